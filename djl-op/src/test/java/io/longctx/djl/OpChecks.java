package io.longctx.djl;

import ai.djl.ndarray.NDArray;
import ai.djl.ndarray.NDManager;
import ai.djl.ndarray.types.Shape;
import io.longctx.kernels.AttentionOptions;
import io.longctx.kernels.ReferenceAttention;
import io.longctx.kernels.Tensor;
import java.util.SplittableRandom;

/**
 * Test support: random inputs, NDArray conversions and the DESIGN.md tolerance rule (error against
 * the float64 reference at most 2x that of the naive float32 algorithm, plus a small epsilon).
 */
final class OpChecks {

  static final double EPS = 1e-6;

  private OpChecks() {}

  static long seed() {
    return System.nanoTime() ^ Thread.currentThread().getId() * 0x9E3779B97F4A7C15L;
  }

  static Tensor random(SplittableRandom rng, int b, int h, int t, int d, double amp) {
    float[] x = new float[b * h * t * d];
    for (int i = 0; i < x.length; i++) {
      x[i] = (float) (rng.nextGaussian() * amp);
    }
    return new Tensor(x, b, h, t, d);
  }

  /** Our [B, H, T, D] tensor as an NDArray in the layout. */
  static NDArray nd(NDManager m, Tensor x, AttentionOp.Layout layout) {
    NDArray a = m.create(x.data(), new Shape(x.batch(), x.heads(), x.tokens(), x.dim()));
    return layout == AttentionOp.Layout.BHTD ? a : a.transpose(0, 2, 1, 3).duplicate();
  }

  /** o and lse of an operator result in attention-state order (row = b*T+t, head, dim). */
  static float[][] stateOrder(NDArray o, NDArray lse, AttentionOp.Layout layout) {
    if (layout == AttentionOp.Layout.BHTD) {
      return new float[][] {o.transpose(0, 2, 1, 3).toFloatArray(), lse.transpose(0, 2, 1).toFloatArray()};
    }
    return new float[][] {o.toFloatArray(), lse.toFloatArray()};
  }

  /** Null when within tolerance, else a message. */
  static String check(float[] o, float[] lse, Tensor q, Tensor k, Tensor v, long[] qPos, long[] kPos,
      AttentionOptions opt) {
    ReferenceAttention.Result ref = ReferenceAttention.compute(q, k, v, qPos, kPos, opt);
    ReferenceAttention.Result naive = ReferenceAttention.computeFloat32(q, k, v, qPos, kPos, opt);
    double[] got = errors(o, lse, ref);
    float[] no = new float[naive.o().length];
    float[] nl = new float[naive.lse().length];
    for (int i = 0; i < no.length; i++) {
      no[i] = (float) naive.o()[i];
    }
    for (int i = 0; i < nl.length; i++) {
      nl[i] = (float) naive.lse()[i];
    }
    double[] base = errors(no, nl, ref);
    double maxLse = 0;
    for (double l : ref.lse()) {
      if (Double.isFinite(l)) {
        maxLse = Math.max(maxLse, Math.abs(l));
      }
    }
    double tolO = 2 * base[0] + EPS, tolL = 2 * base[1] + EPS * (1 + maxLse);
    if (got[0] <= tolO && got[1] <= tolL) {
      return null;
    }
    return String.format("o rel-L2 %.3g (tol %.3g), lse max-abs %.3g (tol %.3g)", got[0], tolO, got[1], tolL);
  }

  private static double[] errors(float[] o, float[] lse, ReferenceAttention.Result ref) {
    if (o.length != ref.o().length || lse.length != ref.lse().length) {
      return new double[] {Double.POSITIVE_INFINITY, Double.POSITIVE_INFINITY};
    }
    double num = 0, den = 0, le = 0;
    for (int i = 0; i < o.length; i++) {
      double e = o[i] - ref.o()[i];
      num += e * e;
      den += ref.o()[i] * ref.o()[i];
    }
    for (int i = 0; i < lse.length; i++) {
      double r = ref.lse()[i];
      if (r == Double.NEGATIVE_INFINITY || lse[i] == Float.NEGATIVE_INFINITY) {
        if (r != lse[i]) {
          return new double[] {Double.POSITIVE_INFINITY, Double.POSITIVE_INFINITY};
        }
        continue;
      }
      double e = Math.abs(lse[i] - r);
      le = e > le || Double.isNaN(e) ? e : le;
    }
    double err = den == 0 ? Math.sqrt(num) : Math.sqrt(num / den);
    return new double[] {Double.isNaN(err) ? Double.POSITIVE_INFINITY : err,
        Double.isNaN(le) ? Double.POSITIVE_INFINITY : le};
  }
}
