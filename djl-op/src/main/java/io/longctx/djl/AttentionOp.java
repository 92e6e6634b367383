package io.longctx.djl;

import ai.djl.Device;
import ai.djl.ndarray.NDArray;
import ai.djl.ndarray.NDList;
import ai.djl.ndarray.NDManager;
import ai.djl.ndarray.types.DataType;
import ai.djl.ndarray.types.Shape;
import io.longctx.kernels.AttentionBackends;
import io.longctx.kernels.AttentionOptions;
import io.longctx.kernels.AttentionState;
import io.longctx.kernels.BufferTensor;
import io.longctx.kernels.CpuAttention;
import io.longctx.kernels.CudaAttention;
import io.longctx.kernels.Tensor;
import java.lang.invoke.MethodHandle;
import java.lang.invoke.MethodHandles;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.FloatBuffer;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Objects;
import java.util.function.IntConsumer;
import java.util.function.LongSupplier;

/**
 * Exact attention as an operator on DJL {@link NDArray}s: forward attention, decoding over a KV
 * cache (one array or a list of chunks), and the LSE merge of attention states. Every call returns
 * the attention state {@code NDList(o, lse)}: the normalized output and the natural-log
 * log-sum-exp of the scores (docs/CONVENTIONS.md), float32.
 *
 * <p><b>Layouts.</b> {@link Layout#BHTD}: q [B, H, Tq, D], k and v [B, Hkv, Tk, D], o [B, H, Tq, D],
 * lse [B, H, Tq]. {@link Layout#BTHD}: q [B, Tq, H, D], k and v [B, Tk, Hkv, D], o [B, Tq, H, D],
 * lse [B, Tq, H] (the layout a projection followed by a reshape gives; it is also the attention
 * state layout of the kernels, row = b * Tq + t). Query head h reads kv head {@code h / (H / Hkv)}.
 *
 * <p><b>Options.</b> Scale, softcap, causal and sliding window as {@link AttentionOptions}; masks are
 * defined by absolute positions ({@code qPos}, {@code kPos}, null for 0..T-1). A row that sees no
 * key gets o = 0, lse = -inf.
 *
 * <p><b>Types and devices.</b> float32 and float16 inputs (float16 is widened to float32 once on the
 * way in: softmax arithmetic and states stay float32). bfloat16 is rejected (it crashes the JVM in
 * DJL 0.35.1), as is every other type. All inputs must be PyTorch-engine arrays on the same device.
 * Outputs are attached to q's manager.
 *
 * <p><b>Paths.</b> On CPU each forward call goes to one of two implementations, both exact and both
 * returning lse ({@link #choose}): libtorch's fused CPU flash attention (through
 * {@link LibtorchSdpa}; zero-copy both ways: the arrays go in as they are (one whose head-dim axis
 * is not dense, a transposed K cache or a broadcast, is made contiguous first: the kernel reads D as
 * dense), and libtorch's outputs come back as they are, in BHTD strided views of its [B, T, H, *]
 * storage; a call whose q.k could overflow float32 goes to the Java kernel, which checks each
 * score, where libtorch's would take the overflow as a masked key) or our Java kernel
 * ({@link CpuAttention}; the kernel reads {@code float[]}, so q, k, v are copied once into the JVM
 * and o, lse once out, O(T*D) each). Memory is O(T*D) on both paths; no T x T matrix is formed.
 * Decoding uses the Java kernels on the CPU, merging always. Where the one backend selector
 * ({@link AttentionBackends}, {@code -Dlongctx.backend}) picks CUDA (named, or {@code auto} with a
 * usable device), forward and decode calls go to the JCuda backend ({@link Path#CUDA}) from host
 * arrays: DJL gives no CUDA data pointer, so arrays stay on the CPU device here (non-CPU arrays are
 * rejected at {@link #requireCpu}) and the backend copies them over, float32, the whole KV cache at
 * once in decode. CI runs that path over a host emulation of the kernels (a fake libcuda,
 * {@code AttentionOpCudaEmulationTest}); it has not run on a GPU yet (docs/CUDA.md).
 *
 * <p><b>Gradients.</b> This operator is inference-only: the Java kernel has no backward, and
 * gradients through the TorchScript path are neither relied on nor tested (its results are always
 * read as plain values). Blocks built on it ({@link MultiHeadAttentionBlock}) switch to
 * differentiable plain DJL ops when training.
 *
 * <p>Thread-safe; {@link #cpu()} is the shared instance.
 */
public final class AttentionOp {

  /** Axis order of q, k, v and o. */
  public enum Layout {
    /** [batch, heads, tokens, dim]: PyTorch's SDPA layout. */
    BHTD,
    /** [batch, tokens, heads, dim]: the layout projections give. */
    BTHD
  }

  /** Which implementation runs a forward call. */
  public enum Path {
    /** Let {@link #choose} decide per call. */
    AUTO,
    /** Our Java kernel ({@link CpuAttention}). */
    JAVA,
    /** libtorch's fused CPU attention ({@link LibtorchSdpa}). */
    LIBTORCH,
    /** The CUDA kernels through JCuda ({@link CudaAttention}); AUTO takes it where the selector picks CUDA. */
    CUDA
  }

  private static final System.Logger LOG = System.getLogger(AttentionOp.class.getName());

  /**
   * System property: {@code java} or {@code libtorch} fixes {@link Path#AUTO}'s choice wherever both
   * paths can compute a call (benchmarks, tests); unset or {@code auto}: measured ({@link #choose}).
   */
  public static final String PATH_PROPERTY = "longctx.op.path";

  /**
   * Calls that should run alike on either path: one calibration each. Token counts by power of two
   * (the paths' relative speed moves slowly with T); everything else that changes the work exactly.
   */
  record ShapeClass(boolean grouped, int dim, boolean causal, int tqLog2, int tkLog2, Layout layout) {
    static ShapeClass of(Dims d, AttentionOptions opt, Layout layout) {
      return new ShapeClass(d.heads != d.kvHeads, d.dim, opt.causal(), ceilLog2(d.tq), ceilLog2(d.tk), layout);
    }

    private static int ceilLog2(int n) {
      return 32 - Integer.numberOfLeadingZeros(Math.max(1, n) - 1);
    }
  }

  /** Runs two ways of computing one call and says which was faster. */
  interface Calibrator {
    Measured faster(ShapeClass shape, Runnable java, Runnable libtorch);
  }

  /**
   * A calibration's answer, and the best times behind it (NaN where not timed) for the log: rounds
   * counted, and rounds set aside because the JIT compiled during them.
   */
  record Measured(Path faster, double javaMs, double libtorchMs, int rounds, int setAside) {
    static Measured untimed(Path faster) {
      return new Measured(faster, Double.NaN, Double.NaN, 0, 0);
    }
  }

