package io.longctx.kernels;

/**
 * q and k whose q.k could overflow float32, refused before a kernel ran: a bound over the whole call
 * ({@link Tensor#qkMayOverflow}), not a score that was found, so it names no query or key. The CUDA
 * backend raises it (its kernels would take an overflowed q.k as a masked key); the CPU backend checks
 * each score instead and raises {@link NonFiniteScoreException}. Bad input, so callers that know
 * more (a document, a layer, positions) can say where.
 */
public final class QkMayOverflowException extends IllegalArgumentException {
  private static final long serialVersionUID = 1L;

  public QkMayOverflowException(String message) {
    super(message);
  }
}
