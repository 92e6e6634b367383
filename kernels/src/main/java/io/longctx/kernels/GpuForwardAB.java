package io.longctx.kernels;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Locale;
import java.util.SplittableRandom;

/**
 * The A/B section of the GPU check ({@code bin/gpu-check run ab}): the bf16 D 128 tensor-core forward
 * as other commits built it, beside this build's, in one process on one device, so that one short GPU
 * call says which of several unmeasured kernel changes paid. {@code bin/gpu-check bundle} compiles
 * {@code flash_forward_tc.cu} of each commit listed in {@code kernels/src/gpu/ab-revisions.txt} into
 * {@code <dir>/<label>.fatbin} and copies the list to {@code <dir>/revisions.txt} (lines {@code label
 * commit note}).
 *
 * <p>Each build's kernel is first checked against the float64 reference by the tensor-core rule
 * ({@link Tolerance#violationRoundedP}) on a few masked shapes, then every build is timed on the
 * forward timing shapes (B 1, H 16, T 4096..16384, causal and not), in two alternating rounds so
 * that drift of the machine shows as a difference between rounds, not between builds. Other builds'
 * kernels get the dynamic shared memory of this build's plus the 1,536 bytes of query and key
 * positions that builds before 7280e1e kept there: at 255 registers per thread the kernel is held to
 * 2 blocks per SM either way (2 x 71,168 bytes fit the 227 KB of an H100), so the extra bytes change
 * no occupancy. Exits as {@link GpuCheck} does. Usage: {@code GpuForwardAB DIR [--smoke]}.
 */
public final class GpuForwardAB {

  private GpuForwardAB() {}

  static final CudaAttention.DType TYPE = CudaAttention.DType.BF16;
  static final int DIM = 128;
  /** Query and key positions of one block in shared memory, as builds before 7280e1e kept them. */
  static final int OLD_POSITION_BYTES = 8 * (CudaAttention.TC_KEYS + CudaAttention.TC_ROWS_PER_BLOCK);
  /** [B, H, Hkv, Tq, Tk]. */
  private static final int[][] CHECK_SHAPES = {{1, 4, 2, 600, 600}, {2, 4, 4, 339, 700}};
  private static final int[][] SMOKE_CHECK_SHAPES = {{1, 2, 2, 5, 130}};
  private static final AttentionOptions[] CHECK_MASKS = {
      AttentionOptions.DEFAULT, AttentionOptions.DEFAULT.withCausal(true), AttentionOptions.DEFAULT.withWindow(100)};

  /** One build's kernel: its label and note from revisions.txt, and the kernel (null: this build's own). */
  record Build(String label, String note, CudaAttention.OtherBuildKernel kernel) {}

  public static void main(String[] args) {
    List<String> a = Arrays.asList(args);
    boolean smoke = a.contains("--smoke");
    List<String> rest = a.stream().filter(x -> !x.equals("--smoke")).toList();
    CheckReport report = new CheckReport("ab");
    if (rest.size() != 1) {
      report.line("usage: GpuForwardAB DIR [--smoke] (DIR: the bundle's ab folder, with revisions.txt and fatbins)");
      System.exit(2);
    }
    CudaProbe.Status s = CudaProbe.status();
    if (!s.available()) {
      report.line("gpu-check ab: CUDA unavailable: " + s.reason());
      System.exit(2);
    }
    long seed = Seeds.fromPropertyOrFresh(); // -Dlongctx.seed=S replays a run
    String kernel = CudaAttention.kernelFor(TYPE, DIM);
    report.line("");
    report.line("## A/B of " + kernel + " across commits on " + s.device() + ", " + CheckReport.driver() + ", seed "
        + seed + (smoke ? " (smoke sizes)" : ""));
    CudaAttention cuda;
    try {
      cuda = CudaAttention.instance();
    } catch (RuntimeException | LinkageError e) {
      report.errorRow("loading the kernels: " + CheckReport.errorText(e));
      report.stop("no CUDA backend");
      System.exit(report.finish());
      return;
    }
    List<Build> builds = load(cuda, Paths.get(rest.get(0)), kernel, report);
    SplittableRandom rng = new SplittableRandom(seed);
    if (!report.stopped()) {
      check(cuda, builds, rng, report, smoke);
    }
    if (!report.stopped()) {
      time(cuda, builds, rng, report, smoke);
    }
    System.exit(report.finish());
  }

  /** This build first, then each listed build whose fatbin loads (one that does not is an ERROR row). */
  static List<Build> load(CudaAttention cuda, Path dir, String kernel, CheckReport report) {
    List<Build> builds = new ArrayList<>(List.of(new Build("this build", "the bundle's own kernel", null)));
    List<String> lines;
    try {
      lines = Files.readAllLines(dir.resolve("revisions.txt"));
    } catch (IOException e) {
      report.errorRow("no list of builds: " + CheckReport.errorText(e));
      return builds;
    }
    int smem = CudaAttention.tcSmemBytes(TYPE, DIM) + OLD_POSITION_BYTES;
    report.line("");
    report.line("| build | commit | note | loaded |");
    report.line("| --- | --- | --- | --- |");
    for (String line : lines) {
      String l = line.strip();
      if (l.isEmpty() || l.startsWith("#")) {
        continue;
      }
      String[] f = l.split("\\s+", 3);
      String head = "| " + f[0] + " | " + (f.length > 1 ? f[1] : "?") + " | " + (f.length > 2 ? f[2] : "") + " | ";
      Path file = dir.resolve(f[0] + ".fatbin");
      if (!Files.isRegularFile(file)) {
        report.errorRow(head + "ERROR: no " + file + " (was commit " + (f.length > 1 ? f[1] : "?")
            + " in the clone that made the bundle?) |");
        continue;
      }
      try {
        byte[] fatbin = Files.readAllBytes(file);
        builds.add(new Build(f[0], f.length > 2 ? f[2] : "", cuda.loadOtherBuild(f[0], fatbin, kernel, smem)));
        report.line(head + "yes, " + smem + " bytes of shared memory |");
      } catch (IOException | RuntimeException e) {
        report.errorRow(head + CheckReport.errorText(e) + " |");
      }
    }
    return builds;
  }

