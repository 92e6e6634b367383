package io.longctx.kernels;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.Arrays;
import java.util.SplittableRandom;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.CsvSource;
import org.junit.jupiter.api.Test;

/** Split-K decoding and the FlashDecoding++ unified maximum against the float64 reference. */
class DecodeTest {

  static long[] decodePositions(int rows, int tk) {
    long[] qp = new long[rows];
    for (int t = 0; t < rows; t++) {
      qp[t] = tk - rows + t; // the last `rows` tokens, as in speculative or batched decoding
    }
    return qp;
  }

  @ParameterizedTest(name = "rows={0} Tk={1} H={2}/{3} D={4} split={5} window={6}")
  @CsvSource({
      "1, 1, 1, 1, 32, 64, 0",
      "1, 7, 8, 1, 64, 3, 0",
      "3, 339, 8, 2, 80, 100, 0",
      "16, 799, 4, 1, 128, 128, 0",
      "1, 4097, 32, 8, 128, 1000, 0",
      "5, 4097, 8, 1, 256, 512, 300",
      "2, 20011, 4, 4, 64, 4096, 2500",
  })
  void decodeMatchesReference(int rows, int tk, int heads, int kvHeads, int dim, int split, long window) {
    long seed = Seeds.forTest();
    SplittableRandom rng = new SplittableRandom(seed);
    Tensor q = Tensor.random(rng, 1, heads, rows, dim);
    Tensor k = Tensor.random(rng, 1, kvHeads, tk, dim);
    Tensor v = Tensor.random(rng, 1, kvHeads, tk, dim);
    long[] qp = decodePositions(rows, tk);
    AttentionOptions opt = AttentionOptions.DEFAULT.withCausal(true).withWindow(window);
    CpuAttention.DecodeResult got = CpuAttention.DEFAULT.decode(q, k, v, qp, null, opt, split);
    assertEquals((tk + split - 1) / split, got.splits());
    ReferenceAttention.Result ref = ReferenceAttention.compute(q, k, v, qp, null, opt);
    ReferenceAttention.Result naive = ReferenceAttention.computeFloat32(q, k, v, qp, null, opt);
    String err = Tolerance.violation(got.state(), ref, naive);
    assertNull(err, "seed " + seed + ": " + err);

    // The unified max from a calibration on this data: same answer.
    UnifiedMax um = UnifiedMax.calibrate(q, k, opt);
    CpuAttention.DecodeResult fast = CpuAttention.DEFAULT.decodeUnifiedMax(q, k, v, qp, null, opt, split, um);
    err = Tolerance.violation(fast.state(), ref, naive);
    assertNull(err, "unified max " + um + ", seed " + seed + ": " + err);
  }

  @Test
  void unifiedMaxRecomputesRowsOutsideItsBoundsAndStillMatches() {
    long seed = Seeds.forTest();
    SplittableRandom rng = new SplittableRandom(seed);
    int heads = 8, kvHeads = 2, rows = 2, tk = 3001, dim = 64;
    Tensor q = Tensor.random(rng, 1, heads, rows, dim);
    Tensor k = Tensor.random(rng, 1, kvHeads, tk, dim);
    Tensor v = Tensor.random(rng, 1, kvHeads, tk, dim);
    // Head 3's queries are scaled so its logits reach hundreds: far above phi = 0 + 40.
    for (int t = 0; t < rows; t++) {
      int at = q.offset(0, 3, t);
      for (int d = 0; d < dim; d++) {
        q.data()[at + d] *= 30;
      }
    }
    long[] qp = decodePositions(rows, tk);
    AttentionOptions opt = AttentionOptions.DEFAULT.withCausal(true);
    int split = 500;
    CpuAttention.DecodeResult got = CpuAttention.DEFAULT.decodeUnifiedMax(q, k, v, qp, null, opt, split, UnifiedMax.of(0f));
    int splits = (tk + split - 1) / split;
    assertTrue(got.recomputedRows() >= rows, "head 3's rows must be recomputed, got " + got.recomputedRows());
    assertTrue(got.recomputedRows() <= (long) rows * splits * 2, "only heads 3 (and a rare other) recompute: " + got.recomputedRows());
    ReferenceAttention.Result ref = ReferenceAttention.compute(q, k, v, qp, null, opt);
    String err = Tolerance.violation(got.state(), ref, ReferenceAttention.computeFloat32(q, k, v, qp, null, opt));
    assertNull(err, "seed " + seed + ": " + err);

    // phi far from every logit: every (row, split) that sees a key is recomputed, the answer is
    // unchanged. The last split holds only key 3000, which row 0 (position 2999) does not see.
    CpuAttention.DecodeResult all = CpuAttention.DEFAULT.decodeUnifiedMax(q, k, v, qp, null, opt, split, UnifiedMax.of(1e4f));
    assertEquals((long) (rows * splits - 1) * heads, all.recomputedRows());
    assertNull(Tolerance.violation(all.state(), ref, ReferenceAttention.computeFloat32(q, k, v, qp, null, opt)), "seed " + seed);

    // In range: nothing is recomputed.
    Tensor calm = Tensor.random(rng, 1, heads, rows, dim);
    assertEquals(0, CpuAttention.DEFAULT.decodeUnifiedMax(calm, k, v, qp, null, opt, split, UnifiedMax.of(0f)).recomputedRows());
  }

