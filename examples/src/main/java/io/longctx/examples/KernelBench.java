package io.longctx.examples;

import ai.djl.ndarray.NDArray;
import ai.djl.ndarray.NDList;
import ai.djl.ndarray.types.Shape;
import io.longctx.djl.AttentionOp;
import io.longctx.djl.LibtorchSdpa;
import io.longctx.kernels.AttentionOptions;
import io.longctx.kernels.CpuAttention;
import io.longctx.kernels.Tensor;
import io.longctx.kernels.UnifiedMax;
import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.UncheckedIOException;
import java.lang.management.ManagementFactory;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Paths;
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
 *   forward: GFLOP/s with FLOPs = 4*B*H*D per visible (query, key) pair (causal: the top-left mask's)
 *   decode:  GB/s of K and V read, beside a plain copy of the same bytes in the same run (one thread,
 *            reading and writing them: a reference point, not the machine's read bandwidth)
 * </pre>
 *
 * <p>Implementations: {@code java} (our Java kernel on float[]), {@code op} (the DJL operator
 * {@link AttentionOp} on NDArrays, through its per-call dispatch; its JSON line names the
 * {@code path} chosen), {@code libtorch-sdpa} (the anchor), {@code djl-plain} (plain DJL ops as
 * DJL's ScaledDotProductAttentionBlock computes attention: matMul, scale, mask, softmax, matMul,
 * materializing the [B, H, Tq, Tk] scores; in-place scale and mask, so two T x T matrices at the
 * peak), and for decode {@code java-unified-max} and {@code copy}.
 *
 * <p>Peak memory ({@code --memory}): each implementation runs alone in a fresh JVM (same class
 * path and flags, {@code --only IMPL --iters 1 --warmup 0}); the child reads {@code VmRSS} from
 * /proc/self/status after its inputs are built and {@code VmHWM} (peak resident set, JVM heap and
 * native memory alike) after the call, and reports {@code peak_extra_mb = VmHWM - VmRSS(before)}:
 * the memory the call itself needed beyond its inputs. A child that fails (out of memory) is
 * reported with {@code "error"}. A child started with a heap cap (-Xmx in LONGCTX_JAVA_OPTS, which the
 * children inherit) says it as {@code "xmx"}.
 */
public final class KernelBench {
  /** Keys of a decode when --tk is not given. */
  static final int DECODE_KEYS = 65536;

  private KernelBench() {}

  static final String USAGE = String.join("\n",
      "usage: longctx bench [options]",
      "",
      "Times the CPU attention kernels against the anchor, libtorch's fused CPU attention (through DJL),",
      "on the same random fp32 inputs in one JVM; implementations alternate within every round, each timed",
      "call after a 50 ms pause (-Dlongctx.bench.settleMs) so that no thread pool left spinning by the call",
      "before (libtorch's OpenMP threads spin after each op) takes cores from the next. Prints one",
      "JSON object per line and implementation on stdout: ms (median), gflops or gbps, and",
      "vs_anchor = anchor time / our time (higher is better; 1.0 = as fast as libtorch); the forward's op",
      "line also vs_faster: of java and the anchor, the one faster at the median (named as faster), and",
      "the median over rounds of its time over op's in the same round (the operator's target: >= 0.95).",
      "Progress goes to stderr, with an estimate of each shape's time",
      "after its first round.",
      "",
      "  --op forward|decode|all   what to time (default all: forward non-causal and causal, then decode)",
      "  --t T                     forward: query and key tokens (default 4096); with --op decode: query rows\n"
          + "                            (default 1)",
      "  --tk TK                   keys (default: T for forward, 65536 for decode)",
      "  --heads H                 query heads (default 8 forward, 32 decode)",
      "  --kv-heads HKV            key/value heads, H % HKV == 0 (default H forward, 8 decode)",
      "  --dim D                   head dim (default 128)",
      "  --causal                  forward: causal only (default: non-causal, then causal); decode is causal",
      "  --iters N                 timed rounds, the median is reported (default 7)",
      "  --warmup N                untimed rounds first, so the JIT has compiled the kernels (default 5); the",
      "                            forward's Java kernel also runs a fixed problem first until its JIT is warm",
      "                            (at most 30 s; not with --warmup 0)",
      "  --block-q BQ, --block-k BK  Java kernel tile: query rows x keys (default " + CpuAttention.DEFAULT_BLOCK_Q
          + " x 128: 64 rows where the vectors are 512-bit, else 32)",
      "  --sweep N                 forward: at most N query blocks of a head sweep the keys together, tile by",
      "                            tile (default " + CpuAttention.DEFAULT_MAX_BLOCKS_PER_SWEEP + "; fewer where L2 or the task count says so;"
          + " 1: each block alone)",
      "  --split L                 decode split length in keys (default " + CpuAttention.DEFAULT_SPLIT_LEN + ")",
      "  --chunk-keys N            decode: also time op-chunks, the operator's decode over the same K and V",
      "                            held as a list of arrays of N keys each (a KV cache grown chunk by chunk;",
      "                            N below the keys; default 0: off)",
      "  --plain                   also time djl-plain (DJL's plain ops, T x T scores materialized; default off):",
      "                            slow (~8.5 s a call in decode, ~2 s at T = 4096 on 2 cores) and needs",
      "                            2 x H x T^2 x 4 bytes of memory",
      "  --no-anchor               skip libtorch-sdpa (default: run it; without it no vs_anchor)",
      "  --callers N               also time N threads calling each impl at once (as N Spark tasks in one",
      "                            executor): extra lines with \"callers\": N, ms per round of N calls, and",
      "                            vs_one_caller = N x one call's ms / that (N.0: N calls in the time of one;",
      "                            1.0: no faster than one after another; default 1: off)",
      "  --only IMPL               time one implementation",
      "  --memory [--impls A,B]    peak memory instead of time: each impl alone in a fresh JVM, one call,",
      "                            peak resident set beyond the inputs (VmHWM - VmRSS before the call);",
      "                            djl-plain only with --plain or when --impls names it; not with --only (give",
      "                            --impls), --iters, --warmup or --callers; with --op all, --t sets the",
      "                            forward's tokens and the decode runs one query row, as when timed",
      "  -h, --help                this text",
      "",
      "impls: java (our Java kernel), op (the DJL AttentionOp, whichever path it picks), libtorch-sdpa",
      "(the anchor), djl-plain (--plain); decode also java-unified-max (FlashDecoding++), op-chunks (--chunk-keys) and copy",
      "(System.arraycopy of the same K/V bytes on one thread, which reads and writes them: a reference",
      "point, not the read-bandwidth ceiling; vs_copy). The decode anchor takes each kv head's query",
      "heads as rows, so it reads K and V once as the kernel does.");

  public static void main(String[] args) {
    String op = "all";
    int t = 4096, tk = -1, heads = -1, kvHeads = -1, dim = 128, iters = 7, warmup = 5;
    boolean tGiven = false; // with --op decode, --t is the query rows (default 1), not the forward's 4096
    int blockQ = CpuAttention.DEFAULT_BLOCK_Q, blockK = 128, sweep = CpuAttention.DEFAULT_MAX_BLOCKS_PER_SWEEP, split = CpuAttention.DEFAULT_SPLIT_LEN, callers = 1, chunkKeys = 0;
    Boolean causal = null;
    boolean anchor = true;
    boolean plain = false; // djl-plain is slow (seconds a call) and memory-hungry: only when asked
    boolean memory = false;
    String only = null;
    for (int i = 0; i < args.length; i++) {
      String a = args[i];
      try {
        switch (a) {
          case "--op" -> op = args[++i];
          case "--t" -> {
            t = Integer.parseInt(args[++i]);
            tGiven = true;
          }
          case "--tk" -> tk = givenSize("--tk", Integer.parseInt(args[++i]));
          case "--heads" -> heads = givenSize("--heads", Integer.parseInt(args[++i]));
          case "--kv-heads" -> kvHeads = givenSize("--kv-heads", Integer.parseInt(args[++i]));
          case "--dim" -> dim = Integer.parseInt(args[++i]);
          case "--causal" -> causal = true;
          case "--no-anchor" -> anchor = false;
          case "--plain" -> plain = true;
          case "--no-plain" -> plain = false; // the default now; still accepted
          case "--only" -> only = args[++i];
          case "--impls" -> { // read by memory()
            if (++i >= args.length) {
              throw new ArrayIndexOutOfBoundsException(i);
            }
          }
          case "--memory" -> memory = true;
          case "--iters" -> iters = Integer.parseInt(args[++i]);
          case "--warmup" -> warmup = Integer.parseInt(args[++i]);
          case "--block-q" -> blockQ = Integer.parseInt(args[++i]);
          case "--block-k" -> blockK = Integer.parseInt(args[++i]);
          case "--sweep" -> sweep = Integer.parseInt(args[++i]);
          case "--split" -> split = Integer.parseInt(args[++i]);
          case "--callers" -> callers = Integer.parseInt(args[++i]);
          case "--chunk-keys" -> chunkKeys = Integer.parseInt(args[++i]);
          case "--help", "-h" -> {
            System.out.println(USAGE);
            return;
          }
          default -> {
            System.err.println("unknown option " + a + "\n" + USAGE);
            System.exit(2);
          }
        }
      } catch (NumberFormatException | ArrayIndexOutOfBoundsException e) {
        // --op, --only and --impls take a word, the rest a number
        String what = List.of("--op", "--only", "--impls").contains(a) ? "a value" : "a number";
        System.err.println("bench: " + a + " needs " + what + ", got " + (i < args.length ? "'" + args[i] + "'"
            : "nothing"));
        System.exit(2);
      }
    }
    if (!List.of("forward", "decode", "all").contains(op)) {
      System.err.println("bench: --op must be forward, decode or all, got '" + op + "'");
      System.exit(2);
    }
    // --only names one that every chosen op times.
    List<String> names = op.equals("decode") ? DECODE_IMPLS : FORWARD_IMPLS;
    if (only != null && !names.contains(only)) {
      System.err.println("bench: --only with --op " + op + " must be one of " + String.join(", ", names) + ", got '"
          + only + "'");
      System.exit(2);
    }
    if ("libtorch-sdpa".equals(only) && !anchor) {
      System.err.println("bench: --only libtorch-sdpa times the anchor: leave out --no-anchor");
      System.exit(2);
    }
    if ("djl-plain".equals(only)) {
      plain = true; // a --memory child asked for it by name
    }
    if (split < 1) { // checked here, not after the forward part has run
      System.err.println("bench: --split must be >= 1, got " + split);
      System.exit(2);
    }
    if (callers < 1) {
      System.err.println("--callers must be >= 1, got " + callers);
      System.exit(2);
    }
    if (chunkKeys < 0 || chunkKeys > 0 && op.equals("forward")) {
      System.err.println("bench: --chunk-keys " + chunkKeys + ": " + (chunkKeys < 0 ? "must be >= 0"
          : "times decode only (--op decode or all)"));
      System.exit(2);
    }
    if (chunkKeys > 0 && chunkKeys >= (tk > 0 ? tk : DECODE_KEYS)) {
      System.err.println("bench: --chunk-keys " + chunkKeys + " makes one chunk of the " + (tk > 0 ? tk : DECODE_KEYS)
          + " keys, which is what op times: give fewer keys per chunk");
      System.exit(2);
    }
    if (chunkKeys > 0 && memory) {
      System.err.println("bench: --chunk-keys times op-chunks; --memory does not measure it");
      System.exit(2);
    }
    if (memory) { // each child makes one measured call of one implementation: these would be dropped
      for (String o : List.of("--only", "--iters", "--warmup", "--callers")) {
        if (Arrays.asList(args).contains(o)) {
          System.err.println("bench: --memory measures one call of each implementation in its own JVM: " + switch (o) {
            case "--only" -> "--impls NAME chooses which, not --only";
            case "--callers" -> "--callers times concurrent calls, which it does not measure";
            default -> o + " does not apply";
          });
          System.exit(2);
        }
      }
    }
    if ("op-chunks".equals(only) && chunkKeys == 0) {
      System.err.println("bench: --only op-chunks needs --chunk-keys N");
      System.exit(2);
    }
    String shapeProblem = shapeProblem(op, t, tk, heads, kvHeads, dim, iters, warmup);
    if (shapeProblem != null) {
      System.err.println("bench: " + shapeProblem);
      System.exit(2);
    }
    try {
      AttentionOp.checkSettings();
    } catch (IllegalArgumentException e) {
      System.err.println("bench: " + e.getMessage());
      System.exit(2);
    }
    CpuAttention kernels;
    try { // before --memory's children too: each would fail on it
      kernels = new CpuAttention(blockQ, blockK, sweep);
    } catch (IllegalArgumentException e) { // --block-q, --block-k, --sweep out of range
      System.err.println("bench: " + e.getMessage());
      System.exit(2);
      return;
    }
    if (!memory && Arrays.asList(args).contains("--impls")) { // it was ignored: every impl was timed
      System.err.println("bench: --impls chooses what --memory measures; to time one implementation, give --only NAME");
      System.exit(2);
    }
    if (memory) {
      int failed = memory(args, op, causal, plain);
      if (failed > 0) { // the error lines are printed; the status says the measurement is incomplete
        System.err.println("bench: " + failed + " memory measurement(s) failed (the \"error\" lines above)");
        System.exit(1);
      }
      return;
    }
    if (only == null) {
      progress("%s; %d warm-up + %d timed rounds per shape; djl-plain %s", switch (op) {
        case "forward" -> "forward";
        case "decode" -> "decode";
        default -> "forward (non-causal, causal), then decode";
      }, warmup, iters, plain ? "included (--plain)" : "skipped (--plain to include it)");
    }
    // The operator, and djl-plain, need the engine; the anchor module is opened only when asked for.
    boolean needEngine = anchor || plain || only == null || !only.equals("java");
    if (needEngine && only == null) {
      progress("loading libtorch through DJL (offline)");
    }
    try (LibtorchSdpa sdpa = needEngine ? LibtorchSdpa.open() : null) {
      run(op, t, tGiven ? t : 1, tk, heads, kvHeads, dim, iters, warmup, split, causal, kernels, sdpa, anchor, plain,
          only, callers, chunkKeys);
    }
  }

  /** An optional size as given: -1 stands for "not given" inside, so a given -1 (or below 1) is refused here. */
  private static int givenSize(String option, int v) {
    if (v < 1) {
      System.err.println("bench: " + option + " must be >= 1, got " + v);
      System.exit(2);
    }
    return v;
  }

  /**
   * What is wrong with the sizes asked for, or null: checked before anything runs, so that a bad
   * shape is exit 2 naming the option, not a kernel's stack trace. -1 = not given (the op's default).
   */
  static String shapeProblem(String op, int t, int tk, int heads, int kvHeads, int dim, int iters, int warmup) {
    int[] values = {t, dim, iters, warmup, tk, heads, kvHeads};
    String[] names = {"--t", "--dim", "--iters", "--warmup", "--tk", "--heads", "--kv-heads"};
    for (int i = 0; i < values.length; i++) {
      int min = names[i].equals("--warmup") ? 0 : 1;
      boolean optional = i >= 4;
      if (values[i] < min && !(optional && values[i] == -1)) {
        return names[i] + " must be >= " + min + ", got " + values[i];
      }
    }
    if (dim > CpuAttention.MAX_DIM) {
      return "--dim must be at most " + CpuAttention.MAX_DIM + " (the kernels' largest head size), got " + dim;
    }
    for (String o : List.of("forward", "decode")) {
      if (op.equals(o) || op.equals("all")) {
        int h = headsFor(o, heads), hkv = kvHeadsFor(o, heads, kvHeads);
        if (h % hkv != 0) {
          return o + " runs " + h + " heads over " + hkv + " kv heads: --heads must be a multiple of --kv-heads";
        }
        // One float array per tensor, batch 1: q (heads x t x dim) and k, v (kv heads x keys x dim) must each
        // fit an int (3,000,000 x 8 x 128 wrapped).
        long keys = tk > 0 ? tk : o.equals("forward") ? t : DECODE_KEYS;
        long most = Math.max((long) h * t * dim, (long) hkv * keys * dim);
        if (most > Integer.MAX_VALUE - 8) {
          return o + " at " + h + "/" + hkv + " heads, " + t + " query and " + keys + " key tokens, dim " + dim + " makes "
              + most + " floats in one array, more than one holds (" + (Integer.MAX_VALUE - 8) + "): give a smaller "
              + "--t, --tk, --heads or --dim";
        }
      }
    }
    return null;
  }

  /** The query heads {@code op} (forward or decode) runs with: --heads, else 8 for forward, 32 for decode. */
  static int headsFor(String op, int heads) {
    return heads > 0 ? heads : op.equals("forward") ? 8 : 32;
  }

  /** The kv heads {@code op} runs with: --kv-heads, else as many as its query heads for forward, 8 for decode. */
  static int kvHeadsFor(String op, int heads, int kvHeads) {
    return kvHeads > 0 ? kvHeads : op.equals("forward") ? headsFor(op, heads) : 8;
  }

  /** A named implementation: {@code call} runs it once. */
  record Impl(String name, Supplier<?> call) {}

  private static void run(String op, int t, int decodeRows, int tk, int heads, int kvHeads, int dim, int iters,
      int warmup, int split, Boolean causal, CpuAttention kernels, LibtorchSdpa engine, boolean anchor, boolean plain,
      String only, int callers, int chunkKeys) {
    SplittableRandom rng = new SplittableRandom(42);
    AttentionOp attentionOp = new AttentionOp(kernels);
    if (op.equals("forward") || op.equals("all")) {
      if (warmup > 0 && (only == null || only.equals("java") || only.equals("op"))) {
        // A few rounds do not compile the Java kernel at short T: --only java at [1,8,1024,128] causal
        // ran 31-38 ms after 10 rounds, 18.7 after 60 (Zen 4). In the alternating rounds the operator's
        // first calibration did this warm-up for both (a --memory child, --warmup 0, measures the cold call).
        long t0 = System.nanoTime();
        boolean warm = CpuAttention.warmUpJit(JIT_WARM_BUDGET_NS);
        progress("Java kernel's JIT warm-up: %.1f s%s", (System.nanoTime() - t0) / 1e9,
            warm ? "" : " (budget spent before the kernel was warm: its first figures may be slow)");
      }
      int h = headsFor("forward", heads), hkv = kvHeadsFor("forward", heads, kvHeads);
      Tensor q = Tensor.random(rng, 1, h, t, dim);
      Tensor k = Tensor.random(rng, 1, hkv, tk > 0 ? tk : t, dim);
      Tensor v = Tensor.random(rng, 1, hkv, tk > 0 ? tk : t, dim);
      NDArray[] nd = engine != null ? toNd(engine, q, k, v) : null;
      // A --memory child (--only) runs exactly one configuration: causal with --causal, else non-causal.
      boolean[] modes = causal != null ? new boolean[] {true} : only != null ? new boolean[] {false}
          : new boolean[] {false, true};
      for (boolean c : modes) {
        AttentionOptions opt = AttentionOptions.DEFAULT.withCausal(c);
        double flops = 4.0 * h * dim * visiblePairs(t, k.tokens(), c);
        List<Impl> impls = new ArrayList<>();
        impls.add(new Impl("java", () -> kernels.forward(q, k, v, null, null, opt)));
        if (engine != null) {
          impls.add(new Impl("op", () -> opCall(attentionOp, nd, opt)));
          if (anchor) {
            impls.add(new Impl("libtorch-sdpa", () -> sdpaCall(engine, nd, c)));
          }
          if (plain && (only == null || only.equals("djl-plain"))) {
            // The T x T causal mask is an input of djl-plain only (built before the call is measured).
            NDArray mask = c ? causalMask(engine, t, k.tokens()) : null;
            impls.add(new Impl("djl-plain", () -> plainCall(nd, mask, h / hkv)));
          }
        }
        impls = select(impls, only);
        if (only == null) {
          progress("forward [1,%d,%d,%d] x %d keys, %s, kv heads %d: %s", h, t, dim, k.tokens(),
              c ? "causal" : "non-causal", hkv, names(impls));
        }
        long rssBefore = beforeMeasuredCall(impls, only);
        double[][] rounds = roundMs(warmup, iters, calls(impls), only == null);
        double[] ms = medians(rounds);
        String mem = only != null ? memoryFigures(rssBefore) : ""; // before choose(), which may calibrate
        int anchorAt = indexOf(impls, "libtorch-sdpa"), javaAt = indexOf(impls, "java");
        String path = indexOf(impls, "op") >= 0 ? attentionOp.choose(nd[0], nd[1], nd[2], null, null, opt,
            AttentionOp.Layout.BHTD).name().toLowerCase(Locale.ROOT) : "";
        for (int i = 0; i < impls.size(); i++) {
          String name = impls.get(i).name();
          String extra = name.equals("libtorch-sdpa") ? "" : ratio(ms, i, anchorAt);
          if (name.equals("java")) { // what the detected L2 size chose (docs/KERNELS.md, "Loop order")
            extra += String.format(Locale.ROOT, ", \"sweep\": %d, \"l2_kib\": %d", kernels.blocksPerSweep(1, h, t, dim),
                CpuAttention.l2CacheBytes() / 1024);
          }
          if (name.equals("op")) {
            extra += ", \"path\": \"" + path + "\"";
            if (anchorAt >= 0 && javaAt >= 0) {
              int faster = fasterPath(ms, javaAt, anchorAt);
              extra += String.format(Locale.ROOT, ", \"vs_faster\": %.3f, \"faster\": \"%s\"",
                  vsFaster(rounds, faster, i), impls.get(faster).name());
            }
          }
          extra += mem;
          print(name, "forward", t, k.tokens(), h, hkv, dim, c, ms[i], gflops(flops, ms[i]) + extra);
        }
        if (callers > 1) {
          double[] msN = medianMs(1, iters, concurrently(calls(impls), callers));
          for (int i = 0; i < impls.size(); i++) {
            print(impls.get(i).name(), "forward", t, k.tokens(), h, hkv, dim, c, msN[i],
                gflops(callers * flops, msN[i]) + callerFigures(callers, ms[i], msN[i]));
          }
        }
      }
      closeAll(nd);
    }
    if (op.equals("decode") || op.equals("all")) {
      if (only == null) {
        progress("decode: generating inputs");
      }
      int h = headsFor("decode", heads), hkv = kvHeadsFor("decode", heads, kvHeads), n = tk > 0 ? tk : DECODE_KEYS;
      int rows = op.equals("decode") ? decodeRows : 1;
      Tensor q = Tensor.random(rng, 1, h, rows, dim);
      Tensor k = Tensor.random(rng, 1, hkv, n, dim);
      Tensor v = Tensor.random(rng, 1, hkv, n, dim);
      long[] qPos = new long[rows];
      Arrays.fill(qPos, n);
      AttentionOptions opt = AttentionOptions.DEFAULT.withCausal(true);
      double bytes = 2.0 * k.data().length * Float.BYTES;
      int splitLen = split;
      UnifiedMax um = UnifiedMax.calibrate(q, k, opt);
      float[] dst = new float[k.data().length];
      NDArray[] nd = engine != null ? toNd(engine, q, k, v) : null;
      List<Impl> impls = new ArrayList<>(List.of(
          new Impl("java", () -> kernels.decode(q, k, v, qPos, null, opt, splitLen)),
          new Impl("java-unified-max", () -> kernels.decodeUnifiedMax(q, k, v, qPos, null, opt, splitLen, um)),
          new Impl("copy", () -> {
            System.arraycopy(k.data(), 0, dst, 0, dst.length);
            System.arraycopy(v.data(), 0, dst, 0, dst.length);
            return dst;
          })));
      if (engine != null) {
        // The operator's decode: split-K on the Java kernel, over NDArrays.
        impls.add(new Impl("op", () -> {
          try (NDList r = attentionOp.decode(nd[0], nd[1], nd[2], qPos, null, opt, AttentionOp.Layout.BHTD)) {
            return r.size();
          }
        }));
        if (chunkKeys > 0) {
          // Separate contiguous arrays, made once, as a cache grown chunk by chunk holds them.
          List<NDArray> kc = new ArrayList<>(), vc = new ArrayList<>();
          for (int c0 = 0; c0 < n; c0 += chunkKeys) {
            String idx = ":, :, " + c0 + ":" + Math.min(n, c0 + chunkKeys);
            kc.add(nd[1].get(idx).duplicate());
            vc.add(nd[2].get(idx).duplicate());
          }
          impls.add(new Impl("op-chunks", () -> {
            try (NDList r = attentionOp.decode(nd[0], kc, vc, qPos, null, opt, AttentionOp.Layout.BHTD)) {
              return r.size();
            }
          }));
        }
        if (anchor) {
          // Every query row sits after every key, so full (non-causal) attention is the same answer; the
          // query heads of a kv head go in as rows of that head ([1, H, rows, D] -> [1, Hkv, H/Hkv * rows, D],
          // a view), so libtorch reads K and V as they are. Passing H query heads instead made the module
          // expand K and V to H heads inside the timed call (4x K/V written at 32/8 heads).
          NDArray[] grouped = {nd[0].reshape(1, hkv, (long) (h / hkv) * rows, dim), nd[1], nd[2]};
          impls.add(new Impl("libtorch-sdpa", () -> sdpaCall(engine, grouped, false)));
        }
        if (plain) {
          impls.add(new Impl("djl-plain", () -> plainCall(nd, null, h / hkv)));
        }
      }
      impls = select(impls, only);
      if (only == null) {
        progress("decode: %d query row(s), %d heads over %d kv heads, %d keys (K+V %.1f MiB), split %d: %s",
            rows, h, hkv, n, bytes / (1 << 20), splitLen, names(impls));
      }
      long rssBefore = beforeMeasuredCall(impls, only);
      double[] ms = medianMs(warmup, iters, calls(impls), only == null);
      int anchorAt = indexOf(impls, "libtorch-sdpa"), copyAt = indexOf(impls, "copy");
      for (int i = 0; i < ms.length; i++) {
        String name = impls.get(i).name();
        String extra = "";
        if (!name.equals("libtorch-sdpa") && !name.equals("copy")) {
          extra = ratio(ms, i, anchorAt) + (copyAt >= 0 ? ", \"vs_copy\": %.2f".formatted(ms[copyAt] / ms[i]) : "");
        }
        if (only != null) {
          extra += memoryFigures(rssBefore);
        }
        print(name, "decode", rows, n, h, hkv, dim, true, ms[i], "\"gbps\": %.2f".formatted(bytes / ms[i] / 1e6) + extra);
      }
      if (callers > 1) {
        double[] msN = medianMs(1, iters, concurrently(calls(impls), callers));
        for (int i = 0; i < impls.size(); i++) {
          print(impls.get(i).name(), "decode", rows, n, h, hkv, dim, true, msN[i],
              "\"gbps\": %.2f".formatted(callers * bytes / msN[i] / 1e6) + callerFigures(callers, ms[i], msN[i]));
        }
      }
      closeAll(nd);
    }
  }

  /** The implementations the forward times (djl-plain only with --plain); decode adds its two own. */
  static final List<String> FORWARD_IMPLS = List.of("java", "op", "libtorch-sdpa", "djl-plain");
  static final List<String> DECODE_IMPLS = List.of("java", "op", "op-chunks", "libtorch-sdpa", "djl-plain",
      "java-unified-max", "copy");

  private static List<Impl> select(List<Impl> impls, String only) {
    if (only == null) {
      return impls;
    }
    List<Impl> one = impls.stream().filter(i -> i.name().equals(only)).toList();
    if (one.isEmpty()) {
      throw new IllegalArgumentException("--only " + only + ": no such implementation here (have "
          + impls.stream().map(Impl::name).toList() + ")");
    }
    return one;
  }

  /** One line on stderr, so stdout stays JSON. */
  static void progress(String format, Object... args) {
    System.err.println("bench: " + String.format(Locale.ROOT, format, args));
  }

  private static String names(List<Impl> impls) {
    return String.join(", ", impls.stream().map(Impl::name).toList());
  }

  private static List<Supplier<?>> calls(List<Impl> impls) {
    return impls.stream().<Supplier<?>>map(Impl::call).toList();
  }

  /**
   * Each call made by {@code n} threads at once (threads of their own, not the kernels' pool, as Spark
   * tasks are): a round ends when all n have returned.
   */
  static List<Supplier<?>> concurrently(List<Supplier<?>> calls, int n) {
    return calls.stream().<Supplier<?>>map(c -> () -> {
      List<Thread> threads = new ArrayList<>();
      Throwable[] failed = new Throwable[1];
      for (int i = 0; i < n; i++) {
        Thread th = new Thread(c::get, "bench-caller-" + i);
        th.setUncaughtExceptionHandler((x, e) -> failed[0] = e);
        threads.add(th);
        th.start();
      }
      for (Thread th : threads) {
        try {
          th.join();
        } catch (InterruptedException e) {
          Thread.currentThread().interrupt();
          throw new IllegalStateException("interrupted while callers ran", e);
        }
      }
      if (failed[0] != null) {
        throw new IllegalStateException("a concurrent caller failed", failed[0]);
      }
      return null;
    }).toList();
  }

  /** The callers fields of a line: n, and n calls' worth of one caller's time over the measured round. */
  static String callerFigures(int n, double oneMs, double roundMs) {
    return String.format(Locale.ROOT, ", \"callers\": %d, \"vs_one_caller\": %.2f", n, n * oneMs / roundMs);
  }

  private static int indexOf(List<Impl> impls, String name) {
    for (int i = 0; i < impls.size(); i++) {
      if (impls.get(i).name().equals(name)) {
        return i;
      }
    }
    return -1;
  }

  static Object opCall(AttentionOp op, NDArray[] qkv, AttentionOptions opt) {
    try (NDList r = op.forward(qkv[0], qkv[1], qkv[2], opt)) {
      return r.size();
    }
  }

  /**
   * Attention as DJL's ScaledDotProductAttentionBlock computes it, on [B, H, T, D] arrays: scores =
   * q k^T, scaled, masked (additive -inf causal mask), softmax, times v. GQA repeats k and v heads.
   */
  static Object plainCall(NDArray[] qkv, NDArray causalMask, int group) {
    try (ai.djl.ndarray.NDManager scope = qkv[0].getManager().newSubManager()) {
      NDArray q = qkv[0], k = qkv[1], v = qkv[2];
      if (group > 1) {
        k = k.repeat(1, group);
        v = v.repeat(1, group);
        k.attach(scope);
        v.attach(scope);
      }
      NDArray kt = k.transpose(0, 1, 3, 2);
      kt.attach(scope);
      NDArray s = q.matMul(kt);
      s.attach(scope);
      s.muli((float) (1.0 / Math.sqrt(q.getShape().get(3))));
      if (causalMask != null) {
        s.addi(causalMask);
      }
      NDArray p = s.softmax(3);
      p.attach(scope);
      s.close(); // DJL's block keeps it alive until the call ends; freeing it early only lowers our peak
      NDArray o = p.matMul(v);
      o.attach(scope);
      return o.getShape();
    }
  }

  static NDArray causalMask(LibtorchSdpa engine, int tq, int tk) {
    float[] m = new float[Math.multiplyExact(tq, tk)];
    for (int i = 0; i < tq; i++) {
      Arrays.fill(m, i * tk + i + 1, (i + 1) * tk, Float.NEGATIVE_INFINITY);
    }
    return engine.manager().create(m, new Shape(1, 1, tq, tk));
  }

  /** Memory figures of a child run (--only): resident set before the call and its peak. */
  /**
   * The resident size before the measured call. In a --memory child ({@code only} set), first one
   * untimed call (the JIT's compiles, thread pools, libtorch's set-up, the operator's calibration),
   * then the kernel's peak-RSS mark reset (/proc/self/clear_refs), so that the figure is the call's
   * own peak, not the JVM's first-call work.
   */
  static long beforeMeasuredCall(List<Impl> impls, String only) {
    if (only != null) {
      calls(impls).forEach(Supplier::get);
      peakReset = resetPeakRss();
    }
    return rssKb("VmRSS");
  }

  private static boolean peakReset; // whether the child could reset the peak-RSS mark

  /** Resets VmHWM to the current RSS (Linux 4.0+); false where that is not possible. */
  static boolean resetPeakRss() {
    try {
      Files.writeString(Paths.get("/proc/self/clear_refs"), "5");
      return true;
    } catch (IOException | RuntimeException e) {
      return false;
    }
  }

  /** Query-key pairs a call computes: all of them, or with the top-left causal mask min(i + 1, tk) per row i. */
  static double visiblePairs(long tq, long tk, boolean causal) {
    if (!causal) {
      return (double) tq * tk;
    }
    long square = Math.min(tq, tk); // rows 0 .. square-1 see i + 1 keys; later rows see all tk
    return square * (square + 1) / 2.0 + (double) (tq - square) * tk;
  }

  static String memoryFigures(long rssBeforeKb) {
    long hwm = rssKb("VmHWM");
    // The heap cap bounds the Java kernel's figure (the JVM grows its heap as far as it may): the line says it.
    String cap = heapCap(ManagementFactory.getRuntimeMXBean().getInputArguments());
    return String.format(Locale.ROOT, ", \"rss_before_mb\": %.1f, \"peak_rss_mb\": %.1f, \"peak_extra_mb\": %.1f, "
        + "\"peak_reset\": %b", rssBeforeKb / 1024.0, hwm / 1024.0, (hwm - rssBeforeKb) / 1024.0, peakReset)
        + (cap != null ? ", \"xmx\": \"" + cap + "\"" : "");
  }

  /** The heap cap given to a JVM with these options (-Xmx or -XX:MaxHeapSize=, the last one wins), or null. */
  static String heapCap(List<String> jvmOptions) {
    String cap = null;
    for (String o : jvmOptions) {
      if (o.startsWith("-Xmx")) {
        cap = o.substring("-Xmx".length());
      } else if (o.startsWith("-XX:MaxHeapSize=")) {
        cap = o.substring("-XX:MaxHeapSize=".length());
      }
    }
    return cap;
  }

  /** A field of /proc/self/status in kB (VmRSS, VmHWM), or -1 where there is none. */
  static long rssKb(String field) {
    try {
      for (String line : Files.readAllLines(Paths.get("/proc/self/status"), StandardCharsets.US_ASCII)) {
        if (line.startsWith(field + ":")) {
          return Long.parseLong(line.replaceAll("[^0-9]", ""));
        }
      }
    } catch (IOException | RuntimeException e) {
      return -1;
    }
    return -1;
  }

  /**
   * --memory: every implementation alone in a fresh JVM, one call each, its peak memory reported;
   * returns how many children failed (each printed as an "error" line).
   */
  static int memory(String[] args, String op, Boolean causal, boolean plain) {
    List<String> base = new ArrayList<>();
    base.add(ProcessHandle.current().info().command().orElse("java"));
    base.addAll(ManagementFactory.getRuntimeMXBean().getInputArguments());
    base.add("-cp");
    base.add(System.getProperty("java.class.path"));
    base.add(KernelBench.class.getName());
    List<String> rest = new ArrayList<>();
    String t = null;
    for (int i = 0; i < args.length; i++) {
      switch (args[i]) {
        case "--memory", "--causal" -> { }
        case "--op", "--impls" -> i++;
        case "--t" -> t = args[++i]; // per child below
        default -> rest.add(args[i]);
      }
    }
    List<String> ops = op.equals("all") ? List.of("forward", "decode") : List.of(op);
    List<String> wanted = impls(args);
    List<String> known = new ArrayList<>(FORWARD_IMPLS);
    known.add("java-unified-max");
    if (wanted != null && !known.containsAll(wanted)) { // an unknown name measured nothing, in silence
      System.err.println("bench: --impls takes " + String.join(", ", known) + ", got " + String.join(",", wanted));
      System.exit(2);
    }
    int failed = 0;
    for (String o : ops) {
      List<String> names = new ArrayList<>(FORWARD_IMPLS);
      if (o.equals("decode")) {
        names.add(1, "java-unified-max");
      }
      if (wanted != null) {
        names.retainAll(wanted);
      } else if (!plain) {
        names.remove("djl-plain");
      }
      if (Arrays.asList(args).contains("--no-anchor")) {
        names.remove("libtorch-sdpa"); // its child would be refused
      }
      for (boolean c : o.equals("forward") && causal == null ? new boolean[] {false, true} : new boolean[] {true}) {
        for (String name : names) {
          List<String> cmd = new ArrayList<>(base);
          cmd.addAll(rest);
          cmd.addAll(List.of("--op", o, "--only", name, "--iters", "1", "--warmup", "0"));
          // --t is the forward's tokens; a decode child gets it only under --op decode (its query rows
          // there): with --op all the decode runs one query row, as when timed
          if (t != null && (o.equals("forward") || op.equals("decode"))) {
            cmd.addAll(List.of("--t", t));
          }
          if (c) {
            cmd.add("--causal");
          }
          progress("memory: %s %s%s alone in a fresh JVM", name, o, o.equals("forward") ? (c ? " causal" : " non-causal") : "");
          failed += runChild(cmd, name, o, c) ? 0 : 1;
        }
      }
    }
    return failed;
  }

  /** The --impls list, or null. */
  private static List<String> impls(String[] args) {
    for (int i = 0; i + 1 < args.length; i++) {
      if (args[i].equals("--impls")) {
        return Arrays.asList(args[i + 1].split(","));
      }
    }
    return null;
  }

  /** Runs one memory child and prints its line (an "error" line where it failed); false where it failed. */
  private static boolean runChild(List<String> cmd, String name, String op, boolean causal) {
    try {
      Process p = new ProcessBuilder(cmd).redirectErrorStream(true).start();
      List<String> lines = new ArrayList<>();
      try (BufferedReader r = new BufferedReader(new InputStreamReader(p.getInputStream(), StandardCharsets.UTF_8))) {
        for (String line; (line = r.readLine()) != null; ) {
          lines.add(line);
        }
      }
      int rc = p.waitFor();
      List<String> json = lines.stream().filter(l -> l.startsWith("{\"impl\"")).toList();
      if (rc == 0 && !json.isEmpty()) {
        json.forEach(System.out::println);
        return true;
      } else {
        System.out.println(String.format(Locale.ROOT,
            "{\"impl\": \"%s\", \"op\": \"%s\", \"causal\": %b, \"error\": \"exit %d: %s\"}", name, op, causal,
            rc, ChildOutput.why(lines, 200)));
        return false;
      }
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      return false;
    }
  }

  /** Median ms of each implementation; they alternate within every iteration. */
  static double[] medianMs(int warmup, int iters, List<Supplier<?>> impls) {
    return medianMs(warmup, iters, impls, false);
  }

  /** The same; with {@code report}, says on stderr how long the rounds will take after the first. */
  static double[] medianMs(int warmup, int iters, List<Supplier<?>> impls, boolean report) {
    return medians(roundMs(warmup, iters, impls, report));
  }

  /**
   * ms of each implementation ([impl][round]) after {@code warmup} untimed rounds. Every round times
   * each implementation once, starting one further along each round, so that none always follows the
   * same other (whose threads or cache contents it might inherit).
   */
  static double[][] roundMs(int warmup, int iters, List<Supplier<?>> impls, boolean report) {
    for (int i = 0; i < warmup; i++) {
      long t0 = System.nanoTime();
      impls.forEach(Supplier::get);
      // The first round compiles (often 2-3x a later one): the estimate comes from the second where
      // there is one; timed rounds also pause SETTLE_MS before each implementation.
      if (report && (i == 1 || (i == 0 && warmup == 1))) {
        double s = (System.nanoTime() - t0) / 1e9;
        int left = warmup + iters - 1 - i;
        progress("  round %d took %.1f s; about %.0f s more for %d rounds", i + 1, s,
            left * s + iters * impls.size() * SETTLE_MS / 1e3, left);
      }
    }
    int n = impls.size();
    double[][] times = new double[n][iters];
    for (int i = 0; i < iters; i++) {
      for (int j = 0; j < n; j++) {
        int m = (i + j) % n;
        settle();
        long t0 = System.nanoTime();
        impls.get(m).get();
        times[m][i] = (System.nanoTime() - t0) / 1e6;
      }
    }
    return times;
  }

  static double[] medians(double[][] times) {
    double[] median = new double[times.length];
    for (int m = 0; m < median.length; m++) {
      median[m] = median(times[m].clone());
    }
    return median;
  }

  private static double median(double[] x) {
    Arrays.sort(x);
    return x[x.length / 2];
  }

  /**
   * The op's speed over the faster of the two paths it chooses between ({@link #fasterPath}, the one
   * with the lower median over the rounds): the median over rounds of that path's time / op's in the
   * same round. Pairing the calls of one round cancels the machine's drift between rounds (other
   * processes, frequency), which moves each median by 5-10% on a shared 2-core machine at T = 1024
   * (docs/BENCHMARKS.md). The path is fixed for all rounds: taking each round's faster call instead
   * (until 2026-11-27) compared the op with the best of two noisy samples, which reads 3-8% low
   * where the paths are equally fast (java 20.6, anchor 20.3, op 20.4 ms medians gave 0.919).
   */
  static double vsFaster(double[][] times, int faster, int op) {
    double[] r = new double[times[op].length];
    for (int i = 0; i < r.length; i++) {
      r[i] = times[faster][i] / times[op][i];
    }
    return median(r);
  }

  /** Which of java and the anchor ran faster at the median (ties: the anchor). */
  static int fasterPath(double[] medians, int java, int anchor) {
    return medians[java] < medians[anchor] ? java : anchor;
  }

  /**
   * Pause before each timed call. libgomp's worker threads spin for a while after every libtorch op
   * before they sleep; timed right after a libtorch call, the Java kernel shared the 2 cores with them
   * and ran up to 30% slower at T = 1024 (docs/BENCHMARKS.md, "Settled calls").
   */
  static final long SETTLE_MS = Long.getLong("longctx.bench.settleMs", 50);

  /** At most this long running the forward kernel before the rounds, until its JIT is warm. */
  static final long JIT_WARM_BUDGET_NS = 30_000_000_000L;

  static void settle() {
    try {
      Thread.sleep(SETTLE_MS);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    }
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
