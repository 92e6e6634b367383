package io.longctx.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.longctx.kernels.AttentionOptions;
import io.longctx.kernels.ReferenceAttention;
import io.longctx.kernels.Seeds;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.SparkSession;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * Positions anywhere in the long range and windows of any size give right answers under every
 * Spark SQL setting (docs/RELIABILITY.md): the chunk index as floor division in Java and SQL alike,
 * the window compared by exact distance, never by {@code p - W}.
 */
class LongRangeTest {
  @TempDir
  Path tmp;

  final SparkSession spark = TestSpark.get();

  static final long MIN = Long.MIN_VALUE, MAX = Long.MAX_VALUE;

  @Test
  void chunkIndexIsFloorDivisionInJavaAndSqlWithAnsiOnAndOff() {
    long[] pos = {MIN, MIN + 1, MIN + 6, MIN + 7, -8, -7, -1, 0, 1, 6, 7, MAX - 7, MAX - 1, MAX};
    List<Row> rows = new ArrayList<>();
    for (long p : pos) {
      rows.add(org.apache.spark.sql.RowFactory.create(p));
    }
    var df = spark.createDataFrame(rows, new org.apache.spark.sql.types.StructType().add("pos",
        org.apache.spark.sql.types.DataTypes.LongType));
    String ansi = spark.conf().get("spark.sql.ansi.enabled");
    try {
      for (String mode : new String[] {"true", "false"}) {
        spark.conf().set("spark.sql.ansi.enabled", mode);
        for (int n : new int[] {1, 2, 7, 4096, Integer.MAX_VALUE}) {
          List<Row> got = df.select(df.col("pos"), Chunking.indexColumn("pos", n).as("c")).collectAsList();
          for (Row r : got) {
            assertEquals(Math.floorDiv(r.getLong(0), n), r.getLong(1), "pos " + r.getLong(0) + ", chunk-len " + n
                + ", ansi " + mode);
            assertEquals(Math.floorDiv(r.getLong(0), n), Chunking.index(r.getLong(0), n));
          }
        }
      }
    } finally {
      spark.conf().set("spark.sql.ansi.enabled", ansi);
    }
  }

  /** Documents at the bottom, the top and across the whole long range, small chunks, huge windows. */
  @Test
  void positionsAtTheEndsOfTheLongRangeWithAnyWindowMatchTheReference() throws Exception {
    long seed = Seeds.forTest();
    long spread = MAX / 20; // 40 keys from MIN to about 0.95 * MAX
    TestData data = new TestData(seed, 4, 2, 8).doc("bottom", 30, MIN, 1).doc("top", 30, MAX - 29, 1)
        .doc("across", 40, MIN, spread)
        .query("b0", "bottom", MIN).query("b1", "bottom", MIN + 3).query("b2", "bottom", MIN + 29)
        .query("b3", "bottom", MAX).query("b4", "bottom", null)
        .query("t0", "top", MAX).query("t1", "top", MAX - 10).query("t2", "top", MIN).query("t3", "top", 0L)
        .query("a0", "across", MIN).query("a1", "across", MIN + 5 * spread).query("a2", "across", -1L)
        .query("a3", "across", MAX).query("a4", "across", 39 * spread);
    Path keys = data.writeKeys(spark, tmp, "parquet", false);
    Path queries = data.writeQueries(spark, tmp, "parquet");
    String ansi = spark.conf().get("spark.sql.ansi.enabled");
    int run = 0;
    try {
      // Each window size under one setting, three under each (a job run costs a few seconds).
      for (String mode : new String[] {"true", "false"}) {
        spark.conf().set("spark.sql.ansi.enabled", mode);
        for (long w : mode.equals("true") ? new long[] {0, 5, MAX} : new long[] {1, 3 * spread, MAX - 1}) {
          AttentionOptions attn = AttentionOptions.DEFAULT.withCausal(true).withWindow(w);
          ScoreOptions o = new ScoreOptions();
          o.keys = keys.toString();
          o.queries = queries.toString();
          o.output = tmp.resolve("out" + run++).toString();
          o.dim = 8;
          o.causal = true;
          o.window = w;
          o.chunkLen = 7;
          o.queryBlock = 2;
          ScoreJob.run(spark, o);
          Map<String, Outputs.Result> got = Outputs.read(spark, Path.of(o.output), "parquet", false);
          assertEquals(data.queries.size(), got.size());
          for (TestData.Query q : data.queries) {
            Outputs.Result r = got.get(q.id());
            String what = "query " + q.id() + " at " + q.pos() + ", window " + w + ", ansi " + mode + " (seed " + seed + ")";
            assertEquals(data.visibleCount(q.doc(), q.pos(), attn), r.nKeys(), "n_keys of " + what);
            ReferenceAttention.Result ref = data.reference(q.doc(), q.q(), q.pos(), attn);
            double[] err = Demo.errors(r.o(), r.lse(), ref.o(), ref.lse());
            assertTrue(err[0] <= EndToEndTest.O_TOL && err[1] <= EndToEndTest.LSE_TOL,
                "errors " + err[0] + ", " + err[1] + " for " + what);
          }
          // Spot checks by hand, independent of the shared rule.
          assertEquals(1, got.get("b0").nKeys(), "the key at Long.MIN_VALUE sees itself");
          assertEquals(w == 0 || w > 29 ? 30 : Math.min(30, w), got.get("b2").nKeys(), "window " + w);
          assertEquals(w == 0 ? 30 : 0, got.get("b3").nKeys(), "bottom keys are 2^64 - 30 or more before MAX, window " + w);
          assertEquals(0, got.get("t2").nKeys());
        }
      }
    } finally {
      spark.conf().set("spark.sql.ansi.enabled", ansi);
    }
  }
}
