package io.longctx.spark;

import static org.apache.spark.sql.functions.col;
import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.longctx.kernels.AttentionOptions;
import io.longctx.kernels.ReferenceAttention;
import io.longctx.kernels.Seeds;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.Map;
import org.apache.spark.sql.SparkSession;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * local[2] end to end against the float64 reference: GQA, causal, sliding window, queries without
 * pos and queries that see no key; bit-identical output under different --partitions; <= 1e-6
 * relative change under different --chunk-len; prefill.
 */
class EndToEndTest {
  static final double O_TOL = 1e-5, LSE_TOL = 1e-5;

  @TempDir
  Path tmp;

  final SparkSession spark = TestSpark.get();

  static TestData corpus(long seed) {
    // GQA 6 heads over 2 kv heads, awkward dim 40; documents of 1, 339 and 799 keys, one with gaps
    // and an offset start (so a query before it sees nothing under a causal mask).
    return new TestData(seed, 6, 2, 40).doc("solo", 1, 5, 1).doc("short", 339, 20, 1).doc("gappy", 799, 1000, 3)
        .randomQueries(5);
  }

  ScoreOptions options(Path keys, Path queries, String out) {
    ScoreOptions o = new ScoreOptions();
    o.keys = keys.toString();
    o.queries = queries == null ? null : queries.toString();
    o.output = tmp.resolve(out).toString();
    o.dim = 40;
    o.chunkLen = 64;
    o.queryBlock = 4;
    return o;
  }

  void checkAgainstReference(TestData data, Map<String, Outputs.Result> got, AttentionOptions attn, long seed) {
    assertEquals(data.queries.size(), got.size(), "one output row per query (seed " + seed + ")");
    int empty = 0;
    for (TestData.Query q : data.queries) {
      Outputs.Result r = got.get(q.id());
      ReferenceAttention.Result ref = data.reference(q.doc(), q.q(), q.pos(), attn);
      double[] err = Demo.errors(r.o(), r.lse(), ref.o(), ref.lse());
      String what = "query " + q.id() + " doc " + q.doc() + " pos " + q.pos() + " " + attn + " (seed " + seed + ")";
      assertTrue(err[0] <= O_TOL, "o rel err " + err[0] + " for " + what);
      assertTrue(err[1] <= LSE_TOL, "lse err " + err[1] + " for " + what);
      assertEquals(data.visibleCount(q.doc(), q.pos(), attn), r.nKeys(), "n_keys for " + what);
      if (r.lse()[0] == Float.NEGATIVE_INFINITY) {
        empty++;
        for (float x : r.o()) {
          assertEquals(0f, x, "o of a query that saw no key must be 0: " + what);
        }
      }
    }
    if (attn.masked()) {
      assertTrue(empty >= 3, "expected queries that see no key (seed " + seed + ")");
    }
  }

  @Test
  void decodeMatchesReferenceUnmaskedCausalAndWindow() throws Exception {
    long seed = Seeds.forTest();
    TestData data = corpus(seed);
    Path keys = data.writeKeys(spark, tmp, "parquet", false);
    Path queries = data.writeQueries(spark, tmp, "parquet");
    int run = 0;
    for (AttentionOptions attn : new AttentionOptions[] {AttentionOptions.DEFAULT,
        AttentionOptions.DEFAULT.withCausal(true), AttentionOptions.DEFAULT.withCausal(true).withWindow(50),
        AttentionOptions.DEFAULT.withWindow(7).withSoftcap(5f).withScale(0.3)}) {
      ScoreOptions o = options(keys, queries, "out" + run++);
      o.causal = attn.causal();
      o.window = attn.window();
      o.softcap = attn.softcap();
      o.scale = attn.scale();
      ScoreJob.Summary s = ScoreJob.run(spark, o);
      assertEquals(3, s.documents());
      assertEquals(1 + 339 + 799, s.tokens());
      assertEquals(1 + 6 + 39, s.chunks(), "chunks by position: 1 + 6 (pos 20..358) + 39 (pos 1000..3394)");
      if (attn.masked()) {
        assertTrue(s.pairsSkipped() > 0, "masked runs skip invisible pairs: " + s);
      }
      checkAgainstReference(data, Outputs.read(spark, Path.of(o.output), "parquet", false), attn, seed);
    }
  }

