package io.longctx.kernels;

/**
 * Something that computes the attention state of queries over one key/value chunk: the CPU kernels
 * or the CUDA kernels. {@link #select()} picks one by {@code -Dlongctx.backend=auto|cpu|cuda}.
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

  /** Short name for logs and summaries: "cpu" or "cuda:&lt;device&gt;". */
  String name();

  /**
   * The backend named by the system property {@code longctx.backend} (default {@code auto}):
   * {@code cpu}; {@code cuda}, which fails loudly when CUDA is unavailable; or {@code auto}, CUDA
   * when a device and the fatbin are there, else the CPU kernels, with one log line saying why.
   */
  static AttentionBackend select() {
    return select(System.getProperty("longctx.backend", "auto"));
  }

  static AttentionBackend select(String choice) {
    switch (choice) {
      case "cpu":
        return CpuAttention.DEFAULT;
      case "cuda": {
        CudaProbe.Status s = CudaProbe.status();
        if (!s.available()) {
          throw new IllegalStateException("longctx.backend=cuda but CUDA is unavailable: " + s.reason());
        }
        return CudaAttention.instance();
      }
      case "auto": {
        CudaProbe.Status s = CudaProbe.status();
        if (s.available()) {
          return CudaAttention.instance();
        }
        CudaProbe.logFallbackOnce(s);
        return CpuAttention.DEFAULT;
      }
      default:
        throw new IllegalArgumentException("longctx.backend must be auto, cpu or cuda, got '" + choice + "'");
    }
  }
}
