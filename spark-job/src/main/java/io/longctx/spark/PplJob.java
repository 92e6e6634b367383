package io.longctx.spark;

import ai.djl.huggingface.tokenizers.HuggingFaceTokenizer;
import ai.djl.ndarray.NDManager;
import io.longctx.djl.DocumentScore;
import io.longctx.djl.LlamaConfig;
import io.longctx.djl.LlamaModel;
import io.longctx.djl.LlamaTranslator;
import io.longctx.djl.Safetensors;
import java.io.IOException;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.spark.Partitioner;
import org.apache.spark.TaskContext;
import org.apache.spark.api.java.JavaRDD;
import org.apache.spark.sql.Column;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.functions;
import org.apache.spark.sql.types.ArrayType;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.storage.StorageLevel;
import org.apache.spark.util.TaskCompletionListener;
import scala.Tuple2;

/**
 * {@code longctx ppl}: the log-likelihood of whole documents under a Llama-family checkpoint, one
 * document per Spark task ({@link LlamaModel#score}: chunked over a KV chunk list, vocabulary LSE
 * over shards, so neither T x T nor T x V ever exists); documents longer than --split-above
 * spread over many tasks layer by layer ({@link SplitPpl}), with the same bits. The model is loaded
 * once per executor JVM and shared by its tasks.
 */
public final class PplJob {

  public static final String HELP = """
      usage: longctx ppl --model DIR --input PATH --output OUT [options]

      Log-likelihood of whole documents under a Llama-family checkpoint (Hugging Face layout:
      config.json, model.safetensors or shards with model.safetensors.index.json, tokenizer.json for
      text input). A document runs chunk by chunk through the model with its KV cache as a list of
      chunks, so memory is O(document) and never O(T^2) or O(T x vocab). Documents up to --split-above
      tokens run one per task; longer ones are split: their chunks spread over many tasks, layer by
      layer (keys and values sent to the chunks that attend to them, hidden states checkpointed after
      every layer, so a lost executor costs one layer). Both paths give the same bits at the same
      --chunk-len.

      Input rows (Parquet or JSON Lines): doc_id string and exactly one of text string (tokenized with
      tokenizer.json and its own special tokens; valid Unicode: no invalid UTF-8 in Parquet, no lone
      surrogate escape such as \\ud800 in JSON) or tokens array<int> (scored exactly as given).
      Output rows (same format): doc_id, n_tokens long, sum_logprob double (natural log, sum over
      i = 1..n-1 of log p(t_i | t_<i); 0 for one token or none, an empty tokens array), ppl double
      (exp(-sum_logprob/(n_tokens-1)); null below 2 tokens), bits_per_byte double (only when the
      input has a text column, as JSON input always does: -sum_logprob/ln 2/UTF-8 bytes; null below 2
      tokens and for tokens rows),
      and with --per-token logprobs array<float> (n_tokens-1 values). Written to a hidden sibling and
      renamed to OUT at the end (as score).

      Options:
        --model DIR           checkpoint directory (required): a local path or file: URI, read at the
                              same place on the driver and on every executor (a shared mount on a
                              cluster; hdfs:// and other schemes are refused)
        --input PATH          documents (required)
        --output OUT          output directory (required; must not exist unless --overwrite)
        --overwrite           replace OUT if it is a previous longctx output
        --format F            parquet | json, the input (default: from the input extension)
        --output-format F     parquet | json, OUT (default: the input format)
        --per-token           add the logprobs column
        --chunk-len N         tokens per chunk (default 512; any length gives the same sums within
                              1e-5 relative, typically ~1e-6: float32 rounding)
        --partitions N        tasks of the one-document-per-task path (default: one per document, at most 8
                              per core of the cluster: a corpus of many short documents then pays
                              fewer task start-ups and writes fewer files)
        --split-above N       split documents longer than N tokens (0: every document of 2+ tokens).
                              Default: what one task can hold, a fifth of the executor heap
                              (spark.executor.memory, default 1g; the driver's heap with a local
                              master) shared by the executor's concurrent tasks (spark.executor.cores
                              / spark.task.cpus), over the KV cache per token (layers x
                              kv heads x head dim x 8 bytes); never for a sliding-window model whose
                              window fits (its one-task cache is bounded): set N to spread long
                              documents for speed. The summary prints the value used
        --split-partitions N  tasks per layer of the split path (default: Spark's default parallelism,
                              or more to keep a task's hidden rows under 64 MiB; at most the chunks)
        --checkpoint-dir DIR  where the split path checkpoints each layer; every executor must reach
                              it (default: a hidden .OUT-tmp-*-checkpoint beside OUT); the run makes
                              its own directory there and deletes it at the end
        --balance B           cost | contiguous: place split blocks by estimated work (default) or in
                              contiguous runs (to measure the difference); never changes the result

      Bad input exits 2 naming the document: a token id outside the vocabulary, a row with neither or
      both of text and tokens, a missing doc_id (named by its file and its line, or in Parquet its row_index), text
      that is not valid Unicode (Parquet: with the byte offset; JSON Lines: a lone surrogate escape with its
      character offset, raw invalid UTF-8 as a malformed record with its line), a document on which the model's
      values leave float32 (with the layer and position); an unreadable or inconsistent checkpoint or
      tokenizer names the file and tensor. A summary goes to stderr at the end.
      """ + LongctxMain.COMMON_HELP;

  /** Options of one run. */
  public static final class Options implements java.io.Serializable {
    private static final long serialVersionUID = 1L;
    public String model;
    public String input;
    public String output;
    public String format;
    /** parquet or json; null: the input format. */
    public String outputFormat;
    public boolean perToken;
    public int chunkLen = 512;
    public int partitions;
    public boolean overwrite;
    /** Documents longer than this many tokens take the split path; -1: derived from memory ({@link #defaultSplitAbove}). */
    public long splitAbove = -1;
    /** Tasks per layer of the split path; 0: Spark's default parallelism. */
    public int splitPartitions;
    /** Where the split path checkpoints (a directory is made inside and deleted); null: beside OUT. */
    public String checkpointDir;
    /** How the split path places blocks in tasks. */
    public SplitPpl.Balance balance = SplitPpl.Balance.COST;

    String resolvedFormat() {
      return Formats.resolve(format, input);
    }

    String resolvedOutputFormat() {
      return outputFormat != null ? outputFormat : resolvedFormat();
    }

    void check() {
      for (String[] r : new String[][] {{"--model", model}, {"--input", input}, {"--output", output}}) {
        if (r[1] == null) {
          throw new IllegalArgumentException(r[0] + " is required");
        }
      }
      Formats.check("--format", format);
      Formats.check("--output-format", outputFormat);
      if (chunkLen < 1) {
        throw new IllegalArgumentException("--chunk-len must be >= 1, got " + chunkLen);
      }
      if (partitions < 0) {
        throw new IllegalArgumentException("--partitions must be >= 1, got " + partitions);
      }
      if (splitAbove < -1) {
        throw new IllegalArgumentException("--split-above must be >= 0, got " + splitAbove);
      }
      if (splitPartitions < 0) {
        throw new IllegalArgumentException("--split-partitions must be >= 1, got " + splitPartitions);
      }
    }
  }

