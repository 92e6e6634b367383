package io.longctx.spark;

import java.io.Serializable;

/** Output of {@code lse_merge}: the merged state of one query row and the keys it attended. */
public class MergedState implements Serializable {
  private static final long serialVersionUID = 1L;
  private long keyCount;
  private float[] lse;
  private float[] o;

  public MergedState() {}

  public MergedState(long keyCount, float[] lse, float[] o) {
    this.keyCount = keyCount;
    this.lse = lse;
    this.o = o;
  }

  public long getKeyCount() { return keyCount; }
  public void setKeyCount(long keyCount) { this.keyCount = keyCount; }
  public float[] getLse() { return lse; }
  public void setLse(float[] lse) { this.lse = lse; }
  public float[] getO() { return o; }
  public void setO(float[] o) { this.o = o; }
}
