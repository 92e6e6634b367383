package io.longctx.spark;

import static org.apache.spark.sql.functions.col;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.longctx.kernels.Seeds;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Random;
import java.util.TreeMap;
import org.apache.hadoop.conf.Configuration;
import org.apache.parquet.column.statistics.Statistics;
import org.apache.parquet.hadoop.ParquetFileReader;
import org.apache.parquet.hadoop.metadata.BlockMetaData;
import org.apache.parquet.hadoop.metadata.ColumnChunkMetaData;
import org.apache.parquet.hadoop.metadata.ParquetMetadata;
import org.apache.parquet.hadoop.util.HadoopInputFile;
import org.apache.spark.sql.Column;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * The page-at-a-time Parquet writer against Spark's own, on random rows of every type it encodes
 * (nulls, empty and long arrays, required and optional columns, many pages and row groups): the
 * same rows read back by both of Spark's readers, the same file schema, footer metadata and column
 * statistics, the same rows through filters that skip row groups and pages by those statistics;
 * other schemas go to Spark's writer.
 */
class BulkParquetFormatTest {
  final SparkSession spark = TestSpark.get();
  @TempDir
  Path dir;

  static final StructType SCHEMA = new StructType()
      .add("id", DataTypes.LongType, false)
      .add("s", DataTypes.StringType)
      .add("l", DataTypes.LongType)
      .add("i", DataTypes.IntegerType)
      .add("d", DataTypes.DoubleType)
      .add("f", DataTypes.FloatType)
      .add("af", DataTypes.createArrayType(DataTypes.FloatType, false))
      .add("ad", DataTypes.createArrayType(DataTypes.DoubleType, false))
      .add("ai", DataTypes.createArrayType(DataTypes.IntegerType, false))
      .add("al", DataTypes.createArrayType(DataTypes.LongType, false))
      .add("req", DataTypes.createArrayType(DataTypes.FloatType, false), false);

  static List<Row> rows(long seed, int n) {
    Random r = new Random(seed);
    List<Row> rows = new ArrayList<>();
    for (int k = 0; k < n; k++) {
      boolean nulls = r.nextInt(5) == 0;
      rows.add(RowFactory.create((long) k,
          nulls ? null : "doc-" + r.nextInt(50) + "\u00e9".repeat(r.nextInt(3)),
          nulls ? null : r.nextLong() >> r.nextInt(60),
          nulls ? null : r.nextInt(),
          nulls ? null : r.nextGaussian() * 1e3,
          nulls ? null : (float) r.nextGaussian(),
          array(r, nulls, 700, () -> (float) r.nextGaussian()),
          array(r, nulls, 40, r::nextGaussian),
          array(r, nulls, 40, r::nextInt),
          array(r, nulls, 40, r::nextLong),
          array(r, false, 300, () -> r.nextFloat() - 0.5f)));
    }
    return rows;
  }

  private static <T> List<T> array(Random r, boolean isNull, int maxLen, java.util.function.Supplier<T> x) {
    if (isNull) {
      return null;
    }
    int n = r.nextInt(6) == 0 ? 0 : r.nextInt(maxLen + 1);
    List<T> a = new ArrayList<>(n);
    for (int j = 0; j < n; j++) {
      a.add(x.get());
    }
    return a;
  }

  @Test
  void sameRowsSchemaAndStatisticsAsSparksWriter() throws Exception {
    long seed = Seeds.forTest();
    String why = "seed " + seed;
    Dataset<Row> df = spark.createDataFrame(rows(seed, 1500), SCHEMA).repartition(3);
    String ours = dir.resolve("ours").toString(), theirs = dir.resolve("theirs").toString();
    long before = BulkParquetFormat.filesWritten();
    // Small pages and row groups: many of each per file.
    Formats.output(df.write(), "parquet").option("parquet.page.size", "4096").option("parquet.block.size", "65536")
        .save(ours);
    assertEquals(3, BulkParquetFormat.filesWritten() - before, why);
    df.write().option("parquet.enable.dictionary", "false").option("spark.sql.parquet.writeLegacyFormat", "true")
        .option("parquet.page.size", "4096").option("parquet.block.size", "65536").parquet(theirs);

    Footers a = footers(ours), b = footers(theirs);
    assertEquals(b.schema, a.schema, why);
    assertEquals(b.keyValues, a.keyValues, why);
    assertTrue(a.rowGroups > 3, "row groups: " + a.rowGroups + ", " + why);
    for (String c : b.stats.keySet()) {
      Statistics<?> x = a.stats.get(c), y = b.stats.get(c);
      assertEquals(y.getNumNulls(), x.getNumNulls(), c + " nulls, " + why);
      assertEquals(y.genericGetMin(), x.genericGetMin(), c + " min, " + why);
      assertEquals(y.genericGetMax(), x.genericGetMax(), c + " max, " + why);
      assertEquals(b.values.get(c), a.values.get(c), c + " values, " + why);
    }

    for (String vectorized : new String[] {"true", "false"}) {
      spark.conf().set("spark.sql.parquet.enableVectorizedReader", vectorized);
      try {
        assertSameRows(read(theirs, null), read(ours, null), "vectorized " + vectorized + ", " + why);
        // Filters on the statistics: whole row groups and (column index) pages are skipped by them.
        for (Column filter : new Column[] {col("id").between(700, 760), col("s").equalTo("doc-7"),
            col("l").gt(0L), col("d").lt(-900.0), col("f").isNull()}) {
          List<Row> want = read(theirs, filter);
          assertSameRows(want, read(ours, filter), filter + ", vectorized " + vectorized + ", " + why);
        }
      } finally {
        spark.conf().unset("spark.sql.parquet.enableVectorizedReader");
      }
    }
  }