  /** What a run did. */
  public record Summary(long documents, long tokens, double wallSeconds, String model, String output, long splitAbove,
      boolean splitAboveGiven, SplitPpl.Stats split) {
    @Override
    public String toString() {
      return String.format(Locale.ROOT, "longctx ppl summary%n  documents      %d%n  tokens         %d%n"
          + "  model          %s%n  split above    %s%n  split path     %s%n  wall time      %.2f s%n"
          + "  tokens/s       %.0f%n  output         %s%n",
          documents, tokens, model, splitAbove == Long.MAX_VALUE
              ? (splitAboveGiven ? "never (--split-above)" : "never (the window bounds the one-task cache)")
              : splitAbove + " tokens" + (splitAboveGiven ? " (--split-above)" : ""),
          split == null ? "none (every document in one task)" : split.describe(),
          wallSeconds, wallSeconds > 0 ? tokens / wallSeconds : 0, output);
    }
  }

  private PplJob() {}

  /** The command line: parse, run on a session (the default one if any, else a new one). */
  static int cli(String[] argv, PrintStream out, PrintStream err) throws Exception {
    Args a = Args.parse(argv, List.of("--model", "--input", "--output", "--format", "--output-format", "--chunk-len",
        "--partitions", "--split-above", "--split-partitions", "--checkpoint-dir", "--balance"),
        List.of("--per-token", "--overwrite"));
    if (a.help) {
      out.print(HELP);
      return 0;
    }
    progressMillis(); // a bad -D value: exit 2 before any work
    Options o = new Options();
    // Absolute from the driver's directory: executors read it with their own working directory.
    String model = modelPath(a.get("--model"));
    o.model = model == null ? null : java.nio.file.Path.of(model).toAbsolutePath().normalize().toString();
    o.input = a.get("--input");
    o.output = a.get("--output");
    o.format = a.get("--format") == null ? null : a.get("--format").toLowerCase(Locale.ROOT);
    o.outputFormat = a.get("--output-format") == null ? null : a.get("--output-format").toLowerCase(Locale.ROOT);
    o.perToken = a.flag("--per-token");
    o.chunkLen = a.intValue("--chunk-len", o.chunkLen);
    o.partitions = a.positiveIntOrAbsent("--partitions"); // 0 in Options: not given
    o.overwrite = a.flag("--overwrite");
    String split = a.get("--split-above");
    if (split != null) {
      try {
        o.splitAbove = Long.parseLong(split);
      } catch (NumberFormatException e) {
        throw new IllegalArgumentException("--split-above must be a whole number of tokens, got '" + split + "'");
      }
      if (o.splitAbove < 0) {
        throw new IllegalArgumentException("--split-above must be >= 0, got " + split);
      }
    }
    o.splitPartitions = a.positiveIntOrAbsent("--split-partitions");
    o.checkpointDir = a.get("--checkpoint-dir");
    String balance = a.get("--balance");
    if (balance != null) {
      o.balance = switch (balance.toLowerCase(Locale.ROOT)) {
        case "cost" -> SplitPpl.Balance.COST;
        case "contiguous" -> SplitPpl.Balance.CONTIGUOUS;
        default -> throw new IllegalArgumentException("--balance must be cost or contiguous, got '" + balance + "'");
      };
    }
    o.check();
    return Sessions.run("longctx ppl", a.get("--master"), a.confs, spark -> {
      err.print(run(spark, o, err));
      return 0;
    });
  }

  public static Summary run(SparkSession spark, Options opt) {
    return run(spark, opt, null);
  }

  /**
   * Runs the job (when documents split, it sets the SparkContext's checkpoint directory to the run's
   * own, deleted at the end); with {@code progress} non-null, a start line (documents, tasks) and then, while
   * documents and tokens are scored, a line at most every {@link #PROGRESS_SECONDS_PROPERTY} seconds
   * (default 10) with the documents and tokens done so far ({@link ProgressListener}).
   */
  public static Summary run(SparkSession spark, Options opt, PrintStream progress) {
    long t0 = System.nanoTime();
    opt.check();
    if (progress != null) {
      progressMillis(); // a bad -D value: refused before any job
    }
    try {
      return runChecked(spark, opt, t0, progress);
    } catch (RuntimeException e) {
      throw InputError.surfaced(e);
    } catch (IOException e) {
      throw new java.io.UncheckedIOException(e);
    } finally {
      Sessions.label(spark, null);
    }
  }

  static final String CORRUPT = "_corrupt_record";
  /** The JSON type of a row's text (schema_of_variant: STRING, VOID for null, ARRAY<...>, ...). */
  private static final String TEXT_TYPE = "_text_type";
  /**
   * In the corrupt-record column of a JSON row: its text is a JSON value of the type that follows,
   * not a string (Spark's reader would hand such a value over as its JSON source, which would be scored).
   */
  static final String TEXT_NOT_A_STRING = "\u0000text is a JSON ";

  /** A partition's tokens and its documents to split: (index, (doc_id, {tokens, bytes})). */
  record PartitionLengths(long tokens, List<Tuple2<Long, Tuple2<String, long[]>>> longDocs) implements
      java.io.Serializable {}

  /** System property: seconds between progress lines (default 10). */
  public static final String PROGRESS_SECONDS_PROPERTY = "longctx.progressSeconds";

  /** {@link #PROGRESS_SECONDS_PROPERTY} in milliseconds; a value that is not a positive count of seconds is refused. */
  static long progressMillis() {
    String v = System.getProperty(PROGRESS_SECONDS_PROPERTY);
    if (v == null) {
      return 10_000;
    }
    try {
      long s = Long.parseLong(v.trim());
      if (s >= 1 && s <= Long.MAX_VALUE / 1000) {
        return s * 1000;
      }
    } catch (NumberFormatException e) {
      // named below
    }
    throw new InputError("-D" + PROGRESS_SECONDS_PROPERTY + " must be a positive number of seconds, got '" + v + "'");
  }

