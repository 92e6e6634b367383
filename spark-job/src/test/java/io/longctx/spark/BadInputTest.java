package io.longctx.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.longctx.kernels.Seeds;
import java.io.ByteArrayOutputStream;
import java.io.PrintStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * Every bad-input class gives exit status 2 and a message naming the file, the document and the
 * position; no output (and no temp directory) is left behind.
 */
class BadInputTest {
  @TempDir
  Path tmp;

  final SparkSession spark = TestSpark.get();

  TestData good() {
    return new TestData(11, 2, 1, 8).doc("alpha", 30, 0, 1).doc("beta", 20, 100, 1).query("q1", "alpha", 10L)
        .query("q2", "beta", null);
  }

  /** Runs score; asserts exit 2, no output, and that stderr contains every fragment. */
  String fails(Path keys, Path queries, String... fragments) throws Exception {
    Path out = tmp.resolve("out");
    List<String> args = new ArrayList<>(List.of("score", "--keys", keys.toString(), "--output", out.toString(),
        "--dim", "8", "--causal", "--chunk-len", "8"));
    if (queries != null) {
      args.addAll(List.of("--queries", queries.toString()));
    } else {
      args.addAll(List.of("--mode", "prefill"));
    }
    ByteArrayOutputStream err = new ByteArrayOutputStream();
    int rc = LongctxMain.run(args.toArray(String[]::new), System.out, new PrintStream(err, true));
    String msg = err.toString();
    assertEquals(2, rc, msg);
    for (String f : fragments) {
      assertTrue(msg.contains(f), "message should contain '" + f + "': " + msg);
    }
    assertFalse(Files.exists(out), "no output after a failure");
    try (var s = Files.list(tmp)) {
      assertTrue(s.noneMatch(p -> p.getFileName().toString().contains("-tmp-")), "no temp output left behind");
    }
    return msg;
  }

  Path keysWith(TestData d, String doc, long pos, String col, Object value, boolean withQ) {
    List<Row> rows = new ArrayList<>();
    for (Row r : d.keyRows(withQ)) {
      if (r.getString(0).equals(doc) && r.getLong(1) == pos) {
        Object[] x = new Object[r.length()];
        for (int i = 0; i < x.length; i++) {
          x[i] = r.get(i);
        }
        x[TestData.keysSchema(withQ).fieldIndex(col)] = value;
        r = RowFactory.create(x);
      }
      rows.add(r);
    }
    Path p = tmp.resolve("bad-keys.parquet");
    TestData.write(spark, rows, TestData.keysSchema(withQ), "parquet", p, 2);
    return p;
  }

  @Test
  void wrongArrayLength() throws Exception {
    TestData d = good();
    Path keys = keysWith(d, "alpha", 17, "k", TestData.boxed(new float[7]), false);
    Path queries = d.writeQueries(spark, tmp, "parquet");
    fails(keys, queries, "bad-keys.parquet/part-", "doc 'alpha'", "pos 17", "k has 7 floats, expected 8");
    // Where kv-heads is inferred from the first row read, a length error says so and names that row: when
    // the odd row is the one read first, the message named a good row alone, "expected" its length.
    io.longctx.djl.MadeFolders.delete(keys); // keysWith writes to one name
    keys = keysWith(d, "alpha", 0, "k", TestData.boxed(new float[16]), false);
    String msg = fails(keys, queries, " (kv-heads*dim; heads, kv-heads inferred from the first rows: KEYS ");
    assertTrue(msg.contains("pos 0: k has 16 floats, expected 8") || msg.contains("doc 'alpha' pos 0, QUERIES"), msg);
  }

  @Test
  void nanAndInfinityInVectors() throws Exception {
    TestData d = good();
    float[] v = d.vec(8);
    v[3] = Float.NaN;
    Path queries = d.writeQueries(spark, tmp, "parquet");
    fails(keysWith(d, "beta", 105, "v", TestData.boxed(v), false), queries, "bad-keys.parquet/part-", "doc 'beta'",
        "pos 105", "v[3] is NaN");
    // Infinity in a query (JSON input this time).
    d.queries.set(0, new TestData.Query("q1", "alpha", 10L, new float[] {1, 2, Float.POSITIVE_INFINITY, 4, 5, 6, 7, 8, 9,
        0, 1, 2, 3, 4, 5, 6}));
    Path keys = d.writeKeys(spark, tmp.resolve("j"), "json", false);
    Path qj = d.writeQueries(spark, tmp.resolve("j"), "json");
    fails(keys, qj, "queries.jsonl/part-", "query 'q1'", "doc 'alpha'", "pos 10", "q[2] is Infinity");
  }

  @Test
  void infinityInPrefillQuery() throws Exception {
    TestData d = good();
    float[] q = d.vec(16);
    q[15] = Float.NEGATIVE_INFINITY;
    fails(keysWith(d, "alpha", 3, "q", TestData.boxed(q), true), null, "bad-keys.parquet/part-", "doc 'alpha'", "pos 3",
        "q[15] is -Infinity");
  }

  @Test
  void duplicateDocAndPos() throws Exception {
    TestData d = good();
    List<Row> rows = d.keyRows(false);
    Path keys = tmp.resolve("dup.parquet");
    TestData.write(spark, rows, TestData.keysSchema(false), "parquet", keys, 1);
    // The second copy of alpha @ 12 in a file of its own: the message names both files, each with its row.
    spark.createDataFrame(List.of(rows.get(12)), TestData.keysSchema(false)).write().mode("append").parquet(
        keys.toString());
    List<String> parts;
    try (var s = Files.list(keys)) {
      parts = s.map(p -> p.getFileName().toString()).filter(n -> n.startsWith("part-")).sorted().toList();
    }
    assertEquals(2, parts.size(), parts.toString());
    Path queries = d.writeQueries(spark, tmp, "parquet");
    String msg = fails(keys, queries, "dup.parquet", "duplicate key", "doc 'alpha'", "pos 12", "the rows are in ");
    for (String part : parts) {
      assertTrue(msg.contains(part + " (1 row)"), part + " should be named with its row: " + msg);
    }
    // Prefill assembles its chunks elsewhere: the same message.
    TestData.write(spark, d.keyRows(true), TestData.keysSchema(true), "parquet", tmp.resolve("dupq.parquet"), 1);
    spark.createDataFrame(List.of(d.keyRows(true).get(12)), TestData.keysSchema(true)).write().mode("append")
        .parquet(tmp.resolve("dupq.parquet").toString());
    fails(tmp.resolve("dupq.parquet"), null, "duplicate key", "doc 'alpha'", "pos 12", "the rows are in ", " (1 row), ");
    // Both rows in one file: that file, with its two rows.
    List<Row> twice = new ArrayList<>(rows);
    twice.add(rows.get(12));
    TestData.write(spark, twice, TestData.keysSchema(false), "parquet", tmp.resolve("dup1.parquet"), 1);
    fails(tmp.resolve("dup1.parquet"), queries, "duplicate key", "pos 12", ".parquet (2 rows)");
  }

