package io.longctx.kernels;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.ArrayList;
import java.util.List;
import java.util.SplittableRandom;
import java.util.stream.Stream;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.MethodSource;

/** The forward kernel against the float64 reference over a sweep of awkward shapes and masks. */
class ForwardAccuracyTest {

  /** How query and key positions relate. */
  enum Layout {
    /** both 0..T-1 */
    PLAIN,
    /** a chunk from the middle of a document: keys start before the queries */
    MIDDLE,
    /** keys start after the first queries: with causal masks those rows see no key at all */
    KEYS_LATER,
    /** sparse, unevenly spaced positions */
    SPARSE
  }

  record Case(int batch, int heads, int kvHeads, int tq, int tk, int dim, AttentionOptions opt, Layout layout) {
    @Override
    public String toString() {
      return "B" + batch + " H" + heads + "/" + kvHeads + " Tq" + tq + " Tk" + tk + " D" + dim + " causal="
          + opt.causal() + " window=" + opt.window() + " softcap=" + opt.softcap() + " " + layout;
    }
  }

  static Stream<Case> sweep() {
    int[] dims = {32, 64, 80, 128, 256};
    int[][] lengths = {{1, 1}, {1, 339}, {7, 7}, {7, 799}, {339, 7}, {339, 339}, {799, 339}, {1, 4097}, {7, 4097}};
    int[] ratios = {1, 4, 8};
    AttentionOptions[] masks = {
        AttentionOptions.DEFAULT,
        AttentionOptions.DEFAULT.withCausal(true),
        AttentionOptions.DEFAULT.withWindow(50),
        AttentionOptions.DEFAULT.withCausal(true).withSoftcap(5f),
    };
    Layout[] layouts = Layout.values();
    List<Case> cases = new ArrayList<>();
    int i = 0;
    for (int d : dims) {
      for (int[] len : lengths) {
        for (AttentionOptions opt : masks) {
          int ratio = ratios[i % ratios.length];
          Layout layout = layouts[(i / 3) % layouts.length];
          int kv = len[0] * len[1] * d > 1_000_000 ? 1 : 2;
          cases.add(new Case(i % 5 == 0 ? 2 : 1, ratio * kv, kv, len[0], len[1], d, opt, layout));
          i++;
        }
      }
    }
    // The long square at 4097, once per mask, with a small head dim to keep the reference quick.
    for (AttentionOptions opt : masks) {
      cases.add(new Case(1, 1, 1, 4097, 4097, 32, opt, Layout.PLAIN));
    }
    return cases.stream();
  }

  static long[][] positions(Layout layout, int tq, int tk, SplittableRandom rng) {
    long[] qp = new long[tq];
    long[] kp = new long[tk];
    switch (layout) {
      case PLAIN -> {
        return new long[][] {null, null};
      }
      case MIDDLE -> {
        long base = 1_000_000_007L;
        for (int t = 0; t < tq; t++) {
          qp[t] = base + tk / 2 + t;
        }
        for (int j = 0; j < tk; j++) {
          kp[j] = base + j;
        }
      }
      case KEYS_LATER -> {
        for (int t = 0; t < tq; t++) {
          qp[t] = t;
        }
        for (int j = 0; j < tk; j++) {
          kp[j] = tq / 3 + j;
        }
      }
      case SPARSE -> {
        long p = 5;
        for (int t = 0; t < tq; t++) {
          qp[t] = (p += 1 + rng.nextInt(4));
        }
        p = 0;
        for (int j = 0; j < tk; j++) {
          kp[j] = (p += 1 + rng.nextInt(3));
        }
      }
    }
    return new long[][] {qp, kp};
  }

  @ParameterizedTest(name = "{0}")
  @MethodSource("sweep")
  void forwardMatchesReference(Case c) {
    long seed = Seeds.forTest();
    SplittableRandom rng = new SplittableRandom(seed);
    Tensor q = Tensor.random(rng, c.batch, c.heads, c.tq, c.dim);
    Tensor k = Tensor.random(rng, c.batch, c.kvHeads, c.tk, c.dim);
    Tensor v = Tensor.random(rng, c.batch, c.kvHeads, c.tk, c.dim);
    long[][] pos = positions(c.layout, c.tq, c.tk, rng);
    AttentionState got = CpuAttention.DEFAULT.forward(q, k, v, pos[0], pos[1], c.opt);
    String err = Tolerance.violation(got, ReferenceAttention.compute(q, k, v, pos[0], pos[1], c.opt),
        ReferenceAttention.computeFloat32(q, k, v, pos[0], pos[1], c.opt));
    assertNull(err, "seed " + seed + ", " + c + ": " + err);
  }