  private static Summary runChecked(SparkSession spark, Options opt, long t0, PrintStream progress)
      throws IOException {
    Configuration hconf = spark.sparkContext().hadoopConfiguration();
    InputError.requireExists(hconf, opt.input, "INPUT");
    LlamaConfig cfg = checkModel(opt.model);
    int vocab = cfg.vocabSize;
    Map<String, String> inputs = new LinkedHashMap<>();
    inputs.put("INPUT", opt.input);
    // The model is read from the local file system (by every executor), whatever fs.defaultFS says.
    inputs.put("MODEL", "file://" + java.nio.file.Path.of(opt.model).toAbsolutePath().normalize());
    if (opt.checkpointDir != null) {
      requireDirectoryOrAbsent(hconf, opt.checkpointDir);
    }
    if (opt.checkpointDir != null && OutputCommit.within(hconf, opt.checkpointDir, opt.output)) {
      // The checkpoints would be made inside OUT before the output exists, and the commit then finds OUT taken.
      throw new InputError("--checkpoint-dir " + opt.checkpointDir + " is inside OUT " + opt.output
          + ": the output replaces OUT as a whole, so give a checkpoint directory outside it");
    }
    for (Map.Entry<String, String> in : inputs.entrySet()) { // its files would read as the input changing
      if (opt.checkpointDir != null && OutputCommit.within(hconf, opt.checkpointDir, in.getValue())) {
        throw new InputError("--checkpoint-dir " + opt.checkpointDir + " is inside " + in.getKey() + " "
            + in.getValue() + ": give a checkpoint directory apart from the inputs");
      }
    }
    OutputCommit commit = OutputCommit.prepare(hconf, opt.output, opt.overwrite, "ppl", inputs);

    String fmt = opt.resolvedFormat();
    Sessions.label(spark, "longctx ppl: input schema");
    Dataset<Row> df = read(spark, fmt, opt.input);
    commit.requireAllRead("INPUT", opt.input, df.inputFiles());
    boolean hasText = Arrays.asList(df.columns()).contains("text");
    boolean hasTokens = Arrays.asList(df.columns()).contains("tokens");
    // JSON input always has a text column (its schema is fixed): where the tokenizer is missing or
    // unreadable, look for a row that uses it before failing (a scan paid only then); a tokens-only
    // input runs without one.
    if (hasText) {
      try {
        checkTokenizer(opt.model);
      } catch (InputError e) {
        if (!df.where(functions.col("text").isNotNull()).isEmpty()) {
          throw e;
        }
      }
    }
    List<Column> cols = new ArrayList<>();
    cols.add(functions.col("doc_id").cast(DataTypes.StringType).as("doc_id"));
    // text as its stored UTF-8 bytes: checked and counted as stored (a string would have replaced invalid bytes)
    cols.add((hasText ? functions.col("text") : functions.lit(null)).cast(DataTypes.BinaryType).as("text"));
    cols.add(hasTokens ? functions.col("tokens").cast(DataTypes.createArrayType(DataTypes.LongType)).as("tokens")
        : functions.lit(null).cast(DataTypes.createArrayType(DataTypes.LongType)).as("tokens"));
    cols.add(fmt.equals("json") ? functions.coalesce(functions.col(CORRUPT), functions.when(
        functions.col(TEXT_TYPE).isNotNull().and(functions.not(functions.col(TEXT_TYPE).isin("STRING", "VOID"))),
        functions.concat(functions.lit(TEXT_NOT_A_STRING), functions.col(TEXT_TYPE)))).as(CORRUPT)
        : functions.lit(null).cast(DataTypes.StringType).as(CORRUPT));
    cols.add(functions.input_file_name().as("file"));
    Dataset<Row> docs = df.select(cols.toArray(new Column[0]));

    Sessions.label(spark, "longctx ppl: count documents");
    long n = docs.count();
    if (n == 0) {
      throw new InputError("INPUT " + opt.input + ": no documents");
    }
    requireUniqueDocIds(docs, opt.input);
    int parts = opt.partitions > 0 ? opt.partitions : defaultPartitions(n, spark.sparkContext().defaultParallelism());
    final Options o = opt;
    final boolean bpb = hasText;
    // Documents over the tasks: index the rows and place document i in partition i % parts; tokenize and
    // check there (bad input fails here, naming the document), kept for the scoring that follows.
    Sessions.label(spark, "longctx ppl: tokenize, find long documents");
    JavaRDD<SplitPpl.Doc> tokenized = docs.javaRDD().zipWithIndex().mapToPair(t -> new Tuple2<>(t._2(), t._1()))
        .partitionBy(new ByIndex(parts)).map(t -> tokenize(t._1(), t._2(), o, vocab));
    tokenized.persist(StorageLevel.MEMORY_AND_DISK_SER());
    ProgressListener listener = null;
    Thread poller = null;
    Path checkpoints = null;
    SplitPpl.Result split = null;
    Dataset<Row> result = null;
    boolean written = false;
    try {
      long splitAbove = opt.splitAbove >= 0 ? opt.splitAbove : defaultSplitAbove(spark, cfg, opt.chunkLen);
      // One pass over the tokenized rows: the long documents, and the tokens of all (for the progress lines).
      List<Tuple2<Long, Tuple2<String, long[]>>> longDocs = new ArrayList<>();
      long totalTokens = 0;
      for (PartitionLengths p : tokenized.mapPartitions(it -> {
        List<Tuple2<Long, Tuple2<String, long[]>>> found = new ArrayList<>();
        long sum = 0;
        while (it.hasNext()) {
          SplitPpl.Doc d = it.next();
          sum += d.tokens().length;
          if (splits(d, splitAbove)) {
            found.add(new Tuple2<>(d.index(), new Tuple2<>(d.docId(), new long[] {d.tokens().length, d.bytes()})));
          }
        }
        return List.of(new PartitionLengths(sum, found)).iterator();
      }).collect()) {
        totalTokens += p.tokens();
        longDocs.addAll(p.longDocs());
      }
      if (progress != null) {
        long whole = n - longDocs.size(); // a split document's tasks are said on its own line below
        progress.printf(Locale.ROOT, "longctx ppl: scoring %d document%s (%d tokens)%s in %d task%s (model %s, chunk %d "
            + "tokens)%n", n, n == 1 ? "" : "s", totalTokens, longDocs.isEmpty() ? "" : ", " + whole + " of them whole",
            parts, parts == 1 ? "" : "s", opt.model, opt.chunkLen);
        progress.flush();
      }
      DocProgress done = new DocProgress();
      spark.sparkContext().register(done, "longctx ppl progress");
      listener = progress == null ? null : new ProgressListener(done.id());
      if (progress != null) {
        spark.sparkContext().addSparkListener(listener);
        poller = progressPoller(progress, n, totalTokens, listener::done, System.nanoTime(), progressMillis());
      }
      Sessions.label(spark, "longctx ppl: score documents");
      JavaRDD<Row> rows = tokenized.filter(d -> !splits(d, splitAbove)).map(d -> {
        DocumentScore sc;
        try {
          // Tokens counted chunk by chunk: the driver sees a running task's count in its heartbeats.
          sc = Loaded.get(o.model).model.score(d.tokens(), o.chunkLen, o.perToken, positions -> {
            done.add(0, positions);
            FaultHooks.at(FaultHooks.PPL_CHUNK);
          });
        } catch (LlamaModel.NumericOverflowException e) {
          throw new InputError("doc '" + d.docId() + "', " + e.getMessage());
        }
        done.add(1, Math.min(1, d.tokens().length)); // and the last token, which predicts nothing
        return row(d.docId(), sc.nTokens(), sc.sumLogprob(), sc.logprobs(), d.bytes(), bpb, o.perToken);
      });
      if (!longDocs.isEmpty()) {
        List<long[]> lengths = new ArrayList<>();
        Map<Long, Tuple2<String, long[]>> meta = new HashMap<>();
        for (Tuple2<Long, Tuple2<String, long[]>> d : longDocs) {
          lengths.add(new long[] {d._1(), d._2()._2()[0]});
          meta.put(d._1(), d._2());
        }
        int splitParts = opt.splitPartitions > 0 ? opt.splitPartitions
            : defaultSplitPartitions(spark.sparkContext().defaultParallelism(), lengths, cfg, opt.chunkLen);
        checkpoints = opt.checkpointDir != null
            ? new Path(opt.checkpointDir, "longctx-ppl-checkpoint-" + java.util.UUID.randomUUID())
            : commit.scratch("checkpoint");
        if (progress != null) {
          progress.printf(Locale.ROOT, "longctx ppl: %d document%s longer than %d tokens run%s layer by layer over %d "
              + "task%s (checkpoints in %s)%n", longDocs.size(), longDocs.size() == 1 ? "" : "s", splitAbove,
              longDocs.size() == 1 ? "s" : "", splitParts, splitParts == 1 ? "" : "s", checkpoints);
          progress.flush();
        }
        Map<Long, String> docIds = new HashMap<>();
        meta.forEach((index, m) -> docIds.put(index, m._1()));
        split = SplitPpl.score(spark, tokenized.filter(d -> splits(d, splitAbove)), lengths, docIds, opt.model, cfg,
            opt.chunkLen, splitParts, opt.balance, checkpoints, progress);
        rows = rows.union(split.scored.map(sc -> {
          Tuple2<String, long[]> m = meta.get(sc.index());
          done.add(1, m._2()[0]);
          return row(m._1(), (int) m._2()[0], sc.sum(), sc.logprobs(), m._2()[1], bpb, o.perToken);
        }));
      }
      result = spark.createDataFrame(rows, outputSchema(hasText, opt.perToken)).cache();
      // Score once (cached), then write: the summary's token count comes from the same rows.
      Sessions.label(spark, "longctx ppl: score documents");
      Row totals = result.agg(functions.count(functions.lit(1)), functions.sum("n_tokens")).first();
      long docCount = totals.getLong(0);
      long tokens = totals.isNullAt(1) ? 0 : totals.getLong(1);
      Sessions.label(spark, "longctx ppl: write");
      commit.write(spark, Formats.output(result.write(), opt.resolvedOutputFormat()));
      written = true;
      double wall = (System.nanoTime() - t0) / 1e9;
      return new Summary(docCount, tokens, wall, opt.model, commit.output().toString(), splitAbove,
          opt.splitAbove >= 0, split == null ? null : split.stats);
    } finally {
      if (poller != null) {
        poller.interrupt();
      }
      if (listener != null) {
        spark.sparkContext().removeSparkListener(listener);
      }
      if (result != null) {
        result.unpersist();
      }
      tokenized.unpersist(false);
      if (split != null) {
        split.close();
      }
      if (checkpoints != null) {
        checkpoints.getFileSystem(hconf).delete(checkpoints, true); // made by this run, named by its UUID
      }
      if (!written) { // a failure before the write: the checkpoint's folder beside OUT may have made OUT's parents
        commit.abort();
      }
    }
  }