  /**
   * The measurement: each path once untimed (JIT, lazy set-up), then rounds that time each path once
   * after a pause, the order swapping every round; the faster best time wins.
   *
   * <p>Why so many calls: single calls on a shared 2-core machine have a slow tail of 1.5-2x on both
   * paths (libtorch's allocations fault in fresh pages, compiles and other processes take a core), and
   * the paths are often only 10-50% apart, so two rounds picked the slower path now and then
   * (docs/BENCHMARKS.md). Rounds go on while they are cheap: at least {@code minRounds}, then until
   * {@code budgetNanos} of wall time (pauses included) or {@code maxRounds}, so a 20 ms call gets
   * many and a second-long one two; a close call ({@link #close}) gets at least
   * {@link #CLOSE_MIN_ROUNDS} within {@code maxRounds}. The pause lets libtorch's OpenMP workers, which
   * spin for a while after each op, stop before the Java path is timed (they cost it up to 30% at
   * 20 ms calls); it is {@code maxPauseMillis}, or twice the untimed libtorch call where that is
   * shorter, so that tiny calls are not measured mostly asleep.
   *
   * <p><b>The JIT's own work.</b> In a young JVM the compiler threads take a core now and then, and a
   * stolen core slows the two paths unequally: libtorch's OpenMP loops split work evenly and wait for
   * the slowest thread (2-3x their time), our fork-join tasks rebalance. First calibrations in fresh
   * JVMs timed libtorch at up to 62 ms for a 21 ms call, and one picked the Java path where libtorch
   * was 19% faster (docs/BENCHMARKS.md, "The operator's calibration and the JIT"). So the rounds start
   * once {@code jitMillis} (the compilers' total time so far, negative where unknown) has stood still
   * for 20 ms, waiting at most {@link #JIT_QUIET_WAIT_MILLIS}, and a round in which compiles worth a
   * tenth of its two calls' time finished is set aside, with the rounds before it those compiles may
   * have overlapped: their times count only where no round is left.
   * The rules above count every round, so a long call costs what it did; fewer than {@code minRounds}
   * kept rounds buy more rounds within {@link #JIT_BUDGET_NANOS}, up to {@code 2 * maxRounds} in all.
   */
  static Calibrator timed(int minRounds, int maxRounds, long budgetNanos, long maxPauseMillis, LongSupplier jitMillis) {
    return (shape, java, libtorch) -> {
      java.run();
      long t = System.nanoTime();
      libtorch.run();
      long pauseMillis = Math.min(maxPauseMillis, Math.max(1, 2 * (System.nanoTime() - t) / 1_000_000));
      awaitQuietJit(jitMillis);
      Runnable[] paths = {java, libtorch};
      List<Round> rounds = new ArrayList<>();
      long start = System.nanoTime();
      while (true) {
        int kept = Round.kept(rounds);
        long elapsed = System.nanoTime() - start;
        long[] best = Round.best(rounds, false);
        if (kept >= maxRounds || rounds.size() >= 2 * maxRounds
            || !(rounds.size() < minRounds || elapsed < budgetNanos
                || rounds.size() < CLOSE_MIN_ROUNDS && close(best[0], best[1])
                || kept < minRounds && elapsed < JIT_BUDGET_NANOS)) {
          break;
        }
        Round r = new Round(System.nanoTime());
        long jit0 = jitMillis.getAsLong();
        for (int i = 0; i < 2; i++) {
          int p = (rounds.size() + i) % 2;
          pause(pauseMillis);
          long t0 = System.nanoTime();
          paths[p].run();
          r.ns[p] = System.nanoTime() - t0;
        }
        long compiledNanos = jit0 < 0 ? 0 : (jitMillis.getAsLong() - jit0) * 1_000_000;
        r.end = System.nanoTime();
        rounds.add(r);
        // Tiny compiles (a stream's lambda at tier 1) finish all the time in a young JVM and cost next to
        // nothing: only compiles worth a tenth of the round's calls count. Their time is known when they
        // finish, and they may have run since that long before this round began (one C2 compile took 1.4 s
        // and slowed three rounds before it): every round in that stretch is set aside.
        if (compiledNanos * 10 > r.ns[0] + r.ns[1]) {
          for (Round o : rounds) {
            o.aside |= o.end > r.start - compiledNanos;
          }
        }
      }
      int kept = Round.kept(rounds);
      long[] b = Round.best(rounds, kept == 0);
      return new Measured(b[0] < b[1] ? Path.JAVA : Path.LIBTORCH, b[0] / 1e6, b[1] / 1e6, kept, rounds.size() - kept);
    };
  }

  /** One calibration round: when it ran, each path's time (ns), whether the JIT's work sets it aside. */
  private static final class Round {
    final long start;
    long end;
    final long[] ns = new long[2];
    boolean aside;

    Round(long start) {
      this.start = start;
    }

    static int kept(List<Round> rounds) {
      return (int) rounds.stream().filter(r -> !r.aside).count();
    }

    /** Each path's best time over the kept rounds, or over all of them; Long.MAX_VALUE where none. */
    static long[] best(List<Round> rounds, boolean all) {
      long[] best = {Long.MAX_VALUE, Long.MAX_VALUE};
      for (Round r : rounds) {
        if (all || !r.aside) {
          best[0] = Math.min(best[0], r.ns[0]);
          best[1] = Math.min(best[1], r.ns[1]);
        }
      }
      return best;
    }
  }

  /** Wall time (from the first round) within which set-aside rounds buy more rounds. */
  static final long JIT_BUDGET_NANOS = 5_000_000_000L;

  /** The longest the calibration waits for the JIT to stand still before its rounds. */
  static final long JIT_QUIET_WAIT_MILLIS = 1000;

  /** Waits until {@code jitMillis} has not moved for 20 ms, at most {@link #JIT_QUIET_WAIT_MILLIS}. */
  private static void awaitQuietJit(LongSupplier jitMillis) {
    long last = jitMillis.getAsLong();
    for (long waited = 0, still = 0; last >= 0 && still < 20 && waited < JIT_QUIET_WAIT_MILLIS; waited += 10) {
      pause(10);
      long now = jitMillis.getAsLong();
      still = now == last ? still + 10 : 0;
      last = now;
    }
  }

  /** The time this JVM's JIT compilers have spent so far (ms), or -1 where the JVM does not say. */
  static long jitMillis() {
    try {
      java.lang.management.CompilationMXBean c = java.lang.management.ManagementFactory.getCompilationMXBean();
      return c != null && c.isCompilationTimeMonitoringSupported() ? c.getTotalCompilationTime() : -1;
    } catch (LinkageError | RuntimeException e) {
      return -1; // a runtime without java.management: every round counts
    }
  }

  /**
   * Best times this near (the faster at least {@code CLOSE} of the slower) are a close call: the
   * calibration then takes at least {@link #CLOSE_MIN_ROUNDS} rounds even past its time budget. With
   * one-second calls the budget allowed 2 rounds, and 2 rounds picked the slower path 2.6-9.1% of
   * the time where the paths were 8-51% apart (docs/BENCHMARKS.md, "Operator calibration"); on a
   * Zen 5 it kept libtorch at a shape where Java ran 12% faster.
   */
  static final double CLOSE = 0.85;

  /** Rounds a close call gets at least (see {@link #CLOSE}); calls far apart keep the budget's rule. */
  static final int CLOSE_MIN_ROUNDS = 4;

  /** Whether two best times (nanoseconds; Long.MAX_VALUE = not timed yet) make a close call. */
  static boolean close(long a, long b) {
    long lo = Math.min(a, b), hi = Math.max(a, b);
    return hi != Long.MAX_VALUE && lo >= CLOSE * hi;
  }

  /**
   * The operator's calibration: the Java kernel first brought to its compiled speed (once per JVM,
   * at most 5 s: {@link CpuAttention#warmUpJit}), then 2 to 8 rounds within 1 s (at least 4 on a
   * close call), pauses up to 50 ms (the bench's). Without the warm-up the first classes of a fresh
   * JVM timed the kernel at 2-3x its compiled time and picked libtorch where the Java path ran 1.6-1.9x
   * faster (docs/BENCHMARKS.md).
   */
  static final Calibrator TIMED = warmedUp(timed(2, 8, 1_000_000_000L, 50, AttentionOp::jitMillis), 5_000_000_000L);

  /** {@code c} after {@link CpuAttention#warmUpJit} with the given budget. */
  static Calibrator warmedUp(Calibrator c, long budgetNanos) {
    return (shape, java, libtorch) -> {
      CpuAttention.warmUpJit(budgetNanos);
      return c.faster(shape, java, libtorch);
    };
  }

  private static void pause(long millis) {
    try {
      Thread.sleep(millis);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new IllegalStateException("interrupted while measuring the attention paths", e);
    }
  }

  /** At or below this many query rows the Java path uses split-K ({@link CpuAttention#decode}). */
  static final int SPLIT_K_MAX_QUERY_ROWS = 16;

  private static final AttentionOp CPU = new AttentionOp(CpuAttention.DEFAULT);

  private final CpuAttention kernels;
  private final Calibrator calibrator;
  /**
   * The path measured faster per shape class, kept for the JVM: a class's results never change path.
   * A future while its first call measures, so that calls of that class wait for the answer and calls
   * of other classes do not (a measurement can take seconds).
   */
  private final java.util.concurrent.ConcurrentHashMap<ShapeClass, java.util.concurrent.CompletableFuture<Path>>
      calibrated = new java.util.concurrent.ConcurrentHashMap<>();
  private final Object sdpaLock = new Object();
  private volatile LibtorchSdpa sdpa;
  private volatile boolean sdpaUnavailable;

  /** An operator using the given Java kernels (tile sizes) for its Java path. */
  public AttentionOp(CpuAttention kernels) {
    this(kernels, TIMED);
  }

  /** With the given calibration (tests give one that answers without timing). */
  AttentionOp(CpuAttention kernels, Calibrator calibrator) {
    this.kernels = Objects.requireNonNull(kernels, "kernels");
    this.calibrator = Objects.requireNonNull(calibrator, "calibrator");
  }

