package io.longctx.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
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

/** The planning of a score run: how many Spark jobs it costs, and the key sample the shape comes from. */
class ScoreJobTest {
  @TempDir
  Path tmp;

  final SparkSession spark = TestSpark.get();

  /** The Spark jobs started while {@code r} ran, by their stages' operations (the listener bus drained before and after). */
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
  void prefillRunPlansWithOneJob() throws Exception {
    // Every job is fixed cost a cold JVM pays (planning, code generation, scheduling). A prefill run is: Spark's
    // read of the Parquet footers for the schema (1 job), one aggregation that plans the chunks and samples the
    // shape (2 jobs under adaptive execution: its shuffle stage, then the collect), the output write (3: the
    // token shuffle, the routed K/V shuffle, the write). Before the sample rode on the chunk aggregation, shape
    // resolution was a job of its own (7 in all).
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
    assertEquals(6, jobs.size(), "Spark jobs of one prefill score run (schema 1, planning 2, write 3): a change here changes the "
        + "fixed cost every run pays; update this figure only on purpose: " + jobs);
  }

  static List<Row> rows(TestData d) {
    return new ArrayList<>(d.keyRows(true));
  }

  @Test
  void keySampleIsTheLeastCleanRowWhateverThePartitioning() throws Exception {
    TestData d = new TestData(11, 4, 2, 8).doc("b", 50, 0, 1).doc("a", 50, 100, 1);
    List<Row> rows = rows(d);
    // doc 'a' sorts first: its pos 100 has no k, 101 a null element in q; 102 is the first clean row
    for (int i = 0; i < rows.size(); i++) {
      Row r = rows.get(i);
      if ("a".equals(r.getString(0)) && r.getLong(1) == 100) {
        rows.set(i, RowFactory.create("a", 100L, null, r.get(3), r.get(4)));
      } else if ("a".equals(r.getString(0)) && r.getLong(1) == 101) {
        @SuppressWarnings("unchecked")
        List<Float> q = new ArrayList<>((List<Float>) r.get(4));
        q.set(3, null);
        rows.set(i, RowFactory.create("a", 101L, r.get(2), r.get(3), q));
      }
    }
    String parts = spark.conf().get("spark.sql.shuffle.partitions");
    List<String> seen = new ArrayList<>();
    try {
      for (int[] run : new int[][] {{1, 1}, {5, 7}, {3, 2}}) {
        Path p = tmp.resolve("keys-" + run[0] + "-" + run[1] + ".parquet");
        TestData.write(spark, rows, TestData.KEYS, "parquet", p, run[0]);
        spark.conf().set("spark.sql.shuffle.partitions", run[1]);
        ScoreJob.ChunkScan s = ScoreJob.chunkRanges(ScoreJob.read(spark, "parquet", p.toString(), true, true), 16, true);
        assertEquals(4 + 4, s.chunks().size(), "chunks of 16 positions: 4 of 'b' (0..49), 4 of 'a' (100..149)");
        ScoreJob.Sample x = s.sample();
        assertNotNull(x);
        assertEquals("a", x.docId());
        assertEquals(102L, x.pos());
        assertEquals(2 * 8, x.kLen());
        assertEquals(4 * 8, x.qLen());
        assertTrue(x.file().contains(p.getFileName().toString()), x.file());
        seen.add(x.docId() + "@" + x.pos());
      }
    } finally {
      spark.conf().set("spark.sql.shuffle.partitions", parts);
    }
    assertEquals(List.of("a@102", "a@102", "a@102"), seen);
  }

  @Test
  void noCleanKeyRowFallsBackToTheErrorThatNamesIt() throws Exception {
    // No chunk has a sample: the driver looks again (the old path) and names the missing column.
    TestData d = new TestData(3, 2, 1, 4).doc("a", 20, 0, 1);
    List<Row> rows = new ArrayList<>();
    for (Row r : rows(d)) {
      rows.add(RowFactory.create(r.get(0), r.get(1), r.get(2), r.get(3), null));
    }
    Path p = tmp.resolve("no-q.parquet");
    TestData.write(spark, rows, TestData.KEYS, "parquet", p, 2);
    assertNull(ScoreJob.chunkRanges(ScoreJob.read(spark, "parquet", p.toString(), true, true), 8, true).sample());
    ScoreOptions o = new ScoreOptions();
    o.mode = ScoreOptions.Mode.PREFILL;
    o.keys = p.toString();
    o.output = tmp.resolve("out").toString();
    o.heads = 2;
    InputError e = assertThrows(InputError.class, () -> ScoreJob.run(spark, o));
    assertTrue(e.getMessage().contains("column 'q' is missing or null (and in every other row)"), e.getMessage());
    assertTrue(e.getMessage().contains("no-q.parquet/part-"), e.getMessage());
  }
}
