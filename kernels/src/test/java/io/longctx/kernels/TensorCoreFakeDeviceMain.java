package io.longctx.kernels;

import java.util.Arrays;
import java.util.Locale;
import java.util.SplittableRandom;

/**
 * Run in a child JVM by {@link CudaTensorCoreEmulationTest} with the emulating fake libcuda on
 * LD_LIBRARY_PATH: the tensor-core forward (flash_forward_tc.cu, through CudaAttention and JCuda) on
 * small awkward shapes, each against the float64 reference by the rounded-P rule
 * ({@link Tolerance#violationRoundedP}). Prints the seed, then one line per case: {@code name=pass}
 * (with its errors and a hash of the output's bits) or {@code name=FAIL: why}.
 */
public final class TensorCoreFakeDeviceMain {
  private TensorCoreFakeDeviceMain() {}

  /**
   * Type, [B, H, Hkv, Tq, Tk, D], mask, first query position (null: the last Tq of the keys' 0..Tk-1):
   * Tq 1, 5, 7, 65, 100 (one partial 128-row block; 100: warp 3's second row block all past Tq), 130
   * and 200 (a whole and a partial block); Tk 1 to 600 (up to ten 64-key tiles).
   */
  private record Case(CudaAttention.DType type, int[] shape, AttentionOptions opt, Long qStart) {
    /** Queries at the last Tq positions of the keys' 0..Tk-1. */
    Case(CudaAttention.DType type, int[] shape, AttentionOptions opt) {
      this(type, shape, opt, null);
    }

    String name() {
      return String.format(Locale.ROOT, "%s[%d,%d/%d,%d,%d,%d]%s", CudaAttention.kernelFor(type, shape[5]),
          shape[0], shape[1], shape[2], shape[3], shape[4], shape[5], GpuCheck.maskName(opt).replace(' ', '-'));
    }
  }

  public static void main(String[] args) {
    AttentionBackend backend = AttentionBackend.select("cuda");
    CudaAttention cuda = (CudaAttention) backend;
    long seed = Seeds.forTest();
    System.out.println("seed=" + seed);
    SplittableRandom rng = new SplittableRandom(seed);
    AttentionOptions full = AttentionOptions.DEFAULT, causal = full.withCausal(true);
    CudaAttention.DType f16 = CudaAttention.DType.F16, bf16 = CudaAttention.DType.BF16;
    Case[] cases = {
        new Case(bf16, new int[] {1, 2, 1, 1, 1, 64}, full),
        new Case(f16, new int[] {1, 2, 2, 7, 7, 128}, causal),
        new Case(bf16, new int[] {1, 4, 2, 65, 65, 64}, causal),
        new Case(f16, new int[] {1, 2, 1, 65, 130, 128}, causal.withWindow(50)),
        new Case(bf16, new int[] {2, 2, 1, 130, 130, 64}, causal.withSoftcap(30f)),
        new Case(f16, new int[] {1, 4, 1, 7, 130, 64}, full.withWindow(20)),
        // Query positions 123..252 over keys 0..129 under a window of 100: whole key tiles are skipped.
        new Case(bf16, new int[] {1, 2, 2, 130, 130, 128}, causal.withWindow(100), 123L),
        // Query positions 420..439 over keys 0..599 under a window of 40: key tiles 0-4 and 7-9 are
        // skipped, the first visible one (5) is the second of find_tile's second batch of 4.
        new Case(f16, new int[] {1, 1, 1, 20, 600, 64}, causal.withWindow(40), 420L),
        // Two 128-row blocks, the second partial, causal: the heavier second block runs first and its
        // diagonal tiles are partial for rows of several warps.
        new Case(bf16, new int[] {1, 2, 1, 200, 200, 128}, causal),
        // One partial 128-row block whose last warp has no row below Tq, over 5 key tiles.
        new Case(f16, new int[] {1, 2, 2, 100, 260, 64}, causal),
        // Queries before every key, causal: no tile is visible, no copy is issued, (0, -inf) rows.
        new Case(bf16, new int[] {1, 2, 1, 5, 70, 128}, causal, -10L),
        // No mask over three whole key tiles and 8 keys of a fourth: the whole tiles take no per-element
        // work, the last one must still drop the keys past Tk.
        new Case(f16, new int[] {1, 2, 1, 70, 200, 128}, full),
        // Queries after every key, causal: both key tiles are fully visible, the second 6 keys long.
        new Case(bf16, new int[] {1, 2, 1, 5, 70, 64}, causal, 100L),
    };
    for (Case c : cases) {
      System.out.println(c.name() + "=" + run(cuda, c, rng));
    }
    System.out.println("fp16-overflow=" + fp16Overflow(cuda, rng));
    System.out.println("qk-overflow=" + qkOverflow(cuda, rng));
  }