  /** Hidden rows per split task (float32): small against an executor heap, large against a task's start-up. */
  static final long SPLIT_TASK_BYTES = 64L << 20;

  /**
   * Tasks per layer of the split path: Spark's default parallelism, or more where a layer's hidden
   * rows (tokens x hidden x 4 bytes) would exceed {@link #SPLIT_TASK_BYTES} per task; never more than
   * there are chunks.
   */
  static int defaultSplitPartitions(int parallelism, List<long[]> lengths, LlamaConfig cfg, int chunkLen) {
    long tokens = 0, chunks = 0;
    for (long[] l : lengths) {
      tokens += l[1];
      chunks += (l[1] - 1 + chunkLen - 1) / chunkLen;
    }
    long bySize = (tokens * cfg.hiddenSize * Float.BYTES + SPLIT_TASK_BYTES - 1) / SPLIT_TASK_BYTES;
    return (int) Math.max(1, Math.min(chunks, Math.max(parallelism, bySize)));
  }

  /**
   * Tasks of the one-task path by default: one per document, at most 8 per core of the cluster (Spark's
   * default parallelism). One per document always cost a task's start-up per document and wrote a part
   * file per document: 2,000 documents of 5 tokens took 42.8 s on local[2] against 10.0 s in 4 tasks.
   * Eight per core still spreads documents of unequal length (round robin in input order).
   */
  static int defaultPartitions(long documents, int parallelism) {
    return (int) Math.max(1, Math.min(documents, 8L * Math.max(1, parallelism)));
  }

  /** Whether a document takes the split path: longer than splitAbove, and at least one token to predict. */
  static boolean splits(SplitPpl.Doc d, long splitAbove) {
    return d.tokens().length > splitAbove && d.tokens().length >= 2;
  }

  /**
   * --model as a local path: a {@code file:} URI ({@code file:/m}, {@code file:///m},
   * {@code file://localhost/m}) names its path; another scheme ({@code hdfs://}, {@code s3a://}) or
   * host is refused, since the checkpoint is read with java.nio at the same path on the driver and
   * every executor. Anything else is a path as given.
   */
  static String modelPath(String model) {
    if (model == null || !model.matches("(?i)file:.*|[A-Za-z][A-Za-z0-9+.-]*://.*")) {
      return model;
    }
    String local = " the checkpoint must be a local directory, read at the same path on the driver and every "
        + "executor (copy it there, or onto a shared mount)";
    java.net.URI u;
    try {
      u = new java.net.URI(model);
    } catch (java.net.URISyntaxException e) {
      throw new InputError("--model " + model + ": not a valid URI (" + e.getReason() + ")");
    }
    if (!"file".equalsIgnoreCase(u.getScheme())) { // hdfs://, s3a://: the model is read with java.nio, not Hadoop
      throw new InputError("--model " + model + ":" + local);
    }
    if (u.getAuthority() != null && !u.getAuthority().equalsIgnoreCase("localhost")) {
      throw new InputError("--model " + model + ": a file URI on host '" + u.getAuthority() + "';" + local);
    }
    if (u.getPath() == null || !u.getPath().startsWith("/")) {
      throw new InputError("--model " + model + ": a file URI needs an absolute path (file:/dir or file:///dir)");
    }
    return u.getPath();
  }

