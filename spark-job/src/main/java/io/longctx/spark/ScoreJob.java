package io.longctx.spark;

import static org.apache.spark.sql.functions.col;
import static org.apache.spark.sql.functions.lit;

import io.longctx.kernels.AttentionBackend;
import io.longctx.kernels.AttentionOptions;
import io.longctx.kernels.AttentionState;
import io.longctx.kernels.CpuAttention;
import io.longctx.kernels.NonFiniteScoreException;
import io.longctx.kernels.Tensor;
import java.io.IOException;
import java.io.Serializable;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Comparator;
import java.util.HashMap;
import java.util.HashSet;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.Set;
import org.apache.hadoop.conf.Configuration;
import org.apache.spark.api.java.JavaSparkContext;
import org.apache.spark.api.java.function.CoGroupFunction;
import org.apache.spark.api.java.function.FlatMapFunction;
import org.apache.spark.api.java.function.FlatMapGroupsFunction;
import org.apache.spark.api.java.function.MapFunction;
import org.apache.spark.api.java.function.MapGroupsFunction;
import org.apache.spark.api.java.function.MapPartitionsFunction;
import org.apache.spark.broadcast.Broadcast;
import org.apache.spark.sql.Column;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.expressions.UserDefinedFunction;
import org.apache.spark.sql.functions;
import org.apache.spark.sql.types.ArrayType;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.LongType;
import org.apache.spark.sql.types.NumericType;
import org.apache.spark.sql.types.StringType;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.storage.StorageLevel;
import org.apache.spark.util.CollectionAccumulator;
import scala.Tuple2;

/**
 * The scoring job. Stages:
 *
 * <ol>
 *   <li>Read and validate KEYS (and QUERIES): shapes, finite values, nulls; the error names the
 *       file, the document and the position.
 *   <li>Chunk: key chunk c of a document holds the keys with positions in
 *       [c * chunkLen, (c + 1) * chunkLen), sorted by position (for dense positions 0..T-1 this is
 *       rank / chunkLen). Duplicate (doc_id, pos) land in one chunk and are reported there.
 *       No task holds more than one chunk of a document at a time (prefill: besides its blocks' own).
 *   <li>Query blocks: decode queries of a document sorted by (has pos, pos, query_id) and cut into
 *       blocks of --query-block; prefill blocks are the chunks themselves. Queries without pos
 *       attend the whole document: their blocks run unmasked.
 *   <li>Pairs: planned on the driver ({@link PairPlan}) from (doc, index, min pos, max pos) of every
 *       chunk and block; pairs invisible by position range are skipped (counted). Each visible
 *       (block, chunk) pair runs the job's one backend ({@link JobBackend}, the CPU kernels unless
 *       chosen otherwise) on that chunk only, with absolute positions. Decode: each
 *       block goes to the chunks it sees ({@link #computePairs}), one partial state per (query,
 *       chunk). Prefill: blocks in pairs of equal work ({@link PairPlan#forPrefill}); each chunk's K/V
 *       goes once to each pair that sees it, arriving in chunk order, and each block merges its
 *       states there ({@link #computeGroup}), one state per token.
 *   <li>Reduce (decode): {@link LseMerge} (SQL {@code lse_merge}) per query: partials merged in
 *       chunk-index order with {@link AttentionState#mergeAll}, so the bits do not depend on
 *       partitioning. Prefill's states are already merged, by the same tree, in their block's task.
 *   <li>Write through {@link OutputCommit}: staged beside OUT, renamed into place; an existing OUT
 *       is replaced only if it is a longctx output.
 * </ol>
 */
public final class ScoreJob {

  private ScoreJob() {}

  /** What a run did; printed on stderr by the launcher. */
  public record Summary(long documents, long tokens, long queries, long chunks, long pairsComputed,
      long pairsSkipped, String backend, double wallSeconds, String output) {

    public double tokensPerSecond() {
      return wallSeconds > 0 ? tokens / wallSeconds : 0;
    }

    @Override
    public String toString() {
      return String.format(java.util.Locale.ROOT,
          "longctx score summary%n  documents      %d%n  tokens         %d%n  queries        %d%n  chunks         %d%n"
              + "  chunk pairs    %d computed, %d skipped%n  backend        %s%n  wall time      %.2f s%n"
              + "  tokens/s       %s%n  output         %s%n",
          documents, tokens, queries, chunks, pairsComputed, pairsSkipped, backend, wallSeconds,
          // a tiny job is mostly Spark's start-up: say so rather than print a rate of 0
          tokensPerSecond() >= 10 ? String.format(java.util.Locale.ROOT, "%.0f", tokensPerSecond())
              : String.format(java.util.Locale.ROOT, "%.1f (a job this small measures Spark's start-up)",
                  tokensPerSecond()),
          output);
    }
  }

  /** Group key of a document's chunk or block: (doc_id, index), typed, never a joined string. */
  static final org.apache.spark.sql.Encoder<Tuple2<String, Long>> KEY = Encoders.tuple(Encoders.STRING(),
      Encoders.LONG());

  /**
   * Resolved tensor shape of the job; {@code origin} says, where a count was inferred, from which rows
   * (a length error then names both rows: the first one may be the odd one).
   */
  record Shape(int heads, int kvHeads, int dim, String origin) implements Serializable {
    Shape(int heads, int kvHeads, int dim) {
      this(heads, kvHeads, dim, "");
    }
  }

  public static Summary run(SparkSession spark, ScoreOptions opt) {
    long t0 = System.nanoTime();
    opt.check();
    try {
      return runChecked(spark, opt, t0);
    } catch (RuntimeException e) {
      throw InputError.surfaced(e);
    } catch (IOException e) {
      throw new java.io.UncheckedIOException(e);
    } finally {
      Sessions.label(spark, null);
    }
  }

