package io.longctx.examples;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.ByteArrayOutputStream;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;

/** bench's help and its output streams: JSON on stdout only, progress on stderr. */
class KernelBenchTest {

  record Out(String out, String err) {}

  static Out run(String... args) {
    PrintStream oldOut = System.out, oldErr = System.err;
    ByteArrayOutputStream out = new ByteArrayOutputStream(), err = new ByteArrayOutputStream();
    System.setOut(new PrintStream(out, true, StandardCharsets.UTF_8));
    System.setErr(new PrintStream(err, true, StandardCharsets.UTF_8));
    try {
      KernelBench.main(args);
    } finally {
      System.setOut(oldOut);
      System.setErr(oldErr);
    }
    return new Out(out.toString(StandardCharsets.UTF_8), err.toString(StandardCharsets.UTF_8));
  }

  @Test
  void helpNamesTheCommandEveryDefaultAndWhatVsAnchorMeans() {
    String help = run("--help").out();
    assertTrue(help.startsWith("usage: longctx bench"), help);
    assertTrue(help.contains("vs_anchor = anchor time / our time (higher is better"), help);
    for (String opt : List.of("--op", "--t", "--tk", "--heads", "--kv-heads", "--dim", "--iters", "--warmup",
        "--block-q", "--split")) {
      String line = Arrays.stream(help.split("\n")).filter(l -> l.trim().startsWith(opt + " ")).findFirst()
          .orElseThrow(() -> new AssertionError(opt + " missing:\n" + help));
      assertTrue(line.contains("default"), line);
    }
    assertTrue(help.contains("--plain"), help);
  }

  @Test
  void tinyRunPrintsJsonOnStdoutAndProgressOnStderr() {
    Out r = run("--t", "48", "--tk", "300", "--heads", "4", "--kv-heads", "2", "--dim", "32", "--iters", "1",
        "--warmup", "1");
    List<String> lines = r.out().lines().toList();
    // forward: java, op, anchor, non-causal and causal; decode: java, unified max, copy, op, anchor
    assertEquals(11, lines.size(), r.out());
    assertTrue(lines.stream().allMatch(l -> l.startsWith("{\"impl\"")), r.out());
    assertTrue(lines.stream().noneMatch(l -> l.contains("djl-plain")), "djl-plain is opt-in:\n" + r.out());
    assertTrue(r.err().contains("bench: decode: 1 query row(s), 4 heads over 2 kv heads, 300 keys"), r.err());
    assertTrue(r.err().contains("djl-plain skipped (--plain to include it)"), r.err());
    assertTrue(r.err().contains("round 1 took"), r.err());
    // the forward's Java kernel is warmed before the rounds, so that --only java is not timed cold
    assertTrue(r.err().contains("bench: Java kernel's JIT warm-up: "), r.err());
    // its 30 s budget can run out on a loaded machine: then it says so, and the count falls short
    assertTrue(r.err().contains("budget spent before the kernel was warm")
        || io.longctx.kernels.CpuAttention.tileSteps() >= io.longctx.kernels.CpuAttention.JIT_WARM_TILE_STEPS, r.err());
    assertEquals(2, lines.stream().filter(l -> l.startsWith("{\"impl\": \"op\", \"op\": \"forward\"")
        && l.contains("\"vs_faster\": ") && l.contains("\"faster\": \"")).count(), "the forward op lines carry vs_faster:\n" + r.out());
  }

  /**
   * vs_faster: java is faster at the median (20 against 25), and the figure is the median of java / op
   * round by round (10/11, 40/25, 20/20: 1.0), neither the ratio of the medians nor each round's
   * faster call over op (10/11, 20/25, 20/20: 0.909, the best of two noisy samples: biased low).
   */
  @Test
  void vsFasterComparesTheFasterPathsCallsRoundByRound() {
    double[][] rounds = {{10, 40, 20}, {11, 25, 20}, {30, 20, 25}}; // [impl: java, op, anchor][round]
    assertEquals(0, KernelBench.fasterPath(KernelBench.medians(rounds), 0, 2));
    assertEquals(1.0, KernelBench.vsFaster(rounds, 0, 1), 1e-12);
    assertEquals(20, KernelBench.medians(rounds)[1], 0);
    double[][] anchorFaster = {{30, 40, 26}, {11, 25, 20}, {10, 20, 25}};
    assertEquals(2, KernelBench.fasterPath(KernelBench.medians(anchorFaster), 0, 2));
    assertEquals(10.0 / 11, KernelBench.vsFaster(anchorFaster, 2, 1), 1e-12); // median of 10/11, 20/25, 25/20
  }

  @Test
  void callersAddsOneLinePerImplWithTheConcurrentFigures() {
    Out r = run("--op", "forward", "--causal", "--t", "40", "--heads", "2", "--dim", "16", "--iters", "1", "--warmup",
        "1", "--no-anchor", "--callers", "2");
    List<String> lines = r.out().lines().toList();
    // java and op, once with one caller, once with two at a time
    assertEquals(4, lines.size(), r.out());
    List<String> two = lines.stream().filter(l -> l.contains("\"callers\": 2, \"vs_one_caller\": ")).toList();
    assertEquals(2, two.size(), r.out());
    assertTrue(two.get(0).startsWith("{\"impl\": \"java\"") && two.get(1).startsWith("{\"impl\": \"op\""), r.out());
  }

  /** --memory of java alone at a tiny forward shape, and {@code more}. */
  static String[] memoryAnd(String... more) {
    List<String> a = new ArrayList<>(List.of("--memory", "--op", "forward", "--causal", "--t", "16", "--heads", "1",
        "--dim", "8", "--impls", "java", "--no-anchor"));
    a.addAll(List.of(more));
    return a.toArray(String[]::new);
  }

