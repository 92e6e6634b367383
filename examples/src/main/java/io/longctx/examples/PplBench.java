package io.longctx.examples;

import ai.djl.ndarray.NDManager;
import io.longctx.djl.AttentionOp;
import io.longctx.djl.LlamaConfig;
import io.longctx.djl.LlamaModel;
import io.longctx.djl.ModelGenerator;
import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.UncheckedIOException;
import java.lang.management.ManagementFactory;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.time.Instant;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Locale;
import java.util.SplittableRandom;
import java.util.concurrent.TimeUnit;

/**
 * {@code bin/longctx bench-ppl}: document scoring with {@link LlamaModel#score} (chunked, KV cache as
 * a chunk list, vocabulary-sharded LSE: path {@code ours}) against the same checkpoint run densely
 * in one libtorch forward through DJL ({@link DenseLlama}: full causal T x T scores, full T x V
 * logits: path {@code dense}), at several document lengths T. One JSON object per line on stdout,
 * progress on stderr.
 *
 * <p>Every (path, T) runs alone in a fresh JVM (same java, flags and class path), so that peak
 * memories do not mix: the child loads the model, warms up on a short document, reads {@code VmRSS}
 * from /proc/self/status, scores the T-token document {@code iters} times (median wall time), and
 * reports {@code VmHWM} (peak resident set of the process: JVM heap and libtorch's native memory
 * alike) and {@code peak_extra_mb = VmHWM - VmRSS(before)}, the memory the scoring itself needed
 * beyond the loaded weights. The dense path is not started when its estimate ({@link
 * DenseLlama#estimateBytes}) exceeds the memory available: it is reported as {@code did_not_fit}
 * with the estimate. Both paths score the same seeded random token ids with the same weights; where
 * both run, their sum_logprob must agree within 1e-4 relative. With {@code --rounds R} each T's two
 * paths run R times in turns (the order reversed every other round) and the ratio is the median of
 * the rounds' own ratios, so that the machine's drift over minutes falls on both.
 */
public final class PplBench {

  private PplBench() {}

  static final String USAGE = String.join("\n",
      "usage: longctx bench-ppl [--t 2048,8192,32768] [--layers 4] [--hidden 512] [--heads 8] [--kv-heads 2]",
      "                         [--vocab 32000] [--dtype bf16] [--model DIR] [--chunk-len 512] [--iters N]",
      "                         [--paths ours,dense] [--rounds R] [--child-timeout S] [--seed S]",
      "  Tokens/s and peak memory of LlamaModel.score (ours) against the same model run densely in one",
      "  libtorch forward through DJL (dense), each (path, T) alone in a fresh JVM. --model uses an",
      "  existing checkpoint instead of generating one (ModelGenerator) into a temp directory.",
      "  --iters: timed runs per (path, T), median reported (default 3 up to T=4096, else 1).",
      "  --rounds: each T's two paths R times, in turns (ours first in odd rounds, dense first in even ones);",
      "  ratio_vs_dense is the median of the rounds' dense / ours (default 1: one child each).");

  /** Options; public fields so that a test can run a toy size. */
  static final class Options {
    int[] ts = {2048, 8192, 32768};
    ModelGenerator.Spec spec = defaultSpec();
    Path model;
    int chunkLen = LlamaModel.DEFAULT_CHUNK_LEN;
    int iters = -1;
    int rounds = 1;
    List<String> paths = List.of("ours", "dense");
    long childTimeoutS = 600;
    long seed = 20261123L;
    // child mode
    String child;
    int t;

    int itersFor(int t) {
      return iters > 0 ? iters : t <= 4096 ? 3 : 1;
    }
  }

  static ModelGenerator.Spec defaultSpec() {
    ModelGenerator.Spec s = new ModelGenerator.Spec();
    s.layers = 4;
    s.hidden = 512;
    s.heads = 8;
    s.kvHeads = 2;
    s.vocab = 32000;
    s.dtype = "BF16";
    s.seed = 7;
    return s;
  }

