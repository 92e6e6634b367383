package io.longctx.spark;

import java.io.Serializable;

/**
 * The keys of one document whose positions fall in [chunk * chunkLen, (chunk + 1) * chunkLen),
 * sorted by position: kPos [Tk], k and v as [kvHeads, Tk, dim] (the kernels' Tensor layout, batch 1).
 * In a prefill block's own chunk q [heads, Tk, dim] holds the same tokens' queries; otherwise null.
 */
public class Chunk implements Serializable {
  private static final long serialVersionUID = 1L;
  private String docId;
  private long chunk;
  private long[] kPos;
  private float[] k;
  private float[] v;
  private float[] q;

  public Chunk() {}

  public String getDocId() { return docId; }
  public void setDocId(String docId) { this.docId = docId; }
  public long getChunk() { return chunk; }
  public void setChunk(long chunk) { this.chunk = chunk; }
  public long[] getKPos() { return kPos; }
  public void setKPos(long[] kPos) { this.kPos = kPos; }
  public float[] getK() { return k; }
  public void setK(float[] k) { this.k = k; }
  public float[] getV() { return v; }
  public void setV(float[] v) { this.v = v; }
  public float[] getQ() { return q; }
  public void setQ(float[] q) { this.q = q; }
}
