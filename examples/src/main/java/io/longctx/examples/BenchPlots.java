package io.longctx.examples;

import java.awt.BasicStroke;
import java.awt.Color;
import java.awt.Graphics2D;
import java.awt.image.BufferedImage;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import javax.imageio.ImageIO;
import org.knowm.xchart.BitmapEncoder;
import org.knowm.xchart.XYChart;
import org.knowm.xchart.XYChartBuilder;
import org.knowm.xchart.XYSeries;
import org.knowm.xchart.style.Styler;
import org.knowm.xchart.style.XYStyler;
import org.knowm.xchart.style.lines.SeriesLines;
import org.knowm.xchart.style.markers.SeriesMarkers;

/**
 * The plots of docs/BENCHMARKS.md ({@code bin/longctx plots}), from the JSON lines that
 * {@code examples/bench-sweep.sh} saves (KernelBench output, one object per implementation and shape):
 *
 * <ul>
 *   <li>{@code throughput-vs-t.png}: GFLOP/s against sequence length T for java, op, libtorch-sdpa
 *       and djl-plain, non-causal and causal side by side;
 *   <li>{@code ratio-vs-t.png}: the same-run ratio libtorch time / our time against T;
 *   <li>both again for every other {@code forward-sweep-NAME.jsonl} (one CPU's runs each), as
 *       {@code throughput-vs-t-NAME.png} and {@code ratio-vs-t-NAME.png};
 *   <li>{@code memory-vs-t.png}: peak memory beyond the inputs against T (each implementation alone
 *       in a fresh JVM), ours beside the naive materialized attention (djl-plain), with the analytic
 *       lines T^2 x H x 4 B (one score matrix) and the inputs' own O(T x D) size. The Java kernel
 *       appears only where its heap was capped (memory-capped-heap.jsonl: {@code bench --memory}
 *       lines from a run under LONGCTX_JAVA_OPTS=-Xmx..., which name the cap as {@code xmx}):
 *       uncapped, the JVM grows its heap far beyond what the call needs, which is not a property of
 *       the kernel.
 * </ul>
 *
 * <p>Every plot says on its axis how it was measured, the CPU (the lines' {@code cpu} field, which
 * bench-sweep.sh records, or {@code --cpu LABEL} for older data) and the load range.
 *
 * <p>Where a shape was measured more than once, the median of the runs is plotted.
 *
 * <pre>
 *   BenchPlots [--data examples/target/bench-data] [--out examples/target/plots] [--cpu LABEL]
 * </pre>
 *
 * <p>The defaults are bench-sweep.sh's own untracked output and an untracked folder beside it: a
 * plain run never rewrites the committed docs/plots. Those are redrawn with {@code --data
 * docs/bench-data --out docs/plots}.
 */
public final class BenchPlots {
  private BenchPlots() {}

  static final String[] IMPLS = {"java", "op", "libtorch-sdpa", "djl-plain"};
  static final Color[] COLORS = {new Color(0x1f77b4), new Color(0x2ca02c), new Color(0xd62728), new Color(0x7f7f7f)};
  static final String[] LABELS = {"java", "op", "libtorch-sdpa (anchor)", "djl-plain (materialized)"};

  private static final String USAGE = "usage: longctx plots [--data DIR (default examples/target/bench-data, where"
      + " examples/bench-sweep.sh writes)] [--out DIR (default examples/target/plots)] [--cpu LABEL (for lines"
      + " without a cpu field)]\n  Writes throughput-vs-t*.png, ratio-vs-t*.png and memory-vs-t.png into --out, each whole"
      + " (a file of another kind under one of those names is refused)\n  The committed figures: --data docs/bench-data"
      + " --out docs/plots";