  @Test
  void prefillJsonMatchesReference() throws Exception {
    long seed = Seeds.forTest();
    TestData data = new TestData(seed, 4, 1, 32).doc("a", 200, 0, 1).doc("b", 77, 10, 2);
    Path keys = data.writeKeys(spark, tmp, "json", true);
    ScoreOptions o = options(keys, null, "prefill.jsonl");
    o.mode = ScoreOptions.Mode.PREFILL;
    o.dim = 0;
    o.heads = 4; // kv-heads and dim inferred from the array lengths
    o.window = 40;
    o.chunkLen = 32;
    ScoreJob.Summary s = ScoreJob.run(spark, o);
    assertEquals("json", o.resolvedFormat());
    assertEquals(277, s.queries());
    Map<String, Outputs.Result> got = Outputs.read(spark, Path.of(o.output), "json", true);
    assertEquals(277, got.size());
    checkPrefillAgainstReference(data, got, AttentionOptions.DEFAULT.withCausal(true).withWindow(40), seed);
  }

  /** Every prefill token's state against the float64 reference, and its key count. */
  void checkPrefillAgainstReference(TestData data, Map<String, Outputs.Result> got, AttentionOptions attn, long seed) {
    for (Map.Entry<String, java.util.List<TestData.Key>> e : data.docs.entrySet()) {
      for (TestData.Key k : e.getValue()) {
        Outputs.Result r = got.get(e.getKey() + "@" + k.pos());
        ReferenceAttention.Result ref = data.reference(e.getKey(), k.q(), k.pos(), attn);
        double[] err = Demo.errors(r.o(), r.lse(), ref.o(), ref.lse());
        String what = "token " + e.getKey() + "@" + k.pos() + " (seed " + seed + ")";
        assertTrue(err[0] <= O_TOL && err[1] <= LSE_TOL, "errors " + err[0] + ", " + err[1] + " for " + what);
        assertEquals(data.visibleCount(e.getKey(), k.pos(), attn), r.nKeys(), what);
      }
    }
  }

  @Test
  void prefillPartitionsDoNotChangeABitAndChunkLenOnlyRounding() throws Exception {
    // Prefill merges a query block's partial states inside its task (chunks arriving in order); the bits
    // must still not depend on partitioning, and a block sees 1 to 7 chunks here (odd counts included),
    // computed in pairs of blocks (PairPlan.forPrefill).
    long seed = Seeds.forTest();
    TestData data = new TestData(seed, 6, 2, 24).doc("a", 211, 0, 1).doc("b", 90, 5, 3);
    Path keys = data.writeKeys(spark, tmp, "parquet", true);
    Map<String, Outputs.Result> base = null;
    for (int[] run : new int[][] {{32, 1}, {32, 5}, {32, 16}, {45, 3}}) {
      ScoreOptions o = options(keys, null, "pf" + run[0] + "-" + run[1]);
      o.mode = ScoreOptions.Mode.PREFILL;
      o.dim = 24;
      o.chunkLen = run[0];
      o.partitions = run[1];
      int files = runUncoalesced(o);
      // 16 blocks in 9 groups at chunk-len 32 over 1, 5 and 9 reduce tasks: the partitioning really differs
      assertTrue(run[0] == 32 ? files == Math.min(9, run[1]) : files > 1, files + " part files with --partitions "
          + run[1]);
      Map<String, Outputs.Result> got = Outputs.read(spark, Path.of(o.output), "parquet", true);
      assertEquals(301, got.size());
      if (base == null) { // and right: the blocks run in pairs ((0, 6), (1, 5), (2, 4) of "a"), each its own state
        checkPrefillAgainstReference(data, got, AttentionOptions.DEFAULT.withCausal(true), seed);
        base = got;
        continue;
      }
      for (Map.Entry<String, Outputs.Result> e : base.entrySet()) {
        Outputs.Result a = e.getValue(), b = got.get(e.getKey());
        String what = e.getKey() + " at chunk-len " + run[0] + ", partitions " + run[1] + " (seed " + seed + ")";
        assertEquals(a.nKeys(), b.nKeys(), what);
        if (run[0] == 32) {
          assertArrayEquals(bits(a.o()), bits(b.o()), "o bits of " + what);
          assertArrayEquals(bits(a.lse()), bits(b.lse()), "lse bits of " + what);
        } else {
          double num = 0, den = 0;
          for (int i = 0; i < a.o().length; i++) {
            num += Math.pow(a.o()[i] - b.o()[i], 2);
            den += Math.pow(a.o()[i], 2);
          }
          assertTrue(den == 0 ? num == 0 : Math.sqrt(num / den) <= 1e-6, "o of " + what + " changed by "
              + Math.sqrt(num / den));
          for (int h = 0; h < a.lse().length; h++) {
            assertTrue(Math.abs(a.lse()[h] - b.lse()[h]) <= 1e-6 * Math.max(1, Math.abs(a.lse()[h])), "lse of " + what);
          }
        }
      }
    }
    // --partitions sets the pair stage's task count, also where adaptive execution has an initial number
    String initial = "spark.sql.adaptive.coalescePartitions.initialPartitionNum";
    spark.conf().set(initial, "7");
    try {
      ScoreOptions o = options(keys, null, "pf-initial");
      o.mode = ScoreOptions.Mode.PREFILL;
      o.dim = 24;
      o.chunkLen = 32;
      o.partitions = 2;
      ScoreJob.run(spark, o);
      try (var parts = Files.list(Path.of(o.output))) {
        assertEquals(2, parts.filter(p -> p.getFileName().toString().startsWith("part-")).count());
      }
    } finally {
      spark.conf().unset(initial);
    }
  }

