package io.longctx.spark;

import io.longctx.kernels.AttentionOptions;
import io.longctx.kernels.CpuAttention;
import io.longctx.kernels.Tensor;
import java.io.PrintStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.Locale;
import org.apache.spark.sql.SparkSession;

/**
 * {@code longctx spark-bench}: Spark overhead of a prefill. Generates one document of --tokens
 * tokens (Parquet, not timed), runs {@code score --mode prefill} (timed: the job's wall time, reading
 * to renamed output), and in the same JVM, before and after the job, runs {@link CpuAttention#forward}
 * on exactly the same visible (query chunk, key chunk) pairs from in-memory arrays (kernel-only
 * time, the mean of the two, after a few untimed pairs have compiled the kernel). The job runs
 * --runs times (cold, then warm). Prints the times, the ratios job / kernel-only in wall and CPU
 * time, and the load average.
 */
final class OverheadBench {
  private OverheadBench() {}

  static int run(String[] argv, PrintStream out) throws Exception {
    Args a = Args.parse(argv, List.of("--tokens", "--heads", "--kv-heads", "--dim", "--chunk-len", "--dir", "--runs"),
        List.of());
    if (a.help) {
      out.println("usage: longctx spark-bench [--tokens 65536] [--heads 8] [--kv-heads 2] [--dim 64] [--chunk-len 8192]"
          + " [--runs 2] [--dir DIR] [--master URL] [--conf k=v]");
      out.println("  --dir DIR: where the generated document and the job's output go: a new or empty directory, or"
          + " one an earlier spark-bench wrote (default: a temporary folder, deleted at the end).");
      out.println("  Runs the job --runs times in one JVM: the first (\"cold\") run is the JVM's first score job,"
          + " paying the JIT's compiles of Spark's and our job code, but after the generator's write job and with"
          + " the kernel already compiled (it ran before, as the kernel-only pass); later runs show a warm,"
          + " long-lived cluster. A fresh `score` process also compiles the kernel: it is colder than \"cold\".");
      return 0;
    }
    Generator g = new Generator();
    g.docs = 1;
    g.tokens = a.longValue("--tokens", 65536);
    g.heads = a.intValue("--heads", 8);
    g.kvHeads = a.intValue("--kv-heads", 2);
    g.dim = a.intValue("--dim", 64);
    g.queriesPerDoc = 0;
    g.prefill = true;
    int chunkLen = a.intValue("--chunk-len", 8192);
    int runs = a.intValue("--runs", 2);
    if (chunkLen < 1 || runs < 1) {
      throw new IllegalArgumentException("--chunk-len and --runs must be >= 1, got " + chunkLen + " and " + runs);
    }
    g.check();
    // The kernel-only pass holds the whole document in arrays: refused before anything is written (a huge
    // --tokens wrote tens of GB of corpus first, and a count past int wrapped in the pass).
    double bytes = 4.0 * g.tokens * ((double) g.heads * g.dim + 2.0 * g.kvHeads * g.dim);
    long heap = Runtime.getRuntime().maxMemory();
    if (g.tokens > Integer.MAX_VALUE || bytes > heap / 2.0) {
      throw new IllegalArgumentException(String.format(Locale.ROOT, "--tokens %d: the kernel-only pass holds the "
          + "document in memory, %.1f GiB, more than half this JVM's heap of %.1f GiB (LONGCTX_JAVA_OPTS=-Xmx... "
          + "sets it)", g.tokens, bytes / (1L << 30), heap / (double) (1L << 30)));
    }
    if ((long) Math.max(g.heads, g.kvHeads) * Math.min(chunkLen, g.tokens) * g.dim > Integer.MAX_VALUE - 8) {
      throw new IllegalArgumentException("--chunk-len " + chunkLen + ": a chunk of heads x chunk-len x dim floats "
          + "must fit one Java array (2^31 - 9 elements)");
    }
    // Without --dir the generated document and the job's output (a few hundred MB) go to a temporary
    // folder made here and deleted at the end; a --dir of the caller's is left as it is.
    boolean ownDir = a.get("--dir") == null;
    Path dir = ownDir ? Files.createTempDirectory("longctx-bench-") : Path.of(a.get("--dir"));
    if (!ownDir) {
      OutputCommit.claimWorkDir(dir, "spark-bench", false);
    }
    // Deleted at the end, also when the run is interrupted (a few hundred MB).
    try (io.longctx.djl.MadeFolders.Temporary ignored = ownDir ? new io.longctx.djl.MadeFolders.Temporary(dir, false)
        : null) {
      return measure(a, g, chunkLen, runs, dir, out);
    }
  }