  /**
   * Documents longer than this take the split path by default: a fifth of an executor's heap, shared
   * by its concurrent tasks, is what one task may keep as KV cache ({@link LlamaConfig#kvCacheBytesPerToken}
   * per token; the rest is for Spark and the chunk's temporaries; the weights are off-heap). Executor
   * heap: this JVM's heap with a local master, else spark.executor.memory (Spark's default 1g where
   * unset); tasks at once: the local master's threads, else spark.executor.cores / spark.task.cpus,
   * where unset one core on YARN and Kubernetes (their default) and, on a standalone master (whose
   * executors take every core of their worker), the cluster's cores known now: an upper bound, so
   * the budget errs on the small side. A sliding-window model
   * keeps only the chunks its window reaches (window + 2 chunks at most): when that fits, no length
   * needs splitting for memory and the default is {@link Long#MAX_VALUE} (never).
   */
  static long defaultSplitAbove(SparkSession spark, LlamaConfig cfg, int chunkLen) {
    org.apache.spark.SparkContext sc = spark.sparkContext();
    return defaultSplitAbove(sc.isLocal(), sc.master(), sc.conf(), sc.defaultParallelism(), cfg, chunkLen);
  }

  /** {@link #defaultSplitAbove(SparkSession, LlamaConfig, int)} from the context's master, conf and parallelism. */
  static long defaultSplitAbove(boolean local, String master, org.apache.spark.SparkConf conf, int parallelism,
      LlamaConfig cfg, int chunkLen) {
    long heap = local ? Runtime.getRuntime().maxMemory() : conf.getSizeAsBytes("spark.executor.memory", "1g");
    int cores = conf.contains("spark.executor.cores") ? conf.getInt("spark.executor.cores", 1)
        : master.startsWith("spark://") ? parallelism : 1;
    int slots = local ? parallelism : Math.max(1, cores / Math.max(1, conf.getInt("spark.task.cpus", 1)));
    long budgetTokens = Math.max(1, heap / 5 / Math.max(1, slots) / cfg.kvCacheBytesPerToken());
    if (cfg.slidingWindow > 0 && cfg.slidingWindow + 2L * chunkLen <= budgetTokens) {
      return Long.MAX_VALUE;
    }
    return budgetTokens;
  }

  /**
   * Documents finished and tokens scored, from inside the tasks, per partition of the scoring stage: a
   * task adds chunk by chunk. Merged by the larger value per partition, so a partition scored twice (a
   * retried or speculative task, a cached result recomputed after a lost executor: the same documents
   * in the same order) counts once, and the driver holds one entry per task, not per document. A
   * concurrent map: the executor's heartbeat reads it while the task adds.
   */
  static final class DocProgress extends org.apache.spark.util.AccumulatorV2<long[], Map<Integer, long[]>> {
    private static final long serialVersionUID = 1L;
    private final ConcurrentHashMap<Integer, long[]> byPartition = new ConcurrentHashMap<>();

    /** In a task: {@code docs} more documents finished, {@code tokens} more tokens scored. */
    void add(long docs, long tokens) {
      add(new long[] {TaskContext.getPartitionId(), docs, tokens});
    }

    /** {documents finished, tokens scored} of per-partition values as this accumulator holds them. */
    static long[] count(Map<?, long[]> byPartition) {
      long docs = 0, tokens = 0;
      for (long[] v : byPartition.values()) {
        docs += v[0];
        tokens += v[1];
      }
      return new long[] {docs, tokens};
    }

    @Override
    public boolean isZero() {
      return byPartition.isEmpty();
    }

    @Override
    public DocProgress copy() {
      DocProgress c = new DocProgress();
      c.byPartition.putAll(byPartition);
      return c;
    }

    @Override
    public void reset() {
      byPartition.clear();
    }

    /** {partition, documents, tokens}: added to that partition's counts (values replaced, never changed). */
    @Override
    public void add(long[] partitionDocsTokens) {
      byPartition.merge((int) partitionDocsTokens[0], new long[] {partitionDocsTokens[1], partitionDocsTokens[2]},
          (a, b) -> new long[] {a[0] + b[0], a[1] + b[1]});
    }

    @Override
    public void merge(org.apache.spark.util.AccumulatorV2<long[], Map<Integer, long[]>> other) {
      other.value().forEach((part, v) -> byPartition.merge(part, v.clone(), DocProgress::larger));
    }

    /** Two counts of one partition: each the larger (counts only grow, over the same documents in order). */
    static long[] larger(long[] a, long[] b) {
      return new long[] {Math.max(a[0], b[0]), Math.max(a[1], b[1])};
    }

    @Override
    public Map<Integer, long[]> value() {
      return byPartition;
    }
  }

  /**
   * The driver's view of a {@link DocProgress}: the values of finished tasks, and of each running task
   * as its executor's last heartbeat reported them (spark.executor.heartbeatInterval, 10 s by default),
   * so a long document in one task shows progress before it ends. A failed task's values are dropped,
   * as Spark drops its accumulator updates; a heartbeat arriving after its task's end is ignored.
   */
  static final class ProgressListener extends org.apache.spark.scheduler.SparkListener {
    private final long accumulatorId;
    private final Map<Long, Map<Object, long[]>> running = new HashMap<>();
    private final Set<Long> ended = new HashSet<>();
    private final Map<Object, long[]> finished = new HashMap<>();

    ProgressListener(long accumulatorId) {
      this.accumulatorId = accumulatorId;
    }

    /** {documents finished, tokens scored}, each partition counted once. */
    synchronized long[] done() {
      Map<Object, long[]> all = new HashMap<>(finished);
      for (Map<Object, long[]> m : running.values()) {
        m.forEach((part, v) -> all.merge(part, v, DocProgress::larger));
      }
      return DocProgress.count(all);
    }

    private Map<Object, long[]> ours(scala.collection.Seq<org.apache.spark.scheduler.AccumulableInfo> infos) {
      for (org.apache.spark.scheduler.AccumulableInfo a : scala.jdk.javaapi.CollectionConverters.asJava(infos)) {
        if (a.id() == accumulatorId && a.update().isDefined() && a.update().get() instanceof Map<?, ?> m) {
          Map<Object, long[]> copy = new HashMap<>(); // in a local master the map is the task's own, still growing
          m.forEach((part, v) -> copy.put(part, ((long[]) v).clone()));
          return copy;
        }
      }
      return null;
    }

    @Override
    public synchronized void onExecutorMetricsUpdate(org.apache.spark.scheduler.SparkListenerExecutorMetricsUpdate e) {
      for (scala.Tuple4<Object, Object, Object, scala.collection.immutable.Seq<org.apache.spark.scheduler.AccumulableInfo>> t
          : scala.jdk.javaapi.CollectionConverters.asJava(e.accumUpdates())) {
        long task = (Long) t._1();
        Map<Object, long[]> m = ours(t._4());
        if (m != null && !ended.contains(task)) {
          running.put(task, m);
        }
      }
    }

    @Override
    public synchronized void onTaskEnd(org.apache.spark.scheduler.SparkListenerTaskEnd e) {
      long task = e.taskInfo().taskId();
      ended.add(task);
      running.remove(task);
      Map<Object, long[]> m = e.reason() instanceof org.apache.spark.Success$ ? ours(e.taskInfo().accumulables()) : null;
      if (m != null) {
        m.forEach((part, v) -> finished.merge(part, v, DocProgress::larger));
      }
    }
  }

