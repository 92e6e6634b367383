package io.longctx.examples;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.io.InputStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import java.util.jar.JarEntry;
import java.util.jar.JarOutputStream;
import javax.tools.ToolProvider;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * Runs the shell scripts of examples/ and bin/, each several times: shell races (a pipe whose reader
 * quits early kills its writer with SIGPIPE, exit 141 under pipefail) fail only some of the time.
 * The example scripts run against a stub launcher (LONGCTX=stub-longctx.sh) that writes their
 * inputs at once: what is tested is the scripts' own shell, not Spark (EndToEndTest covers that).
 * Not run here: bench-sweep's real benchmarks, scale-runs.sh's runs (tens of minutes each) and
 * gpu-check's bundle/run (a build and a GPU).
 */
class ScriptsTest {

  static final int REPEATS = 5;

  static Path root;
  static Path stub;

  @TempDir
  static Path tmp;

  @BeforeAll
  static void setUp() throws IOException {
    root = Path.of("").toAbsolutePath().getParent(); // surefire runs in examples/
    assertTrue(Files.isRegularFile(root.resolve("bin/longctx")), "repository root not found from " + root);
    stub = tmp.resolve("stub-longctx.sh");
    try (InputStream in = ScriptsTest.class.getResourceAsStream("stub-longctx.sh")) {
      Files.copy(in, stub, StandardCopyOption.REPLACE_EXISTING);
    }
    assertTrue(stub.toFile().setExecutable(true));
  }

  record Result(int rc, String out) {}

  static Result run(Map<String, String> env, String... cmd) throws Exception {
    ProcessBuilder pb = new ProcessBuilder(cmd).directory(root.toFile()).redirectErrorStream(true);
    // the caller's code limits would show in bench-sweep's cpu field: only what a test sets
    pb.environment().keySet().removeAll(List.of("LONGCTX_JAVA_OPTS", "ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS"));
    pb.environment().putAll(env);
    Path log = Files.createTempFile(tmp, "out", ".txt");
    pb.redirectOutput(log.toFile());
    Process p = pb.start();
    if (!p.waitFor(60, TimeUnit.SECONDS)) {
      p.descendants().forEach(ProcessHandle::destroyForcibly);
      p.destroyForcibly();
      throw new AssertionError(String.join(" ", cmd) + " ran past 60 s:\n" + Files.readString(log));
    }
    return new Result(p.exitValue(), Files.readString(log, StandardCharsets.UTF_8));
  }

  @Test
  void scoreEndToEndShowsItsRowsEveryTime() throws Exception {
    for (int i = 0; i < REPEATS; i++) {
      Path work = Files.createDirectory(tmp.resolve("e2e-" + i));
      Result r = run(Map.of("LONGCTX", stub.toString()), "examples/score-end-to-end.sh", work.toString());
      assertEquals(0, r.rc(), "run " + i + " exit " + r.rc() + ":\n" + r.out());
      assertTrue(r.out().contains("q-00-6"), r.out());
      assertTrue(!r.out().contains("q-00-7"), "more than 6 rows:\n" + r.out());
    }
  }

  /** --help, or an OUTDIR that reads as an option, ran the sweep (mkdir took it as its own option). */
  @Test
  void benchSweepHelpAndADashLedOutdirRunNothing() throws Exception {
    Path calls = tmp.resolve("calls");
    Path logging = tmp.resolve("logging-stub.sh");
    Files.writeString(logging, "#!/bin/sh\necho \"$@\" >> " + calls + "\n");
    assertTrue(logging.toFile().setExecutable(true));
    Result help = run(Map.of("LONGCTX", logging.toString(), "TS", "1024"), "examples/bench-sweep.sh", "--help");
    assertEquals(0, help.rc(), help.out());
    assertTrue(help.out().contains("examples/bench-sweep.sh [OUTDIR]"), help.out());
    Result dash = run(Map.of("LONGCTX", logging.toString(), "TS", "1024"), "examples/bench-sweep.sh", "--out");
    assertEquals(2, dash.rc(), dash.out());
    assertTrue(!Files.exists(calls) && !Files.exists(Path.of("--out")), "the launcher was called: " + dash.out());
  }

