package io.longctx.spark;

import java.io.Serializable;

/**
 * A prefill key token addressed to a group of query blocks ({@link PairPlan#groupOf}, named by the
 * first) and the pair-stage partition that computes it: its k and v when one of the blocks sees the
 * token's chunk, its q when one of them is its own (a prefill block is a chunk's own tokens); null
 * where not sent. The job routes every token straight to its groups in one shuffle, and each group's
 * task assembles the chunks its blocks see from these rows ({@link ScoreJob#computeGroup}).
 */
public class BlockToken implements Serializable, KeyVectors {
  private static final long serialVersionUID = 1L;
  private String docId;
  private long group;
  private int partition;
  private long chunk;
  private Long pos;
  private float[] k;
  private float[] v;
  private float[] q;

  public BlockToken() {}

  /**
   * Token t of chunk c for group g, computed in partition p of the pair stage: its K/V if a block of g
   * sees the chunk, its q if c is one of them.
   */
  static BlockToken of(Token t, long g, int p, long c, boolean withKv, boolean withQ) {
    BlockToken r = new BlockToken();
    r.docId = t.getDocId();
    r.group = g;
    r.partition = p;
    r.chunk = c;
    r.pos = t.getPos();
    if (withKv) {
      r.k = t.getK();
      r.v = t.getV();
    }
    r.q = withQ ? t.getQ() : null;
    return r;
  }

  public String getDocId() { return docId; }
  public void setDocId(String docId) { this.docId = docId; }
  public long getGroup() { return group; }
  public void setGroup(long group) { this.group = group; }
  public int getPartition() { return partition; }
  public void setPartition(int partition) { this.partition = partition; }
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
