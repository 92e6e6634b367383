package io.longctx.kernels;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Locale;
import java.util.SplittableRandom;
import jcuda.driver.CUstream;
import jcuda.driver.JCudaDriver;

/**
 * The decode section of the GPU check, run by bin/gpu-check in a JVM of its own (a sticky CUDA
 * error in the forward section, {@link GpuCheck}, cannot take it down): split-K decoding and the FlashDecoding++
 * variant against the float64 reference on fresh random inputs (KV lengths 1, 7, 4097 and
 * 1,000,003; chunked KV; CTAs of 16 to 64 rows on the tensor-core partials, rows marked "tc"; logits pushed out of the unified-max bounds, with the recompute count
 * printed beside the CPU's), then CUDA-event timing of both variants, of a device-to-device copy of
 * the same bytes, with the numbers for sdpa_baseline.py's decode anchor written to
 * {@code decode-times.tsv} beside the results file ($OUT or the working directory).
 */
final class GpuDecodeCheck {

  private GpuDecodeCheck() {}

  /** Timed launches per figure in smoke runs (emulated kernels are slow); 0 = the real 5 + 20. */
  private static int smokeRepeats;

  /** One correctness case: [B, H/Hkv, Tq, Tk, D], split length, mask, chunk lengths (null: one chunk). */
  private record Case(int b, int h, int hkv, int tq, int tk, int d, int split, AttentionOptions opt, int[] chunks) {}

  /**
   * {@code --smoke}: the decode check alone at tiny sizes (Tk up to 1,003; timing at Tk 1,024 in
   * four splits of 256), to exercise this code without a GPU (CudaDecodeFakeDeviceTest runs it on
   * the emulating fake libcuda); its timings mean nothing. Without it: the full sizes. Rows go to stdout and the
   * results file as they are made ({@link CheckReport}). Exit 0 when every row passes, 1 otherwise,
   * 2 without CUDA; {@code -Dlongctx.seed=S} replays a run. {@code --timing-only}: the timing table
   * alone (what {@code bin/gpu-check run --profile} runs under ncu).
   */
  public static void main(String[] args) {
    boolean smoke = Arrays.asList(args).contains("--smoke");
    smokeRepeats = smoke ? 1 : 0;
    boolean timingOnly = Arrays.asList(args).contains("--timing-only");
    CheckReport report = new CheckReport("decode");
    CudaProbe.Status s = CudaProbe.status();
    if (!s.available()) {
      report.line("gpu-check decode: CUDA unavailable: " + s.reason());
      System.exit(2);
    }
    long seed = Seeds.fromPropertyOrFresh(); // -Dlongctx.seed=S replays a run
    report.line("");
    report.line("## Decode on " + s.device() + ", " + CheckReport.driver() + (smoke ? " (smoke sizes)" : "") + ", seed " + seed);
    CudaAttention cuda = null;
    try {
      cuda = CudaAttention.instance();
    } catch (RuntimeException | LinkageError e) {
      report.errorRow("loading the kernels: " + CheckReport.errorText(e));
      report.stop("no CUDA backend");
    }
    if (cuda != null) {
      try {
        if (timingOnly) {
          timing(cuda, new SplittableRandom(seed), report, smoke);
        } else {
          run(cuda, new SplittableRandom(seed), report, smoke);
        }
      } catch (RuntimeException | OutOfMemoryError e) { // run isolates its cases; this is what escapes
        report.errorRow("decode" + (timingOnly ? " timing" : "") + ": " + CheckReport.errorText(e));
      }
    }
    System.exit(report.finish());
  }

