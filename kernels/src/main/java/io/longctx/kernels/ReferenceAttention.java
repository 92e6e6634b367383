package io.longctx.kernels;

/**
 * Plain attention with materialized scores, in float64 (the yardstick for tests and checks) or,
 * for the tolerance rule of docs/CONVENTIONS.md, the same naive algorithm rounded to float32 after every
 * operation. Never used on a production path. Output layout is the attention-state layout: row = b * Tq + t,
 * {@code o[(row * heads + h) * dim + d]}, {@code lse[row * heads + h]}; a row that sees no key has
 * o = 0 and lse = -inf.
 */
public final class ReferenceAttention {

  /** float64 attention output and natural-log log-sum-exp, in attention-state layout. */
  public record Result(double[] o, double[] lse, int rows, int heads, int dim) {}

  private ReferenceAttention() {}

  /**
   * Attention of q [B, H, Tq, D] over k, v [B, Hkv, Tk, D]; positions may be null (0..T-1).
   * Query head h reads kv head h / (H / Hkv).
   */
  public static Result compute(Tensor q, Tensor k, Tensor v, long[] qPos, long[] kPos, AttentionOptions opt) {
    return compute(q, k, v, qPos, kPos, opt, false, CudaAttention.DType.F32);
  }

  /** The same naive algorithm with every intermediate rounded to float32. */
  public static Result computeFloat32(Tensor q, Tensor k, Tensor v, long[] qPos, long[] kPos, AttentionOptions opt) {
    return compute(q, k, v, qPos, kPos, opt, true, CudaAttention.DType.F32);
  }

  /**
   * The naive algorithm in a tensor-core kernel's own precision: float32 throughout, but each
   * p = exp(s - max) rounded to {@code pType} (fp16 or bf16) before it multiplies v, as the kernel
   * must to feed P to mma.sync; the row sum l takes the unrounded float32 p, as the kernel's does.
   * Its error against {@link #compute} is the yardstick for those kernels (FlashAttention's tests
   * likewise round P to the input type in their reference). Inputs should already be rounded to
   * {@code pType} (the kernel sees nothing else).
   */
  public static Result computeRoundedP(Tensor q, Tensor k, Tensor v, long[] qPos, long[] kPos, AttentionOptions opt,
      CudaAttention.DType pType) {
    return compute(q, k, v, qPos, kPos, opt, true, pType);
  }

  /** x rounded to the element type and back (float32: unchanged). */
  static float roundTo(float x, CudaAttention.DType type) {
    return switch (type) {
      case F32 -> x;
      case F16 -> HalfFloats.halfToFloat(HalfFloats.floatToHalf(x));
      case BF16 -> HalfFloats.bf16ToFloat(HalfFloats.floatToBf16(x));
    };
  }

  private static double r(double x, boolean f32) {
    return f32 ? (float) x : x;
  }

  private static Result compute(Tensor q, Tensor k, Tensor v, long[] qPos, long[] kPos, AttentionOptions opt,
      boolean f32, CudaAttention.DType pType) {
    int batch = q.batch(), heads = q.heads(), tq = q.tokens(), dim = q.dim();
    int kvHeads = k.heads(), tk = k.tokens();
    int group = heads / kvHeads;
    long[] qp = qPos != null ? qPos : iota(tq);
    long[] kp = kPos != null ? kPos : iota(tk);
    double scale = opt.scaleFor(dim);
    double[] o = new double[batch * tq * heads * dim];
    double[] lse = new double[batch * tq * heads];
    double[] s = new double[tk];
    for (int b = 0; b < batch; b++) {
      for (int h = 0; h < heads; h++) {
        int kvh = h / group;
        for (int t = 0; t < tq; t++) {
          int qo = q.offset(b, h, t);
          double max = Double.NEGATIVE_INFINITY;
          for (int j = 0; j < tk; j++) {
            if (!opt.visible(qp[t], kp[j])) {
              s[j] = Double.NEGATIVE_INFINITY;
              continue;
            }
            int ko = k.offset(b, kvh, j);
            double dot = 0;
            for (int d = 0; d < dim; d++) {
              dot = r(dot + r((double) q.data()[qo + d] * k.data()[ko + d], f32), f32);
            }
            double x = r(r(scale, f32) * dot, f32);
            if (opt.softcap() > 0) {
              x = r(opt.softcap() * r(Math.tanh(r(x / opt.softcap(), f32)), f32), f32);
            }
            s[j] = x;
            max = Math.max(max, x);
          }
          int row = b * tq + t;
          int oo = (row * heads + h) * dim;
          if (max == Double.NEGATIVE_INFINITY) {
            lse[row * heads + h] = Double.NEGATIVE_INFINITY;
            continue;
          }
          double sum = 0;
          for (int j = 0; j < tk; j++) {
            if (s[j] == Double.NEGATIVE_INFINITY) {
              continue;
            }
            double p = r(Math.exp(r(s[j] - max, f32)), f32);
            sum = r(sum + p, f32);
            double pv = f32 ? roundTo((float) p, pType) : p;
            int vo = v.offset(b, kvh, j);
            for (int d = 0; d < dim; d++) {
              o[oo + d] = r(o[oo + d] + r(pv * v.data()[vo + d], f32), f32);
            }
          }
          for (int d = 0; d < dim; d++) {
            o[oo + d] = r(o[oo + d] / sum, f32);
          }
          lse[row * heads + h] = r(max + r(Math.log(sum), f32), f32);
        }
      }
    }
    return new Result(o, lse, batch * tq, heads, dim);
  }

  static long[] iota(int n) {
    long[] p = new long[n];
    for (int i = 0; i < n; i++) {
      p[i] = i;
    }
    return p;
  }
}
