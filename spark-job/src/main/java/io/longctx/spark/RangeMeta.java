package io.longctx.spark;

import java.io.Serializable;

/** Position range of a chunk or a query block, collected on the driver to plan the pairs. */
public class RangeMeta implements Serializable {
  private static final long serialVersionUID = 1L;
  private String docId;
  private long index;
  private long min;
  private long max;
  private long count;
  private boolean hasPos;
  private String sample;

  public RangeMeta() {}

  public String getDocId() { return docId; }
  public void setDocId(String docId) { this.docId = docId; }
  public long getIndex() { return index; }
  public void setIndex(long index) { this.index = index; }
  public long getMin() { return min; }
  public void setMin(long min) { this.min = min; }
  public long getMax() { return max; }
  public void setMax(long max) { this.max = max; }
  public long getCount() { return count; }
  public void setCount(long count) { this.count = count; }
  public boolean getHasPos() { return hasPos; }
  public void setHasPos(boolean hasPos) { this.hasPos = hasPos; }
  public String getSample() { return sample; }
  public void setSample(String sample) { this.sample = sample; }
}