  public static void main(String[] args) throws IOException {
    Path data = Path.of("examples/target/bench-data");
    Path out = Path.of("examples/target/plots");
    String cpu = null;
    for (int i = 0; i < args.length; i++) {
      String a = args[i];
      if (List.of("--data", "--out", "--cpu").contains(a) && i + 1 == args.length) {
        System.err.println("plots: " + a + " needs a value\n" + USAGE);
        System.exit(2);
      }
      switch (a) {
        case "--data" -> data = Path.of(args[++i]);
        case "--out" -> out = Path.of(args[++i]);
        case "--cpu" -> cpu = args[++i];
        case "--help", "-h" -> {
          System.out.println(USAGE);
          return;
        }
        default -> {
          System.err.println("plots: unknown option " + a + "\n" + USAGE);
          System.exit(2);
        }
      }
    }
    if (Files.exists(out) && !Files.isDirectory(out)) {
      System.err.println("plots: --out " + out + " is a file, not a folder for the PNGs");
      System.exit(2);
    }
    if (!Files.isDirectory(data)) {
      System.err.println("plots: --data " + data + " is not a directory (examples/bench-sweep.sh writes"
          + " examples/target/bench-data; the recorded figures are in docs/bench-data)");
      System.exit(2);
    }
    // One pair of speed plots per forward-sweep*.jsonl: each file holds one CPU's runs, and lines of
    // different CPUs in one plot would compare machines, not kernels.
    List<Path> sweeps;
    try (var files = Files.list(data)) {
      sweeps = files.filter(f -> f.getFileName().toString().matches("forward-sweep.*\\.jsonl")).sorted().toList();
    }
    Path memoryFile = data.resolve("memory-sweep.jsonl");
    if (sweeps.isEmpty() && !Files.isRegularFile(memoryFile)) {
      System.err.println("plots: no forward-sweep*.jsonl or memory-sweep.jsonl in " + data + ": nothing to draw");
      System.exit(2);
    }
    List<Map<String, String>> memory = Files.isRegularFile(memoryFile) ? read(memoryFile) : List.of();
    Map<Path, List<Map<String, String>>> speeds = new LinkedHashMap<>(); // every file read (and checked) first
    for (Path sweep : sweeps) {
      speeds.put(sweep, read(sweep));
    }
    // every target checked before the first is written (a refusal halfway left the folder half replaced)
    List<Path> targets = new ArrayList<>();
    for (Path sweep : sweeps) {
      String suffix = sweep.getFileName().toString().replaceFirst("^forward-sweep", "").replaceFirst("\\.jsonl$", "");
      targets.add(out.resolve("throughput-vs-t" + suffix + ".png"));
      targets.add(out.resolve("ratio-vs-t" + suffix + ".png"));
    }
    targets.add(out.resolve("memory-vs-t.png"));
    for (Path t : targets) {
      refuseNonPng(t);
    }
    Files.createDirectories(out);
    for (Path sweep : sweeps) {
      String suffix = sweep.getFileName().toString().replaceFirst("^forward-sweep", "").replaceFirst("\\.jsonl$", "");
      List<Map<String, String>> speed = speeds.get(sweep);
      String speedNote = note(speed, cpu);
      Path tp = out.resolve("throughput-vs-t" + suffix + ".png");
      writePng(withCaption(sideBySide(throughput(speed, false), throughput(speed, true)),
          "bin/longctx bench per T: median of rounds that alternate the implementations in one JVM. " + speedNote + ".",
          "Each T ran at its own time and load, so the level moves between T (a peak can be the load, not the kernel):"
              + " compare lines within one T; the ratio plot does."), tp);
      System.out.println("wrote " + tp);
      Path rp = out.resolve("ratio-vs-t" + suffix + ".png");
      writePng(withCaption(BitmapEncoder.getBufferedImage(ratioChart(speed)),
          "Each point: libtorch's median time / ours, both from one run (alternating rounds, one JVM).",
          speedNote + "."), rp);
      System.out.println("wrote " + rp);
    }
    if (memory.isEmpty()) {
      System.out.println("no memory plot: " + data.resolve("memory-sweep.jsonl") + " is absent or empty");
      return;
    }
    Path cappedFile = data.resolve("memory-capped-heap.jsonl"); // optional: java under a capped heap
    List<Map<String, String>> capped = Files.isRegularFile(cappedFile) ? read(cappedFile) : List.of();
    Path mp = out.resolve("memory-vs-t.png");
    writePng(withCaption(BitmapEncoder.getBufferedImage(memoryChart(memory, capped)),
        "Each implementation alone in a fresh JVM, one call: peak resident set (VmHWM) minus the resident set with the"
            + " inputs built. " + note(memory, cpu) + ".",
        "The Java kernel is shown only with a capped heap: uncapped, the JVM grows its heap far beyond what the call"
            + " needs."), mp);
    System.out.println("wrote " + mp);
  }