  /** The shared operator with the default kernels. */
  public static AttentionOp cpu() {
    return CPU;
  }

  // ---------------------------------------------------------------------------------------------
  // forward

  /** Forward attention, BHTD layout, default positions, automatic path. */
  public NDList forward(NDArray q, NDArray k, NDArray v, AttentionOptions opt) {
    return forward(q, k, v, null, null, opt, Layout.BHTD, Path.AUTO);
  }

  /** Forward attention with the given layout, default positions, automatic path. */
  public NDList forward(NDArray q, NDArray k, NDArray v, AttentionOptions opt, Layout layout) {
    return forward(q, k, v, null, null, opt, layout, Path.AUTO);
  }

  /**
   * Forward attention: returns {@code NDList(o, lse)} in {@code layout} (see the class comment).
   *
   * @param qPos absolute positions of the query tokens (length Tq), or null for 0..Tq-1
   * @param kPos absolute positions of the keys (length Tk), or null for 0..Tk-1
   * @param path {@link Path#AUTO} to dispatch by measurement ({@link #choose}); JAVA or LIBTORCH to force one (LIBTORCH
   *     throws when the call is outside what it supports, {@link #libtorchSupports})
   * @throws IllegalArgumentException on wrong ranks, shapes, types, devices or positions
   */
  public NDList forward(NDArray q, NDArray k, NDArray v, long[] qPos, long[] kPos, AttentionOptions opt,
      Layout layout, Path path) {
    Objects.requireNonNull(opt, "opt");
    Objects.requireNonNull(layout, "layout");
    Objects.requireNonNull(path, "path");
    Dims d = Dims.of(q, k, v, layout);
    checkPositions(qPos, d.tq, "qPos");
    checkPositions(kPos, d.tk, "kPos");
    Path chosen = path == Path.AUTO ? choose(q, k, v, d, qPos, kPos, opt, layout) : path;
    if (chosen == Path.LIBTORCH) {
      String why = libtorchUnsupported(d, qPos, kPos, opt);
      if (why != null) {
        throw new IllegalArgumentException("libtorch path requested but " + why);
      }
      LibtorchSdpa s = sdpa();
      if (s == null) {
        throw new IllegalStateException("libtorch path requested but the TorchScript attention module did not load");
      }
      Libtorch r = libtorchForward(s, q, k, v, d, opt, layout);
      if (r.out() != null) {
        return r.out();
      }
      // The Java kernel checks each score and output: it names NaN, Infinity or an overflow where it finds one.
      NDList java = javaForward(q, k, v, d, qPos, kPos, opt, layout);
      if (path == Path.LIBTORCH) {
        java.close();
        throw new IllegalArgumentException("libtorch path requested but " + r.whyNot() + ": Path.JAVA computes this call");
      }
      return java;
    }
    if (chosen == Path.CUDA) {
      requireBuffers(q, k, LIBTORCH_TAKES_LARGE_ARRAYS);
      AttentionState st = CudaAttention.instance().forward(toTensor(q, layout), toTensor(k, layout),
          toTensor(v, layout), qPos, kPos, opt);
      return stateToNd(q.getManager(), st, d.batch, d.tq, d.heads, d.dim, layout);
    }
    return javaForward(q, k, v, d, qPos, kPos, opt, layout);
  }

  /**
   * The path {@link Path#AUTO} takes for this call: CUDA where the backend selector picks it; our
   * Java kernel where libtorch cannot compute the call exactly (custom positions, windows, softcap;
   * {@link #libtorchSupports}) or did not load; otherwise the path {@link #PATH_PROPERTY} names, or
   * else the one measured faster on this machine for the call's {@link ShapeClass}: the first call
   * of a class runs both paths a few times on its own inputs ({@link #TIMED}), and the answer is kept
   * for the JVM. Machines differ (the Java kernel beats libtorch on some AVX-512 machines and loses on
   * AVX2 ones at long T), so no rule is written down here. Either path meets the same tolerance;
   * bits can differ between paths, so within a JVM a class never changes path.
   */
  public Path choose(NDArray q, NDArray k, NDArray v, long[] qPos, long[] kPos, AttentionOptions opt,
      Layout layout) {
    return choose(q, k, v, Dims.of(q, k, v, layout), qPos, kPos, opt, layout);
  }

  /** The CPU path {@link #PATH_PROPERTY} forces, or null for {@code auto} (the default). */
  private static Path forcedPath() {
    String forced = System.getProperty(PATH_PROPERTY, "auto");
    return switch (forced) {
      case "java" -> Path.JAVA;
      case "libtorch" -> Path.LIBTORCH;
      case "auto" -> null;
      default -> throw new IllegalArgumentException(
          "-D" + PATH_PROPERTY + " must be auto, java or libtorch, got '" + forced + "'");
    };
  }

  /**
   * Checks the system properties this package reads ({@value AttentionBackends#PROPERTY}, {@link #PATH_PROPERTY},
   * {@value HugePages#PROPERTY}, {@link LlamaModel#KV_GROUP_FLOATS_PROPERTY}) without acting on them, so that a command can refuse
   * a bad value before its work starts instead of failing at its first attention call.
   *
   * @throws IllegalArgumentException naming the first bad property and its value
   */
  public static void checkSettings() {
    if (!AttentionBackends.choice().equals("auto")) {
      try {
        AttentionBackends.provider(AttentionBackends.choice()); // a name no provider has
      } catch (IllegalArgumentException e) {
        throw new IllegalArgumentException("-D" + e.getMessage(), e);
      }
    }
    forcedPath();
    HugePages.mode();
    LlamaModel.kvGroupFloatsSetting();
  }

  /**
   * Whether a call of head size {@code dim} goes to CUDA: the one selector (-Dlongctx.backend) says
   * cuda, or auto where CUDA is usable (named but missing, the CUDA path then fails loudly); cpu and
   * other providers keep the CPU paths, as do head sizes above the CUDA kernels' largest.
   */
  private static boolean cudaPicked(int dim) {
    return dim <= CudaAttention.MAX_DIM && AttentionBackends.provider(AttentionBackends.choice()).name().equals("cuda");
  }

  private Path choose(NDArray q, NDArray k, NDArray v, Dims d, long[] qPos, long[] kPos, AttentionOptions opt,
      Layout layout) {
    if (cudaPicked(d.dim)) {
      return Path.CUDA;
    }
    LibtorchSdpa s = libtorchUnsupported(d, qPos, kPos, opt) == null ? sdpa() : null;
    if (s == null) {
      return Path.JAVA;
    }
    Path forced = forcedPath();
    if (forced != null) {
      return forced;
    }
    if (bufferProblem(q.getShape(), k.getShape()) != null) {
      return Path.LIBTORCH; // the Java kernel cannot read arrays this large
    }
    ShapeClass shape = ShapeClass.of(d, opt, layout);
    while (true) {
      java.util.concurrent.CompletableFuture<Path> mine = new java.util.concurrent.CompletableFuture<>();
      java.util.concurrent.CompletableFuture<Path> known = calibrated.putIfAbsent(shape, mine);
      if (known != null) {
        try {
          Path p = known.join();
          if (p != null) {
            return p;
          }
        } catch (java.util.concurrent.CompletionException | java.util.concurrent.CancellationException e) {
          // that call failed on its own inputs: measure on ours
        }
        continue; // its measurement did not count (removed): measure again, on this call
      }
      try {
        Path p = calibrate(shape, q, k, v, d, qPos, kPos, opt, layout, s);
        if (p == null) {
          calibrated.remove(shape, mine);
        }
        mine.complete(p);
        return p == null ? Path.JAVA : p;
      } catch (RuntimeException | Error e) {
        calibrated.remove(shape, mine);
        mine.completeExceptionally(e);
        throw e;
      }
    }
  }