  private static int measure(Args a, Generator g, int chunkLen, int runs, Path dir, PrintStream out) throws Exception {
    return Sessions.run("longctx spark-bench", a.get("--master"), a.confs, spark -> {
      if (a.get("--dir") != null) {
        OutputCommit.claimWorkDir(dir, "spark-bench", true);
      }
      g.write(spark, dir.toString(), true);
      ScoreOptions o = new ScoreOptions();
      o.mode = ScoreOptions.Mode.PREFILL;
      o.keys = dir.resolve(g.keysName()).toString();
      o.output = dir.resolve("prefill-out.parquet").toString();
      o.overwrite = true;
      o.heads = g.heads;
      o.chunkLen = chunkLen;

      // Kernel-only time is taken before and after the job and averaged: the machine's speed drifts
      // (other work, thermal), and one side-by-side pass would charge the drift to one side.
      Pairs pairs = new Pairs(g, chunkLen);
      // The first pass of a JVM also compiled the kernel (and ran it below C2 until then): its pairs
      // took 0.4-5.7 s longer than the pass after the jobs, which biased kernel-only time up and the
      // ratios down. A few untimed diagonal pairs warm it first.
      pairs.warmUp(3);
      double load0 = loadAverage();
      double cpu0 = cpuSeconds();
      double before = pairs.run();
      double cpu1 = cpuSeconds();
      double[] wall = new double[runs], cpu = new double[runs], jit = new double[runs], gc = new double[runs];
      ScoreJob.Summary s = null;
      List<StageTimes> stages = new java.util.ArrayList<>();
      for (int r = 0; r < runs; r++) {
        StageTimes st = new StageTimes();
        stages.add(st);
        spark.sparkContext().addSparkListener(st);
        double c = cpuSeconds(), j = jitSeconds(), p = gcPauseSeconds();
        s = ScoreJob.run(spark, o);
        cpu[r] = cpuSeconds() - c;
        jit[r] = jitSeconds() - j;
        gc[r] = gcPauseSeconds() - p;
        wall[r] = s.wallSeconds();
        spark.sparkContext().listenerBus().waitUntilEmpty();
        spark.sparkContext().removeSparkListener(st);
        System.err.print(s);
      }
      double cpu2 = cpuSeconds();
      double after = pairs.run();
      double cpu3 = cpuSeconds();
      double load1 = loadAverage();
      double kernel = (before + after) / 2;
      double kernelCpu = (cpu1 - cpu0 + cpu3 - cpu2) / 2;

      int n = (int) g.tokens, d = g.dim;
      double flops = 4.0 * g.heads * (double) n * n * d / 2;
      out.printf(Locale.ROOT, "spark-bench: prefill of %d tokens, heads %d, kv heads %d, dim %d, chunk-len %d%n", n,
          g.heads, g.kvHeads, d, chunkLen);
      out.printf(Locale.ROOT, "  kernel-only time   %.2f s (before the jobs %.2f s, after %.2f s; %d pairs, %.1f GFLOP/s"
          + " causal), %.1f CPU s%n", kernel, before, after, pairs.count, flops / kernel / 1e9, kernelCpu);
      for (int r = 0; r < runs; r++) {
        out.printf(Locale.ROOT, "  job run %d (%s)%s wall %.2f s, overhead %.2fx; CPU %.1f s, %.2fx (JIT compiler"
            + " threads %.1f s, GC pauses %.1f s)%n", r + 1,
            r == 0 ? "cold" : "warm", " ".repeat(Math.max(0, 3 - String.valueOf(r + 1).length())), wall[r],
            wall[r] / kernel, cpu[r], cpu[r] / kernelCpu, jit[r], gc[r]);
      }
      out.printf(Locale.ROOT, "  (%d pairs computed, %d skipped; overhead = job / kernel-only. CPU is this JVM's CPU"
          + " seconds, JIT and GC included, and hardly moved by other processes)%n", s.pairsComputed(), s.pairsSkipped());
      for (int r = 0; r < runs; r++) {
        out.printf(Locale.ROOT, "  stages of run %d (task threads only: the kernel runs on its own pool, so a stage's"
            + " task CPU is Spark's work around it):%n", r + 1);
        stages.get(r).print(out);
      }
      out.printf(Locale.ROOT, "  load average       %.2f at the start, %.2f at the end (%d cores; above that, other"
          + " processes shared the machine)%n", load0, load1,
          Runtime.getRuntime().availableProcessors());
      out.printf(Locale.ROOT, "  data               %s%s%n", dir, a.get("--dir") == null ? " (made for this run, deleted"
          + " at its end)" : "");
      return 0;
    });
  }

