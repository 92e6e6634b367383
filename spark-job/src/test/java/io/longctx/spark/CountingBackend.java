package io.longctx.spark;

import io.longctx.kernels.AttentionBackend;
import io.longctx.kernels.AttentionBackendProvider;
import io.longctx.kernels.AttentionOptions;
import io.longctx.kernels.AttentionState;
import io.longctx.kernels.CpuAttention;
import io.longctx.kernels.Tensor;
import io.longctx.kernels.UnifiedMax;
import java.util.concurrent.atomic.AtomicLong;

/**
 * A second backend for tests, registered in this module's test resources like any third-party
 * provider: the CPU kernels, counting its forward calls, so a test can show the job's tasks used
 * the backend the selector chose.
 */
final class CountingBackend implements AttentionBackend {
  static final AtomicLong FORWARD_CALLS = new AtomicLong();

  @Override
  public AttentionState forward(Tensor q, Tensor k, Tensor v, long[] qPos, long[] kPos, AttentionOptions opt) {
    FORWARD_CALLS.incrementAndGet();
    return CpuAttention.DEFAULT.forward(q, k, v, qPos, kPos, opt);
  }

  @Override
  public CpuAttention.DecodeResult decode(Tensor q, Tensor k, Tensor v, long[] qPos, long[] kPos, AttentionOptions opt,
      int splitLen) {
    return CpuAttention.DEFAULT.decode(q, k, v, qPos, kPos, opt, splitLen);
  }

  @Override
  public CpuAttention.DecodeResult decodeUnifiedMax(Tensor q, Tensor k, Tensor v, long[] qPos, long[] kPos,
      AttentionOptions opt, int splitLen, UnifiedMax um) {
    return CpuAttention.DEFAULT.decodeUnifiedMax(q, k, v, qPos, kPos, opt, splitLen, um);
  }

  @Override
  public String name() {
    return "counting";
  }

  public static final class Provider implements AttentionBackendProvider {
    @Override
    public String name() {
      return "counting";
    }

    @Override
    public int priority() {
      return -1; // never chosen by auto
    }

    @Override
    public String unavailableReason() {
      return null;
    }

    @Override
    public AttentionBackend open(int device) {
      return new CountingBackend();
    }
  }
}
