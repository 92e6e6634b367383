package io.longctx.kernels;

/**
 * A (query, key) pair whose attention score is not a finite float32: q or k holds NaN or Infinity,
 * or q.k overflows float32. Bad input, named by place, so callers that know more (a document id, a
 * query id) can say where.
 */
public final class NonFiniteScoreException extends IllegalArgumentException {
  private static final long serialVersionUID = 1L;

  /** Batch entry, query head, query token index, key token index within the call's tensors. */
  public final int batch;
  public final int head;
  public final int queryToken;
  public final int keyToken;
  /** Absolute positions of the query and the key. */
  public final long queryPos;
  public final long keyPos;
  /** The score as computed: NaN, +Infinity or -Infinity. */
  public final float score;

  /** {@code cause}: which of q and k holds a NaN or an infinity (and where), or that q.k overflows. */
  NonFiniteScoreException(int batch, int head, int queryToken, long queryPos, int keyToken, long keyPos, float score,
      String cause) {
    super("non-finite attention score (" + score + ") at batch " + batch + ", head " + head + ", query token "
        + queryToken + " (position " + queryPos + "), key token " + keyToken + " (position " + keyPos + "): " + cause);
    this.batch = batch;
    this.head = head;
    this.queryToken = queryToken;
    this.keyToken = keyToken;
    this.queryPos = queryPos;
    this.keyPos = keyPos;
    this.score = score;
  }
}
