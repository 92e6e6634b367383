package io.longctx.examples;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import ai.djl.ndarray.NDManager;
import io.longctx.djl.DocumentScore;
import io.longctx.djl.LlamaModel;
import io.longctx.djl.ModelGenerator;
import java.io.ByteArrayOutputStream;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** The ppl benchmark's dense anchor against LlamaModel on toy models, and the bench's own plumbing at toy size. */
class PplBenchTest {

  @TempDir
  Path tmp;

  static ModelGenerator.Spec toy(String type) {
    ModelGenerator.Spec s = new ModelGenerator.Spec();
    s.modelType = type;
    s.layers = 2;
    s.hidden = 32;
    s.heads = 4;
    s.kvHeads = 2;
    s.vocab = 300;
    s.seed = 11;
    s.initStd = 2.0 / Math.sqrt(s.hidden); // attention far from uniform: a mask or rotary slip shows
    if (type.equals("qwen2")) {
      s.tie = true;
    }
    if (type.equals("mistral")) {
      s.slidingWindow = 9;
    }
    return s;
  }

  /**
   * The dense one-forward path and the chunked one give the same log-probabilities (llama, qwen2 with
   * tied embeddings and bias, mistral with a window).
   */
  @Test
  void denseAnchorMatchesLlamaModel() throws Exception {
    for (String type : new String[] {"llama", "qwen2", "mistral"}) {
      Path dir = tmp.resolve(type);
      ModelGenerator.generate(toy(type), dir);
      int[] doc = PplBench.tokens(5, 70, 300);
      try (NDManager nm = NDManager.newBaseManager("PyTorch");
          LlamaModel ours = LlamaModel.load(dir, nm);
          DenseLlama dense = DenseLlama.load(dir, nm)) {
        DocumentScore s = ours.score(doc, 7, true);
        float[] d = dense.logprobs(doc);
        assertEquals(doc.length - 1, d.length);
        for (int i = 0; i < d.length; i++) {
          assertEquals(s.logprobs()[i], d[i], 1e-4 + 1e-5 * Math.abs(d[i]), type + " token " + (i + 1));
        }
        double sum = dense.sumLogprob(doc);
        assertEquals(s.sumLogprob(), sum, 1e-5 * Math.abs(sum), type);
      }
    }
  }

  /** A child run prints one JSON line; a dense size over the machine's memory is refused by the estimate, not run. */
  @Test
  void benchPlumbingAtToySize() throws Exception {
    Path dir = tmp.resolve("m");
    ModelGenerator.generate(toy("llama"), dir);
    PplBench.Options o = PplBench.parse(new String[] {"--model", dir.toString(), "--iters", "1", "--chunk-len", "16"});
    o.child = "ours";
    o.t = 40;
    String ours = PplBench.child(o);
    o.child = "dense";
    String dense = PplBench.child(o);
    assertTrue(ours.startsWith("{\"bench\": \"ppl\", \"path\": \"ours\", \"t\": 40, \"ms\": "), ours);
    assertTrue(PplBench.number(ours, "tokens_per_s") > 0, ours);
    assertTrue(PplBench.number(dense, "peak_rss_mb") > 0, dense);
    String cmp = PplBench.compare(40, ours, dense);
    assertTrue(cmp.contains("\"agree_1e-4\": true"), cmp);

    PplBench.Options big =
        PplBench.parse(new String[] {"--model", dir.toString(), "--paths", "dense", "--t", "3000000"});
    String text = stdoutOf(big);
    assertTrue(text.contains("\"path\": \"dense\", \"t\": 3000000, \"did_not_fit\": true"), text);
    assertTrue(text.contains("\"simd\": "), text);
  }

  /**
   * --rounds: the paths in turns (round 2 starts with dense), each child line tagged with its round,
   * and ratio_vs_dense the median of the rounds' own ratios.
   */
  @Test
  void roundsAlternateThePathsAndTakeTheMedianOfPairedRatios() throws Exception {
    Path dir = tmp.resolve("m");
    ModelGenerator.generate(toy("llama"), dir);
    PplBench.Options o = PplBench.parse(new String[] {"--model", dir.toString(), "--t", "40", "--iters", "1",
        "--chunk-len", "16", "--rounds", "2"});
    java.util.List<String> lines = stdoutOf(o).lines()
        .filter(l -> l.contains("\"round\": ") || l.contains("\"compare\": true")).toList();
    assertEquals(5, lines.size(), String.join("\n", lines));
    String[] want = {"\"path\": \"ours\"", "\"path\": \"dense\"", "\"path\": \"dense\"", "\"path\": \"ours\""};
    for (int i = 0; i < 4; i++) {
      assertTrue(lines.get(i).contains(want[i]) && lines.get(i).endsWith("\"round\": " + (i < 2 ? 1 : 2) + "}"),
          i + ": " + lines.get(i));
    }
    assertTrue(lines.get(4).contains("\"rounds\": 2, \"ratios\": [") && lines.get(4).contains("\"agree_1e-4\": true"),
        lines.get(4));

    java.util.function.DoubleFunction<String> line = ms -> String.format(java.util.Locale.ROOT,
        "{\"ms\": %.1f, \"sum_logprob\": -5.0, \"peak_extra_mb\": 1.0}", ms);
    String failed = "{\"error\": \"exit 1\"}";
    // paired ratios 3.0, 1.5, (a failed round left out), 5.0: median 3.0; the medians' ratio would be 30 / 12 = 2.5
    String cmp = PplBench.compare(40, java.util.List.of(line.apply(10), line.apply(20), failed, line.apply(12)),
        java.util.List.of(line.apply(30), line.apply(30), line.apply(30), line.apply(60)));
    assertTrue(cmp.contains("\"ratio_vs_dense\": 3.000, \"rounds\": 3, \"ratios\": [3.000, 1.500, 5.000]"), cmp);
    assertTrue(PplBench.parse(new String[] {"--rounds", "2"}).rounds == 2);
    org.junit.jupiter.api.Assertions.assertThrows(IllegalArgumentException.class,
        () -> PplBench.parse(new String[] {"--rounds", "0"}));
  }