  @Test
  void partitionsDoNotChangeABitAndChunkLenOnlyRounding() throws Exception {
    long seed = Seeds.forTest();
    TestData data = corpus(seed);
    Path keys = data.writeKeys(spark, tmp, "parquet", false);
    Path queries = data.writeQueries(spark, tmp, "parquet");
    Map<String, Outputs.Result> base = null;
    int[] files = new int[2];
    for (int parts : new int[] {1, 7}) {
      ScoreOptions o = options(keys, queries, "p" + parts);
      o.causal = true;
      o.partitions = parts;
      files[parts == 1 ? 0 : 1] = runUncoalesced(o);
      Map<String, Outputs.Result> got = Outputs.read(spark, Path.of(o.output), "parquet", false);
      if (base == null) {
        base = got;
        continue;
      }
      assertSameBits(base, got, " (seed " + seed + ")");
    }
    // 1 merge task (and the blocks that see no chunk) vs 7: the runs above really were cut differently.
    assertTrue(files[0] <= 2 && files[1] >= 3, "part files with --partitions 1 and 7: " + files[0] + ", " + files[1]);
    for (int chunkLen : new int[] {37, 1000}) {
      ScoreOptions o = options(keys, queries, "c" + chunkLen);
      o.causal = true;
      o.chunkLen = chunkLen;
      ScoreJob.run(spark, o);
      Map<String, Outputs.Result> got = Outputs.read(spark, Path.of(o.output), "parquet", false);
      for (Map.Entry<String, Outputs.Result> e : base.entrySet()) {
        Outputs.Result a = e.getValue(), b = got.get(e.getKey());
        assertEquals(a.nKeys(), b.nKeys());
        double num = 0, den = 0;
        for (int i = 0; i < a.o().length; i++) {
          num += Math.pow(a.o()[i] - b.o()[i], 2);
          den += Math.pow(a.o()[i], 2);
        }
        assertTrue(den == 0 ? num == 0 : Math.sqrt(num / den) <= 1e-6,
            "o of " + e.getKey() + " changed by " + Math.sqrt(num / den) + " at chunk-len " + chunkLen + " (seed " + seed + ")");
        for (int h = 0; h < a.lse().length; h++) {
          float x = a.lse()[h], y = b.lse()[h];
          assertTrue(x == y || Math.abs(x - y) <= 1e-6 * Math.max(1, Math.abs(x)),
              "lse of " + e.getKey() + ": " + x + " vs " + y + " at chunk-len " + chunkLen + " (seed " + seed + ")");
        }
      }
    }
  }

