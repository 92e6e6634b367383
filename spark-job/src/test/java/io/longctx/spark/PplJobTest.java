package io.longctx.spark;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotSame;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import ai.djl.huggingface.tokenizers.HuggingFaceTokenizer;
import ai.djl.ndarray.NDManager;
import io.longctx.djl.DocumentScore;
import io.longctx.djl.LlamaModel;
import io.longctx.djl.LlamaTranslator;
import io.longctx.djl.ModelGenerator;
import io.longctx.djl.Safetensors;
import io.longctx.kernels.Seeds;
import java.io.ByteArrayOutputStream;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.SplittableRandom;
import java.util.stream.Collectors;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** {@code longctx ppl} end to end on a generated checkpoint: text and token input, every bad input. */
class PplJobTest {

  @TempDir
  static Path shared;

  static Path model;
  static long seed;
  final SparkSession spark = TestSpark.get();

  @TempDir
  Path tmp;

  static final String TEXT = "The merged result does not depend on how the work was chunked, beyond rounding. "
      + "Grüße — 東京 🙂. Positions are absolute token indices within the document, counted from zero.";

  @BeforeAll
  static void makeModel() throws Exception {
    seed = Seeds.forTest();
    model = shared.resolve("model");
    ModelGenerator.generate(TestModels.small(seed, 2), model);
  }

  int run(ByteArrayOutputStream err, String... args) {
    return LongctxMain.run(args, System.out, new PrintStream(err, true));
  }

  Path jsonl(String name, String... lines) throws Exception {
    Path p = tmp.resolve(name);
    Files.writeString(p, String.join("\n", lines) + "\n", StandardCharsets.UTF_8);
    return p;
  }

  static String tokensJson(int[] t) {
    return Arrays.stream(t).mapToObj(Integer::toString).collect(Collectors.joining(",", "[", "]"));
  }

  /** A copy of the shared model under tmp (file times kept), without the file {@code except} (or null). */
  Path copyOfModel(String name, String except) throws Exception {
    Path dir = Files.createDirectories(tmp.resolve(name));
    try (var files = Files.list(model)) {
      for (Path f : (Iterable<Path>) files::iterator) {
        if (!f.getFileName().toString().equals(except)) {
          Files.copy(f, dir.resolve(f.getFileName()), java.nio.file.StandardCopyOption.COPY_ATTRIBUTES);
        }
      }
    }
    return dir;
  }

  /**
   * The executors' model cache sees a checkpoint replaced by a copy that kept the old modification
   * times (cp -p, rsync -t, tar): the copy is a new file, so its file key differs.
   */
  @Test
  void aCheckpointReplacedWithItsOldTimesIsLoadedAgain() throws Exception {
    Path dir = copyOfModel("model-copy", null);
    PplJob.Loaded first = PplJob.Loaded.get(dir.toString());
    assertSame(first, PplJob.Loaded.get(dir.toString()), "unchanged files: the cached model");
    Path weights;
    try (var files = Files.list(dir)) {
      weights = files.filter(f -> f.getFileName().toString().endsWith(".safetensors")).findFirst().orElseThrow();
    }
    var before = Files.getLastModifiedTime(weights);
    Path fresh = tmp.resolve("fresh.safetensors");
    Files.copy(weights, fresh, java.nio.file.StandardCopyOption.COPY_ATTRIBUTES);
    Files.move(fresh, weights, java.nio.file.StandardCopyOption.REPLACE_EXISTING); // as rsync does: a new file
    Files.setLastModifiedTime(weights, before);
    assertNotSame(first, PplJob.Loaded.get(dir.toString()), "a replaced file with the old time: loaded again");
  }

  /** Replaces dir's weights with a copy (a new file, as rsync writes one): the checkpoint's stamp changes. */
  static void replaceWeights(Path dir) throws java.io.IOException {
    Path weights;
    try (var files = Files.list(dir)) {
      weights = files.filter(f -> f.getFileName().toString().endsWith(".safetensors")).findFirst().orElseThrow();
    }
    Path fresh = dir.resolveSibling(dir.getFileName() + "-fresh.safetensors");
    Files.copy(weights, fresh, java.nio.file.StandardCopyOption.COPY_ATTRIBUTES);
    Files.move(fresh, weights, java.nio.file.StandardCopyOption.REPLACE_EXISTING);
  }

  /**
   * The executors' model cache frees what it no longer needs: a load replaced by a newer one of its
   * checkpoint, and the least recently used beyond {@link PplJob.Loaded#KEPT}. Before, every load
   * stayed in native memory for the life of the JVM.
   */
  @Test
  void staleLoadsAndTheLeastRecentlyUsedBeyondTheKeptOnesAreClosed() throws Exception {
    Path a = copyOfModel("model-a", null), b = copyOfModel("model-b", null), c = copyOfModel("model-c", null);
    PplJob.Loaded first = PplJob.Loaded.get(a.toString());
    replaceWeights(a);
    PplJob.Loaded second = PplJob.Loaded.get(a.toString());
    assertNotSame(first, second);
    assertTrue(first.closed(), "the replaced checkpoint's old load is freed");
    assertThrows(IllegalStateException.class, () -> first.model.config(), "a closed model refuses work");
    assertFalse(second.closed());
    assertEquals(2, PplJob.Loaded.KEPT);
    PplJob.Loaded lb = PplJob.Loaded.get(b.toString()), lc = PplJob.Loaded.get(c.toString());
    assertTrue(second.closed(), "three checkpoints: the least recently used one is freed");
    assertFalse(lb.closed() || lc.closed(), "the two most recent ones stay");
    assertSame(lc, PplJob.Loaded.get(c.toString()));
  }

