package io.longctx.spark;

import java.io.Serializable;

/**
 * The keys of one document whose positions fall in [chunk * chunkLen, (chunk + 1) * chunkLen),
 * sorted by position: kPos [Tk], k and v as [kvHeads, Tk, dim] (the kernels' Tensor layout, batch 1).
 * In prefill mode q [heads, Tk, dim] holds the same tokens' queries; otherwise null. {@code block}: on
 * the copies sent to prefill query blocks (a chunk's q to its own block, its K/V to every block that
 * sees it), the receiving block (-1 otherwise).
 */
public class Chunk implements Serializable {
  private static final long serialVersionUID = 1L;
  private String docId;
  private long chunk;
  private long[] kPos;
  private float[] k;
  private float[] v;
  private float[] q;
  private long block = -1;

  public Chunk() {}

  /** This chunk's q and positions, without K/V, addressed to its own prefill query block. */
  Chunk qForOwnBlock() {
    Chunk c = new Chunk();
    c.docId = docId;
    c.chunk = chunk;
    c.kPos = kPos;
    c.q = q;
    c.block = chunk;
    return c;
  }

  /** This chunk's keys and values, without q, addressed to prefill query block {@code b}. */
  Chunk kvFor(long b) {
    Chunk c = new Chunk();
    c.docId = docId;
    c.chunk = chunk;
    c.kPos = kPos;
    c.k = k;
    c.v = v;
    c.block = b;
    return c;
  }

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
  public long getBlock() { return block; }
  public void setBlock(long block) { this.block = block; }
}
