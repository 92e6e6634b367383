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
 * Masks are defined by absolute token positions, never by array offsets (DESIGN.md).
 */
public record AttentionOptions(double scale, float softcap, boolean causal, long window) {

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

  /** True when a window or causal mask applies at all. */
  public boolean masked() {
    return causal || window > 0;
  }

  /** Whether a query at {@code qPos} sees a key at {@code kPos}. */
  public boolean visible(long qPos, long kPos) {
    if ((causal || window > 0) && kPos > qPos) {
      return false;
    }
    return window <= 0 || kPos > qPos - window;
  }
}