  @Test
  void missingColumns() throws Exception {
    TestData d = good();
    Path keys = tmp.resolve("no-v.parquet");
    spark.createDataFrame(d.keyRows(false), TestData.keysSchema(false)).drop("v").write().parquet(keys.toString());
    fails(keys, d.writeQueries(spark, tmp, "parquet"), "KEYS", "no-v.parquet", "missing column v");
    // JSON: the field absent from a row.
    Path qj = tmp.resolve("queries-no-q.jsonl");
    Files.createDirectories(qj);
    Files.writeString(qj.resolve("part-0.json"), "{\"query_id\":\"q9\",\"doc_id\":\"alpha\",\"pos\":4}\n");
    Path kj = d.writeKeys(spark, tmp.resolve("j"), "json", false);
    fails(kj, qj, "queries-no-q.jsonl/part-0.json", "query 'q9'", "doc 'alpha'", "pos 4", "column 'q' is missing");
  }

  @Test
  void queriesForUnknownDocument() throws Exception {
    TestData d = good().query("q3", "gamma", 5L);
    fails(d.writeKeys(spark, tmp, "parquet", false), d.writeQueries(spark, tmp, "parquet"), "query 'q3'",
        "document 'gamma'", "has no keys");
  }

  @Test
  void shapeThatDoesNotDivide() throws Exception {
    TestData d = good();
    Path keys = d.writeKeys(spark, tmp, "parquet", false);
    Path queries = d.writeQueries(spark, tmp, "parquet");
    Run r = score(keys, queries, "--heads", "3");
    assertEquals(2, r.rc(), r.err());
    assertTrue(r.err().contains("shape: q has 16 floats, not a multiple of --heads 3 (first rows: KEYS "), r.err());
    // a count inferred by a division with a remainder was printed as its quotient ("heads=2 ... dim=6")
    r = score(keys, queries, "--dim", "6");
    assertEquals(2, r.rc(), r.err());
    assertTrue(r.err().contains("shape: q has 16 floats, not a multiple of the head dim 6 (--dim)"), r.err());
    r = score(keys, queries, "--kv-heads", "3");
    assertTrue(r.rc() == 2 && r.err().contains("shape: k has 8 floats, not a multiple of --kv-heads 3"), r.err());
    r = score(keys, queries, "--dim", "4", "--heads", "3");
    assertTrue(r.rc() == 2 && r.err().contains("shape heads=3 kv-heads=2 dim=4 does not match the data"), r.err());
  }

  record Run(int rc, String err) {}

  /** score over KEYS and QUERIES into tmp/o with the extra options: exit code and stderr. */
  Run score(Path keys, Path queries, String... extra) {
    List<String> args = new ArrayList<>(List.of("score", "--keys", keys.toString(), "--queries", queries.toString(),
        "--output", tmp.resolve("o").toString()));
    args.addAll(List.of(extra));
    ByteArrayOutputStream err = new ByteArrayOutputStream();
    int rc = LongctxMain.run(args.toArray(String[]::new), System.out, new PrintStream(err, true));
    return new Run(rc, err.toString());
  }