  /**
   * Runs every case and the timing, each isolated: a case that throws is an ERROR row, a lost
   * context ends the section ({@link CheckReport#stop}). Rows go to {@code report} as they are made.
   */
  static void run(CudaAttention cuda, SplittableRandom rng, CheckReport report, boolean smoke) {
    AttentionOptions causal = AttentionOptions.DEFAULT.withCausal(true);
    List<Case> cases = smoke ? List.of(
        new Case(1, 32, 8, 1, 1, 128, 4096, causal, null),
        new Case(1, 32, 8, 4, 7, 128, 3, causal, null),
        new Case(1, 8, 2, 5, 300, 128, 70, causal, new int[] {100, 0, 200}),
        new Case(1, 16, 2, 3, 200, 64, 64, causal.withWindow(100), null),
        new Case(1, 2, 1, 2, 1003, 64, 256, causal.withWindow(300), null)) : List.of(
        new Case(1, 32, 8, 1, 1, 128, 4096, causal, null),
        new Case(1, 32, 8, 4, 7, 128, 3, causal, null),
        new Case(2, 8, 2, 16, 4097, 64, 512, causal, null),
        new Case(1, 8, 1, 16, 4097, 128, 1000, causal, null),
        new Case(1, 32, 4, 6, 4097, 64, 1000, causal.withWindow(1500), new int[] {2000, 2097}),
        new Case(1, 16, 2, 3, 4097, 128, 4096, causal.withSoftcap(30f), null),
        new Case(1, 4, 1, 3, 4097, 256, 1000, causal.withWindow(300), null),
        new Case(1, 4, 4, 2, 4097, 96, 4096, causal.withSoftcap(30f), null),
        new Case(1, 8, 2, 5, 4097, 128, 700, causal, new int[] {1000, 0, 2048, 1049}),
        new Case(1, 8, 2, 5, 4097, 128, 700, causal, new int[] {1, 1, 4095}),
        new Case(1, 2, 1, 2, 1_000_003, 64, 4096, causal, null),
        new Case(1, 2, 1, 2, 1_000_003, 64, 4096, causal, new int[] {333_333, 333_334, 333_336}));
    report.line("");
    report.line("### Decode (split-K), correctness against float64");
    report.line("");
    report.line("| variant | type | [B,H/Hkv,Tq,Tk,D] split | mask | chunks | errors | CPU fallback errors | recomputed (GPU / CPU) | verdict |");
    report.line("| --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    for (Case c : cases) {
      for (CudaAttention.DType type : CudaAttention.DType.values()) {
        if (c.tk() > 100_000 && type == CudaAttention.DType.F32) {
          continue; // the 1M case in 2-byte types only: the float64 reference is the slow part
        }
        try {
          checkCase(cuda, rng, c, type, report);
        } catch (RuntimeException | OutOfMemoryError e) {
          report.errorRow(String.format(Locale.ROOT, "| decode | %s | %s | %s | | | | | %s |", type, shape(c),
              GpuCheck.maskName(c.opt()), CheckReport.errorText(e)));
          if (stopIfLost(e, report)) {
            return;
          }
        }
      }
    }
    for (String part : List.of("out-of-range", "batch invariance", "timing")) {
      try {
        switch (part) {
          case "out-of-range" -> checkOutOfRange(cuda, rng, report, smoke);
          case "batch invariance" -> checkBatchInvariance(cuda, rng, report, smoke);
          default -> timing(cuda, rng, report, smoke);
        }
      } catch (RuntimeException | OutOfMemoryError e) {
        report.errorRow("decode " + part + ": " + CheckReport.errorText(e));
        if (stopIfLost(e, report)) {
          return;
        }
      }
      if (report.stopped()) {
        return;
      }
    }
  }

  /** After a case threw: ends the section when the CUDA context is lost; true if it did. */
  private static boolean stopIfLost(Throwable e, CheckReport report) {
    String lost = CheckReport.contextLost(e);
    if (lost != null) {
      report.stop(lost);
    }
    return lost != null;
  }

  private static String shape(Case c) {
    return String.format(Locale.ROOT, "[%d,%d/%d,%d,%d,%d] %d", c.b(), c.h(), c.hkv(), c.tq(), c.tk(), c.d(), c.split());
  }

  private static long[] lastPositions(int tq, int tk) {
    return GpuCheck.lastPositions(tq, tk);
  }

