package io.longctx.spark;

import java.io.Serializable;

/**
 * Input of the {@code lse_merge} aggregation: one partial attention state of one query row over
 * one key chunk. Bean fields are bound by alphabetical position when the aggregator is used as a
 * SQL function: {@code lse_merge(chunk, key_count, lse, o)}.
 */
public class StatePart implements Serializable {
  private static final long serialVersionUID = 1L;
  private long chunk;
  private long keyCount;
  private float[] lse;
  private float[] o;

  public StatePart() {}

  public StatePart(long chunk, long keyCount, float[] lse, float[] o) {
    this.chunk = chunk;
    this.keyCount = keyCount;
    this.lse = lse;
    this.o = o;
  }

  public long getChunk() { return chunk; }
  public void setChunk(long chunk) { this.chunk = chunk; }
  public long getKeyCount() { return keyCount; }
  public void setKeyCount(long keyCount) { this.keyCount = keyCount; }
  public float[] getLse() { return lse; }
  public void setLse(float[] lse) { this.lse = lse; }
  public float[] getO() { return o; }
  public void setO(float[] o) { this.o = o; }
}
