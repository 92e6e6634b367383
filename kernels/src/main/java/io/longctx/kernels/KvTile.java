package io.longctx.kernels;

/**
 * Where the kernels read one key tile's keys and values: the Tensors' own arrays, or, for keys and
 * values in buffers ({@link BufferTensor}: a DJL array's native memory), copies of the tile in arrays
 * of this thread. A task reads each tile of its buffer once that way, in order, and the inner loops
 * keep reading float[].
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
    if (p.kb == null) {
      k = p.k.data();
      v = p.v.data();
      off = p.kvOffset(b, kvh) + jt * p.dim;
    } else {
      int len = n * p.dim;
      if (kCopy.length < len) {
        kCopy = new float[len];
        vCopy = new float[len];
      }
      p.kb.readRows(b, kvh, jt, n, kCopy, 0);
      p.vb.readRows(b, kvh, jt, n, vCopy, 0);
      k = kCopy;
      v = vCopy;
      off = 0;
    }
    return this;
  }

  /**
   * Drops the references to the caller's arrays at the end of a task: this object lives as long as
   * its pool thread, and a reference left here kept a call's arrays (the operator's staged K/V copy,
   * hundreds of MiB, held only softly on purpose) from ever being collected.
   */
  void release() {
    k = null;
    v = null;
  }
}
