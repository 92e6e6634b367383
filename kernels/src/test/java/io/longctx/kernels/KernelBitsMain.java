package io.longctx.kernels;

import java.util.Arrays;
import java.util.SplittableRandom;

/**
 * Prints a digest of the kernels' output bits on fixed inputs; {@link JitDeterminismTest} runs it in
 * a child JVM whose JIT never reaches C2 (the Vector API then runs its plain-Java fallbacks).
 */
public final class KernelBitsMain {
  private KernelBitsMain() {}

  static String digest() {
    SplittableRandom rng = new SplittableRandom(20261122);
    Tensor q = Tensor.random(rng, 1, 4, 150, 64, 1.5);
    Tensor k = Tensor.random(rng, 1, 2, 700, 64, 1.5);
    Tensor v = Tensor.random(rng, 1, 2, 700, 64);
    long[] qp = new long[150];
    for (int t = 0; t < qp.length; t++) {
      qp[t] = 550 + t;
    }
    AttentionOptions capped = AttentionOptions.DEFAULT.withCausal(true).withSoftcap(3f);
    AttentionOptions window = AttentionOptions.DEFAULT.withCausal(true).withWindow(200);
    // Decode blocks and a forward of few rows (keys in the SIMD lanes): 2 heads per kv head x 2
    // tokens, and one row of an odd head dim.
    Tensor qFew = Tensor.random(rng, 1, 4, 2, 64, 1.5);
    long[] qpFew = {690, 699};
    Tensor q1 = Tensor.random(rng, 1, 3, 1, 100, 1.5);
    Tensor k1 = Tensor.random(rng, 1, 3, 333, 100, 1.5);
    Tensor v1 = Tensor.random(rng, 1, 3, 333, 100);
    int h = 1;
    for (AttentionState s : new AttentionState[] {
        CpuAttention.DEFAULT.forward(q, k, v, qp, null, capped),
        CpuAttention.DEFAULT.forward(q, k, v, qp, null, window),
        CpuAttention.DEFAULT.decode(q, k, v, qp, null, window, 128).state(),
        CpuAttention.DEFAULT.decodeUnifiedMax(q, k, v, qp, null, capped, 128, UnifiedMax.of(1f)).state(),
        CpuAttention.DEFAULT.decode(qFew, k, v, qpFew, null, window, 128).state(),
        CpuAttention.DEFAULT.decodeUnifiedMax(qFew, k, v, qpFew, null, capped, 128, UnifiedMax.of(1f)).state(),
        CpuAttention.DEFAULT.decode(q1, k1, v1, new long[] {400}, null, AttentionOptions.DEFAULT.withCausal(true), 100)
            .state(),
        CpuAttention.DEFAULT.forward(qFew, k, v, qpFew, null, capped)}) {
      h = 31 * h + Arrays.hashCode(s.o());
      h = 31 * h + Arrays.hashCode(s.lse());
    }
    return Integer.toHexString(h);
  }

  public static void main(String[] args) {
    System.out.println("digest=" + digest());
  }
}