  @Test
  void usageErrors() throws Exception {
    ByteArrayOutputStream err = new ByteArrayOutputStream();
    PrintStream e = new PrintStream(err, true);
    assertEquals(2, LongctxMain.run(new String[] {"score", "--keys", "k"}, System.out, e));
    assertTrue(err.toString().contains("--output is required"), err.toString());
    assertEquals(2, LongctxMain.run(new String[] {"score", "--bogus"}, System.out, e));
    assertEquals(2, LongctxMain.run(new String[] {"score", "--keys", "/nonexistent/k.parquet", "--queries", "q",
        "--output", tmp.resolve("x").toString()}, System.out, e));
    assertTrue(err.toString().contains("/nonexistent/k.parquet: no such file"), err.toString());
    // Flags that once went through: --scale NaN read as the default scale; --min-tokens 0 crashed half-way
    // (keys written, no queries); a --tokens whose sum over documents wrapped wrote an empty corpus.
    assertEquals(2, LongctxMain.run(new String[] {"score", "--keys", "k", "--queries", "q", "--output", "o",
        "--scale", "NaN"}, System.out, e));
    assertTrue(err.toString().contains("--scale needs a finite number, got NaN"), err.toString());
    String g = tmp.resolve("g").toString();
    assertEquals(2, LongctxMain.run(new String[] {"gen", "--docs", "2", "--tokens", "10", "--min-tokens", "0",
        "--output", g}, System.out, e));
    assertTrue(err.toString().contains("--min-tokens must be 1..10"), err.toString());
    assertEquals(2, LongctxMain.run(new String[] {"gen", "--docs", "2", "--tokens", "10", "--min-tokens", "-1",
        "--output", g}, System.out, e));
    assertTrue(err.toString().contains("--min-tokens must be 1..10 (--tokens), got -1"), err.toString());
    assertEquals(2, LongctxMain.run(new String[] {"gen", "--docs", "3", "--tokens", "4611686018427387904",
        "--output", g}, System.out, e));
    assertTrue(err.toString().contains("more tokens than a long counts"), err.toString());
    assertEquals(2, LongctxMain.run(new String[] {"demo", "--ppl-only", "--ppl-tokens", "0"}, System.out, e));
    assertTrue(err.toString().contains("demo --ppl-only --ppl-tokens 0 runs nothing"), err.toString());
    // A missing value took the next option as the value: a folder named --prefill, the flag never applied.
    assertEquals(2, LongctxMain.run(new String[] {"gen", "--docs", "1", "--tokens", "16", "--output", "--prefill"},
        System.out, e));
    assertTrue(err.toString().contains("--output needs a value, got the option --prefill"), err.toString());
    assertFalse(Files.exists(Path.of("--prefill")), "no folder named after the option");
    // An option given twice: the last won in silence. A count past int named no limit.
    assertEquals(2, LongctxMain.run(new String[] {"score", "--keys", "k", "--queries", "q", "--output", "o1",
        "--output", "o2"}, System.out, e));
    assertTrue(err.toString().contains("--output is given twice (o1, then o2)"), err.toString());
    assertEquals(2, LongctxMain.run(new String[] {"score", "--keys", "k", "--queries", "q", "--output", "o",
        "--chunk-len", "4611686018427387904"}, System.out, e));
    assertTrue(err.toString().contains("--chunk-len needs an integer between -2147483648 and 2147483647, got "
        + "4611686018427387904"),
        err.toString());
    // A softcap below float32's range was read as 0: no cap.
    assertEquals(2, LongctxMain.run(new String[] {"score", "--keys", "k", "--queries", "q", "--output", "o",
        "--softcap", "1e-50"}, System.out, e));
    assertTrue(err.toString().contains("--softcap 1.0E-50 is below float32's range"), err.toString());
    // An explicit 0 for a count that is inferred when left out was read as not given.
    for (String opt : new String[] {"--heads", "--kv-heads", "--dim", "--partitions"}) {
      assertEquals(2, LongctxMain.run(new String[] {"score", "--keys", "k", "--queries", "q", "--output", "o", opt, "0"},
          System.out, e));
      assertTrue(err.toString().contains(opt + " must be >= 1, got 0"), err.toString());
    }
    assertEquals(2, LongctxMain.run(new String[] {"gen", "--docs", "2", "--tokens", "10", "--partitions", "0",
        "--output", g}, System.out, e));
    assertTrue(err.toString().contains("--partitions must be >= 1, got 0"), err.toString());
    assertEquals(2, LongctxMain.run(new String[] {"gen", "--heads", "3", "--kv-heads", "2", "--output", g}, System.out, e));
    assertTrue(err.toString().contains("--heads (3) must be a multiple of --kv-heads (2)"), err.toString());
    // spark-bench was told of gen's options (docs, queries-per-doc, format) that it does not take
    assertEquals(2, LongctxMain.run(new String[] {"spark-bench", "--tokens", "0"}, System.out, e));
    assertTrue(err.toString().contains("--tokens must be >= 1, got 0"), err.toString());
    // Shapes and counts past what the generator (or score) can handle: an int product wrapped to 0 wrote
    // empty vectors, --docs 2^31-1 and a huge dim ended in stack traces, --dim 1025 wrote what score refuses.
    String[][] big = {{"--heads", "65536", "--kv-heads", "65536", "--dim", "1024"}, {"--docs", "2147483647"},
        {"--dim", "1025"}};
    String[] says = {"--heads 65536 x --dim 1024 floats per vector is above", "--docs must be <= 100000000",
        "--dim 1025 is above the kernels' maximum 1024"};
    for (int i = 0; i < big.length; i++) {
      err.reset();
      List<String> args = new ArrayList<>(List.of("gen", "--output", g));
      args.addAll(List.of(big[i]));
      assertEquals(2, LongctxMain.run(args.toArray(String[]::new), System.out, e), err.toString());
      assertTrue(err.toString().contains(says[i]), err.toString());
    }
    assertTrue(!java.nio.file.Files.exists(tmp.resolve("g")), "nothing written");
    // spark-bench --runs 0 ran once; demo --tokens 0 failed inside the job. Both refused before any work.
    assertEquals(2, LongctxMain.run(new String[] {"spark-bench", "--runs", "0"}, System.out, e));
    assertTrue(err.toString().contains("--chunk-len and --runs must be >= 1, got 8192 and 0"), err.toString());
    assertEquals(2, LongctxMain.run(new String[] {"demo", "--tokens", "0"}, System.out, e));
    assertTrue(err.toString().contains("demo needs --tokens >= 1"), err.toString());
    // A bad --conf value: Spark's own message names neither property nor value, its cause does.
    assertEquals("Error while instantiating 'B': spark.sql.shuffle.partitions should be int, but was abc",
        LongctxMain.withCauses(new IllegalArgumentException("Error while instantiating 'B':",
            new IllegalArgumentException("spark.sql.shuffle.partitions should be int, but was abc"))));
    // demo --dir over a user's folder replaced its keys.parquet and scores.parquet: now refused, untouched.
    java.nio.file.Path mine = java.nio.file.Files.createDirectories(tmp.resolve("mine").resolve("scores.parquet"));
    assertEquals(2, LongctxMain.run(new String[] {"demo", "--dir", mine.getParent().toString()}, System.out, e));
    assertTrue(err.toString().contains("holds files demo did not make (scores.parquet)"), err.toString());
    try (java.util.stream.Stream<Path> left = Files.list(mine.getParent())) {
      assertEquals(List.of(mine), left.toList(), "nothing added");
    }
    assertEquals(2, LongctxMain.run(new String[] {"spark-bench", "--dir", mine.getParent().toString()}, System.out, e));
    assertTrue(err.toString().contains("holds files spark-bench did not make (scores.parquet)"), err.toString());
    java.nio.file.Path fresh = tmp.resolve("fresh-demo");
    OutputCommit.claimWorkDir(fresh, "demo", false); // checked before the session starts: nothing made yet
    assertTrue(!Files.exists(fresh), "a session that fails to start leaves no folder");
    OutputCommit.claimWorkDir(fresh, "demo", true); // a new directory is marked as the demo's: a re-run may use it
    Files.createDirectories(fresh.resolve("scores.parquet"));
    OutputCommit.claimWorkDir(fresh, "demo", true);
    assertTrue(Files.exists(fresh.resolve(".longctx-demo")));
    assertThrows(InputError.class, () -> OutputCommit.claimWorkDir(fresh, "spark-bench", false),
        "the demo's, not spark-bench's");
    // gen --queries-per-doc 0 over an earlier run's output left its queries beside the new keys.
    assertEquals(0, LongctxMain.run(new String[] {"gen", "--docs", "2", "--tokens", "10", "--output", g}, System.out, e));
    assertEquals(2, LongctxMain.run(new String[] {"gen", "--docs", "2", "--tokens", "12", "--queries-per-doc", "0",
        "--overwrite", "--output", g}, System.out, e));
    assertTrue(err.toString().contains("from an earlier run, and --queries-per-doc 0 writes none"), err.toString());
    // A bad -D setting of the operator or of ppl ended in a stack trace (bench) or a "MODEL dir" error (ppl);
    // every command now refuses it first, naming the property.
    String before = System.setProperty(io.longctx.djl.AttentionOp.PATH_PROPERTY, "fastest");
    try {
      assertEquals(2, LongctxMain.run(new String[] {"gen", "--docs", "2", "--tokens", "10", "--output", g + "2"},
          System.out, e));
      assertTrue(err.toString().contains("longctx gen: error: -Dlongctx.op.path must be auto, java or libtorch, got "
          + "'fastest'"), err.toString());
      assertTrue(!java.nio.file.Files.exists(tmp.resolve("g2")), "nothing written");
      // Help and an unknown command are answered as they are.
      assertEquals(0, LongctxMain.run(new String[] {"gen", "--help"}, new PrintStream(new ByteArrayOutputStream()), e));
      ByteArrayOutputStream unknown = new ByteArrayOutputStream();
      assertEquals(2, LongctxMain.run(new String[] {"bogus"}, System.out, new PrintStream(unknown, true)));
      assertTrue(unknown.toString().startsWith("longctx: unknown command 'bogus'"), unknown.toString());
    } finally {
      if (before == null) {
        System.clearProperty(io.longctx.djl.AttentionOp.PATH_PROPERTY);
      } else {
        System.setProperty(io.longctx.djl.AttentionOp.PATH_PROPERTY, before);
      }
    }
    ByteArrayOutputStream out = new ByteArrayOutputStream();
    for (String cmd : new String[] {"score", "gen", "demo"}) {
      assertEquals(0, LongctxMain.run(new String[] {cmd, "--help"}, new PrintStream(out, true), e));
    }
    assertTrue(out.toString().contains("--chunk-len") && out.toString().contains("--queries-per-doc"));
  }

