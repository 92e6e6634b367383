package io.longctx.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import org.apache.spark.scheduler.SparkListener;
import org.apache.spark.scheduler.SparkListenerJobStart;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.SparkSession;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** The planning of a score run: how many Spark jobs it costs, and its error when no row gives the shape. */
class ScoreJobTest {
  @TempDir
  Path tmp;

  final SparkSession spark = TestSpark.get();

  /** The Spark jobs started while {@code r} ran, by their stages' operations (listener bus drained around it). */
  List<String> jobsDuring(Runnable r) throws java.util.concurrent.TimeoutException {
    List<String> jobs = java.util.Collections.synchronizedList(new ArrayList<>());
    SparkListener l = new SparkListener() {
      @Override
      public void onJobStart(SparkListenerJobStart e) {
        // a job's stages, each by its operation (its call site)
        jobs.add(scala.jdk.javaapi.CollectionConverters.asJava(e.stageInfos()).stream()
            .map(s -> s.name().replaceAll(" at .*", "")).toList().toString());
      }
    };
    spark.sparkContext().listenerBus().waitUntilEmpty();
    spark.sparkContext().addSparkListener(l);
    try {
      r.run();
      spark.sparkContext().listenerBus().waitUntilEmpty();
    } finally {
      spark.sparkContext().removeSparkListener(l);
    }
    return new ArrayList<>(jobs);
  }

  @Test
  void vectorsReadAsArraysWithoutNullElementsSoTheDecoderCopiesThemWhole() {
    // Spark reads every file's arrays as possibly holding nulls; for such a column the bean decoder boxes each
    // element of a float[] (a large share of a cold read stage). read() tags the vectors that passed its null/NaN
    // test, so the decoder copies them whole. A Spark upgrade that drops the tag fails here, not in a profile.
    TestData data = new TestData(7, 4, 2, 16).doc("a", 20, 0, 1);
    org.apache.spark.sql.Dataset<Token> keys = ScoreJob.read(spark, "parquet",
        data.writeKeys(spark, tmp, "parquet", true).toString(), true, true);
    org.apache.spark.sql.Dataset<Token> queries = ScoreJob.read(spark, "json",
        data.writeQueries(spark, tmp, "json").toString(), false, true);
    for (var c : List.of(List.of(keys, "k"), List.of(keys, "v"), List.of(keys, "q"), List.of(queries, "q"))) {
      org.apache.spark.sql.types.StructType schema = ((org.apache.spark.sql.Dataset<?>) c.get(0)).schema();
      assertEquals(new org.apache.spark.sql.types.ArrayType(org.apache.spark.sql.types.DataTypes.FloatType, false),
          schema.apply((String) c.get(1)).dataType(), () -> c.get(1) + " in " + schema.treeString());
    }
    // The one element-wise decode left is suspectVec, a List<Float> that is null on every good row.
    String plan = keys.map((org.apache.spark.api.java.function.MapFunction<Token, Integer>) t -> 0,
        org.apache.spark.sql.Encoders.INT()).queryExecution().optimizedPlan().toString().toLowerCase(java.util.Locale.ROOT);
    assertEquals(plan.indexOf("mapobjects"), plan.lastIndexOf("mapobjects"), plan);
    assertTrue(plan.contains("mapobjects"), plan); // the check above looks at the right text
  }

  @Test
  void prefillRunIsSixJobs() throws Exception {
    // Every job is fixed cost a cold JVM pays (planning, code generation, scheduling). A prefill run is: Spark's
    // read of the Parquet footers for the schema (1 job), the shape's sample row (1: a limit(1) scan), the chunk
    // ranges (2 under adaptive execution: the aggregation's shuffle stage, then the collect), the output write
    // (2: the shuffle of the tokens to their query blocks, the write; chunks built in a shuffle of their own
    // before routing were a job and a stage more). The sample stays a job of its own on purpose:
    // riding on the chunk-range aggregation (one job less) made that scan decode every vector, which cost more CPU, cold
    // and warm, than the job it saved (docs/BENCHMARKS-HISTORY.md, cold start).
    TestData data = new TestData(7, 4, 2, 16).doc("a", 150, 0, 1).doc("b", 40, 3, 2);
    Path keys = data.writeKeys(spark, tmp, "parquet", true);
    ScoreOptions o = new ScoreOptions();
    o.mode = ScoreOptions.Mode.PREFILL;
    o.keys = keys.toString();
    o.output = tmp.resolve("out").toString();
    o.heads = 4;
    o.chunkLen = 32;
    ScoreJob.run(spark, o); // a first run, so that nothing one-off (a first use of a data source) is counted
    o.overwrite = true;
    List<String> jobs = jobsDuring(() -> ScoreJob.run(spark, o));
    assertEquals(6, jobs.size(), "Spark jobs of one prefill score run (schema 1, sample 1, ranges 2, write 2): a "
        + "change here changes the fixed cost every run pays; update this figure only on purpose: " + jobs);
    // each stage named by its phase (Sessions.label), not by an internal call site
    assertEquals(List.of("[longctx score: input schemas]", "[longctx score: first rows (shape)]",
        "[longctx score: chunk ranges]", "[longctx score: chunk ranges, longctx score: chunk ranges]",
        "[longctx score: route keys, attention, write]",
        "[longctx score: route keys, attention, write, longctx score: route keys, attention, write]"), jobs);
  }

