package io.longctx.spark;

import io.longctx.djl.AttentionOp;
import java.io.PrintStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.Locale;

/**
 * Entry point of the Spark application: {@code score}, {@code ppl}, {@code gen}, {@code demo},
 * {@code spark-bench}. Exit status 0 on success, 2 on bad input or bad usage (message on stderr), 1
 * on any other failure.
 * Runs under bin/longctx (embedded local[*]) or under SparkSubmit (the -app.jar).
 */
public final class LongctxMain {

  static final String COMMON_HELP = """
      Spark:
        --master URL          Spark master (default: spark.master if set, e.g. by SparkSubmit, else local[*])
        --conf KEY=VALUE      Spark property; repeatable (after conf/spark-defaults.conf)
        -h, --help            this text
      """;

  public static final String SCORE_HELP = """
      usage: longctx score --keys KEYS --queries QUERIES --output OUT [options]
             longctx score --mode prefill --keys KEYS --output OUT [options]

      Exact attention of queries over very long documents, chunked across Spark executors; partial
      states are LSE-merged per query in chunk order (bit-reproducible under any partitioning).

      Inputs (Parquet or JSON Lines; a path may be a file or a directory of part files):
        KEYS      one row per token: doc_id string, pos long, k array<float> (kv-heads*dim),
                  v array<float> (kv-heads*dim); in prefill mode also q array<float> (heads*dim)
        QUERIES   query_id string, doc_id string, q array<float> (heads*dim), optional pos long
      Output OUT (--output-format, default the format of KEYS): decode: query_id, doc_id, o, lse, n_keys; prefill: doc_id, pos, o, lse,
      n_keys. o array<float> (heads*dim), lse array<float> (heads, natural log; -Infinity and o = 0
      where no key was visible), n_keys long (keys attended). Written to a hidden sibling directory
      and renamed to OUT at the end: after a failure OUT is absent or, with --overwrite, the previous
      output, unchanged. OUT may not be, contain or sit inside KEYS or QUERIES.

      Options:
        --keys PATH           key tokens (required)
        --queries PATH        queries (decode mode, required there)
        --output PATH         output directory (required; must not exist unless --overwrite)
        --overwrite           replace OUT if it is a previous longctx output (its _LONGCTX marker and
                              only the files longctx writes); anything else is refused, never deleted
        --format F            parquet | json, both inputs (default: each from its own extension,
                              .json/.jsonl/.ndjson, gzipped or not -> json, else parquet)
        --output-format F     parquet | json, OUT (default: the format of KEYS)
        --mode M              decode (default): QUERIES against documents; prefill: every KEYS token
                              is a causal query over its own document
        --heads H             query heads    } give at least one of these three; the others are
        --kv-heads HKV        key/value heads} inferred from the array lengths and checked
        --dim D               head dim       } (heads % kv-heads == 0; GQA head h reads kv head h/(H/HKV))
        --scale S             score scale (default 1/sqrt(dim))
        --softcap C           score = C*tanh(score/C) (default 0: off)
        --causal              a query with pos p attends keys with pos <= p
        --window W            a query with pos p attends keys with pos in (p-W, p] (implies the causal
                              bound); W is 1..2^63-1, any size is exact; 0 (default) means no window
                              Query positions matter only with --causal or --window: without either,
                              or for a query without pos, a query attends the whole document.
        --chunk-len N         keys per chunk, by position: chunk c = pos in [c*N, (c+1)*N) (default 4096)
        --query-block N       decode queries of one document computed together (default 64)
        --partitions N        Spark shuffle partitions (default: spark.sql.shuffle.partitions)
        --backend B           auto (default; or -Dlongctx.backend): cuda when Spark schedules GPUs for the
                              tasks (spark.task.resource.gpu.amount > 0), else cpu; or cpu, cuda, or the
                              name of a backend registered on the class path (docs/ARCHITECTURE.md). One
                              backend for the whole job: an executor that cannot run it fails the job

      Queries for a document that has no keys are an error (exit 2), naming the query and document.
      A summary (documents, tokens, queries, chunks, chunk pairs computed/skipped, backend, wall time,
      tokens/s) goes to stderr at the end.
      """ + COMMON_HELP;

