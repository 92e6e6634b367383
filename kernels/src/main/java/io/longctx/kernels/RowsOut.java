package io.longctx.kernels;

import java.nio.FloatBuffer;

/**
 * Where the workers write finished rows ({@link TileWorker#writeRow}): a state's arrays, row
 * {@code out = (b * tq + t) * heads + h} of o [rows, heads, dim] and lse, with lse rounded to float32
 * or (split-K partials, rounded once after the merge) kept in float64; or, for a forward, a caller's
 * buffers (a DJL array's memory) in either order, so that no copy of o follows the kernel.
 */
final class RowsOut {
  private final float[] o;
  private final float[] lse32;
  private final double[] lse64;
  private final FloatBuffer ob;
  private final FloatBuffer lb;
  private final boolean tokenMajor;
  private final int heads;
  private final int tq;

  private RowsOut(float[] o, float[] lse32, double[] lse64, FloatBuffer ob, FloatBuffer lb, boolean tokenMajor,
      int heads, int tq) {
    this.o = o;
    this.lse32 = lse32;
    this.lse64 = lse64;
    this.ob = ob;
    this.lb = lb;
    this.tokenMajor = tokenMajor;
    this.heads = heads;
    this.tq = tq;
  }

  /** A state's arrays, lse rounded to float32. */
  static RowsOut state(float[] o, float[] lse) {
    return new RowsOut(o, lse, null, null, null, true, 0, 0);
  }

  /** A state's arrays with the lse in float64. */
  static RowsOut wideLse(float[] o, double[] lse) {
    return new RowsOut(o, null, lse, null, null, true, 0, 0);
  }

  /** Buffers of o (logical [B, H, Tq, D]) and lse ([B, H, Tq] or, token-major, [B, Tq, H]). */
  static RowsOut buffers(BufferTensor o, FloatBuffer lse) {
    return new RowsOut(null, null, null, o.data(), lse, o.tokenMajor(), o.heads(), o.tokens());
  }

  /** Where row {@code out}'s lse goes, and times dim its o: out itself, but for head-major buffers. */
  int at(int out) {
    if (tokenMajor) {
      return out;
    }
    int h = out % heads, row = out / heads;
    return (row / tq * heads + h) * tq + row % tq;
  }

  void o(int i, float x) {
    if (o != null) {
      o[i] = x;
    } else {
      ob.put(i, x);
    }
  }

  void lse(int at, double x) {
    if (lse64 != null) {
      lse64[at] = x;
    } else if (lse32 != null) {
      lse32[at] = (float) x;
    } else {
      lb.put(at, (float) x);
    }
  }
}