  static final java.util.concurrent.atomic.AtomicReference<PplJob.Loaded> HELD = new java.util.concurrent.atomic.AtomicReference<>();

  /** A load that a running task got is not freed under it when its checkpoint changes: only when the task completes. */
  @Test
  void aLoadHeldByARunningTaskIsClosedWhenTheTaskCompletes() throws Exception {
    String dir = copyOfModel("model-held", null).toString();
    var jsc = org.apache.spark.api.java.JavaSparkContext.fromSparkContext(spark.sparkContext());
    List<String> seen = jsc.parallelize(List.of(1), 1).map(x -> {
      PplJob.Loaded held = PplJob.Loaded.get(dir);
      HELD.set(held);
      replaceWeights(Path.of(dir));
      PplJob.Loaded fresh = PplJob.Loaded.get(dir); // the held one is stale now
      double sum = held.model.score(new int[] {1, 2, 3, 4}, 2, false).sumLogprob(); // still usable
      return (fresh != held) + " " + held.closed() + " " + Double.isFinite(sum);
    }).collect();
    assertEquals(List.of("true false true"), seen);
    assertTrue(HELD.get().closed(), "freed when the task that held it completed");
    assertFalse(PplJob.Loaded.get(dir).closed());
  }

  /**
   * JSON Lines rows with tokens only, over a checkpoint without tokenizer.json: JSON input always
   * has a text column (its schema is fixed), and the driver used to demand a tokenizer (exit 2)
   * though no row had text; Parquet with the same rows scored. A malformed tokenizer.json likewise.
   */
  @Test
  void tokenRowsInJsonNeedNoTokenizer() throws Exception {
    Path noTokenizer = copyOfModel("model-no-tokenizer", "tokenizer.json");
    Path in = jsonl("tokens.jsonl", "{\"doc_id\": \"a\", \"tokens\": [1, 5, 9, 30, 200, 7]}");
    ByteArrayOutputStream err = new ByteArrayOutputStream();
    assertEquals(0, run(err, "ppl", "--model", noTokenizer.toString(), "--input", in.toString(), "--output",
        tmp.resolve("out").toString()), err.toString());
    Path text = jsonl("text.jsonl", "{\"doc_id\": \"a\", \"tokens\": [1, 5]}", "{\"doc_id\": \"b\", \"text\": \"hi\"}");
    err.reset();
    assertEquals(2, run(err, "ppl", "--model", noTokenizer.toString(), "--input", text.toString(), "--output",
        tmp.resolve("out2").toString()), err.toString());
    assertTrue(err.toString().contains("text input needs a tokenizer"), err.toString());
    // A tokenizer.json that cannot be read stops only an input with text rows.
    Files.writeString(noTokenizer.resolve("tokenizer.json"), "{\"version\": \"1.0\", \"model\": {");
    err.reset();
    assertEquals(0, run(err, "ppl", "--model", noTokenizer.toString(), "--input", in.toString(), "--output",
        tmp.resolve("out3").toString()), err.toString());
    err.reset();
    assertEquals(2, run(err, "ppl", "--model", noTokenizer.toString(), "--input", text.toString(), "--output",
        tmp.resolve("out4").toString()), err.toString());
    assertTrue(err.toString().contains("not a valid tokenizer.json"), err.toString());
  }

  /** Paths with a space (and other characters a URI escapes) are read: the read-all check compares them decoded. */
  @Test
  void inputsUnderAFolderWithASpaceAreRead() throws Exception {
    Path dir = Files.createDirectories(tmp.resolve("my docs %20 #1"));
    Files.writeString(dir.resolve("part 0.jsonl"), "{\"doc_id\": \"a\", \"tokens\": [1, 5, 9, 30]}\n");
    ByteArrayOutputStream err = new ByteArrayOutputStream();
    assertEquals(0, run(err, "ppl", "--model", model.toString(), "--input", dir.toString(), "--format", "json",
        "--output", tmp.resolve("out with space").toString()), err.toString());
    assertEquals(1, spark.read().json(tmp.resolve("out with space").toString()).count());
  }