  /** Each option that takes a value, and how it sets it: the one list of them. */
  private static final java.util.Map<String, java.util.function.BiConsumer<Options, String>> VALUE_OPTIONS =
      java.util.Map.ofEntries(
      java.util.Map.entry("--t", (o, v) -> o.ts = Arrays.stream(v.split(",")).mapToInt(Integer::parseInt).toArray()),
      java.util.Map.entry("--layers", (o, v) -> o.spec.layers = Integer.parseInt(v)),
      java.util.Map.entry("--hidden", (o, v) -> o.spec.hidden = Integer.parseInt(v)),
      java.util.Map.entry("--heads", (o, v) -> o.spec.heads = Integer.parseInt(v)),
      java.util.Map.entry("--kv-heads", (o, v) -> o.spec.kvHeads = Integer.parseInt(v)),
      java.util.Map.entry("--vocab", (o, v) -> o.spec.vocab = Integer.parseInt(v)),
      java.util.Map.entry("--dtype", (o, v) -> o.spec.dtype = v.toUpperCase(Locale.ROOT)),
      java.util.Map.entry("--model", (o, v) -> o.model = Path.of(v)),
      java.util.Map.entry("--chunk-len", (o, v) -> o.chunkLen = Integer.parseInt(v)),
      java.util.Map.entry("--iters", (o, v) -> o.iters = Integer.parseInt(v)),
      java.util.Map.entry("--rounds", (o, v) -> o.rounds = Integer.parseInt(v)),
      java.util.Map.entry("--paths", (o, v) -> o.paths = List.of(v.split(","))),
      java.util.Map.entry("--child-timeout", (o, v) -> o.childTimeoutS = Long.parseLong(v)),
      java.util.Map.entry("--seed", (o, v) -> o.seed = Long.parseLong(v)),
      java.util.Map.entry("--child", (o, v) -> o.child = v),
      java.util.Map.entry("--child-t", (o, v) -> o.t = Integer.parseInt(v)));

  static Options parse(String[] args) {
    Options o = new Options();
    for (int i = 0; i < args.length; i++) {
      String a = args[i];
      if (a.equals("--help") || a.equals("-h")) {
        return null;
      }
      java.util.function.BiConsumer<Options, String> set = VALUE_OPTIONS.get(a);
      if (set == null) {
        throw new IllegalArgumentException("unknown option " + a + "\n" + USAGE);
      }
      if (i + 1 >= args.length) {
        throw new IllegalArgumentException(a + " needs a value");
      }
      String v = args[++i];
      if (v.startsWith("--")) { // the next option is not a value
        throw new IllegalArgumentException(a + " needs a value, got the option " + v);
      }
      try {
        set.accept(o, v);
      } catch (NumberFormatException e) {
        throw new IllegalArgumentException(a + " needs a number, got '" + v + "'");
      }
    }
    if (o.rounds < 1) {
      throw new IllegalArgumentException("--rounds must be >= 1, got " + o.rounds);
    }
    for (String p : o.paths) {
      if (!p.equals("ours") && !p.equals("dense")) {
        throw new IllegalArgumentException("--paths takes ours and/or dense, got " + p);
      }
    }
    if (new java.util.HashSet<>(o.paths).size() < o.paths.size()) { // one path timed twice, in silence
      throw new IllegalArgumentException("--paths names a path twice: " + String.join(",", o.paths));
    }
    // Refused here, not by each child in turn (the run then ended with exit 0 and error lines).
    if (Arrays.asList(args).contains("--iters") && o.iters < 1) { // 0 fell back to the default in silence
      throw new IllegalArgumentException("--iters must be >= 1, got " + o.iters);
    }
    if (Arrays.stream(o.ts).anyMatch(t -> t < 1) || o.chunkLen < 1 || o.childTimeoutS < 1) {
      throw new IllegalArgumentException("--t values, --chunk-len and --child-timeout must be >= 1, got --t "
          + Arrays.toString(o.ts) + ", --chunk-len " + o.chunkLen + ", --child-timeout " + o.childTimeoutS);
    }
    if (o.model != null) { // the checkpoint's own sizes are measured: these would be ignored in silence
      for (String a : List.of("--layers", "--hidden", "--heads", "--kv-heads", "--vocab", "--dtype")) {
        if (Arrays.asList(args).contains(a)) {
          throw new IllegalArgumentException(a + " shapes the generated model: with --model the checkpoint's own is "
              + "measured; leave out one or the other");
        }
      }
    }
    return o;
  }