  /** Splits a [B, H, T, D] tensor into chunks of the given token counts (which sum to T). */
  static List<Tensor> chunk(Tensor x, int[] lens) {
    List<Tensor> out = new ArrayList<>();
    int at = 0;
    for (int len : lens) {
      float[] data = new float[x.batch() * x.heads() * len * x.dim()];
      for (int b = 0; b < x.batch(); b++) {
        for (int h = 0; h < x.heads(); h++) {
          System.arraycopy(x.data(), x.offset(b, h, at), data, ((b * x.heads() + h) * len) * x.dim(), len * x.dim());
        }
      }
      out.add(new Tensor(data, x.batch(), x.heads(), len, x.dim()));
      at += len;
    }
    return out;
  }

  private static void checkCase(CudaAttention cuda, SplittableRandom rng, Case c, CudaAttention.DType type,
      CheckReport report) {
    Tensor q = GpuCheck.rounded(Tensor.random(rng, c.b(), c.h(), c.tq(), c.d()), type);
    Tensor k = GpuCheck.rounded(Tensor.random(rng, c.b(), c.hkv(), c.tk(), c.d()), type);
    Tensor v = GpuCheck.rounded(Tensor.random(rng, c.b(), c.hkv(), c.tk(), c.d()), type);
    long[] qp = lastPositions(c.tq(), c.tk());
    List<Tensor> kc = c.chunks() == null ? List.of(k) : chunk(k, c.chunks());
    List<Tensor> vc = c.chunks() == null ? List.of(v) : chunk(v, c.chunks());
    ReferenceAttention.Result ref = ReferenceAttention.compute(q, k, v, qp, null, c.opt());
    ReferenceAttention.Result naive = ReferenceAttention.computeFloat32(q, k, v, qp, null, c.opt());
    CpuAttention.DecodeResult cpu = CpuAttention.DEFAULT.decode(q, k, v, qp, null, c.opt(), c.split());
    UnifiedMax um = UnifiedMax.calibrate(q, k, c.opt());
    CpuAttention.DecodeResult cpuUm = CpuAttention.DEFAULT.decodeUnifiedMax(q, k, v, qp, null, c.opt(), c.split(), um);
    CpuAttention.DecodeResult unchunked = null;
    // Tensor-core partials (fp16/bf16, D % 16 == 0 up to 128, any row count) are marked "tc".
    String kernels = CudaAttention.hostPlan(q, kc, vc, qp, null, c.opt(), c.split(), type).tensorCores() ? " tc" : "";
    for (UnifiedMax variant : new UnifiedMax[] {null, um}) {
      CpuAttention.DecodeResult got = cuda.decodeChunks(q, kc, vc, qp, null, c.opt(), c.split(), variant, type);
      String bad = Tolerance.violation(got.state(), ref, naive);
      if (c.chunks() != null && variant == null) {
        // The same keys in one chunk must give the same bits: splits are windows of the sequence.
        unchunked = cuda.decodeChunks(q, List.of(k), List.of(v), qp, null, c.opt(), c.split(), null, type);
        if (bad == null && (!Arrays.equals(unchunked.state().o(), got.state().o())
            || !Arrays.equals(unchunked.state().lse(), got.state().lse()))) {
          bad = "chunked result differs from the unchunked one in some bits";
        }
      }
      CpuAttention.DecodeResult cpuSame = variant == null ? cpu : cpuUm;
      report.row(String.format(Locale.ROOT, "| %s | %s | %s | %s | %s | %s | %s | %s | %s |",
          (variant == null ? "sync" : "unified phi=" + variant.phi()) + kernels, type, shape(c), GpuCheck.maskName(c.opt()),
          c.chunks() == null ? "1" : Arrays.toString(c.chunks()) + (unchunked != null ? " (bit-equal to 1 chunk)" : ""),
          Tolerance.errors(got.state().o(), got.state().lse(), ref),
          Tolerance.errors(cpuSame.state().o(), cpuSame.state().lse(), ref),
          variant == null ? "-" : got.recomputedRows() + " / " + cpuSame.recomputedRows(),
          bad == null ? "pass" : "FAIL: " + bad), bad == null);
    }
  }

