package io.longctx.spark;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.apache.spark.SparkConf;
import org.apache.spark.sql.SparkSession;

/**
 * Builds the SparkSession. Precedence, lowest first: built-in defaults (console progress bar, Parquet reader
 * batch size), the file named by system property {@code longctx.conf} or env {@code LONGCTX_CONF}
 * (spark-defaults.conf syntax; bin/longctx passes conf/spark-defaults.conf), Spark properties
 * already set (SparkSubmit's --conf), then --master / --conf on the command line.
 * Master: --master, else spark.master if set (SparkSubmit), else local[*]. With a local master
 * (and only then) the driver binds to and advertises 127.0.0.1 unless a setting says otherwise.
 */
public final class Sessions {
  private Sessions() {}

  /** A command's work on a session. */
  @FunctionalInterface
  public interface Work {
    int run(SparkSession spark) throws Exception;
  }

  /**
   * Runs a command's work on a session made for it and stops the session after, unless one existed
   * already (tests share theirs); returns the work's exit status. After a failure (an exception or a
   * non-zero status) the stop is left to {@link #stopFailed}.
   */
  public static int run(String appName, String master, List<String> confs, Work work) throws Exception {
    boolean owned = SparkSession.getDefaultSession().isEmpty();
    SparkSession spark = create(appName, master, confs);
    boolean ok = false;
    try {
      int status = work.run(spark);
      ok = status == 0;
      return status;
    } finally {
      if (owned && ok) {
        spark.stop();
      } else if (owned) {
        FAILED.set(() -> {
          drainTasks(spark, DRAIN_MILLIS);
          spark.stop();
        });
      }
    }
  }

  /**
   * Names the jobs this thread starts from now on (until the next label, or null to clear): Spark's stage
   * names, its UI and event log show LABEL instead of the call site, which for Dataset actions is an
   * internal lambda ("$anonfun$withThreadLocalCaptured$1 at CompletableFuture.java").
   */
  static void label(SparkSession spark, String label) {
    if (label == null) {
      spark.sparkContext().clearCallSite();
    } else {
      spark.sparkContext().setCallSite(label);
    }
    spark.sparkContext().setJobDescription(label);
  }

  /** How long a failed command waits for the tasks still running before it stops the session. */
  static final long DRAIN_MILLIS = 10_000;

  private static final java.util.concurrent.atomic.AtomicReference<Runnable> FAILED =
      new java.util.concurrent.atomic.AtomicReference<>();

  /**
   * Whether the JVM is shutting down (a signal, or System.exit elsewhere): a job failing then failed
   * because its SparkContext was stopped under it, not for a reason of its own.
   */
  static boolean shuttingDown() {
    Thread probe = new Thread(() -> {});
    try {
      Runtime.getRuntime().addShutdownHook(probe);
      Runtime.getRuntime().removeShutdownHook(probe);
      return false;
    } catch (IllegalStateException e) {
      return true;
    }
  }

  /**
   * Stops the session of a command that failed ({@link #run} leaves it to this, so that the command's
   * error is printed first): waits up to {@link #DRAIN_MILLIS} for its tasks still running, then
   * stops it. Nothing to do after a command that succeeded or ran on a session it did not make.
   */
  public static void stopFailed() {
    Runnable stop = FAILED.getAndSet(null);
    if (stop != null) {
      stop.run();
    }
  }

  /**
   * After a failed job: cancels what still runs and waits (at most {@code maxMillis}) until no task
   * runs. A job fails at its first failed task while the others run on (a task sees a cancel only
   * between rows); stopping the session under them made each log an ERROR with a stack trace (a
   * broadcast block gone) after the command's own one-line error. Returns the tasks still running.
   */
  static int drainTasks(SparkSession spark, long maxMillis) {
    org.apache.spark.SparkContext sc = spark.sparkContext();
    try {
      sc.cancelAllJobs();
    } catch (IllegalStateException stopped) { // stopped meanwhile (a signal's shutdown): nothing runs
      return 0;
    }
    long end = System.nanoTime() + maxMillis * 1_000_000L;
    int running = runningTasks(sc);
    while (running > 0 && System.nanoTime() < end) {
      try {
        Thread.sleep(20);
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        break;
      }
      running = runningTasks(sc);
    }
    return running;
  }

  /**
   * Tasks running on the executors, those of a failed job's stage included: started minus ended, as
   * the listener bus delivered them to the session's {@link TaskCount} (all it had posted by now).
   * Spark's status tracker was no help: its store saves a count at most every 100 ms
   * (spark.ui.liveUpdate.period) unless the count falls to 0, so two tasks started right after an
   * earlier stage ended still read 0 when one of them failed, and a failed ppl run stopped its session
   * under the other (3 runs in 4: Spark's stack traces after the one-line error).
   */
  static int runningTasks(org.apache.spark.SparkContext sc) {
    if (sc.isStopped()) { // by a signal's shutdown, say: nothing runs
      return 0;
    }
    TaskCount count = COUNTS.get(sc);
    if (count == null) { // a session made elsewhere: the status tracker, late as it may be
      int n = 0;
      for (org.apache.spark.SparkExecutorInfo e : sc.statusTracker().getExecutorInfos()) {
        n += e.numRunningTasks();
      }
      return n;
    }
    try {
      sc.listenerBus().waitUntilEmpty(1_000);
    } catch (java.util.concurrent.TimeoutException | IllegalStateException e) {
      // a listener slower than that, or the bus stopped: the count as delivered so far
    }
    return count.running.get();
  }