  public static void main(String[] args) throws Exception {
    Options o;
    try {
      o = parse(args);
      AttentionOp.checkSettings();
    } catch (IllegalArgumentException e) { // a bad option, number or -D setting: exit 2 naming it, not a stack trace
      System.err.println("bench-ppl: " + e.getMessage());
      System.exit(2);
      return;
    }
    if (o == null) {
      System.out.println(USAGE);
      return;
    }
    if (o.child != null) {
      System.out.println(child(o));
      return;
    }
    try {
      int failed = run(o, args);
      if (failed > 0) { // the error lines are printed; the status says the measurement is incomplete
        System.err.println("bench-ppl: " + failed + " run(s) failed (the \"error\" lines above)");
        System.exit(1);
      }
    } catch (IllegalArgumentException e) { // the generator's or the checkpoint's: exit 2 naming it, not a stack trace
      System.err.println("bench-ppl: " + e.getMessage());
      System.exit(2);
    }
  }

  /** The parent: generates the model if needed, then one child JVM per (T, path), and the comparisons. */
  /** Returns how many children failed (each printed as an "error" line). */
  static int run(Options o, String[] args) throws IOException {
    long t0 = System.nanoTime();
    int failed = 0;
    Path model = o.model;
    // The generated model is deleted at the end, also when the run is interrupted; an interrupt also
    // ends the child JVM running then (it ran on, under init), with --model too, which makes no folder.
    io.longctx.djl.MadeFolders.Temporary tmp = new io.longctx.djl.MadeFolders.Temporary(
        model == null ? Files.createTempDirectory("longctx-bench-ppl-") : null, true);
    try (tmp) {
      if (model == null) {
        model = tmp.dir().resolve("model");
        System.err.printf("bench-ppl: generating the model (%d layers, hidden %d, heads %d/%d, vocab %d, %s) in %s%n",
            o.spec.layers, o.spec.hidden, o.spec.heads, o.spec.kvHeads, o.spec.vocab, o.spec.dtype, model);
        ModelGenerator.generate(o.spec, model);
      }
      LlamaConfig cfg = LlamaConfig.read(model);
      System.out.println(envLine(cfg, o, model, o.model == null));
      for (int t : o.ts) {
        List<String> ours = new ArrayList<>(), dense = new ArrayList<>();
        boolean denseFits = true;
        // Rounds in turns, so that the machine's drift over minutes falls on both paths alike.
        for (int round = 1; round <= o.rounds; round++) {
          List<String> order = new ArrayList<>(o.paths);
          if (round % 2 == 0) {
            java.util.Collections.reverse(order);
          }
          for (String path : order) {
            long est = path.equals("dense") ? DenseLlama.estimateBytes(cfg, t) : oursEstimateBytes(cfg, t, o.chunkLen);
            long avail = memAvailableKb() * 1024;
            if (path.equals("dense") && (!denseFits || avail > 0 && est > avail - (1L << 30))) {
              if (denseFits) {
                denseFits = false;
                System.out.println(String.format(Locale.ROOT, "{\"bench\": \"ppl\", \"path\": \"dense\", \"t\": %d, "
                    + "\"did_not_fit\": true, "
                    + "\"estimate_extra_mb\": %.0f, \"mem_available_mb\": %.0f, \"note\": \"not started: estimate above "
                    + "available memory less 1 GiB\"}", t, est / 1048576.0, avail / 1048576.0));
                System.err.printf("bench-ppl: dense T=%d does not fit (estimate %.1f GiB, available %.1f GiB)%n", t,
                    est / 1073741824.0, avail / 1073741824.0);
              }
              continue;
            }
            System.err.printf("bench-ppl: %s T=%d%s (estimate %.0f MiB beyond the weights; %d timed run(s))...%n",
                path, t, o.rounds > 1 ? ", round " + round + " of " + o.rounds : "", est / 1048576.0, o.itersFor(t));
            String line = runChild(o, model, path, t, est);
            failed += line.contains("\"error\":") ? 1 : 0;
            if (o.rounds > 1) {
              line = line.substring(0, line.length() - 1) + ", \"round\": " + round + "}";
            }
            System.err.println("bench-ppl:   " + line);
            System.out.println(line);
            (path.equals("ours") ? ours : dense).add(line);
          }
        }
        if (!ours.isEmpty() && !dense.isEmpty()) {
          System.out.println(compare(t, ours, dense));
        }
      }
      System.out.printf(Locale.ROOT, "{\"bench\": \"ppl\", \"end\": true, \"loadavg_end\": \"%s\", \"wall_s\": %.1f}%n",
          loadavg(), (System.nanoTime() - t0) / 1e9);
    }
    return failed;
  }