  /**
   * Inputs that once ended in a stack trace (exit 1) or in an empty answer: a glob matching nothing, a
   * file Spark skips as hidden, JSON Lines read as Parquet (no .jsonl name, no --format), and gen onto
   * a file. Each is exit 2 naming the path.
   */
  @Test
  void pathsThatReadNothingOrTheWrongFormat() throws Exception {
    TestData d = good();
    Path keys = d.writeKeys(spark, tmp, "parquet", false), queries = d.writeQueries(spark, tmp, "parquet");
    fails(tmp.resolve("nothing-*.parquet"), queries, "nothing-*.parquet: no file or directory matches");
    Path hidden = tmp.resolve("_keys.parquet");
    try (var parts = Files.list(keys)) {
      Files.copy(parts.filter(p -> p.getFileName().toString().endsWith(".parquet")).findFirst().orElseThrow(), hidden);
    }
    fails(hidden, queries, "_keys.parquet: Spark skips files whose names start with '_' or '.'");
    Path jsonDir = tmp.resolve("keys-as-json");
    Files.move(d.writeKeys(spark, tmp, "json", false), jsonDir);
    fails(jsonDir, queries, "KEYS " + jsonDir, "is not a Parquet file", "--format json");
    // An empty directory, or one with only _SUCCESS (what a failed upstream step leaves): Spark cannot
    // infer a schema; named, exit 2.
    Path empty = Files.createDirectories(tmp.resolve("empty-keys"));
    fails(empty, queries, "KEYS " + empty, "no data files to read");
    Files.writeString(empty.resolve("_SUCCESS"), "");
    fails(empty, queries, "KEYS " + empty, "no data files to read");
    // Two part files that disagree on pos's type (int32, then int64): a task fails reading the second.
    Path mixed = Files.createDirectories(tmp.resolve("mixed-keys"));
    var all = spark.read().parquet(keys.toString());
    var asInt = all.where("pos < 4").withColumn("pos", org.apache.spark.sql.functions.col("pos").cast("int"));
    var asLong = all.where("pos >= 4");
    int i = 0;
    for (var part : List.of(asInt, asLong)) {
      Path one = tmp.resolve("part-src-" + i);
      part.coalesce(1).write().parquet(one.toString());
      try (var files = Files.list(one)) {
        Files.copy(files.filter(f -> f.getFileName().toString().endsWith(".parquet")).findFirst().orElseThrow(),
            mixed.resolve("part-" + i++ + ".parquet"));
      }
    }
    fails(mixed, queries, "part-1.parquet", "column [pos]", "disagree on this column's type");
    Path file = Files.writeString(tmp.resolve("a-file"), "mine");
    ByteArrayOutputStream err = new ByteArrayOutputStream();
    assertEquals(2, LongctxMain.run(new String[] {"gen", "--docs", "1", "--tokens", "10", "--output", file.toString()},
        System.out, new PrintStream(err, true)), err.toString());
    assertTrue(err.toString().contains("--output " + file + " is a file"), err.toString());
    assertEquals("mine", Files.readString(file));
  }

  /**
   * Inputs a review found answered wrongly or with the wrong error: a file in a plain subfolder of a
   * KEYS folder was left out by Spark's reader in silence (exit 0, its keys missing from the answers);
   * key rows without pos (a misspelled JSON field) gave "no key rows"; a file that is not Parquet
   * among Parquet ones, read by a task, was exit 1 with a stack trace; a glob in the first name of a
   * path made the whole working folder count as the input, refusing an output beside it.
   */
  @Test
  void inputsReadPartlyOrReportedWrongly() throws Exception {
    TestData d = good();
    Path queries = d.writeQueries(spark, tmp, "parquet");
    Path keys = d.writeKeys(spark, tmp, "parquet", false);
    Path nested = tmp.resolve("nested-keys");
    Files.createDirectories(nested.resolve("late"));
    try (var parts = Files.list(keys)) {
      List<Path> ps = parts.filter(f -> f.getFileName().toString().endsWith(".parquet")).sorted().toList();
      Files.copy(ps.get(0), nested.resolve("part-0.parquet"));
      for (int i = 1; i < ps.size(); i++) {
        Files.copy(ps.get(i), nested.resolve("late").resolve("part-" + i + ".parquet"));
      }
    }
    fails(nested, queries, "KEYS " + nested, "nested-keys/late/part-", ".parquet would not be read",
        "not those of other subfolders");
    // key=value partition folders are read, and taken as they are.
    Path partitioned = tmp.resolve("partitioned-keys");
    spark.read().parquet(keys.toString()).withColumn("batch", org.apache.spark.sql.functions.expr("pos % 2")).write()
        .partitionBy("batch").parquet(partitioned.toString());
    ByteArrayOutputStream err = new ByteArrayOutputStream();
    assertEquals(0, LongctxMain.run(new String[] {"score", "--keys", partitioned.toString(), "--queries",
        queries.toString(), "--output", tmp.resolve("from-partitions").toString(), "--dim", "8", "--causal",
        "--chunk-len", "8"}, System.out, new PrintStream(err, true)), err.toString());

    Path noPos = tmp.resolve("no-pos.jsonl");
    List<String> lines = new ArrayList<>();
    for (String line : Files.readAllLines(firstPart(d.writeKeys(spark, tmp, "json", false), ".json"))) {
      lines.add(line.replace("\"pos\"", "\"position\""));
    }
    Files.write(noPos, lines);
    fails(noPos, queries, "KEYS file", "no-pos.jsonl", "column 'pos' is missing or null");

    Path junk = tmp.resolve("keys-with-junk");
    Files.createDirectories(junk);
    Files.copy(firstPart(keys, ".parquet"), junk.resolve("part-0.parquet"));
    Files.writeString(junk.resolve("zzz-notes.txt"), "notes");
    fails(junk, queries, "zzz-notes.txt is not a Parquet file");

    Path c1 = Files.createDirectories(tmp.resolve("c1"));
    Files.move(keys, c1.resolve("keys.parquet"));
    err.reset();
    assertEquals(0, LongctxMain.run(new String[] {"score", "--keys", tmp + "/c[1]/keys.parquet", "--queries",
        queries.toString(), "--output", tmp.resolve("beside-a-glob").toString(), "--dim", "8", "--causal",
        "--chunk-len", "8"}, System.out, new PrintStream(err, true)), err.toString());
  }

