package io.longctx.kernels;

import java.util.Objects;

/**
 * A float32 tensor of shape [batch, heads, tokens, dim], row-major and contiguous: element
 * (b, h, t, d) is at {@code ((b * heads + h) * tokens + t) * dim + d}. Queries, keys and values
 * are passed to the kernels in this layout; the array is used in place, never copied.
 */
public record Tensor(float[] data, int batch, int heads, int tokens, int dim) {

  public Tensor {
    Objects.requireNonNull(data, "data");
    requireShape(batch, heads, tokens, dim, data.length, "array");
  }

  /** The shape checks of a tensor held in {@code holder} (an array, a buffer) of {@code floats} floats. */
  static void requireShape(int batch, int heads, int tokens, int dim, long floats, String holder) {
    if (batch < 1 || heads < 1 || tokens < 0 || dim < 1) {
      throw new IllegalArgumentException(
          "tensor shape must have batch >= 1, heads >= 1, tokens >= 0, dim >= 1, got " + shape(batch, heads, tokens, dim));
    }
    long need = (long) batch * heads * tokens * dim;
    if (need != floats) {
      throw new IllegalArgumentException(
          "tensor of shape " + shape(batch, heads, tokens, dim) + " needs " + need + " floats, " + holder + " has " + floats);
    }
  }

  /** A zero-filled tensor of the given shape. */
  public static Tensor zeros(int batch, int heads, int tokens, int dim) {
    return new Tensor(new float[Math.multiplyExact(Math.multiplyExact(batch, heads), Math.multiplyExact(tokens, dim))],
        batch, heads, tokens, dim);
  }

  /** Standard normal entries from {@code rng} (the GPU checks' and benchmarks' inputs, the JIT warm-up's problem). */
  public static Tensor random(java.util.SplittableRandom rng, int batch, int heads, int tokens, int dim) {
    return random(rng, batch, heads, tokens, dim, 1.0);
  }

  /** Normal entries of standard deviation {@code amplitude} from {@code rng} (the tests' inputs). */
  public static Tensor random(java.util.SplittableRandom rng, int batch, int heads, int tokens, int dim,
      double amplitude) {
    Tensor x = zeros(batch, heads, tokens, dim);
    for (int i = 0; i < x.data.length; i++) {
      x.data[i] = (float) (rng.nextGaussian() * amplitude); // times 1.0 is exact: the same bits as before
    }
    return x;
  }

  /**
   * Offset of row (b, h, t), i.e. of element (b, h, t, 0); t may equal {@code tokens}, the end of
   * the (b, h) rows. An index out of the shape is an error, not a neighbour's offset.
   */
  public int offset(int b, int h, int t) {
    Objects.checkIndex(b, batch);
    Objects.checkIndex(h, heads);
    Objects.checkIndex(t, tokens + 1);
    return ((b * heads + h) * tokens + t) * dim;
  }

  /** A copy of tokens [from, to) of every (batch, head): a chunk of a sequence. */
  public Tensor sliceTokens(int from, int to) {
    Objects.checkFromToIndex(from, to, tokens);
    int n = to - from;
    float[] out = new float[batch * heads * n * dim];
    for (int b = 0; b < batch; b++) {
      for (int h = 0; h < heads; h++) {
        System.arraycopy(data, offset(b, h, from), out, (b * heads + h) * n * dim, n * dim);
      }
    }
    return new Tensor(out, batch, heads, n, dim);
  }

  /**
   * Throws, naming the first NaN or infinity by (batch, head, token, dim). The kernels see them in
   * the scores (a NaN or infinite score is an error); the softcapped paths look in q and k first,
   * since under a cap the GPU kernels only report a NaN row.
   */
  public void requireFinite(String name) {
    for (int i = 0; i < data.length; i++) {
      if (!Float.isFinite(data[i])) {
        int d = i % dim, rest = i / dim, t = rest % tokens, bh = rest / tokens;
        throw notFinite(name, data[i], shape(), bh / heads, bh % heads, t, d);
      }
    }
  }

  /**
   * The sum of the squares of the entries, in float64 (no float32 input can overflow it): NaN where one
   * is NaN, infinite where one is. Four running sums, and blocks on the kernels' threads from 1M
   * entries, added in block order: a bound for the CUDA host paths, paid on every call (one sum alone
   * ran about 1 ns an entry).
   */
  public double sumOfSquares() {
    int block = 1 << 16, blocks = (data.length + block - 1) / block;
    double[] sums = new double[blocks];
    java.util.function.IntConsumer sum = b -> sums[b] = sumOfSquares(data, b * block, Math.min(data.length, (b + 1) * block));
    if (data.length >= 1 << 20) {
      CpuAttention.parallelFor(blocks, sum);
    } else {
      for (int b = 0; b < blocks; b++) {
        sum.accept(b);
      }
    }
    double s = 0;
    for (double x : sums) {
      s += x;
    }
    return s;
  }

  private static double sumOfSquares(float[] x, int from, int to) {
    double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    int i = from;
    for (; i + 3 < to; i += 4) {
      s0 += (double) x[i] * x[i];
      s1 += (double) x[i + 1] * x[i + 1];
      s2 += (double) x[i + 2] * x[i + 2];
      s3 += (double) x[i + 3] * x[i + 3];
    }
    for (; i < to; i++) {
      s0 += (double) x[i] * x[i];
    }
    return (s0 + s1) + (s2 + s3);
  }

  /**
   * Whether some q.k could overflow float32, from the sums of squares of q's and k's entries and the
   * factor the scores' arithmetic multiplies them by before the sum is bounded (1, or the scale where
   * it is folded into q or applied after): every partial sum of a q.k is at most |q| |k|
   * (Cauchy-Schwarz), so at most the product of the two arrays' Frobenius norms. Below {@link
   * #QK_BOUND} (3.4x under Float.MAX_VALUE, a margin for the sum's rounding) none can overflow; NaN or
   * infinity in either answers true. Kernels that take an overflowed q.k as -Infinity (libtorch's CPU
   * attention, the CUDA kernels without a softcap) weigh its key as masked, a wrong answer without a
   * word, so their callers check this first; the Java kernels check each score.
   */
  public static boolean qkMayOverflow(double qSumOfSquares, double kSumOfSquares, double factor) {
    return !(Math.sqrt(qSumOfSquares * kSumOfSquares) * Math.abs(factor) < QK_BOUND);
  }

  /** See {@link #qkMayOverflow}. */
  public static final double QK_BOUND = 1e38;

  /** The error of a NaN or infinite input element (b, h, t, d) (also {@link BufferTensor}'s). */
  static IllegalArgumentException notFinite(String name, float x, String shape, int b, int h, int t, int d) {
    return new IllegalArgumentException(name + " " + shape + " holds " + x + " at (batch " + b + ", head " + h
        + ", token " + t + ", dim " + d + "): attention inputs must be finite");
  }

  public String shape() {
    return shape(batch, heads, tokens, dim);
  }

  static String shape(int b, int h, int t, int d) {
    return "[" + b + ", " + h + ", " + t + ", " + d + "]";
  }
}