  /**
   * q and k whose q.k overflows float32 (2e19 x -2e19 at dim 0; each fits bf16): refused before
   * anything is sent, on the forward and on decode, where the kernels would have taken every key as
   * masked. Large values whose q.k cannot overflow still run.
   */
  private static String qkOverflow(CudaAttention cuda, SplittableRandom rng) {
    Tensor q = Tensor.random(rng, 1, 2, 3, 64), k = Tensor.random(rng, 1, 1, 5, 64);
    Tensor v = Tensor.random(rng, 1, 1, 5, 64);
    q.data()[0] = 2e19f;
    k.data()[0] = -2e19f;
    for (int path = 0; path < 2; path++) {
      try {
        if (path == 0) {
          cuda.forward(q, k, v, null, null, AttentionOptions.DEFAULT, CudaAttention.DType.BF16);
        } else {
          cuda.decode(q, k, v, new long[] {2, 3, 4}, null, AttentionOptions.DEFAULT.withCausal(true), 4);
        }
        return "FAIL: no error on " + (path == 0 ? "the forward" : "decode");
      } catch (QkMayOverflowException e) { // its own type: callers name where (LlamaModel: layer, positions)
        if (!e.getMessage().contains("overflow float32")) {
          return "FAIL: " + e.getMessage();
        }
      } catch (IllegalArgumentException e) {
        return "FAIL: not a QkMayOverflowException: " + e;
      }
    }
    q.data()[0] = 1e9f; // q.k up to 2e28: far from float32's limit
    k.data()[0] = -1e9f;
    AttentionState st = cuda.forward(q, k, v, null, null, AttentionOptions.DEFAULT, CudaAttention.DType.BF16);
    return Float.isFinite(st.lse()[0]) ? "pass" : "FAIL: lse " + st.lse()[0];
  }

  /** One case: "pass" with errors and the output's bits, or "FAIL: why". */
  private static String run(CudaAttention cuda, Case c, SplittableRandom rng) {
    String bad;
    try {
      int[] s = c.shape();
      Tensor q = GpuCheck.rounded(Tensor.random(rng, s[0], s[1], s[3], s[5]), c.type());
      Tensor k = GpuCheck.rounded(Tensor.random(rng, s[0], s[2], s[4], s[5]), c.type());
      Tensor v = GpuCheck.rounded(Tensor.random(rng, s[0], s[2], s[4], s[5]), c.type());
      long[] qp = GpuCheck.lastPositions(s[3], s[4]);
      if (c.qStart() != null) {
        for (int t = 0; t < qp.length; t++) {
          qp[t] = c.qStart() + t;
        }
      }
      AttentionState got = GpuCheck.run(cuda, c.type(), q, k, v, qp, c.opt());
      ReferenceAttention.Result ref = ReferenceAttention.compute(q, k, v, qp, null, c.opt());
      bad = Tolerance.violationRoundedP(got.o(), got.lse(), ref,
          ReferenceAttention.computeRoundedP(q, k, v, qp, null, c.opt(), c.type()));
      if (bad == null) {
        // The output's bits, to compare runs whose cp.async copies land at different times.
        bad = "pass " + Tolerance.errors(got.o(), got.lse(), ref) + " bits "
            + Integer.toHexString(31 * Arrays.hashCode(got.o()) + Arrays.hashCode(got.lse()));
      }
    } catch (RuntimeException | AssertionError e) {
      bad = e.toString();
    }
    return bad.startsWith("pass") ? bad : "FAIL: " + bad;
  }

  /** An fp16 overflow in the host-array forward is an error naming the element. */
  private static String fp16Overflow(CudaAttention cuda, SplittableRandom rng) {
    Tensor q = Tensor.random(rng, 1, 2, 3, 64), k = Tensor.random(rng, 1, 1, 5, 64);
    Tensor v = Tensor.random(rng, 1, 1, 5, 64);
    k.data()[(3 * 64) + 17] = 70000f; // key position 3, dim 17
    try {
      cuda.forward(q, k, v, null, null, AttentionOptions.DEFAULT, CudaAttention.DType.F16);
      return "FAIL: no error";
    } catch (IllegalArgumentException e) {
      String m = e.getMessage();
      return m.contains("k ") && m.contains("position 3, dim 17") && m.contains("fp16") ? "pass" : "FAIL: " + m;
    }
  }
}
