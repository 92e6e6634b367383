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
    assertArrayEquals(new long[] {0, 1, 2, 3}, causal.seenBy("d", 0));
    assertArrayEquals(new long[] {2, 3}, causal.seenBy("d", 3));
    assertArrayEquals(new long[0], causal.seenBy("nope", 0));

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

  /** A prefill document of n chunks of 10 positions: block b is chunk b's own tokens. */
  static PairPlan prefill(String doc, int n, AttentionOptions attn) {
    List<RangeMeta> cs = new ArrayList<>();
    for (int i = 0; i < n; i++) {
      cs.add(range(doc, i, 10L * i, 10L * i + 9, 10, true));
    }
    return PairPlan.make(cs, cs, attn, "K", "K").forPrefill(16);
  }

  @Test
  void causalPrefillBlocksArePairedHeaviestWithLightestAndEachChunkGoesOncePerTask() {
    PairPlan p = prefill("d", 8, AttentionOptions.DEFAULT.withCausal(true));
    for (int b = 0; b < 8; b++) {
      assertArrayEquals(new long[] {Math.min(b, 7 - b), Math.max(b, 7 - b)}, p.groupOf("d", b), "block " + b);
    }
    assertArrayEquals(new long[] {0, 1, 2, 3}, p.seenBy("d", 0), "chunk 0: every task once");
    assertArrayEquals(new long[] {0, 1, 2}, p.seenBy("d", 5), "chunk 5: blocks 7, 6, 5 in tasks 0, 1, 2");
    long sends = 0;
    for (int c = 0; c < 8; c++) {
      sends += p.seenBy("d", c).length;
    }
    assertEquals(8 + 7 + 6 + 5, sends, "the larger block of each pair sets its task's chunks");
    assertEquals(36, p.computed, "pairs are the same");
    // Blocks 0..2 of three: 3 + 1 chunks would pass the heaviest's 3 by more than a quarter; 2 + 1 does not.
    PairPlan three = prefill("t", 3, AttentionOptions.DEFAULT.withCausal(true));
    assertArrayEquals(new long[] {2}, three.groupOf("t", 2));
    assertArrayEquals(new long[] {0, 1}, three.groupOf("t", 0));
    assertArrayEquals(new long[] {0, 1}, three.groupOf("t", 1));
    assertArrayEquals(new long[] {0, 2}, three.seenBy("t", 0));
  }

  @Test
  void prefillBlocksOfEqualWorkStayAlone() {
    PairPlan full = prefill("d", 8, AttentionOptions.DEFAULT);
    for (int b = 0; b < 8; b++) {
      assertArrayEquals(new long[] {b}, full.groupOf("d", b), "no mask, block " + b);
      assertEquals(8, full.seenBy("d", b).length);
    }
    // A window of 25 positions: blocks see 1, 2, 3, 4, 4, 4, 4, 4 chunks; 4 + 1 and 3 + 2 stay within 5.
    PairPlan w = prefill("d", 8, AttentionOptions.DEFAULT.withCausal(true).withWindow(25));
    assertArrayEquals(new long[] {0, 3}, w.groupOf("d", 0));
    assertArrayEquals(new long[] {0, 3}, w.groupOf("d", 3));
    assertArrayEquals(new long[] {1, 2}, w.groupOf("d", 1));
    for (int b : new int[] {4, 5, 6, 7}) {
      assertArrayEquals(new long[] {b}, w.groupOf("d", b), "window, block " + b);
    }
    PairPlan two = prefill("d", 2, AttentionOptions.DEFAULT.withCausal(true));
    assertArrayEquals(new long[] {1}, two.groupOf("d", 1), "1 + 2 chunks is half again the heaviest's 2");
  }

  @Test
  void prefillGroupsArePlacedHeaviestFirstOnTheLeastLoadedPartition() {
    List<RangeMeta> cs = new ArrayList<>();
    for (int i = 0; i < 8; i++) {
      cs.add(range("long", i, 10L * i, 10L * i + 9, 10, true));
    }
    cs.add(range("short", 0, 0, 4, 5, true));
    PairPlan base = PairPlan.make(cs, cs, AttentionOptions.DEFAULT.withCausal(true), "K", "K");
    // Groups (0, 7), (1, 6), (2, 5), (3, 4) of "long" see 9 chunks each, "short" 1.
    PairPlan wide = base.forPrefill(16);
    assertEquals(5, wide.partitions, "one partition per group when there are enough");
    for (int g = 0; g < 4; g++) {
      assertEquals(g, wide.partitionOf("long", g), "equal groups in block order, first");
    }
    assertEquals(4, wide.partitionOf("short", 0), "the lightest last");
    PairPlan two = base.forPrefill(2);
    assertEquals(2, two.partitions);
    int[] load = new int[2];
    for (int g = 0; g < 4; g++) {
      load[two.partitionOf("long", g)] += 9;
    }
    load[two.partitionOf("short", 0)] += 1;
    assertEquals(19, Math.max(load[0], load[1]), "18 + 1 against 18");
    assertThrows(IllegalStateException.class, () -> two.partitionOf("long", 7), "a group is named by its first block");
    assertThrows(IllegalArgumentException.class, () -> base.forPrefill(0));
  }
}