  @Test
  void textAndTokensMatchTheModel() throws Exception {
    int[] toks = new int[90];
    SplittableRandom r = new SplittableRandom(seed);
    for (int i = 0; i < toks.length; i++) {
      toks[i] = r.nextInt(300);
    }
    Path in = jsonl("docs.jsonl",
        "{\"doc_id\": \"t\", \"text\": " + new com.google.gson.Gson().toJson(TEXT) + "}",
        "{\"doc_id\": \"k\", \"tokens\": " + tokensJson(toks) + "}",
        "{\"doc_id\": \"one\", \"tokens\": [7]}");
    Path out = tmp.resolve("out");
    ByteArrayOutputStream err = new ByteArrayOutputStream();
    int rc = run(err, "ppl", "--model", model.toString(), "--input", in.toString(), "--output", out.toString(),
        "--per-token", "--chunk-len", "7");
    assertEquals(0, rc, err.toString());
    assertTrue(err.toString().contains("longctx ppl summary"), err.toString());
    java.util.regex.Matcher start = java.util.regex.Pattern.compile("longctx ppl: scoring 3 documents \\((\\d+) tokens\\) "
        + "in 3 tasks").matcher(err.toString());
    assertTrue(start.find(), err.toString());
    assertTrue(err.toString().contains("  tokens         " + start.group(1) + "\n"), "the start line's tokens are the "
        + "summary's:\n" + err);
    assertTrue(Files.exists(out.resolve(OutputCommit.MARKER)));
    Map<String, Row> rows = new HashMap<>();
    for (Row row : spark.read().json(out.toString()).collectAsList()) {
      rows.put(row.getAs("doc_id"), row);
    }
    assertEquals(3, rows.size());
    int[] textIds;
    DocumentScore wantText, wantToks;
    try (NDManager m = NDManager.newBaseManager("PyTorch");
        LlamaModel lm = LlamaModel.load(model, m);
        HuggingFaceTokenizer tok = LlamaTranslator.openTokenizer(model)) {
      textIds = LlamaTranslator.encode(tok, TEXT);
      wantText = lm.score(textIds, 7, true);
      wantToks = lm.score(toks, 7, true);
    }
    Row t = rows.get("t");
    assertEquals(textIds.length, ((Number) t.getAs("n_tokens")).longValue());
    assertEquals(wantText.sumLogprob(), (double) t.getAs("sum_logprob"), 0.0, "seed " + seed);
    assertEquals(wantText.perplexity(), (double) t.getAs("ppl"), 1e-12 * wantText.perplexity());
    double bytes = TEXT.getBytes(StandardCharsets.UTF_8).length;
    assertEquals(-wantText.sumLogprob() / Math.log(2) / bytes, (double) t.getAs("bits_per_byte"), 1e-12);
    assertEquals(textIds.length - 1, t.getList(t.fieldIndex("logprobs")).size());
    Row k = rows.get("k");
    assertEquals(90L, ((Number) k.getAs("n_tokens")).longValue(), "token ids scored as given");
    assertEquals(wantToks.sumLogprob(), (double) k.getAs("sum_logprob"), 0.0, "seed " + seed);
    assertTrue(k.isNullAt(k.fieldIndex("bits_per_byte")), "bits per byte only for text");
    List<Object> lp = k.getList(k.fieldIndex("logprobs"));
    for (int i = 0; i < lp.size(); i++) {
      assertEquals(wantToks.logprobs()[i], ((Number) lp.get(i)).floatValue(), 0f);
    }
    Row one = rows.get("one");
    assertEquals(1L, ((Number) one.getAs("n_tokens")).longValue());
    assertEquals(0.0, (double) one.getAs("sum_logprob"));
    assertTrue(one.isNullAt(one.fieldIndex("ppl")));
    // a null is written as null, not left out: every line has every column
    String lines;
    try (var parts = Files.list(out)) {
      lines = parts.filter(f -> f.getFileName().toString().startsWith("part-"))
          .map(f -> { try { return Files.readString(f); } catch (java.io.IOException e) { throw new java.io.UncheckedIOException(e); } })
          .collect(java.util.stream.Collectors.joining());
    }
    assertTrue(lines.contains("\"doc_id\":\"one\",\"n_tokens\":1,\"sum_logprob\":0.0,\"ppl\":null"), lines);
  }

  @Test
  void parquetTokensOnlyHasNoBitsPerByte() throws Exception {
    StructType schema = new StructType().add("doc_id", DataTypes.StringType)
        .add("tokens", DataTypes.createArrayType(DataTypes.IntegerType));
    List<Row> in = new ArrayList<>();
    for (int d = 0; d < 3; d++) {
      in.add(RowFactory.create("d" + d, Arrays.asList(1, 5 + d, 9, 200, 3, 17)));
    }
    Path p = tmp.resolve("in.parquet");
    spark.createDataFrame(in, schema).write().parquet(p.toString());
    Path out = tmp.resolve("out");
    ByteArrayOutputStream err = new ByteArrayOutputStream();
    assertEquals(0, run(err, "ppl", "--model", model.toString(), "--input", p.toString(), "--output",
        out.toString(), "--partitions", "2"), err.toString());
    var df = spark.read().parquet(out.toString());
    assertEquals(List.of("doc_id", "n_tokens", "sum_logprob", "ppl"), Arrays.asList(df.columns()));
    assertEquals(3, df.count());
  }

  /** Asserts exit 2, the fragments on stderr, and no output. */
  void fails(Path in, Path modelDir, String... fragments) {
    Path out = tmp.resolve("out");
    ByteArrayOutputStream err = new ByteArrayOutputStream();
    int rc = run(err, "ppl", "--model", modelDir.toString(), "--input", in.toString(), "--output", out.toString());
    String msg = err.toString();
    assertEquals(2, rc, msg);
    for (String f : fragments) {
      assertTrue(msg.contains(f), "message should contain '" + f + "': " + msg);
    }
    assertFalse(Files.exists(out), "no output after a failure");
  }