  /**
   * Across chunk lengths the output changes only by float32 rounding, and that rounding grows with
   * the size of the logits: a partial state's lse is a float32 near the largest logit, so it holds
   * |lse| * 2^-24 of absolute error, which becomes relative error of the merge weights. The bound
   * checked, per query: relative L2 change of o <= 4 * 2^-24 * max(1, |lse|), and of lse <= 4 ulp of
   * max(1, |lse|). Logits here reach about 40 (scale 2 on dim 40).
   */
  @Test
  void chunkLenChangesOnlyRoundingRelativeToTheLogits() throws Exception {
    long seed = Seeds.forTest();
    TestData data = corpus(seed);
    Path keys = data.writeKeys(spark, tmp, "parquet", false);
    Path queries = data.writeQueries(spark, tmp, "parquet");
    Map<String, Outputs.Result> base = null;
    double worst = 0, maxLse = 0;
    for (int chunkLen : new int[] {64, 37, 1000}) {
      ScoreOptions o = options(keys, queries, "large-" + chunkLen);
      o.causal = true;
      o.scale = 2.0;
      o.chunkLen = chunkLen;
      ScoreJob.run(spark, o);
      Map<String, Outputs.Result> got = Outputs.read(spark, Path.of(o.output), "parquet", false);
      if (base == null) {
        base = got;
        continue;
      }
      for (Map.Entry<String, Outputs.Result> e : base.entrySet()) {
        Outputs.Result a = e.getValue(), b = got.get(e.getKey());
        double size = 1;
        for (float l : a.lse()) {
          size = Float.isFinite(l) ? Math.max(size, Math.abs(l)) : size;
        }
        maxLse = Math.max(maxLse, size);
        double unit = Math.scalb(1.0, -24) * size;
        double change = relL2(a.o(), b.o());
        worst = Math.max(worst, change / unit);
        String what = e.getKey() + " at chunk-len " + chunkLen + ", |lse| up to " + size + " (seed " + seed + ")";
        assertTrue(change <= 4 * unit, "o of " + what + " changed by " + change + ", bound " + 4 * unit);
        for (int h = 0; h < a.lse().length; h++) {
          assertTrue(a.lse()[h] == b.lse()[h] || Math.abs(a.lse()[h] - b.lse()[h]) <= 4 * Math.ulp((float) size),
              "lse of " + what + ": " + a.lse()[h] + " vs " + b.lse()[h]);
        }
      }
    }
    assertTrue(maxLse > 30, "the corpus reaches large logits: |lse| up to " + maxLse);
    System.out.printf("chunk-len rounding at |lse| up to %.1f: worst o change %.2f x 2^-24 x |lse|%n", maxLse, worst);
  }

  static double relL2(float[] a, float[] b) {
    double num = 0, den = 0;
    for (int i = 0; i < a.length; i++) {
      num += Math.pow((double) a[i] - b[i], 2);
      den += Math.pow(a[i], 2);
    }
    return den == 0 ? (num == 0 ? 0 : Double.POSITIVE_INFINITY) : Math.sqrt(num / den);
  }

  @Test
  void commandLineWritesOutputAndRefusesToOverwrite() throws Exception {
    TestData data = new TestData(7, 2, 2, 16).doc("d", 50, 3, 1).randomQueries(2);
    Path keys = data.writeKeys(spark, tmp, "json", false);
    Path queries = data.writeQueries(spark, tmp, "json");
    Path out = tmp.resolve("cli-out");
    String[] args = {"score", "--keys", keys.toString(), "--queries", queries.toString(), "--output", out.toString(),
        "--kv-heads", "2", "--causal", "--chunk-len", "16"};
    java.io.ByteArrayOutputStream err = new java.io.ByteArrayOutputStream();
    assertEquals(0, LongctxMain.run(args, System.out, new java.io.PrintStream(err, true)), err.toString());
    assertTrue(err.toString().contains("chunk pairs"), err.toString());
    assertTrue(Files.isDirectory(out));
    assertEquals(4, Outputs.read(spark, out, "json", false).size());
    err.reset();
    assertEquals(2, LongctxMain.run(args, System.out, new java.io.PrintStream(err, true)));
    assertTrue(err.toString().contains("exists"), err.toString());
    String[] again = java.util.Arrays.copyOf(args, args.length + 1);
    again[args.length] = "--overwrite";
    assertEquals(0, LongctxMain.run(again, System.out, System.err));
    try (var s = Files.list(tmp)) {
      assertTrue(s.noneMatch(p -> p.getFileName().toString().contains("-tmp-")), "no temp output left behind");
    }
  }

  /** Each input's format comes from its own name: Parquet KEYS beside JSON Lines QUERIES, OUT as KEYS. */
  @Test
  void parquetKeysWithJsonQueriesGiveTheSameResults() throws Exception {
    TestData data = new TestData(11, 2, 2, 16).doc("d", 40, 3, 1).randomQueries(2);
    Path mixed = Files.createDirectory(tmp.resolve("mixed"));
    Path jsonOnly = Files.createDirectory(tmp.resolve("json-only"));
    Path pq = data.writeKeys(spark, mixed, "parquet", false);
    Path jq = data.writeQueries(spark, mixed, "json");
    Path jk = data.writeKeys(spark, jsonOnly, "json", false);
    scoreOk(pq, jq, mixed.resolve("out"), "--causal", "--chunk-len", "16");
    scoreOk(jk, jq, jsonOnly.resolve("out"), "--causal", "--chunk-len", "16");
    // --format names one format for both: JSON Lines QUERIES read as Parquet is exit 2, and says why
    java.io.ByteArrayOutputStream err = new java.io.ByteArrayOutputStream();
    String[] forced = {"score", "--keys", pq.toString(), "--queries", jq.toString(), "--output",
        mixed.resolve("forced").toString(), "--kv-heads", "2", "--format", "parquet"};
    assertEquals(2, LongctxMain.run(forced, System.out, new java.io.PrintStream(err, true)), err.toString());
    assertTrue(err.toString().contains("QUERIES " + jq) && err.toString().contains("applies to every input"),
        err.toString());
    Map<String, Outputs.Result> a = Outputs.read(spark, mixed.resolve("out"), "parquet", false);
    assertEquals(4, a.size());
    assertSameBits(Outputs.read(spark, jsonOnly.resolve("out"), "json", false), a, " (mixed formats vs JSON)");
  }