  private static Summary runChecked(SparkSession spark, ScoreOptions opt, long t0) throws IOException {
    boolean prefill = opt.mode == ScoreOptions.Mode.PREFILL;
    if (opt.partitions > 0) {
      spark.conf().set("spark.sql.shuffle.partitions", opt.partitions);
    }
    AttentionOptions attn = prefill ? opt.attention().withCausal(true) : opt.attention();
    final JobBackend backend = JobBackend.resolve(spark, opt.backend);
    // The backends the tasks actually ran on (one name, or the job failed): for the summary.
    final CollectionAccumulator<String> used = spark.sparkContext().collectionAccumulator("longctx backends used");
    Configuration hconf = spark.sparkContext().hadoopConfiguration();

    InputError.requireExists(hconf, opt.keys, "KEYS");
    if (!prefill) {
      InputError.requireExists(hconf, opt.queries, "QUERIES");
    }
    Map<String, String> inputs = new java.util.LinkedHashMap<>();
    inputs.put("KEYS", opt.keys);
    inputs.put("QUERIES", opt.queries);
    OutputCommit commit = OutputCommit.prepare(hconf, opt.output, opt.overwrite, "score", inputs);

    Sessions.label(spark, "longctx score: input schemas");
    Dataset<Token> keyRows = read(spark, opt.resolvedFormat(), opt.keys, true, prefill);
    Dataset<Token> queryRows = prefill ? null : read(spark, opt.queriesFormat(), opt.queries, false, true);
    commit.requireAllRead("KEYS", opt.keys, keyRows.inputFiles());
    if (!prefill) {
      commit.requireAllRead("QUERIES", opt.queries, queryRows.inputFiles());
    }
    Sessions.label(spark, "longctx score: first rows (shape)");
    Shape shape = resolveShape(opt, keyRows, queryRows, prefill);
    try { // an option's fault, said before the jobs run (a task named the data's first pair instead)
      attn.scoreScale(shape.dim());
    } catch (IllegalArgumentException e) {
      throw new InputError("--scale / --softcap: " + e.getMessage());
    }

    final String keysPath = opt.keys;
    final int chunkLen = opt.chunkLen;
    final Shape sh = shape;

    Dataset<QueryBlock> blocks = null; // decode only: a prefill block is its chunk's own tokens
    if (!prefill) {
      final String queriesPath = opt.queries;
      final int qb = opt.queryBlock;
      final long gap = blockGap(attn, chunkLen);
      blocks = queryRows
          .map((MapFunction<Token, Token>) t -> validateQuery(t, sh), Encoders.bean(Token.class))
          .groupByKey((MapFunction<Token, String>) Token::getDocId, Encoders.STRING())
          .flatMapGroups((FlatMapGroupsFunction<String, Token, QueryBlock>) (doc, it) -> buildBlocks(doc, it, sh, qb, gap,
              queriesPath), Encoders.bean(QueryBlock.class))
          .persist(StorageLevel.MEMORY_AND_DISK());
    }

    try {
      Sessions.label(spark, "longctx score: chunk ranges");
      List<RangeMeta> chunkMeta = chunkRanges(keyRows, chunkLen);
      Sessions.label(spark, "longctx score: query blocks");
      List<RangeMeta> blockMeta = prefill ? chunkMeta // a prefill block is its chunk's tokens
          : blocks.map((MapFunction<QueryBlock, RangeMeta>) ScoreJob::blockMeta, Encoders.bean(RangeMeta.class))
              .collectAsList();
      if (!prefill && (attn.causal() || attn.window() > 0) && blockMeta.stream().noneMatch(RangeMeta::getHasPos)) {
        // A query without pos attends the whole document by design; when none has one, a mask was asked
        // for and would apply nowhere: most likely the field is misspelled or missing.
        throw new InputError("QUERIES " + opt.queries + ": " + (attn.causal() ? "--causal" : "--window")
            + " needs query positions, but no query has a 'pos' (a query without one attends the whole document; the "
            + "name is matched exactly, so 'Pos' or 'position' is not it): give each query its position, or leave out "
            + (attn.causal() ? "--causal" : "--window"));
      }
      PairPlan plan;
      try {
        plan = PairPlan.make(chunkMeta, blockMeta, attn, opt.keys, opt.queries);
        if (prefill) {
          // spark.sql.shuffle.partitions (--partitions), not AQE's initial partition number: AQE does not
          // coalesce this stage, so its count is the user's
          plan = plan.forPrefill(spark.sessionState().conf().defaultNumShufflePartitions());
        }
      } catch (InputError e) { // "no key rows", "a document without keys": rows the ranges left out may be why
        InputError unplaced = unplacedKey(keyRows, sh, prefill);
        throw unplaced != null ? unplaced : e;
      }
      Broadcast<PairPlan> planB = JavaSparkContext.fromSparkContext(spark.sparkContext()).broadcast(plan);

      Dataset<Row> result;
      if (prefill) {
        // Prefill: the work is keyed by group, one query block or a pair of them (PairPlan.forPrefill), and a
        // block is its chunk's own tokens. Each key token, validated where its file is known, goes in one
        // shuffle to the groups that see its chunk (its K/V, once per group) and to its own block's group (its
        // q), in the partition the plan gave the group; a group's rows are assembled into chunks in chunk
        // order, and each block's partial states merged there (the tree lse_merge would build), so one state
        // per token leaves the task. K/V per pair is smaller than the q per pair plus a partial state per
        // (token, chunk) that keying by chunk ships (2 * kv-heads <= 2 * heads), and a task holds one group at
        // a time, not every block that sees chunk 0. (Building whole chunks first cost a shuffle and a stage
        // of its own: 0.9-2.9 s of a 65,536-token job.)
        Dataset<BlockToken> routed = keyRows.flatMap((FlatMapFunction<Token, BlockToken>) t -> route(
            validateKey(t, sh, true), planB.value(), chunkLen), Encoders.bean(BlockToken.class));
        // A token's states are all merged in its group's task: its one state is final, written from there (an
        // lse_merge of single states would only add a shuffle). A group's rows come sorted: its blocks' own
        // chunks (the rows with q) first, then the other chunks in order, each by position.
        result = routed
            .repartitionById(plan.partitions, col("partition"))
            .sortWithinPartitions(col("docId"), col("group"), col("q").isNull(), col("chunk"), col("pos"))
            .mapPartitions((MapPartitionsFunction<BlockToken, Partial>) it -> computeGroups(it, planB.value(), sh,
                attn, task(backend, used), chunkLen, keysPath), Encoders.bean(Partial.class))
            .toDF()
            .select(col("docId").as("doc_id"), col("pos"), col("o"), col("lse"), col("keyCount").as("n_keys"));
      } else {
        // Decode: few query blocks, many chunks: each chunk receives the (small) query blocks that see it.
        // The keys are validated before their shuffle (the file name is known there), then chunked.
        Dataset<Chunk> chunks = keyRows
            .map((MapFunction<Token, Token>) t -> validateKey(t, sh, false), Encoders.bean(Token.class))
            .groupByKey((MapFunction<Token, Tuple2<String, Long>>) t -> new Tuple2<>(t.getDocId(),
                Chunking.index(t.getPos(), chunkLen)), KEY)
            .mapGroups((MapGroupsFunction<Tuple2<String, Long>, Token, Chunk>) (key, it) -> buildChunk(it, sh, chunkLen,
                keysPath), Encoders.bean(Chunk.class));
        // Not persisted: Spark caches a Dataset as columnar batches built whole in the heap, and with rows
        // of one chunk each (32 MiB at 4096 tokens x 8 kv heads x 128) that held a whole shuffle partition
        // per task and ran a 2 GiB executor out of memory on a 1M-token document. The pair stage reads the
        // chunks from the shuffle; the plan needs only each chunk's position range.
        Dataset<QueryBlock> pairs = blocks.flatMap((FlatMapFunction<QueryBlock, QueryBlock>) b -> {
          long[] cs = planB.value().chunksOf(b.getDocId(), b.getBlock());
          List<QueryBlock> r = new ArrayList<>(cs.length);
          for (long c : cs) {
            r.add(b.withChunk(c));
          }
          return r.iterator();
        }, Encoders.bean(QueryBlock.class));
        Dataset<Partial> partials = pairs
            .groupByKey((MapFunction<QueryBlock, Tuple2<String, Long>>) b -> new Tuple2<>(b.getDocId(), b.getChunk()), KEY)
            .cogroup(chunks.groupByKey((MapFunction<Chunk, Tuple2<String, Long>>) c -> new Tuple2<>(c.getDocId(),
                    c.getChunk()), KEY),
                (CoGroupFunction<Tuple2<String, Long>, QueryBlock, Chunk, Partial>) (key, bs, cs) -> computePairs(bs, cs, sh,
                    attn, task(backend, used)),
                Encoders.bean(Partial.class));
        // The states of one query come from many tasks: lse_merge reduces them in chunk order.
        UserDefinedFunction lseMerge = LseMerge.register(spark);
        result = partials.toDF()
            .groupBy(col("docId"), col("queryId"), col("pos"))
            .agg(lseMerge.apply(col("chunk"), col("keyCount"), col("lse"), col("o")).as("m"))
            .select(col("queryId").as("query_id"), col("docId").as("doc_id"), col("m.o").as("o"),
                col("m.lse").as("lse"), col("m.keyCount").as("n_keys"));
        // Blocks that see no chunk at all (every key after them) pair with nothing: their queries' states
        // are the empty state (0, -inf), written as they are, with no chunk-index sentinel.
        Dataset<Row> unseen = blocks
            .filter((org.apache.spark.api.java.function.FilterFunction<QueryBlock>) b ->
                planB.value().chunksOf(b.getDocId(), b.getBlock()).length == 0)
            .flatMap((FlatMapFunction<QueryBlock, Partial>) b -> rows(b, AttentionState.empty(b.getQPos().length,
                sh.heads(), sh.dim()), t -> 0), Encoders.bean(Partial.class))
            .toDF()
            .select(col("queryId").as("query_id"), col("docId").as("doc_id"), col("o"), col("lse"),
                col("keyCount").as("n_keys"));
        result = result.union(unseen);
      }

      Sessions.label(spark, "longctx score: " + (prefill ? "route keys, attention" : "chunks, attention, lse_merge")
          + ", write");
      try {
        commit.write(spark, Formats.output(result.write(), opt.resolvedOutputFormat()));
      } catch (Exception e) { // also Spark's SparkException, undeclared by Scala: rethrown as it is
        if (InputError.find(e) instanceof InputError.DuplicateKey dup) {
          throw dup.inFiles(filesHolding(spark, keyRows, dup.doc, dup.pos));
        }
        throw e;
      }
      double wall = (System.nanoTime() - t0) / 1e9;
      java.util.TreeSet<String> ran = new java.util.TreeSet<>(used.value());
      String backendUsed = backend.name + (ran.isEmpty() ? " (no pair computed)" : " (tasks ran on " + String.join(", ",
          ran) + ")");
      return new Summary(plan.documents, plan.tokens, plan.queries, plan.chunks, plan.computed, plan.skipped, backendUsed,
          wall,
          commit.output().toString());
    } finally {
      if (!prefill) {
        blocks.unpersist();
      }
    }
  }