  /** Ours beyond the weights: the KV cache (float32, every layer) plus a chunk's activations and logits shard. */
  static long oursEstimateBytes(LlamaConfig c, long t, int chunkLen) {
    long cache = 2L * t * c.layers * c.kvHeads * c.headDim * 4;
    long chunk = (long) chunkLen * (3L * c.intermediateSize + 8L * c.hiddenSize
        + 3L * Math.min(LlamaModel.DEFAULT_VOCAB_SHARD, c.vocabSize)) * 4;
    return cache + chunk;
  }

  static String compare(int t, String ours, String dense) {
    return compare(t, List.of(ours), List.of(dense));
  }

  /**
   * The two paths at one T: ratio_vs_dense is the median over rounds of that round's dense ms / ours
   * ms (rounds paired in order; a round where either child failed is left out); memory and the
   * agreement of sum_logprob from the first round.
   */
  static String compare(int t, List<String> ours, List<String> dense) {
    List<Double> ratios = new ArrayList<>();
    for (int i = 0; i < Math.min(ours.size(), dense.size()); i++) {
      double r = number(dense.get(i), "ms") / number(ours.get(i), "ms");
      if (!Double.isNaN(r)) {
        ratios.add(r);
      }
    }
    if (ratios.isEmpty()) {
      return String.format(Locale.ROOT, "{\"bench\": \"ppl\", \"compare\": true, \"t\": %d, "
          + "\"note\": \"one path has no time\"}", t);
    }
    double[] sorted = ratios.stream().mapToDouble(Double::doubleValue).sorted().toArray();
    double median = sorted.length % 2 == 1 ? sorted[sorted.length / 2]
        : (sorted[sorted.length / 2 - 1] + sorted[sorted.length / 2]) / 2;
    double os = number(ours.get(0), "sum_logprob"), ds = number(dense.get(0), "sum_logprob");
    double rel = Math.abs(os - ds) / Math.max(1e-30, Math.abs(ds));
    String perRound = ratios.size() > 1 ? ", \"rounds\": " + ratios.size() + ", \"ratios\": " + ratios.stream()
        .map(r -> String.format(Locale.ROOT, "%.3f", r)).collect(java.util.stream.Collectors.joining(", ", "[", "]")) : "";
    return String.format(Locale.ROOT, "{\"bench\": \"ppl\", \"compare\": true, \"t\": %d, \"ratio_vs_dense\": %.3f%s, "
        + "\"peak_extra_ratio\": %.4f, \"sum_logprob_rel_diff\": %.2e, \"agree_1e-4\": %b}", t, median, perRound,
        number(ours.get(0), "peak_extra_mb") / number(dense.get(0), "peak_extra_mb"), rel, rel <= 1e-4);
  }

  /** A number field of a flat JSON line, or NaN. */
  static double number(String json, String key) {
    int i = json.indexOf("\"" + key + "\": ");
    if (i < 0) {
      return Double.NaN;
    }
    int s = i + key.length() + 4, e = s;
    while (e < json.length() && ",}".indexOf(json.charAt(e)) < 0) {
      e++;
    }
    try {
      return Double.parseDouble(json.substring(s, e).trim());
    } catch (NumberFormatException x) {
      return Double.NaN;
    }
  }