  /**
   * Times both paths on this call ({@link #calibrator}) and logs the answer; null where libtorch gave
   * no answer to the call (q.k could overflow, or NaN/Infinity came out: {@link #libtorchForward}), whose
   * round timed only libtorch's checks: not a measurement of the class.
   */
  private Path calibrate(ShapeClass shape, NDArray q, NDArray k, NDArray v, Dims d, long[] qPos, long[] kPos,
      AttentionOptions opt, Layout layout, LibtorchSdpa s) {
    String[] whyNot = {null};
    Measured m = calibrator.faster(shape,
        () -> javaForward(q, k, v, d, qPos, kPos, opt, layout).close(),
        () -> {
          Libtorch r = libtorchForward(s, q, k, v, d, opt, layout);
          if (r.out() != null) {
            r.out().close();
          } else {
            whyNot[0] = r.whyNot();
          }
        });
    if (whyNot[0] != null) {
      LOG.log(System.Logger.Level.INFO, () -> String.format("attention path for %s not measured on this call: "
          + "libtorch gave no answer (%s); the call runs the Java kernel, the next call of the class measures",
          shape, whyNot[0]));
      return null;
    }
    LOG.log(System.Logger.Level.INFO, () -> Double.isNaN(m.javaMs())
        ? String.format("attention path for %s: %s", shape, m.faster())
        : String.format("attention path for %s: %s (measured on this machine: best java %.2f ms, libtorch %.2f ms,"
            + " %d rounds, %d set aside while the JIT compiled)", shape, m.faster(), m.javaMs(), m.libtorchMs(),
            m.rounds(), m.setAside()));
    return m.faster();
  }

  /**
   * Whether libtorch's fused attention computes this call exactly: no window, no softcap, default
   * positions (0..T-1; its causal mask is top-left aligned, which is ours for those positions), and
   * at least one query and one key.
   * Any scale is fine (q is pre-scaled), GQA is expanded inside the module.
   */
  public static boolean libtorchSupports(NDArray q, NDArray k, NDArray v, long[] qPos, long[] kPos,
      AttentionOptions opt, Layout layout) {
    return libtorchUnsupported(Dims.of(q, k, v, layout), qPos, kPos, opt) == null;
  }

  private static String libtorchUnsupported(Dims d, long[] qPos, long[] kPos, AttentionOptions opt) {
    if (opt.window() > 0) {
      return "it has no sliding window";
    }
    if (opt.softcap() > 0) {
      return "it has no softcap";
    }
    if (!isIota(qPos) || !isIota(kPos)) {
      return "it takes no positions (only 0..T-1)";
    }
    // Its causal mask is top-left aligned (query i sees keys j <= i), which is exactly our mask for
    // the default positions 0..Tq-1 and 0..Tk-1, whatever Tq and Tk are.
    if (d.tk == 0 || d.tq == 0) {
      return "it needs at least one query and one key";
    }
    return null;
  }

  private static boolean isIota(long[] pos) {
    if (pos == null) {
      return true;
    }
    for (int i = 0; i < pos.length; i++) {
      if (pos[i] != i) {
        return false;
      }
    }
    return true;
  }

  /** libtorch's answer to a call ({@code out}), or null and why it cannot give it ({@code whyNot}). */
  private record Libtorch(NDList out, String whyNot) {}

  /**
   * libtorch's fused attention on the call; no answer where a q.k could overflow there
   * ({@link #qkMayOverflow}) or where its output holds NaN or Infinity (the Java path then names the
   * input at fault, or computes the call: a NaN in v at a key no query sees enters libtorch's sums
   * with weight 0, and the Java kernel's only where such a key shares a tile with seen ones).
   */
  private Libtorch libtorchForward(LibtorchSdpa s, NDArray q, NDArray k, NDArray v, Dims d, AttentionOptions opt,
      Layout layout) {
    NDManager out = q.getManager();
    try (NDManager scope = out.newSubManager()) {
      NDArray qa = temp(asFloat32(q), q, scope), ka = temp(asFloat32(k), k, scope), va = temp(asFloat32(v), v, scope);
      double scale = opt.scaleFor(d.dim);
      opt.scoreScale(d.dim); // refuses a scale float32 holds only as 0, a subnormal or infinity, as the Java path does
      double def = 1.0 / Math.sqrt(d.dim);
      if (qkMayOverflow(qa, ka, scale / def)) { // before the transposes: the callers' arrays flatten as views
        return new Libtorch(null, "q and k are large enough for a q.k to overflow float32, which libtorch's kernel "
            + "would take as a masked key");
      }
      if (layout == Layout.BTHD) {
        qa = temp(qa.transpose(0, 2, 1, 3), q, scope);
        ka = temp(ka.transpose(0, 2, 1, 3), k, scope);
        va = temp(va.transpose(0, 2, 1, 3), v, scope);
      }
      if (scale != def) {
        // libtorch applies 1/sqrt(D); fold the requested scale into q instead (O(T*D), exact up to rounding).
        qa = temp(qa.mul((float) (scale / def)), q, scope);
      }
      NDList r = s.forward(qa, ka, va, opt.causal());
      NDArray o = temp(r.get(0), q, scope), lse = temp(r.get(1), q, scope);
      if (nanOrInfinity(o, lse)) {
        return new Libtorch(null, "libtorch's attention gave NaN or Infinity where the Java kernel computes the call "
            + "(a NaN or Infinity in v at keys no query sees, or values near float32's limits)");
      }
      // libtorch's outputs are views of [B, T, H, *] storage: the BTHD transposes below are contiguous.
      if (layout == Layout.BTHD) {
        o = temp(o.transpose(0, 2, 1, 3), q, scope);
        lse = temp(lse.transpose(0, 2, 1), q, scope);
      }
      o.attach(out);
      lse.attach(out);
      return new Libtorch(new NDList(o, lse), null);
    }
  }

  /**
   * Whether some q.k could overflow float32 in libtorch's kernel, which takes an overflow to -inf as
   * a masked key, silently (a row of them came back as o = 0, lse = 0): {@link Tensor#qkMayOverflow}
   * from the two arrays' sums of squares (q's times {@code qFactor}, the scale folded into it); where
   * it may (entries near 1e16 and more at these sizes, or NaN) the call goes to the Java kernel, which
   * checks each score. Two dot products: about 1 ms at [1, 8, 1024, 128] with the NaN check below,
   * passes over memory (docs/BENCHMARKS.md, "The operator's calibration and the JIT").
   */
  private static boolean qkMayOverflow(NDArray q, NDArray k, double qFactor) {
    return Tensor.qkMayOverflow(sumOfSquares(q), sumOfSquares(k), qFactor);
  }

  private static double sumOfSquares(NDArray x) {
    try (NDArray flat = x.flatten(); NDArray s = flat.dot(flat)) {
      return s.getFloat();
    }
  }

  /**
   * Whether o holds NaN or an infinity or lse NaN or +inf (-inf is a row with no keys). A sum is finite
   * when every entry is (NaN and infinities carry through it), so the exact test runs only when one
   * is not. The sums cost 0.2 ms at [1, 8, 1024, 128] (about 1.5% of the call) and 1.3 ms at T = 16384
   * on a 2-core Xeon. Temporaries go to o's manager.
   */
  private static boolean nanOrInfinity(NDArray o, NDArray lse) {
    if (Float.isFinite(o.sum().getFloat()) && Float.isFinite(lse.sum().getFloat())) {
      return false;
    }
    return o.isNaN().logicalOr(o.isInfinite()).any().getBoolean()
        || lse.isNaN().logicalOr(lse.eq(Float.POSITIVE_INFINITY)).any().getBoolean();
  }

  /** Puts an intermediate (not the caller's own array) under the scope, to be freed with it. */
  private static NDArray temp(NDArray x, NDArray original, NDManager scope) {
    if (x != original) {
      x.attach(scope);
    }
    return x;
  }

  private NDList javaForward(NDArray q, NDArray k, NDArray v, Dims d, long[] qPos, long[] kPos,
      AttentionOptions opt, Layout layout) {
    requireBuffers(q, k, LIBTORCH_TAKES_LARGE_ARRAYS);
    try (NDManager scope = q.getManager().newSubManager()) {
      BufferTensor qb = inPlace(q, layout, scope), kb = inPlace(k, layout, scope), vb = inPlace(v, layout, scope);
      if (d.tq <= SPLIT_K_MAX_QUERY_ROWS) {
        // Few query rows: the forward kernel would have only B*H*ceil(Tq/blockQ) tasks; split-K also
        // splits the keys (the same exact attention, splits merged in a fixed order).
        AttentionState st = kernels.decode(qb, kb, vb, qPos, kPos, opt, CpuAttention.DEFAULT_SPLIT_LEN).state();
        return stateToNd(q.getManager(), st, d.batch, d.tq, d.heads, d.dim, layout);
      }
      // The kernel writes the output arrays' memory itself (no copy of its state after it).
      NDList out = newOutputs(q.getManager(), d.batch, d.heads, d.tq, d.dim, layout);
      try {
        FloatBuffer o = directFloats(out.get(0)), lse = directFloats(out.get(1));
        kernels.forward(qb, kb, vb, qPos, kPos, opt, layout == Layout.BHTD
            ? BufferTensor.bhtd(o, d.batch, d.heads, d.tq, d.dim)
            : BufferTensor.bthd(o, d.batch, d.tq, d.heads, d.dim), lse);
      } catch (RuntimeException | Error e) {
        out.close();
        throw e;
      }
      return out;
    }
  }

