package io.longctx.spark;

import io.longctx.kernels.AttentionOptions;
import io.longctx.kernels.ReferenceAttention;
import io.longctx.kernels.Tensor;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Random;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;

/** Random corpora held in memory, written as KEYS / QUERIES files, with a float64 reference per query. */
final class TestData {
  record Key(long pos, float[] k, float[] v, float[] q) {}

  record Query(String id, String doc, Long pos, float[] q) {}

  final int heads, kvHeads, dim;
  final long seed;
  final Map<String, List<Key>> docs = new LinkedHashMap<>();
  final List<Query> queries = new ArrayList<>();
  private final Random rnd;

  TestData(long seed, int heads, int kvHeads, int dim) {
    this.seed = seed;
    this.heads = heads;
    this.kvHeads = kvHeads;
    this.dim = dim;
    this.rnd = new Random(seed);
  }

  float[] vec(int n) {
    float[] x = new float[n];
    for (int i = 0; i < n; i++) {
      x[i] = (float) rnd.nextGaussian();
    }
    return x;
  }

  /** A document of n keys at positions start, start+stride, ... (q on every key for prefill). */
  TestData doc(String id, int n, long start, long stride) {
    List<Key> ks = new ArrayList<>();
    for (int i = 0; i < n; i++) {
      ks.add(new Key(start + i * stride, vec(kvHeads * dim), vec(kvHeads * dim), vec(heads * dim)));
    }
    docs.put(id, ks);
    return this;
  }

  TestData query(String id, String doc, Long pos) {
    queries.add(new Query(id, doc, pos, vec(heads * dim)));
    return this;
  }

  /** Per document: random positions inside, one before the first key, one without pos. */
  TestData randomQueries(int perDoc) {
    int n = 0;
    for (Map.Entry<String, List<Key>> e : docs.entrySet()) {
      List<Key> ks = e.getValue();
      long first = ks.get(0).pos(), last = ks.get(ks.size() - 1).pos();
      for (int i = 0; i < perDoc; i++) {
        query("q" + (n++), e.getKey(), first + (long) (rnd.nextDouble() * (last - first + 1)));
      }
      query("q" + (n++), e.getKey(), first - 1); // sees no key when causal
      query("q" + (n++), e.getKey(), null); // attends the whole document
    }
    return this;
  }

  static List<Float> boxed(float[] x) {
    List<Float> l = new ArrayList<>(x.length);
    for (float f : x) {
      l.add(f);
    }
    return l;
  }

  static final StructType KEYS = new StructType().add("doc_id", DataTypes.StringType).add("pos", DataTypes.LongType)
      .add("k", DataTypes.createArrayType(DataTypes.FloatType)).add("v", DataTypes.createArrayType(DataTypes.FloatType))
      .add("q", DataTypes.createArrayType(DataTypes.FloatType));
  static final StructType QUERIES = new StructType().add("query_id", DataTypes.StringType)
      .add("doc_id", DataTypes.StringType).add("q", DataTypes.createArrayType(DataTypes.FloatType))
      .add("pos", DataTypes.LongType);

  List<Row> keyRows(boolean withQ) {
    List<Row> rows = new ArrayList<>();
    docs.forEach((d, ks) -> ks.forEach(k -> rows.add(withQ
        ? RowFactory.create(d, k.pos(), boxed(k.k()), boxed(k.v()), boxed(k.q()))
        : RowFactory.create(d, k.pos(), boxed(k.k()), boxed(k.v())))));
    return rows;
  }

  List<Row> queryRows() {
    List<Row> rows = new ArrayList<>();
    for (Query q : queries) {
      rows.add(RowFactory.create(q.id(), q.doc(), boxed(q.q()), q.pos()));
    }
    return rows;
  }

  static StructType keysSchema(boolean withQ) {
    return withQ ? KEYS : new StructType(java.util.Arrays.copyOf(KEYS.fields(), 4));
  }

  static void write(SparkSession spark, List<Row> rows, StructType schema, String fmt, Path path, int files) {
    spark.createDataFrame(rows, schema).repartition(files).write().format(fmt).save(path.toString());
  }

  Path writeKeys(SparkSession spark, Path dir, String fmt, boolean withQ) {
    Path p = dir.resolve(fmt.equals("json") ? "keys.jsonl" : "keys.parquet");
    write(spark, keyRows(withQ), keysSchema(withQ), fmt, p, 3);
    return p;
  }

  Path writeQueries(SparkSession spark, Path dir, String fmt) {
    Path p = dir.resolve(fmt.equals("json") ? "queries.jsonl" : "queries.parquet");
    write(spark, queryRows(), QUERIES, fmt, p, 2);
    return p;
  }

  /** float64 reference of one query row q (heads*dim) at pos (null: unmasked) over a document. */
  ReferenceAttention.Result reference(String doc, float[] q, Long pos, AttentionOptions opt) {
    List<Key> ks = docs.get(doc);
    int n = ks.size(), d = dim;
    float[] k = new float[kvHeads * n * d];
    float[] v = new float[k.length];
    long[] kp = new long[n];
    for (int t = 0; t < n; t++) {
      kp[t] = ks.get(t).pos();
      for (int h = 0; h < kvHeads; h++) {
        System.arraycopy(ks.get(t).k(), h * d, k, (h * n + t) * d, d);
        System.arraycopy(ks.get(t).v(), h * d, v, (h * n + t) * d, d);
      }
    }
    AttentionOptions o = pos == null ? opt.withCausal(false).withWindow(0) : opt;
    return ReferenceAttention.compute(new Tensor(q.clone(), 1, heads, 1, d), new Tensor(k, 1, kvHeads, n, d),
        new Tensor(v, 1, kvHeads, n, d), new long[] {pos == null ? 0 : pos}, kp, o);
  }

  /** Keys a query sees, counted plainly. */
  long visibleCount(String doc, Long pos, AttentionOptions opt) {
    if (pos == null) {
      return docs.get(doc).size();
    }
    return docs.get(doc).stream().filter(k -> opt.visible(pos, k.pos())).count();
  }
}