  // ---------------------------------------------------------------- reading and validation

  /**
   * The files holding key rows at (doc, pos), each as "file (rows)", at most 10, for a duplicate key's
   * message: one more pass over KEYS, on the failure path only (Parquet skips the row groups whose
   * statistics rule the key out). Empty where the look-up itself fails: the message stays as it was.
   */
  static List<String> filesHolding(SparkSession spark, Dataset<Token> keys, String doc, long pos) {
    try {
      Sessions.label(spark, "longctx score: locate the duplicate key");
      return keys.toDF().filter(col("docId").equalTo(doc).and(col("pos").equalTo(pos)))
          .groupBy(col("file")).count().orderBy(col("file")).limit(10).collectAsList().stream()
          .map(r -> r.getString(0) + " (" + r.getLong(1) + (r.getLong(1) == 1 ? " row)" : " rows)")).toList();
    } catch (RuntimeException e) {
      return List.of();
    }
  }

  static StructType keysSchema(boolean withQ) {
    StructType s = new StructType()
        .add("doc_id", DataTypes.StringType)
        .add("pos", DataTypes.LongType)
        .add("k", DataTypes.createArrayType(DataTypes.FloatType))
        .add("v", DataTypes.createArrayType(DataTypes.FloatType));
    return withQ ? s.add("q", DataTypes.createArrayType(DataTypes.FloatType)) : s;
  }

  static StructType queriesSchema() {
    return new StructType()
        .add("query_id", DataTypes.StringType)
        .add("doc_id", DataTypes.StringType)
        .add("q", DataTypes.createArrayType(DataTypes.FloatType))
        .add("pos", DataTypes.LongType);
  }