  /** Tasks started minus tasks ended on one SparkContext, from its listener bus. */
  static final class TaskCount extends org.apache.spark.scheduler.SparkListener {
    final java.util.concurrent.atomic.AtomicInteger running = new java.util.concurrent.atomic.AtomicInteger();

    @Override
    public void onTaskStart(org.apache.spark.scheduler.SparkListenerTaskStart e) {
      running.incrementAndGet();
    }

    @Override
    public void onTaskEnd(org.apache.spark.scheduler.SparkListenerTaskEnd e) {
      running.decrementAndGet();
    }
  }

  private static final Map<org.apache.spark.SparkContext, TaskCount> COUNTS =
      java.util.Collections.synchronizedMap(new java.util.WeakHashMap<>());

  /** Counts the tasks of SC from now on ({@link #runningTasks}); once per context. */
  static void countTasks(org.apache.spark.SparkContext sc) {
    COUNTS.computeIfAbsent(sc, c -> {
      TaskCount t = new TaskCount();
      c.addSparkListener(t);
      return t;
    });
  }


  public static SparkSession create(String appName, String master, List<String> confs) {
    SparkSession.Builder b = SparkSession.builder().appName(appName);
    settings(master, confs).forEach(b::config);
    try {
      SparkSession spark = b.getOrCreate();
      // The SQL settings are read when the session state is first built: now, so that a bad --conf value is said
      // before a command makes anything (demo had made and marked its --dir by then)
      spark.conf().getAll();
      countTasks(spark.sparkContext());
      return spark;
    } catch (Exception e) { // Scala throws SparkException unchecked
      if (String.valueOf(e.getMessage()).startsWith("Could not parse Master URL")) { // bad usage: exit 2, one line
        throw new InputError("--master: " + e.getMessage());
      }
      throw e;
    }
  }

  /** The session's properties in precedence order (see the class comment). */
  static Map<String, String> settings(String master, List<String> confs) {
    Map<String, String> conf = new LinkedHashMap<>();
    conf.put("spark.ui.showConsoleProgress", "true");
    // longctx writes no tables: keep Spark's (empty) warehouse directory out of the user's working directory
    conf.put("spark.sql.warehouse.dir", Path.of(System.getProperty("java.io.tmpdir"), "longctx-spark-warehouse-"
        + System.getProperty("user.name", "user")).toUri().toString());
    // A row of ours holds whole vectors (heads x dim floats): Parquet's default 4096-row batches made the reader
    // grow 8-16 MiB column vectors in every file it opened, 1.2 GB of garbage for a 200 MB input, and a cold
    // read stage paid for it in page faults and GC (docs/BENCHMARKS.md, Spark overhead).
    conf.put("spark.sql.parquet.columnarReaderBatchSize", "256");
    String file = System.getProperty("longctx.conf", System.getenv("LONGCTX_CONF"));
    if (file != null && !file.isEmpty()) {
      Path p = Path.of(file); // a misspelled name would drop every setting in silence (/dev/null: none, on purpose)
      if (!Files.exists(p) || Files.isDirectory(p)) {
        throw new InputError("Spark defaults file " + file + " (LONGCTX_CONF or -Dlongctx.conf) "
            + (Files.isDirectory(p) ? "is a directory" : "does not exist"));
      }
      conf.putAll(readDefaults(p));
    }
    SparkConf already = new SparkConf(true); // spark.* system properties, e.g. from SparkSubmit
    for (scala.Tuple2<String, String> kv : already.getAll()) {
      conf.put(kv._1(), kv._2());
    }
    for (String kv : confs) {
      int eq = kv.indexOf('=');
      conf.put(kv.substring(0, eq).trim(), kv.substring(eq + 1).trim());
    }
    if (master != null) {
      conf.put("spark.master", master);
    }
    conf.putIfAbsent("spark.master", "local[*]");
    if (isLocal(conf.get("spark.master"))) {
      // Everything runs on this machine: stay on loopback. On a cluster the executors must reach the driver
      // at an address of the caller's choosing (spark.driver.host), so nothing is pinned there.
      conf.putIfAbsent("spark.driver.host", "127.0.0.1");
      conf.putIfAbsent("spark.driver.bindAddress", "127.0.0.1");
    }
    return conf;
  }

  /** local, local[N], local[*], local[N,F], local-cluster[...]: every JVM on this machine. */
  static boolean isLocal(String master) {
    return master.equals("local") || master.startsWith("local[") || master.startsWith("local-cluster[");
  }

  /** spark-defaults.conf syntax: "key value" or "key=value" per line, # comments. */
  static Map<String, String> readDefaults(Path p) {
    Map<String, String> m = new LinkedHashMap<>();
    try {
      for (String line : Files.readAllLines(p)) {
        String s = line.strip();
        if (s.isEmpty() || s.startsWith("#")) {
          continue;
        }
        String[] kv = s.split("[\\s=]+", 2);
        if (kv.length == 2) {
          m.put(kv[0], kv[1].strip());
        }
      }
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
    return m;
  }
}