  /**
   * Parquet files of one INPUT with different columns (text in one, tokens in another): Spark took
   * one file's columns, and the other's rows were refused as having "neither" text nor tokens.
   */
  @Test
  void parquetFilesWithDifferentColumnsAreOneInput() throws Exception {
    Path in = tmp.resolve("mixed");
    spark.createDataFrame(List.of(RowFactory.create("t", TEXT)), new StructType().add("doc_id", DataTypes.StringType)
        .add("text", DataTypes.StringType)).write().parquet(in.toString());
    spark.createDataFrame(List.of(RowFactory.create("k", List.of(4, 5, 6, 7))), new StructType()
        .add("doc_id", DataTypes.StringType).add("tokens", DataTypes.createArrayType(DataTypes.IntegerType)))
        .write().mode("append").parquet(in.toString());
    Path out = tmp.resolve("mixed-out");
    ByteArrayOutputStream err = new ByteArrayOutputStream();
    assertEquals(0, run(err, "ppl", "--model", model.toString(), "--input", in.toString(), "--output", out.toString(),
        "--output-format", "json"), err.toString());
    Map<String, Long> tokens = new HashMap<>();
    for (Row r : spark.read().json(out.toString()).collectAsList()) {
      tokens.put(r.getAs("doc_id"), r.getAs("n_tokens"));
    }
    assertEquals(4L, tokens.get("k"), tokens.toString());
    assertTrue(tokens.containsKey("t") && tokens.size() == 2, tokens.toString());
    // Integer doc_ids are read as text (as JSON's are), tokens of any integer type (tinyint was refused).
    Path ints = tmp.resolve("int-ids");
    spark.createDataFrame(List.of(RowFactory.create(7, List.of((byte) 4, (byte) 5, (byte) 6))), new StructType()
        .add("doc_id", DataTypes.IntegerType).add("tokens", DataTypes.createArrayType(DataTypes.ByteType)))
        .write().parquet(ints.toString());
    Path intsOut = tmp.resolve("int-ids-out");
    assertEquals(0, run(err, "ppl", "--model", model.toString(), "--input", ints.toString(), "--output",
        intsOut.toString(), "--output-format", "json"), err.toString());
    Row r = spark.read().json(intsOut.toString()).first();
    assertEquals("7", r.getAs("doc_id"));
    assertEquals(3L, (long) r.<Long>getAs("n_tokens"));
  }

  /** One task per document up to 8 per core: 2,000 short documents were 2,000 tasks and part files. */
  @Test
  void defaultPartitionsAreBoundedByTheCores() {
    assertEquals(3, PplJob.defaultPartitions(3, 2));
    assertEquals(16, PplJob.defaultPartitions(2000, 2));
    assertEquals(800, PplJob.defaultPartitions(1_000_000, 100));
    assertEquals(1, PplJob.defaultPartitions(1, 0));
  }

  /** A tokenizer whose ids pass the model's vocabulary: the checkpoint is named, not the document. */
  @Test
  void aTokenizerThatDoesNotFitTheModelIsNamed() throws Exception {
    ModelGenerator.Spec s = TestModels.small(seed, 1);
    s.vocab = 259;
    Path small = tmp.resolve("vocab259");
    ModelGenerator.generate(s, small);
    Files.copy(model.resolve("tokenizer.json"), small.resolve("tokenizer.json"),
        java.nio.file.StandardCopyOption.REPLACE_EXISTING);
    fails(jsonl("tx.jsonl", "{\"doc_id\": \"tx\", \"text\": \"The quick brown fox jumps over the lazy dog\"}"), small,
        "MODEL " + small, "tokenizer.json does not fit config.json's vocab_size", "doc 'tx'", "outside the vocabulary [0, 259)");
  }

  @Test
  void badInputNamesTheDocument() throws Exception {
    fails(jsonl("a.jsonl", "{\"doc_id\": \"ok\", \"tokens\": [1, 2]}", "{\"doc_id\": \"big\", \"tokens\": [1, 300]}"),
        model, "doc 'big'", "300", "position 1", "vocabulary");
    fails(jsonl("b.jsonl", "{\"doc_id\": \"both\", \"tokens\": [1, 2], \"text\": \"hi\"}"), model, "doc 'both'",
        "exactly one of text and tokens", "both");
    fails(jsonl("c.jsonl", "{\"doc_id\": \"none\"}"), model, "doc 'none'", "neither");
    // The line of a row without doc_id is named: Spark gives the row, not its line, so the file is read again.
    fails(jsonl("d.jsonl", "{\"doc_id\": \"a\", \"tokens\": [1]}", "", "{\"meta\": {\"doc_id\": \"x\"}, \"tokens\": [1]}",
        "{\"doc_id\": \"b\", \"tokens\": [2]}"), model, "d.jsonl, line 3: a row has no doc_id");
    fails(jsonl("d2.jsonl", "{\"doc_id\": \"a\", \"tokens\": [1]}", "{\"doc_id\": null, \"tokens\": [2]}"), model,
        "d2.jsonl, line 2: a row has no doc_id");
    // In Parquet, by the row's index in its file (Spark's _metadata.row_index): the file is read again too.
    Path pq = tmp.resolve("d3.parquet");
    spark.read().json(jsonl("d3.jsonl", "{\"doc_id\": \"a\", \"tokens\": [1]}", "{\"doc_id\": \"b\", \"tokens\": [2]}",
        "{\"doc_id\": null, \"tokens\": [3]}").toString()).coalesce(1).write().parquet(pq.toString());
    fails(pq, model, ".parquet, row_index 2: a row has no doc_id");
    fails(jsonl("e.jsonl", "{\"doc_id\": \"neg\", \"tokens\": [-1]}"), model, "doc 'neg'", "-1");
    fails(jsonl("e2.jsonl", "{\"doc_id\": \"hole\", \"tokens\": [1, null, 3]}"), model, "doc 'hole'",
        "the token id at position 1 is null");
    fails(jsonl("f.jsonl", "{\"doc_id\": \"a\", \"tokens\": [1, 2]}", "not json"), model, "f.jsonl, line 2",
        "malformed JSON", "not json");
    // gzipped JSON Lines: the line is found in the decompressed text
    Path gz = tmp.resolve("f2.jsonl.gz");
    try (var out = new java.util.zip.GZIPOutputStream(Files.newOutputStream(gz))) {
      out.write("{\"doc_id\": \"a\", \"tokens\": [1]}\n{\"doc_id\": \"b\", \"tokens\": [2]}\n{oops\n"
          .getBytes(StandardCharsets.UTF_8));
    }
    fails(gz, model, "f2.jsonl.gz, line 3", "malformed JSON", "{oops");
    fails(tmp.resolve("missing.jsonl"), model, "no such file");
    fails(jsonl("g.jsonl", "{\"doc_id\": \"twice\", \"tokens\": [1, 2]}", "{\"doc_id\": \"once\", \"tokens\": [3]}",
        "{\"doc_id\": \"twice\", \"tokens\": [4]}"), model, "doc_id 'twice' appears 2 times", "g.jsonl",
        "one row per doc_id");
    // Spark's JSON reader hands any value to a string column as its JSON source: ["x", "y"] would be scored.
    fails(jsonl("h.jsonl", "{\"doc_id\": \"arr\", \"text\": [\"x\", \"y\"]}"), model, "h.jsonl, doc 'arr'",
        "text is a JSON array<string> value, expected a string");
    fails(jsonl("i.jsonl", "{\"doc_id\": \"num\", \"text\": 12.5}"), model, "doc 'num'", "text is a JSON decimal(3,1)");
    fails(jsonl("j.jsonl", "{\"doc_id\": \"obj\", \"text\": {\"a\": \"b\"}}"), model, "doc 'obj'",
        "text is a JSON object<a: string>");
  }

