package io.longctx.spark;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import io.longctx.kernels.Seeds;
import java.io.File;
import java.io.IOException;
import java.io.OutputStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.concurrent.TimeUnit;
import java.util.jar.Attributes;
import java.util.jar.JarEntry;
import java.util.jar.JarOutputStream;
import java.util.jar.Manifest;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import java.util.stream.Stream;
import io.longctx.djl.ModelGenerator;
import org.apache.spark.sql.SparkSession;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.MethodOrderer;
import org.junit.jupiter.api.Order;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestInstance;
import org.junit.jupiter.api.TestMethodOrder;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.api.io.TempDir;

/**
 * Faults on a real standalone cluster (docs/RELIABILITY.md): a Master and two Workers (1 core,
 * 1 GiB each) started as JVMs from the test classpath's Spark jars, bound to 127.0.0.1 with
 * ephemeral ports; every job is submitted with {@code org.apache.spark.deploy.SparkSubmit} (client
 * mode) as a child JVM, with an application jar this test builds from the compiled classes (the
 * {@code test} phase runs before {@code package}). Runs, all on one cluster:
 *
 * <ul>
 *   <li>fault-free: the reference bits;
 *   <li>one executor SIGKILLed mid-stage in the map (kernel) stage, then another in the reduce
 *       (LSE-merge, output-writing) stage of the same job: the job recovers (new executors, lost
 *       shuffle output recomputed) and the output is bit-identical;
 *   <li>injected task failures (the test-only {@link FaultHooks}) in both stages with
 *       spark.task.maxFailures retries: bit-identical;
 *   <li>the driver SIGKILLed mid-job: no OUT, no _SUCCESS anywhere, only the hidden temp
 *       directory; the Worker ends the orphaned executors;
 *   <li>split {@code ppl} (a 3-layer model, every document split over 4 tasks per layer): an
 *       executor SIGKILLed while it runs layer 1, and injected failures of every layer-1 task:
 *       the same bits as the fault-free cluster run (which matches the in-process one-task path);
 *   <li>prefill (every key token its document's causal query): an executor SIGKILLed in a query
 *       block's task: the bits of the same job run in this process.
 * </ul>
 *
 * Tasks are paused for a kill by the marker protocol of {@link FaultHooks} (the paused task writes
 * its JVM's pid). Every process this test starts is SIGKILLed after each test (drivers) and in
 * {@link #stop()} (Workers, their executors, the Master); everything has a timeout. Logs of every
 * JVM are kept in target/fault-tests.
 */
@TestInstance(TestInstance.Lifecycle.PER_CLASS)
@TestMethodOrder(MethodOrderer.OrderAnnotation.class)
class FaultToleranceTest {
  static final Pattern MASTER_URL = Pattern.compile("Starting Spark master at (spark://[0-9.]+:[0-9]+)");

  @TempDir
  static Path tmp;

  final SparkSession spark = TestSpark.get();
  final List<Process> daemons = new ArrayList<>();
  final List<Run> started = new ArrayList<>();
  final long seed = Seeds.forTest();
  String java, sparkCp, masterUrl;
  Path home, appJar, keys, queries;
  List<String> flags;
  Map<String, Outputs.Result> reference;