  /** Reads KEYS (isKeys) or QUERIES into Token rows; missing required columns are an error. */
  static Dataset<Token> read(SparkSession spark, String fmt, String path, boolean isKeys, boolean withQ) {
    String what = isKeys ? "KEYS" : "QUERIES";
    Dataset<Row> df;
    boolean json = fmt.equals("json");
    if (json) {
      // An explicit schema: no inference pass; an absent field reads as null and is reported per row. A line
      // that is not JSON or holds a value of the wrong type is kept in CORRUPT and reported per row with its file.
      df = spark.read().schema((isKeys ? keysSchema(withQ) : queriesSchema()).add(CORRUPT, DataTypes.StringType))
          .option("mode", "PERMISSIVE").option("columnNameOfCorruptRecord", CORRUPT).json(path);
    } else {
      df = Formats.load(spark, fmt, path, what);
    }
    Set<String> have = new HashSet<>(Arrays.asList(df.columns()));
    List<String> need = new ArrayList<>(isKeys ? List.of("doc_id", "pos", "k", "v") : List.of("query_id", "doc_id", "q"));
    if (isKeys && withQ) {
      need.add("q");
    }
    List<String> missing = need.stream().filter(c -> !have.contains(c)).toList();
    if (!missing.isEmpty()) {
      throw new InputError(what + " " + path + ": missing column" + (missing.size() > 1 ? "s " : " ")
          + String.join(", ", missing) + " (has " + String.join(", ", df.columns()) + "; expected "
          + (isKeys ? "doc_id string, pos long, k array<float>, v array<float>" + (withQ ? ", q array<float>" : "")
              : "query_id string, doc_id string, q array<float>, optional pos long") + ")");
    }
    List<String> read = new ArrayList<>(need);
    if (!isKeys) {
      read.add("pos"); // optional, read where present
    }
    checkTypes(df.schema(), what, path, read);
    // A problem of the row found while reading, reported by validateKey / validateQuery with the row's place:
    // a malformed JSON line, else the first vector holding a null or NaN element (the bean encoder would fail on a
    // null with a message that names neither the file nor the row), kept whole in suspectVec for readProblem.
    Column bad = json ? functions.when(col(CORRUPT).startsWith(Formats.PARQUET_MAGIC), lit(Formats.PARQUET_READ_AS_JSON))
        .when(col(CORRUPT).isNotNull(), functions.concat(lit(Formats.MALFORMED_JSON), functions.substring(col(CORRUPT),
        1, 300))) : lit(null);
    Column floats = lit(null).cast(DataTypes.createArrayType(DataTypes.FloatType));
    Column suspectVec = floats;
    Map<String, Column> vec = new HashMap<>();
    for (String v : isKeys ? (withQ ? List.of("k", "v", "q") : List.of("k", "v")) : List.of("q")) {
      Column x = col(v).cast("array<float>");
      if (!(df.schema().apply(v).dataType() instanceof ArrayType a && a.containsNull())) {
        vec.put(v, x); // the file's schema rules out null elements
        continue;
      }
      // array_contains(x, NaN) is true with a NaN, null with a null element and no NaN, else false: one compiled
      // loop per vector. (Exact null tests by transform() or arrays_overlap() run interpreted per element, with a
      // SQLConf lookup each: a fifth of the executors' time in a JFR profile of a prefill job.)
      Column suspect = x.isNotNull().and(functions.coalesce(functions.array_contains(x, lit(Float.NaN)), lit(true)));
      bad = functions.coalesce(bad, functions.when(suspect, lit(SUSPECT_ELEMENT + v)));
      suspectVec = functions.coalesce(suspectVec, functions.when(suspect, x));
      vec.put(v, withoutNullElements(functions.when(suspect, floats).otherwise(x)));
    }
    Dataset<Row> sel = df.select(
        isKeys ? lit(null).cast("string").as("queryId") : col("query_id").cast("string").as("queryId"),
        col("doc_id").cast("string").as("docId"),
        (have.contains("pos") ? col("pos").cast("long") : lit(null).cast("long")).as("pos"),
        vec.getOrDefault("k", floats).as("k"),
        vec.getOrDefault("v", floats).as("v"),
        vec.getOrDefault("q", floats).as("q"),
        functions.input_file_name().as("file"),
        bad.cast("string").as("bad"),
        suspectVec.as("suspectVec"));
    return sel.as(Encoders.bean(Token.class));
  }

  /**
   * The same array column, typed as holding no null element: true of a vector that passed the suspect test.
   * Spark reads every file's arrays as possibly holding nulls, and for such a column the bean decoder
   * of a float[] boxes each element (Float.valueOf) where it could copy the array whole: 40% of the read
   * stage's task samples in a cold prefill job, 20% warm (JFR). Spark has no public function for the
   * tag, so this uses the one its own array_compact uses (catalyst internals: pinned with the Spark version).
   */
  static Column withoutNullElements(Column x) {
    return org.apache.spark.sql.classic.ExpressionUtils.column(
        new org.apache.spark.sql.catalyst.expressions.KnownNotContainsNull(
            org.apache.spark.sql.classic.ExpressionUtils.expression(x)));
  }

  static final String CORRUPT = "_corrupt_record";

  /** Marker of a {@code bad} value naming the first vector with a null or NaN element (the name follows it). */
  static final String SUSPECT_ELEMENT = "null or NaN element in ";

  /**
   * The row's problem found while reading, as a message (null: none). A suspect vector without a null
   * element holds a NaN: it goes back on the row, and validation reports it like any non-finite value.
   */
  static String readProblem(Token t) {
    String b = t.getBad();
    if (b == null || !b.startsWith(SUSPECT_ELEMENT)) {
      return b;
    }
    String name = b.substring(SUSPECT_ELEMENT.length());
    List<Float> x = t.getSuspectVec();
    int i = x == null ? -1 : x.indexOf(null);
    if (i >= 0 || x == null) {
      return name + "[" + i + "] is null (vectors must be finite)";
    }
    float[] f = new float[x.size()];
    for (int j = 0; j < f.length; j++) {
      f[j] = x.get(j);
    }
    switch (name) {
      case "k" -> t.setK(f);
      case "v" -> t.setV(f);
      default -> t.setQ(f);
    }
    t.setBad(null);
    t.setSuspectVec(null);
    return null;
  }

  /**
   * Column types that cannot be read as the expected ones are an error naming the input and the
   * column; only the columns this mode reads ({@code read}) are judged: JSON input reads those alone.
   */
  static void checkTypes(StructType schema, String what, String path, List<String> read) {
    for (StructField f : schema.fields()) {
      if (!read.contains(f.name())) {
        continue;
      }
      DataType t = f.dataType();
      String expected = switch (f.name()) {
        case "doc_id", "query_id" -> t instanceof StringType || Formats.integral(t) ? null : "string";
        case "pos" -> Formats.integral(t) ? null : "an integer type (long)";
        case "k", "v", "q" -> t instanceof ArrayType a && a.elementType() instanceof NumericType ? null
            : "array<float>";
        default -> null;
      };
      if (expected != null) {
        throw new InputError(what + " " + path + ": column '" + f.name() + "' has type " + t.simpleString()
            + "; expected " + expected);
      }
    }
  }

