package io.longctx.kernels;

/**
 * The accuracy rule, for tests and the GPU check: a kernel's error against the float64 reference
 * must be at most 2x the error of the naive float32 algorithm against that reference, plus a small
 * epsilon. Errors are the relative L2 error of o and the max absolute error of lse; -inf must match
 * -inf exactly. Both epsilons scale with the size of the logits: a kernel that merges partial states
 * holds each partial lse as a float32 near the largest logit L, whose rounding (L x 2^-24) becomes
 * relative error of the merge weights, so o's epsilon is max(1e-6, 4 x 2^-24 x max|lse|). (With
 * logits near 30..100 the 2x ratio alone is a heavy-tailed random variable: a split-K case failed
 * it once in several hundred runs at 2.71e-6 against 2.70e-6.)
 */
public final class Tolerance {

  static final double EPS_O = 1e-6;
  static final double EPS_LSE = 1e-6;

  private Tolerance() {}

  /** Relative L2 error of o and max |lse error|. */
  public record Errors(double o, double lse) {
    @Override
    public String toString() {
      return String.format(java.util.Locale.ROOT, "o rel-L2 %.3g, lse max-abs %.3g", o, lse);
    }
  }

  public static Errors errors(float[] o, float[] lse, ReferenceAttention.Result ref) {
    if (o.length != ref.o().length || lse.length != ref.lse().length) {
      return new Errors(Double.POSITIVE_INFINITY, Double.POSITIVE_INFINITY);
    }
    double num = 0, den = 0, lseErr = 0;
    for (int i = 0; i < o.length; i++) {
      double e = o[i] - ref.o()[i];
      num += e * e;
      den += ref.o()[i] * ref.o()[i];
    }
    for (int i = 0; i < lse.length; i++) {
      double r = ref.lse()[i];
      if (r == Double.NEGATIVE_INFINITY || lse[i] == Float.NEGATIVE_INFINITY || Float.isNaN(lse[i])) {
        if (r != lse[i]) {
          return new Errors(Double.POSITIVE_INFINITY, Double.POSITIVE_INFINITY);
        }
        continue;
      }
      lseErr = Math.max(lseErr, Math.abs(lse[i] - r));
    }
    double o2 = den == 0 ? Math.sqrt(num) : Math.sqrt(num / den);
    return new Errors(Double.isNaN(o2) ? Double.POSITIVE_INFINITY : o2, lseErr);
  }

  /** Null when {@code got} meets the rule, else a message with both errors and the bounds. */
  public static String violation(AttentionState got, ReferenceAttention.Result ref, ReferenceAttention.Result naive32) {
    return violation(got.o(), got.lse(), ref, naive32);
  }

  /** The same on raw arrays in attention-state order (they may hold NaN: that is a violation). */
  public static String violation(float[] o, float[] lse, ReferenceAttention.Result ref,
      ReferenceAttention.Result naive32) {
    Errors kernel = errors(o, lse, ref);
    Errors naive = errors(toFloat(naive32.o()), toFloat(naive32.lse()), ref);
    double tolO = 2 * naive.o() + Math.max(EPS_O, 4 * Math.scalb(maxAbs(ref.lse()), -24));
    double tolLse = 2 * naive.lse() + EPS_LSE * (1 + maxAbs(ref.lse()));
    if (kernel.o() <= tolO && kernel.lse() <= tolLse) {
      return null;
    }
    return "kernel " + kernel + " vs naive float32 " + naive + " (tolerance o " + tolO + ", lse " + tolLse + ")";
  }

  /**
   * Factor on the naive error for tensor-core kernels ({@link #violationRoundedP}). The kernel and
   * the naive rounded-P computation round the same kind of value (p in (0, 1]) to the same type at
   * different points (the kernel against its running max, the naive one against the row's max):
   * two draws of one rounding process, so their o errors differ only by that spread. Measured on
   * TensorCoreModel (40 seeds x 4 masks per shape, 2026-11-23): kernel/naive o error 0.92-1.0 on
   * shapes of 34+ rows, 0.64-1.27 on one or three rows; P rounded to bf16 instead of fp16 gives
   * 7.4-7.5x (4.6x on one row). 3 sits between, with room for what the model leaves out (mma's
   * internal summation order, exp2f's last bits: float32-level, ~1000x below fp16's P rounding).
   */
  static final double ROUNDED_P_FACTOR = 3;

  /**
   * The rule for kernels that round P to fp16/bf16 before P·V (the tensor-core forward): error
   * against the float64 reference at most {@link #ROUNDED_P_FACTOR} x the error of
   * {@link ReferenceAttention#computeRoundedP} (the naive algorithm in that precision), plus the
   * float32 rule's floors (which cover rows where rounding P costs nothing, e.g. one key: p = 1).
   * Null when met, else a message.
   */
  public static String violationRoundedP(float[] o, float[] lse, ReferenceAttention.Result ref,
      ReferenceAttention.Result naiveRoundedP) {
    Errors kernel = errors(o, lse, ref);
    Errors naive = errors(toFloat(naiveRoundedP.o()), toFloat(naiveRoundedP.lse()), ref);
    double tolO = ROUNDED_P_FACTOR * naive.o() + Math.max(EPS_O, 4 * Math.scalb(maxAbs(ref.lse()), -24));
    double tolLse = ROUNDED_P_FACTOR * naive.lse() + EPS_LSE * (1 + maxAbs(ref.lse()));
    if (kernel.o() <= tolO && kernel.lse() <= tolLse) {
      return null;
    }
    return "kernel " + kernel + " vs naive rounded-P " + naive + " (tolerance o " + tolO + ", lse " + tolLse + ")";
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

  /** A float32 array widened to float64 (exact). */
  public static double[] toDouble(float[] x) {
    double[] d = new double[x.length];
    for (int i = 0; i < x.length; i++) {
      d[i] = x[i];
    }
    return d;
  }

  /** A float64 array rounded to float32. */
  public static float[] toFloat(double[] x) {
    float[] f = new float[x.length];
    for (int i = 0; i < x.length; i++) {
      f[i] = (float) x[i];
    }
    return f;
  }
}