  /** Each build against the float64 reference, tensor-core rule; one row per (build, shape, mask). */
  static void check(CudaAttention cuda, List<Build> builds, SplittableRandom rng, CheckReport report, boolean smoke) {
    report.line("");
    report.line("| build | shape [B,H/Hkv,Tq,Tk,D] | mask | errors | verdict |");
    report.line("| --- | --- | --- | --- | --- |");
    for (int[] sh : smoke ? SMOKE_CHECK_SHAPES : CHECK_SHAPES) {
      for (AttentionOptions opt : smoke ? Arrays.copyOf(CHECK_MASKS, 2) : CHECK_MASKS) {
        Tensor q = GpuCheck.rounded(Tensor.random(rng, sh[0], sh[1], sh[3], DIM), TYPE);
        Tensor k = GpuCheck.rounded(Tensor.random(rng, sh[0], sh[2], sh[4], DIM), TYPE);
        Tensor v = GpuCheck.rounded(Tensor.random(rng, sh[0], sh[2], sh[4], DIM), TYPE);
        long[] qPos = GpuCheck.lastPositions(sh[3], sh[4]);
        ReferenceAttention.Result ref = ReferenceAttention.compute(q, k, v, qPos, null, opt);
        ReferenceAttention.Result naive = ReferenceAttention.computeRoundedP(q, k, v, qPos, null, opt, TYPE);
        for (Build b : builds) {
          String head = String.format(Locale.ROOT, "| %s | [%d,%d/%d,%d,%d,%d] | %s | ", b.label(), sh[0], sh[1], sh[2],
              sh[3], sh[4], DIM, GpuCheck.maskName(opt));
          try {
            AttentionState got = GpuCheck.run(cuda, TYPE, q, k, v, qPos, opt, b.kernel());
            String bad = Tolerance.violationRoundedP(got.o(), got.lse(), ref, naive);
            report.row(head + Tolerance.errors(got.o(), got.lse(), ref) + " | " + (bad == null ? "pass" : "FAIL: " + bad)
                + " |", bad == null);
          } catch (RuntimeException | OutOfMemoryError e) {
            report.errorRow(head + " | " + CheckReport.errorText(e) + " |");
            String lost = CheckReport.contextLost(e);
            if (lost != null) {
              report.stop(lost);
              return;
            }
          }
        }
      }
    }
  }

  /** Every build on each timing shape, two alternating rounds; ratios against this build's faster round. */
  static void time(CudaAttention cuda, List<Build> builds, SplittableRandom rng, CheckReport report, boolean smoke) {
    report.line("");
    report.line("| build | B | H | T | D | causal | ms, round 1 / 2 (median of 10 each) | TFLOP/s (faster round)"
        + " | this build's ms / its ms |");
    report.line("| --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    int b = 1, h = smoke ? 2 : 16;
    for (int t : smoke ? new int[] {128} : new int[] {4096, 8192, 16384}) {
      for (boolean causal : new boolean[] {false, true}) {
        AttentionOptions opt = AttentionOptions.DEFAULT.withCausal(causal);
        double[][] ms = new double[builds.size()][2];
        for (double[] m : ms) {
          Arrays.fill(m, Double.NaN);
        }
        String[] error = new String[builds.size()];
        for (int round = 0; round < 2; round++) {
          for (int i = 0; i < builds.size(); i++) {
            if (error[i] != null) {
              continue;
            }
            try {
              ms[i][round] = GpuCheck.time(cuda, TYPE, b, h, t, DIM, opt, rng, builds.get(i).kernel());
            } catch (RuntimeException | OutOfMemoryError e) {
              error[i] = CheckReport.errorText(e);
              String lost = CheckReport.contextLost(e);
              if (lost != null) {
                report.errorRow("| " + builds.get(i).label() + " | " + error[i] + " |");
                report.stop(lost);
                return;
              }
            }
          }
        }
        double flops = 4.0 * b * h * t * (double) t * DIM * (causal ? 0.5 : 1.0);
        double mine = Math.min(ms[0][0], ms[0][1]);
        for (int i = 0; i < builds.size(); i++) {
          String head = String.format(Locale.ROOT, "| %s | %d | %d | %d | %d | %b | ", builds.get(i).label(), b, h, t,
              DIM, causal);
          if (error[i] != null) {
            report.errorRow(head + error[i] + " | | |");
            continue;
          }
          double best = Math.min(ms[i][0], ms[i][1]);
          report.line(head + String.format(Locale.ROOT, "%.3f / %.3f | %.1f | %.3f |", ms[i][0], ms[i][1],
              flops / best / 1e9, mine / best));
        }
      }
    }
  }
}