  /** Per stage of a job: its wall span, tasks, task wall and CPU time, shuffle bytes (Spark's task metrics). */
  private static final class StageTimes extends org.apache.spark.scheduler.SparkListener {
    private final java.util.Map<Integer, String> names = new java.util.concurrent.ConcurrentHashMap<>();
    private final java.util.Map<Integer, Double> spans = new java.util.concurrent.ConcurrentHashMap<>();
    private final java.util.Map<Integer, double[]> sums = new java.util.concurrent.ConcurrentSkipListMap<>();

    @Override
    public void onStageCompleted(org.apache.spark.scheduler.SparkListenerStageCompleted e) {
      names.put(e.stageInfo().stageId(), e.stageInfo().name());
      if (e.stageInfo().submissionTime().isDefined() && e.stageInfo().completionTime().isDefined()) {
        spans.put(e.stageInfo().stageId(),
            ((Long) e.stageInfo().completionTime().get() - (Long) e.stageInfo().submissionTime().get()) / 1e3);
      }
    }

    @Override
    public void onTaskEnd(org.apache.spark.scheduler.SparkListenerTaskEnd e) {
      org.apache.spark.executor.TaskMetrics m = e.taskMetrics();
      if (m == null) {
        return;
      }
      double[] x = sums.computeIfAbsent(e.stageId(), k -> new double[5]);
      synchronized (x) {
        x[0]++;
        x[1] += m.executorRunTime() / 1e3;
        x[2] += m.executorCpuTime() / 1e9;
        x[3] += m.shuffleReadMetrics().totalBytesRead() / 1048576.0;
        x[4] += m.shuffleWriteMetrics().bytesWritten() / 1048576.0;
      }
    }

    void print(PrintStream out) {
      double[] all = new double[2];
      sums.values().forEach(x -> {
        all[0] += x[1];
        all[1] += x[2];
      });
      out.printf(Locale.ROOT, "    %-6s %6s %7s %10s %9s %12s %13s  %s%n", "stage", "tasks", "wall", "task wall",
          "task CPU", "shuffle read", "shuffle write", "operation");
      sums.forEach((id, x) -> out.printf(Locale.ROOT, "    %-6d %6d %6.1fs %9.1fs %8.1fs %10.0f MiB %11.0f MiB  %s%n", id,
          (long) x[0], spans.getOrDefault(id, Double.NaN), x[1], x[2], x[3], x[4], names.getOrDefault(id, "?")));
      out.printf(Locale.ROOT, "    %-6s %6s %7s %9.1fs %8.1fs%n", "all", "", "", all[0], all[1]);
    }
  }