  @Test
  void benchSweepTagsAndKeepsOnlyJsonLines() throws Exception {
    for (int i = 0; i < REPEATS; i++) {
      Path out = Files.createDirectory(tmp.resolve("sweep-" + i));
      Result r = run(Map.of("LONGCTX", stub.toString(), "TS", "1024"), "examples/bench-sweep.sh", out.toString());
      assertEquals(0, r.rc(), "run " + i + " exit " + r.rc() + ":\n" + r.out());
      for (String f : List.of("forward-sweep.jsonl", "memory-sweep.jsonl")) {
        List<String> lines = Files.readAllLines(out.resolve(f));
        assertEquals(3, lines.size(), f + ": " + lines);
        assertTrue(lines.stream().allMatch(l -> l.startsWith("{") && l.contains("\"load1\"") && l.contains("\"cpu\": \"")), f + ": " + lines);
        assertTrue(lines.stream().noneMatch(l -> l.contains("limited code")), f + ": " + lines);
      }
    }
    // AVX2 code on a wider CPU is said on every line (the AVX2 machines' stand-in)
    Path out = Files.createDirectory(tmp.resolve("sweep-avx2"));
    Result r = run(Map.of("LONGCTX", stub.toString(), "TS", "1024", "SKIP_MEMORY", "1", "LONGCTX_JAVA_OPTS",
        "-Xmx1g -XX:UseAVX=2", "ATEN_CPU_CAPABILITY", "avx2"), "examples/bench-sweep.sh", out.toString());
    assertEquals(0, r.rc(), r.out());
    List<String> lines = Files.readAllLines(out.resolve("forward-sweep.jsonl"));
    assertTrue(!lines.isEmpty() && lines.stream().allMatch(
        l -> l.contains(" CPU running limited code: -XX:UseAVX=2, ATEN_CPU_CAPABILITY=avx2\"")), lines.toString());
  }

  /** SKIP_PLAIN=1 leaves djl-plain out of the memory half too (it measured djl-plain there). */
  @Test
  void benchSweepSkipPlainLeavesDjlPlainOutOfBothHalves() throws Exception {
    Path out = Files.createDirectory(tmp.resolve("sweep-skip-plain"));
    Path args = tmp.resolve("sweep-skip-plain-args.txt");
    Result r = run(Map.of("LONGCTX", stub.toString(), "TS", "1024", "SKIP_PLAIN", "1", "STUB_ARGS", args.toString()),
        "examples/bench-sweep.sh", out.toString());
    assertEquals(0, r.rc(), r.out());
    List<String> calls = Files.readAllLines(args);
    assertEquals(2, calls.size(), calls.toString()); // the time half, then the memory half
    assertTrue(calls.get(1).endsWith("--memory --impls java,op,libtorch-sdpa"), calls.toString());
    assertTrue(calls.stream().noneMatch(c -> c.contains("plain")), calls.toString());
  }

  @Test
  void launchersAnswerHelpAndRefuseUnknownCommands() throws Exception {
    Path data = tmp.resolve("scale-data");
    Map<String, String> scaleEnv = Map.of("DATA", data.toString(), "OUT", tmp.resolve("scale.jsonl").toString());
    for (int i = 0; i < REPEATS; i++) {
      Result help = run(Map.of(), "bin/longctx", "--help");
      assertEquals(0, help.rc(), help.out());
      assertTrue(help.out().startsWith("usage: bin/longctx"), help.out());
      Result none = run(Map.of(), "bin/longctx"); // no command: a usage error
      assertEquals(2, none.rc());
      assertTrue(none.out().contains("usage: bin/longctx"), none.out());
      Result bad = run(Map.of(), "bin/longctx", "no-such-command");
      assertEquals(2, bad.rc(), bad.out());
      assertTrue(bad.out().contains("unknown command 'no-such-command'"), bad.out());
      assertEquals(0, run(Map.of(), "bin/gpu-check", "--help").rc());
      assertEquals(2, run(Map.of(), "bin/gpu-check").rc());
      Result scale = run(scaleEnv, "examples/scale-runs.sh", "--help");
      assertEquals(2, scale.rc(), scale.out()); // usage, no run
      assertTrue(scale.out().contains("examples/scale-runs.sh decode"), scale.out());
      assertTrue(!Files.exists(data), "usage made " + data);
    }
  }