  @BeforeAll
  @Timeout(value = 120, unit = TimeUnit.SECONDS)
  void start() throws Exception {
    // Several documents and chunks (chunk-len 50), so every stage has several tasks; one document
    // with negative positions.
    TestData data = new TestData(seed, 4, 2, 16).doc("x", 400, 0, 1).doc("y", 200, 30, 2).doc("z", 90, -60, 1)
        .randomQueries(4);
    keys = data.writeKeys(spark, tmp, "parquet", false);
    queries = data.writeQueries(spark, tmp, "parquet");

    java = Path.of(System.getProperty("java.home"), "bin", "java").toString();
    List<String> jars = new ArrayList<>();
    List<Path> classDirs = new ArrayList<>();
    for (String e : System.getProperty("java.class.path").split(File.pathSeparator)) {
      Path p = Path.of(e);
      if (Files.isDirectory(p)) {
        if (!p.getFileName().toString().equals("test-classes")) {
          classDirs.add(p); // spark-job/target/classes, kernels/target/classes
        }
      } else if (e.endsWith(".jar") && Files.isRegularFile(p)) {
        jars.add(e);
      }
    }
    sparkCp = String.join(File.pathSeparator, jars);
    appJar = tmp.resolve("longctx-spark-job-test-app.jar");
    writeJar(appJar, classDirs);

    home = tmp.resolve("spark-home");
    Files.createDirectories(home.resolve("jars"));
    Files.createDirectories(home.resolve("launcher/target/scala-2.13"));
    // C1 only and small heaps: seven JVMs share two cores here.
    flags = new ArrayList<>(LocalClusterTest.ManagementFlags.jvmFlags());
    flags.addAll(List.of("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-D" + FaultHooks.ENABLE_PROPERTY + "=true",
        "-Dai.djl.offline=true", "-D" + PplJob.PROGRESS_SECONDS_PROPERTY + "=1"));

    // Should this JVM be ended from outside (surefire's timeout), take the cluster with it.
    Runtime.getRuntime().addShutdownHook(new Thread(() -> daemons.forEach(d -> {
      d.descendants().forEach(ProcessHandle::destroyForcibly);
      d.destroyForcibly();
    })));
    Process master = daemon("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", "0",
        "--webui-port", "0");
    masterUrl = awaitLog(tmp.resolve("master.log"), MASTER_URL, master, 60).group(1);
    List<Process> workers = new ArrayList<>();
    for (int i = 1; i <= 2; i++) {
      Path work = tmp.resolve("worker" + i);
      Files.createDirectories(work);
      workers.add(daemon("worker" + i, "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--port", "0",
          "--webui-port", "0", "--cores", "1", "--memory", "1g", "--work-dir", work.toString(), masterUrl));
    }
    for (int i = 1; i <= 2; i++) {
      awaitLog(tmp.resolve("worker" + i + ".log"), Pattern.compile("Successfully registered with master"),
          workers.get(i - 1), 60);
    }
  }

  @AfterEach
  void endDrivers() {
    for (Run r : started) { // a failed assertion must not leave a driver holding the executors
      r.process.descendants().forEach(ProcessHandle::destroyForcibly);
      r.process.destroyForcibly();
    }
    started.clear();
  }

  @AfterAll
  void stop() throws IOException {
    endDrivers();
    for (Process p : daemons) { // Workers' executors, then the Workers and the Master
      p.descendants().forEach(ProcessHandle::destroyForcibly);
    }
    for (int i = daemons.size() - 1; i >= 0; i--) {
      daemons.get(i).destroyForcibly();
    }
    for (Process p : daemons) {
      try {
        p.waitFor(10, TimeUnit.SECONDS);
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
      }
    }
    // Keep the logs of the cluster and of every run (CI artifacts; the temp dir is deleted).
    Path keep = Path.of("target", "fault-tests");
    Files.createDirectories(keep);
    try (Stream<Path> s = Files.walk(tmp)) {
      for (Path log : s.filter(p -> p.getFileName().toString().endsWith(".log")
          || p.getFileName().toString().equals("stderr")).toList()) {
        Files.copy(log, keep.resolve(tmp.relativize(log).toString().replace(File.separatorChar, '-')),
            StandardCopyOption.REPLACE_EXISTING);
      }
    }
  }

  @Test
  @Order(1)
  @Timeout(value = 150, unit = TimeUnit.SECONDS)
  void faultFreeRun() throws Exception {
    assertEquals(3 * 6, reference().size(), "one row per query");
  }

  @Test
  @Order(2)
  @Timeout(value = 150, unit = TimeUnit.SECONDS)
  void executorKilledInMapStageThenInReduceStage() throws Exception {
    Map<String, Outputs.Result> ref = reference();
    Run r = submit("kill-executors", Map.of(FaultHooks.PAUSE_STAGE, FaultHooks.MAP + "," + FaultHooks.REDUCE));
    for (String stage : List.of(FaultHooks.MAP, FaultHooks.REDUCE)) {
      killPausedExecutor(r, stage);
    }
    r.await(120);
    assertEquals(0, r.exitCode(), r.tail());
    String log = r.log();
    // The reason is the Worker's "Command exited with code 137" or, if the closed connection is noticed first,
    // "Remote RPC client disassociated": count the executors, not the messages.
    assertEquals(2, Pattern.compile("Lost executor (\\d+) on 127\\.0\\.0\\.1").matcher(log).results().map(m -> m.group(1))
        .distinct().count(), "the driver saw both executors die:\n" + r.tail());
    assertSameBits(ref, r.output(), "one executor SIGKILLed in the map stage, another in the reduce stage");
  }