  private static double cpuSeconds() {
    return ((com.sun.management.OperatingSystemMXBean) java.lang.management.ManagementFactory
        .getOperatingSystemMXBean()).getProcessCpuTime() / 1e9;
  }

  /** Time the JIT compiler threads spent compiling (JVM-wide; 0 where the JVM does not say). */
  private static double jitSeconds() {
    java.lang.management.CompilationMXBean c = java.lang.management.ManagementFactory.getCompilationMXBean();
    return c != null && c.isCompilationTimeMonitoringSupported() ? c.getTotalCompilationTime() / 1e3 : 0;
  }

  /** Wall time of stop-the-world collections (newer JVMs also list G1's concurrent cycles: left out). */
  private static double gcPauseSeconds() {
    long ms = 0;
    for (java.lang.management.GarbageCollectorMXBean b : java.lang.management.ManagementFactory
        .getGarbageCollectorMXBeans()) {
      if (!b.getName().contains("Concurrent")) {
        ms += Math.max(0, b.getCollectionTime());
      }
    }
    return ms / 1e3;
  }

  private static double loadAverage() {
    return java.lang.management.ManagementFactory.getOperatingSystemMXBean().getSystemLoadAverage();
  }

  /**
   * The job's visible (query chunk i, key chunk j <= i) pairs on in-memory arrays, run one after
   * another as tasks would run them, each forward using the whole fork-join pool.
   */
  private static final class Pairs {
    static final AttentionOptions CAUSAL = AttentionOptions.DEFAULT.withCausal(true);
    final Generator g;
    final float[][] q, k, v;
    final long[][] pos;
    final int chunks;
    long count;

    Pairs(Generator g, int chunkLen) {
      this.g = g;
      int n = (int) g.tokens, d = g.dim;
      chunks = (n + chunkLen - 1) / chunkLen;
      q = new float[chunks][];
      k = new float[chunks][];
      v = new float[chunks][];
      pos = new long[chunks][];
      for (int c = 0; c < chunks; c++) {
        int t0 = c * chunkLen, len = Math.min(chunkLen, n - t0);
        q[c] = new float[g.heads * len * d];
        k[c] = new float[g.kvHeads * len * d];
        v[c] = new float[k[c].length];
        pos[c] = new long[len];
        for (int t = 0; t < len; t++) {
          Token x = g.key(0, t0 + t);
          pos[c][t] = t0 + t;
          for (int h = 0; h < g.heads; h++) {
            System.arraycopy(x.getQ(), h * d, q[c], (h * len + t) * d, d);
          }
          for (int h = 0; h < g.kvHeads; h++) {
            System.arraycopy(x.getK(), h * d, k[c], (h * len + t) * d, d);
            System.arraycopy(x.getV(), h * d, v[c], (h * len + t) * d, d);
          }
        }
      }
    }

    /** Runs the first chunk's diagonal pair {@code times} times, untimed. */
    void warmUp(int times) {
      for (int r = 0; r < times; r++) {
        pair(0, 0);
      }
    }

    /** Seconds for all pairs. */
    double run() {
      count = 0;
      long t0 = System.nanoTime();
      for (int i = 0; i < chunks; i++) {
        for (int j = 0; j <= i; j++) {
          pair(i, j);
          count++;
        }
      }
      return (System.nanoTime() - t0) / 1e9;
    }

    /** Query chunk i over key chunk j, causal by position, as the job computes it. */
    private void pair(int i, int j) {
      int d = g.dim;
      CpuAttention.DEFAULT.forward(new Tensor(q[i], 1, g.heads, pos[i].length, d),
          new Tensor(k[j], 1, g.kvHeads, pos[j].length, d), new Tensor(v[j], 1, g.kvHeads, pos[j].length, d),
          pos[i], pos[j], CAUSAL);
    }
  }
}