  static Shape resolveShape(ScoreOptions opt, Dataset<Token> keys, Dataset<Token> queries, boolean prefill) {
    // readProblem puts a vector with a NaN (held aside while reading) back on its row: its length counts here.
    List<Token> firstK = keys.filter((org.apache.spark.api.java.function.FilterFunction<Token>) t -> readProblem(t) == null
        && t.getK() != null && (!prefill || t.getQ() != null)).limit(1).collectAsList();
    if (firstK.isEmpty()) {
      List<Token> any = keys.limit(1).collectAsList();
      if (any.isEmpty()) {
        throw new InputError("KEYS " + opt.keys + ": no key rows");
      }
      Token t = any.get(0);
      if (t.getBad() != null) {
        validateKey(t, new Shape(1, 1, 1), prefill); // reports the row's own problem
      }
      throw new InputError("KEYS file " + t.getFile() + ", doc '" + t.getDocId() + "', pos " + t.getPos() + ": column '"
          + (t.getK() == null ? "k" : "q") + "' is missing or null (and in every other row)");
    }
    Token k0 = firstK.get(0);
    readProblem(k0);
    Token q0 = k0;
    if (!prefill) {
      List<Token> firstQ = queries.filter((org.apache.spark.api.java.function.FilterFunction<Token>) t ->
          readProblem(t) == null && t.getQ() != null).limit(1).collectAsList();
      if (firstQ.isEmpty()) {
        List<Token> any = queries.limit(1).collectAsList();
        if (any.isEmpty()) {
          throw new InputError("QUERIES " + opt.queries + ": no query rows");
        }
        Token t = any.get(0);
        if (t.getBad() != null) {
          validateQuery(t, new Shape(1, 1, 1)); // reports the row's own problem
        }
        throw new InputError("QUERIES file " + t.getFile() + ", query '" + t.getQueryId() + "', doc '" + t.getDocId()
            + "', pos " + (t.getPos() == null ? "(none)" : t.getPos()) + ": column 'q' is missing or null (and in every other row)");
      }
      q0 = firstQ.get(0);
      readProblem(q0);
    }
    int kLen = k0.getK().length, qLen = q0.getQ().length;
    int heads = opt.heads, kvHeads = opt.kvHeads, dim = opt.dim;
    if (dim == 0) {
      if (heads > 0) {
        dim = qLen / heads;
      } else if (kvHeads > 0) {
        dim = kLen / kvHeads;
      } else {
        throw new InputError("cannot infer the shape from array lengths alone (k: " + kLen + " floats in KEYS "
            + k0.getFile() + ", q: " + qLen + " floats in " + q0.getFile() + "): give --dim, --heads or --kv-heads");
      }
    }
    if (dim < 1) {
      throw new InputError("head dim resolves to " + dim + " (k: " + kLen + " floats, q: " + qLen + " floats)");
    }
    if (heads == 0) {
      heads = qLen / dim;
    }
    if (kvHeads == 0) {
      kvHeads = kLen / dim;
    }
    String rows = "KEYS " + k0.getFile() + " doc '" + k0.getDocId() + "' pos " + k0.getPos() + ", "
        + (prefill ? "" : "QUERIES " + q0.getFile() + " query '" + q0.getQueryId() + "', ") + "k " + kLen + " floats, q "
        + qLen + " floats";
    String where = " (first rows: " + rows + ")";
    if (dim > CpuAttention.MAX_DIM) {
      throw new InputError("head dim " + dim + " is above the kernels' maximum " + CpuAttention.MAX_DIM + where);
    }
    // A count inferred by a division that left a remainder: said as such (the quotient alone read as a wrong count).
    String dimFrom = opt.dim > 0 ? "--dim" : opt.heads > 0 ? "from --heads" : "from --kv-heads";
    String notMultiple = opt.dim == 0 && opt.heads > 0 && qLen % opt.heads != 0
        ? "q has " + qLen + " floats, not a multiple of --heads " + opt.heads
        : opt.dim == 0 && opt.heads == 0 && kLen % opt.kvHeads != 0
        ? "k has " + kLen + " floats, not a multiple of --kv-heads " + opt.kvHeads
        : opt.heads == 0 && qLen % dim != 0 ? "q has " + qLen + " floats, not a multiple of the head dim " + dim + " ("
            + dimFrom + ")"
        : opt.kvHeads == 0 && kLen % dim != 0 ? "k has " + kLen + " floats, not a multiple of the head dim " + dim + " ("
            + dimFrom + ")" : null;
    if (notMultiple != null) {
      throw new InputError("shape: " + notMultiple + where);
    }
    // long products: --heads and --dim are any ints, and an int product can wrap onto the array length
    if (heads < 1 || kvHeads < 1 || (long) heads * dim != qLen || (long) kvHeads * dim != kLen) {
      throw new InputError("shape heads=" + heads + " kv-heads=" + kvHeads + " dim=" + dim
          + " does not match the data: q needs heads*dim floats, k and v kv-heads*dim" + where);
    }
    if (heads % kvHeads != 0) {
      throw new InputError("heads (" + heads + ") must be a multiple of kv-heads (" + kvHeads + ")" + where);
    }
    List<String> inferred = new ArrayList<>(); // the options left out (0)
    if (opt.heads == 0) {
      inferred.add("heads");
    }
    if (opt.kvHeads == 0) {
      inferred.add("kv-heads");
    }
    if (opt.dim == 0) {
      inferred.add("dim");
    }
    return new Shape(heads, kvHeads, dim, inferred.isEmpty() ? ""
        : "; " + String.join(", ", inferred) + " inferred from the first rows: " + rows);
  }

  /**
   * The error of the first key row the chunk ranges left out (no doc_id or pos: a field missing or
   * misspelled, a malformed line), or null where there is none: one more pass over KEYS, only on the
   * way to a "no key rows" or "no keys for document" error that such rows would explain better.
   */
  static InputError unplacedKey(Dataset<Token> keys, Shape s, boolean prefill) {
    List<Token> first = keys.filter(col("docId").isNull().or(col("pos").isNull())).limit(1).collectAsList();
    try {
      if (!first.isEmpty()) {
        validateKey(first.get(0), s, prefill);
      }
    } catch (InputError e) {
      return e;
    }
    return null;
  }

  static Token validateKey(Token t, Shape s, boolean prefill) {
    String file = t.getFile();
    String bad = readProblem(t);
    if (bad != null) {
      throw new InputError("KEYS file " + file + (unreadableRow(bad) ? Formats.malformedLine(file, bad) : ", doc '"
          + t.getDocId() + "', pos " + t.getPos() + ": " + bad));
    }
    if (t.getDocId() == null) {
      throw new InputError("KEYS file " + file + Formats.lineOfRow(file, List.of("doc_id"), r -> r.get("doc_id") == null)
          + ": a row has no doc_id (pos " + t.getPos() + ")");
    }
    Formats.refuseLoneSurrogateId("KEYS", file, "doc_id", t.getDocId());
    String where = "KEYS file " + file + ", doc '" + t.getDocId() + "', pos " + t.getPos();
    if (t.getPos() == null) {
      throw new InputError("KEYS file " + file + Formats.lineOfRow(file, List.of("pos", "doc_id"), r -> r.get("pos") == null
          && t.getDocId().equals(r.get("doc_id"))) + ", doc '" + t.getDocId() + "': column 'pos' is missing or null "
          + "(in JSON: the field absent, misspelled or null)");
    }
    checkVector(t.getK(), "k", s.kvHeads() * s.dim(), "kv-heads*dim" + s.origin(), where);
    checkVector(t.getV(), "v", s.kvHeads() * s.dim(), "kv-heads*dim" + s.origin(), where);
    if (prefill) {
      checkVector(t.getQ(), "q", s.heads() * s.dim(), "heads*dim" + s.origin(), where);
    }
    t.setFile(null);
    return t;
  }

  /** A row whose fields could not be read at all (no document or position to name): say the file only. */
  private static boolean unreadableRow(String problem) {
    return problem.startsWith("malformed") || problem.equals(Formats.PARQUET_READ_AS_JSON);
  }