  static Path firstPart(Path dir, String suffix) throws java.io.IOException {
    try (var parts = Files.list(dir)) {
      return parts.filter(f -> f.getFileName().toString().endsWith(suffix)).sorted().findFirst().orElseThrow();
    }
  }

  /**
   * Finite q and k whose score overflows float32 are bad input found inside a task: exit 2 naming the
   * document, the query (or token) and the key's position, in decode (-Infinity) and prefill (+Infinity).
   */
  @Test
  void scoresThatOverflowFloat32AreBadInputNamedByPlace() throws Exception {
    TestData d = good();
    float[] big = new float[16], neg = new float[8], pos = new float[8];
    java.util.Arrays.fill(big, 3e19f);
    java.util.Arrays.fill(neg, -3e19f);
    java.util.Arrays.fill(pos, 3e19f);
    d.queries.set(0, new TestData.Query("q1", "alpha", 10L, big));
    fails(keysWith(d, "alpha", 5, "k", TestData.boxed(neg), false), d.writeQueries(spark, tmp, "parquet"), "doc 'alpha'",
        "query 'q1' (pos 10)", "key at pos 5", "-Infinity", "overflows");
    Path twice = tmp.resolve("prefill");
    TestData p = good();
    List<Row> rows = new ArrayList<>();
    for (Row r : p.keyRows(true)) {
      Object[] x = new Object[r.length()];
      for (int i = 0; i < x.length; i++) {
        x[i] = r.get(i);
      }
      if (r.getString(0).equals("alpha") && r.getLong(1) == 4) {
        x[2] = TestData.boxed(pos); // k at pos 4
      }
      if (r.getString(0).equals("alpha") && r.getLong(1) == 7) {
        x[4] = TestData.boxed(big); // q at pos 7
      }
      rows.add(RowFactory.create(x));
    }
    TestData.write(spark, rows, TestData.keysSchema(true), "parquet", twice, 2);
    fails(twice, null, "doc 'alpha'", "the token at pos 7", "key at pos 4", "overflows");
  }

  /**
   * A --scale (or softcap) float32 cannot apply is the option's fault, said before any job: it ran the
   * jobs and a task named the data's first pair as the cause.
   */
  @Test
  void scaleOutsideFloat32IsNamedAsTheOption() throws Exception {
    TestData d = good();
    Path keys = d.writeKeys(spark, tmp, "parquet", false), queries = d.writeQueries(spark, tmp, "parquet");
    for (String[] opt : new String[][] {{"--scale", "1e300"}, {"--scale", "1e-50"}, {"--softcap", "1e-40"}}) {
      ByteArrayOutputStream err = new ByteArrayOutputStream();
      int rc = LongctxMain.run(new String[] {"score", "--keys", keys.toString(), "--queries", queries.toString(),
          "--output", tmp.resolve("out").toString(), "--dim", "8", opt[0], opt[1]}, System.out, new PrintStream(err, true));
      assertEquals(2, rc, err.toString());
      assertTrue(err.toString().contains("--scale / --softcap: the score scale"), err.toString());
      assertFalse(Files.exists(tmp.resolve("out")));
    }
  }

  /** A Parquet file read as JSON is named as such (not its raw bytes); --output-format is separate. */
  @Test
  void parquetReadAsJsonIsNamedAndTheOutputFormatIsItsOwn() throws Exception {
    TestData d = good();
    Path keys = d.writeKeys(spark, tmp, "parquet", false);
    Path queries = d.writeQueries(spark, tmp, "parquet");
    Run r = score(keys, queries, "--dim", "8", "--format", "json");
    assertEquals(2, r.rc(), r.err());
    assertTrue(r.err().contains("Parquet file read as JSON") && !r.err().contains("PAR1\u0015")
        && !r.err().contains("doc 'null'"), r.err());
    assertFalse(Files.exists(tmp.resolve("o")));
    r = score(keys, queries, "--dim", "8", "--output-format", "json");
    assertEquals(0, r.rc(), r.err());
    assertEquals(2, Outputs.read(spark, tmp.resolve("o"), "json", false).size(), "JSON output from Parquet input");
  }

  /** --heads * --dim is checked in long arithmetic: 536870914 * 8 wraps to 16 in an int. */
  @Test
  void shapeArithmeticDoesNotWrap() throws Exception {
    TestData d = good();
    ByteArrayOutputStream err = new ByteArrayOutputStream();
    int rc = LongctxMain.run(new String[] {"score", "--keys", d.writeKeys(spark, tmp, "parquet", false).toString(),
        "--queries", d.writeQueries(spark, tmp, "parquet").toString(), "--output", tmp.resolve("o").toString(),
        "--heads", "536870914", "--dim", "8"}, System.out, new PrintStream(err, true));
    assertEquals(2, rc, err.toString());
    assertTrue(err.toString().contains("heads=536870914") && err.toString().contains("does not match the data"),
        err.toString());
  }

  // ---------------------------------------------------------------- the rest of the matrix (docs/RELIABILITY.md)