  /**
   * Writes a PNG whole: into a hidden sibling, then renamed over TARGET, so an interrupted run leaves the
   * old plot or the new one, never a cut one. A TARGET that is not a PNG (a link, a folder, a user's file
   * of another kind under the same name) is refused, exit 2: it was replaced in silence.
   */
  static void writePng(java.awt.image.BufferedImage image, Path target) throws IOException {
    refuseNonPng(target);
    Path tmp = target.resolveSibling("." + target.getFileName() + "-tmp-" + java.util.UUID.randomUUID());
    try {
      if (!ImageIO.write(image, "png", tmp.toFile())) {
        throw new IOException("no PNG writer in this JVM");
      }
      Files.move(tmp, target, java.nio.file.StandardCopyOption.REPLACE_EXISTING,
          java.nio.file.StandardCopyOption.ATOMIC_MOVE);
    } finally {
      Files.deleteIfExists(tmp);
    }
  }

  /** Exit 2 where TARGET exists and is not a PNG. */
  private static void refuseNonPng(Path target) throws IOException {
    if (Files.exists(target, java.nio.file.LinkOption.NOFOLLOW_LINKS) && !isPng(target)) {
      System.err.println("plots: " + target + " exists and is not a PNG: refusing to replace it (move it, or give"
          + " another --out)");
      System.exit(2);
    }
  }