  /**
   * Text must be Unicode, as bits_per_byte counts its UTF-8 bytes and the tokenizer reads its
   * characters. Parquet text with invalid UTF-8 was decoded with U+FFFD in place of the bad bytes and
   * scored with exit 0: other text than stored, and the bytes counted were the replacement's. A JSON
   * escape of a lone surrogate was refused as a "malformed JSON record" without the reason. Both now
   * name the document and the place; an escaped surrogate pair and a stored U+FFFD are text.
   */
  @Test
  void textThatIsNotUnicodeIsRefusedNamingThePlace() throws Exception {
    Path in = tmp.resolve("bad-utf8.parquet");
    StructType raw = new StructType().add("doc_id", DataTypes.StringType).add("b", DataTypes.BinaryType);
    spark.createDataFrame(List.of(RowFactory.create("fine", "x\ufffdy".getBytes(StandardCharsets.UTF_8)),
        RowFactory.create("ff", new byte[] {'a', (byte) 0xc3, (byte) 0xa9, (byte) 0xff, 'c'})), raw)
        .selectExpr("doc_id", "cast(b as string) as text").write().parquet(in.toString());
    fails(in, model, "doc 'ff'", "text is not valid UTF-8: byte FF at byte offset 3 (character 2)");
    fails(jsonl("s.jsonl", "{\"doc_id\": \"ok\", \"text\": \"fine\"}",
        "{\"doc_id\": \"sur\", \"text\": \"a\\ud83d\\ude42b\\udc00c\"}"), model,
        "s.jsonl, line 2, doc 'sur': text holds a lone UTF-16 surrogate (\\udc00) at character 3");
    // Bytes that are not UTF-8 in a JSON line (a Latin-1 file): "malformed JSON record" and no reason before.
    Path latin1 = tmp.resolve("latin1.jsonl");
    Files.write(latin1, ("{\"doc_id\": \"ok\", \"tokens\": [1]}\r\n{\"doc_id\": \"caf\u00e9\", \"text\": \"x\"}\n")
        .getBytes(StandardCharsets.ISO_8859_1));
    fails(latin1, model, "latin1.jsonl, line 2: not valid UTF-8 (JSON Lines files must be UTF-8): byte E9 at byte offset 15 "
        + "of the line: {\"doc_id\": \"caf\ufffd\"");
    // past the 300 characters Spark's error quotes, too
    Path late = tmp.resolve("latin1-late.jsonl");
    Files.write(late, ("{\"doc_id\": \"late\", \"text\": \"" + "hello world ".repeat(40) + "caf\u00e9\"}\n")
        .getBytes(StandardCharsets.ISO_8859_1));
    fails(late, model, "latin1-late.jsonl, line 1: not valid UTF-8 (JSON Lines files must be UTF-8): byte E9 at byte "
        + "offset 511 of the line");
    // An id too: Spark reads one as '?'. Alone it was scored as 'e?' with exit 0; two were refused as one id 'd?'
    // appearing twice, which is in neither file.
    fails(jsonl("sid1.jsonl", "{\"doc_id\": \"e\\udfff\", \"tokens\": [1, 2]}"), model,
        "sid1.jsonl, line 1: doc_id 'e\\udfff' holds a lone UTF-16 surrogate (\\udfff) at character 1");
    fails(jsonl("sid.jsonl", "{\"doc_id\": \"ok?\", \"tokens\": [1]}", "{\"doc_id\": \"d\\ud800\", \"tokens\": [1, 2]}",
        "{\"doc_id\": \"d\\udc00\", \"tokens\": [3]}"), model,
        "sid.jsonl, line 2: doc_id 'd\\ud800' holds a lone UTF-16 surrogate (\\ud800) at character 1");
    String text = "a\ud83d\ude42b \ufffd"; // a pair (escaped in the JSON below) and U+FFFD itself
    Path good = jsonl("pair.jsonl", "{\"doc_id\": \"pair\", \"text\": \"a\\ud83d\\ude42b \ufffd\"}");
    Path out = tmp.resolve("pair-out");
    ByteArrayOutputStream err = new ByteArrayOutputStream();
    assertEquals(0, run(err, "ppl", "--model", model.toString(), "--input", good.toString(), "--output",
        out.toString()), err.toString());
    Row r = spark.read().json(out.toString()).first();
    double bytes = text.getBytes(StandardCharsets.UTF_8).length;
    assertEquals(-(double) r.getAs("sum_logprob") / Math.log(2) / bytes, (double) r.getAs("bits_per_byte"), 1e-12);
  }