  private static String runChild(Options o, Path model, String path, int t, long est) {
    List<String> cmd = new ArrayList<>();
    cmd.add(ProcessHandle.current().info().command().orElse("java"));
    cmd.addAll(ManagementFactory.getRuntimeMXBean().getInputArguments());
    cmd.addAll(List.of("-cp", System.getProperty("java.class.path"), PplBench.class.getName(), "--child", path,
        "--child-t", Integer.toString(t), "--model", model.toString(), "--chunk-len", Integer.toString(o.chunkLen),
        "--iters", Integer.toString(o.itersFor(t)), "--seed", Long.toString(o.seed)));
    try {
      Process p = new ProcessBuilder(cmd).redirectErrorStream(true).start();
      List<String> lines = java.util.Collections.synchronizedList(new ArrayList<>());
      Thread reader = new Thread(() -> {
        try (BufferedReader r = new BufferedReader(new InputStreamReader(p.getInputStream(), StandardCharsets.UTF_8))) {
          for (String line; (line = r.readLine()) != null; ) {
            lines.add(line);
          }
        } catch (IOException ignored) {
          // the child died: its exit status says so
        }
      });
      reader.start();
      boolean done = p.waitFor(o.childTimeoutS, TimeUnit.SECONDS);
      if (!done) {
        p.destroyForcibly().waitFor();
      }
      reader.join(5000);
      List<String> json;
      synchronized (lines) {
        json = lines.stream().filter(l -> l.startsWith("{\"bench\": \"ppl\"")).toList();
      }
      if (done && p.exitValue() == 0 && !json.isEmpty()) {
        return json.get(json.size() - 1);
      }
      String said;
      synchronized (lines) {
        said = ChildOutput.why(lines, 300);
      }
      String why = !done ? "timed out after " + o.childTimeoutS + " s" : "exit " + p.exitValue() + ": " + said;
      return String.format(Locale.ROOT, "{\"bench\": \"ppl\", \"path\": \"%s\", \"t\": %d, \"error\": \"%s\", "
          + "\"estimate_extra_mb\": %.0f}", path, t, why, est / 1048576.0);
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new IllegalStateException(e);
    }
  }

  /** Seeded token ids in [3, vocab): no special tokens. */
  static int[] tokens(long seed, int n, int vocab) {
    SplittableRandom r = new SplittableRandom(seed);
    int[] t = new int[n];
    for (int i = 0; i < n; i++) {
      t[i] = 3 + r.nextInt(vocab - 3);
    }
    return t;
  }

  /** A child: one path at one T; returns its JSON line. */
  static String child(Options o) throws IOException {
    LlamaConfig cfg = LlamaConfig.read(o.model);
    int[] doc = tokens(o.seed, o.t, cfg.vocabSize);
    int[] warm = tokens(o.seed + 1, Math.min(o.t, 256), cfg.vocabSize);
    boolean ours = o.child.equals("ours");
    try (NDManager nm = NDManager.newBaseManager("PyTorch")) {
      java.util.function.ToDoubleFunction<int[]> score;
      AutoCloseable model;
      if (ours) {
        LlamaModel m = LlamaModel.load(o.model, nm);
        score = d -> m.score(d, o.chunkLen, false).sumLogprob();
        model = m;
      } else {
        DenseLlama m = DenseLlama.load(o.model, nm);
        score = m::sumLogprob;
        model = m;
      }
      score.applyAsDouble(warm);
      System.gc();
      long before = KernelBench.rssKb("VmRSS");
      double[] ms = new double[o.itersFor(o.t)];
      double sum = 0;
      for (int i = 0; i < ms.length; i++) {
        long s = System.nanoTime();
        sum = score.applyAsDouble(doc);
        ms[i] = (System.nanoTime() - s) / 1e6;
      }
      long hwm = KernelBench.rssKb("VmHWM");
      Arrays.sort(ms);
      double med = ms[ms.length / 2];
      try {
        model.close();
      } catch (Exception e) {
        throw new IllegalStateException(e);
      }
      return String.format(Locale.ROOT, "{\"bench\": \"ppl\", \"path\": \"%s\", \"t\": %d, \"ms\": %.1f, "
          + "\"tokens_per_s\": %.1f, \"iters\": %d, \"sum_logprob\": %.10e, \"rss_before_mb\": %.1f, "
          + "\"peak_rss_mb\": %.1f, \"peak_extra_mb\": %.1f, \"estimate_extra_mb\": %.0f%s}", o.child, o.t, med,
          o.t / (med / 1e3), ms.length, sum, before / 1024.0, hwm / 1024.0, (hwm - before) / 1024.0,
          (ours ? oursEstimateBytes(cfg, o.t, o.chunkLen) : DenseLlama.estimateBytes(cfg, o.t)) / 1048576.0,
          ours ? ", \"chunk_len\": " + o.chunkLen : "");
    }
  }

