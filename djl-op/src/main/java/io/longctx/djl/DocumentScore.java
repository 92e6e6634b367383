package io.longctx.djl;

/**
 * The log-likelihood of one document under a causal language model: {@code nTokens} tokens,
 * {@code sumLogprob} the natural-log sum of log p(t_i | t_0..t_{i-1}) over i = 1..n-1 (0 for fewer
 * than two tokens), and, when asked for, each of those n-1 log-probabilities.
 *
 * @param logprobs the n-1 per-token log-probabilities, or null when not requested
 */
public record DocumentScore(int nTokens, double sumLogprob, float[] logprobs) {

  /** exp(-sumLogprob / (n - 1)), or NaN when fewer than two tokens were scored. */
  public double perplexity() {
    return nTokens < 2 ? Double.NaN : Math.exp(-sumLogprob / (nTokens - 1));
  }

  /**
   * -sumLogprob / ln 2 / utf8Bytes: bits per byte of the text the tokens came from; NaN when fewer
   * than two tokens were scored, as {@link #perplexity} (it was -0.0: "no bits" for a text not scored).
   */
  public double bitsPerByte(long utf8Bytes) {
    if (utf8Bytes <= 0) {
      throw new IllegalArgumentException("bits per byte needs a positive byte count, got " + utf8Bytes);
    }
    return nTokens < 2 ? Double.NaN : -sumLogprob / Math.log(2) / utf8Bytes;
  }
}
