package io.longctx.kernels;

/**
 * A Java model of flash_forward_tc.cu's arithmetic, row by row, to validate the tensor-core rule of
 * {@link Tolerance#violationRoundedP} on the CPU before a GPU runs the kernel. It follows the kernel
 * where the rounding happens: 64-key tiles; S by mma (products of fp16/bf16 values are exact, each
 * k16 step rounds once to float32 into the accumulator); logits in base 2: the raw q.k s stays as it
 * is, its factor c = scale x log2 e applied in the exp's fma (with softcap, s becomes softcap x
 * tanh(s x scale / softcap) x log2 e and c = 1); running max m = max(m_old, max(s) x c), alpha =
 * exp2(m_old - m_new), exactly 1 when the max stands still; p = exp2(fma(s, c, -m)) in float32 with
 * results below float's normal range flushed to 0 (ex2.approx.ftz), summed unrounded into four
 * per-thread shares (keys 2*t4, 2*t4+1 of each 8) that are rescaled by alpha with an FMA and added
 * pairwise at the end; P rounded to the input type before P·V (again one float32 rounding per k16
 * step); o = acc x (1 / l); lse = (m + log2 l) x ln 2. Not modeled: the mma hardware's internal
 * summation order and the last bit of ex2/log2f/tanhf (both far below the P rounding this rule is
 * about).
 */
final class TensorCoreModel {

  /** Deliberate bugs, to show the rule catches what matters. */
  enum Mistake {
    NONE,
    /** acc is not rescaled by exp2(m_old - m_new) when the running max grows (l still is). */
    NO_RESCALE,
    /** P rounded to the other 2-byte type (bf16 for fp16 inputs: 8x the rounding error). */
    WRONG_P_TYPE,
    /** The second key tile is skipped (a wrong visibility class or loop bound). */
    DROPPED_TILE
  }

  static final int KEYS = 64; // kKeys in flash_forward_tc.cu
  private static final float LOG2E = 1.4426950408889634f;
  private static final float LN2 = 0.6931471805599453f;

  private TensorCoreModel() {}

  /** o [B*Tq, H, D] and lse [B*Tq, H], as the kernel writes them; inputs already rounded to {@code type}. */
  static float[][] forward(Tensor q, Tensor k, Tensor v, long[] qPos, long[] kPos, AttentionOptions opt,
      CudaAttention.DType type, Mistake mistake) {
    int batch = q.batch(), heads = q.heads(), tq = q.tokens(), dim = q.dim(), tk = k.tokens();
    int group = heads / k.heads();
    long[] kp = kPos != null ? kPos : ReferenceAttention.iota(tk);
    float scale = (float) opt.scaleFor(dim); // the launch passes a float
    float softcap = opt.softcap();
    float sScale = softcap > 0f ? scale / softcap : scale * LOG2E;
    float sMul = softcap > 0f ? 1f : sScale; // s_mul in the kernel
    CudaAttention.DType pType = mistake == Mistake.WRONG_P_TYPE
        ? (type == CudaAttention.DType.F16 ? CudaAttention.DType.BF16 : CudaAttention.DType.F16) : type;
    float[] o = new float[batch * tq * heads * dim];
    float[] lse = new float[batch * tq * heads];
    float[] x = new float[KEYS];
    float[] acc = new float[dim];
    float[] share = new float[4];
    for (int b = 0; b < batch; b++) {
      for (int h = 0; h < heads; h++) {
        int kvh = h / group;
        for (int t = 0; t < tq; t++) {
          int qo = q.offset(b, h, t);
          java.util.Arrays.fill(acc, 0f);
          java.util.Arrays.fill(share, 0f);
          float rowMax = Float.NEGATIVE_INFINITY;
          for (int j0 = 0, tile = 0; j0 < tk; j0 += KEYS, tile++) {
            if (mistake == Mistake.DROPPED_TILE && tile == 1) {
              continue;
            }
            float mx = Float.NEGATIVE_INFINITY;
            for (int key = 0; key < KEYS; key++) {
              int j = j0 + key;
              if (j >= tk || !opt.visible(qPos[t], kp[j])) {
                x[key] = Float.NEGATIVE_INFINITY;
                continue;
              }
              int ko = k.offset(b, kvh, j);
              float s = 0f;
              for (int c = 0; c < dim; c += 16) { // one mma k16 step: exact products, one rounding
                double step = s;
                for (int d = c; d < c + 16; d++) {
                  step += (double) q.data()[qo + d] * k.data()[ko + d];
                }
                s = (float) step;
              }
              if (softcap > 0f) {
                s = softcap * (float) Math.tanh(s * sScale) * LOG2E;
              }
              x[key] = s;
              mx = Math.max(mx, s);
            }
            float mNew = Math.max(rowMax, mx * sMul);
            float mUse = mNew == Float.NEGATIVE_INFINITY ? 0f : mNew;
            float alpha = mNew == rowMax ? 1f : exp2(rowMax - mUse); // exactly 1 while the max stands still
            float[] tileShare = new float[4];
            for (int key = 0; key < KEYS; key++) {
              x[key] = exp2(Math.fma(x[key], sMul, -mUse)); // now p, float32
            }
            for (int t4 = 0; t4 < 4; t4++) {
              for (int nb = 0; nb < KEYS / 8; nb++) {
                int key = nb * 8 + 2 * t4;
                tileShare[t4] += x[key] + x[key + 1];
              }
              share[t4] = Math.fma(share[t4], alpha, tileShare[t4]); // nvcc contracts row_sum * alpha + sum
            }
            rowMax = mNew;
            if (mistake != Mistake.NO_RESCALE) {
              for (int d = 0; d < dim; d++) {
                acc[d] *= alpha;
              }
            }
            int vBase = v.offset(b, kvh, 0);
            for (int kk = 0; kk < KEYS; kk += 16) { // one mma k16 step of P·V
              for (int d = 0; d < dim; d++) {
                double step = acc[d];
                for (int key = kk; key < kk + 16 && j0 + key < tk; key++) {
                  float p = ReferenceAttention.roundTo(x[key], pType);
                  step += (double) p * v.data()[vBase + (j0 + key) * dim + d];
                }
                acc[d] = (float) step;
              }
            }
          }
          float l = (share[0] + share[1]) + (share[2] + share[3]); // shfl_xor 1, then 2
          int out = (b * tq + t) * heads + h;
          float inv = l > 0f ? 1f / l : 0f;
          for (int d = 0; d < dim; d++) {
            o[out * dim + d] = acc[d] * inv;
          }
          lse[out] = l > 0f ? (rowMax + (float) (Math.log(l) / Math.log(2))) * LN2 : Float.NEGATIVE_INFINITY;
        }
      }
    }
    return new float[][] {o, lse};
  }

  /** ex2.approx.ftz.f32 (but exact): subnormal inputs and results are 0; exp2(-inf) = 0. */
  private static float exp2(float x) {
    float r = (float) Math.pow(2, Math.abs(x) < Float.MIN_NORMAL ? 0f : x);
    return r < Float.MIN_NORMAL ? 0f : r;
  }
}
