package io.longctx.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.longctx.djl.LlamaModel;
import io.longctx.djl.ModelGenerator;
import io.longctx.kernels.Seeds;
import java.io.ByteArrayOutputStream;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.SplittableRandom;
import java.util.stream.Stream;
import org.apache.spark.api.java.JavaPairRDD;
import org.apache.spark.api.java.JavaSparkContext;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.SparkSession;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;
import scala.Tuple2;

/**
 * Split {@code ppl} (one document's layers over many tasks) against the one-task path on a corpus
 * mixing short and long documents: bit for bit at the same chunk length (both run the same chunk
 * pieces of {@code LlamaModel}), within 1e-5 relative at other chunk lengths, and bit for bit
 * whatever the number of tasks or the placement of blocks in them.
 */
class SplitPplTest {

  @TempDir
  static Path shared;

  static Path causal, windowed, input;
  static long seed;
  final SparkSession spark = TestSpark.get();

  @TempDir
  Path tmp;

  @BeforeAll
  static void setUp() throws Exception {
    seed = Seeds.forTest();
    causal = shared.resolve("causal");
    windowed = shared.resolve("windowed");
    ModelGenerator.generate(causalSpec(), causal);
    ModelGenerator.generate(windowedSpec(), windowed);
    // Lengths around the chunk lengths used below (16, 7, 40): 1 and 2 tokens, a partial last chunk,
    // exact multiples, and documents over several windows.
    SplittableRandom r = new SplittableRandom(seed);
    List<String> lines = new ArrayList<>();
    int[] lengths = {1, 2, 17, 33, 64, 97, 150};
    for (int d = 0; d < lengths.length; d++) {
      StringBuilder t = new StringBuilder("[");
      for (int i = 0; i < lengths[d]; i++) {
        t.append(i == 0 ? "" : ",").append(r.nextInt(300));
      }
      lines.add("{\"doc_id\": \"d" + d + "\", \"tokens\": " + t + "]}");
    }
    lines.add("{\"doc_id\": \"text\", \"text\": \"Exact attention over the whole document, split or not.\"}");
    input = shared.resolve("docs.jsonl");
    Files.writeString(input, String.join("\n", lines) + "\n", StandardCharsets.UTF_8);
  }

  static ModelGenerator.Spec causalSpec() {
    return spec(seed, "llama", 0, 3);
  }

  static ModelGenerator.Spec windowedSpec() {
    return spec(seed + 1, "mistral", 23, 2);
  }

  static ModelGenerator.Spec spec(long seed, String type, long window, int layers) {
    ModelGenerator.Spec s = TestModels.small(seed, layers);
    s.modelType = type;
    s.slidingWindow = window;
    return s;
  }

  record Result(String log, Map<String, Row> rows) {}

  Result ppl(Path model, String... extra) throws Exception {
    Path out = tmp.resolve("out-" + System.nanoTime());
    List<String> args = new ArrayList<>(List.of("ppl", "--model", model.toString(), "--input", input.toString(),
        "--output", out.toString(), "--per-token"));
    args.addAll(List.of(extra));
    ByteArrayOutputStream err = new ByteArrayOutputStream();
    int rc = LongctxMain.run(args.toArray(new String[0]), System.out, new PrintStream(err, true));
    assertEquals(0, rc, err.toString());
    try (Stream<Path> s = Files.list(tmp)) {
      assertFalse(s.anyMatch(p -> p.getFileName().toString().contains("checkpoint")),
          "the checkpoints are deleted at the end");
    }
    Map<String, Row> rows = new HashMap<>();
    for (Row row : spark.read().json(out.toString()).collectAsList()) {
      rows.put(row.getAs("doc_id"), row);
    }
    assertEquals(8, rows.size(), err.toString());
    return new Result(err.toString(), rows);
  }

  static void assertSameBits(Result a, Result b, String what) {
    for (String d : a.rows().keySet()) {
      Row x = a.rows().get(d), y = b.rows().get(d);
      String m = what + ", doc " + d + " (seed " + seed + ")";
      assertEquals((double) x.getAs("sum_logprob"), (double) y.getAs("sum_logprob"), 0.0, m);
      assertEquals(x.getList(x.fieldIndex("logprobs")), y.getList(y.fieldIndex("logprobs")), m);
    }
  }

  static void assertClose(Result a, Result b, double rel, String what) {
    for (String d : a.rows().keySet()) {
      double x = a.rows().get(d).getAs("sum_logprob"), y = b.rows().get(d).getAs("sum_logprob");
      assertTrue(Math.abs(x - y) <= rel * Math.abs(x), what + ", doc " + d + ": " + x + " vs " + y + " (seed "
          + seed + ")");
    }
  }

