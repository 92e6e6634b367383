package io.longctx.spark;

import static org.apache.spark.sql.functions.col;

import java.io.IOException;
import java.io.Serializable;
import java.util.Map;
import java.util.SplittableRandom;
import org.apache.hadoop.conf.Configuration;
import org.apache.spark.api.java.function.MapFunction;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.SparkSession;

/**
 * Synthetic corpus ({@code longctx gen}): documents doc-00000.. with dense positions 0..len-1,
 * lengths spaced evenly from --tokens down to --min-tokens; k, v, q standard normal from a
 * generator seeded by (seed, doc, pos), so any row can be regenerated alone. Queries:
 * doc-i/q-j; every 4th has no pos (attends the whole document), the others a random position.
 * Generated in parallel by Spark: no process ever holds a whole document.
 */
public final class Generator implements Serializable {
  private static final long serialVersionUID = 1L;

  public int docs = 3;
  public long tokens = 4096;
  public Long minTokens; // the shortest document; null: every document --tokens long
  public int heads = 8;
  public int kvHeads = 2;
  public int dim = 64;
  public int queriesPerDoc = 4;
  public long seed = 42;
  public boolean prefill;
  public String format = "parquet";
  public int partitions;

  public long docLength(int i) {
    long min = minTokens == null ? tokens : minTokens;
    return docs == 1 ? tokens : tokens - Math.multiplyExact(tokens - min, (long) i) / (docs - 1);
  }

  /** Floats in one generated vector at most (q is heads x dim; a row holds q, k and v). */
  static final long MAX_VECTOR = 1 << 24;
  static final int MAX_DOCS = 100_000_000;

  /** Refuses, before any Spark work, a corpus that cannot be made: shape, counts, format, total. */
  public void check() {
    // each option named alone (one message listing every rule named options a command may not even take)
    String[] names = {"--docs", "--tokens", "--heads", "--kv-heads", "--dim"};
    long[] values = {docs, tokens, heads, kvHeads, dim};
    for (int i = 0; i < names.length; i++) {
      if (values[i] < 1) {
        throw new IllegalArgumentException(names[i] + " must be >= 1, got " + values[i]);
      }
    }
    if (heads % kvHeads != 0) {
      throw new IllegalArgumentException("--heads (" + heads + ") must be a multiple of --kv-heads (" + kvHeads + ")");
    }
    if (queriesPerDoc < 0) {
      throw new IllegalArgumentException("--queries-per-doc must be >= 0, got " + queriesPerDoc);
    }
    if (!(format.equals("parquet") || format.equals("json"))) {
      throw new IllegalArgumentException("--format must be parquet or json, got " + format);
    }
    if (dim > io.longctx.kernels.CpuAttention.MAX_DIM) { // score would refuse the corpus
      throw new IllegalArgumentException("--dim " + dim + " is above the kernels' maximum " + io.longctx.kernels.CpuAttention.MAX_DIM);
    }
    if ((long) heads * dim > MAX_VECTOR) { // an int product wrapped to 0 wrote empty vectors
      throw new IllegalArgumentException("--heads " + heads + " x --dim " + dim + " floats per vector is above "
          + MAX_VECTOR);
    }
    if (docs > MAX_DOCS) {
      throw new IllegalArgumentException("--docs must be <= " + MAX_DOCS + " (each document's start is held in memory), got "
          + docs);
    }
    if (minTokens != null && (minTokens < 1 || minTokens > tokens)) {
      throw new IllegalArgumentException("--min-tokens must be 1.." + tokens + " (--tokens), got " + minTokens);
    }
    totalTokens();
  }

  /**
   * The corpus's tokens, every document's length summed. Refused when the sum passes a long (key ids
   * run on across documents: a wrapped sum wrote an empty corpus).
   */
  public long totalTokens() {
    long total = 0;
    try {
      for (int i = 0; i < docs; i++) {
        total = Math.addExact(total, docLength(i));
      }
    } catch (ArithmeticException e) {
      throw new IllegalArgumentException("--docs " + docs + " x --tokens " + tokens + " is more tokens than a long counts");
    }
    return total;
  }

  public static String docId(int i) {
    return String.format("doc-%05d", i);
  }

  /** Output file names inside DIR. */
  public String keysName() {
    return format.equals("json") ? "keys.jsonl" : "keys.parquet";
  }

  public String queriesName() {
    return format.equals("json") ? "queries.jsonl" : "queries.parquet";
  }