  public static final String GEN_HELP = """
      usage: longctx gen --output DIR [options]

      Writes a synthetic corpus: DIR/keys.parquet and DIR/queries.parquet (.jsonl with --format json).
      Documents doc-00000.. with positions 0..len-1; k, v, q standard normal, seeded per (seed, doc, pos).
      Every 4th query has no pos (attends the whole document).

      Options:
        --docs N              documents (default 3)
        --tokens T            tokens of the longest (first) document (default 4096)
        --min-tokens M        lengths spaced evenly from T down to M (default T: all equal)
        --heads H, --kv-heads HKV, --dim D   shapes (default 8, 2, 64)
        --queries-per-doc Q   queries per document (default 4; 0: no QUERIES file)
        --prefill             also write q (heads*dim) on every KEYS row, for --mode prefill
        --seed S              random seed (default 42)
        --format F            parquet (default) | json
        --partitions N        write parallelism (default: by size)
        --overwrite           replace DIR's keys and queries where they are earlier longctx outputs
        --output DIR          output directory (required)
      """ + COMMON_HELP;

  public static final String DEMO_HELP = """
      usage: longctx demo [--tokens N] [--sample S] [--ppl-tokens N] [--ppl-only] [--dir DIR]

      Attention part: generates 3 documents (the longest --tokens, default 100000; 8 heads over 2 kv
      heads, dim 64), scores 12 queries causally on the embedded Spark (local[*] unless --master), checks
      --sample queries (default 6) against a float64 reference computed in this process, and prints a
      results table and the summary.
      ppl part: generates a small Llama-family checkpoint (gen-model) and a text document of about
      --ppl-tokens tokens (default 8000; 0 skips the part) plus a short one, scores them with ppl on
      the same Spark, and checks each against the model run in this process (the same sum_logprob
      exactly; chunk length 1000 within 1e-5). Exit 1 if a check does not match.

        --ppl-only            run only the ppl part
        --dir DIR             where to write the corpus and scores: a new or empty directory, or one an
                              earlier demo wrote (the outputs this run makes replace that run's; a
                              part not run leaves its old output); default a temp directory, deleted
                              at the end
      """ + COMMON_HELP;

  public static final String MAIN_HELP = """
      usage: longctx-spark COMMAND [options]
        score   exact long-context attention scoring (score --help)
        gen     generate a synthetic corpus (gen --help)
        demo    score a small corpus and a generated model's text, check both (demo --help)
        ppl     log-likelihood of whole documents under a Llama-family checkpoint (ppl --help)
        spark-bench   Spark overhead of a prefill: job wall time over kernel-only time (spark-bench --help)
      """;

  public static void main(String[] args) {
    int rc = run(args, System.out, System.err);
    if (rc == 0) {
      writeClassArchive();
    }
    System.exit(rc);
  }

  /** System property naming the class archive bin/lib/java-cds asks a successful run to write. */
  static final String CDS_ARCHIVE_PROPERTY = "longctx.cdsArchive";

  /**
   * Writes the class archive that bin/lib/java-cds asked for ({@value #CDS_ARCHIVE_PROPERTY}, with
   * -XX:+RecordDynamicDumpInfo), through the JVM's own diagnostic command: only after a run that
   * succeeded. The JVM's -XX:ArchiveClassesAtExit wrote it at every exit, so a newcomer's failing first
   * runs each paid its ~15 s and then threw it away. Nothing to do without the property; a dump that
   * fails is a warning, never the run's failure.
   */
  static void writeClassArchive() {
    String file = System.getProperty(CDS_ARCHIVE_PROPERTY);
    if (file == null || file.isEmpty()) {
      return;
    }
    try {
      java.lang.management.ManagementFactory.getPlatformMBeanServer().invoke(
          new javax.management.ObjectName("com.sun.management:type=DiagnosticCommand"), "vmCds",
          new Object[] {new String[] {"dynamic_dump", file}}, new String[] {String[].class.getName()});
    } catch (Exception | LinkageError e) {
      System.err.println("longctx: the class archive was not written (" + e + "); the next run tries again");
    }
  }

  /** A command's entry point: its arguments after the name; returns the exit status. */
  private interface Command {
    int run(String[] argv, PrintStream out, PrintStream err) throws Exception;
  }

  private static final java.util.Map<String, Command> COMMANDS = java.util.Map.of(
      "score", LongctxMain::score,
      "gen", LongctxMain::gen,
      "demo", LongctxMain::demo,
      "spark-bench", (argv, out, err) -> OverheadBench.run(argv, out),
      "ppl", PplJob::cli);

