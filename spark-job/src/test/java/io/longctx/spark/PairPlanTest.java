package io.longctx.spark;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.longctx.kernels.AttentionOptions;
import java.util.ArrayList;
import java.util.List;
import org.junit.jupiter.api.Test;

/** The pair plan as plain functions: no Spark. */
class PairPlanTest {

  static RangeMeta range(String doc, long index, long min, long max, long count, boolean hasPos) {
    RangeMeta m = new RangeMeta();
    m.setDocId(doc);
    m.setIndex(index);
    m.setMin(min);
    m.setMax(max);
    m.setCount(count);
    m.setHasPos(hasPos);
    m.setSample(doc + "-q" + index);
    return m;
  }

  /** Document "d": chunks of 10 positions 0..39; blocks at 5..7, 25..25, 39..39 and one without pos. */
  static List<RangeMeta> chunks() {
    List<RangeMeta> c = new ArrayList<>();
    for (int i = 0; i < 4; i++) {
      c.add(range("d", i, 10L * i, 10L * i + 9, 10, true));
    }
    c.add(range("e", -1, -7, -1, 7, true));
    return c;
  }

  static List<RangeMeta> blocks() {
    return List.of(range("d", 0, 5, 7, 3, true), range("d", 1, 25, 25, 1, true), range("d", 2, 39, 39, 1, true),
        range("d", 3, 0, 0, 2, false), range("e", 0, -3, -2, 2, true));
  }

  @Test
  void causalAndWindowedPlansSkipWhatNoQuerySees() {
    PairPlan causal = PairPlan.make(chunks(), blocks(), AttentionOptions.DEFAULT.withCausal(true), "K", "Q");
    assertArrayEquals(new long[] {0}, causal.chunksOf("d", 0));
    assertArrayEquals(new long[] {0, 1, 2}, causal.chunksOf("d", 1));
    assertArrayEquals(new long[] {0, 1, 2, 3}, causal.chunksOf("d", 2));
    assertArrayEquals(new long[] {0, 1, 2, 3}, causal.chunksOf("d", 3), "a block without pos sees everything");
    assertArrayEquals(new long[] {-1}, causal.chunksOf("e", 0));
    assertEquals(1 + 3 + 4 + 4 + 1, causal.computed);
    assertEquals(3 + 1 + 0 + 0 + 0, causal.skipped);
    assertEquals(2, causal.documents);
    assertEquals(47, causal.tokens);
    assertEquals(9, causal.queries);
    assertEquals(5, causal.chunks);
    // The routing map is the inverse, ascending.
    assertArrayEquals(new long[] {0, 1, 2, 3}, causal.blocksOf("d", 0));
    assertArrayEquals(new long[] {2, 3}, causal.blocksOf("d", 3));
    assertArrayEquals(new long[0], causal.blocksOf("nope", 0));

    // Window 7: the query at 25 sees (18, 25]: chunks 1 (by its key 19) and 2; at 39: (32, 39]: chunk 3.
    // Window 6: (19, 25] leaves chunk 1 out.
    PairPlan w = PairPlan.make(chunks(), blocks(), AttentionOptions.DEFAULT.withCausal(true).withWindow(7), "K", "Q");
    assertArrayEquals(new long[] {1, 2}, w.chunksOf("d", 1));
    assertArrayEquals(new long[] {3}, w.chunksOf("d", 2));
    PairPlan w6 = PairPlan.make(chunks(), blocks(), AttentionOptions.DEFAULT.withCausal(true).withWindow(6), "K", "Q");
    assertArrayEquals(new long[] {2}, w6.chunksOf("d", 1));
    PairPlan all = PairPlan.make(chunks(), blocks(), AttentionOptions.DEFAULT, "K", "Q");
    assertEquals(0, all.skipped, "unmasked: every pair");
  }

  @Test
  void theEndsOfTheLongRangeAndAnyWindow() {
    long min = Long.MIN_VALUE, max = Long.MAX_VALUE;
    List<RangeMeta> cs = List.of(range("x", Long.MIN_VALUE, min, min + 5, 6, true), range("x", 0, 0, 9, 10, true),
        range("x", max, max - 3, max, 4, true));
    List<RangeMeta> bs = List.of(range("x", 0, min, min, 1, true), range("x", 1, max, max, 1, true));
    PairPlan full = PairPlan.make(cs, bs, AttentionOptions.DEFAULT.withWindow(max), "K", "Q");
    assertArrayEquals(new long[] {Long.MIN_VALUE}, full.chunksOf("x", 0));
    // From MAX a window of 2^63-1 reaches keys above 0 (MAX - 9 < MAX), never those near MIN (2^64 - 6 away).
    assertArrayEquals(new long[] {0, max}, full.chunksOf("x", 1));
    PairPlan one = PairPlan.make(cs, bs, AttentionOptions.DEFAULT.withWindow(1), "K", "Q");
    assertArrayEquals(new long[] {max}, one.chunksOf("x", 1));
  }

  @Test
  void aBlockOfADocumentWithoutKeysIsBadInput() {
    List<RangeMeta> bs = new ArrayList<>(blocks());
    bs.add(range("ghost", 0, 1, 1, 1, true));
    InputError e = assertThrows(InputError.class, () -> PairPlan.make(chunks(), bs, AttentionOptions.DEFAULT, "K", "Q"));
    assertTrue(e.getMessage().contains("query 'ghost-q0' refers to document 'ghost', which has no keys in KEYS K"),
        e.getMessage());
    assertThrows(InputError.class, () -> PairPlan.make(List.of(), bs, AttentionOptions.DEFAULT, "K", "Q"));
  }
}
