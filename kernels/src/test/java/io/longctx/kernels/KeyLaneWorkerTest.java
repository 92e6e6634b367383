package io.longctx.kernels;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

import java.util.List;
import java.util.SplittableRandom;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.function.Executable;

/**
 * Split-K decoding and the forward of few query tokens with the keys in the SIMD lanes
 * ({@link KeyLaneWorker}) give the bits of the query-rows-in-lanes worker ({@link TileWorker}), row
 * for row, on random awkward shapes and every option, and fail on bad input with the same message.
 */
class KeyLaneWorkerTest {

  private static final CpuAttention ROWS_IN_LANES = new CpuAttention(CpuAttention.DEFAULT_BLOCK_Q, 128,
      CpuAttention.DEFAULT_MAX_BLOCKS_PER_SWEEP, 0);
  private static final CpuAttention KEYS_IN_LANES = new CpuAttention(CpuAttention.DEFAULT_BLOCK_Q, 128,
      CpuAttention.DEFAULT_MAX_BLOCKS_PER_SWEEP, 1 << 20);

  @Test
  void sameBitsAsTheRowsInLanesWorker() {
    long seed = Seeds.forTest();
    SplittableRandom rng = new SplittableRandom(seed);
    int[] dims = {1, 3, 16, 17, 64, 80, 100, 128, 130};
    for (int round = 0; round < 60; round++) {
      int batch = 1 + rng.nextInt(2);
      int kvHeads = 1 + rng.nextInt(3);
      int group = 1 + rng.nextInt(6);
      int tq = 1 + rng.nextInt(4);
      int tk = 1 + rng.nextInt(700);
      int dim = dims[rng.nextInt(dims.length)];
      int split = 1 + rng.nextInt(Math.max(1, tk));
      double amp = rng.nextBoolean() ? 1 : 4;
      Tensor q = Tensor.random(rng, batch, kvHeads * group, tq, dim, amp);
      Tensor k = Tensor.random(rng, batch, kvHeads, tk, dim, amp);
      Tensor v = Tensor.random(rng, batch, kvHeads, tk, dim);
      // Key positions with gaps; queries after, among or before them.
      long[] kp = new long[tk];
      for (int j = 0, pos = rng.nextInt(5); j < tk; j++, pos += 1 + rng.nextInt(3)) {
        kp[j] = pos;
      }
      long[] qp = new long[tq];
      for (int t = 0; t < tq; t++) {
        qp[t] = rng.nextLong(-5, kp[tk - 1] + 10);
      }
      AttentionOptions opt = AttentionOptions.DEFAULT.withCausal(rng.nextBoolean())
          .withWindow(rng.nextInt(3) == 0 ? 1 + rng.nextInt(300) : 0)
          .withSoftcap(rng.nextInt(3) == 0 ? 1 + rng.nextInt(30) : 0f);
      String where = "seed " + seed + ", round " + round + ": B " + batch + " heads " + kvHeads * group + "/" + kvHeads
          + " Tq " + tq + " Tk " + tk + " D " + dim + " split " + split + " " + opt;
      same(ROWS_IN_LANES.decode(q, k, v, qp, kp, opt, split), KEYS_IN_LANES.decode(q, k, v, qp, kp, opt, split), where);
      AttentionState fw = ROWS_IN_LANES.forward(q, k, v, qp, kp, opt), fk = KEYS_IN_LANES.forward(q, k, v, qp, kp, opt);
      assertArrayEquals(fw.o(), fk.o(), "forward, " + where);
      assertArrayEquals(fw.lse(), fk.lse(), "forward, " + where);
      // A unified max that some rows leave (recomputed) and others keep.
      UnifiedMax um = UnifiedMax.of((float) rng.nextDouble(-2, 6));
      same(ROWS_IN_LANES.decodeUnifiedMax(q, k, v, qp, kp, opt, split, um),
          KEYS_IN_LANES.decodeUnifiedMax(q, k, v, qp, kp, opt, split, um), where + ", " + um);
    }
  }

  private static void same(CpuAttention.DecodeResult want, CpuAttention.DecodeResult got, String where) {
    assertArrayEquals(want.state().o(), got.state().o(), where);
    assertArrayEquals(want.state().lse(), got.state().lse(), where);
    assertEquals(want.recomputedRows(), got.recomputedRows(), where);
  }