  // ---------------------------------------------------------------------------------------------
  // decode

  /**
   * Decoding: q (few tokens, typically one per sequence) over a KV cache k, v, with split-K on the
   * Java kernel, or on the CUDA kernel where the backend selector picks CUDA (as {@link #choose}; the
   * cache copied to the device whole, so it must fit one array): splits of
   * {@link CpuAttention#DEFAULT_SPLIT_LEN} keys from key 0, merged in a fixed order, so the result
   * does not depend on the rest of the batch. Layout and positions as in {@link #forward}; for
   * causal decoding pass qPos (e.g. the query's absolute position).
   */
  public NDList decode(NDArray q, NDArray k, NDArray v, long[] qPos, long[] kPos, AttentionOptions opt,
      Layout layout) {
    return decode(q, k, v, qPos, kPos, opt, layout, MAX_BUFFER_FLOATS);
  }

  /**
   * {@link #decode(NDArray, NDArray, NDArray, long[], long[], AttentionOptions, Layout)} with K and V
   * of more than {@code maxPageFloats} elements read as pages of consecutive tokens (tests lower it):
   * where their memory is token-major with batch 1 (a cache grown along T), each page is a view read
   * in place and the answer is the one array's bits; otherwise such a cache is refused (its pages
   * would be copies of the whole cache).
   */
  NDList decode(NDArray q, NDArray k, NDArray v, long[] qPos, long[] kPos, AttentionOptions opt, Layout layout,
      long maxPageFloats) {
    Objects.requireNonNull(opt, "opt");
    Dims d = Dims.of(q, k, v, layout);
    checkPositions(qPos, d.tq, "qPos");
    checkPositions(kPos, d.tk, "kPos");
    String tooLarge = "pass the KV cache as a list of chunks (decode(q, kChunks, vChunks, ...)), or split the batch";
    String qTooLarge = bufferProblem(q.getShape(), new Shape(0));
    if (qTooLarge != null) {
      throw new IllegalArgumentException(qTooLarge + ": split the batch");
    }
    AttentionState st;
    if (cudaPicked(d.dim)) {
      requireBuffers(q, k, tooLarge);
      st = CudaAttention.instance().decode(toTensor(q, layout), toTensor(k, layout), toTensor(v, layout), qPos, kPos,
          opt, CpuAttention.DEFAULT_SPLIT_LEN).state();
      return stateToNd(q.getManager(), st, d.batch, d.tq, d.heads, d.dim, layout);
    }
    try (NDManager scope = q.getManager().newSubManager()) {
      BufferTensor qb = inPlace(q, layout, scope);
      if (k.size() <= maxPageFloats) {
        st = kernels.decode(qb, inPlace(k, layout, scope), inPlace(v, layout, scope), qPos, kPos, opt,
            CpuAttention.DEFAULT_SPLIT_LEN).state();
      } else {
        int pageTokens = (int) Math.max(1, maxPageFloats / ((long) d.batch * d.kvHeads * d.dim));
        List<BufferTensor> kPages = tokenPages(k, layout, pageTokens, scope), vPages = tokenPages(v, layout, pageTokens,
            scope);
        if (kPages == null || vPages == null) {
          NDArray bad = kPages == null ? k : v;
          throw new IllegalArgumentException((bad == k ? "k " : "v ") + bad.getShape() + " has "
              + String.format("%,d", bad.size()) + " elements, more than one direct buffer holds ("
              + String.format("%,d", maxPageFloats) + " float32 elements), and "
              + (bad.getDataType() != DataType.FLOAT32 ? "it is " + bad.getDataType() + ", not float32"
                  : "its memory cannot be read in pages of tokens (only K/V in token-major memory with batch 1 can)")
              + ": " + tooLarge);
        }
        st = kernels.decode(qb, kPages, vPages, qPos, kPos, opt, CpuAttention.DEFAULT_SPLIT_LEN).state();
      }
    }
    return stateToNd(q.getManager(), st, d.batch, d.tq, d.heads, d.dim, layout);
  }

  /**
   * a cut along its token axis into pages of {@code pageTokens} tokens (the last shorter), each a view
   * {@link #inPlace} reads without a copy; null where the pages would not be such views (batch above
   * 1, or memory not token-major: its token slices are strided).
   */
  private static List<BufferTensor> tokenPages(NDArray a, Layout layout, int pageTokens, NDManager scope) {
    if (a.getShape().get(0) != 1) {
      return null;
    }
    int tAxis = layout == Layout.BHTD ? 2 : 1;
    long tokens = a.getShape().get(tAxis);
    List<BufferTensor> pages = new ArrayList<>();
    for (long t0 = 0; t0 < tokens; t0 += pageTokens) {
      long t1 = Math.min(tokens, t0 + pageTokens);
      NDArray page = a.get(tAxis == 2 ? ":, :, " + t0 + ":" + t1 : ":, " + t0 + ":" + t1);
      page.attach(scope);
      BufferTensor b = view(page, layout, scope);
      if (b == null) {
        return null;
      }
      pages.add(b);
    }
    return pages;
  }

  /**
   * a as a {@link BufferTensor} in the layout's order, valid while {@code scope} is open, for the Java
   * kernels to read in place (a query row as its block starts, a key tile at a time): a's own memory
   * where {@link #view} reads it, else libtorch's float32 conversion or contiguous copy, put in
   * scope. a itself stays with its manager (another thread may be reading it). Before, q, k and v
   * were copied whole into float[] first: 4-5 ms of a 17 ms call at [1,8,1024,128] causal, and a long
   * KV cache's copies cost more than its decode (docs/BENCHMARKS.md, "Decode with the keys in the
   * lanes", "The operator reads its inputs and writes its output in place").
   */
  private static BufferTensor inPlace(NDArray a, Layout layout, NDManager scope) {
    NDArray x = a;
    if (x.getDataType() != DataType.FLOAT32) {
      x = x.toType(DataType.FLOAT32, false); // keeps a's strides
      x.attach(scope);
    }
    BufferTensor b = view(x, layout, scope);
    if (b != null) {
      return b;
    }
    NDArray flat = x.reshape(-1); // libtorch's contiguous copy
    flat.attach(scope);
    return buffer(flat, x.getShape(), layout == Layout.BTHD);
  }

  /**
   * a (float32) as a {@link BufferTensor} over its own memory, without a copy: where that memory is
   * a's shape row-major, or its transpose's (a transposed view, BHTD memory given as BTHD or the
   * reverse, read in its memory's own order: libtorch's contiguous copy of it cost as much as the
   * kernel at [1,8,1024,128], docs/BENCHMARKS.md); else null. The array's own direct buffer starts at
   * its first element (a slice's too) and skips the flat reshape per array that a chunk list paid
   * 1.1-1.3x one array's decode time for ("Chunk-list decode as pages").
   */
  private static BufferTensor view(NDArray a, Layout layout, NDManager scope) {
    if (a.getDataType() != DataType.FLOAT32 || !contiguityKnown()) {
      return null;
    }
    NDArray x = rowMajorView(a, scope);
    if (x == null) {
      return null;
    }
    boolean tokenMajor = (layout == Layout.BTHD) == (x == a);
    return buffer(x, x.getShape(), tokenMajor);
  }

  /** A contiguous array's memory as a BufferTensor of the 4-d shape s, in the given order. */
  private static BufferTensor buffer(NDArray contiguous, Shape s, boolean tokenMajor) {
    FloatBuffer data = contiguous.toByteBuffer(true).order(ByteOrder.nativeOrder()).asFloatBuffer();
    int d0 = (int) s.get(0), d1 = (int) s.get(1), d2 = (int) s.get(2), d3 = (int) s.get(3);
    return tokenMajor ? BufferTensor.bthd(data, d0, d1, d2, d3) : BufferTensor.bhtd(data, d0, d1, d2, d3);
  }

  /**
   * libtorch's {@code is_contiguous} through DJL's own JNI binding (DJL's API exposes no strides), or
   * null where this DJL has no such binding; {@code AttentionOpTest} checks it is there.
   */
  private static final MethodHandle IS_CONTIGUOUS = isContiguousHandle();