  /** Parquet inputs with integer ids and pos and double vectors read as strings, long and float32 (README). */
  @Test
  void integerIdsAndDoubleVectorsAreRead() throws Exception {
    TestData data = new TestData(13, 2, 2, 16).doc("7", 30, 3, 1).randomQueries(2);
    Path typed = Files.createDirectory(tmp.resolve("typed"));
    Path wide = Files.createDirectory(tmp.resolve("wide"));
    Path k = data.writeKeys(spark, typed, "parquet", false);
    Path q = data.writeQueries(spark, typed, "parquet");
    Path kw = wide.resolve("keys.parquet");
    Path qw = wide.resolve("queries.parquet");
    spark.read().parquet(k.toString()).select(col("doc_id").cast("int").as("doc_id"), col("pos").cast("int").as("pos"),
        col("k").cast("array<double>").as("k"), col("v").cast("array<double>").as("v")).write().parquet(kw.toString());
    spark.read().parquet(q.toString()).withColumn("doc_id", col("doc_id").cast("long"))
        .withColumn("q", col("q").cast("array<double>")).write().parquet(qw.toString());
    scoreOk(k, q, typed.resolve("out"), "--chunk-len", "8");
    scoreOk(kw, qw, wide.resolve("out"), "--chunk-len", "8");
    Map<String, Outputs.Result> a = Outputs.read(spark, typed.resolve("out"), "parquet", false);
    assertEquals(4, a.size());
    assertEquals(List.of("7"), spark.read().parquet(wide.resolve("out").toString()).select("doc_id").distinct()
        .as(org.apache.spark.sql.Encoders.STRING()).collectAsList());
    // float -> double -> float is exact: the same bits
    assertSameBits(a, Outputs.read(spark, wide.resolve("out"), "parquet", false), " (integer ids, double vectors)");
  }

  /**
   * Runs the job with Spark's partition coalescing off, so --partitions N really means N reduce tasks
   * (with it on, 1 and 7 would most likely run as one); returns the number of part files written.
   */
  int runUncoalesced(ScoreOptions o) throws java.io.IOException {
    String key = "spark.sql.adaptive.coalescePartitions.enabled";
    String was = spark.conf().get(key);
    spark.conf().set(key, "false");
    try {
      ScoreJob.run(spark, o);
    } finally {
      spark.conf().set(key, was);
    }
    try (var s = Files.list(Path.of(o.output))) {
      return (int) s.filter(p -> p.getFileName().toString().startsWith("part-")).count();
    }
  }

  /** score on the command line, exit 0 expected: KEYS, QUERIES, OUT, 2 kv heads and EXTRA options. */
  void scoreOk(Path keys, Path queries, Path out, String... extra) {
    List<String> args = new java.util.ArrayList<>(List.of("score", "--keys", keys.toString(), "--queries",
        queries.toString(), "--output", out.toString(), "--kv-heads", "2"));
    args.addAll(List.of(extra));
    java.io.ByteArrayOutputStream err = new java.io.ByteArrayOutputStream();
    assertEquals(0, LongctxMain.run(args.toArray(new String[0]), System.out, new java.io.PrintStream(err, true)),
        err.toString());
  }

  /** Every row of WANT in GOT (the same rows), o and lse bit for bit; WHAT ends the messages. */
  static void assertSameBits(Map<String, Outputs.Result> want, Map<String, Outputs.Result> got, String what) {
    assertEquals(want.keySet(), got.keySet(), "rows" + what);
    for (Map.Entry<String, Outputs.Result> e : want.entrySet()) {
      Outputs.Result g = got.get(e.getKey());
      assertArrayEquals(bits(e.getValue().o()), bits(g.o()), "o bits of " + e.getKey() + what);
      assertArrayEquals(bits(e.getValue().lse()), bits(g.lse()), "lse bits of " + e.getKey() + what);
    }
  }

  static int[] bits(float[] x) {
    int[] b = new int[x.length];
    for (int i = 0; i < x.length; i++) {
      b[i] = Float.floatToRawIntBits(x[i]);
    }
    return b;
  }
}