  /**
   * A driver daemon thread printing documents finished and tokens scored ({documents, tokens} from
   * {@code done}) every few seconds while either moves; stopped by an interrupt.
   */
  static Thread progressPoller(PrintStream progress, long docs, long tokens, java.util.function.Supplier<long[]> done,
      long start, long everyMs) {
    Thread t = new Thread(() -> {
      long shownDocs = 0, shownTokens = 0;
      try {
        while (true) {
          Thread.sleep(everyMs);
          long[] now = done.get();
          long d = Math.min(now[0], docs), tok = Math.min(now[1], tokens);
          if (d != shownDocs || tok != shownTokens) {
            shownDocs = d;
            shownTokens = tok;
            double s = (System.nanoTime() - start) / 1e9;
            progress.printf(Locale.ROOT, "longctx ppl: %d/%d documents done, %d/%d tokens (%d%%), %.0f s (%.0f "
                + "tokens/s)%n", d, docs, tok, tokens, tokens > 0 ? 100 * tok / tokens : 100, s, s > 0 ? tok / s : 0);
            progress.flush();
          }
        }
      } catch (InterruptedException e) {
        // the job ended
      }
    }, "longctx-ppl-progress");
    t.setDaemon(true);
    t.start();
    return t;
  }

  /** Reads config.json and the tensor headers on the driver: a bad checkpoint fails before any task. */
  private static LlamaConfig checkModel(String dir) throws IOException {
    java.nio.file.Path p = java.nio.file.Path.of(dir);
    if (!java.nio.file.Files.isDirectory(p)) {
      throw new InputError("MODEL " + dir + ": " + (java.nio.file.Files.exists(p) ? "not a directory (a checkpoint is a "
          + "folder holding config.json and *.safetensors)" : "no such directory"));
    }
    try {
      LlamaConfig cfg = LlamaConfig.read(p);
      cfg.requireTensors(Safetensors.checkpointEntries(p), p);
      return cfg;
    } catch (IllegalArgumentException e) {
      throw new InputError("MODEL " + dir + ": " + e.getMessage());
    }
  }

  /** --checkpoint-dir: a directory, or absent below a directory (a file on the way fails every layer's job). */
  private static void requireDirectoryOrAbsent(Configuration hconf, String dir) throws IOException {
    Path p = new Path(dir);
    FileSystem fs = p.getFileSystem(hconf);
    for (Path q = p; q != null; q = q.getParent()) {
      if (fs.exists(q)) {
        if (!fs.getFileStatus(q).isDirectory()) {
          throw new InputError("--checkpoint-dir " + dir + ": " + (q.equals(p) ? "is a file" : q + " is a file")
              + ", not a directory");
        }
        return;
      }
    }
  }

  /** Opens tokenizer.json on the driver: a missing or malformed one fails before any task. */
  private static void checkTokenizer(String dir) {
    try {
      LlamaTranslator.openTokenizer(java.nio.file.Path.of(dir)).close();
    } catch (IllegalArgumentException | IOException e) {
      throw new InputError("MODEL " + dir + ": text input needs a tokenizer: " + e.getMessage());
    }
  }

  /**
   * The output has one row per doc_id, so two documents under one id would give two rows no one could
   * tell apart: refused, naming the id and where it occurs. (Rows without a doc_id are reported when
   * they are tokenized.)
   */
  static void requireUniqueDocIds(Dataset<Row> docs, String input) {
    Column file = functions.col("file");
    List<Row> dup = docs.where(functions.col("doc_id").isNotNull()).groupBy(functions.col("doc_id"))
        .agg(functions.count(functions.lit(1)).as("n"), functions.min(file).as("first"), functions.max(file).as("last"))
        .where(functions.col("n").gt(1)).limit(1).collectAsList();
    if (!dup.isEmpty()) {
      Row r = dup.get(0);
      String first = r.getString(2), last = r.getString(3);
      Formats.refuseLoneSurrogateId("INPUT", first, "doc_id", r.getString(0)); // the reason two ids became one
      Formats.refuseLoneSurrogateId("INPUT", last, "doc_id", r.getString(0));
      throw new InputError("INPUT " + input + ": doc_id '" + r.getString(0) + "' appears " + r.getLong(1) + " times ("
          + (first.equals(last) ? "in file " + first : "in files " + first + " and " + last + " at least")
          + "); the output has one row per doc_id, so give each document its own");
    }
  }

  static Dataset<Row> read(SparkSession spark, String fmt, String path) {
    Dataset<Row> df;
    if (fmt.equals("json")) {
      // text as a variant: its JSON type is checked (a string, else the row is refused), then it is read as a string.
      StructType s = new StructType().add("doc_id", DataTypes.StringType).add("text", DataTypes.VariantType)
          .add("tokens", DataTypes.createArrayType(DataTypes.LongType)).add(CORRUPT, DataTypes.StringType);
      df = spark.read().schema(s).option("mode", "PERMISSIVE").option("columnNameOfCorruptRecord", CORRUPT).json(path)
          .withColumn(TEXT_TYPE, functions.expr("schema_of_variant(text)"))
          .withColumn("text", functions.expr("variant_get(text, '$', 'string')"));
    } else {
      // Files with different columns (some text, some tokens) are one input: their schemas merged, a column a
      // file lacks reads as null there (without it, Spark took one file's columns for all).
      df = Formats.load(spark, fmt, path, "INPUT", true);
    }
    Set<String> have = new HashSet<>(Arrays.asList(df.columns()));
    if (!have.contains("doc_id") || (!have.contains("text") && !have.contains("tokens"))) {
      throw new InputError("INPUT " + path + ": needs columns doc_id string and text string and/or tokens array<int>"
          + " (has " + String.join(", ", df.columns()) + ")");
    }
    for (StructField f : df.schema().fields()) {
      DataType t = f.dataType();
      boolean ok = switch (f.name()) {
        // Integer ids are read as text, as JSON's are (and as score reads them).
        case "doc_id" -> t.equals(DataTypes.StringType) || Formats.integral(t);
        case "text" -> t.equals(DataTypes.StringType);
        case "tokens" -> t instanceof ArrayType at && Formats.integral(at.elementType());
        default -> true;
      };
      if (!ok) {
        throw new InputError("INPUT " + path + ": column '" + f.name() + "' has type " + t.simpleString()
            + (f.name().equals("tokens") ? ", expected array<int>" : f.name().equals("doc_id")
                ? ", expected string (or an integer type)" : ", expected string"));
      }
    }
    return df;
  }