  private static MethodHandle isContiguousHandle() {
    try {
      Class<?> lib = Class.forName("ai.djl.pytorch.jni.PyTorchLibrary");
      java.lang.reflect.Field instance = lib.getDeclaredField("LIB");
      instance.setAccessible(true);
      java.lang.reflect.Method m = lib.getDeclaredMethod("torchIsContiguous", long.class);
      m.setAccessible(true);
      return MethodHandles.lookup().unreflect(m).bindTo(instance.get(null));
    } catch (ReflectiveOperationException | RuntimeException | LinkageError e) {
      LOG.log(System.Logger.Level.DEBUG, "no is_contiguous probe: transposed views are copied by libtorch: " + e);
      return null;
    }
  }

  /** Whether a's memory is its shape row-major; true where that cannot be asked (reshape copies then). */
  static boolean contiguous(NDArray a) {
    if (IS_CONTIGUOUS == null || !(a instanceof ai.djl.util.NativeResource<?> r) || !(r.getHandle() instanceof Long h)) {
      return true;
    }
    try {
      return (boolean) IS_CONTIGUOUS.invoke(h.longValue());
    } catch (Error e) {
      throw e;
    } catch (Throwable e) {
      return true; // not asked: reshape copies where needed
    }
  }

  /**
   * a where its memory is its shape row-major; its transpose of the T and H axes (put in scope) where
   * that is; null otherwise (strided: {@link #inPlace} copies it). {@link #inPlace} reads the first two
   * without a copy.
   */
  private static NDArray rowMajorView(NDArray a, NDManager scope) {
    if (contiguous(a)) {
      return a;
    }
    NDArray t = a.transpose(0, 2, 1, 3);
    t.attach(scope);
    return contiguous(t) ? t : null;
  }

  /** Whether {@link #contiguous} asks libtorch (false: another DJL version; transposed views are then copied). */
  static boolean contiguityKnown() {
    return IS_CONTIGUOUS != null;
  }

  /**
   * Decoding over a KV cache held as a list of chunks (k chunk i and v chunk i of equal shape, each
   * [B, Hkv, Tk_i, D] or [B, Tk_i, Hkv, D] by layout), without concatenating them. Where every chunk
   * is float32 in memory of its own order or its transpose's (an array of its own, a transposed view
   * of one, a slice along T of a batch-1 array in token-major memory), the chunks are read in place
   * as pages of one K and one V ({@link CpuAttention#decode(BufferTensor, List, List, long[], long[],
   * AttentionOptions, int)}): the result is {@link #decode(NDArray, NDArray, NDArray, long[], long[],
   * AttentionOptions, Layout)}'s on the chunks concatenated, bit for bit, however the cache is cut.
   * Otherwise (float16 chunks, strided slices) each chunk is converted or copied and decoded alone,
   * one at a time so the cache is never copied whole, and the states are merged in chunk order
   * ({@link AttentionState#mergeAll}): within the tolerance, not the one array's bits. Where the
   * backend selector picks CUDA, the chunks go to the device as they are, one buffer each (converted
   * to float32 on the host on the way), and the answer is the one array's CUDA decode, bit for bit.
   *
   * @param kStart absolute position of each chunk's first key (keys inside a chunk are
   *     consecutive), or null for chunks laid end to end from position 0
   */
  public NDList decode(NDArray q, List<NDArray> kChunks, List<NDArray> vChunks, long[] qPos, long[] kStart,
      AttentionOptions opt, Layout layout) {
    Objects.requireNonNull(opt, "opt");
    Objects.requireNonNull(kChunks, "kChunks");
    Objects.requireNonNull(vChunks, "vChunks");
    if (kChunks.isEmpty() || kChunks.size() != vChunks.size()) {
      throw new IllegalArgumentException("need one or more k chunks and as many v chunks, got " + kChunks.size()
          + " and " + vChunks.size());
    }
    if (kStart != null && kStart.length != kChunks.size()) {
      throw new IllegalArgumentException("kStart has " + kStart.length + " entries for " + kChunks.size() + " chunks");
    }
    int n = kChunks.size();
    Dims[] dims = new Dims[n];
    long total = 0;
    for (int i = 0; i < n; i++) {
      try {
        dims[i] = Dims.of(q, kChunks.get(i), vChunks.get(i), layout);
        requireBuffers(q, kChunks.get(i), "use smaller chunks");
      } catch (IllegalArgumentException e) {
        throw new IllegalArgumentException("chunk " + i + ": " + e.getMessage(), e);
      }
      if (dims[i].kvHeads != dims[0].kvHeads) {
        // Each chunk alone fits q, but a cache's chunks must share one head mapping.
        throw new IllegalArgumentException("chunk " + i + " has " + dims[i].kvHeads + " kv heads, chunk 0 has "
            + dims[0].kvHeads);
      }
      total += dims[i].tk;
    }
    Dims first = dims[0];
    checkPositions(qPos, first.tq, "qPos");
    if (total > Integer.MAX_VALUE) {
      throw new IllegalArgumentException("the chunks hold " + total + " keys; the Java kernels take at most "
          + Integer.MAX_VALUE);
    }
    long[] kPos = new long[(int) total];
    long next = 0;
    for (int i = 0, at = 0; i < n; at += dims[i].tk, i++) {
      long start = kStart != null ? kStart[i] : next;
      if (dims[i].tk > 0 && start > Long.MAX_VALUE - (dims[i].tk - 1)) { // the last key's position would wrap
        throw new IllegalArgumentException("chunk " + i + ": its " + dims[i].tk + " keys from position " + start
            + " pass Long.MAX_VALUE");
      }
      next = start + dims[i].tk;
      for (int j = 0; j < dims[i].tk; j++) {
        kPos[at + j] = start + j;
      }
    }
    AttentionState st;
    if (cudaPicked(first.dim)) {
      List<Tensor> ks = new ArrayList<>(n), vs = new ArrayList<>(n);
      for (int i = 0; i < n; i++) {
        ks.add(toTensor(kChunks.get(i), layout));
        vs.add(toTensor(vChunks.get(i), layout));
      }
      st = CudaAttention.instance().decodeChunks(toTensor(q, layout), ks, vs, qPos, kPos, opt,
          CpuAttention.DEFAULT_SPLIT_LEN, null, CudaAttention.DType.F32).state();
      return stateToNd(q.getManager(), st, first.batch, first.tq, first.heads, first.dim, layout);
    }
    try (NDManager scope = q.getManager().newSubManager()) {
      BufferTensor qb = inPlace(q, layout, scope);
      List<BufferTensor> kPages = new ArrayList<>(n), vPages = new ArrayList<>(n);
      for (int i = 0; i < n; i++) {
        BufferTensor kb = view(kChunks.get(i), layout, scope), vb = view(vChunks.get(i), layout, scope);
        if (kb == null || vb == null) {
          break; // this chunk needs a copy: all go one at a time below
        }
        kPages.add(kb);
        vPages.add(vb);
      }
      if (kPages.size() == n) {
        st = kernels.decode(qb, kPages, vPages, qPos, kPos, opt, CpuAttention.DEFAULT_SPLIT_LEN).state();
      } else {
        // Some chunk needs a conversion or copy: holding every chunk's copy at once could double a cache's
        // memory, so each chunk is decoded alone, its copy freed after it, and the states merged in order.
        List<AttentionState> states = new ArrayList<>(n);
        for (int i = 0, at = 0; i < n; at += dims[i].tk, i++) {
          try (NDManager chunkScope = q.getManager().newSubManager()) {
            states.add(kernels.decode(qb, inPlace(kChunks.get(i), layout, chunkScope),
                inPlace(vChunks.get(i), layout, chunkScope), qPos, Arrays.copyOfRange(kPos, at, at + dims[i].tk), opt,
                CpuAttention.DEFAULT_SPLIT_LEN).state());
          }
        }
        st = AttentionState.mergeAll(states);
      }
    }
    return stateToNd(q.getManager(), st, first.batch, first.tq, first.heads, first.dim, layout);
  }

  // ---------------------------------------------------------------------------------------------
  // merge

