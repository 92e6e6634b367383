package io.longctx.spark;

import java.io.Serializable;

/**
 * One input row as read: a key token (docId, pos, k, v and in prefill q) or a query (queryId,
 * docId, optional pos, q). {@code file} is the input file, kept only until the row is validated; {@code bad} a
 * problem found while reading ({@link ScoreJob#readProblem}).
 */
public class Token implements Serializable, KeyVectors {
  private static final long serialVersionUID = 1L;
  private String queryId;
  private String docId;
  private Long pos;
  private float[] k;
  private float[] v;
  private float[] q;
  private String file;
  private String bad;
  private java.util.List<Float> suspectVec;

  public Token() {}

  public String getQueryId() { return queryId; }
  public void setQueryId(String queryId) { this.queryId = queryId; }
  public String getDocId() { return docId; }
  public void setDocId(String docId) { this.docId = docId; }
  public Long getPos() { return pos; }
  public void setPos(Long pos) { this.pos = pos; }
  public float[] getK() { return k; }
  public void setK(float[] k) { this.k = k; }
  public float[] getV() { return v; }
  public void setV(float[] v) { this.v = v; }
  public float[] getQ() { return q; }
  public void setQ(float[] q) { this.q = q; }
  public String getFile() { return file; }
  public void setFile(String file) { this.file = file; }
  /** A problem found while reading (malformed JSON line, null or NaN vector element), reported by validation. */
  public String getBad() { return bad; }
  public void setBad(String bad) { this.bad = bad; }
  /** The first vector with a null or NaN element, as read (null for every other row). */
  public java.util.List<Float> getSuspectVec() { return suspectVec; }
  public void setSuspectVec(java.util.List<Float> suspectVec) { this.suspectVec = suspectVec; }
}