  /**
   * 0 tasks is no default: refused as any count below 1; a relative --model is made absolute; a row
   * with nothing scored has no bits per byte.
   */
  @Test
  void usageEdges() throws Exception {
    Path in = jsonl("z.jsonl", "{\"doc_id\": \"a\", \"tokens\": [1, 2, 3]}");
    // A ':' in a name: Hadoop's bare URISyntaxException before; now the argument it concerns (a colon in a folder
    // above OUT is fine: only OUT's own name is a problem).
    Path colon = copyOfModel("m o:d", null);
    for (String[] bad : new String[][] {
        {"--model", colon.toString(), "MODEL file://" + colon + ": Hadoop cannot take this path"},
        {"--output", tmp.resolve("o u:t").toString(), "output " + tmp.resolve("o u:t") + ": a ':' in its name"},
        {"--model", tmp.resolve("nockpt").toString(), "MODEL " + tmp.resolve("nockpt") + ": no such directory"},
        {"--model", in.toString(), "MODEL " + in + ": not a directory (a checkpoint is a folder"}}) {
      ByteArrayOutputStream err = new ByteArrayOutputStream();
      List<String> args = new ArrayList<>(List.of("ppl", "--model", model.toString(), "--input", in.toString(),
          "--output", tmp.resolve("out").toString()));
      args.set(args.indexOf(bad[0]) + 1, bad[1]);
      assertEquals(2, run(err, args.toArray(String[]::new)), err.toString());
      assertTrue(err.toString().contains(bad[2]), err.toString());
    }
    for (String opt : List.of("--partitions", "--split-partitions")) {
      ByteArrayOutputStream err = new ByteArrayOutputStream();
      assertEquals(2, run(err, "ppl", "--model", model.toString(), "--input", in.toString(), "--output",
          tmp.resolve("out").toString(), opt, "0"), err.toString());
      assertTrue(err.toString().contains(opt + " must be >= 1, got 0"), err.toString());
    }
    // A relative --model is made absolute on the driver: executors resolve paths from their own directories.
    Path relative = Path.of("").toAbsolutePath().relativize(model.toAbsolutePath());
    ByteArrayOutputStream err = new ByteArrayOutputStream();
    assertEquals(0, run(err, "ppl", "--model", relative.toString(), "--input", in.toString(), "--output",
        tmp.resolve("rel").toString()), err.toString());
    assertTrue(err.toString().contains("(model " + model.toAbsolutePath() + ","), err.toString());
    // A file: URI names the same directory; another scheme is refused: the model is read with java.nio.
    err = new ByteArrayOutputStream();
    assertEquals(0, run(err, "ppl", "--model", model.toAbsolutePath().toUri().toString(), "--input", in.toString(),
        "--output", tmp.resolve("uri").toString()), err.toString());
    assertTrue(err.toString().contains("(model " + model.toAbsolutePath() + ","), err.toString());
    err = new ByteArrayOutputStream();
    assertEquals(2, run(err, "ppl", "--model", "hdfs://nn:8020/models/x", "--input", in.toString(), "--output",
        tmp.resolve("hdfs").toString()), err.toString());
    assertTrue(err.toString().contains("--model hdfs://nn:8020/models/x: the checkpoint must be a local directory"),
        err.toString());
    assertFalse(Files.exists(tmp.resolve("hdfs")), "nothing written");
    // Every form of a local file URI, Spark's own "file:/dir" included; a host or a relative one is refused.
    for (String uri : List.of("file:/m/x%20y", "file:///m/x%20y", "file://localhost/m/x%20y", "FILE:/m/x%20y")) {
      assertEquals("/m/x y", PplJob.modelPath(uri), uri);
    }
    assertEquals("rel/m", PplJob.modelPath("rel/m"));
    assertEquals("/abs/m", PplJob.modelPath("/abs/m"));
    for (String[] bad : new String[][] {{"file://nn/m", "on host 'nn'"}, {"file:m", "needs an absolute path"},
        {"file:/a b", "not a valid URI"}, {"s3a://b/m", "must be a local directory"}}) {
      InputError e = assertThrows(InputError.class, () -> PplJob.modelPath(bad[0]));
      assertTrue(e.getMessage().startsWith("--model " + bad[0] + ": ") && e.getMessage().contains(bad[1]),
          e.getMessage());
    }
    // A one-token text row (a tokenizer without special tokens) scores nothing: no rate, as no ppl.
    Row one = PplJob.row("d", 1, 0.0, null, 5, true, false);
    assertTrue(one.isNullAt(3) && one.isNullAt(4), one.toString());
    assertEquals(-2.0 / Math.log(2) / 5, (double) PplJob.row("d", 2, 2.0, null, 5, true, false).get(4), 1e-15);
  }