  @Test
  void badInputIsNamedAsTheRowsInLanesWorkerNamesIt() {
    long seed = Seeds.forTest();
    SplittableRandom rng = new SplittableRandom(seed);
    Tensor q = Tensor.random(rng, 1, 4, 2, 20);
    Tensor k = Tensor.random(rng, 1, 2, 300, 20);
    Tensor v = Tensor.random(rng, 1, 2, 300, 20);
    AttentionOptions causal = AttentionOptions.DEFAULT.withCausal(true);
    long[] qp = {250, 299};
    // q.k past float32 at one visible key (only there: with several, which split's task fails first
    // is a race); NaN in k at a visible key; Infinity in v.
    Tensor big = new Tensor(q.data().clone(), 1, 4, 2, 20);
    java.util.Arrays.fill(big.data(), big.offset(0, 3, 1), big.offset(0, 3, 1) + 20, 1e19f);
    Tensor kBig = new Tensor(k.data().clone(), 1, 2, 300, 20);
    java.util.Arrays.fill(kBig.data(), kBig.offset(0, 1, 140), kBig.offset(0, 1, 140) + 20, 1e20f);
    sameError(() -> ROWS_IN_LANES.decode(big, kBig, v, qp, null, causal, 64),
        () -> KEYS_IN_LANES.decode(big, kBig, v, qp, null, causal, 64), seed);
    Tensor kNan = new Tensor(k.data().clone(), 1, 2, 300, 20);
    kNan.data()[kNan.offset(0, 0, 77) + 5] = Float.NaN;
    sameError(() -> ROWS_IN_LANES.decode(q, kNan, v, qp, null, causal, 64),
        () -> KEYS_IN_LANES.decode(q, kNan, v, qp, null, causal, 64), seed);
    Tensor vInf = new Tensor(v.data().clone(), 1, 2, 300, 20);
    vInf.data()[vInf.offset(0, 1, 200) + 19] = Float.POSITIVE_INFINITY;
    sameError(() -> ROWS_IN_LANES.decode(q, k, vInf, qp, null, causal, 64),
        () -> KEYS_IN_LANES.decode(q, k, vInf, qp, null, causal, 64), seed);
  }

  /**
   * A NaN or infinite key that every query masks (junk past the end of a preallocated cache) is not
   * read: both workers return the same state. (TileWorker refused it when its block had unused lanes,
   * whose q = 0 scored the key as NaN, and accepted it in a full block.)
   */
  @Test
  void aNonFiniteKeyThatEveryQueryMasksIsNotRead() {
    long seed = Seeds.forTest();
    SplittableRandom rng = new SplittableRandom(seed);
    Tensor q = Tensor.random(rng, 1, 4, 1, 16);
    Tensor k = Tensor.random(rng, 1, 2, 100, 16);
    Tensor v = Tensor.random(rng, 1, 2, 100, 16);
    long[] qp = {60};
    AttentionOptions causal = AttentionOptions.DEFAULT.withCausal(true);
    for (float junk : new float[] {Float.NaN, Float.POSITIVE_INFINITY}) {
      Tensor kj = new Tensor(k.data().clone(), 1, 2, 100, 16);
      kj.data()[kj.offset(0, 0, 70) + 3] = junk;
      CpuAttention.DecodeResult want = ROWS_IN_LANES.decode(q, kj, v, qp, null, causal, 64);
      same(want, KEYS_IN_LANES.decode(q, kj, v, qp, null, causal, 64), "junk " + junk + ", seed " + seed);
      same(want, CpuAttention.DEFAULT.decode(q, k, v, qp, null, causal, 64), "junk " + junk + " against clean k");
      UnifiedMax um = UnifiedMax.of(0f);
      same(ROWS_IN_LANES.decodeUnifiedMax(q, kj, v, qp, null, causal, 64, um),
          KEYS_IN_LANES.decodeUnifiedMax(q, kj, v, qp, null, causal, 64, um), "junk " + junk + ", unified max");
    }
  }

  @Test
  void noQueryTokensGiveAnEmptyState() {
    Tensor q = Tensor.zeros(1, 4, 0, 16);
    Tensor k = Tensor.zeros(1, 2, 30, 16);
    for (CpuAttention.DecodeResult r : List.of(KEYS_IN_LANES.decode(q, k, k, null, null, AttentionOptions.DEFAULT, 8),
        CpuAttention.DEFAULT.decode(BufferTensorTest.direct(q, false), BufferTensorTest.direct(k, true),
            BufferTensorTest.direct(k, true), null, null, AttentionOptions.DEFAULT, 8))) {
      assertEquals(0, r.state().o().length);
      assertEquals(0, r.state().lse().length);
    }
  }

  private static void sameError(Executable want, Executable got, long seed) {
    RuntimeException a = assertThrows(RuntimeException.class, want, "seed " + seed);
    RuntimeException b = assertThrows(RuntimeException.class, got, "seed " + seed);
    assertEquals(a.getClass(), b.getClass(), "seed " + seed);
    assertEquals(a.getMessage(), b.getMessage(), "seed " + seed);
  }
}