  @Test
  @Order(3)
  @Timeout(value = 150, unit = TimeUnit.SECONDS)
  void injectedTaskFailuresAreRetried() throws Exception {
    Map<String, Outputs.Result> ref = reference();
    Run r = submit("retries", Map.of(FaultHooks.FAIL_FIRST_ATTEMPTS, "2", "spark.task.maxFailures", "4"));
    r.await(120);
    assertEquals(0, r.exitCode(), r.tail());
    String log = r.log();
    for (String stage : List.of(FaultHooks.MAP, FaultHooks.REDUCE)) {
      assertTrue(log.contains("injected test failure (" + FaultHooks.FAIL_FIRST_ATTEMPTS + "=2) in the " + stage
          + " stage"), "failures were injected in the " + stage + " stage:\n" + r.tail());
    }
    assertSameBits(ref, r.output(), "with 2 failed attempts of every map and reduce task");
  }

  @Test
  @Order(4)
  @Timeout(value = 150, unit = TimeUnit.SECONDS)
  void driverKilledMidJobLeavesNoOutput() throws Exception {
    Run r = submit("driver-killed", Map.of(FaultHooks.PAUSE_STAGE, FaultHooks.REDUCE));
    long executor = r.awaitPause(FaultHooks.REDUCE);
    r.process.destroyForcibly(); // SIGKILL: no finally block of the driver runs
    assertTrue(r.process.waitFor(30, TimeUnit.SECONDS));
    assertNoCompleteOutput(r, true);
    // The Master notices the lost driver and the Worker ends the application's executors.
    Optional<ProcessHandle> e = ProcessHandle.of(executor);
    if (e.isPresent()) {
      e.get().onExit().get(60, TimeUnit.SECONDS); // TimeoutException: the executor outlived its driver
    }
  }

  /**
   * README's cluster recipe, for real: SparkSubmit to the standalone Master with only
   * {@code --conf spark.driver.host=ADDRESS}, the driver on another loopback address (127.0.0.3)
   * than the Master and Workers (127.0.0.1), no SPARK_LOCAL_IP for the driver. The executors must
   * reach the driver there: a driver still bound to 127.0.0.1 would leave them unable to connect.
   */
  @Test
  @Order(5)
  @Timeout(value = 150, unit = TimeUnit.SECONDS)
  void readmeClusterRecipeWithTheDriverOnAnotherAddress() throws Exception {
    Map<String, Outputs.Result> ref = reference();
    Run r = submit("recipe", Map.of("spark.driver.host", "127.0.0.3"), false);
    r.await(120);
    assertEquals(0, r.exitCode(), r.tail());
    assertTrue(r.log().contains("127.0.0.3"), "the driver advertised 127.0.0.3:\n" + r.tail());
    assertSameBits(ref, r.output(), "the driver on 127.0.0.3");
  }


  /** Split ppl, fault-free on the cluster: the reference of the next two, checked against the one-task path. */
  @Test
  @Order(6)
  @Timeout(value = 200, unit = TimeUnit.SECONDS)
  void splitPplFaultFree() throws Exception {
    Map<String, Double> ref = pplReference();
    assertEquals(3, ref.size());
    // In this JVM, one document per task: the same model code, but libtorch here runs its matmuls with
    // other thread counts than the one-core executors, which can round differently (seen: 1.1e-9
    // relative on a sum); within a cluster run the bits are exact, which the next two tests check.
    Path out = tmp.resolve("ppl-local");
    assertEquals(0, LongctxMain.run(new String[] {"ppl", "--model", pplModel.toString(), "--input",
        pplInput.toString(), "--output", out.toString(), "--chunk-len", "20"}, System.out, System.err));
    Map<String, Double> local = pplSums(out);
    for (String d : ref.keySet()) {
      assertEquals(local.get(d), ref.get(d), 1e-5 * Math.abs(local.get(d)), "doc " + d + " (seed " + seed + ")");
    }
  }

