package io.longctx.spark;

import java.io.Serializable;
import java.util.Arrays;

/**
 * Aggregation buffer of {@link LseMerge}: the partial states seen so far, unmerged, each tagged with
 * its chunk index. Entry i is {@code chunks[i]}, {@code lse[i*heads .. (i+1)*heads)},
 * {@code o[i*width .. (i+1)*width)} with width = heads * dim. Arrays grow by doubling in memory;
 * the getters trim them, so what Spark serializes at a shuffle holds exactly {@code size} entries.
 * Every field has a getter and a setter (bean encoder: a field without both is silently dropped).
 */
public class LseBuffer implements Serializable {
  private static final long serialVersionUID = 1L;
  private long[] chunks = new long[0];
  private float[] lse = new float[0];
  private float[] o = new float[0];
  private long keyCount;
  private int size;
  private int heads;
  private int width;

  public LseBuffer() {}

  void add(long chunk, long keys, float[] l, int lAt, float[] x, int xAt, int h, int w) {
    if (size == 0 && heads == 0) {
      heads = h;
      width = w;
    } else if (h != heads || w != width) {
      throw new IllegalArgumentException("lse_merge: states of different shapes in one group: lse of " + heads
          + " and " + h + " floats, o of " + width + " and " + w + " floats");
    }
    if (size == chunks.length) {
      int cap = Math.max(4, size * 2);
      chunks = Arrays.copyOf(chunks, cap);
      lse = Arrays.copyOf(lse, cap * heads);
      o = Arrays.copyOf(o, cap * width);
    }
    chunks[size] = chunk;
    System.arraycopy(l, lAt, lse, size * heads, heads);
    System.arraycopy(x, xAt, o, size * width, width);
    keyCount += keys;
    size++;
  }

  private void trim() {
    if (chunks.length != size) {
      chunks = Arrays.copyOf(chunks, size);
      lse = Arrays.copyOf(lse, size * heads);
      o = Arrays.copyOf(o, size * width);
    }
  }

  public long[] getChunks() { trim(); return chunks; }
  public void setChunks(long[] chunks) { this.chunks = chunks; }
  public float[] getLse() { trim(); return lse; }
  public void setLse(float[] lse) { this.lse = lse; }
  public float[] getO() { trim(); return o; }
  public void setO(float[] o) { this.o = o; }
  public long getKeyCount() { return keyCount; }
  public void setKeyCount(long keyCount) { this.keyCount = keyCount; }
  public int getSize() { return size; }
  public void setSize(int size) { this.size = size; }
  public int getHeads() { return heads; }
  public void setHeads(int heads) { this.heads = heads; }
  public int getWidth() { return width; }
  public void setWidth(int width) { this.width = width; }
}
