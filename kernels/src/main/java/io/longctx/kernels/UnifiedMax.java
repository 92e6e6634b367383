package io.longctx.kernels;

/**
 * FlashDecoding++ asynchronized softmax settings: every partial uses the shared scaling value
 * {@code phi} instead of its own running maximum, so partials never rescale. Valid while every
 * visible logit x satisfies {@code lower < x - phi < upper}; a partial row that sees a logit outside
 * is recomputed with the synchronized (running-max) method (DESIGN.md).
 *
 * <p>Defaults keep exp(x - phi) within float32's normal range with room for summing a split of
 * 2^20 keys: {@code e^40 * 2^20 < 3e23}, {@code e^-40 > 4e-18}.
 */
public record UnifiedMax(float phi, float lower, float upper) {

  public static final float DEFAULT_LOWER = -40f;
  public static final float DEFAULT_UPPER = 40f;

  public UnifiedMax {
    if (!Float.isFinite(phi) || !Float.isFinite(lower) || !Float.isFinite(upper) || !(lower < 0 && 0 < upper)) {
      throw new IllegalArgumentException(
          "unified max needs finite phi and bounds lower < 0 < upper, got phi=" + phi + " lower=" + lower + " upper=" + upper);
    }
  }

  public static UnifiedMax of(float phi) {
    return new UnifiedMax(phi, DEFAULT_LOWER, DEFAULT_UPPER);
  }

  /** Whether a row whose visible logits span [min, max] can use phi (no visible logit: trivially yes). */
  boolean accepts(float min, float max) {
    return max == Float.NEGATIVE_INFINITY || (min - phi > lower && max - phi < upper);
  }
}