  public static int run(String[] args, PrintStream out, PrintStream err) {
    if (args.length == 0 || args[0].equals("-h") || args[0].equals("--help") || args[0].equals("help")) {
      out.print(MAIN_HELP);
      return args.length == 0 ? 2 : 0;
    }
    String cmd = args[0];
    String[] rest = java.util.Arrays.copyOfRange(args, 1, args.length);
    try {
      Command command = COMMANDS.get(cmd);
      if (command == null) {
        err.println("longctx: unknown command '" + cmd + "'");
        err.print(MAIN_HELP);
        return 2;
      }
      if (java.util.Arrays.stream(rest).noneMatch(a -> a.equals("-h") || a.equals("--help"))) {
        AttentionOp.checkSettings(); // a bad -Dlongctx... value: exit 2 now, not at the first attention call
      }
      return command.run(rest, out, err);
    } catch (IllegalArgumentException e) {
      InputError ie = InputError.find(e);
      err.println("longctx " + cmd + ": error: " + (ie != null ? ie.getMessage() : withCauses(e)));
      return 2;
    } catch (Throwable e) {
      InputError ie = InputError.find(e);
      if (ie != null) {
        err.println("longctx " + cmd + ": error: " + ie.getMessage());
        return 2;
      }
      if (Sessions.shuttingDown()) { // Spark's errors then are about its stopped context, not the cause
        // Not e's message: Spark's error for its stopped context reads "[INTERNAL_ERROR] ... report this bug".
        err.println("longctx " + cmd + ": interrupted: the JVM is shutting down (a signal); an output is "
            + "written whole or not at all (docs/RELIABILITY.md)");
        return 130; // the JVM's own status (130, 143) wins: System.exit waits on the shutdown
      }
      err.println("longctx " + cmd + ": failed: " + e);
      e.printStackTrace(err);
      return 1;
    } finally {
      Sessions.stopFailed(); // after the error is printed: a failed job's other tasks may still be ending
    }
  }

  /**
   * The message and those of its causes that add something: Spark wraps a bad --conf value as "Error
   * while instantiating '...SessionStateBuilder':", and only the cause names the property and value.
   */
  static String withCauses(Throwable e) {
    StringBuilder m = new StringBuilder(String.valueOf(e.getMessage()));
    Throwable c = e.getCause();
    for (int depth = 0; c != null && depth < 8; c = c.getCause(), depth++) {
      if (c.getMessage() != null && !m.toString().contains(c.getMessage())) {
        m.append(m.toString().endsWith(":") ? " " : ": ").append(c.getMessage());
      }
    }
    return m.toString();
  }

  static int score(String[] argv, PrintStream out, PrintStream err) throws Exception {
    Args a = Args.parse(argv, List.of("--keys", "--queries", "--output", "--format", "--output-format", "--heads",
        "--kv-heads", "--dim",
        "--scale", "--softcap", "--window", "--chunk-len", "--query-block", "--partitions", "--mode", "--backend"),
        List.of("--causal", "--overwrite"));
    if (a.help) {
      out.print(SCORE_HELP);
      return 0;
    }
    ScoreOptions o = new ScoreOptions();
    o.keys = a.get("--keys");
    o.queries = a.get("--queries");
    o.output = a.get("--output");
    o.format = a.get("--format") == null ? null : a.get("--format").toLowerCase(Locale.ROOT);
    o.outputFormat = a.get("--output-format") == null ? null : a.get("--output-format").toLowerCase(Locale.ROOT);
    o.heads = a.positiveIntOrAbsent("--heads");
    o.kvHeads = a.positiveIntOrAbsent("--kv-heads");
    o.dim = a.positiveIntOrAbsent("--dim");
    o.scale = a.doubleValue("--scale", Double.NaN);
    double softcap = a.doubleValue("--softcap", 0);
    o.softcap = (float) softcap;
    if (softcap > 0 && o.softcap == 0f) { // 0 would turn the cap off without a word
      throw new IllegalArgumentException("--softcap " + softcap + " is below float32's range (it would round to 0, no cap)");
    }
    o.causal = a.flag("--causal");
    o.window = a.longValue("--window", 0);
    o.chunkLen = a.intValue("--chunk-len", o.chunkLen);
    o.queryBlock = a.intValue("--query-block", o.queryBlock);
    o.partitions = a.positiveIntOrAbsent("--partitions");
    o.overwrite = a.flag("--overwrite");
    o.backend = a.get("--backend");
    String mode = a.get("--mode");
    if (mode != null) {
      switch (mode.toLowerCase(Locale.ROOT)) {
        case "decode" -> o.mode = ScoreOptions.Mode.DECODE;
        case "prefill" -> o.mode = ScoreOptions.Mode.PREFILL;
        default -> throw new IllegalArgumentException("--mode must be decode or prefill, got " + mode);
      }
    }
    o.check();
    return Sessions.run("longctx score", a.get("--master"), a.confs, spark -> {
      err.print(ScoreJob.run(spark, o));
      return 0;
    });
  }

