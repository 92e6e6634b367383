package io.longctx.kernels;

/**
 * FlashDecoding++ asynchronized softmax settings: every partial uses the shared scaling value
 * {@code phi} instead of its own running maximum, so partials never rescale. Valid while every
 * visible logit x satisfies {@code lower < x - phi < upper}; a partial row that sees a logit outside
 * is recomputed with the synchronized (running-max) method (docs/KERNELS.md).
 *
 * <p>Defaults keep exp(x - phi) within float32's normal range with room for summing a split of
 * 2^20 keys: {@code e^40 * 2^20 < 3e23}, {@code e^-40 > 4e-18}.
 */
public record UnifiedMax(float phi, float lower, float upper) {

  public static final float DEFAULT_LOWER = -40f;
  public static final float DEFAULT_UPPER = 40f;
  /**
   * The widest bounds: the kernels' float32 exp flushes results below e^-87.3 to 0 and clamps its
   * argument at 88 (e^88 < Float.MAX_VALUE), so beyond them an accepted row would get weights of 0
   * (an empty row) or all the same weight, without a word.
   */
  public static final float MIN_LOWER = -87f;
  public static final float MAX_UPPER = 88f;

  public UnifiedMax {
    if (!Float.isFinite(phi) || !(MIN_LOWER <= lower && lower < 0 && 0 < upper && upper <= MAX_UPPER)) {
      throw new IllegalArgumentException("unified max needs a finite phi and bounds " + MIN_LOWER + " <= lower < 0 < upper <= "
          + MAX_UPPER + " (float32 exp's range), got phi=" + phi + " lower=" + lower + " upper=" + upper);
    }
  }

  public static UnifiedMax of(float phi) {
    return new UnifiedMax(phi, DEFAULT_LOWER, DEFAULT_UPPER);
  }

  /**
   * Calibrates phi on real data: the median over sampled query rows of each row's largest logit
   * against up to 4096 evenly spaced keys (masks ignored: phi only needs to be typical; rows it does
   * not suit are recomputed, never wrong). q and k must fit one decode call (as {@link CpuAttention#decode}
   * checks them: same batch and head dim, heads a multiple of kv heads), else IllegalArgumentException.
   */
  public static UnifiedMax calibrate(Tensor q, Tensor k, AttentionOptions opt) {
    new CpuAttention.Problem(q, k, k, null, null, opt); // the decode's own shape checks, named as it names them
    int group = q.heads() / k.heads();
    double scale = opt.scaleFor(q.dim());
    int rowStep = Math.max(1, q.tokens() / 8);
    int keyStep = Math.max(1, k.tokens() / 4096);
    java.util.List<Double> maxima = new java.util.ArrayList<>();
    for (int b = 0; b < q.batch(); b++) {
      for (int h = 0; h < q.heads(); h++) {
        for (int t = 0; t < q.tokens(); t += rowStep) {
          double best = Double.NEGATIVE_INFINITY;
          for (int j = 0; j < k.tokens(); j += keyStep) {
            int qo = q.offset(b, h, t), ko = k.offset(b, h / group, j);
            double dot = 0;
            for (int d = 0; d < q.dim(); d++) {
              dot += q.data()[qo + d] * k.data()[ko + d];
            }
            double x = scale * dot;
            best = Math.max(best, opt.softcap() > 0 ? opt.softcap() * Math.tanh(x / opt.softcap()) : x);
          }
          if (Double.isFinite(best)) {
            maxima.add(best);
          }
        }
      }
    }
    if (maxima.isEmpty()) {
      return of(0f);
    }
    maxima.sort(null);
    return of(maxima.get(maxima.size() / 2).floatValue());
  }

  /** Whether a row whose visible logits span [min, max] can use phi (no visible logit: trivially yes). */
  boolean accepts(float min, float max) {
    return max == Float.NEGATIVE_INFINITY || (min - phi > lower && max - phi < upper);
  }
}