  @Test
  void schemaWrongColumnTypes() throws Exception {
    TestData d = good();
    Path queries = d.writeQueries(spark, tmp, "parquet");
    // pos as a string column.
    Path strPos = tmp.resolve("string-pos.parquet");
    spark.createDataFrame(d.keyRows(false), TestData.keysSchema(false)).withColumn("pos",
        org.apache.spark.sql.functions.col("pos").cast("string")).write().parquet(strPos.toString());
    fails(strPos, queries, "KEYS", "string-pos.parquet", "column 'pos' has type string", "expected an integer type");
    // k as a plain float, not an array.
    Path scalarK = tmp.resolve("scalar-k.parquet");
    spark.createDataFrame(d.keyRows(false), TestData.keysSchema(false)).withColumn("k",
        org.apache.spark.sql.functions.lit(1.5f)).write().parquet(scalarK.toString());
    fails(scalarK, queries, "KEYS", "scalar-k.parquet", "column 'k' has type float", "expected array<float>");
    // A column the mode does not read is not judged (decode KEYS with a string 'q'): as JSON, which reads the
    // columns it needs alone, already did.
    Path extraQ = tmp.resolve("extra-q.parquet");
    spark.createDataFrame(d.keyRows(false), TestData.keysSchema(false)).withColumn("q",
        org.apache.spark.sql.functions.lit("note")).write().parquet(extraQ.toString());
    ByteArrayOutputStream err = new ByteArrayOutputStream();
    assertEquals(0, LongctxMain.run(new String[] {"score", "--keys", extraQ.toString(), "--queries", queries.toString(),
        "--output", tmp.resolve("extra-out").toString(), "--dim", "8"}, System.out, new PrintStream(err, true)),
        err.toString());
    // JSON: a value of the wrong type in one line names the file and the line.
    Path kj = d.writeKeys(spark, tmp.resolve("j"), "json", false);
    Path qj = tmp.resolve("queries-bad-line.jsonl");
    Files.createDirectories(qj);
    Files.writeString(qj.resolve("part-0.json"), "{\"query_id\":\"q1\",\"doc_id\":\"alpha\",\"q\":" + floats(16)
        + ",\"pos\":3}\n{\"query_id\":\"q2\",\"doc_id\":\"alpha\",\"q\":" + floats(16) + ",\"pos\":\"late\"}\n");
    fails(kj, qj, "QUERIES file", "queries-bad-line.jsonl/part-0.json, line 2", "malformed JSON record",
        "\"pos\":\"late\"");
  }

  /** A JSON row without one of its identifying fields is named by its line (Spark's reader gives none). */
  @Test
  void jsonRowsWithoutTheirIdsAreNamedByLine() throws Exception {
    TestData d = good();
    Path kj = d.writeKeys(spark, tmp.resolve("ids"), "json", false);
    Path queries = d.writeQueries(spark, tmp, "parquet");
    Path keyFile = firstPart(kj, ".json");
    List<String> keyLines = Files.readAllLines(keyFile);
    Files.delete(keyFile.resolveSibling("." + keyFile.getFileName() + ".crc")); // edited below
    // line 3 of the first part: doc_id misspelled; line 4: pos null
    List<String> noDoc = new ArrayList<>(keyLines);
    noDoc.set(2, noDoc.get(2).replace("\"doc_id\"", "\"doc\""));
    Files.write(keyFile, noDoc);
    fails(kj, queries, keyFile.getFileName() + ", line 3: a row has no doc_id");
    List<String> noPos = new ArrayList<>(keyLines);
    noPos.set(3, noPos.get(3).replaceFirst("\"pos\":\\d+", "\"pos\":null"));
    Files.write(keyFile, noPos);
    String doc = new com.google.gson.Gson().fromJson(noPos.get(3), java.util.Map.class).get("doc_id").toString();
    fails(kj, queries, keyFile.getFileName() + ", line 4, doc '" + doc + "': column 'pos' is missing or null");
    Files.write(keyFile, keyLines);

    // In Parquet, by the row's index in its file (Spark's _metadata.row_index, from 0).
    Dataset<Row> rows = spark.read().json(keyFile.toString());
    List<Row> all = new ArrayList<>(rows.collectAsList());
    int docAt = rows.schema().fieldIndex("doc_id"), posAt = rows.schema().fieldIndex("pos");
    Object[] noDocRow = new Object[all.get(2).size()], noPosRow = new Object[all.get(3).size()];
    for (int i = 0; i < noDocRow.length; i++) {
      noDocRow[i] = i == docAt ? null : all.get(2).get(i);
      noPosRow[i] = i == posAt ? null : all.get(3).get(i);
    }
    all.set(2, org.apache.spark.sql.RowFactory.create(noDocRow));
    Path kp = tmp.resolve("ids-parquet");
    spark.createDataFrame(all, rows.schema()).coalesce(1).write().parquet(kp.toString());
    fails(kp, queries, ".parquet, row_index 2: a row has no doc_id");
    all.set(2, rows.collectAsList().get(2));
    all.set(3, org.apache.spark.sql.RowFactory.create(noPosRow));
    Path kp2 = tmp.resolve("pos-parquet");
    spark.createDataFrame(all, rows.schema()).coalesce(1).write().parquet(kp2.toString());
    fails(kp2, queries, ".parquet, row_index 3, doc '" + doc + "': column 'pos' is missing or null");

    // A file edited by hand beside the checksum file Spark wrote with it: named, with what to do.
    Path edited = d.writeKeys(spark, tmp.resolve("edited"), "json", false);
    Path part = firstPart(edited, ".json");
    Files.writeString(part, Files.readString(part).replaceFirst("\"pos\":(\\d+)", "\"pos\": $1"));
    fails(edited, queries, part.getFileName() + ": its bytes do not match its checksum file ." + part.getFileName()
        + ".crc beside it", "delete that .crc file");
    // Hadoop's message, wrapped as a task failure, for a path with spaces
    InputError named = InputError.find(new RuntimeException("Job aborted", new org.apache.hadoop.fs.ChecksumException(
        "Checksum error: file:/data/my keys/part 0.json at 0 exp: 1 got: 2", 0)));
    assertTrue(named != null && named.getMessage().startsWith("file file:/data/my keys/part 0.json: its bytes do not "
        + "match its checksum file .part 0.json.crc"), String.valueOf(named));
    // data past what the .crc covers (text appended to a file of a whole number of checksum chunks)
    named = InputError.find(new RuntimeException("Job aborted", new org.apache.hadoop.fs.ChecksumException(
        "Checksum error: /data/keys/part-0.json at 512", 512)));
    assertTrue(named != null && named.getMessage().startsWith("file /data/keys/part-0.json: its bytes do not match"),
        String.valueOf(named));

    Path qj = Files.createDirectories(tmp.resolve("queries-ids.jsonl"));
    String q = ",\"q\":" + floats(16) + ",\"pos\":3}";
    Files.writeString(qj.resolve("part-0.json"), "{\"query_id\":\"q1\",\"doc_id\":\"alpha\"" + q + "\n"
        + "{\"query_id\":\"q2\",\"doc_id\":\"beta\"" + q + "\n{\"doc_id\":\"alpha\"" + q + "\n");
    fails(kj, qj, "queries-ids.jsonl/part-0.json, line 3, query 'null', doc 'alpha'",
        "column 'query_id' is missing or null");
    Files.writeString(qj.resolve("part-0.json"), "{\"query_id\":\"q1\",\"doc_id\":\"alpha\"" + q + "\n"
        + "{\"query_id\":\"q2\",\"doc_id\":null" + q + "\n");
    fails(kj, qj, "queries-ids.jsonl/part-0.json, line 2, query 'q2', doc 'null'", "column 'doc_id' is missing or null");
  }