  /**
   * The LSE merge of attention states given as NDArrays (each an {@code NDList(o, lse)} as this
   * operator returns, all of one shape and layout), in list order as a balanced tree. Empty states
   * (lse = -inf) are the identity; NaN or +inf lse is rejected. The result belongs to the first
   * state's {@code o} manager (there is no q here).
   */
  public NDList merge(List<NDList> states, Layout layout) {
    Objects.requireNonNull(states, "states");
    Objects.requireNonNull(layout, "layout");
    if (states.isEmpty()) {
      throw new IllegalArgumentException("merge needs at least one state");
    }
    Shape oShape = null;
    List<AttentionState> list = new ArrayList<>(states.size());
    NDManager manager = null;
    for (int i = 0; i < states.size(); i++) {
      NDList s = states.get(i);
      if (s == null || s.size() != 2) {
        throw new IllegalArgumentException("state " + i + " must be NDList(o, lse), got "
            + (s == null ? "null" : s.size() + " arrays"));
      }
      NDArray o = s.get(0), lse = s.get(1);
      checkType(o, "state " + i + " o");
      checkType(lse, "state " + i + " lse");
      if (o.getDataType() != DataType.FLOAT32 || lse.getDataType() != DataType.FLOAT32) {
        // float16 holds lse near 5 only to 0.004, which moves merge weights by 0.4%.
        throw new IllegalArgumentException("state " + i + ": o and lse must be float32 (attention states are, as this "
            + "operator returns them), got " + o.getDataType() + " and " + lse.getDataType());
      }
      requireCpu(o, "state " + i + " o");
      requireCpu(lse, "state " + i + " lse");
      Shape os = o.getShape();
      if (os.dimension() != 4 || !lse.getShape().equals(os.slice(0, 3))) {
        throw new IllegalArgumentException("state " + i + ": o must be 4-d and lse its first three axes, got o " + os
            + " and lse " + lse.getShape());
      }
      if (oShape == null) {
        oShape = os;
        manager = o.getManager();
      } else if (!oShape.equals(os)) {
        throw new IllegalArgumentException("state " + i + " has shape " + os + ", state 0 has " + oShape);
      }
      // AttentionState layout is [B*T, H, D] = BTHD; BHTD states are transposed on the way in.
      NDArray oo = layout == Layout.BHTD ? o.transpose(0, 2, 1, 3) : o;
      NDArray ll = layout == Layout.BHTD ? lse.transpose(0, 2, 1) : lse;
      int b = (int) os.get(0), t = (int) os.get(layout == Layout.BHTD ? 2 : 1);
      int h = (int) os.get(layout == Layout.BHTD ? 1 : 2), dim = (int) os.get(3);
      list.add(AttentionState.of(toFloats(oo), toFloats(ll), b * t, h, dim));
      if (oo != o) {
        oo.close();
        ll.close();
      }
    }
    AttentionState m = AttentionState.mergeAll(list);
    int b = (int) oShape.get(0), t = (int) oShape.get(layout == Layout.BHTD ? 2 : 1);
    return stateToNd(manager, m, b, t, m.heads(), m.dim(), layout);
  }

  /** Merge of two states, {@link #merge(List, Layout)}. */
  public NDList merge(NDList a, NDList b, Layout layout) {
    return merge(List.of(a, b), layout);
  }

  // ---------------------------------------------------------------------------------------------
  // plumbing

  /** Shapes of a validated (q, k, v) triple. */
  record Dims(int batch, int heads, int kvHeads, int tq, int tk, int dim) {

    static Dims of(NDArray q, NDArray k, NDArray v, Layout layout) {
      Objects.requireNonNull(q, "q");
      Objects.requireNonNull(k, "k");
      Objects.requireNonNull(v, "v");
      Objects.requireNonNull(layout, "layout");
      checkType(q, "q");
      checkType(k, "k");
      checkType(v, "v");
      requireCpu(q, "q");
      if (!k.getDevice().equals(q.getDevice()) || !v.getDevice().equals(q.getDevice())) {
        throw new IllegalArgumentException("q, k, v must be on one device, got " + q.getDevice() + ", " + k.getDevice()
            + ", " + v.getDevice());
      }
      Shape qs = q.getShape(), ks = k.getShape(), vs = v.getShape();
      String want = layout == Layout.BHTD ? "[B, H, T, D]" : "[B, T, H, D]";
      if (qs.dimension() != 4 || ks.dimension() != 4 || vs.dimension() != 4) {
        throw new IllegalArgumentException("q, k, v must be 4-d " + want + " (layout " + layout + "), got q " + qs
            + ", k " + ks + ", v " + vs);
      }
      if (!ks.equals(vs)) {
        throw new IllegalArgumentException("k and v must have the same shape, got k " + ks + " and v " + vs);
      }
      int hAxis = layout == Layout.BHTD ? 1 : 2, tAxis = layout == Layout.BHTD ? 2 : 1;
      long b = qs.get(0), h = qs.get(hAxis), tq = qs.get(tAxis), d = qs.get(3);
      long hk = ks.get(hAxis), tk = ks.get(tAxis);
      if (ks.get(0) != b) {
        throw new IllegalArgumentException("q and k must have the same batch, got q " + qs + " and k " + ks);
      }
      if (ks.get(3) != d) {
        throw new IllegalArgumentException("q and k must have the same head dim, got q " + qs + " and k " + ks);
      }
      if (b < 1 || h < 1 || hk < 1 || d < 1) {
        throw new IllegalArgumentException("batch, heads and head dim must be >= 1, got q " + qs + " and k " + ks
            + " (layout " + layout + " " + want + ")");
      }
      if (h % hk != 0) {
        throw new IllegalArgumentException("query heads (" + h + ") must be a multiple of kv heads (" + hk + "), got q "
            + qs + " and k " + ks + " (layout " + layout + " " + want + ")");
      }
      if (d > CpuAttention.MAX_DIM) {
        throw new IllegalArgumentException("head dim " + d + " above the supported " + CpuAttention.MAX_DIM);
      }
      if (q.size() > Integer.MAX_VALUE || k.size() > Integer.MAX_VALUE) {
        throw new IllegalArgumentException("arrays above 2^31 elements are not supported, got q " + qs + ", k " + ks
            + " (decode takes a larger KV cache as a list of chunks)");
      }
      return new Dims((int) b, (int) h, (int) hk, (int) tq, (int) tk, (int) d);
    }
  }

  /**
   * The most elements of one array the Java and CUDA paths take: they read and write arrays through
   * direct buffers ({@code toByteBuffer}), which hold under 2 GiB (float16 inputs are widened first).
   */
  static final long MAX_BUFFER_FLOATS = Integer.MAX_VALUE / Float.BYTES;

  /** Why q (and o, of q's size) or k (and v) is too large for a direct buffer, or null. */
  static String bufferProblem(Shape q, Shape k) {
    Shape big = k.size() > MAX_BUFFER_FLOATS ? k : q.size() > MAX_BUFFER_FLOATS ? q : null;
    if (big == null) {
      return null;
    }
    return (big == k ? "k " : "q ") + big + " has " + String.format("%,d", big.size()) + " elements; the Java and "
        + "CUDA paths read and write arrays through direct buffers, which hold under 2 GiB: at most "
        + String.format("%,d", MAX_BUFFER_FLOATS) + " float32 elements per array";
  }

  private static final String LIBTORCH_TAKES_LARGE_ARRAYS =
      "libtorch's path (AUTO or Path.LIBTORCH) takes such arrays for the calls it computes: no window, softcap or positions";

  private static void requireBuffers(NDArray q, NDArray k, String instead) {
    String why = bufferProblem(q.getShape(), k.getShape());
    if (why != null) {
      throw new IllegalArgumentException(why + ": " + instead);
    }
  }

  static void checkType(NDArray a, String name) {
    checkType(a.getDataType(), a.getManager().getEngine().getEngineName(), name);
    if (a.getSparseFormat() != ai.djl.ndarray.types.SparseFormat.DENSE) { // libtorch would fail deep inside, unnamed
      throw new IllegalArgumentException(name + " is a sparse (" + a.getSparseFormat() + ") array: pass a dense one");
    }
  }

  /** The dtype and engine rule alone (a bfloat16 NDArray cannot even be made in DJL 0.35.1 without a crash). */
  static void checkType(DataType t, String engine, String name) {
    if (t == DataType.BFLOAT16) {
      throw new IllegalArgumentException(name + " is bfloat16, which DJL 0.35.1 cannot read safely (it crashes the "
          + "JVM): convert to float16 or float32 first");
    }
    if (t != DataType.FLOAT32 && t != DataType.FLOAT16) {
      throw new IllegalArgumentException(name + " must be float32 or float16, got " + t);
    }
    if (!"PyTorch".equals(engine)) {
      throw new IllegalArgumentException(name + " must be a PyTorch-engine NDArray, got engine " + engine);
    }
  }