  static Token validateQuery(Token t, Shape s) {
    String file = t.getFile();
    String row = ", query '" + t.getQueryId() + "', doc '" + t.getDocId() + "', pos "
        + (t.getPos() == null ? "(none)" : t.getPos());
    String where = "QUERIES file " + file + row;
    String bad = readProblem(t);
    if (bad != null) {
      throw new InputError(unreadableRow(bad) ? "QUERIES file " + file + Formats.malformedLine(file, bad) : where + ": "
          + bad);
    }
    if (t.getQueryId() == null || t.getDocId() == null) {
      String field = t.getQueryId() == null ? "query_id" : "doc_id";
      String other = t.getQueryId() == null ? "doc_id" : "query_id";
      String value = t.getQueryId() == null ? t.getDocId() : t.getQueryId();
      throw new InputError("QUERIES file " + file + Formats.lineOfRow(file, List.of(field, other),
          r -> r.get(field) == null && (value == null || value.equals(r.get(other)))) + row + ": column '" + field
          + "' is missing or null");
    }
    Formats.refuseLoneSurrogateId("QUERIES", file, "query_id", t.getQueryId());
    Formats.refuseLoneSurrogateId("QUERIES", file, "doc_id", t.getDocId());
    checkVector(t.getQ(), "q", s.heads() * s.dim(), "heads*dim" + s.origin(), where);
    t.setFile(null);
    return t;
  }

  private static void checkVector(float[] x, String name, int len, String lenName, String where) {
    if (x == null) {
      throw new InputError(where + ": column '" + name + "' is missing or null");
    }
    if (x.length != len) {
      throw new InputError(where + ": " + name + " has " + x.length + " floats, expected " + len + " (" + lenName + ")");
    }
    for (int i = 0; i < x.length; i++) {
      if (!Float.isFinite(x[i])) {
        throw new InputError(where + ": " + name + "[" + i + "] is " + x[i] + " (vectors must be finite"
            + (Float.isInfinite(x[i]) ? "; a value past float32's range, about 3.4e38, reads as infinite)" : ")"));
      }
    }
  }

  // ---------------------------------------------------------------- chunks and blocks

  /** Decode: the chunk of one group of key tokens, in any order. */
  static Chunk buildChunk(Iterator<Token> it, Shape s, int chunkLen, String keysPath) {
    List<Token> toks = new ArrayList<>();
    it.forEachRemaining(toks::add);
    toks.sort(Comparator.comparingLong(Token::getPos));
    return chunkOf(toks, s, chunkLen, keysPath);
  }

  /**
   * The chunk of key tokens sorted by position: their K/V (none if the first token carries none) and
   * their q (none likewise). Two tokens at one position are bad input.
   */
  static Chunk chunkOf(List<? extends KeyVectors> toks, Shape s, int chunkLen, String keysPath) {
    int n = toks.size(), d = s.dim();
    boolean withKv = toks.get(0).getK() != null, withQ = toks.get(0).getQ() != null;
    long[] pos = new long[n];
    float[] k = withKv ? new float[s.kvHeads() * n * d] : null;
    float[] v = withKv ? new float[k.length] : null;
    float[] q = withQ ? new float[s.heads() * n * d] : null;
    for (int t = 0; t < n; t++) {
      KeyVectors x = toks.get(t);
      pos[t] = x.getPos();
      if (t > 0 && pos[t] == pos[t - 1]) {
        throw new InputError.DuplicateKey(keysPath, x.getDocId(), pos[t]);
      }
      if (withKv) {
        for (int h = 0; h < s.kvHeads(); h++) {
          System.arraycopy(x.getK(), h * d, k, (h * n + t) * d, d);
          System.arraycopy(x.getV(), h * d, v, (h * n + t) * d, d);
        }
      }
      if (withQ) {
        for (int h = 0; h < s.heads(); h++) {
          System.arraycopy(x.getQ(), h * d, q, (h * n + t) * d, d);
        }
      }
    }
    Chunk c = new Chunk();
    c.setDocId(toks.get(0).getDocId());
    c.setChunk(Chunking.index(pos[0], chunkLen));
    c.setKPos(pos);
    c.setK(k);
    c.setV(v);
    c.setQ(q);
    return c;
  }

  /**
   * Prefill: a validated key token's rows, one per block that sees its chunk (with its K/V) and one
   * for its own block (with its q; one row when that block sees its own chunk, as causal blocks do).
   */
  static Iterator<BlockToken> route(Token t, PairPlan plan, int chunkLen) {
    long c = Chunking.index(t.getPos(), chunkLen);
    String doc = t.getDocId();
    long own = plan.groupOf(doc, c)[0]; // the group of the token's own block, which takes its q
    long[] groups = plan.seenBy(doc, c);
    List<BlockToken> r = new ArrayList<>(groups.length + 1);
    boolean ownSees = false;
    for (long g : groups) {
      r.add(BlockToken.of(t, g, plan.partitionOf(doc, g), c, true, g == own));
      ownSees |= g == own;
    }
    if (!ownSees) {
      r.add(BlockToken.of(t, own, plan.partitionOf(doc, own), c, false, true));
    }
    return r.iterator();
  }

  static QueryBlock prefillBlock(Chunk c) {
    QueryBlock b = new QueryBlock();
    b.setDocId(c.getDocId());
    b.setBlock(c.getChunk());
    b.setHasPos(true);
    b.setQPos(c.getKPos());
    b.setQ(c.getQ());
    return b;
  }

  /**
   * The position gap at which a decode block ends early: with a window W, a block is paired with every
   * chunk between its first and last query, and a gap of W + chunkLen or more between two of them
   * holds a whole chunk neither sees. Without a window every earlier chunk is seen (causal) or every
   * chunk (no mask): no gap is wasted.
   */
  static long blockGap(AttentionOptions attn, int chunkLen) {
    return attn.window() > 0 ? attn.window() + Math.min(chunkLen, Long.MAX_VALUE - attn.window()) : Long.MAX_VALUE;
  }

  /**
   * A document's queries as blocks of up to {@code blockLen}, by position (those without one last);
   * a block also ends before a query {@code gap} or more positions past the one before it
   * ({@link #blockGap}), so that a windowed block is not paired with the chunks between far-apart
   * queries (64 queries spread over 1M tokens would have been paired with every chunk). A query's
   * bits do not depend on its block ({@link LseMerge} merges only the chunks it sees).
   */
  static Iterator<QueryBlock> buildBlocks(String doc, Iterator<Token> it, Shape s, int blockLen, long gap, String path) {
    List<Token> qs = new ArrayList<>();
    it.forEachRemaining(qs::add);
    qs.sort(Comparator.comparing((Token t) -> t.getPos() == null)
        .thenComparing(t -> t.getPos() == null ? 0L : t.getPos())
        .thenComparing(Token::getQueryId));
    Set<String> seen = new HashSet<>();
    for (Token t : qs) {
      if (!seen.add(t.getQueryId())) {
        throw new InputError("QUERIES " + path + ": duplicate query_id '" + t.getQueryId() + "' in doc '" + doc + "'");
      }
    }
    List<QueryBlock> out = new ArrayList<>();
    int d = s.dim(), h = s.heads();
    int i = 0;
    while (i < qs.size()) {
      boolean hasPos = qs.get(i).getPos() != null;
      int j = i;
      while (j < qs.size() && j - i < blockLen && (qs.get(j).getPos() != null) == hasPos
          // Sorted, so the difference is >= 0: as unsigned it is exact even past Long.MAX_VALUE.
          && !(hasPos && j > i && Long.compareUnsigned(qs.get(j).getPos() - qs.get(j - 1).getPos(), gap) >= 0)) {
        j++;
      }
      int n = j - i;
      String[] ids = new String[n];
      long[] pos = new long[n];
      float[] q = new float[h * n * d];
      for (int t = 0; t < n; t++) {
        Token x = qs.get(i + t);
        ids[t] = x.getQueryId();
        pos[t] = hasPos ? x.getPos() : 0L;
        for (int hh = 0; hh < h; hh++) {
          System.arraycopy(x.getQ(), hh * d, q, (hh * n + t) * d, d);
        }
      }
      QueryBlock b = new QueryBlock();
      b.setDocId(doc);
      b.setBlock(out.size());
      b.setHasPos(hasPos);
      b.setIds(ids);
      b.setQPos(pos);
      b.setQ(q);
      out.add(b);
      i = j;
    }
    return out.iterator();
  }