  /**
   * A unified max whose upper bound is near float32's exp limit (phi + 87.5 < phi + 88) accepts
   * weights near 1e38: a sum of several of them, or one of them times a value above 3.4, overflows
   * float32. Such a row is recomputed with the running max, as one out of bounds (the output's
   * overflow used to end in "v holds values too large", though v was fine). Inputs built so that
   * every logit is the same (equal q rows, equal keys).
   */
  @Test
  void unifiedMaxRecomputesRowsWhoseSumOrOutputOverflows() {
    long seed = Seeds.forTest();
    SplittableRandom rng = new SplittableRandom(seed);
    for (int tk : new int[] {40, 1}) { // 40 weights of 1e38: the sum overflows; 1: only o, v up to 10
      Tensor[] qkv = sameLogitInputs(rng, tk);
      Tensor q = qkv[0], k = qkv[1], v = qkv[2];
      int heads = q.heads();
      AttentionOptions opt = AttentionOptions.DEFAULT;
      UnifiedMax um = sameLogitBound(q, k, opt);
      CpuAttention.DecodeResult got = CpuAttention.DEFAULT.decodeUnifiedMax(q, k, v, null, null, opt, 64, um);
      assertEquals(heads, got.recomputedRows(), "tk " + tk + ", seed " + seed);
      String err = Tolerance.violation(got.state(), ReferenceAttention.compute(q, k, v, null, null, opt),
          ReferenceAttention.computeFloat32(q, k, v, null, null, opt));
      assertNull(err, "tk " + tk + ", seed " + seed + ": " + err);
    }
  }

  /** q [1, 4, 1, 64] of one random row for every head, k [1, 1, tk, 64] of one key, v up to 10. */
  static Tensor[] sameLogitInputs(SplittableRandom rng, int tk) {
    int heads = 4, dim = 64;
    Tensor q = Tensor.random(rng, 1, heads, 1, dim);
    for (int h = 1; h < heads; h++) {
      System.arraycopy(q.data(), q.offset(0, 0, 0), q.data(), q.offset(0, h, 0), dim);
    }
    Tensor k = Tensor.random(rng, 1, 1, tk, dim);
    for (int j = 1; j < tk; j++) {
      System.arraycopy(k.data(), k.offset(0, 0, 0), k.data(), k.offset(0, 0, j), dim);
    }
    return new Tensor[] {q, k, Tensor.random(rng, 1, 1, tk, dim, 10)};
  }

  /** Bounds (-87, 88) and phi 87.5 below the logit every (row, key) of q and k shares. */
  static UnifiedMax sameLogitBound(Tensor q, Tensor k, AttentionOptions opt) {
    float dot = 0;
    for (int d = 0; d < q.dim(); d++) {
      dot += q.data()[q.offset(0, 0, 0) + d] * k.data()[k.offset(0, 0, 0) + d];
    }
    return new UnifiedMax((float) (opt.scaleFor(q.dim()) * dot) - 87.5f, UnifiedMax.MIN_LOWER, UnifiedMax.MAX_UPPER);
  }

