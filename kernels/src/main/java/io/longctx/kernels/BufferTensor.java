package io.longctx.kernels;

import java.nio.FloatBuffer;
import java.util.Objects;

/**
 * A float32 tensor of logical shape [batch, heads, tokens, dim] held in a buffer (typically a DJL
 * array's native memory), in one of two row-major orders: {@code tokenMajor} false is [B, H, T, D]
 * like {@link Tensor}, true is [B, T, H, D]. The kernels read it in place: a query row when its block
 * starts, a key tile into arrays of the worker's thread as it is reached ({@link KvTile}). Buffer
 * indices start at 0 (the buffer's position is ignored, its limit is the tensor's size); absolute
 * reads only, so several threads may read one buffer.
 */
public record BufferTensor(FloatBuffer data, int batch, int heads, int tokens, int dim, boolean tokenMajor) {

  public BufferTensor {
    Objects.requireNonNull(data, "data");
    Tensor.requireShape(batch, heads, tokens, dim, data.limit(), "buffer");
  }

  /** [batch, heads, tokens, dim] in that order: the {@link Tensor} layout. */
  public static BufferTensor bhtd(FloatBuffer data, int batch, int heads, int tokens, int dim) {
    return new BufferTensor(data, batch, heads, tokens, dim, false);
  }

  /** [batch, tokens, heads, dim] in that order (e.g. projections before a transpose). */
  public static BufferTensor bthd(FloatBuffer data, int batch, int tokens, int heads, int dim) {
    return new BufferTensor(data, batch, heads, tokens, dim, true);
  }

  /** Offset of row (b, h, t), i.e. of element (b, h, t, 0); an index out of the shape is an error. */
  public int offset(int b, int h, int t) {
    Objects.checkIndex(b, batch);
    Objects.checkIndex(h, heads);
    Objects.checkIndex(t, tokens);
    return tokenMajor ? ((b * tokens + t) * heads + h) * dim : ((b * heads + h) * tokens + t) * dim;
  }

  /** Distance between the rows of consecutive tokens of one (batch, head). */
  int tokenStride() {
    return tokenMajor ? heads * dim : dim;
  }

  /** Copies rows (b, h, t0 .. t0 + n - 1) into dst from {@code dstOff}, one after another. */
  void readRows(int b, int h, int t0, int n, float[] dst, int dstOff) {
    if (n == 0) {
      return;
    }
    int at = offset(b, h, t0);
    Objects.checkIndex(t0 + n - 1, tokens);
    if (!tokenMajor) {
      data.get(at, dst, dstOff, n * dim);
    } else {
      for (int i = 0, stride = tokenStride(); i < n; i++) {
        data.get(at + i * stride, dst, dstOff + i * dim, dim);
      }
    }
  }

  /** A copy as a new {@link Tensor} ([B, H, T, D] in an array), whichever order this is stored in. */
  public Tensor toTensor() {
    float[] out = new float[Math.toIntExact((long) batch * heads * tokens * dim)];
    copyInto(out);
    return new Tensor(out, batch, heads, tokens, dim);
  }

  /**
   * Copies this into out in [B, H, T, D] order (out holds exactly its floats); from 1 MiB on, in
   * pieces on the kernels' threads.
   */
  void copyInto(float[] out) {
    int bh = batch * heads;
    boolean large = out.length >= 1 << 18;
    int pieces = large ? Math.max(1, Math.min(tokens, 4 * CpuAttention.POOL.getParallelism() / bh + 1)) : 1;
    java.util.function.IntConsumer copy = task -> {
      int b = task / pieces / heads, h = task / pieces % heads, piece = task % pieces;
      int t0 = (int) ((long) tokens * piece / pieces), t1 = (int) ((long) tokens * (piece + 1) / pieces);
      readRows(b, h, t0, t1 - t0, out, ((b * heads + h) * tokens + t0) * dim);
    };
    if (large) {
      CpuAttention.parallelFor(bh * pieces, copy);
    } else {
      for (int task = 0; task < bh * pieces; task++) {
        copy.accept(task);
      }
    }
  }

  /** Throws, naming the first NaN or infinity by (batch, head, token, dim), as {@link Tensor#requireFinite}. */
  public void requireFinite(String name) {
    for (int i = 0, n = data.limit(); i < n; i++) {
      float x = data.get(i);
      if (!Float.isFinite(x)) {
        int d = i % dim, rest = i / dim;
        int b, h, t;
        if (tokenMajor) {
          h = rest % heads;
          t = rest / heads % tokens;
          b = rest / heads / tokens;
        } else {
          t = rest % tokens;
          h = rest / tokens % heads;
          b = rest / tokens / heads;
        }
        throw Tensor.notFinite(name, x, shape(), b, h, t, d);
      }
    }
  }

  /** The logical shape, [batch, heads, tokens, dim], and the order when it is token-major. */
  public String shape() {
    return Tensor.shape(batch, heads, tokens, dim) + (tokenMajor ? " (stored [batch, tokens, heads, dim])" : "");
  }
}