  @Test
  void outputArraysAreTwoLevelParquetListsThatReadBackAsFloatArrays() throws Exception {
    // Formats.output: two-level lists cost a third less to write than three-level ones (docs/BENCHMARKS.md,
    // "Parquet output"); a Spark upgrade that stopped honoring the per-write option would show here.
    TestData data = new TestData(5, 2, 1, 8).doc("a", 40, 0, 1);
    ScoreOptions o = new ScoreOptions();
    o.mode = ScoreOptions.Mode.PREFILL;
    o.keys = data.writeKeys(spark, tmp, "parquet", true).toString();
    o.output = tmp.resolve("two-level").toString();
    o.heads = 2;
    o.chunkLen = 16;
    ScoreJob.run(spark, o);
    Path part;
    try (var files = java.nio.file.Files.list(Path.of(o.output))) {
      part = files.filter(f -> f.getFileName().toString().endsWith(".parquet")).findFirst().orElseThrow();
    }
    org.apache.parquet.schema.MessageType schema;
    try (var reader = org.apache.parquet.hadoop.ParquetFileReader.open(org.apache.parquet.hadoop.util.HadoopInputFile
        .fromPath(new org.apache.hadoop.fs.Path(part.toUri()), new org.apache.hadoop.conf.Configuration()))) {
      schema = reader.getFooter().getFileMetaData().getSchema();
    }
    for (String column : List.of("o", "lse")) {
      org.apache.parquet.schema.GroupType list = schema.getType(column).asGroupType();
      org.apache.parquet.schema.Type element = list.getType(0);
      assertTrue(element.isPrimitive() && element.isRepetition(org.apache.parquet.schema.Type.Repetition.REPEATED),
          column + " is not a two-level list: " + schema);
    }
    org.apache.spark.sql.types.StructType read = spark.read().parquet(o.output).schema();
    // Spark reads back the schema it wrote (file columns are written nullable): the same as three-level lists give.
    assertEquals(org.apache.spark.sql.types.DataTypes.createArrayType(org.apache.spark.sql.types.DataTypes.FloatType),
        read.apply("o").dataType(), read.treeString());
    assertEquals(40, spark.read().parquet(o.output).count());
  }

  static List<Row> rows(TestData d) {
    return new ArrayList<>(d.keyRows(true));
  }

  @Test
  void noCleanKeyRowIsNamedByTheMissingColumn() throws Exception {
    // Shape resolution finds no row with k and q: the error names a row and the missing column.
    TestData d = new TestData(3, 2, 1, 4).doc("a", 20, 0, 1);
    List<Row> rows = new ArrayList<>();
    for (Row r : rows(d)) {
      rows.add(RowFactory.create(r.get(0), r.get(1), r.get(2), r.get(3), null));
    }
    Path p = tmp.resolve("no-q.parquet");
    TestData.write(spark, rows, TestData.KEYS, "parquet", p, 2);
    ScoreOptions o = new ScoreOptions();
    o.mode = ScoreOptions.Mode.PREFILL;
    o.keys = p.toString();
    o.output = tmp.resolve("out").toString();
    o.heads = 2;
    InputError e = assertThrows(InputError.class, () -> ScoreJob.run(spark, o));
    assertTrue(e.getMessage().contains("column 'q' is missing or null (and in every other row)"), e.getMessage());
    assertTrue(e.getMessage().contains("no-q.parquet/part-"), e.getMessage());
  }
  /**
   * Decode blocks under a window end at a gap that holds a whole chunk no query of the block sees, so
   * the block is not paired with it; without a window blocks are cut by count alone.
   */
  @Test
  void windowedDecodeBlocksEndAtAGapNoQuerySees() {
    ScoreJob.Shape shape = new ScoreJob.Shape(1, 1, 2);
    long[] pos = {10, 20, 183, 5000, 5010, 9000};
    java.util.function.LongFunction<List<List<Long>>> blocks = gap -> {
      List<Token> qs = new ArrayList<>();
      for (long p : pos) {
        Token t = new Token();
        t.setQueryId("q" + p);
        t.setDocId("d");
        t.setPos(p);
        t.setQ(new float[] {1, 2});
        qs.add(t);
      }
      List<List<Long>> out = new ArrayList<>();
      ScoreJob.buildBlocks("d", qs.iterator(), shape, 4, gap, "queries").forEachRemaining(
          b -> out.add(java.util.Arrays.stream(b.getQPos()).boxed().toList()));
      return out;
    };
    // window 100, chunks of 64: a gap of 164 or more (20 -> 183 is 163: kept together)
    long gap = ScoreJob.blockGap(io.longctx.kernels.AttentionOptions.DEFAULT.withWindow(100), 64);
    assertEquals(164, gap);
    assertEquals(List.of(List.of(10L, 20L, 183L), List.of(5000L, 5010L), List.of(9000L)), blocks.apply(gap));
    assertEquals(List.of(List.of(10L, 20L, 183L, 5000L), List.of(5010L, 9000L)),
        blocks.apply(ScoreJob.blockGap(io.longctx.kernels.AttentionOptions.DEFAULT.withCausal(true), 64)));
    // The largest window: window + chunk wrapped negative, and every query made a block of its own.
    long widest = ScoreJob.blockGap(io.longctx.kernels.AttentionOptions.DEFAULT.withWindow(Long.MAX_VALUE), 64);
    assertEquals(Long.MAX_VALUE, widest);
    assertEquals(blocks.apply(Long.MAX_VALUE), blocks.apply(widest));
    // Positions far apart at both ends of the long range: their difference passes Long.MAX_VALUE.
    pos[0] = Long.MIN_VALUE + 1;
    assertEquals(List.of(List.of(Long.MIN_VALUE + 1), List.of(20L, 183L), List.of(5000L, 5010L), List.of(9000L)),
        blocks.apply(gap));
  }
}