  /** scale-runs.sh deletes (clean) and writes only into a DATA folder it made, never a user's. */
  @Test
  void scaleRunsLeavesAForeignDataFolderAlone() throws Exception {
    Path foreign = Files.createDirectory(tmp.resolve("users-folder"));
    Files.writeString(foreign.resolve("keep.txt"), "mine");
    for (String cmd : List.of("clean", "decode")) {
      Result r = run(Map.of("DATA", foreign.toString(), "OUT", tmp.resolve("scale.jsonl").toString()),
          "examples/scale-runs.sh", cmd);
      assertEquals(2, r.rc(), cmd + ":\n" + r.out());
      assertTrue(r.out().contains("did not make"), r.out());
      assertEquals(List.of(foreign.resolve("keep.txt")), Files.list(foreign).toList(), cmd);
    }
    // nor an empty folder of the user's
    Path empty = Files.createDirectory(tmp.resolve("users-empty"));
    Result e = run(Map.of("DATA", empty.toString()), "examples/scale-runs.sh", "clean");
    assertEquals(2, e.rc(), e.out());
    assertTrue(Files.isDirectory(empty), e.out());
    // A folder it made (marker inside): what the marker lists is its to delete; a file put there later is not
    // (clean deleted the whole folder, a user's files with it).
    Path made = tmp.resolve("made-data");
    Files.createDirectories(made.resolve("tmp"));
    Files.writeString(made.resolve(".made-by-scale-runs"), "tmp\ndecode-100\n");
    Path notes = Files.writeString(made.resolve("notes.txt"), "mine");
    Result r = run(Map.of("DATA", made.toString()), "examples/scale-runs.sh", "clean");
    assertEquals(0, r.rc(), r.out());
    assertEquals(java.util.Set.of(notes, made.resolve(".made-by-scale-runs")),
        java.util.Set.copyOf(Files.list(made).toList()), r.out());
    assertTrue(r.out().contains("kept what it did not make (and its marker): notes.txt"), r.out());
    Files.delete(notes);
    Files.createDirectories(made.resolve("tmp"));
    Files.writeString(made.resolve(".made-by-scale-runs"), "tmp\n");
    r = run(Map.of("DATA", made.toString()), "examples/scale-runs.sh", "clean");
    assertEquals(0, r.rc(), r.out());
    assertTrue(!Files.exists(made), r.out());
    // a marker without names (an older run's, or `touch` to adopt one, as the refusal advises): the script's
    // own names by pattern; a user's file stays, with the marker (the folder was left stranded, unmarked)
    Files.createDirectories(made.resolve("decode-1000").resolve("keys.parquet"));
    Files.createDirectories(made.resolve("tmp"));
    Files.writeString(made.resolve("decode-1000.peak.json"), "{}");
    Files.writeString(made.resolve("decode-1000.log"), "log");
    Files.writeString(made.resolve(".made-by-scale-runs"), "");
    Files.writeString(made.resolve("mine.log"), "mine");
    r = run(Map.of("DATA", made.toString()), "examples/scale-runs.sh", "clean");
    assertEquals(0, r.rc(), r.out());
    assertEquals(java.util.Set.of(made.resolve("mine.log"), made.resolve(".made-by-scale-runs")),
        java.util.Set.copyOf(Files.list(made).toList()), r.out());
  }

