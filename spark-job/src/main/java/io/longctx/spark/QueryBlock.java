package io.longctx.spark;

import java.io.Serializable;

/**
 * Up to a block of queries of one document, computed together against each visible chunk:
 * q as [heads, Tq, dim], their positions and ids (ids null in prefill mode, where the rows are the
 * document's own tokens). {@code hasPos} false: the queries carry no position and attend the whole
 * document (no mask). {@code chunk} is the key chunk the block is paired with (decode); a block
 * that sees no chunk is never paired.
 */
public class QueryBlock implements Serializable {
  private static final long serialVersionUID = 1L;
  private String docId;
  private long block;
  private boolean hasPos;
  private String[] ids;
  private long[] qPos;
  private float[] q;
  private long chunk;

  public QueryBlock() {}

  QueryBlock withChunk(long c) {
    QueryBlock b = new QueryBlock();
    b.docId = docId;
    b.block = block;
    b.hasPos = hasPos;
    b.ids = ids;
    b.qPos = qPos;
    b.q = q;
    b.chunk = c;
    return b;
  }

  public String getDocId() { return docId; }
  public void setDocId(String docId) { this.docId = docId; }
  public long getBlock() { return block; }
  public void setBlock(long block) { this.block = block; }
  public boolean getHasPos() { return hasPos; }
  public void setHasPos(boolean hasPos) { this.hasPos = hasPos; }
  public String[] getIds() { return ids; }
  public void setIds(String[] ids) { this.ids = ids; }
  public long[] getQPos() { return qPos; }
  public void setQPos(long[] qPos) { this.qPos = qPos; }
  public float[] getQ() { return q; }
  public void setQ(float[] q) { this.q = q; }
  public long getChunk() { return chunk; }
  public void setChunk(long chunk) { this.chunk = chunk; }
}