  @Test
  void rowsWithoutVisibleKeysAreEmptyStates() {
    long seed = Seeds.forTest();
    SplittableRandom rng = new SplittableRandom(seed);
    Tensor q = Tensor.random(rng, 1, 2, 40, 64);
    Tensor k = Tensor.random(rng, 1, 2, 30, 64);
    Tensor v = Tensor.random(rng, 1, 2, 30, 64);
    long[] qp = new long[40];
    long[] kp = new long[30];
    for (int t = 0; t < 40; t++) {
      qp[t] = t;
    }
    for (int j = 0; j < 30; j++) {
      kp[j] = 20 + j; // queries 0..19 precede every key
    }
    AttentionState s = CpuAttention.DEFAULT.forward(q, k, v, qp, kp, AttentionOptions.DEFAULT.withCausal(true));
    for (int t = 0; t < 40; t++) {
      for (int h = 0; h < 2; h++) {
        if (t < 20) {
          assertEquals(Float.NEGATIVE_INFINITY, s.lse(t, h), "seed " + seed + " row " + t);
          for (int d = 0; d < 64; d++) {
            assertEquals(0f, s.o(t, h, d));
          }
        } else {
          assertTrue(Float.isFinite(s.lse(t, h)), "seed " + seed + " row " + t);
        }
      }
    }
  }

  /**
   * Logits of magnitude ~1e4: nothing overflows and the result is as exact as float32 allows. At
   * |s| ~ 1e4 a logit's own float32 rounding is ~5e-4, so both this kernel's and the naive
   * algorithm's errors come from a few rows whose top logits nearly tie, and their ratio is a
   * heavy-tailed random variable (measured over 30 seeds with 8 heads x 257 rows: median 1.0,
   * worst 2.6; with 2 x 129 rows it reached 11, which made the factor-2 rule flaky here). So this
   * test uses many rows and allows 4x the naive error; the sweep keeps the factor 2.
   */
  @Test
  void logitsNearTenThousandDoNotOverflow() {
    long seed = Seeds.forTest();
    SplittableRandom rng = new SplittableRandom(seed);
    // |q.k| * scale ~ 1e4: amplitude a gives scores of order a^2 * sqrt(D).
    int d = 64;
    double amplitude = Math.sqrt(1e4 / Math.sqrt(d)) * 1.3;
    Tensor q = Tensor.random(rng, 1, 8, 257, d, amplitude);
    Tensor k = Tensor.random(rng, 1, 8, 300, d, amplitude);
    Tensor v = Tensor.random(rng, 1, 8, 300, d);
    for (AttentionOptions opt : new AttentionOptions[] {AttentionOptions.DEFAULT, AttentionOptions.DEFAULT.withCausal(true)}) {
      AttentionState got = CpuAttention.DEFAULT.forward(q, k, v, null, null, opt);
      ReferenceAttention.Result ref = ReferenceAttention.compute(q, k, v, null, null, opt);
      assertTrue(Tolerance.maxAbs(ref.lse()) > 5e3, "test must reach large logits, got max |lse| " + Tolerance.maxAbs(ref.lse()));
      Tolerance.Errors kernel = Tolerance.errors(got.o(), got.lse(), ref);
      Tolerance.Errors naive = Tolerance.errors(Tolerance.toFloat(ReferenceAttention.computeFloat32(q, k, v, null, null, opt).o()),
          Tolerance.toFloat(ReferenceAttention.computeFloat32(q, k, v, null, null, opt).lse()), ref);
      String msg = "seed " + seed + ": kernel " + kernel + " vs naive float32 " + naive;
      assertTrue(kernel.o() <= 4 * naive.o() + 1e-6, msg);
      assertTrue(kernel.lse() <= 4 * naive.lse() + 4 * Math.ulp((float) Tolerance.maxAbs(ref.lse())), msg);
    }
  }

  @Test
  void tileSizesDoNotChangeTheResultBeyondRounding() {
    long seed = Seeds.forTest();
    SplittableRandom rng = new SplittableRandom(seed);
    Tensor q = Tensor.random(rng, 1, 4, 201, 80);
    Tensor k = Tensor.random(rng, 1, 1, 333, 80);
    Tensor v = Tensor.random(rng, 1, 1, 333, 80);
    AttentionOptions opt = AttentionOptions.DEFAULT.withCausal(true).withWindow(97);
    ReferenceAttention.Result ref = ReferenceAttention.compute(q, k, v, null, null, opt);
    ReferenceAttention.Result naive = ReferenceAttention.computeFloat32(q, k, v, null, null, opt);
    int g = CpuAttention.laneGroup();
    for (int[] tiles : new int[][] {{g, 1}, {g, 7}, {2 * g, 64}, {4 * g, 128}, {8 * g, 512}}) {
      AttentionState got = new CpuAttention(tiles[0], tiles[1]).forward(q, k, v, null, null, opt);
      String err = Tolerance.violation(got, ref, naive);
      assertNull(err, "seed " + seed + ", blockQ " + tiles[0] + " blockK " + tiles[1] + ": " + err);
    }
  }
}