  static float[] normal(long seed, long doc, long pos, int which, int n) {
    SplittableRandom r = new SplittableRandom(seed * 0x9E3779B97F4A7C15L ^ (doc * 0xBF58476D1CE4E5B9L)
        ^ (pos * 0x94D049BB133111EBL) ^ which);
    float[] x = new float[n];
    for (int i = 0; i < n; i++) {
      x[i] = (float) r.nextGaussian();
    }
    return x;
  }

  /** The key row (doc, pos) exactly as written. */
  public Token key(int doc, long pos) {
    Token t = new Token();
    t.setDocId(docId(doc));
    t.setPos(pos);
    t.setK(normal(seed, doc, pos, 1, kvHeads * dim));
    t.setV(normal(seed, doc, pos, 2, kvHeads * dim));
    if (prefill) {
      t.setQ(normal(seed, doc, pos, 3, heads * dim));
    }
    return t;
  }

  /** Query j of document doc exactly as written. */
  public Token query(int doc, int j) {
    Token t = new Token();
    t.setDocId(docId(doc));
    t.setQueryId(docId(doc) + "/q-" + j);
    long len = docLength(doc);
    SplittableRandom r = new SplittableRandom(seed * 31 + doc * 1_000_003L + j);
    t.setPos(j % 4 == 3 ? null : r.nextLong(len));
    t.setQ(normal(seed, doc, -1 - j, 4, heads * dim));
    return t;
  }

  public void write(SparkSession spark, String dir, boolean overwrite) throws IOException {
    long total = totalTokens(); // refuses a sum past a long before anything is written
    long[] starts = new long[docs + 1];
    for (int i = 0; i < docs; i++) {
      starts[i + 1] = starts[i] + docLength(i);
    }
    int parts = partitions > 0 ? partitions
        : (int) Math.max(spark.sparkContext().defaultParallelism(), Math.min(4096, total * (kvHeads * 2L + (prefill ? heads : 0)) * dim / (4L << 20)));
    Generator g = this;
    Dataset<Token> keys = spark.range(0, total, 1, parts).map((MapFunction<Long, Token>) id -> {
      int d = java.util.Arrays.binarySearch(starts, id);
      d = d >= 0 ? d : -d - 2;
      return g.key(d, id - starts[d]);
    }, Encoders.bean(Token.class));
    Dataset<Row> keyRows = prefill
        ? keys.select(col("docId").as("doc_id"), col("pos"), col("k"), col("v"), col("q"))
        : keys.select(col("docId").as("doc_id"), col("pos"), col("k"), col("v"));
    // Both outputs are checked before either is written, and each is committed like score's OUT.
    Configuration hconf = spark.sparkContext().hadoopConfiguration();
    org.apache.hadoop.fs.Path top = new org.apache.hadoop.fs.Path(dir);
    org.apache.hadoop.fs.FileSystem fs = top.getFileSystem(hconf);
    if (fs.exists(top) && !fs.getFileStatus(top).isDirectory()) {
      throw new InputError("--output " + dir + " is a file: gen writes a directory (the keys and queries inside it)");
    }
    org.apache.hadoop.fs.Path oldQueries = new org.apache.hadoop.fs.Path(dir + "/" + queriesName());
    if (queriesPerDoc == 0 && fs.exists(oldQueries)) { // it would stay beside keys it does not belong to
      throw new InputError("--output " + dir + " holds " + oldQueries.getName() + " from an earlier run, and "
          + "--queries-per-doc 0 writes none: it would pair with the new keys. Remove it or choose another --output");
    }
    OutputCommit keysOut = OutputCommit.prepare(hconf, dir + "/" + keysName(), overwrite, "gen", Map.of());
    OutputCommit queriesOut = queriesPerDoc > 0
        ? OutputCommit.prepare(hconf, dir + "/" + queriesName(), overwrite, "gen", Map.of()) : null;
    // Both are staged, then committed as one: a run that fails or dies part-way never leaves new keys
    // beside the old queries (they would score as a corpus nobody generated).
    keysOut.stage(spark, Formats.output(keyRows.write(), format));
    if (queriesOut == null) {
      keysOut.commit();
      return;
    }
    try {
      int q = queriesPerDoc;
      Dataset<Row> queries = spark.range(0, (long) docs * q, 1, Math.max(1, Math.min(parts, docs)))
          .map((MapFunction<Long, Token>) id -> g.query((int) (id / q), (int) (id % q)), Encoders.bean(Token.class))
          .select(col("queryId").as("query_id"), col("docId").as("doc_id"), col("q"), col("pos"));
      queriesOut.stage(spark, Formats.output(queries.write(), format));
    } catch (Throwable e) {
      keysOut.abort();
      throw e;
    }
    OutputCommit.commitAll(java.util.List.of(keysOut, queriesOut));
  }
}