  /**
   * One head's logits in the hundreds (q x 30, bf16-rounded inputs, D 128, Tk 3001, split 500).
   * With the scale folded into q (a 24-bit mantissa, so every fma of q.k rounded) the error missed
   * the tolerance on about 2 seeds in 10 (o rel-L2 up to 9e-6 against a ~2-4e-6 bound), in forward
   * and single-split decode alike; the scale now multiplies the finished q.k, which then rounds like
   * the naive algorithm's. Split lse is also kept in float64 until the merged result (a float32 lse
   * near 100 has an ulp of 8e-6; with float32 split lse the worst of 40 seeds reached 0.8 of the
   * bound, with float64 0.47). Both decode variants.
   */
  @Test
  void largeLogitsStayWithinToleranceAcrossSplits() {
    for (int trial = 0; trial < 16; trial++) {
      long seed = Seeds.forTest();
      SplittableRandom rng = new SplittableRandom(seed);
      int heads = 8, kvHeads = 2, rows = 2, tk = 3001, dim = 128, split = 500;
      Tensor q = Tensor.random(rng, 1, heads, rows, dim);
      for (int t = 0; t < rows; t++) {
        int at = q.offset(0, 3, t);
        for (int d = 0; d < dim; d++) {
          q.data()[at + d] *= 30;
        }
      }
      q = GpuCheck.rounded(q, CudaAttention.DType.BF16);
      Tensor k = GpuCheck.rounded(Tensor.random(rng, 1, kvHeads, tk, dim), CudaAttention.DType.BF16);
      Tensor v = GpuCheck.rounded(Tensor.random(rng, 1, kvHeads, tk, dim), CudaAttention.DType.BF16);
      long[] qp = decodePositions(rows, tk);
      AttentionOptions opt = AttentionOptions.DEFAULT.withCausal(true);
      ReferenceAttention.Result ref = ReferenceAttention.compute(q, k, v, qp, null, opt);
      ReferenceAttention.Result naive = ReferenceAttention.computeFloat32(q, k, v, qp, null, opt);
      String err = Tolerance.violation(CpuAttention.DEFAULT.decode(q, k, v, qp, null, opt, split).state(), ref, naive);
      assertNull(err, "decode, seed " + seed + ": " + err);
      // phi = 0: head 3's rows leave the bounds and are recomputed; the other heads use phi.
      err = Tolerance.violation(
          CpuAttention.DEFAULT.decodeUnifiedMax(q, k, v, qp, null, opt, split, UnifiedMax.of(0f)).state(), ref, naive);
      assertNull(err, "decodeUnifiedMax, seed " + seed + ": " + err);
    }
  }

  @Test
  void decodeOfOneSequenceDoesNotDependOnTheRestOfTheBatch() {
    long seed = Seeds.forTest();
    SplittableRandom rng = new SplittableRandom(seed);
    int heads = 4, kvHeads = 2, rows = 3, tk = 2500, dim = 64;
    Tensor q = Tensor.random(rng, 2, heads, rows, dim);
    Tensor k = Tensor.random(rng, 2, kvHeads, tk, dim);
    Tensor v = Tensor.random(rng, 2, kvHeads, tk, dim);
    AttentionState batched = CpuAttention.DEFAULT.decode(q, k, v, null, null, AttentionOptions.DEFAULT, 700).state();
    Tensor q0 = new Tensor(Arrays.copyOf(q.data(), q.data().length / 2), 1, heads, rows, dim);
    Tensor k0 = new Tensor(Arrays.copyOf(k.data(), k.data().length / 2), 1, kvHeads, tk, dim);
    Tensor v0 = new Tensor(Arrays.copyOf(v.data(), v.data().length / 2), 1, kvHeads, tk, dim);
    AttentionState alone = CpuAttention.DEFAULT.decode(q0, k0, v0, null, null, AttentionOptions.DEFAULT, 700).state();
    assertArrayEquals(alone.lse(), Arrays.copyOf(batched.lse(), alone.lse().length), "seed " + seed);
    assertArrayEquals(alone.o(), Arrays.copyOf(batched.o(), alone.o().length), "seed " + seed);
    // And repeated runs give the same bits.
    AttentionState again = CpuAttention.DEFAULT.decode(q, k, v, null, null, AttentionOptions.DEFAULT, 700).state();
    assertArrayEquals(batched.o(), again.o());
    assertArrayEquals(batched.lse(), again.lse());
  }
}
