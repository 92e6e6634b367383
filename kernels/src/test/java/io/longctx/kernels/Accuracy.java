package io.longctx.kernels;

import java.util.SplittableRandom;

/**
 * Test support: random inputs and the DESIGN.md tolerance rule. A kernel's error against the
 * float64 reference must be at most 2x the error of the naive float32 algorithm against that
 * reference, plus a small epsilon: relative L2 error for o, max absolute error for lse (scaled by
 * the lse magnitude).
 */
final class Accuracy {

  static final double EPS_O = 1e-6;
  static final double EPS_LSE = 1e-6;

  private Accuracy() {}

  /** Fresh seed for a test run; print it in failures. */
  static long seed() {
    return System.nanoTime() ^ Thread.currentThread().getId() * 0x9E3779B97F4A7C15L;
  }

  static Tensor random(SplittableRandom rng, int b, int h, int t, int d, double amplitude) {
    float[] x = new float[b * h * t * d];
    for (int i = 0; i < x.length; i++) {
      x[i] = (float) (rng.nextGaussian() * amplitude);
    }
    return new Tensor(x, b, h, t, d);
  }

  /** Relative L2 error of o and max |lse error| of a state against a reference. */
  record Errors(double o, double lse) {
    @Override
    public String toString() {
      return String.format("o rel-L2 %.3g, lse max-abs %.3g", o, lse);
    }
  }

  static Errors errors(float[] o, float[] lse, ReferenceAttention.Result ref) {
    double num = 0, den = 0, lseErr = 0;
    for (int i = 0; i < o.length; i++) {
      double e = o[i] - ref.o()[i];
      num += e * e;
      den += ref.o()[i] * ref.o()[i];
    }
    for (int i = 0; i < lse.length; i++) {
      double r = ref.lse()[i];
      if (r == Double.NEGATIVE_INFINITY || lse[i] == Float.NEGATIVE_INFINITY) {
        if (r != lse[i]) {
          return new Errors(Double.POSITIVE_INFINITY, Double.POSITIVE_INFINITY);
        }
        continue;
      }
      lseErr = Math.max(lseErr, Math.abs(lse[i] - r));
    }
    return new Errors(den == 0 ? Math.sqrt(num) : Math.sqrt(num / den), lseErr);
  }

  static Errors errors(ReferenceAttention.Result naive, ReferenceAttention.Result ref) {
    float[] o = new float[naive.o().length];
    float[] lse = new float[naive.lse().length];
    for (int i = 0; i < o.length; i++) {
      o[i] = (float) naive.o()[i];
    }
    for (int i = 0; i < lse.length; i++) {
      lse[i] = (float) naive.lse()[i];
    }
    return errors(o, lse, ref);
  }

  static double maxAbs(double[] x) {
    double m = 0;
    for (double v : x) {
      if (Double.isFinite(v)) {
        m = Math.max(m, Math.abs(v));
      }
    }
    return m;
  }

  /**
   * Null when the state meets the tolerance against the reference, else a message with both errors.
   */
  static String check(AttentionState got, ReferenceAttention.Result ref, ReferenceAttention.Result naive32) {
    Errors kernel = errors(got.o(), got.lse(), ref);
    Errors naive = errors(naive32, ref);
    double tolO = 2 * naive.o() + EPS_O;
    double tolLse = 2 * naive.lse() + EPS_LSE * (1 + maxAbs(ref.lse()));
    if (kernel.o() <= tolO && kernel.lse() <= tolLse) {
      return null;
    }
    return "kernel " + kernel + " vs naive float32 " + naive + " (tolerance o " + tolO + ", lse " + tolLse + ")";
  }
}
