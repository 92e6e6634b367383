package io.longctx.spark;

import java.io.Serializable;

/**
 * One query row's state with the row's identity: in decode the partial state over chunk {@code chunk};
 * in prefill (queryId null) the token's final state, merged in its block's task (chunk unused).
 */
public class Partial implements Serializable {
  private static final long serialVersionUID = 1L;
  private String docId;
  private String queryId;
  private Long pos;
  private long chunk;
  private long keyCount;
  private float[] lse;
  private float[] o;

  public Partial() {}

  public String getDocId() { return docId; }
  public void setDocId(String docId) { this.docId = docId; }
  public String getQueryId() { return queryId; }
  public void setQueryId(String queryId) { this.queryId = queryId; }
  public Long getPos() { return pos; }
  public void setPos(Long pos) { this.pos = pos; }
  public long getChunk() { return chunk; }
  public void setChunk(long chunk) { this.chunk = chunk; }
  public long getKeyCount() { return keyCount; }
  public void setKeyCount(long keyCount) { this.keyCount = keyCount; }
  public float[] getLse() { return lse; }
  public void setLse(float[] lse) { this.lse = lse; }
  public float[] getO() { return o; }
  public void setO(float[] o) { this.o = o; }
}