  @Test
  @Order(7)
  @Timeout(value = 200, unit = TimeUnit.SECONDS)
  void splitPplExecutorKilledInAMiddleLayer() throws Exception {
    Map<String, Double> ref = pplReference();
    String stage = FaultHooks.layerStage(1, FaultHooks.REDUCE);
    Run r = submitPpl("ppl-kill", Map.of(FaultHooks.PAUSE_STAGE, stage));
    killPausedExecutor(r, stage);
    r.await(180);
    assertEquals(0, r.exitCode(), r.tail());
    assertTrue(Pattern.compile("Lost executor \\d+ on 127\\.0\\.0\\.1").matcher(r.log()).find(), r.tail());
    assertEquals(ref, pplSums(r.out), "an executor SIGKILLed in layer 1 of 3 (seed " + seed + ")");
  }

  @Test
  @Order(8)
  @Timeout(value = 200, unit = TimeUnit.SECONDS)
  void splitPplLayerTasksRetried() throws Exception {
    Map<String, Double> ref = pplReference();
    String stages = FaultHooks.layerStage(1, FaultHooks.MAP) + "," + FaultHooks.layerStage(1, FaultHooks.REDUCE);
    Run r = submitPpl("ppl-retries", Map.of(FaultHooks.FAIL_FIRST_ATTEMPTS, "1", FaultHooks.FAIL_STAGE, stages,
        "spark.task.maxFailures", "4"));
    r.await(180);
    assertEquals(0, r.exitCode(), r.tail());
    assertTrue(r.log().contains("in the " + FaultHooks.layerStage(1, FaultHooks.REDUCE) + " stage"), r.tail());
    assertEquals(ref, pplSums(r.out), "every layer-1 task failed once (seed " + seed + ")");
  }

  @Test
  @Order(9)
  @Timeout(value = 200, unit = TimeUnit.SECONDS)
  void prefillExecutorKilledInABlockTask() throws Exception {
    // Prefill sends every key token to its query blocks in one shuffle; a block's task assembles the chunks it
    // sees and merges their states (the MAP hook). An executor SIGKILLed there loses that task and the shuffle
    // output it held: the job recovers, with the bits of the same job run in this process.
    Path dir = Files.createDirectories(tmp.resolve("prefill-data"));
    Path keys = new TestData(seed, 4, 2, 16).doc("x", 300, 0, 1).doc("y", 120, 30, 2)
        .writeKeys(spark, dir, "parquet", true);
    ScoreOptions o = new ScoreOptions();
    o.mode = ScoreOptions.Mode.PREFILL;
    o.keys = keys.toString();
    o.output = dir.resolve("in-process").toString();
    o.heads = 4;
    o.chunkLen = 50;
    ScoreJob.run(spark, o);
    Map<String, Outputs.Result> ref = Outputs.read(spark, Path.of(o.output), "parquet", true);
    assertEquals(420, ref.size(), "one row per token");
    Path out = tmp.resolve("runs").resolve("prefill-kill").resolve("out");
    Run r = submit("prefill-kill", Map.of(FaultHooks.PAUSE_STAGE, FaultHooks.MAP), true, List.of("score", "--mode",
        "prefill", "--keys", keys.toString(), "--output", out.toString(), "--heads", "4", "--chunk-len", "50"));
    killPausedExecutor(r, FaultHooks.MAP);
    r.await(150);
    assertEquals(0, r.exitCode(), r.tail());
    assertTrue(Pattern.compile("Lost executor \\d+ on 127\\.0\\.0\\.1").matcher(r.log()).find(), r.tail());
    assertSameBits(ref, Outputs.read(spark, out, "parquet", true), "prefill, an executor SIGKILLed in a block task");
  }

  @Test
  @Order(10)
  @Timeout(value = 200, unit = TimeUnit.SECONDS)
  void pplProgressCountsTheTokensOfARunningTask() throws Exception {
    // One document of 300 tokens in one task, paused after its first chunk (20 positions): the driver's
    // progress line counts them from the executor's heartbeats while the task still runs.
    pplReference(); // makes the model
    java.util.SplittableRandom rnd = new java.util.SplittableRandom(seed);
    StringBuilder t = new StringBuilder();
    for (int i = 0; i < 300; i++) {
      t.append(i == 0 ? "" : ",").append(rnd.nextInt(TestModels.small(seed, 3).vocab));
    }
    Path input = Files.writeString(tmp.resolve("ppl-one-doc.jsonl"), "{\"doc_id\": \"long\", \"tokens\": [" + t + "]}\n");
    Run r = submit("ppl-progress", Map.of(FaultHooks.PAUSE_STAGE, FaultHooks.PPL_CHUNK,
        "spark.executor.heartbeatInterval", "500ms"), true, List.of("ppl", "--model", pplModel.toString(), "--input",
        input.toString(), "--output", tmp.resolve("runs").resolve("ppl-progress").resolve("out").toString(),
        "--chunk-len", "20", "--split-above", "1000"));
    r.awaitPause(FaultHooks.PPL_CHUNK);
    awaitLog(r.logFile, Pattern.compile("longctx ppl: 0/1 documents done, 20/300 tokens"), r.process, 100);
    Files.createFile(r.dir.resolve("pause").resolve(FaultHooks.PPL_CHUNK + ".release"));
    r.await(120);
    assertEquals(0, r.exitCode(), r.tail());
    assertTrue(r.log().contains("longctx ppl: scoring 1 document (300 tokens) in 1 task"), r.tail());
  }

