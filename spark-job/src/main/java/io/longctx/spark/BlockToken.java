package io.longctx.spark;

import java.io.Serializable;

/**
 * A prefill key token addressed to one query block: its k and v when the block sees the token's
 * chunk, its q when the block is its own (a prefill block is a chunk's own tokens); null where not
 * sent. The job routes every token straight to its blocks in one shuffle, and each block's task
 * assembles the chunks it sees from these rows ({@link ScoreJob#computeBlock}).
 */
public class BlockToken implements Serializable, KeyVectors {
  private static final long serialVersionUID = 1L;
  private String docId;
  private long block;
  private long chunk;
  private Long pos;
  private float[] k;
  private float[] v;
  private float[] q;

  public BlockToken() {}

  /** Token t of chunk c for block b: its K/V if the block sees the chunk, its q if b is c. */
  static BlockToken of(Token t, long b, long c, boolean withKv) {
    BlockToken r = new BlockToken();
    r.docId = t.getDocId();
    r.block = b;
    r.chunk = c;
    r.pos = t.getPos();
    if (withKv) {
      r.k = t.getK();
      r.v = t.getV();
    }
    r.q = b == c ? t.getQ() : null;
    return r;
  }

  public String getDocId() { return docId; }
  public void setDocId(String docId) { this.docId = docId; }
  public long getBlock() { return block; }
  public void setBlock(long block) { this.block = block; }
  public long getChunk() { return chunk; }
  public void setChunk(long chunk) { this.chunk = chunk; }
  public Long getPos() { return pos; }
  public void setPos(Long pos) { this.pos = pos; }
  public float[] getK() { return k; }
  public void setK(float[] k) { this.k = k; }
  public float[] getV() { return v; }
  public void setV(float[] v) { this.v = v; }
  public float[] getQ() { return q; }
  public void setQ(float[] q) { this.q = q; }
}