  /**
   * A jar holding class Hello, whose main prints "hello" and exits with its first argument, if any; a run
   * that ends well writes the class archive bin/lib/java-cds asks for, as LongctxMain.writeClassArchive does.
   */
  static Path helloJar(Path dir) throws IOException {
    Path src = Files.createDirectories(dir.resolve("src")).resolve("Hello.java");
    Files.writeString(src, "public class Hello { public static void main(String[] a) throws Exception {"
        + " System.out.println(\"hello\"); if (a.length > 0 && a[0].equals(\"sleep\")) try { Thread.sleep(120_000); }"
        + " catch (InterruptedException e) { } else if (a.length > 0 && !a[0].startsWith(\"-\"))"
        + " System.exit(Integer.parseInt(a[0]));"
        + " String f = System.getProperty(\"longctx.cdsArchive\"); if (f != null)"
        + " java.lang.management.ManagementFactory.getPlatformMBeanServer().invoke(new javax.management.ObjectName("
        + "\"com.sun.management:type=DiagnosticCommand\"), \"vmCds\", new Object[] {new String[] {\"dynamic_dump\", f}},"
        + " new String[] {String[].class.getName()}); } }");
    assertEquals(0, ToolProvider.getSystemJavaCompiler().run(null, null, null, "-d", dir.toString(), src.toString()));
    Path jar = dir.resolve("hello.jar");
    try (JarOutputStream out = new JarOutputStream(Files.newOutputStream(jar))) {
      out.putNextEntry(new JarEntry("Hello.class"));
      out.write(Files.readAllBytes(dir.resolve("Hello.class")));
    }
    return jar;
  }

  static List<String> archives(Path dir) throws IOException {
    try (var files = Files.list(dir)) {
      return files.map(f -> f.getFileName().toString()).sorted().toList();
    }
  }

  /**
   * bin/lib/java-cds, which bin/longctx puts in front of score, ppl and spark-bench: the first run
   * writes an archive (and only a successful one keeps it), the next runs load their classes from it,
   * a rebuilt jar gets a new archive in place of the old, --help and LONGCTX_CDS=0 write none, and a
   * place where no archive can be written, or a native agent, runs the command without one.
   */
  @Test
  void classDataSharingArchiveIsWrittenOnceUsedAndRenewedAfterARebuild() throws Exception {
    Path jar = helloJar(Files.createDirectory(tmp.resolve("cds-src")));
    Path dir = tmp.resolve("cds");
    String java = Path.of(System.getProperty("java.home"), "bin", "java").toString();
    String[] hello = {"bin/lib/java-cds", dir.toString(), "hello", java, "-Xlog:class+load=info", "-cp", jar.toString(), "Hello"};

    Result failed = run(Map.of(), concat(hello, "3"));
    assertEquals(3, failed.rc(), failed.out());
    assertEquals(List.of(), archives(dir), "a failed run keeps no archive");
    Result help = run(Map.of(), concat(hello, "--help"));
    assertEquals(0, help.rc(), help.out());
    assertTrue(!help.out().contains("class archive"), help.out());
    assertEquals(0, run(Map.of("LONGCTX_CDS", "0"), hello).rc());
    assertEquals(List.of(), archives(dir), "--help and LONGCTX_CDS=0 write no archive");
    Path file = Files.writeString(tmp.resolve("cds-not-a-dir"), "x"); // no archive can be written below it
    String[] unwritable = hello.clone();
    unwritable[1] = file.resolve("cds").toString();
    Result noPlace = run(Map.of(), unwritable);
    assertEquals(0, noPlace.rc(), noPlace.out());
    assertTrue(noPlace.out().contains("hello") && !noPlace.out().contains("class archive"), noPlace.out());

    // The JVM refuses to write an archive with a native agent loaded (jdwp here, a profiler in use): the
    // command runs, without one.
    String[] agent = new String[hello.length + 1];
    System.arraycopy(hello, 0, agent, 0, 4);
    agent[4] = "-agentlib:jdwp=transport=dt_socket,server=y,suspend=n,address=127.0.0.1:0";
    System.arraycopy(hello, 4, agent, 5, hello.length - 4);
    Result withAgent = run(Map.of(), agent);
    assertEquals(0, withAgent.rc(), withAgent.out());
    assertTrue(withAgent.out().contains("hello") && !withAgent.out().contains("class archive"), withAgent.out());
    assertEquals(List.of(), archives(dir), "a run with a native agent writes no archive");

    Result first = run(Map.of(), hello);
    assertEquals(0, first.rc(), first.out());
    assertTrue(first.out().contains("writes a class archive") && first.out().contains("hello"), first.out());
    List<String> written = archives(dir);
    assertEquals(1, written.size(), written.toString());
    assertTrue(written.get(0).matches("hello-[0-9]+-[0-9]+\\.jsa"), written.toString());
    for (int i = 0; i < 2; i++) {
      Result again = run(Map.of(), hello);
      assertEquals(0, again.rc(), again.out());
      assertTrue(again.out().contains("Hello source: shared objects file (top)"), again.out());
      assertTrue(!again.out().contains("writes a class archive"), again.out());
      assertEquals(written, archives(dir));
    }

    assertTrue(jar.toFile().setLastModified(jar.toFile().lastModified() - 60_000)); // a rebuild
    Result rebuilt = run(Map.of(), hello);
    assertEquals(0, rebuilt.rc(), rebuilt.out());
    assertTrue(rebuilt.out().contains("writes a class archive"), rebuilt.out());
    List<String> renewed = archives(dir);
    assertEquals(1, renewed.size(), renewed.toString());
    assertTrue(!renewed.equals(written), "the rebuilt jar's archive replaces the old one: " + renewed);
    assertTrue(run(Map.of(), hello).out().contains("Hello source: shared objects file (top)"));
  }