  static String envLine(LlamaConfig c, Options o, Path model, boolean generated) {
    String cpu = cpuInfo("model name");
    String flags = cpuInfo("flags");
    String simd = flags.contains("avx512f") ? "AVX-512" : flags.contains("avx2") ? "AVX2" : "no AVX2";
    return String.format(Locale.ROOT, "{\"bench\": \"ppl\", \"env\": true, \"date\": \"%s\", \"cpu\": \"%s\", "
        + "\"simd\": \"%s\", \"cores\": %d, \"mem_total_mb\": %.0f, \"loadavg_start\": \"%s\", \"java\": \"%s\", "
        + "\"model\": \"%s\", \"model_generated\": %b, \"model_dtype_stored\": \"%s\", \"layers\": %d, \"hidden\": %d, "
        + "\"heads\": %d, \"kv_heads\": %d, \"head_dim\": %d, \"ffn\": %d, \"vocab\": %d, \"chunk_len\": %d, "
        + "\"vocab_shard\": %d, \"tokens\": \"seeded random ids, seed %d\", \"memory\": \"per (path, T) a fresh JVM; "
        + "peak_rss_mb = VmHWM (JVM + native), peak_extra_mb = VmHWM - VmRSS after load and warm-up\"}",
        Instant.now().toString(), cpu.replace("\"", ""), simd, Runtime.getRuntime().availableProcessors(),
        memTotalKb() / 1024.0, loadavg(), System.getProperty("java.version"), generated ? "generated (ModelGenerator)"
            : model.toString().replace("\"", ""), generated, generated ? o.spec.dtype : "?", c.layers, c.hiddenSize,
        c.heads,
        c.kvHeads, c.headDim, c.intermediateSize, c.vocabSize, o.chunkLen, LlamaModel.DEFAULT_VOCAB_SHARD, o.seed);
  }

  static String loadavg() {
    try {
      String[] f = Files.readString(Paths.get("/proc/loadavg")).trim().split("\\s+");
      return f[0] + " " + f[1] + " " + f[2];
    } catch (IOException | RuntimeException e) {
      return "unknown";
    }
  }

  private static String cpuInfo(String key) {
    try {
      for (String l : Files.readAllLines(Paths.get("/proc/cpuinfo"), StandardCharsets.US_ASCII)) {
        if (l.startsWith(key)) {
          return l.substring(l.indexOf(':') + 1).trim();
        }
      }
    } catch (IOException | RuntimeException e) {
      return "unknown";
    }
    return "unknown";
  }

  private static long memInfoKb(String key) {
    try {
      for (String l : Files.readAllLines(Paths.get("/proc/meminfo"), StandardCharsets.US_ASCII)) {
        if (l.startsWith(key + ":")) {
          return Long.parseLong(l.replaceAll("[^0-9]", ""));
        }
      }
    } catch (IOException | RuntimeException e) {
      return -1;
    }
    return -1;
  }

  static long memAvailableKb() {
    return memInfoKb("MemAvailable");
  }

  static long memTotalKb() {
    return memInfoKb("MemTotal");
  }
}
