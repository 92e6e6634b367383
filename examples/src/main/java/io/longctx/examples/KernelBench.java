package io.longctx.examples;

import ai.djl.ndarray.NDArray;
import ai.djl.ndarray.NDList;
import ai.djl.ndarray.types.Shape;
import io.longctx.djl.LibtorchSdpa;
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
 * Benchmark of the CPU kernels against the anchor, libtorch's fused CPU attention through DJL, on
 * the same inputs in the same process: median wall time after warm-up, one JSON object per line.
 * The implementations alternate within each iteration so that drift of this shared machine hits
 * both alike; compare ratios, not absolute times.
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
      "                   [--no-anchor]",
      "  forward defaults: T=4096, H=HKV=8, D=128, causal and non-causal when --op all",
      "  decode defaults:  TK=65536, 1 query row, H=32, HKV=8, D=128");

  public static void main(String[] args) {
    String op = "all";
    int t = 4096, tk = -1, heads = -1, kvHeads = -1, dim = 128, iters = 7, warmup = 5;
    int blockQ = 32, blockK = 128, split = CpuAttention.DEFAULT_SPLIT_LEN;
    Boolean causal = null;
    boolean anchor = true;
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
        case "--no-anchor" -> anchor = false;
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
    try (LibtorchSdpa sdpa = anchor ? LibtorchSdpa.open() : null) {
      run(op, t, tk, heads, kvHeads, dim, iters, warmup, split, causal, kernels, sdpa);
    }
  }

  private static void run(String op, int t, int tk, int heads, int kvHeads, int dim, int iters, int warmup, int split,
      Boolean causal, CpuAttention kernels, LibtorchSdpa sdpa) {
    SplittableRandom rng = new SplittableRandom(42);
    if (op.equals("forward") || op.equals("all")) {
      int h = heads > 0 ? heads : 8, hkv = kvHeads > 0 ? kvHeads : h;
      Tensor q = random(rng, 1, h, t, dim);
      Tensor k = random(rng, 1, hkv, tk > 0 ? tk : t, dim);
      Tensor v = random(rng, 1, hkv, tk > 0 ? tk : t, dim);
      NDArray[] nd = sdpa != null ? toNd(sdpa, q, k, v) : null;
      for (boolean c : causal != null ? new boolean[] {true} : new boolean[] {false, true}) {
        AttentionOptions opt = AttentionOptions.DEFAULT.withCausal(c);
        double flops = 4.0 * h * t * k.tokens() * dim * (c ? 0.5 : 1.0);
        List<Supplier<?>> impls = new ArrayList<>(List.of(() -> kernels.forward(q, k, v, null, null, opt)));
        if (sdpa != null) {
          impls.add(() -> sdpaCall(sdpa, nd, c));
        }
        double[] ms = medianMs(warmup, iters, impls);
        print("java", "forward", t, k.tokens(), h, hkv, dim, c, ms[0], gflops(flops, ms[0]) + ratio(ms, 0, sdpa != null ? 1 : -1));
        if (sdpa != null) {
          print("libtorch-sdpa", "forward", t, k.tokens(), h, hkv, dim, c, ms[1], gflops(flops, ms[1]));
        }
      }
      closeAll(nd);
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
      UnifiedMax um = UnifiedMax.calibrate(q, k, opt);
      float[] dst = new float[k.data().length];
      List<Supplier<?>> impls = new ArrayList<>(List.of(
          () -> kernels.decode(q, k, v, qPos, null, opt, splitLen),
          () -> kernels.decodeUnifiedMax(q, k, v, qPos, null, opt, splitLen, um),
          () -> {
            System.arraycopy(k.data(), 0, dst, 0, dst.length);
            System.arraycopy(v.data(), 0, dst, 0, dst.length);
            return dst;
          }));
      NDArray[] nd = sdpa != null ? toNd(sdpa, q, k, v) : null;
      if (sdpa != null) {
        // Every query row sits after every key, so full (non-causal) attention is the same answer.
        impls.add(() -> sdpaCall(sdpa, nd, false));
      }
      double[] ms = medianMs(warmup, iters, impls);
      String[] names = {"java", "java-unified-max", "copy", "libtorch-sdpa"};
      for (int i = 0; i < ms.length; i++) {
        String extra = i < 2 ? ratio(ms, i, sdpa != null ? 3 : -1) + ", \"vs_copy\": %.2f".formatted(ms[2] / ms[i]) : "";
        print(names[i], "decode", rows, n, h, hkv, dim, true, ms[i], "\"gbps\": %.2f".formatted(bytes / ms[i] / 1e6) + extra);
      }
      closeAll(nd);
    }
  }

  static Tensor random(SplittableRandom rng, int b, int h, int t, int d) {
    float[] x = new float[b * h * t * d];
    for (int i = 0; i < x.length; i++) {
      x[i] = (float) rng.nextGaussian();
    }
    return new Tensor(x, b, h, t, d);
  }

  /** Median ms of each implementation; they alternate within every iteration. */
  static double[] medianMs(int warmup, int iters, List<Supplier<?>> impls) {
    for (int i = 0; i < warmup; i++) {
      impls.forEach(Supplier::get);
    }
    double[][] times = new double[impls.size()][iters];
    for (int i = 0; i < iters; i++) {
      for (int m = 0; m < impls.size(); m++) {
        long t0 = System.nanoTime();
        impls.get(m).get();
        times[m][i] = (System.nanoTime() - t0) / 1e6;
      }
    }
    double[] median = new double[impls.size()];
    for (int m = 0; m < median.length; m++) {
      Arrays.sort(times[m]);
      median[m] = times[m][iters / 2];
    }
    return median;
  }

  static String gflops(double flops, double ms) {
    return String.format(Locale.ROOT, "\"gflops\": %.1f", flops / ms / 1e6);
  }

  /** Our speed over the anchor's (implementation {@code anchor}, -1 when it did not run), or nothing. */
  static String ratio(double[] ms, int i, int anchor) {
    return anchor < 0 ? "" : String.format(Locale.ROOT, ", \"vs_anchor\": %.2f", ms[anchor] / ms[i]);
  }

  static NDArray[] toNd(LibtorchSdpa sdpa, Tensor... ts) {
    NDArray[] out = new NDArray[ts.length];
    for (int i = 0; i < ts.length; i++) {
      Tensor x = ts[i];
      out[i] = sdpa.manager().create(x.data(), new Shape(x.batch(), x.heads(), x.tokens(), x.dim()));
    }
    return out;
  }

  static Object sdpaCall(LibtorchSdpa sdpa, NDArray[] qkv, boolean causal) {
    try (NDList r = sdpa.forward(qkv[0], qkv[1], qkv[2], causal)) {
      return r.size();
    }
  }

  static void closeAll(NDArray[] nd) {
    if (nd != null) {
      for (NDArray a : nd) {
        a.close();
      }
    }
  }

  static void print(String impl, String op, int t, int tk, int h, int hkv, int d, boolean causal, double ms,
      String figure) {
    System.out.println(String.format(Locale.ROOT,
        "{\"impl\": \"%s\", \"op\": \"%s\", \"t\": %d, \"tk\": %d, \"heads\": %d, \"kv_heads\": %d, \"dim\": %d, "
            + "\"causal\": %b, \"ms\": %.2f, %s}", impl, op, t, tk, h, hkv, d, causal, ms, figure));
  }
}