  static int gen(String[] argv, PrintStream out, PrintStream err) throws Exception {
    Args a = Args.parse(argv, List.of("--docs", "--tokens", "--min-tokens", "--heads", "--kv-heads", "--dim",
        "--queries-per-doc", "--seed", "--format", "--partitions", "--output"), List.of("--prefill", "--overwrite"));
    if (a.help) {
      out.print(GEN_HELP);
      return 0;
    }
    Generator g = new Generator();
    g.docs = a.intValue("--docs", g.docs);
    g.tokens = a.longValue("--tokens", g.tokens);
    g.minTokens = a.get("--min-tokens") == null ? null : a.longValue("--min-tokens", 0);
    g.heads = a.intValue("--heads", g.heads);
    g.kvHeads = a.intValue("--kv-heads", g.kvHeads);
    g.dim = a.intValue("--dim", g.dim);
    g.queriesPerDoc = a.intValue("--queries-per-doc", g.queriesPerDoc);
    g.seed = a.longValue("--seed", g.seed);
    g.prefill = a.flag("--prefill");
    g.format = a.get("--format") == null ? "parquet" : a.get("--format").toLowerCase(Locale.ROOT);
    g.partitions = a.positiveIntOrAbsent("--partitions");
    String dir = a.get("--output");
    if (dir == null) {
      throw new IllegalArgumentException("--output DIR is required");
    }
    g.check();
    long total = g.totalTokens();
    return Sessions.run("longctx gen", a.get("--master"), a.confs, spark -> {
      long t0 = System.nanoTime();
      g.write(spark, dir, a.flag("--overwrite"));
      err.printf(Locale.ROOT, "longctx gen: %d document%s, %d tokens, %d queries -> %s/%s%s (%.1f s)%n", g.docs,
          g.docs == 1 ? "" : "s", total, (long) g.docs * g.queriesPerDoc, dir, g.keysName(), g.queriesPerDoc > 0 ? ", " + g.queriesName() : "",
          (System.nanoTime() - t0) / 1e9);
      return 0;
    });
  }

  static int demo(String[] argv, PrintStream out, PrintStream err) throws Exception {
    Args a = Args.parse(argv, List.of("--tokens", "--sample", "--dir", "--ppl-tokens"), List.of("--ppl-only"));
    if (a.help) {
      out.print(DEMO_HELP);
      return 0;
    }
    int tokens = a.intValue("--tokens", 100_000), sample = a.intValue("--sample", 6);
    int pplTokens = a.intValue("--ppl-tokens", 8_000);
    if (a.flag("--ppl-only") && pplTokens == 0) { // the two together ran nothing, and said ok
      throw new IllegalArgumentException("demo --ppl-only --ppl-tokens 0 runs nothing: give --ppl-tokens N >= 1");
    }
    if (tokens < 1 || sample < 0 || pplTokens < 0) {
      throw new IllegalArgumentException("demo needs --tokens >= 1, --sample >= 0, --ppl-tokens >= 0; got " + tokens
          + ", " + sample + ", " + pplTokens);
    }
    boolean temp = a.get("--dir") == null;
    Path dir = temp ? Files.createTempDirectory("longctx-demo-") : Path.of(a.get("--dir"));
    if (!temp) {
      OutputCommit.claimWorkDir(dir, "demo", false);
    }
    // The generated corpus is ~200 MB: not left in /tmp, also when the run is interrupted.
    try (io.longctx.djl.MadeFolders.Temporary ignored = temp ? new io.longctx.djl.MadeFolders.Temporary(dir, false)
        : null) {
      return Sessions.run("longctx demo", a.get("--master"), a.confs, spark -> {
        if (!temp) {
          OutputCommit.claimWorkDir(dir, "demo", true);
        }
        boolean ok = a.flag("--ppl-only")
            || Demo.run(spark, dir, tokens, sample, out);
        if (pplTokens > 0) {
          ok &= Demo.runPpl(spark, dir, pplTokens, out);
        }
        return ok ? 0 : 1;
      });
    }
  }

  private LongctxMain() {}
}