  // ---------------------------------------------------------------- runs

  /** The fault-free cluster run, computed once. */
  Map<String, Outputs.Result> reference() throws Exception {
    if (reference == null) {
      Run r = submit("fault-free", Map.of());
      r.await(120);
      assertEquals(0, r.exitCode(), r.tail());
      assertTrue(r.log().contains("chunk pairs"), r.tail());
      reference = r.output();
    }
    return reference;
  }

  Path pplModel, pplInput;
  Map<String, Double> pplReference;

  /** The fault-free split ppl run on the cluster (made once, with its model and documents). */
  Map<String, Double> pplReference() throws Exception {
    if (pplReference == null) {
      ModelGenerator.Spec s = TestModels.small(seed, 3);
      pplModel = tmp.resolve("ppl-model");
      ModelGenerator.generate(s, pplModel);
      java.util.SplittableRandom rnd = new java.util.SplittableRandom(seed);
      List<String> lines = new ArrayList<>();
      for (int d = 0; d < 3; d++) {
        StringBuilder t = new StringBuilder();
        for (int i = 0; i < 90 + 40 * d; i++) {
          t.append(i == 0 ? "" : ",").append(rnd.nextInt(s.vocab));
        }
        lines.add("{\"doc_id\": \"p" + d + "\", \"tokens\": [" + t + "]}");
      }
      pplInput = tmp.resolve("ppl-docs.jsonl");
      Files.writeString(pplInput, String.join("\n", lines) + "\n");
      Run r = submitPpl("ppl-fault-free", Map.of());
      r.await(180);
      assertEquals(0, r.exitCode(), r.tail());
      assertTrue(r.log().contains("layer 3/3 done"), r.tail());
      pplReference = pplSums(r.out);
    }
    return pplReference;
  }

  Map<String, Double> pplSums(Path out) {
    Map<String, Double> m = new java.util.TreeMap<>();
    for (org.apache.spark.sql.Row row : spark.read().json(out.toString()).collectAsList()) {
      m.put(row.getAs("doc_id"), row.getAs("sum_logprob"));
    }
    return m;
  }

  /** Submits split ppl (every document split, chunks of 20 tokens, 4 tasks per layer) on the cluster. */
  Run submitPpl(String name, Map<String, String> conf) throws IOException {
    return submit(name, conf, true, List.of("ppl", "--model", pplModel.toString(), "--input", pplInput.toString(),
        "--output", tmp.resolve("runs").resolve(name).resolve("out").toString(), "--chunk-len", "20",
        "--split-above", "0", "--split-partitions", "4"));
  }

  /** Waits until a task of run r pauses in {@code stage}, then SIGKILLs the executor JVM it runs in. */
  void killPausedExecutor(Run r, String stage) throws Exception {
    long pid = r.awaitPause(stage);
    ProcessHandle victim = ProcessHandle.of(pid).orElseThrow(() -> new AssertionError("no process " + pid));
    assertNotEquals(r.process.pid(), pid, "the hook ran in the driver");
    // Executors are children of the Worker JVMs.
    assertTrue(daemons.stream().anyMatch(d -> d.children().anyMatch(c -> c.pid() == pid)),
        "pid " + pid + " is not an executor started by a Worker of this test");
    assertTrue(victim.destroyForcibly(), "SIGKILL " + pid); // SIGKILL on Linux
    victim.onExit().get(30, TimeUnit.SECONDS);
  }