  /** Logits pushed out of [phi + lower, phi + upper]: flagged pairs are recomputed, the answer holds. */
  private static void checkOutOfRange(CudaAttention cuda, SplittableRandom rng, CheckReport report, boolean smoke) {
    int heads = 8, kvHeads = 2, tq = 2, tk = smoke ? 301 : 3001, dim = 128, split = smoke ? 50 : 500;
    AttentionOptions opt = AttentionOptions.DEFAULT.withCausal(true);
    report.line("");
    report.line("| unified max, logits out of range | type | phi | recomputed GPU | recomputed CPU | errors | verdict |");
    report.line("| --- | --- | --- | --- | --- | --- | --- |");
    for (CudaAttention.DType type : CudaAttention.DType.values()) {
      Tensor q = Tensor.random(rng, 1, heads, tq, dim);
      for (int t = 0; t < tq; t++) { // head 3: logits in the hundreds, far above phi + 40
        int at = q.offset(0, 3, t);
        for (int d = 0; d < dim; d++) {
          q.data()[at + d] *= 30;
        }
      }
      q = GpuCheck.rounded(q, type);
      Tensor k = GpuCheck.rounded(Tensor.random(rng, 1, kvHeads, tk, dim), type);
      Tensor v = GpuCheck.rounded(Tensor.random(rng, 1, kvHeads, tk, dim), type);
      long[] qp = lastPositions(tq, tk);
      ReferenceAttention.Result ref = ReferenceAttention.compute(q, k, v, qp, null, opt);
      ReferenceAttention.Result naive = ReferenceAttention.computeFloat32(q, k, v, qp, null, opt);
      for (float phi : new float[] {0f, 1e4f}) {
        UnifiedMax um = UnifiedMax.of(phi);
        CpuAttention.DecodeResult got = cuda.decodeChunks(q, List.of(k), List.of(v), qp, null, opt, split, um, type);
        CpuAttention.DecodeResult cpu = CpuAttention.DEFAULT.decodeUnifiedMax(q, k, v, qp, null, opt, split, um);
        String bad = Tolerance.violation(got.state(), ref, naive);
        if (bad == null && got.recomputedRows() == 0) {
          bad = "nothing was recomputed";
        }
        report.row(String.format(Locale.ROOT, "| %d heads, head 3 scaled x30 | %s | %s | %d | %d | %s | %s |", heads, type,
            phi, got.recomputedRows(), cpu.recomputedRows(), Tolerance.errors(got.state().o(), got.state().lse(), ref),
            bad == null ? "pass" : "FAIL: " + bad), bad == null);
      }
    }
  }

  /** The first sequence of a batch of two gives the bits it gives alone. */
  private static void checkBatchInvariance(CudaAttention cuda, SplittableRandom rng, CheckReport report,
      boolean smoke) {
    int heads = 8, kvHeads = 2, tq = 3, tk = smoke ? 250 : 2500, dim = 128;
    Tensor q = GpuCheck.rounded(Tensor.random(rng, 2, heads, tq, dim), CudaAttention.DType.BF16);
    Tensor k = GpuCheck.rounded(Tensor.random(rng, 2, kvHeads, tk, dim), CudaAttention.DType.BF16);
    Tensor v = GpuCheck.rounded(Tensor.random(rng, 2, kvHeads, tk, dim), CudaAttention.DType.BF16);
    AttentionOptions opt = AttentionOptions.DEFAULT;
    AttentionState both = cuda.decodeChunks(q, List.of(k), List.of(v), null, null, opt, 700, null,
        CudaAttention.DType.BF16).state();
    Tensor q0 = new Tensor(Arrays.copyOf(q.data(), q.data().length / 2), 1, heads, tq, dim);
    Tensor k0 = new Tensor(Arrays.copyOf(k.data(), k.data().length / 2), 1, kvHeads, tk, dim);
    Tensor v0 = new Tensor(Arrays.copyOf(v.data(), v.data().length / 2), 1, kvHeads, tk, dim);
    AttentionState alone = cuda.decodeChunks(q0, List.of(k0), List.of(v0), null, null, opt, 700, null,
        CudaAttention.DType.BF16).state();
    boolean same = Arrays.equals(alone.o(), Arrays.copyOf(both.o(), alone.o().length))
        && Arrays.equals(alone.lse(), Arrays.copyOf(both.lse(), alone.lse().length));
    report.line("");
    report.row("batch invariance (bf16, sequence 0 alone vs in a batch of 2, split 700): "
        + (same ? "pass, bit-equal" : "FAIL: bits differ"), same);
  }