  /**
   * Spark's JSON reader reads an id holding a lone UTF-16 surrogate escape (not Unicode) as '?': two
   * documents that differ only there were scored as one document 'x?' of both's keys, with exit 0.
   * Refused now, naming the line; an id that holds a '?' of its own is an id like any other.
   */
  @Test
  void jsonIdsWithALoneSurrogateAreRefusedByLine() throws Exception {
    TestData d = good();
    Path merged = d.writeKeys(spark, tmp.resolve("sur"), "json", true);
    editParts(merged, l -> l.replace("\"doc_id\":\"alpha\"", "\"doc_id\":\"x\\ud800\"")
        .replace("\"doc_id\":\"beta\"", "\"doc_id\":\"x\\udc00\""));
    fails(merged, null, ".json, line 1: doc_id 'x\\ud", "' holds a lone UTF-16 surrogate (\\ud", ") at character 1");

    Path asked = d.writeKeys(spark, tmp.resolve("asked"), "json", true);
    editParts(asked, l -> l.replace("\"doc_id\":\"alpha\"", "\"doc_id\":\"al?pha\""));
    Path out = tmp.resolve("asked-out.jsonl");
    ByteArrayOutputStream err = new ByteArrayOutputStream();
    assertEquals(0, LongctxMain.run(new String[] {"score", "--keys", asked.toString(), "--output", out.toString(),
        "--dim", "8", "--causal", "--chunk-len", "8", "--mode", "prefill"}, System.out, new PrintStream(err, true)),
        err.toString());
    assertEquals(30, spark.read().json(out.toString()).where("doc_id = 'al?pha'").count());

    Path kj = d.writeKeys(spark, tmp.resolve("keys"), "json", false);
    Path qj = Files.createDirectories(tmp.resolve("queries-sur.jsonl"));
    String q = ",\"q\":" + floats(16) + ",\"pos\":3}";
    Files.writeString(qj.resolve("part-0.json"), "{\"query_id\":\"q1?\",\"doc_id\":\"alpha\"" + q + "\n"
        + "{\"query_id\":\"q\\udbff\",\"doc_id\":\"beta\"" + q + "\n");
    fails(kj, qj, "queries-sur.jsonl/part-0.json, line 2: query_id 'q\\udbff' holds a lone UTF-16 surrogate");
    // a raw byte that is not UTF-8 (Latin-1): the reason, where Spark said "malformed" alone
    Files.write(qj.resolve("part-0.json"), ("{\"query_id\":\"q1\",\"doc_id\":\"alpha\"" + q + "\n"
        + "{\"query_id\":\"q\u00e9\",\"doc_id\":\"beta\"" + q + "\n").getBytes(java.nio.charset.StandardCharsets.ISO_8859_1));
    fails(kj, qj, "queries-sur.jsonl/part-0.json, line 2: not valid UTF-8 (JSON Lines files must be UTF-8): byte E9 at "
        + "byte offset 14 of the line");
  }

  /** Rewrites every line of a folder's JSON part files (their checksum files dropped). */
  static void editParts(Path dir, java.util.function.UnaryOperator<String> edit) throws java.io.IOException {
    try (var parts = Files.list(dir)) {
      for (Path f : parts.filter(f -> f.getFileName().toString().endsWith(".json")).toList()) {
        Files.deleteIfExists(f.resolveSibling("." + f.getFileName() + ".crc"));
        Files.write(f, Files.readAllLines(f).stream().map(edit).toList());
      }
    }
  }

  @Test
  void emptyArraysAreAnArrayLengthError() throws Exception {
    TestData d = good();
    Path keys = keysWith(d, "beta", 110, "v", List.of(), false);
    fails(keys, d.writeQueries(spark, tmp, "parquet"), "bad-keys.parquet/part-", "doc 'beta'", "pos 110",
        "v has 0 floats, expected 8");
  }

  @Test
  void nullElementInsideAVector() throws Exception {
    TestData d = good();
    List<Float> k = new ArrayList<>(TestData.boxed(d.vec(8)));
    k.set(5, null);
    Path keys = keysWith(d, "alpha", 4, "k", k, false);
    fails(keys, d.writeQueries(spark, tmp, "parquet"), "bad-keys.parquet/part-", "doc 'alpha'", "pos 4",
        "k[5] is null");
  }

  @Test
  void nullElementInTheSecondVectorIsNamedWithItsIndex() throws Exception {
    // k is clean, v holds the null: the message must name v and v's own index, not k's.
    TestData d = good();
    List<Float> v = new ArrayList<>(TestData.boxed(d.vec(8)));
    v.set(2, null);
    Path keys = keysWith(d, "beta", 107, "v", v, false);
    fails(keys, d.writeQueries(spark, tmp, "parquet"), "bad-keys.parquet/part-", "doc 'beta'", "pos 107",
        "v[2] is null");
  }