  /** A checkpoint directory inside OUT: refused before anything is made (it used to leave an empty OUT). */
  @Test
  void checkpointDirInsideTheOutputIsRefused() throws Exception {
    Path in = jsonl("cp.jsonl", "{\"doc_id\": \"a\", \"tokens\": [1, 2, 3]}");
    for (String cp : List.of("out", "out/checkpoints", "out/../out/x")) {
      Path out = tmp.resolve("out");
      ByteArrayOutputStream err = new ByteArrayOutputStream();
      int rc = run(err, "ppl", "--model", model.toString(), "--input", in.toString(), "--output", out.toString(),
          "--checkpoint-dir", tmp.resolve(cp).toString());
      String msg = err.toString();
      assertEquals(2, rc, msg);
      assertTrue(msg.contains("--checkpoint-dir " + tmp.resolve(cp) + " is inside OUT " + out), msg);
      assertFalse(Files.exists(out), "nothing made: " + msg);
    }
    // Inside an input: its checkpoint files would read as the input changing at commit, after the whole run.
    Path inDir = Files.createDirectories(tmp.resolve("in-dir"));
    Files.copy(in, inDir.resolve("cp.jsonl"));
    for (String[] where : List.of(new String[] {"INPUT", inDir.resolve("cp").toString()},
        new String[] {"MODEL", model.resolve("cp").toString()})) {
      ByteArrayOutputStream err = new ByteArrayOutputStream();
      int rc = run(err, "ppl", "--model", model.toString(), "--input", inDir.toString(), "--output",
          tmp.resolve("out").toString(), "--checkpoint-dir", where[1]);
      assertEquals(2, rc, err.toString());
      assertTrue(err.toString().contains("--checkpoint-dir " + where[1] + " is inside " + where[0]), err.toString());
    }
    // A file where the directory should be, or on its way: refused up front (it failed the first layer's job).
    Path file = Files.writeString(tmp.resolve("a-file"), "mine");
    for (Path cp : List.of(file, file.resolve("below"))) {
      Path out = tmp.resolve("out");
      ByteArrayOutputStream err = new ByteArrayOutputStream();
      int rc = run(err, "ppl", "--model", model.toString(), "--input", in.toString(), "--output", out.toString(),
          "--split-above", "0", "--checkpoint-dir", cp.toString());
      assertEquals(2, rc, err.toString());
      assertTrue(err.toString().contains("--checkpoint-dir " + cp + ": "), err.toString());
      assertTrue(err.toString().contains("is a file, not a directory"), err.toString());
      assertFalse(Files.exists(out));
      assertEquals("mine", Files.readString(file));
    }
    Path beside = tmp.resolve("out-checkpoints"); // a sibling whose name starts like OUT's is not inside it
    assertEquals(0, run(new ByteArrayOutputStream(), "ppl", "--model", model.toString(), "--input", in.toString(),
        "--output", tmp.resolve("out").toString(), "--checkpoint-dir", beside.toString()));
  }

  @Test
  void badCheckpointNamesTheFileAndTensor() throws Exception {
    Path bad = tmp.resolve("bad-model");
    Files.createDirectories(bad);
    for (String f : List.of("config.json", "tokenizer.json")) {
      Files.copy(model.resolve(f), bad.resolve(f));
    }
    // A config that needs more layers than the weights hold.
    String cfg = Files.readString(model.resolve("config.json")).replace("\"num_hidden_layers\": 2",
        "\"num_hidden_layers\": 3");
    Files.writeString(bad.resolve("config.json"), cfg);
    Files.copy(model.resolve("model.safetensors"), bad.resolve("model.safetensors"));
    Path in = jsonl("g.jsonl", "{\"doc_id\": \"x\", \"tokens\": [1, 2]}");
    fails(in, bad, "MODEL", "model.layers.2.", "missing");
    Files.writeString(bad.resolve("config.json"), cfg.replace("\"num_hidden_layers\": 3", "\"num_hidden_layers\": 2")
        .replace("\"silu\"", "\"gelu\""));
    fails(in, bad, "config.json", "hidden_act", "gelu");
    // A malformed tokenizer.json with text input: named on the driver, before any task.
    Files.writeString(bad.resolve("config.json"), Files.readString(model.resolve("config.json")));
    Files.writeString(bad.resolve("tokenizer.json"), "{\"version\": \"1.0\", \"model\": {\"type\": \"BPE\"");
    fails(jsonl("t.jsonl", "{\"doc_id\": \"x\", \"text\": \"hello\"}"), bad, "MODEL", "tokenizer.json",
        "not a valid tokenizer.json");
  }

  /**
   * Weights that take a document's values past float32: exit 2 naming the document, the layer or
   * the logits, and the position, on both paths (the logits' overflow used to give ppl NaN, exit 0).
   */
  @Test
  void valuesPastFloat32NameTheDocument() throws Exception {
    Path in = jsonl("o.jsonl", "{\"doc_id\": \"fine\", \"tokens\": [3]}", "{\"doc_id\": \"loud\", \"tokens\": [1, 2, 3, 4, 5]}");
    Path logits = scaledCopy("huge-logits", "model.norm.weight", 3e38f);
    for (String split : List.of("-1", "0")) {
      Path out = tmp.resolve("out");
      ByteArrayOutputStream err = new ByteArrayOutputStream();
      List<String> args = new java.util.ArrayList<>(List.of("ppl", "--model", logits.toString(), "--input",
          in.toString(), "--output", out.toString()));
      if (!split.equals("-1")) {
        args.addAll(List.of("--split-above", split));
      }
      int rc = run(err, args.toArray(new String[0]));
      String msg = err.toString();
      assertEquals(2, rc, "split-above " + split + ": " + msg);
      for (String f : List.of("doc 'loud'", "the logits leave float32", "position 1")) {
        assertTrue(msg.contains(f), "split-above " + split + ", '" + f + "': " + msg);
      }
      assertFalse(Files.exists(out));
    }
    fails(in, scaledCopy("huge-attention", "model.layers.0.input_layernorm.weight", 3e37f), "doc 'loud'", "layer 0",
        "past float32", "position");
    // Hidden values whose squares pass float32 while the values do not: the norm divided them to 0 and
    // every token scored ln(1 / vocab), exit 0 (found 2026-11-28 with gen-model --init-std 1e6).
    Path loudEmbeddings = scaledCopy("huge-embeddings", "model.embed_tokens.weight", 1e20f);
    fails(in, loudEmbeddings, "doc 'loud'", "layer 0: the input norm at position 0", "mean square", "past float32");
    Path out = tmp.resolve("out");
    ByteArrayOutputStream err = new ByteArrayOutputStream();
    assertEquals(2, run(err, "ppl", "--model", loudEmbeddings.toString(), "--input", in.toString(), "--output",
        out.toString(), "--split-above", "0"), err.toString());
    assertTrue(err.toString().contains("layer 0: the input norm at position 0"), err.toString());
    assertFalse(Files.exists(out));
  }