  /**
   * --memory measures each implementation at the shape it is timed at: with --op all, --t is the
   * forward's tokens and the decode runs one query row (its children were given --t as their rows).
   * The children inherit the heap cap and say it (xmx: the capped-heap plot's legend read "-Xmxnull").
   */
  @Test
  void memoryChildrenRunTheTimedShapes() throws Exception {
    String javaBin = Path.of(System.getProperty("java.home"), "bin", "java").toString();
    List<String> cmd = new ArrayList<>(List.of(javaBin, "--add-modules=jdk.incubator.vector", "-Xmx256m", "-cp",
        System.getProperty("java.class.path"), KernelBench.class.getName(), "--memory", "--t", "40", "--tk", "300",
        "--heads", "2", "--kv-heads", "2", "--dim", "16", "--impls", "java", "--no-anchor"));
    Process p = new ProcessBuilder(cmd).redirectError(ProcessBuilder.Redirect.DISCARD).start();
    String out = new String(p.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
    assertTrue(p.waitFor(120, TimeUnit.SECONDS));
    assertEquals(0, p.exitValue(), out);
    List<String> lines = out.lines().toList();
    assertEquals(3, lines.size(), out); // forward non-causal and causal, decode
    assertEquals(2, lines.stream().filter(l -> l.contains("\"op\": \"forward\", \"t\": 40, \"tk\": 300")).count(), out);
    assertEquals(1, lines.stream().filter(l -> l.contains("\"op\": \"decode\", \"t\": 1, \"tk\": 300")).count(), out);
    assertTrue(lines.stream().allMatch(l -> l.contains("\"peak_extra_mb\": ") && l.contains("\"xmx\": \"256m\"")), out);
  }

  @Test
  void heapCapIsTheLastMaxHeapOptionGiven() {
    assertEquals("2g", KernelBench.heapCap(List.of("-Xms1g", "-Xmx384m", "-XX:MaxHeapSize=2g")));
    assertEquals("384m", KernelBench.heapCap(List.of("-XX:MaxHeapSize=2g", "-Xmx384m", "-Xss4m")));
    assertEquals(null, KernelBench.heapCap(List.of("-Xms1g", "--add-modules=jdk.incubator.vector")));
  }

  /** A bad number or an out-of-range option: exit 2 naming it (a child JVM: main calls System.exit). */
  @Test
  void badOptionsAreExit2NamingTheOption() throws Exception {
    String javaBin = Path.of(System.getProperty("java.home"), "bin", "java").toString();
    String[][] cases = {
        {"--sweep", "0"}, {"--t", "x"}, {"--t"}, {"--block-q", "5"}, {"--frobnicate"}, {"--op"}, {"--t", "0"},
        {"--op", "forward", "--heads", "8", "--kv-heads", "3"}, {"--op", "decode", "--heads", "12"},
        {"--op", "foo"}, {"--only", "nope"}, {"--only", "copy"}, {"--only", "libtorch-sdpa", "--no-anchor"},
        {"--op", "decode", "--tk", "1024", "--chunk-keys", "1024"}, {"--op", "decode", "--chunk-keys", "65536"},
        {"--split", "0"}, {"--dim", "2000"}, {"--t", "3000000"}, {"--memory", "--impls", "jav"},
        {"--memory", "--block-q", "0"}, {"--impls", "java"},
        // tiny, so that a --memory that dropped these (it did) ran its children quickly and exited 0
        memoryAnd("--only", "java"), memoryAnd("--iters", "3"), memoryAnd("--warmup", "0"), memoryAnd("--callers", "2")};
    String[] expect = {"maxBlocksPerSweep must be >= 1", "--t needs a number, got 'x'", "--t needs a number, got nothing",
        "blockQ must be a positive multiple", "unknown option --frobnicate", "--op needs a value, got nothing",
        "--t must be >= 1, got 0", "forward runs 8 heads over 3 kv heads: --heads must be a multiple of --kv-heads",
        "decode runs 12 heads over 8 kv heads", "--op must be forward, decode or all, got 'foo'",
        "--only with --op all must be one of java, op, libtorch-sdpa, djl-plain, got 'nope'",
        "--only with --op all must be one of java, op, libtorch-sdpa, djl-plain, got 'copy'",
        "--only libtorch-sdpa times the anchor: leave out --no-anchor",
        "--chunk-keys 1024 makes one chunk of the 1024 keys", "--chunk-keys 65536 makes one chunk of the 65536 keys",
        // These were stack traces, or (--memory) children that each failed while the parent exited 0.
        "--split must be >= 1, got 0", "--dim must be at most 1024", "floats in one array, more than one holds",
        "--impls takes java, op, libtorch-sdpa, djl-plain, java-unified-max, got jav", "blockQ must be a positive multiple",
        "--impls chooses what --memory measures", "--impls NAME chooses which, not --only", "--iters does not apply",
        "--warmup does not apply", "--callers times concurrent calls, which it does not measure"};
    for (int c = 0; c < cases.length; c++) {
      List<String> cmd = new ArrayList<>(List.of(javaBin, "--add-modules=jdk.incubator.vector", "-cp",
          System.getProperty("java.class.path"), KernelBench.class.getName()));
      cmd.addAll(List.of(cases[c]));
      Process p = new ProcessBuilder(cmd).redirectErrorStream(true).start();
      String out = new String(p.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
      assertTrue(p.waitFor(60, TimeUnit.SECONDS), String.join(" ", cases[c]));
      assertEquals(2, p.exitValue(), String.join(" ", cases[c]) + ":\n" + out);
      assertTrue(out.contains(expect[c]), String.join(" ", cases[c]) + ":\n" + out);
      assertTrue(!out.contains("\tat "), "a stack trace:\n" + out);
    }
  }
}