  /**
   * Timing on the shape (B 1, 32 query / 8 kv heads, D 128, bf16 KV of 262,144 tokens):
   * synchronized and unified kernels (combine included) for a few split lengths and query counts,
   * and a device-to-device copy of the same K+V bytes; medians of 20 after 5 warm-up launches. Also
   * 8 query heads (one row per CTA), and each tensor-core call again on the CUDA-core partials.
   */
  private static void timing(CudaAttention cuda, SplittableRandom rng, CheckReport report, boolean smoke) {
    // Smoke: four splits of 256 keys, so that the combine runs too, at a quarter of 4,096 keys' emulation time.
    int b = 1, h = 32, hkv = 8, d = 128, tk = smoke ? 1024 : 262_144, mainSplit = smoke ? 256 : 4096;
    CudaAttention.DType type = CudaAttention.DType.BF16;
    report.line("");
    report.line("## Decode timing, B 1, H 32 / Hkv 8, D 128, bf16 KV, Tk " + tk + " (CUDA events, median of 20)");
    report.line("");
    report.line("| what | Tq | split | ms | K+V GB/s | vs copy | recomputed |");
    report.line("| --- | --- | --- | --- | --- | --- | --- |");
    CUstream stream = new CUstream();
    CudaAttention.check("cuStreamCreate", JCudaDriver.cuStreamCreate(stream, 0));
    // One random float tensor (1 GiB) serves as both K and V: timing does not depend on the values.
    Tensor kvHost = Tensor.random(rng, b, hkv, tk, d);
    StringBuilder tsv = new StringBuilder("what\ttq\tsplit\tms\tgbps\n");
    try (CudaAttention.DeviceBuffer dk = CudaAttention.upload(kvHost, type, "k", stream);
         CudaAttention.DeviceBuffer dv = CudaAttention.upload(kvHost, type, "v", stream);
         CudaAttention.DeviceBuffer copy = new CudaAttention.DeviceBuffer(dk.bytes())) {
      // The copy reads and writes: its bandwidth counts both, the usual device-to-device figure.
      double copyMs = median(stream, () -> CudaAttention.check("cuMemcpyDtoDAsync",
          JCudaDriver.cuMemcpyDtoDAsync(copy.pointer(), dk.pointer(), dk.bytes(), stream)));
      double copyGbps = 2.0 * dk.bytes() / copyMs / 1e6;
      report.line(String.format(Locale.ROOT, "| device-to-device copy of K (%d MiB read + written) | | | %.3f | %.0f (read+write) | 1.00 | |",
          dk.bytes() >> 20, copyMs, copyGbps));
      tsv.append(String.format(Locale.ROOT, "copy\t0\t0\t%.6f\t%.3f%n", copyMs, copyGbps));
      // (query heads, Tq): the 32/8 heads at Tq 1, 4, 16, and 8/8 heads (one row per CTA: the
      // fewest rows the tensor-core partials take) at Tq 1, reported but not in the SDPA ratio table.
      for (int[] config : smoke ? new int[][] {{h, 1}, {hkv, 1}} : new int[][] {{h, 1}, {h, 4}, {h, 16}, {hkv, 1}}) {
        final int heads = config[0], tq = config[1];
        final String label = heads == h ? "" : String.format(Locale.ROOT, " (H %d / Hkv %d)", heads, hkv);
        Tensor q = Tensor.random(rng, b, heads, tq, d);
        long[] qp = lastPositions(tq, tk);
        UnifiedMax um = UnifiedMax.calibrate(q, kvHost, AttentionOptions.DEFAULT.withCausal(true));
        try (CudaAttention.DeviceBuffer dq = CudaAttention.upload(q, type, "q", stream);
             CudaAttention.DeviceBuffer dqp = CudaAttention.upload(qp, stream);
             CudaAttention.DeviceBuffer o = new CudaAttention.DeviceBuffer(4L * b * tq * heads * d);
             CudaAttention.DeviceBuffer lse = new CudaAttention.DeviceBuffer(4L * b * tq * heads)) {
          CudaAttention.DeviceTensor tqd = new CudaAttention.DeviceTensor(dq, type, b, heads, tq, d);
          List<CudaAttention.DeviceTensor> kc = List.of(new CudaAttention.DeviceTensor(dk, type, b, hkv, tk, d));
          List<CudaAttention.DeviceTensor> vc = List.of(new CudaAttention.DeviceTensor(dv, type, b, hkv, tk, d));
          for (int split : smoke || heads != h || tq > 1 ? new int[] {mainSplit} : new int[] {1024, 2048, 4096, 8192}) {
            try {
              CudaDecode.Plan plan = CudaAttention.devicePlan(tqd, kc, vc, split);
              try (CudaDecode.Workspace ws = cuda.decodeWorkspace(plan, kc, vc, stream)) {
                AttentionOptions opt = AttentionOptions.DEFAULT.withCausal(true);
                double sync = median(stream, () -> cuda.launchDecode(plan, ws, tqd, dqp, null, opt, null, o, lse, stream));
                double unified = median(stream, () -> cuda.launchDecode(plan, ws, tqd, dqp, null, opt, um, o, lse, stream));
                long recomputed = ws.recomputedRows(stream);
                double syncGbps = plan.kvBytes() / sync / 1e6, uniGbps = plan.kvBytes() / unified / 1e6;
                if (split == mainSplit) {
                  report.line("| " + occupancy(cuda, plan) + " | " + tq + " | " + split + " | | | | |");
                }
                report.line(String.format(Locale.ROOT, "| sync split-K%s | %d | %d | %.3f | %.0f | %.2f | |", label, tq, split,
                    sync, syncGbps, syncGbps / copyGbps));
                report.line(String.format(Locale.ROOT, "| unified max phi=%.2f (sync/unified time %.2fx)%s | %d | %d | %.3f | %.0f | %.2f | %d |",
                    um.phi(), sync / unified, label, tq, split, unified, uniGbps, uniGbps / copyGbps, recomputed));
                if (heads == h) { // the SDPA anchor times the heads only
                  tsv.append(String.format(Locale.ROOT, "sync\t%d\t%d\t%.6f\t%.3f%n", tq, split, sync, syncGbps));
                  tsv.append(String.format(Locale.ROOT, "unified\t%d\t%d\t%.6f\t%.3f%n", tq, split, unified, uniGbps));
                }
                if (plan.tensorCores() && split == mainSplit) {
                  timeOnCudaCores(cuda, plan, ws, kc, vc, tqd, dqp, opt, o, lse, stream, copyGbps, report, tq, split, label);
                }
              }
            } catch (RuntimeException | OutOfMemoryError e) { // one configuration lost, not the table
              report.errorRow(String.format(Locale.ROOT, "| decode timing%s | %d | %d | %s | | | |", label, tq, split,
                  CheckReport.errorText(e)));
              if (stopIfLost(e, report)) {
                return;
              }
            }
          }
        }
      }
    } finally {
      JCudaDriver.cuStreamDestroy(stream);
    }
    report.line("");
    report.line("(K+V GB/s = bytes of K and V read once over the kernel time; 'vs copy' = that over the copy's"
        + " read+write bandwidth. The PyTorch SDPA decode anchor follows, from sdpa_baseline.py.)");
    Path tsvFile = CheckReport.resultsFile().toAbsolutePath().resolveSibling("decode-times.tsv"); // beside the table
    try {
      Files.writeString(tsvFile, tsv.toString());
    } catch (java.io.IOException e) {
      report.line("could not write " + tsvFile + ": " + e);
    }
  }