  @Test
  void emptyOutputAndOtherSchemas() throws Exception {
    long before = BulkParquetFormat.filesWritten();
    String empty = dir.resolve("empty").toString();
    Formats.output(spark.createDataFrame(List.of(), SCHEMA).write(), "parquet").save(empty);
    Dataset<Row> back = spark.read().parquet(empty);
    assertEquals(0, back.count());
    assertEquals(SCHEMA.asNullable().simpleString(), back.schema().asNullable().simpleString());

    // Arrays that may hold null elements (three-level lists) are Spark's writer's.
    StructType nullable = new StructType().add("id", DataTypes.LongType)
        .add("a", DataTypes.createArrayType(DataTypes.FloatType, true));
    List<Row> rows = List.of(RowFactory.create(1L, java.util.Arrays.asList(1f, null, 3f)),
        RowFactory.create(2L, null), RowFactory.create(3L, List.of()));
    String other = dir.resolve("other").toString();
    long mid = BulkParquetFormat.filesWritten();
    Formats.output(spark.createDataFrame(rows, nullable).coalesce(1).write(), "parquet").save(other);
    assertEquals(mid, BulkParquetFormat.filesWritten(), "a nullable-element array went to the bulk writer");
    String plain = dir.resolve("plain").toString();
    spark.createDataFrame(rows, nullable).coalesce(1).write().parquet(plain);
    assertSameRows(read(plain, null), read(other, null), "a nullable-element array");
    assertEquals(3, read(other, null).size());
    assertTrue(mid - before <= 1, "the empty output wrote " + (mid - before) + " files");
  }

  @Test
  void settingsBeyondPlainPagesGoToSparksWriter() {
    Dataset<Row> df = spark.createDataFrame(rows(7, 60), SCHEMA).coalesce(1);
    List<Row> want = df.orderBy("id").collectAsList();
    int k = 0;
    for (String[] setting : new String[][] {{"parquet.enable.dictionary", "true"},
        {"parquet.bloom.filter.enabled#s", "true"}, {"parquet.writer.version", "v2"}}) {
      long before = BulkParquetFormat.filesWritten();
      String out = dir.resolve("setting-" + k++).toString();
      Formats.output(df.write(), "parquet").option(setting[0], setting[1]).save(out);
      assertEquals(before, BulkParquetFormat.filesWritten(), String.join("=", setting) + " went to the bulk writer");
      assertSameRows(want, read(out, null), String.join("=", setting));
    }
  }

  @Test
  void everyCodecSparkShips() {
    Dataset<Row> df = spark.createDataFrame(rows(11, 80), SCHEMA).coalesce(1);
    List<Row> want = df.orderBy("id").collectAsList();
    for (String codec : new String[] {"uncompressed", "gzip", "zstd", "lz4_raw"}) {
      long before = BulkParquetFormat.filesWritten();
      String out = dir.resolve("codec-" + codec).toString();
      Formats.output(df.write(), "parquet").option("compression", codec).save(out);
      assertEquals(before + 1, BulkParquetFormat.filesWritten(), codec);
      assertSameRows(want, read(out, null), codec);
    }
  }

  /** Equal row lists, or a failure naming the first row that differs (not both lists: megabytes). */
  private static void assertSameRows(List<Row> want, List<Row> got, String why) {
    for (int k = 0; k < Math.min(want.size(), got.size()); k++) {
      if (!want.get(k).equals(got.get(k))) {
        String w = want.get(k).toString(), g = got.get(k).toString();
        org.junit.jupiter.api.Assertions.fail("row " + k + " differs (" + why + "): want "
            + w.substring(0, Math.min(600, w.length())) + " ... got " + g.substring(0, Math.min(600, g.length())));
      }
    }
    assertEquals(want.size(), got.size(), "row count, " + why);
  }

  private List<Row> read(String path, Column filter) {
    Dataset<Row> d = spark.read().parquet(path);
    if (filter != null) {
      d = d.filter(filter);
    }
    return d.orderBy("id").collectAsList();
  }

  /** The parts' footers: file schema, key-value metadata, and per column statistics merged over all row groups. */
  private static final class Footers {
    String schema;
    TreeMap<String, String> keyValues;
    int rowGroups;
    final TreeMap<String, Statistics<?>> stats = new TreeMap<>();
    final TreeMap<String, Long> values = new TreeMap<>();
  }

  @SuppressWarnings({"unchecked", "rawtypes"})
  private static Footers footers(String dir) throws Exception {
    Footers f = new Footers();
    Configuration conf = new Configuration();
    try (var parts = Files.list(Path.of(dir))) {
      for (Path p : parts.filter(p -> p.getFileName().toString().endsWith(".parquet")).sorted().toList()) {
        try (ParquetFileReader r = ParquetFileReader.open(HadoopInputFile.fromPath(
            new org.apache.hadoop.fs.Path(p.toString()), conf))) {
          ParquetMetadata m = r.getFooter();
          f.schema = m.getFileMetaData().getSchema().toString();
          TreeMap<String, String> kv = new TreeMap<>(m.getFileMetaData().getKeyValueMetaData());

          f.keyValues = kv;
          for (BlockMetaData g : m.getBlocks()) {
            f.rowGroups++;
            for (ColumnChunkMetaData c : g.getColumns()) {
              String name = c.getPath().toDotString();
              Statistics s = f.stats.computeIfAbsent(name, k -> Statistics.createStats(c.getPrimitiveType()));
              s.mergeStatistics(c.getStatistics());
              f.values.merge(name, c.getValueCount(), Long::sum);
            }
          }
        }
      }
    }
    return f;
  }
}