  @Test
  void nullAfterANaNInOneVectorIsNamedAsTheNull() throws Exception {
    // The read-time check flags NaN and null alike; a null must still be named as a null, at its own index.
    TestData d = good();
    List<Float> k = new ArrayList<>(TestData.boxed(d.vec(8)));
    k.set(1, Float.NaN);
    k.set(6, null);
    Path keys = keysWith(d, "alpha", 9, "k", k, false);
    fails(keys, d.writeQueries(spark, tmp, "parquet"), "bad-keys.parquet/part-", "doc 'alpha'", "pos 9",
        "k[6] is null");
  }

  @Test
  void nanInEveryKeyRowIsReportedAsNaNNotAsAShapeProblem() throws Exception {
    // Vectors with a NaN are held aside while reading; shape resolution must still see their lengths.
    TestData d = good();
    List<Row> rows = new ArrayList<>();
    for (Row r : d.keyRows(false)) {
      Object[] x = new Object[r.length()];
      for (int i = 0; i < x.length; i++) {
        x[i] = r.get(i);
      }
      List<Float> k = new ArrayList<>(TestData.boxed(d.vec(8)));
      k.set(4, Float.NaN);
      x[TestData.keysSchema(false).fieldIndex("k")] = k;
      rows.add(RowFactory.create(x));
    }
    Path keys = tmp.resolve("all-nan.parquet");
    TestData.write(spark, rows, TestData.keysSchema(false), "parquet", keys, 1);
    fails(keys, d.writeQueries(spark, tmp, "parquet"), "all-nan.parquet/part-", "k[4] is NaN");
  }

  /**
   * --causal over queries none of which has a position (here JSON with the field named "position",
   * which reads as absent) would let every query see its whole document: refused, naming the file.
   */
  @Test
  void maskWithoutAnyQueryPositionIsRefused() throws Exception {
    TestData d = new TestData(11, 2, 1, 8).doc("alpha", 30, 0, 1).query("q1", "alpha", 10L).query("q2", "alpha", 3L);
    Path qj = d.writeQueries(spark, tmp, "json");
    try (var files = Files.list(qj)) {
      for (Path f : files.toList()) {
        String name = f.getFileName().toString();
        if (name.endsWith(".crc")) {
          Files.delete(f); // the local file system's checksum of the file as written
        } else if (name.endsWith(".json")) {
          Files.writeString(f, Files.readString(f).replace("\"pos\":", "\"position\":"));
        }
      }
    }
    fails(d.writeKeys(spark, tmp, "json", false), qj, "queries.jsonl", "--causal needs query positions",
        "no query has a 'pos'");
  }

  @Test
  void duplicateQueryIdInADocument() throws Exception {
    TestData d = good().query("q1", "alpha", 20L);
    fails(d.writeKeys(spark, tmp, "parquet", false), d.writeQueries(spark, tmp, "parquet"), "queries.parquet",
        "duplicate query_id 'q1'", "doc 'alpha'");
  }

  @Test
  void emptyDocumentIsAnUnknownDocument() throws Exception {
    // "empty" has no key rows at all: there is no such document in KEYS.
    TestData d = good().doc("empty", 0, 0, 1).query("q7", "empty", 3L);
    fails(d.writeKeys(spark, tmp, "parquet", false), d.writeQueries(spark, tmp, "parquet"), "query 'q7'",
        "document 'empty'", "has no keys");
  }

  @Test
  void emptyQuerySetAndEmptyKeys() throws Exception {
    TestData d = good();
    Path keys = d.writeKeys(spark, tmp, "parquet", false);
    Path none = tmp.resolve("no-queries.parquet");
    TestData.write(spark, List.of(), TestData.QUERIES, "parquet", none, 1);
    fails(keys, none, "QUERIES", "no-queries.parquet", "no query rows");
    Path noKeys = tmp.resolve("no-keys.parquet");
    TestData.write(spark, List.of(), TestData.keysSchema(false), "parquet", noKeys, 1);
    fails(noKeys, d.writeQueries(spark, tmp, "parquet"), "KEYS", "no-keys.parquet", "no key rows");
  }

  @Test
  void negativePositionsAreValid() throws Exception {
    // Positions are absolute token indices of any sign: chunk c = floor(pos / chunk-len).
    long seed = Seeds.forTest();
    TestData d = new TestData(seed, 2, 1, 8).doc("neg", 60, -45, 1).doc("mixed", 40, -100, 7)
        .query("a", "neg", -30L).query("b", "neg", -46L).query("c", "neg", 3L).query("d", "mixed", -1L)
        .query("e", "mixed", null).query("f", "mixed", -100L);
    Path keys = d.writeKeys(spark, tmp, "parquet", false);
    Path queries = d.writeQueries(spark, tmp, "parquet");
    for (io.longctx.kernels.AttentionOptions attn : List.of(io.longctx.kernels.AttentionOptions.DEFAULT.withCausal(true),
        io.longctx.kernels.AttentionOptions.DEFAULT.withCausal(true).withWindow(20))) {
      ScoreOptions o = new ScoreOptions();
      o.keys = keys.toString();
      o.queries = queries.toString();
      o.output = tmp.resolve("neg-" + attn.window()).toString();
      o.dim = 8;
      o.causal = true;
      o.window = attn.window();
      o.chunkLen = 16;
      o.queryBlock = 2;
      ScoreJob.Summary s = ScoreJob.run(spark, o);
      assertEquals(100, s.tokens());
      java.util.Map<String, Outputs.Result> got = Outputs.read(spark, Path.of(o.output), "parquet", false);
      assertEquals(6, got.size());
      for (TestData.Query q : d.queries) {
        Outputs.Result r = got.get(q.id());
        io.longctx.kernels.ReferenceAttention.Result ref = d.reference(q.doc(), q.q(), q.pos(), attn);
        double[] err = Demo.errors(r.o(), r.lse(), ref.o(), ref.lse());
        String what = "query " + q.id() + " at pos " + q.pos() + ", " + attn + " (seed " + seed + ")";
        assertTrue(err[0] <= EndToEndTest.O_TOL && err[1] <= EndToEndTest.LSE_TOL, err[0] + ", " + err[1] + ": " + what);
        assertEquals(d.visibleCount(q.doc(), q.pos(), attn), r.nKeys(), what);
      }
      assertEquals(Float.NEGATIVE_INFINITY, got.get("b").lse()[0], "a query before the first key sees nothing");
    }
  }

  static String floats(int n) {
    StringBuilder b = new StringBuilder("[");
    for (int i = 0; i < n; i++) {
      b.append(i == 0 ? "" : ",").append(0.25 * i);
    }
    return b.append(']').toString();
  }

  static StructType unused() {
    return new StructType().add("x", DataTypes.LongType);
  }
}