  void assertNoCompleteOutput(Run r, boolean hiddenTempAllowed) throws IOException {
    assertFalse(Files.exists(r.out), "no OUT after a failed job");
    try (Stream<Path> s = Files.walk(r.out.getParent())) {
      for (Path p : s.toList()) {
        String name = p.getFileName().toString();
        assertFalse(name.equals("_SUCCESS"), "a _SUCCESS marker was left: " + p);
        if (p.getParent().equals(r.out.getParent()) && !name.equals("pause") && !name.equals("driver.log")) {
          assertTrue(hiddenTempAllowed && name.startsWith("." + r.out.getFileName() + "-tmp-"),
              "left behind after the failure: " + p);
        }
      }
    }
  }

  void assertSameBits(Map<String, Outputs.Result> a, Map<String, Outputs.Result> b, String what) {
    assertEquals(a.keySet(), b.keySet(), what);
    for (String q : a.keySet()) {
      String m = what + ", query " + q + " (seed " + seed + ")";
      assertArrayEquals(EndToEndTest.bits(a.get(q).o()), EndToEndTest.bits(b.get(q).o()), m);
      assertArrayEquals(EndToEndTest.bits(a.get(q).lse()), EndToEndTest.bits(b.get(q).lse()), m);
      assertEquals(a.get(q).nKeys(), b.get(q).nKeys(), m);
    }
  }

  final class Run {
    final Process process;
    final Path dir, out, logFile;

    Run(Process process, Path dir) {
      this.process = process;
      this.dir = dir;
      this.out = dir.resolve("out");
      this.logFile = dir.resolve("driver.log");
    }

    void await(int seconds) throws Exception {
      boolean done;
      try {
        done = process.waitFor(seconds, TimeUnit.SECONDS);
      } finally {
        process.descendants().forEach(ProcessHandle::destroyForcibly);
        process.destroyForcibly();
      }
      assertTrue(done, "driver did not finish in " + seconds + " s:\n" + tail());
    }

    int exitCode() {
      return process.exitValue();
    }

    String log() throws IOException {
      return Files.readString(logFile);
    }

    String tail() {
      try {
        return LocalClusterTest.tail(log());
      } catch (IOException e) {
        return e.toString();
      }
    }

    Map<String, Outputs.Result> output() {
      return Outputs.read(spark, out, "parquet", false);
    }

    /** Waits for the paused task's marker; returns the pid of the JVM it runs in. */
    long awaitPause(String stage) throws Exception {
      Path marker = dir.resolve("pause").resolve(stage + ".pid");
      long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(120);
      while (!Files.exists(marker)) {
        if (!process.isAlive()) {
          fail("the driver ended before a " + stage + " task paused:\n" + tail());
        }
        if (System.nanoTime() > deadline) {
          process.destroyForcibly();
          fail("no " + stage + " task paused in 120 s:\n" + tail());
        }
        Thread.sleep(50);
      }
      List<String> lines = Files.readAllLines(marker);
      assertEquals(stage, lines.get(1), "marker " + lines);
      return Long.parseLong(lines.get(0).strip());
    }
  }

  /** Submits {@code score} on the cluster with SparkSubmit (client mode); extra Spark properties. */
  Run submit(String name, Map<String, String> conf) throws IOException {
    return submit(name, conf, true);
  }

  /** loopback false: no driver address settings and no SPARK_LOCAL_IP for the driver (the README recipe). */
  Run submit(String name, Map<String, String> conf, boolean loopback) throws IOException {
    Path dir = tmp.resolve("runs").resolve(name);
    return submit(name, conf, loopback, List.of("score", "--keys", keys.toString(), "--queries", queries.toString(),
        "--output", dir.resolve("out").toString(), "--dim", "16", "--causal", "--chunk-len", "50",
        "--query-block", "3"));
  }

