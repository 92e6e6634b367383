package io.longctx.kernels;

/**
 * How scores are formed and masked; immutable, built with the {@code with...} methods.
 *
 * <ul>
 *   <li>{@code scale}: score = scale * q.k; {@code NaN} means the default 1/sqrt(dim).
 *   <li>{@code softcap}: when positive, score = softcap * tanh(score / softcap); 0 disables it.
 *   <li>{@code causal}: a query at position p sees keys at positions {@code <= p}.
 *   <li>{@code window}: when positive, a query at p sees only keys in {@code (p - window, p]}
 *       (a sliding window; it implies the causal upper bound).
 * </ul>
 *
 * Masks are defined by absolute token positions, never by array offsets (docs/CONVENTIONS.md).
 */
public record AttentionOptions(double scale, float softcap, boolean causal, long window)
    implements java.io.Serializable {

  public static final AttentionOptions DEFAULT = new AttentionOptions(Double.NaN, 0f, false, 0);

  public AttentionOptions {
    if (!Double.isNaN(scale) && !(scale > 0 && Double.isFinite(scale))) {
      throw new IllegalArgumentException("scale must be positive and finite (or NaN for 1/sqrt(dim)), got " + scale);
    }
    if (!(softcap >= 0 && Float.isFinite(softcap))) {
      throw new IllegalArgumentException("softcap must be >= 0 and finite (0 disables it), got " + softcap);
    }
    if (window < 0) {
      throw new IllegalArgumentException("window must be >= 0 (0 disables it), got " + window);
    }
  }

  public AttentionOptions withScale(double s) {
    return new AttentionOptions(s, softcap, causal, window);
  }

  public AttentionOptions withSoftcap(float c) {
    return new AttentionOptions(scale, c, causal, window);
  }

  public AttentionOptions withCausal(boolean c) {
    return new AttentionOptions(scale, softcap, c, window);
  }

  public AttentionOptions withWindow(long w) {
    return new AttentionOptions(scale, softcap, causal, w);
  }

  /** The scale actually applied for head dimension {@code dim}. */
  public double scaleFor(int dim) {
    return Double.isNaN(scale) ? 1.0 / Math.sqrt(dim) : scale;
  }

  /**
   * The float32 factor every q.k is multiplied by for head dimension {@code dim}: the scale, divided
   * by the softcap when capping (the score is then cap * tanh(factor * q.k)). Refused when float32
   * cannot hold it as a normal number: 0 would make every score 0, a subnormal loses bits, and
   * infinity turns 0 scores into NaN.
   */
  public float scoreScale(int dim) {
    double s = scaleFor(dim);
    double f = softcap > 0 ? s / softcap : s;
    if (!(Math.abs(f) >= Float.MIN_NORMAL && Math.abs(f) <= Float.MAX_VALUE)) {
      throw new IllegalArgumentException("the score scale " + f + " (scale " + s + (softcap > 0 ? " / softcap " + softcap : "")
          + ") is outside float32's normal range " + Float.MIN_NORMAL + ".." + Float.MAX_VALUE);
    }
    return (float) f;
  }

  /** True when a window or causal mask applies at all. */
  public boolean masked() {
    return causal || window > 0;
  }

  // The visibility rule, in one place for the kernels, the Spark planner and the key counts. Positions
  // may be any long: a window is compared with the exact distance q - k (0 <= q - k < 2^64 when k <= q,
  // held as an unsigned long), never with q - window, which overflows near Long.MIN_VALUE.

  /** Whether a query at {@code qPos} sees a key at {@code kPos}. */
  public boolean visible(long qPos, long kPos) {
    return !masked() || (kPos <= qPos && withinWindow(qPos, kPos));
  }

  /**
   * Whether some query with position in [qMin, qMax] may see some key with position in [kMin, kMax]
   * (both ranges non-empty). False means the pair can be skipped.
   */
  public boolean anyVisible(long qMin, long qMax, long kMin, long kMax) {
    if (!masked()) {
      return true;
    }
    if (kMin > qMax) {
      return false; // every key after every query
    }
    return kMax >= qMin || withinWindow(qMin, kMax); // overlapping ranges hold a pair at distance 0
  }

  /** Whether every query in [qMin, qMax] sees every key in [kMin, kMax]: no mask work needed. */
  public boolean allVisible(long qMin, long qMax, long kMin, long kMax) {
    return !masked() || (kMax <= qMin && withinWindow(qMax, kMin));
  }

  /**
   * How many keys of {@code sortedKPos} (ascending) a query at {@code qPos} sees: the keys in
   * (qPos - window, qPos] (causal: (-inf, qPos]; unmasked: all).
   */
  public int visibleCount(long[] sortedKPos, long qPos) {
    if (!masked()) {
      return sortedKPos.length;
    }
    int hi = countAtMost(sortedKPos, qPos);
    // keys with pos <= qPos - window; none when that bound is below Long.MIN_VALUE
    int lo = window > 0 && qPos >= Long.MIN_VALUE + window ? countAtMost(sortedKPos, qPos - window) : 0;
    return Math.max(0, hi - lo);
  }

  /** For k <= q: whether q - k < window (always true without a window). */
  private boolean withinWindow(long q, long k) {
    return window <= 0 || Long.compareUnsigned(q - k, window) < 0;
  }

  private static int countAtMost(long[] a, long x) {
    int lo = 0, hi = a.length;
    while (lo < hi) {
      int m = (lo + hi) >>> 1;
      if (a[m] <= x) {
        lo = m + 1;
      } else {
        hi = m;
      }
    }
    return lo;
  }
}