  /** What PplBench.run prints on stdout for {@code o} (its JSON lines). */
  static String stdoutOf(PplBench.Options o) throws Exception {
    ByteArrayOutputStream buf = new ByteArrayOutputStream();
    PrintStream old = System.out;
    System.setOut(new PrintStream(buf, true, StandardCharsets.UTF_8));
    try {
      PplBench.run(o, new String[0]);
    } finally {
      System.setOut(old);
    }
    return buf.toString(StandardCharsets.UTF_8);
  }

  /**
   * With --model nothing is generated, so no temporary folder is made (one was, empty): the run works
   * where none can be (java.io.tmpdir missing). A child JVM, for its own java.io.tmpdir; the dense
   * size is refused by the estimate, so no grandchild runs.
   */
  @Test
  void modelMakesNoTemporaryFolder() throws Exception {
    Path dir = tmp.resolve("m");
    ModelGenerator.generate(toy("llama"), dir);
    String javaBin = Path.of(System.getProperty("java.home"), "bin", "java").toString();
    Process p = new ProcessBuilder(javaBin, "--add-modules=jdk.incubator.vector",
        "-Djava.io.tmpdir=" + tmp.resolve("no-such-folder"), "-cp", System.getProperty("java.class.path"),
        PplBench.class.getName(), "--model", dir.toString(), "--paths", "dense", "--t", "3000000")
        .redirectErrorStream(true).start();
    String out = new String(p.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
    assertTrue(p.waitFor(60, java.util.concurrent.TimeUnit.SECONDS), out);
    assertEquals(0, p.exitValue(), out);
    assertTrue(out.contains("\"path\": \"dense\", \"t\": 3000000, \"did_not_fit\": true"), out);
  }

  /** A bad option or number: exit 2 naming it, no stack trace (a child JVM: main calls System.exit). */
  @Test
  void badOptionsAreExit2NamingTheOption() throws Exception {
    String javaBin = Path.of(System.getProperty("java.home"), "bin", "java").toString();
    String[][] cases = {{"--rounds", "0"}, {"--rounds", "x"}, {"--paths", "foo"}, {"--frobnicate", "1"}, {"--t"}, {"--bogus"},
        {"--t", "0"}, {"--model", "--t"}, {"--iters", "0"}, {"--model", "m", "--layers", "2"}, {"--paths", "ours,ours"}};
    String[] expect = {"bench-ppl: --rounds must be >= 1, got 0", "bench-ppl: --rounds needs a number, got 'x'",
        "--paths takes ours and/or dense, got foo", "unknown option --frobnicate", "--t needs a value", "unknown option --bogus",
        "--t values, --chunk-len and --child-timeout must be >= 1", "--model needs a value, got the option --t",
        "--iters must be >= 1, got 0", "--layers shapes the generated model: with --model the checkpoint's own",
        "--paths names a path twice: ours,ours"};
    for (int c = 0; c < cases.length; c++) {
      java.util.List<String> cmd = new java.util.ArrayList<>(java.util.List.of(javaBin, "-cp",
          System.getProperty("java.class.path"), PplBench.class.getName()));
      cmd.addAll(java.util.List.of(cases[c]));
      Process p = new ProcessBuilder(cmd).redirectErrorStream(true).start();
      String out = new String(p.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
      assertTrue(p.waitFor(60, java.util.concurrent.TimeUnit.SECONDS), String.join(" ", cases[c]));
      assertEquals(2, p.exitValue(), String.join(" ", cases[c]) + ":\n" + out);
      assertTrue(out.contains(expect[c]), String.join(" ", cases[c]) + ":\n" + out);
      assertTrue(!out.contains("\tat "), "a stack trace:\n" + out);
    }
  }
}