  /** Submits {@code command} (a longctx command line) on the cluster. */
  Run submit(String name, Map<String, String> conf, boolean loopback, List<String> command) throws IOException {
    Path dir = tmp.resolve("runs").resolve(name);
    Files.createDirectories(dir.resolve("pause"));
    Map<String, String> c = new LinkedHashMap<>();
    c.put("spark.executor.extraClassPath", sparkCp); // Spark itself; the job's classes come from the app jar
    c.put("spark.executor.extraJavaOptions", String.join(" ", flags));
    c.put("spark.executor.memory", "512m");
    if (loopback) {
      c.put("spark.driver.host", "127.0.0.1");
      c.put("spark.driver.bindAddress", "127.0.0.1");
    }
    c.put("spark.ui.enabled", "false");
    c.put("spark.ui.showConsoleProgress", "false");
    c.put("spark.sql.shuffle.partitions", "4");
    c.put("spark.sql.adaptive.coalescePartitions.enabled", "false"); // keep 4 tasks per stage
    c.put("spark.task.maxFailures", "4");
    if (conf.containsKey(FaultHooks.PAUSE_STAGE)) {
      c.put(FaultHooks.PAUSE_DIR, dir.resolve("pause").toString());
    }
    c.putAll(conf);
    List<String> cmd = new ArrayList<>(List.of(java));
    cmd.addAll(flags);
    cmd.addAll(List.of("-Xmx768m", "-cp", sparkCp, "org.apache.spark.deploy.SparkSubmit", "--master", masterUrl,
        "--deploy-mode", "client", "--class", LongctxMain.class.getName()));
    c.forEach((k, v) -> cmd.addAll(List.of("--conf", k + "=" + v)));
    cmd.add(appJar.toString());
    cmd.addAll(command);
    Run r = new Run(process(cmd, dir.resolve("driver.log"), loopback), dir);
    started.add(r);
    return r;
  }

  // ---------------------------------------------------------------- processes

  Process daemon(String name, String mainClass, String... args) throws IOException {
    List<String> cmd = new ArrayList<>(List.of(java));
    cmd.addAll(flags);
    cmd.addAll(List.of("-Xmx256m", "-Dspark.worker.cleanup.enabled=false", "-cp", sparkCp, mainClass));
    cmd.addAll(List.of(args));
    Process p = process(cmd, tmp.resolve(name + ".log"));
    daemons.add(p);
    return p;
  }

  Process process(List<String> cmd, Path log) throws IOException {
    return process(cmd, log, true);
  }

  Process process(List<String> cmd, Path log, boolean loopback) throws IOException {
    ProcessBuilder pb = new ProcessBuilder(cmd).redirectErrorStream(true).redirectOutput(log.toFile());
    Map<String, String> env = pb.environment();
    env.keySet().removeIf(k -> k.startsWith("SPARK_") || k.startsWith("PYSPARK"));
    env.put("SPARK_HOME", home.toString());
    env.put("SPARK_SCALA_VERSION", "2.13");
    if (loopback) {
      env.put("SPARK_LOCAL_IP", "127.0.0.1");
    }
    env.put("JAVA_HOME", System.getProperty("java.home"));
    return pb.start();
  }

  static Matcher awaitLog(Path log, Pattern p, Process proc, int seconds) throws Exception {
    long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(seconds);
    while (true) {
      String s = Files.exists(log) ? Files.readString(log) : "";
      Matcher m = p.matcher(s);
      if (m.find()) {
        return m;
      }
      if (!proc.isAlive() || System.nanoTime() > deadline) {
        fail("'" + p.pattern() + "' did not appear in " + log + (proc.isAlive() ? " in " + seconds + " s" : " (exited)")
            + ":\n" + LocalClusterTest.tail(s));
      }
      Thread.sleep(100);
    }
  }

  /** A jar of the compiled classes (job + kernels), as the shaded -app.jar would hold them. */
  static void writeJar(Path jar, List<Path> dirs) throws IOException {
    Manifest mf = new Manifest();
    mf.getMainAttributes().put(Attributes.Name.MANIFEST_VERSION, "1.0");
    mf.getMainAttributes().put(Attributes.Name.MAIN_CLASS, LongctxMain.class.getName());
    java.util.Set<String> seen = new java.util.HashSet<>();
    try (OutputStream fo = Files.newOutputStream(jar); JarOutputStream jo = new JarOutputStream(fo, mf)) {
      for (Path d : dirs) {
        try (Stream<Path> s = Files.walk(d)) {
          for (Path f : s.filter(Files::isRegularFile).sorted().toList()) {
            String name = d.relativize(f).toString().replace(File.separatorChar, '/');
            if (name.equals("META-INF/MANIFEST.MF") || !seen.add(name)) {
              continue;
            }
            jo.putNextEntry(new JarEntry(name));
            Files.copy(f, jo);
            jo.closeEntry();
          }
        }
      }
    }
  }
}