  @Test
  void splitEqualsOneTaskBitForBitAndDoesNotDependOnTasks() throws Exception {
    for (Path model : List.of(causal, windowed)) {
      Result one = ppl(model, "--chunk-len", "16", "--split-above", "1000000");
      assertTrue(one.log().contains("split path     none"), one.log());
      Result split = ppl(model, "--chunk-len", "16", "--split-above", "0", "--split-partitions", "3");
      assertTrue(split.log().contains("7 documents split into"), split.log());
      assertTrue(split.log().contains("layer 1/"), "progress per layer:\n" + split.log());
      assertSameBits(one, split, model.getFileName() + ": split vs one task, chunk 16");
      // Same bits over 1 and 5 tasks and with contiguous placement; a mixed corpus (long above 40).
      Result oneTask = ppl(model, "--chunk-len", "16", "--split-above", "0", "--split-partitions", "1");
      Result fiveTasks = ppl(model, "--chunk-len", "16", "--split-above", "40", "--split-partitions", "5",
          "--balance", "contiguous");
      // The runs were really cut differently (RDD shuffles with our partitioner: no coalescing).
      assertTrue(split.log().contains("over 3 tasks per layer") && oneTask.log().contains("over 1 task per layer")
          && fiveTasks.log().contains("3 documents split into") && fiveTasks.log().contains("over 5 tasks per layer"),
          split.log() + oneTask.log() + fiveTasks.log());
      // the start line's task count is the whole documents' (it read as if all ran in those tasks)
      assertTrue(fiveTasks.log().contains("documents (") && fiveTasks.log().contains("tokens), 5 of them whole in "),
          fiveTasks.log());
      assertSameBits(split, oneTask, model.getFileName() + ": 1 task");
      assertSameBits(split, fiveTasks, model.getFileName() + ": 5 tasks, contiguous, mixed corpus");
      // Other chunk lengths: rounding only.
      for (String len : List.of("7", "40")) {
        assertClose(one, ppl(model, "--chunk-len", len, "--split-above", "0", "--split-partitions", "2"), 1e-5,
            model.getFileName() + ": chunk " + len + " vs 16");
      }
    }
  }

  /**
   * Each attention call takes a group of consecutive chunks (LlamaModel.KV_GROUP_FLOATS); at this
   * model's size every document fits one group, so the test above never sees two. With groups of
   * 2 chunks of 16 tokens (16 x 2 kv heads x 8 x 2 floats each), the causal model's documents of up
   * to 10 chunks make up to 5 groups, and the window (23 tokens: up to 3 chunks seen) moves the first
   * group's start with each chunk: both paths must still agree bit for bit. Fresh model folders, so
   * the models are loaded (and their group size read) under the property.
   */
  @Test
  void splitEqualsOneTaskWithSeveralGroupsPerAttentionCall() throws Exception {
    for (Path model : List.of(causal, windowed)) {
      Result defaultGroups = ppl(model, "--chunk-len", "16", "--split-above", "1000000");
      Path grouped = shared.resolve(model.getFileName() + "-groups-of-2");
      ModelGenerator.generate(model == causal ? causalSpec() : windowedSpec(), grouped);
      System.setProperty(LlamaModel.KV_GROUP_FLOATS_PROPERTY, String.valueOf(2 * 16 * 2 * 8 * 2));
      Result one, split;
      try {
        one = ppl(grouped, "--chunk-len", "16", "--split-above", "1000000");
        split = ppl(grouped, "--chunk-len", "16", "--split-above", "0", "--split-partitions", "3");
      } finally {
        System.clearProperty(LlamaModel.KV_GROUP_FLOATS_PROPERTY);
      }
      assertSameBits(one, split, model.getFileName() + ": groups of 2 chunks, split vs one task");
      assertClose(defaultGroups, one, 1e-5, model.getFileName() + ": groups of 2 chunks vs one group");
      // The groups were really made: the sums moved (by rounding) for some document of 3+ chunks.
      assertTrue(defaultGroups.rows().keySet().stream().anyMatch(d -> (double) defaultGroups.rows().get(d)
          .getAs("sum_logprob") != (double) one.rows().get(d).getAs("sum_logprob")),
          model.getFileName() + ": the same bits with groups of 2 as with one group (seed " + seed + ")");
    }
  }