  /**
   * A TERM sent to bin/lib/java-cds alone (as a supervisor or timeout(1) sends it) while its first run
   * writes the archive: the JVM is stopped and waited for, and no archive, whole or partial, is left.
   */
  @Test
  void aSignalToTheArchivingRunStopsItsJvm() throws Exception {
    Path jar = helloJar(Files.createDirectory(tmp.resolve("cds-signal-src")));
    Path dir = tmp.resolve("cds-signal");
    String java = Path.of(System.getProperty("java.home"), "bin", "java").toString();
    ProcessBuilder pb = new ProcessBuilder("bin/lib/java-cds", dir.toString(), "hello", java, "-cp", jar.toString(),
        "Hello", "sleep").directory(root.toFile()).redirectErrorStream(true)
        .redirectOutput(Files.createTempFile(tmp, "out", ".txt").toFile());
    Process p = pb.start();
    try {
      ProcessHandle jvm = null;
      for (long end = System.nanoTime() + 30_000_000_000L; jvm == null && System.nanoTime() < end; Thread.sleep(100)) {
        jvm = p.descendants().filter(h -> h.info().command().orElse("").endsWith("java")).findFirst().orElse(null);
      }
      assertTrue(jvm != null, "the JVM started");
      Thread.sleep(1000); // past the JVM's start, into main's sleep
      p.destroy(); // SIGTERM to the script alone
      assertTrue(p.waitFor(30, TimeUnit.SECONDS), "the script ended");
      assertEquals(143, p.exitValue());
      assertTrue(jvm.onExit().get(30, TimeUnit.SECONDS) != null && !jvm.isAlive(), "the JVM ended with it");
      assertEquals(List.of(), Files.exists(dir) ? archives(dir) : List.of(), "no archive, whole or partial");
    } finally {
      p.descendants().forEach(ProcessHandle::destroyForcibly);
      p.destroyForcibly();
    }
  }

  static String[] concat(String[] a, String b) {
    String[] r = java.util.Arrays.copyOf(a, a.length + 1);
    r[a.length] = b;
    return r;
  }
}