  /** Arrays must be on the CPU device: DJL gives no CUDA data pointer, so the CUDA path copies from host arrays. */
  static void requireCpu(NDArray a, String name) {
    Device dev = a.getDevice();
    if (!Device.Type.CPU.equals(dev.getDeviceType())) {
      throw new IllegalArgumentException(name + " is on " + dev + ": only CPU-device arrays are supported (DJL gives "
          + "no CUDA data pointer; the CUDA path copies host arrays itself); move it with toDevice(Device.cpu(), false)");
    }
  }

  private static void checkPositions(long[] pos, int n, String name) {
    if (pos != null && pos.length != n) {
      throw new IllegalArgumentException(name + " has " + pos.length + " positions for " + n + " tokens");
    }
  }

  private static NDArray asFloat32(NDArray a) {
    return a.getDataType() == DataType.FLOAT32 ? a : a.toType(DataType.FLOAT32, false);
  }

  /**
   * One copy of a CPU array into a float[] in our [B, H, T, D] layout (widening float16): read in
   * place ({@link #inPlace}) and copied row by row, so BTHD needs no libtorch transpose first (its
   * strided copy took 32 ms for 64 MiB, this 7-9 ms; docs/BENCHMARKS.md).
   */
  static Tensor toTensor(NDArray a, Layout layout) {
    try (NDManager scope = a.getManager().newSubManager()) {
      return inPlace(a, layout, scope).toTensor();
    }
  }

  /**
   * One copy of a float32 array into a new float[]: {@code toByteBuffer(true)} is a direct view of the
   * tensor's memory (DJL first makes a strided array contiguous, into a temporary freed here) and the
   * bulk get is a memcpy, in pieces on the kernels' threads from 1 MiB; {@code toFloatArray()} would
   * copy twice.
   */
  private static float[] toFloats(NDArray a) {
    int n = Math.toIntExact(a.size());
    float[] out = new float[n];
    // For a strided array toByteBuffer would make its contiguous copy on a's manager (the caller's),
    // where nothing closes it. The flat reshape is a view of a contiguous array and a contiguous copy
    // of any other, moved to a scope of ours at once (inPlace copies so too); a itself stays where it
    // is (another thread may be reading it: lending it to a scope broke two callers sharing one input).
    try (NDManager scope = a.getManager().newSubManager()) {
      NDArray flat = a.reshape(-1);
      flat.attach(scope);
      FloatBuffer src = flat.toByteBuffer(true).order(java.nio.ByteOrder.nativeOrder()).asFloatBuffer();
      inRanges(n, (from, to) -> src.get(from, out, from, to - from));
    }
    return out;
  }

  /**
   * The kernel's state (rows b*T+t, [rows, H, D]) as NDList(o, lse) in the layout, on the manager,
   * in one pass each: new (uninitialized) libtorch arrays, written through their direct buffers, and
   * for BHTD transposed on the way. Before, a create(float[]) copy and a transpose-and-duplicate took
   * two passes over o (docs/BENCHMARKS.md, "Four-vector register blocks"). The memory is libtorch's
   * own, so views of the outputs stay valid after the outputs are closed (a create(float[]) array's
   * memory lives only as long as that array).
   *
   * <p>o is written in pieces on the kernels' threads: glibc maps 32 MiB and more afresh on every
   * call, and the first touch of each page is most of what that write costs (128-132 ms for 32 MiB on
   * one thread of a Zen 5 VM, 67-77 ms on two; docs/BENCHMARKS.md, "The operator's copies on the
   * kernels' threads").
   */
  private static NDList stateToNd(NDManager m, AttentionState st, int batch, int t, int heads, int dim,
      Layout layout) {
    float[] o = st.o(), lse = st.lse();
    boolean bthd = layout == Layout.BTHD;
    NDList out = newOutputs(m, batch, heads, t, dim, layout);
    NDArray on = out.get(0), ln = out.get(1);
    if (o.length > 0) {
      FloatBuffer of = directFloats(on), lf = directFloats(ln);
      // Absolute puts of disjoint ranges: safe from several threads.
      if (bthd) {
        lf.put(0, lse);
        inRanges(o.length, (from, to) -> of.put(from, o, from, to - from));
      } else {
        boolean parallel = o.length >= COPY_MIN_FLOATS;
        // Each head's rows in enough pieces that few heads still give every thread work.
        int pieces = parallel ? Math.max(1, Math.min(t, COPY_TASKS / (batch * heads))) : 1;
        forEach(batch * heads * pieces, parallel, task -> {
          int bh = task / pieces, piece = task % pieces, b = bh / heads, h = bh % heads;
          int first = (int) ((long) t * piece / pieces), end = (int) ((long) t * (piece + 1) / pieces);
          for (int tt = first; tt < end; tt++) {
            int from = (b * t + tt) * heads + h, to = (b * heads + h) * t + tt;
            of.put(to * dim, o, from * dim, dim);
            lf.put(to, lse[from]);
          }
        });
      }
    }
    return out;
  }

  /** New (uninitialized) libtorch arrays o and lse for q's shape, in the layout, on m. */
  private static NDList newOutputs(NDManager m, int batch, int heads, int t, int dim, Layout layout) {
    boolean bthd = layout == Layout.BTHD;
    // Fresh memory, first touched when the kernel or the copy writes it: 2 MiB pages where they were
    // measured faster (HugePages; a bad -D value is named before anything is made).
    long bytes = 4L * batch * heads * t * dim;
    boolean hugePages = bytes >= HugePages.MIN_BYTES && HugePages.decision().advise();
    NDArray o = m.create(bthd ? new Shape(batch, t, heads, dim) : new Shape(batch, heads, t, dim), DataType.FLOAT32);
    if (hugePages) {
      HugePages.madvise(o.toByteBuffer(true), bytes);
    }
    NDArray lse = m.create(bthd ? new Shape(batch, t, heads) : new Shape(batch, heads, t), DataType.FLOAT32);
    return new NDList(o, lse);
  }

  /** A copy of range [from, to) of a flat array. */
  private interface RangeCopy {
    void copy(int from, int to);
  }

  /**
   * {@code body} over [0, n): from {@link #COPY_MIN_FLOATS} on, in {@link #COPY_TASKS} pieces on the
   * kernels' threads; below, in one piece on the calling thread.
   */
  private static void inRanges(int n, RangeCopy body) {
    boolean parallel = n >= COPY_MIN_FLOATS;
    int parts = parallel ? COPY_TASKS : 1;
    forEach(parts, parallel, p -> body.copy((int) ((long) n * p / parts), (int) ((long) n * (p + 1) / parts)));
  }

  private static void forEach(int tasks, boolean parallel, IntConsumer body) {
    if (parallel) {
      CpuAttention.parallelFor(tasks, body);
    } else {
      for (int i = 0; i < tasks; i++) {
        body.accept(i);
      }
    }
  }

  /** Pieces of a bulk copy in or out of an NDArray: a few per kernel thread. */
  private static final int COPY_TASKS = 4 * Runtime.getRuntime().availableProcessors();

  /** Arrays smaller than this (1 MiB) copy on the calling thread: a hand-off would cost more. */
  private static final int COPY_MIN_FLOATS = 1 << 18;

  /** The memory of a new contiguous CPU float32 array, writable in place. */
  private static FloatBuffer directFloats(NDArray a) {
    ByteBuffer b = a.toByteBuffer(true);
    if (!b.isDirect()) {
      throw new IllegalStateException("expected a direct view of a new CPU array's memory, got a copy");
    }
    return b.order(ByteOrder.nativeOrder()).asFloatBuffer();
  }

  private LibtorchSdpa sdpa() {
    if (sdpaUnavailable) {
      return null;
    }
    LibtorchSdpa s = sdpa;
    if (s == null) {
      synchronized (sdpaLock) {
        s = sdpa;
        if (s == null && !sdpaUnavailable) {
          try {
            s = LibtorchSdpa.open();
            sdpa = s;
          } catch (RuntimeException e) {
            sdpaUnavailable = true;
            LOG.log(System.Logger.Level.WARNING, "libtorch fused attention unavailable, using the Java kernel: " + e);
          }
        }
      }
    }
    return s;
  }
}