  /**
   * Spark keeps one checkpoint directory per context. Another run in the same context (here a thread
   * setting the directory as a second run would, under the same lock) must not take this run's
   * layers into its own directory: none may land there, and this run's bits stay the same. Before,
   * the directory was set once per run and every later setting took the rest of the layers.
   */
  @Test
  void anotherRunSettingTheCheckpointDirectoryTakesNoLayers() throws Exception {
    Result alone = ppl(causal, "--chunk-len", "16", "--split-above", "0", "--split-partitions", "2");
    Path foreign = Files.createDirectories(tmp.resolve("foreign-dir"));
    java.util.concurrent.atomic.AtomicBoolean done = new java.util.concurrent.atomic.AtomicBoolean();
    Thread other = new Thread(() -> {
      while (!done.get()) {
        synchronized (SplitPpl.CHECKPOINT_DIR) {
          spark.sparkContext().setCheckpointDir(foreign.toString());
        }
        try {
          Thread.sleep(5);
        } catch (InterruptedException e) {
          return;
        }
      }
    });
    other.start();
    Result beside;
    try {
      beside = ppl(causal, "--chunk-len", "16", "--split-above", "0", "--split-partitions", "2");
    } finally {
      done.set(true);
      other.join();
    }
    assertSameBits(alone, beside, "causal, with another setter of the checkpoint directory");
    try (Stream<Path> s = Files.walk(foreign)) {
      List<Path> taken = s.filter(p -> p.getFileName().toString().startsWith("rdd-")).toList();
      assertTrue(taken.isEmpty(), "this run's layers were checkpointed into another run's directory: " + taken);
    }
  }

  /**
   * The context's checkpoint directory is set once per run, not once per layer: each setting makes a
   * subdirectory and, on a non-local master, logs Spark's warning that the directory is local (three
   * times for a three-layer model before). Set again after another run set its own.
   */
  @Test
  void theCheckpointDirectoryIsSetOncePerRunNotPerLayer() throws Exception {
    Path dir = tmp.resolve("checkpoints");
    org.apache.hadoop.fs.Path hdir = new org.apache.hadoop.fs.Path(dir.toString());
    JavaSparkContext jsc = JavaSparkContext.fromSparkContext(spark.sparkContext());
    for (int layer = 0; layer < 4; layer++) {
      if (layer == 3) {
        spark.sparkContext().setCheckpointDir(tmp.resolve("another-run").toString());
      }
      JavaPairRDD<Integer, Integer> rdd = jsc.parallelizePairs(List.of(new Tuple2<>(layer, layer)));
      SplitPpl.markForCheckpoint(spark, rdd, hdir);
      rdd.count();
      assertTrue(rdd.getCheckpointFile().isPresent() && rdd.getCheckpointFile().get().contains(dir.toString()),
          "layer " + layer + " checkpointed into its run's directory: " + rdd.getCheckpointFile());
      try (Stream<Path> s = Files.list(dir)) {
        assertEquals(layer < 3 ? 1 : 2, s.count(), "settings of the directory (a subdirectory each), layer " + layer);
      }
    }
  }

  /**
   * A split run that fails after its checkpoint folder was made beside OUT: that folder made OUT's
   * parents, which stayed behind (OutputCommit.abort ran only for a failed write).
   */
  @Test
  void aFailedSplitRunLeavesNoFoldersItMade() throws Exception {
    org.apache.spark.SparkConf conf = org.apache.spark.SparkEnv.get().conf();
    conf.set(FaultHooks.FAIL_FIRST_ATTEMPTS, "1");
    conf.set(FaultHooks.FAIL_STAGE, FaultHooks.layerStage(1, FaultHooks.REDUCE));
    System.setProperty(FaultHooks.ENABLE_PROPERTY, "true");
    try {
      Path out = tmp.resolve("new1").resolve("new2").resolve("out");
      ByteArrayOutputStream err = new ByteArrayOutputStream();
      int rc = LongctxMain.run(new String[] {"ppl", "--model", causal.toString(), "--input", input.toString(),
          "--output", out.toString(), "--chunk-len", "16", "--split-above", "0"}, System.out, new PrintStream(err, true));
      assertTrue(rc != 0 && err.toString().contains("injected test failure"), rc + ": " + err);
      assertFalse(Files.exists(tmp.resolve("new1")), "the folders made for OUT and the checkpoints are gone: " + err);
    } finally {
      System.clearProperty(FaultHooks.ENABLE_PROPERTY);
      conf.remove(FaultHooks.FAIL_FIRST_ATTEMPTS);
      conf.remove(FaultHooks.FAIL_STAGE);
    }
  }

