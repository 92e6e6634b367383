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
 * to renamed output), then in the same JVM runs {@link CpuAttention#forward} on exactly the same
 * visible (query chunk, key chunk) pairs from in-memory arrays (kernel-only time). Prints both and
 * the ratio job / kernel-only.
 */
final class OverheadBench {
  private OverheadBench() {}

  static int run(String[] argv, PrintStream out) throws Exception {
    Args a = Args.parse(argv, List.of("--tokens", "--heads", "--kv-heads", "--dim", "--chunk-len", "--dir"),
        List.of());
    if (a.help) {
      out.println("usage: longctx spark-bench [--tokens 65536] [--heads 8] [--kv-heads 2] [--dim 64] [--chunk-len 8192]"
          + " [--dir DIR] [--master URL] [--conf k=v]");
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
    Path dir = a.get("--dir") != null ? Path.of(a.get("--dir")) : Files.createTempDirectory("longctx-bench-");
    boolean owned = SparkSession.getDefaultSession().isEmpty();
    SparkSession spark = Sessions.create("longctx spark-bench", a.get("--master"), a.confs);
    try {
      g.write(spark, dir.toString(), true);
      ScoreOptions o = new ScoreOptions();
      o.mode = ScoreOptions.Mode.PREFILL;
      o.keys = dir.resolve(g.keysName()).toString();
      o.output = dir.resolve("prefill-out.parquet").toString();
      o.overwrite = true;
      o.heads = g.heads;
      o.chunkLen = chunkLen;
      ScoreJob.Summary s = ScoreJob.run(spark, o);
      System.err.print(s);

      // Kernel only: the same pairs (i, j <= i) on the same data, sequentially per pair as tasks
      // would run them, each forward using the whole fork-join pool.
      int n = (int) g.tokens, d = g.dim, chunks = (n + chunkLen - 1) / chunkLen;
      float[][] q = new float[chunks][], k = new float[chunks][], v = new float[chunks][];
      long[][] pos = new long[chunks][];
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
      AttentionOptions causal = AttentionOptions.DEFAULT.withCausal(true);
      long pairs = 0;
      long t0 = System.nanoTime();
      for (int i = 0; i < chunks; i++) {
        for (int j = 0; j <= i; j++) {
          CpuAttention.DEFAULT.forward(new Tensor(q[i], 1, g.heads, pos[i].length, d),
              new Tensor(k[j], 1, g.kvHeads, pos[j].length, d), new Tensor(v[j], 1, g.kvHeads, pos[j].length, d),
              pos[i], pos[j], causal);
          pairs++;
        }
      }
      double kernel = (System.nanoTime() - t0) / 1e9;
      double flops = 4.0 * g.heads * (double) n * n * d / 2;
      out.printf(Locale.ROOT, "spark-bench: prefill of %d tokens, heads %d, kv heads %d, dim %d, chunk-len %d%n", n,
          g.heads, g.kvHeads, d, chunkLen);
      out.printf(Locale.ROOT, "  job wall time      %.2f s (%d pairs computed, %d skipped)%n", s.wallSeconds(),
          s.pairsComputed(), s.pairsSkipped());
      out.printf(Locale.ROOT, "  kernel-only time   %.2f s (%d pairs, %.1f GFLOP/s causal)%n", kernel, pairs,
          flops / kernel / 1e9);
      out.printf(Locale.ROOT, "  Spark overhead     %.2fx (job / kernel-only)%n", s.wallSeconds() / kernel);
      return 0;
    } finally {
      if (owned) {
        spark.stop();
      }
    }
  }
}