  static StructType outputSchema(boolean bitsPerByte, boolean perToken) {
    StructType s = new StructType()
        .add("doc_id", DataTypes.StringType, false)
        .add("n_tokens", DataTypes.LongType, false)
        .add("sum_logprob", DataTypes.DoubleType, false)
        .add("ppl", DataTypes.DoubleType, true);
    if (bitsPerByte) {
      s = s.add("bits_per_byte", DataTypes.DoubleType, true);
    }
    if (perToken) {
      s = s.add("logprobs", DataTypes.createArrayType(DataTypes.FloatType, false), false);
    }
    return s;
  }

  /** Checks and tokenizes one input row (doc_id, text, tokens, corrupt, file) in a task. */
  static SplitPpl.Doc tokenize(long index, Row r, Options o, int vocab) throws IOException {
    String file = r.getString(4);
    String where = "INPUT file " + file;
    if (!r.isNullAt(3)) {
      String c = r.getString(3);
      if (c.startsWith(TEXT_NOT_A_STRING)) {
        throw new InputError(where + (r.isNullAt(0) ? "" : ", doc '" + r.getString(0) + "'") + ": text is a JSON "
            + c.substring(TEXT_NOT_A_STRING.length()).toLowerCase(Locale.ROOT) + " value, expected a string");
      }
      String problem = Formats.malformedJson(c);
      String surrogate = loneSurrogateInText(c);
      throw new InputError(where + (surrogate != null ? Formats.lineOf(file, problem) + surrogate
          : Formats.malformedLine(file, problem)));
    }
    if (r.isNullAt(0)) {
      // Spark gives the row no place: its file is read again for the first row without doc_id (line or row_index).
      throw new InputError(where + Formats.lineOfRow(file, List.of("doc_id"), row -> row.get("doc_id") == null)
          + ": a row has no doc_id");
    }
    String doc = r.getString(0);
    Formats.refuseLoneSurrogateId("INPUT", file, "doc_id", doc);
    where += ", doc '" + doc + "'";
    boolean text = !r.isNullAt(1), tokens = !r.isNullAt(2);
    if (text == tokens) {
      throw new InputError(where + ": a row needs exactly one of text and tokens, got "
          + (text ? "both" : "neither"));
    }
    int[] ids;
    long bytes = -1;
    if (text) {
      byte[] utf8 = (byte[]) r.get(1);
      ids = LlamaTranslator.encode(Loaded.get(o.model).tokenizer(), decodeUtf8(utf8, where));
      bytes = utf8.length; // bits_per_byte's bytes: the text as stored, which is the text tokenized
    } else {
      List<Long> l = r.getList(2);
      ids = new int[l.size()];
      for (int i = 0; i < ids.length; i++) {
        Long v = l.get(i);
        if (v == null) {
          throw new InputError(where + ": the token id at position " + i + " is null (tokens must be integers)");
        }
        if (v < 0 || v >= vocab) {
          throw new InputError(where + ": token id " + v + " at position " + i + " is outside the vocabulary [0, "
              + vocab + ")");
        }
        ids[i] = (int) (long) v;
      }
    }
    try {
      Loaded.get(o.model).model.checkTokens(ids); // token rows were checked above: this is the tokenizer's id
    } catch (IllegalArgumentException e) {
      throw new InputError("MODEL " + o.model + ": tokenizer.json does not fit config.json's vocab_size: on the text of "
          + where + " it made " + e.getMessage());
    }
    return new SplitPpl.Doc(index, doc, ids, bytes);
  }

  /**
   * Text's stored UTF-8 bytes as a string, or bad input naming the first invalid byte: decoding would
   * replace it with U+FFFD, so the tokenizer would score other text than stored, and bits_per_byte
   * count other bytes than those scored.
   */
  static String decodeUtf8(byte[] utf8, String where) {
    java.nio.ByteBuffer in = java.nio.ByteBuffer.wrap(utf8);
    java.nio.CharBuffer out = java.nio.CharBuffer.allocate(utf8.length); // UTF-8: at most a char per byte
    java.nio.charset.CharsetDecoder d = StandardCharsets.UTF_8.newDecoder(); // reports malformed input
    java.nio.charset.CoderResult res = d.decode(in, out, true);
    if (!res.isError()) {
      res = d.flush(out);
    }
    if (res.isError()) {
      int at = in.position(), n = Math.min(res.length(), utf8.length - at);
      StringBuilder hex = new StringBuilder();
      for (int i = at; i < at + n; i++) {
        hex.append(String.format(Locale.ROOT, "%s%02X", i == at ? "" : " ", utf8[i] & 0xff));
      }
      throw new InputError(where + ": text is not valid UTF-8: byte" + (n == 1 ? " " : "s ") + hex + " at byte offset "
          + at + " (character " + Character.codePointCount(out.flip(), 0, out.limit()) + ")"
          + "; it would be scored as U+FFFD, not as stored");
    }
    return out.flip().toString();
  }

  /**
   * For a JSON record Spark refused: where its string text holds a lone UTF-16 surrogate (the JSON
   * escape of one, U+D800 to U+DFFF, without its pair), ", doc 'ID': ..." naming it and its position
   * in code points, else null. Spark's variant reader refuses such text as a malformed record without
   * saying why: it is not Unicode, and has no UTF-8 bytes to count or tokenize. Runs on the way to an
   * error only.
   */
  static String loneSurrogateInText(String record) {
    String doc = null, text = null;
    try (com.fasterxml.jackson.core.JsonParser p = Formats.JSON.createParser(record)) {
      if (p.nextToken() != com.fasterxml.jackson.core.JsonToken.START_OBJECT) {
        return null;
      }
      while (p.nextToken() == com.fasterxml.jackson.core.JsonToken.FIELD_NAME) {
        String name = p.currentName();
        com.fasterxml.jackson.core.JsonToken v = p.nextToken();
        if (name.equals("doc_id")) { // the last one counts, as in Spark
          doc = v.isScalarValue() && v != com.fasterxml.jackson.core.JsonToken.VALUE_NULL ? p.getText() : null;
        } else if (name.equals("text")) {
          text = v == com.fasterxml.jackson.core.JsonToken.VALUE_STRING ? p.getText() : null;
        }
        p.skipChildren();
      }
    } catch (IOException | RuntimeException e) {
      return null;
    }
    int i = text == null ? -1 : Formats.loneSurrogate(text);
    return i < 0 ? null : (doc == null ? "" : ", doc '" + doc + "'") + ": text holds a lone UTF-16 surrogate (\\u"
        + Integer.toHexString(text.charAt(i)) + ") at character " + text.codePointCount(0, i) + " (code points from 0): "
        + "not valid Unicode, so it has no UTF-8 bytes to tokenize or count";
  }