  /**
   * (doc, chunk index, min pos, max pos, key count) of every chunk, by an aggregation over the key
   * positions alone (the vectors are pruned from the scan). Rows without doc_id or pos are left to
   * the validation before the keys' shuffle, which names them.
   */
  static List<RangeMeta> chunkRanges(Dataset<Token> keys, int chunkLen) {
    Column pos = col("pos");
    return keys.toDF()
        .where(col("docId").isNotNull().and(pos.isNotNull()))
        .groupBy(col("docId"), Chunking.indexColumn("pos", chunkLen).as("index"))
        .agg(functions.min(pos).as("min"), functions.max(pos).as("max"), functions.count(lit(1)).as("count"))
        .select(col("docId"), col("index"), col("min"), col("max"), col("count"), lit(true).as("hasPos"),
            lit(null).cast("string").as("sample"))
        .as(Encoders.bean(RangeMeta.class))
        .collectAsList();
  }

  static RangeMeta blockMeta(QueryBlock b) {
    RangeMeta m = new RangeMeta();
    long[] p = b.getQPos();
    m.setDocId(b.getDocId());
    m.setIndex(b.getBlock());
    m.setMin(Arrays.stream(p).min().orElse(0));
    m.setMax(Arrays.stream(p).max().orElse(0));
    m.setCount(p.length);
    m.setHasPos(b.getHasPos());
    m.setSample(b.getIds() == null ? null : b.getIds()[0]);
    return m;
  }

  // ---------------------------------------------------------------- the kernel on one pair

  /** The job's backend opened in this task, its name recorded for the summary. */
  private static AttentionBackend task(JobBackend backend, CollectionAccumulator<String> used) {
    AttentionBackend b = backend.open();
    used.add(b.name());
    return b;
  }

  /**
   * The kernel on every (block, chunk) pair of one chunk. Lazy: one block is computed when the
   * previous block's partial rows have been consumed, so a task holds one block's state at a time,
   * not the partials of every block that sees the chunk.
   */
  static Iterator<Partial> computePairs(Iterator<QueryBlock> blocks, Iterator<Chunk> chunks, Shape s,
      AttentionOptions attn, AttentionBackend backend) {
    FaultHooks.at(FaultHooks.MAP); // test-only fault injection, off by default
    Chunk c = chunks.hasNext() ? chunks.next() : null;
    return oneAfterAnother(() -> {
      if (!blocks.hasNext()) {
        return null;
      }
      QueryBlock b = blocks.next();
      if (c == null) { // the plan pairs blocks only with chunks that exist: a lost chunk is a bug, not empty
        throw new IllegalStateException("query block " + b.getBlock() + " of doc '" + b.getDocId()
            + "': the planned key chunk " + b.getChunk() + " did not arrive");
      }
      return pairRows(backend, b, c, s, attn);
    });
  }

  /**
   * The iterators {@code more} gives, one after another, each asked for only once the one before is
   * used up ({@code more} returns null when none is left): a task holds one block's or group's
   * partials at a time.
   */
  static <T> Iterator<T> oneAfterAnother(java.util.function.Supplier<Iterator<T>> more) {
    return new Iterator<>() {
      private Iterator<T> current = java.util.Collections.emptyIterator();
      private boolean ended;

      @Override
      public boolean hasNext() {
        while (!current.hasNext() && !ended) {
          Iterator<T> n = more.get();
          ended = n == null;
          current = ended ? current : n;
        }
        return current.hasNext();
      }

      @Override
      public T next() {
        if (!hasNext()) {
          throw new java.util.NoSuchElementException();
        }
        return current.next();
      }
    };
  }

  /**
   * A prefill task: its partition's rows, sorted by document, group, then as {@link #computeGroup} takes
   * them; one group at a time, each computed when its rows are reached.
   */
  static Iterator<Partial> computeGroups(Iterator<BlockToken> rows, PairPlan plan, Shape s, AttentionOptions attn,
      AttentionBackend backend, int chunkLen, String keysPath) {
    BlockToken[] head = {rows.hasNext() ? rows.next() : null}; // the first row not yet taken
    return oneAfterAnother(() -> {
      if (head[0] == null) {
        return null;
      }
      String doc = head[0].getDocId();
      long group = head[0].getGroup();
      Iterator<BlockToken> groupRows = new Iterator<>() {
        @Override
        public boolean hasNext() {
          return head[0] != null && head[0].getGroup() == group && head[0].getDocId().equals(doc);
        }

        @Override
        public BlockToken next() {
          if (!hasNext()) {
            throw new java.util.NoSuchElementException();
          }
          BlockToken r = head[0];
          head[0] = rows.hasNext() ? rows.next() : null;
          return r;
        }
      };
      // takes every row of the group (or throws: a row the plan does not pair), so head is the next group's
      return computeGroup(groupRows, doc, plan.groupOf(doc, group), plan, s, attn, backend, chunkLen, keysPath);
    });
  }