  /** A regular file (not a link) that starts with PNG's signature. */
  private static boolean isPng(Path p) throws IOException {
    if (!Files.isRegularFile(p, java.nio.file.LinkOption.NOFOLLOW_LINKS)) {
      return false;
    }
    byte[] sig = {(byte) 0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    try (java.io.InputStream in = Files.newInputStream(p)) {
      return java.util.Arrays.equals(in.readNBytes(sig.length), sig);
    }
  }

  // ---------------------------------------------------------------- charts

  /** "CPU ..., load1 a-b": what every plot says about where its data came from. */
  static String note(List<Map<String, String>> rows, String cpu) {
    // The lines' own cpu field where they have one; --cpu labels older data that lacks it.
    String c = rows.stream().map(r -> r.get("cpu")).filter(x -> x != null).distinct()
        .reduce((a, b) -> a + " / " + b).orElse(cpu != null ? cpu : "CPU not recorded");
    double[] load = rows.stream().filter(r -> r.containsKey("load1"))
        .mapToDouble(r -> Double.parseDouble(r.get("load1"))).sorted().toArray();
    return load.length == 0 ? c
        : String.format(java.util.Locale.ROOT, "%s, load1 %.1f-%.1f", c, load[0], load[load.length - 1]);
  }

  static XYChart throughput(List<Map<String, String>> rows, boolean causal) {
    XYChart c = new XYChartBuilder().width(680).height(500)
        .title("Forward, H = Hkv = 8, D = 128, fp32: " + (causal ? "causal" : "non-causal"))
        .xAxisTitle("sequence length T")
        .yAxisTitle("GFLOP/s (4·H·T²·D" + (causal ? " / 2" : "") + ")")
        .build();
    style(c);
    log2X(c);
    c.getStyler().setYAxisMin(0.0);
    for (int i = 0; i < IMPLS.length; i++) {
      Map<Integer, Double> pts = median(rows, IMPLS[i], causal, "gflops");
      if (pts.isEmpty()) {
        continue;
      }
      XYSeries s = c.addSeries(LABELS[i], xs(pts), ys(pts));
      s.setLineColor(COLORS[i]);
      s.setMarkerColor(COLORS[i]);
      s.setMarker(SeriesMarkers.CIRCLE);
      s.setLineStyle(i == 2 ? SeriesLines.DASH_DASH : SeriesLines.SOLID);
    }
    return c;
  }

  /** Same-run speed over the anchor (vs_anchor), the figure that survives this machine's drift. */
  static XYChart ratioChart(List<Map<String, String>> rows) {
    XYChart c = new XYChartBuilder().width(900).height(520)
        .title("Speed relative to libtorch's fused attention in the same run (H = Hkv = 8, D = 128, fp32)")
        .xAxisTitle("sequence length T")
        .yAxisTitle("libtorch time / our time (higher is better)").build();
    style(c);
    log2X(c);
    c.getStyler().setYAxisMin(0.0);
    c.getStyler().setLegendPosition(Styler.LegendPosition.OutsideE);
    c.getStyler().setLegendLayout(Styler.LegendLayout.Vertical);
    TreeMap<Integer, Double> one = new TreeMap<>();
    for (int i = 0; i < IMPLS.length; i++) {
      if (IMPLS[i].equals("libtorch-sdpa")) {
        continue;
      }
      for (boolean causal : new boolean[] {false, true}) {
        Map<Integer, Double> pts = median(rows, IMPLS[i], causal, "vs_anchor");
        if (pts.isEmpty()) {
          continue;
        }
        pts.keySet().forEach(t -> one.put(t, 1.0));
        XYSeries s = c.addSeries(IMPLS[i] + (causal ? ", causal" : ", non-causal"), xs(pts), ys(pts));
        s.setLineColor(COLORS[i]);
        s.setMarkerColor(COLORS[i]);
        s.setMarker(causal ? SeriesMarkers.DIAMOND : SeriesMarkers.CIRCLE);
        s.setLineStyle(causal ? SeriesLines.DASH_DASH : SeriesLines.SOLID);
      }
    }
    if (!one.isEmpty()) {
      XYSeries s = c.addSeries("libtorch-sdpa = 1", xs(one), ys(one));
      s.setLineColor(COLORS[2]);
      s.setMarker(SeriesMarkers.NONE);
      s.setLineStyle(SeriesLines.DOT_DOT);
    }
    return c;
  }

  static XYChart memoryChart(List<Map<String, String>> rows, List<Map<String, String>> capped) {
    XYChart c = new XYChartBuilder().width(1200).height(560)
        .title("Memory of one forward call beyond its inputs, H = 8, D = 128, fp32, non-causal unless marked")
        .xAxisTitle("sequence length T")
        .yAxisTitle("MiB (log scale)").build();
    style(c);
    log2X(c);
    c.getStyler().setYAxisLogarithmic(true);
    c.getStyler().setYAxisLogarithmicDecadeOnly(false); // labels between the decades too
    c.getStyler().setYAxisDecimalPattern("#,##0");
    c.getStyler().setLegendPosition(Styler.LegendPosition.OutsideE);
    c.getStyler().setLegendLayout(Styler.LegendLayout.Vertical);
    TreeMap<Integer, Double> all = new TreeMap<>();
    for (int i = 0; i < IMPLS.length; i++) {
      Map<Integer, Double> pts = median(rows, IMPLS[i], false, "peak_extra_mb");
      pts.replaceAll((t, mb) -> Math.max(mb, 1.0)); // a log axis: 1 MiB floor (noise of the RSS reading)
      all.putAll(pts);
      // uncapped, java's figure is how far the JVM let its heap grow, not what the call needs: the
      // capped-heap points below say that
      if (pts.isEmpty() || IMPLS[i].equals("java")) {
        continue;
      }
      XYSeries s = c.addSeries(LABELS[i], xs(pts), ys(pts));
      s.setLineColor(COLORS[i]);
      s.setMarkerColor(COLORS[i]);
      s.setMarker(SeriesMarkers.CIRCLE);
    }
    // java with a capped heap: what the call needs. One series per implementation, mask and cap (a
    // series per line clashed where one cap was run at several T), the median where a T ran twice.
    Map<String, List<Map<String, String>>> byCap = new LinkedHashMap<>();
    for (Map<String, String> r : capped) {
      if (r.containsKey("impl")) {
        // bench writes xmx where the heap was capped; a line without it (an older one) says so, never "null"
        String cap = r.containsKey("xmx") ? "heap capped at -Xmx" + r.get("xmx") : "heap capped (cap not recorded)";
        byCap.computeIfAbsent(r.get("impl") + (Boolean.parseBoolean(r.get("causal")) ? ", causal," : "") + " " + cap
            + " (what the call needs)", k -> new ArrayList<>()).add(r);
      }
    }
    byCap.forEach((label, rs) -> {
      Map<Integer, Double> p = median(rs, rs.get(0).get("impl"), Boolean.parseBoolean(rs.get(0).get("causal")),
          "peak_extra_mb");
      p.replaceAll((t, mb) -> Math.max(mb, 1.0)); // the same 1 MiB floor as above
      if (!p.isEmpty()) {
        XYSeries s = c.addSeries(label, xs(p), ys(p));
        s.setLineColor(COLORS[0]);
        s.setMarkerColor(COLORS[0]);
        s.setMarker(SeriesMarkers.DIAMOND);
      }
    });
    if (!all.isEmpty()) {
      // Analytic lines over the measured range (and one step beyond, where the naive path was skipped).
      TreeMap<Integer, Double> naive = new TreeMap<>(), inputs = new TreeMap<>();
      for (int t : all.keySet()) {
        naive.put(t, (double) t * t * 8 * 4 / (1 << 20));
        inputs.put(t, 3.0 * 8 * t * 128 * 4 / (1 << 20));
      }
      XYSeries n = c.addSeries("naive: one T×T score matrix per head, T²·H·4 B", xs(naive), ys(naive));
      n.setLineColor(Color.BLACK);
      n.setMarker(SeriesMarkers.NONE);
      n.setLineStyle(SeriesLines.DASH_DASH);
      XYSeries in = c.addSeries("inputs q, k, v: 3·H·T·D·4 B  (O(T·D))", xs(inputs), ys(inputs));
      in.setLineColor(new Color(0x9467bd));
      in.setMarker(SeriesMarkers.NONE);
      in.setLineStyle(SeriesLines.DOT_DOT);
    }
    return c;
  }

  static void style(XYChart c) {
    XYStyler s = c.getStyler();
    s.setLegendPosition(Styler.LegendPosition.OutsideS);
    s.setLegendLayout(Styler.LegendLayout.Horizontal);
    s.setChartBackgroundColor(Color.WHITE);
    s.setPlotBackgroundColor(Color.WHITE);
    s.setPlotGridLinesColor(new Color(0xdddddd));
    s.setLegendBorderColor(new Color(0xcccccc));
    s.setMarkerSize(7);
    s.setDefaultSeriesRenderStyle(XYSeries.XYSeriesRenderStyle.Line);
    s.setAxisTickLabelsColor(Color.DARK_GRAY);
  }

  /** The image with lines of text below it: how the figures were measured, on the plot itself. */
  static BufferedImage withCaption(BufferedImage chart, String... lines) {
    int lineHeight = 20, pad = 8;
    BufferedImage img = new BufferedImage(chart.getWidth(), chart.getHeight() + pad * 2 + lineHeight * lines.length,
        BufferedImage.TYPE_INT_RGB);
    Graphics2D g = img.createGraphics();
    g.setColor(Color.WHITE);
    g.fillRect(0, 0, img.getWidth(), img.getHeight());
    g.drawImage(chart, 0, 0, null);
    g.setRenderingHint(java.awt.RenderingHints.KEY_TEXT_ANTIALIASING, java.awt.RenderingHints.VALUE_TEXT_ANTIALIAS_ON);
    g.setColor(Color.DARK_GRAY);
    g.setFont(new java.awt.Font(java.awt.Font.SANS_SERIF, java.awt.Font.PLAIN, 13));
    for (int i = 0; i < lines.length; i++) {
      g.drawString(lines[i], 12, chart.getHeight() + pad + lineHeight * (i + 1) - 5);
    }
    g.dispose();
    return img;
  }

  static BufferedImage sideBySide(XYChart a, XYChart b) {
    BufferedImage ia = BitmapEncoder.getBufferedImage(a), ib = BitmapEncoder.getBufferedImage(b);
    BufferedImage img = new BufferedImage(ia.getWidth() + ib.getWidth(), Math.max(ia.getHeight(), ib.getHeight()),
        BufferedImage.TYPE_INT_RGB);
    Graphics2D g = img.createGraphics();
    g.setColor(Color.WHITE);
    g.fillRect(0, 0, img.getWidth(), img.getHeight());
    g.drawImage(ia, 0, 0, null);
    g.drawImage(ib, ia.getWidth(), 0, null);
    g.setColor(new Color(0xcccccc));
    g.setStroke(new BasicStroke(1));
    g.drawLine(ia.getWidth(), 0, ia.getWidth(), img.getHeight());
    g.dispose();
    return img;
  }

  // ---------------------------------------------------------------- data

  /** Median of FIELD per T over the lines of IMPL (forward op, the given causal flag, no error). */
  static Map<Integer, Double> median(List<Map<String, String>> rows, String impl, boolean causal, String field) {
    TreeMap<Integer, List<Double>> by = new TreeMap<>();
    for (Map<String, String> r : rows) {
      if (impl.equals(r.get("impl")) && "forward".equals(r.get("op")) && String.valueOf(causal).equals(r.get("causal"))
          && r.containsKey(field) && !r.containsKey("error")) {
        by.computeIfAbsent(Integer.parseInt(r.get("t")), k -> new ArrayList<>()).add(Double.parseDouble(r.get(field)));
      }
    }
    TreeMap<Integer, Double> m = new TreeMap<>();
    by.forEach((t, v) -> {
      v.sort(null);
      m.put(t, v.size() % 2 == 1 ? v.get(v.size() / 2) : (v.get(v.size() / 2 - 1) + v.get(v.size() / 2)) / 2);
    });
    return m;
  }

  /** x values are log2(T), labelled as T: one tick per doubling. */
  static double[] xs(Map<Integer, Double> m) {
    return m.keySet().stream().mapToDouble(t -> Math.log(t) / Math.log(2)).toArray();
  }

  static void log2X(XYChart c) {
    c.setCustomXAxisTickLabelsFormatter(x -> Math.abs(x - Math.rint(x)) < 1e-6 ? String.valueOf(1L << (long) Math.rint(x)) : "");
    c.getStyler().setXAxisDecimalPattern("0");
  }

  static double[] ys(Map<Integer, Double> m) {
    return m.values().stream().mapToDouble(Double::doubleValue).toArray();
  }

  private static final Pattern FIELD = Pattern.compile("\"([^\"]+)\"\\s*:\\s*(\"((?:[^\"\\\\]|\\\\.)*)\"|[^,}\\s]+)");

  /** The fields the plots read as numbers. */
  private static final List<String> NUMBERS = List.of("t", "load1", "gflops", "vs_anchor", "peak_extra_mb");

  /** The flat JSON objects of a JSON Lines file (string and number values), or none if it is absent. */
  static List<Map<String, String>> read(Path p) {
    List<Map<String, String>> rows = new ArrayList<>();
    if (!Files.isRegularFile(p)) {
      System.err.println("BenchPlots: no " + p + " (run examples/bench-sweep.sh)");
      return rows;
    }
    try {
      int n = 0;
      for (String line : Files.readAllLines(p)) {
        n++;
        if (!line.startsWith("{")) {
          continue;
        }
        Map<String, String> r = new LinkedHashMap<>();
        Matcher m = FIELD.matcher(line);
        while (m.find()) {
          r.put(m.group(1), m.group(3) != null ? m.group(3) : m.group(2));
        }
        for (String f : NUMBERS) { // read as numbers when drawn: a bad one is named here, not by a stack trace
          String v = r.get(f);
          try {
            if (v != null && f.equals("t")) {
              Integer.parseInt(v);
            } else if (v != null) {
              Double.parseDouble(v);
            }
          } catch (NumberFormatException e) {
            System.err.println("plots: " + p + ", line " + n + ": field " + f + " is '" + v + "', expected "
                + (f.equals("t") ? "an integer" : "a number"));
            System.exit(2);
          }
        }
        rows.add(r);
      }
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
    return rows;
  }
}