  /** An output row (see {@link #outputSchema}); bytes < 0: not a text row. */
  static Row row(String doc, int nTokens, double sum, float[] logprobs, long bytes, boolean bitsPerByteColumn,
      boolean perToken) {
    DocumentScore s = new DocumentScore(nTokens, sum, logprobs);
    List<Object> out = new ArrayList<>();
    out.add(doc);
    out.add((long) nTokens);
    out.add(sum);
    out.add(nTokens < 2 ? null : s.perplexity());
    if (bitsPerByteColumn) {
      out.add(bytes > 0 && nTokens >= 2 ? s.bitsPerByte(bytes) : null); // nothing scored: no rate, as ppl
    }
    if (perToken) {
      Float[] boxed = new Float[logprobs.length];
      for (int i = 0; i < logprobs.length; i++) {
        boxed[i] = logprobs[i];
      }
      // An external Row's array must be a Scala Seq for the encoder.
      out.add(scala.jdk.javaapi.CollectionConverters.asScala(Arrays.asList(boxed)).toSeq());
    }
    return RowFactory.create(out.toArray());
  }

  /**
   * The model and tokenizer of a checkpoint, loaded once per JVM and shared by its tasks. A load is
   * held by each Spark task that got it until the task completes; it is closed (its native memory
   * freed) once no task holds it and it is stale (the checkpoint's files changed and a newer load
   * replaced it) or beyond the {@link #KEPT} most recently used checkpoints. Before, every load stayed
   * for the life of the JVM: a long-lived session scoring several checkpoints, or one rewritten
   * between runs, kept each of them in memory.
   */
  static final class Loaded {
    /** Checkpoints kept loaded with no task holding them: the most recently used ones. */
    static final int KEPT = 2;

    private static final Map<String, Loaded> CACHE = new java.util.HashMap<>(); // by dir@stamp; guarded by Loaded.class
    private static NDManager manager; // the loads' parent, for the life of the JVM
    private static long clock; // of last uses

    final LlamaModel model;
    private final String dir;
    private final java.util.Set<Long> holders = new java.util.HashSet<>(); // task attempt ids; guarded by Loaded.class
    private boolean cached = true; // guarded by Loaded.class
    private boolean closed; // guarded by Loaded.class
    private long lastUsed; // guarded by Loaded.class
    private volatile HuggingFaceTokenizer tokenizer;

    private Loaded(String dir, LlamaModel model) {
      this.dir = dir;
      this.model = model;
    }

    /**
     * The current load of the checkpoint in dir, loaded here if its files changed or it was never
     * loaded; held by the running Spark task until it completes (outside a task, e.g. on the driver or
     * in tests, not held: it stays valid while it is among the kept ones).
     */
    static Loaded get(String dir) {
      // Keyed by each file's modification time, size and file key (inode) too: a checkpoint rewritten
      // in place, or replaced by a copy that kept the old times (cp -p, rsync -t, tar), is loaded again.
      // Only a same-size rewrite in place that also restores the times goes unseen.
      String key = dir + "@" + stamp(dir);
      TaskContext task = TaskContext.get();
      synchronized (Loaded.class) { // a load takes seconds; the tasks of one executor share one model anyway
        Loaded e = CACHE.get(key);
        if (e == null) {
          e = load(dir);
          CACHE.put(key, e);
          for (Loaded old : CACHE.values()) {
            if (old != e && old.dir.equals(dir)) {
              old.cached = false; // stale: closed below, or by its last holder
            }
          }
        }
        e.lastUsed = ++clock;
        if (task != null && e.holders.add(task.taskAttemptId())) {
          Loaded held = e;
          task.addTaskCompletionListener((TaskCompletionListener) tc -> release(held, tc.taskAttemptId()));
        }
        evict();
        return e;
      }
    }

    private static Loaded load(String dir) {
      try {
        if (manager == null) {
          manager = NDManager.newBaseManager("PyTorch");
        }
        return new Loaded(dir, LlamaModel.load(java.nio.file.Path.of(dir), manager));
      } catch (IOException e) {
        throw new java.io.UncheckedIOException("loading the model " + dir, e);
      } catch (IllegalArgumentException e) {
        throw new InputError("MODEL " + dir + ": " + e.getMessage());
      }
    }

    private static void release(Loaded e, long taskAttemptId) {
      synchronized (Loaded.class) {
        e.holders.remove(taskAttemptId);
        closeIfDone(e);
        evict();
      }
    }

    /** Drops stale loads and the least recently used idle ones beyond {@link #KEPT}; closes those no task holds. */
    private static void evict() {
      List<Loaded> idle = new ArrayList<>();
      for (Loaded e : CACHE.values()) {
        if (e.cached && e.holders.isEmpty()) {
          idle.add(e);
        }
      }
      idle.sort(java.util.Comparator.comparingLong((Loaded e) -> e.lastUsed).reversed());
      for (int i = KEPT; i < idle.size(); i++) {
        idle.get(i).cached = false;
      }
      for (java.util.Iterator<Loaded> it = CACHE.values().iterator(); it.hasNext(); ) {
        Loaded e = it.next();
        if (!e.cached) {
          it.remove();
          closeIfDone(e); // a held one is closed by its last holder's release
        }
      }
    }

    private static void closeIfDone(Loaded e) {
      if (!e.cached && e.holders.isEmpty() && !e.closed) {
        e.closed = true;
        e.model.close();
        HuggingFaceTokenizer t = e.tokenizer;
        if (t != null) {
          t.close();
        }
      }
    }

    /** Whether this load was closed (stale or evicted, and no task held it any more). */
    boolean closed() {
      synchronized (Loaded.class) {
        return closed;
      }
    }

    private static String stamp(String dir) {
      StringBuilder b = new StringBuilder();
      try (var files = java.nio.file.Files.list(java.nio.file.Path.of(dir))) {
        for (java.nio.file.Path f : (Iterable<java.nio.file.Path>) files.sorted()::iterator) {
          var a = java.nio.file.Files.readAttributes(f, java.nio.file.attribute.BasicFileAttributes.class);
          b.append(f.getFileName()).append(':').append(a.lastModifiedTime().toInstant()).append(':').append(a.size())
              .append(':').append(a.fileKey()).append(';');
        }
      } catch (IOException e) {
        throw new java.io.UncheckedIOException("listing the model directory " + dir, e);
      }
      return b.toString();
    }

    synchronized HuggingFaceTokenizer tokenizer() throws IOException {
      if (tokenizer == null) {
        try {
          tokenizer = LlamaTranslator.openTokenizer(java.nio.file.Path.of(dir));
        } catch (IllegalArgumentException e) {
          throw new InputError("MODEL " + dir + ": text input needs a tokenizer: " + e.getMessage());
        }
      }
      return tokenizer;
    }
  }

  /** Document i to partition i % n. */
  static final class ByIndex extends Partitioner {
    private static final long serialVersionUID = 1L;
    private final int n;

    ByIndex(int n) {
      this.n = n;
    }

    @Override
    public int numPartitions() {
      return n;
    }

    @Override
    public int getPartition(Object key) {
      return (int) Math.floorMod((Long) key, (long) n);
    }

    @Override
    public boolean equals(Object o) {
      return o instanceof ByIndex b && b.n == n;
    }

    @Override
    public int hashCode() {
      return n;
    }
  }
}