  /**
   * One prefill group: its query blocks ({@link PairPlan#groupOf}: one, or a pair) against the chunks
   * each sees. The rows come sorted: the blocks' own chunks (the rows with q) first, then every other
   * chunk in order, each by position. Each chunk is assembled once and paired with every block of the
   * group that sees it, then dropped; each block's states merge in chunk order as they come, in the tree
   * {@link AttentionState#mergeAll} builds (the tree {@link LseMerge} would build from the same partial
   * states), so a block's bits do not depend on its group. It holds its blocks (with their own chunks'
   * K/V), one other chunk and about log2(chunks) states per block. Yields each token's final state.
   */
  static Iterator<Partial> computeGroup(Iterator<BlockToken> rows, String doc, long[] blocks, PairPlan plan, Shape s,
      AttentionOptions attn, AttentionBackend backend, int chunkLen, String keysPath) {
    FaultHooks.at(FaultHooks.MAP); // test-only fault injection, off by default
    ChunkRows in = new ChunkRows(rows);
    int nb = blocks.length, h = s.heads(), d = s.dim();
    Chunk[] own = new Chunk[nb];
    QueryBlock[] qb = new QueryBlock[nb];
    long[][] visible = new long[nb][], keys = new long[nb][];
    AttentionState.TreeMerge[] merged = new AttentionState.TreeMerge[nb];
    java.util.TreeSet<Long> wanted = new java.util.TreeSet<>();
    for (int i = 0; i < nb; i++) {
      List<BlockToken> ownRows = in.take(blocks[i]);
      if (ownRows.isEmpty() || ownRows.get(0).getQ() == null) { // the q rows sort first
        throw new IllegalStateException("query block " + blocks[i] + " of doc '" + doc
            + "': K/V arrived without the block's q");
      }
      own[i] = chunkOf(ownRows, s, chunkLen, keysPath);
      qb[i] = prefillBlock(own[i]);
      visible[i] = plan.chunksOf(doc, blocks[i]);
      keys[i] = new long[qb[i].getQPos().length];
      merged[i] = visible[i].length == 0 ? null : new AttentionState.TreeMerge(visible[i].length);
      for (long c : visible[i]) {
        wanted.add(c);
      }
    }
    for (long want : wanted) {
      int ownAt = Arrays.binarySearch(blocks, want);
      Chunk c;
      if (ownAt >= 0) {
        c = own[ownAt];
        if (c.getK() == null) {
          throw new IllegalStateException("query block " + want + " of doc '" + doc
              + "': its own chunk is planned but its K/V did not arrive");
        }
      } else {
        List<BlockToken> part = in.take(want);
        if (part.isEmpty()) { // the plan's chunk is lost: an error, never an empty state
          throw new IllegalStateException("query blocks " + Arrays.toString(blocks) + " of doc '" + doc
              + "': the planned key chunk " + want + (in.hasNext() ? " did not arrive (chunk " + in.nextChunk()
              + " came instead)" : " did not arrive"));
        }
        c = chunkOf(part, s, chunkLen, keysPath);
      }
      for (int i = 0; i < nb; i++) {
        if (Arrays.binarySearch(visible[i], want) >= 0) {
          for (int t = 0; t < keys[i].length; t++) {
            keys[i][t] += attn.visibleCount(c.getKPos(), qb[i].getQPos()[t]);
          }
          merged[i].add(kernel(backend, qb[i], c, s, attn));
        }
      }
    }
    if (in.hasNext()) {
      throw new IllegalStateException("query blocks " + Arrays.toString(blocks) + " of doc '" + doc + "': chunk "
          + in.nextChunk() + " arrived, which the plan does not pair with them");
    }
    java.util.stream.Stream<Partial> out = java.util.stream.Stream.empty();
    for (int i = 0; i < nb; i++) {
      long[] k = keys[i];
      out = java.util.stream.Stream.concat(out, rowStream(qb[i], merged[i] == null ? AttentionState.empty(k.length, h,
          d) : merged[i].result(), t -> k[t]));
    }
    return out.iterator();
  }

  /** A block's sorted rows, taken a chunk at a time. */
  private static final class ChunkRows {
    private final Iterator<BlockToken> it;
    private BlockToken next;

    ChunkRows(Iterator<BlockToken> it) {
      this.it = it;
      next = it.hasNext() ? it.next() : null;
    }

    boolean hasNext() {
      return next != null;
    }

    long nextChunk() {
      return next.getChunk();
    }

    /** The rows of chunk c if they come next, else none. */
    List<BlockToken> take(long c) {
      List<BlockToken> r = new ArrayList<>();
      while (next != null && next.getChunk() == c) {
        r.add(next);
        next = it.hasNext() ? it.next() : null;
      }
      return r;
    }
  }

  /** One pair's partial states, a row per query. */
  private static Iterator<Partial> pairRows(AttentionBackend backend, QueryBlock b, Chunk c, Shape s,
      AttentionOptions attn) {
    AttentionOptions o = b.getHasPos() ? attn : attn.withCausal(false).withWindow(0);
    AttentionState st = kernel(backend, b, c, s, o);
    return rows(b, st, t -> o.visibleCount(c.getKPos(), b.getQPos()[t]));
  }

  /** The kernel on one (block, chunk) pair; a non-finite score is bad input named by document and query. */
  private static AttentionState kernel(AttentionBackend backend, QueryBlock b, Chunk c, Shape s, AttentionOptions o) {
    int n = b.getQPos().length, tk = c.getKPos().length, d = s.dim();
    try {
      return backend.forward(new Tensor(b.getQ(), 1, s.heads(), n, d),
          new Tensor(c.getK(), 1, s.kvHeads(), tk, d), new Tensor(c.getV(), 1, s.kvHeads(), tk, d), b.getQPos(),
          c.getKPos(), o);
    } catch (NonFiniteScoreException e) {
      String query = b.getIds() != null ? "query '" + b.getIds()[e.queryToken] + "'"
          + (b.getHasPos() ? " (pos " + e.queryPos + ")" : "") : "the token at pos " + e.queryPos;
      throw new InputError("doc '" + b.getDocId() + "', " + query + ", head " + e.head + ", against the key at pos "
          + e.keyPos + ": the attention score is " + e.score + " in float32 (q.k overflows: q and k hold values too "
          + "large for float32 attention)");
    } catch (IllegalArgumentException e) { // e.g. an output that overflows float32: v too large
      long[] p = b.getQPos();
      String[] ids = b.getIds();
      String queries = ids != null ? "queries '" + ids[0] + "'..'" + ids[ids.length - 1] + "'"
          : "the tokens at pos " + p[0] + ".." + p[p.length - 1];
      throw new InputError("doc '" + b.getDocId() + "', " + queries + " against the keys at pos " + c.getKPos()[0]
          + ".." + c.getKPos()[tk - 1] + ": " + e.getMessage());
    }
  }

  /** The block's state as one row per query: its identity, the keys it attended, its lse and o. */
  private static Iterator<Partial> rows(QueryBlock b, AttentionState st, java.util.function.IntToLongFunction keys) {
    return rowStream(b, st, keys).iterator();
  }

  private static java.util.stream.Stream<Partial> rowStream(QueryBlock b, AttentionState st,
      java.util.function.IntToLongFunction keys) {
    float[] so = st.o(), sl = st.lse();
    int h = st.heads(), w = h * st.dim();
    return java.util.stream.IntStream.range(0, st.rows()).mapToObj(t -> {
      Partial p = new Partial();
      p.setDocId(b.getDocId());
      p.setQueryId(b.getIds() == null ? null : b.getIds()[t]);
      p.setPos(b.getHasPos() ? b.getQPos()[t] : null);
      p.setChunk(b.getChunk());
      p.setKeyCount(keys.applyAsLong(t));
      p.setLse(Arrays.copyOfRange(sl, t * h, (t + 1) * h));
      p.setO(Arrays.copyOfRange(so, t * w, (t + 1) * w));
      return p;
    });
  }


}