  /**
   * The same call on the CUDA-core partials, which the plan no longer chooses for fp16/bf16 at D a
   * multiple of 16 up to 128:
   * whether the tensor cores still win at this row count. Reports the time and how far its output is
   * from the tensor-core kernel's (o rel-L2, lse max-abs).
   */
  private static void timeOnCudaCores(CudaAttention cuda, CudaDecode.Plan plan, CudaDecode.Workspace ws,
      List<CudaAttention.DeviceTensor> kc,
      List<CudaAttention.DeviceTensor> vc, CudaAttention.DeviceTensor q, CudaAttention.DeviceBuffer qp,
      AttentionOptions opt, CudaAttention.DeviceBuffer o, CudaAttention.DeviceBuffer lse, CUstream stream,
      double copyGbps, CheckReport report, int tq, int split, String label) {
    CudaDecode.Plan cc = plan.onCudaCores();
    int rows = Math.toIntExact(plan.states());
    float[] o1 = new float[rows * plan.dim()], l1 = new float[rows], o2 = new float[rows * plan.dim()], l2 = new float[rows];
    try (CudaDecode.Workspace wt = cuda.decodeWorkspace(cc, kc, vc, stream)) {
      cuda.launchDecode(plan, ws, q, qp, null, opt, null, o, lse, stream);
      download(o, lse, o1, l1, stream);
      double ms = median(stream, () -> cuda.launchDecode(cc, wt, q, qp, null, opt, null, o, lse, stream));
      download(o, lse, o2, l2, stream);
      Tolerance.Errors diff = Tolerance.errors(o2, l2, new ReferenceAttention.Result(Tolerance.toDouble(o1),
          Tolerance.toDouble(l1), plan.batch() * plan.tq(), plan.heads(), plan.dim()));
      double gbps = cc.kvBytes() / ms / 1e6;
      report.line("| " + occupancy(cuda, cc) + " | " + tq + " | " + split + " | | | | |");
      report.line(String.format(Locale.ROOT, "| sync split-K on CUDA cores%s (%s vs tensor cores) | %d | %d | %.3f | %.0f | %.2f | |",
          label, diff, tq, split, ms, gbps, gbps / copyGbps));
    }
  }

