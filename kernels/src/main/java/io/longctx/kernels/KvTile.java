package io.longctx.kernels;

/**
 * Where the kernels read one key tile's keys and values: the Tensors' own arrays, or, for keys and
 * values in buffers (a DJL array's native memory), copies of the tile in arrays of this thread. A
 * buffer is read once per tile that way, in order, and the inner loops keep reading float[].
 */
final class KvTile {
  float[] k;
  float[] v;
  /** Offset of the tile's first key (and value) in {@link #k} and {@link #v}. */
  int off;

  private float[] kCopy = new float[0];
  private float[] vCopy = new float[0];

  /** Points at keys and values [jt, jt + n) of kv head kvh of batch entry b. */
  KvTile load(CpuAttention.Problem p, int b, int kvh, int jt, int n) {
    int at = p.kvOffset(b, kvh) + jt * p.dim;
    if (p.kBuf == null) {
      k = p.k.data();
      v = p.v.data();
      off = at;
    } else {
      int len = n * p.dim;
      if (kCopy.length < len) {
        kCopy = new float[len];
        vCopy = new float[len];
      }
      p.kBuf.get(at, kCopy, 0, len);
      p.vBuf.get(at, vCopy, 0, len);
      k = kCopy;
      v = vCopy;
      off = 0;
    }
    return this;
  }
}
