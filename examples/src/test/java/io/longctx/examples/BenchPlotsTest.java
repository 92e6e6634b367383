package io.longctx.examples;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.awt.image.BufferedImage;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.Map;
import javax.imageio.ImageIO;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

class BenchPlotsTest {
  @TempDir
  Path tmp;

  static String line(String impl, int t, boolean causal, String fields) {
    return "{\"impl\": \"" + impl + "\", \"op\": \"forward\", \"t\": " + t + ", \"tk\": " + t
        + ", \"heads\": 8, \"kv_heads\": 8, \"dim\": 128, \"causal\": " + causal + ", " + fields + "}";
  }

  @Test
  void readsKernelBenchLinesAndTakesTheMedianPerShape() throws Exception {
    Path f = tmp.resolve("x.jsonl");
    Files.write(f, List.of(
        line("java", 1024, false, "\"ms\": 80.0, \"gflops\": 50.0, \"vs_anchor\": 0.70"),
        line("java", 1024, false, "\"ms\": 70.0, \"gflops\": 60.0, \"vs_anchor\": 0.80"),
        line("java", 1024, false, "\"ms\": 60.0, \"gflops\": 70.0, \"vs_anchor\": 0.90"),
        line("java", 2048, true, "\"ms\": 60.0, \"gflops\": 40.0"),
        "{\"impl\": \"djl-plain\", \"op\": \"forward\", \"causal\": false, \"error\": \"exit 1: out of memory\"}",
        "not json"));
    List<Map<String, String>> rows = BenchPlots.read(f);
    assertEquals(5, rows.size());
    assertEquals("exit 1: out of memory", rows.get(4).get("error"));
    assertEquals(Map.of(1024, 60.0), BenchPlots.median(rows, "java", false, "gflops"));
    assertEquals(Map.of(2048, 40.0), BenchPlots.median(rows, "java", true, "gflops"));
    assertTrue(BenchPlots.median(rows, "djl-plain", false, "gflops").isEmpty());
  }

  @Test
  void writesThePlots() throws Exception {
    Path data = Files.createDirectories(tmp.resolve("data"));
    Path out = tmp.resolve("plots");
    Files.write(data.resolve("forward-sweep.jsonl"), List.of(
        line("java", 1024, false, "\"ms\": 80.0, \"gflops\": 50.0, \"vs_anchor\": 0.70"),
        line("libtorch-sdpa", 1024, false, "\"ms\": 60.0, \"gflops\": 70.0"),
        line("java", 2048, false, "\"ms\": 300.0, \"gflops\": 55.0, \"vs_anchor\": 0.75"),
        line("libtorch-sdpa", 2048, false, "\"ms\": 220.0, \"gflops\": 76.0")));
    Files.write(data.resolve("memory-sweep.jsonl"), List.of(
        line("op", 1024, false, "\"ms\": 1.0, \"gflops\": 1.0, \"peak_extra_mb\": 25.0"),
        line("op", 2048, false, "\"ms\": 1.0, \"gflops\": 1.0, \"peak_extra_mb\": 22.0"),
        line("djl-plain", 2048, false, "\"ms\": 1.0, \"gflops\": 1.0, \"peak_extra_mb\": 263.0")));
    System.setProperty("java.awt.headless", "true");
    BenchPlots.main(new String[] {"--data", data.toString(), "--out", out.toString()});
    for (String name : List.of("throughput-vs-t.png", "ratio-vs-t.png", "memory-vs-t.png")) {
      BufferedImage img = ImageIO.read(out.resolve(name).toFile());
      assertTrue(img != null && img.getWidth() > 600 && img.getHeight() > 300, name);
    }
    // a sweep without memory lines draws the speed plots and no empty memory plot
    Files.delete(data.resolve("memory-sweep.jsonl"));
    Path speedOnly = tmp.resolve("speed-only");
    BenchPlots.main(new String[] {"--data", data.toString(), "--out", speedOnly.toString()});
    assertTrue(Files.isRegularFile(speedOnly.resolve("ratio-vs-t.png")));
    assertTrue(!Files.exists(speedOnly.resolve("memory-vs-t.png")));
  }

  /**
   * The capped-heap points' legend names the cap bench recorded (xmx), says where none was recorded
   * (it read "-Xmxnull"), and one cap's runs at several T are one series (a second T was a name clash).
   */
  @Test
  void cappedHeapLegendNamesTheCapOrSaysItWasNotRecorded() {
    List<Map<String, String>> memory = List.of(BenchPlots.read(write("m.jsonl",
        line("op", 1024, false, "\"peak_extra_mb\": 25.0"))).get(0));
    List<Map<String, String>> capped = BenchPlots.read(write("c.jsonl",
        line("java", 8192, true, "\"peak_extra_mb\": 90.0, \"xmx\": \"384m\""),
        line("java", 16384, true, "\"peak_extra_mb\": 157.5, \"xmx\": \"384m\""),
        line("java", 16384, true, "\"peak_extra_mb\": 150.0")));
    Map<String, org.knowm.xchart.XYSeries> series = BenchPlots.memoryChart(memory, capped).getSeriesMap();
    assertTrue(series.keySet().stream().noneMatch(n -> n.contains("null")), series.keySet().toString());
    org.knowm.xchart.XYSeries at384 = series.get("java, causal, heap capped at -Xmx384m (what the call needs)");
    assertTrue(at384 != null && at384.getXData().length == 2, series.keySet().toString());
    assertTrue(series.containsKey("java, causal, heap capped (cap not recorded) (what the call needs)"),
        series.keySet().toString());
  }

  private Path write(String name, String... lines) {
    try {
      return Files.write(tmp.resolve(name), List.of(lines));
    } catch (java.io.IOException e) {
      throw new java.io.UncheckedIOException(e);
    }
  }

  /** An option without its value, or data that is not there: exit 2 naming it (a child JVM: main exits). */
  @Test
  void badArgumentsAreExit2() throws Exception {
    String javaBin = Path.of(System.getProperty("java.home"), "bin", "java").toString();
    Path empty = Files.createDirectories(tmp.resolve("empty"));
    String[][] cases = {{"--data"}, {"--data", tmp.resolve("none").toString()}, {"--bogus"}, {"--data", empty.toString()}};
    String[] expect = {"--data needs a value", "none is not a directory", "unknown option --bogus", "nothing to draw"};
    for (int c = 0; c < cases.length; c++) {
      List<String> cmd = new java.util.ArrayList<>(List.of(javaBin, "-Djava.awt.headless=true", "-cp",
          System.getProperty("java.class.path"), BenchPlots.class.getName(), "--out", tmp.resolve("plots").toString()));
      cmd.addAll(List.of(cases[c]));
      Process p = new ProcessBuilder(cmd).redirectErrorStream(true).start();
      String out = new String(p.getInputStream().readAllBytes(), java.nio.charset.StandardCharsets.UTF_8);
      assertTrue(p.waitFor(60, java.util.concurrent.TimeUnit.SECONDS), String.join(" ", cases[c]));
      assertEquals(2, p.exitValue(), String.join(" ", cases[c]) + ":\n" + out);
      assertTrue(out.contains(expect[c]) && !out.contains("\tat "), String.join(" ", cases[c]) + ":\n" + out);
    }
  }
}
