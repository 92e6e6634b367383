package io.longctx.examples;

import io.longctx.kernels.AttentionOptions;
import io.longctx.kernels.CpuAttention;
import io.longctx.kernels.Tensor;
import io.longctx.kernels.UnifiedMax;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Locale;
import java.util.SplittableRandom;
import java.util.function.Supplier;

/**
 * Benchmark of the CPU kernels: median wall time after warm-up, printed as one JSON object per line.
 *
 * <pre>
 *   forward: GFLOP/s with FLOPs = 4*B*H*Tq*Tk*D (halved for causal square)
 *   decode:  GB/s of K and V read, beside a plain copy of the same bytes in the same run
 * </pre>
 */
public final class KernelBench {

  private KernelBench() {}

  static final String USAGE = String.join("\n",
      "usage: KernelBench [--op forward|decode|all] [--t T] [--tk TK] [--heads H] [--kv-heads HKV] [--dim D]",
      "                   [--causal] [--iters N] [--warmup N] [--block-q BQ] [--block-k BK] [--split L]",
      "  forward defaults: T=4096, H=HKV=8, D=128, causal and non-causal when --op all",
      "  decode defaults:  TK=65536, 1 query row, H=32, HKV=8, D=128");

  public static void main(String[] args) {
    String op = "all";
    int t = 4096, tk = -1, heads = -1, kvHeads = -1, dim = 128, iters = 5, warmup = 2;
    int blockQ = 64, blockK = 128, split = CpuAttention.DEFAULT_SPLIT_LEN;
    Boolean causal = null;
    for (int i = 0; i < args.length; i++) {
      String a = args[i];
      switch (a) {
        case "--op" -> op = args[++i];
        case "--t" -> t = Integer.parseInt(args[++i]);
        case "--tk" -> tk = Integer.parseInt(args[++i]);
        case "--heads" -> heads = Integer.parseInt(args[++i]);
        case "--kv-heads" -> kvHeads = Integer.parseInt(args[++i]);
        case "--dim" -> dim = Integer.parseInt(args[++i]);
        case "--causal" -> causal = true;
        case "--iters" -> iters = Integer.parseInt(args[++i]);
        case "--warmup" -> warmup = Integer.parseInt(args[++i]);
        case "--block-q" -> blockQ = Integer.parseInt(args[++i]);
        case "--block-k" -> blockK = Integer.parseInt(args[++i]);
        case "--split" -> split = Integer.parseInt(args[++i]);
        case "--help", "-h" -> {
          System.out.println(USAGE);
          return;
        }
        default -> {
          System.err.println("unknown option " + a + "\n" + USAGE);
          System.exit(2);
        }
      }
    }
    CpuAttention kernels = new CpuAttention(blockQ, blockK);
    SplittableRandom rng = new SplittableRandom(42);
    if (op.equals("forward") || op.equals("all")) {
      int h = heads > 0 ? heads : 8, hkv = kvHeads > 0 ? kvHeads : h;
      Tensor q = random(rng, 1, h, t, dim);
      Tensor k = random(rng, 1, hkv, tk > 0 ? tk : t, dim);
      Tensor v = random(rng, 1, hkv, tk > 0 ? tk : t, dim);
      for (boolean c : causal != null ? new boolean[] {true} : new boolean[] {false, true}) {
        AttentionOptions opt = AttentionOptions.DEFAULT.withCausal(c);
        double flops = 4.0 * h * t * k.tokens() * dim * (c ? 0.5 : 1.0);
        double ms = medianMs(warmup, iters, () -> kernels.forward(q, k, v, null, null, opt));
        print("java", "forward", t, k.tokens(), h, hkv, dim, c, ms, "\"gflops\": %.1f".formatted(flops / ms / 1e6));
      }
    }
    if (op.equals("decode") || op.equals("all")) {
      int h = heads > 0 ? heads : 32, hkv = kvHeads > 0 ? kvHeads : 8, n = tk > 0 ? tk : 65536;
      int rows = op.equals("decode") && t != 4096 ? t : 1;
      Tensor q = random(rng, 1, h, rows, dim);
      Tensor k = random(rng, 1, hkv, n, dim);
      Tensor v = random(rng, 1, hkv, n, dim);
      long[] qPos = new long[rows];
      Arrays.fill(qPos, n);
      AttentionOptions opt = AttentionOptions.DEFAULT.withCausal(true);
      double bytes = 2.0 * k.data().length * Float.BYTES;
      int splitLen = split;
      double ms = medianMs(warmup, iters, () -> kernels.decode(q, k, v, qPos, null, opt, splitLen));
      print("java", "decode", rows, n, h, hkv, dim, true, ms, "\"gbps\": %.2f".formatted(bytes / ms / 1e6));
      UnifiedMax um = UnifiedMax.of(0f);
      double msU = medianMs(warmup, iters, () -> kernels.decodeUnifiedMax(q, k, v, qPos, null, opt, splitLen, um));
      print("java-unified-max", "decode", rows, n, h, hkv, dim, true, msU, "\"gbps\": %.2f".formatted(bytes / msU / 1e6));
      float[] dst = new float[k.data().length];
      double msCopy = medianMs(warmup, iters, () -> {
        System.arraycopy(k.data(), 0, dst, 0, dst.length);
        System.arraycopy(v.data(), 0, dst, 0, dst.length);
        return dst;
      });
      print("copy", "decode", rows, n, h, hkv, dim, true, msCopy, "\"gbps\": %.2f".formatted(bytes / msCopy / 1e6));
    }
  }

  static Tensor random(SplittableRandom rng, int b, int h, int t, int d) {
    float[] x = new float[b * h * t * d];
    for (int i = 0; i < x.length; i++) {
      x[i] = (float) rng.nextGaussian();
    }
    return new Tensor(x, b, h, t, d);
  }

  static double medianMs(int warmup, int iters, Supplier<?> body) {
    for (int i = 0; i < warmup; i++) {
      body.get();
    }
    List<Double> times = new ArrayList<>();
    for (int i = 0; i < iters; i++) {
      long t0 = System.nanoTime();
      body.get();
      times.add((System.nanoTime() - t0) / 1e6);
    }
    times.sort(null);
    return times.get(times.size() / 2);
  }

  static void print(String impl, String op, int t, int tk, int h, int hkv, int d, boolean causal, double ms,
      String figure) {
    System.out.println(String.format(Locale.ROOT,
        "{\"impl\": \"%s\", \"op\": \"%s\", \"t\": %d, \"tk\": %d, \"heads\": %d, \"kv_heads\": %d, \"dim\": %d, "
            + "\"causal\": %b, \"ms\": %.2f, %s}", impl, op, t, tk, h, hkv, d, causal, ms, figure));
  }
}