  @Test
  void planSeesWhatTheWindowAllowsAndBalancesCausalWork() {
    io.longctx.djl.LlamaConfig cfg = configOf(windowed);
    // Window 23: a query at q sees keys q-22..q. Chunks of 10 over positions 0..99 (101 tokens).
    SplitPpl.Plan p = SplitPpl.Plan.make(List.of(new long[] {0, 101}), 10, cfg.attention(), cfg, 3,
        SplitPpl.Balance.COST);
    assertEquals(10, p.chunkCount(0));
    assertEquals(0, p.firstChunkSeen(0, 0));
    assertEquals(0, p.firstChunkSeen(0, 3)); // q = 30 sees keys 8 and 9 of chunk 0
    assertEquals(1, p.firstChunkSeen(0, 4)); // q = 40 sees from 18
    assertEquals(2, p.firstChunkSeen(0, 5));
    assertEquals(4, p.lastBlockSeeing(0, 1)); // chunk 1 ends at 19: q = 40 sees it, q = 50 does not
    assertEquals(9, p.lastBlockSeeing(0, 9));
    io.longctx.djl.LlamaConfig full = configOf(causal);
    SplitPpl.Plan cost = SplitPpl.Plan.make(List.of(new long[] {0, 4097}), 256, full.attention(), full, 4,
        SplitPpl.Balance.COST);
    SplitPpl.Plan contiguous = SplitPpl.Plan.make(List.of(new long[] {0, 4097}), 256, full.attention(), full, 4,
        SplitPpl.Balance.CONTIGUOUS);
    assertEquals(0, cost.firstChunkSeen(0, 15));
    double c = spread(cost.load), n = spread(contiguous.load);
    assertTrue(c < 1.1 && n > 2, "max/min estimated task cost: by cost " + c + ", contiguous " + n);
  }

  @Test
  void defaultSplitAboveFollowsTheCacheAndTheWindow() {
    io.longctx.djl.LlamaConfig full = configOf(causal);
    // local[2]: two tasks share this JVM's heap; a fifth of it per task's KV cache.
    long want = Runtime.getRuntime().maxMemory() / 5 / 2 / full.kvCacheBytesPerToken();
    assertEquals(want, PplJob.defaultSplitAbove(spark, full, 16));
    assertEquals(3L * 32 / 4 * 2 * 2 * 4, full.kvCacheBytesPerToken()); // layers x kv heads x head dim x K,V x 4
    // A window of 23 tokens bounds the one-task cache: no length needs splitting for memory.
    assertEquals(Long.MAX_VALUE, PplJob.defaultSplitAbove(spark, configOf(windowed), 16));
    // On a cluster: the executors' heap and cores, Spark's defaults where unset (1g; one core on YARN and
    // Kubernetes; a standalone executor takes its worker's cores: bounded by the cluster's), never the driver's heap.
    long per = full.kvCacheBytesPerToken();
    org.apache.spark.SparkConf none = new org.apache.spark.SparkConf(false);
    assertEquals((1L << 30) / 5 / per, PplJob.defaultSplitAbove(false, "yarn", none, 12, full, 16));
    assertEquals((1L << 30) / 5 / 12 / per, PplJob.defaultSplitAbove(false, "spark://m:7077", none, 12, full, 16));
    org.apache.spark.SparkConf set = new org.apache.spark.SparkConf(false).set("spark.executor.memory", "8g")
        .set("spark.executor.cores", "4").set("spark.task.cpus", "2");
    assertEquals((8L << 30) / 5 / 2 / per, PplJob.defaultSplitAbove(false, "spark://m:7077", set, 12, full, 16));
    assertEquals((8L << 30) / 5 / 2 / per, PplJob.defaultSplitAbove(false, "k8s://https://api", set, 12, full, 16));
  }

  @Test
  void defaultSplitPartitionsKeepTasksSmall() {
    io.longctx.djl.LlamaConfig cfg = configOf(causal); // hidden 32: 128 bytes per token
    assertEquals(2, PplJob.defaultSplitPartitions(2, List.of(new long[] {0, 1001}), cfg, 100));
    assertEquals(1, PplJob.defaultSplitPartitions(2, List.of(new long[] {0, 50}), cfg, 100), "one chunk, one task");
    // 2^20 tokens x 128 bytes = 128 MiB: two tasks of 64 MiB at least; 5 on a wider cluster.
    assertEquals(2, PplJob.defaultSplitPartitions(1, List.of(new long[] {0, 1 << 20}), cfg, 4096));
    assertEquals(5, PplJob.defaultSplitPartitions(5, List.of(new long[] {0, 1 << 20}), cfg, 4096));
  }

  static double spread(double[] load) {
    double max = 0, min = Double.MAX_VALUE;
    for (double l : load) {
      max = Math.max(max, l);
      min = Math.min(min, l);
    }
    return max / min;
  }

  static io.longctx.djl.LlamaConfig configOf(Path dir) {
    try {
      return io.longctx.djl.LlamaConfig.read(dir);
    } catch (java.io.IOException e) {
      throw new java.io.UncheckedIOException(e);
    }
  }
}