  /** A copy of the test model with every value of one tensor replaced by {@code value}. */
  Path scaledCopy(String name, String tensor, float value) throws Exception {
    Path dir = tmp.resolve(name);
    Files.createDirectories(dir);
    for (String f : List.of("config.json", "tokenizer.json")) {
      Files.copy(model.resolve(f), dir.resolve(f));
    }
    java.util.Map<String, Safetensors.Tensor> t = new java.util.LinkedHashMap<>();
    for (Safetensors.Entry e : Safetensors.readHeader(model.resolve("model.safetensors")).values()) {
      float[] v = Safetensors.readFloats(e);
      if (e.name().equals(tensor)) {
        Arrays.fill(v, value);
      }
      t.put(e.name(), new Safetensors.Tensor("F32", e.shape(), v));
    }
    assertTrue(t.containsKey(tensor), tensor);
    Safetensors.write(dir.resolve("model.safetensors"), t);
    return dir;
  }

  @Test
  void progressLinesFollowTheCounts() throws Exception {
    java.util.concurrent.atomic.AtomicReference<long[]> done = new java.util.concurrent.atomic.AtomicReference<>(
        new long[] {0, 0});
    ByteArrayOutputStream buf = new ByteArrayOutputStream();
    PrintStream ps = new PrintStream(buf, true, StandardCharsets.UTF_8);
    Thread t = PplJob.progressPoller(ps, 5, 5000, done::get, System.nanoTime(), 20);
    try {
      done.set(new long[] {0, 1234}); // tokens alone move (a running task's count): a line
      awaitText(buf, "0/5 documents done, 1234/5000 tokens (24%)");
      done.set(new long[] {2, 1234});
      awaitText(buf, "2/5 documents done, 1234/5000 tokens (24%)");
      Thread.sleep(100); // no change: no new line
      assertEquals(2, buf.toString(StandardCharsets.UTF_8).lines().count(), buf.toString(StandardCharsets.UTF_8));
      done.set(new long[] {5, 4999}); // rounded down: not 100% before the end
      awaitText(buf, "5/5 documents done, 4999/5000 tokens (99%)");
    } finally {
      t.interrupt();
      t.join(5000);
    }
    assertFalse(t.isAlive());
  }

  /** Progress counts a partition's documents once however often it ran: values merge by the larger per partition. */
  @Test
  void progressCountsEachPartitionOnce() {
    PplJob.DocProgress a = new PplJob.DocProgress(), b = new PplJob.DocProgress();
    a.add(new long[] {7, 0, 100});
    a.add(new long[] {7, 1, 51}); // chunk by chunk in one task, then the document's end
    a.add(new long[] {8, 0, 30});
    b.add(new long[] {7, 0, 100}); // partition 7 again (a retried task, say), not as far yet
    b.add(new long[] {9, 0, 5});
    assertArrayEquals(new long[] {1, 181}, PplJob.DocProgress.count(a.value()));
    a.merge(b);
    assertArrayEquals(new long[] {1, 186}, PplJob.DocProgress.count(a.value()));
    b.add(new long[] {7, 2, 200}); // the retry goes further
    a.merge(b);
    assertArrayEquals(new long[] {2, 335}, PplJob.DocProgress.count(a.value()));
    PplJob.DocProgress c = a.copy();
    a.reset();
    assertTrue(a.isZero());
    assertArrayEquals(new long[] {2, 335}, PplJob.DocProgress.count(c.value()));
  }

  @Test
  void aBadProgressIntervalIsRefused() {
    String old = System.getProperty(PplJob.PROGRESS_SECONDS_PROPERTY);
    try {
      System.setProperty(PplJob.PROGRESS_SECONDS_PROPERTY, "2");
      assertEquals(2000, PplJob.progressMillis());
      for (String bad : List.of("0", "-1", "abc", "1.5", "99999999999999999")) {
        System.setProperty(PplJob.PROGRESS_SECONDS_PROPERTY, bad);
        InputError e = assertThrows(InputError.class, PplJob::progressMillis, bad);
        assertTrue(e.getMessage().contains("got '" + bad + "'"), e.getMessage());
      }
    } finally {
      if (old == null) {
        System.clearProperty(PplJob.PROGRESS_SECONDS_PROPERTY);
      } else {
        System.setProperty(PplJob.PROGRESS_SECONDS_PROPERTY, old);
      }
    }
  }

  static void awaitText(ByteArrayOutputStream buf, String want) throws InterruptedException {
    long end = System.nanoTime() + 10_000_000_000L;
    while (!buf.toString(StandardCharsets.UTF_8).contains(want) && System.nanoTime() < end) {
      Thread.sleep(20);
    }
    assertTrue(buf.toString(StandardCharsets.UTF_8).contains(want), want + " in:\n" + buf.toString(StandardCharsets.UTF_8));
  }
}
