package io.longctx.kernels;

/**
 * Something that computes the attention state of queries over one key/value chunk: the CPU kernels
 * or the CUDA kernels, or another registered {@link AttentionBackendProvider}. {@link #select()} picks
 * one by {@code -Dlongctx.backend=auto|cpu|cuda|NAME}.
 */
public interface AttentionBackend {

  /** See {@link CpuAttention#forward}; every backend meets the same contract and tolerance. */
  AttentionState forward(Tensor q, Tensor k, Tensor v, long[] qPos, long[] kPos, AttentionOptions opt);

  /**
   * Split-K decoding of a few query rows over a long KV sequence: see {@link CpuAttention#decode};
   * the CUDA backend meets the same contract and tolerance.
   */
  CpuAttention.DecodeResult decode(Tensor q, Tensor k, Tensor v, long[] qPos, long[] kPos, AttentionOptions opt,
      int splitLen);

  /** Split-K decoding with the FlashDecoding++ unified maximum: see {@link CpuAttention#decodeUnifiedMax}. */
  CpuAttention.DecodeResult decodeUnifiedMax(Tensor q, Tensor k, Tensor v, long[] qPos, long[] kPos,
      AttentionOptions opt, int splitLen, UnifiedMax um);

  /** Short name for logs and summaries: "cpu" or "cuda:&lt;ordinal&gt; &lt;device name&gt;". */
  String name();

  /**
   * The backend named by the system property {@code longctx.backend} (default {@code auto}): see
   * {@link AttentionBackends}, the one selector.
   */
  static AttentionBackend select() {
    return AttentionBackends.select(AttentionBackends.choice());
  }

  static AttentionBackend select(String choice) {
    return AttentionBackends.select(choice);
  }
}