  private static void download(CudaAttention.DeviceBuffer o, CudaAttention.DeviceBuffer lse, float[] oh, float[] lh,
      CUstream stream) {
    CudaAttention.copyOutputs(o, lse, oh, lh, stream);
    CudaAttention.check("cuStreamSynchronize", JCudaDriver.cuStreamSynchronize(stream));
  }

  /** CTAs of the partial kernel, how many fit on one SM (registers, shared memory), and the SM count. */
  private static String occupancy(CudaAttention cuda, CudaDecode.Plan plan) {
    int[] perSm = new int[1], sms = new int[1];
    jcuda.driver.CUdevice dev = new jcuda.driver.CUdevice();
    CudaAttention.check("cuDeviceGet", JCudaDriver.cuDeviceGet(dev, 0));
    CudaAttention.check("cuDeviceGetAttribute(SM count)", JCudaDriver.cuDeviceGetAttribute(sms,
        jcuda.driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev));
    CudaAttention.check("cuOccupancyMaxActiveBlocksPerMultiprocessor", JCudaDriver
        .cuOccupancyMaxActiveBlocksPerMultiprocessor(perSm, cuda.kernel(plan.syncKernel()), plan.threads(),
            plan.smemBytes()));
    long ctas = (long) plan.splits() * plan.rowBlocks() * plan.kvHeads() * plan.batch();
    return String.format(Locale.ROOT, "%s: %d CTAs of %d rows, %d threads, %d B shared memory, %d resident per SM x %d SMs",
        plan.syncKernel(), ctas, plan.rowsPerCta(), plan.threads(), plan.smemBytes(), perSm[0], sms[0]);
  }

  /** Median ms of 20 timed launches after 5 warm-up launches (one launch in smoke mode). */
  private static double median(CUstream stream, Runnable launch) {
    return smokeRepeats > 0 ? GpuCheck.medianMs(stream, 0, smokeRepeats, launch) : GpuCheck.medianMs(stream, 5, 20, launch);
  }
}
