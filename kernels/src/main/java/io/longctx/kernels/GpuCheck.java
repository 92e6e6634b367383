package io.longctx.kernels;

import java.util.Arrays;
import java.util.Locale;
import java.util.SplittableRandom;
import jcuda.Pointer;
import jcuda.driver.CUevent;
import jcuda.driver.CUstream;
import jcuda.driver.JCudaDriver;

/**
 * The forward section of the GPU check, run by {@code bin/gpu-check run} on a GPU machine in a JVM
 * of its own (the decode section, {@link GpuDecodeCheck}, runs in another): every forward kernel
 * variant against the float64 reference on fresh random inputs rounded to the kernel's element
 * type, then timing with CUDA events after warm-up. Tensor-core rows are judged by
 * {@link Tolerance#violationRoundedP} (their P is rounded to fp16/bf16 before P·V), the others by
 * the float32 rule. Every row is printed and appended to the results file as it is made
 * ({@link CheckReport}); a case that throws is an ERROR row and the next case runs, unless the CUDA
 * context is lost (sticky error), which ends the section. Exits 0 when every row passes, 1
 * otherwise, 2 when CUDA is unavailable. {@code --smoke}: tiny shapes, for CI on a fake libcuda.
 * {@code --timing-only}: the timing table alone (what {@code bin/gpu-check run --profile} runs under ncu).
 */
public final class GpuCheck {

  private GpuCheck() {}

  private static final AttentionOptions[] MASKS = {
      AttentionOptions.DEFAULT, AttentionOptions.DEFAULT.withCausal(true),
      AttentionOptions.DEFAULT.withWindow(100), AttentionOptions.DEFAULT.withCausal(true).withSoftcap(30f)};
  /** [B, H, Hkv, Tq, Tk, D]. */
  private static final int[][] SHAPES = {{1, 4, 1, 1, 1, 64}, {2, 8, 2, 7, 339, 128}, {1, 4, 4, 339, 339, 64},
      {1, 8, 1, 799, 799, 128}, {1, 2, 2, 1, 4097, 256}, {1, 2, 1, 1000, 1000, 32}, {1, 4, 2, 257, 257, 96}};
  private static final int[][] SMOKE_SHAPES = {{1, 2, 1, 3, 70, 64}, {1, 2, 2, 5, 130, 128}, {1, 2, 1, 4, 50, 32}};

  public static void main(String[] args) {
    boolean smoke = Arrays.asList(args).contains("--smoke");
    boolean timingOnly = Arrays.asList(args).contains("--timing-only");
    CheckReport report = new CheckReport("forward");
    CudaProbe.Status s = CudaProbe.status();
    if (!s.available()) {
      report.line("gpu-check forward: CUDA unavailable: " + s.reason());
      System.exit(2);
    }
    long seed = Seeds.fromPropertyOrFresh(); // -Dlongctx.seed=S replays a run
    report.line("");
    report.line("## Forward on " + s.device() + ", " + CheckReport.driver() + ", seed " + seed + (smoke ? " (smoke sizes)" : ""));
    CudaAttention cuda = null;
    try {
      cuda = CudaAttention.instance();
    } catch (RuntimeException | LinkageError e) {
      report.errorRow("loading the kernels: " + CheckReport.errorText(e));
      report.stop("no CUDA backend");
    }
    if (cuda != null) {
      SplittableRandom rng = new SplittableRandom(seed);
      if (!timingOnly) {
        correctness(cuda, rng, report, smoke);
      }
      if (!report.stopped()) {
        timing(cuda, rng, report, smoke);
      }
    }
    System.exit(report.finish());
  }

  /** One row per (type, shape, mask); each case isolated. */
  static void correctness(CudaAttention cuda, SplittableRandom rng, CheckReport report, boolean smoke) {
    report.line("");
    report.line("| kernel | shape [B,H/Hkv,Tq,Tk,D] | mask | errors | rule | verdict |");
    report.line("| --- | --- | --- | --- | --- | --- |");
    AttentionOptions[] masks = smoke ? Arrays.copyOf(MASKS, 2) : MASKS;
    for (CudaAttention.DType type : CudaAttention.DType.values()) {
      for (int[] sh : smoke ? SMOKE_SHAPES : SHAPES) {
        for (AttentionOptions opt : masks) {
          String kernel = CudaAttention.kernelFor(type, sh[5]);
          boolean roundedP = CudaAttention.usesTensorCores(type, sh[5]);
          String rule = roundedP
              ? String.valueOf(Tolerance.ROUNDED_P_FACTOR).replaceAll("\\.0$", "") + "x naive rounded-P"
              : "2x naive float32";
          String head = String.format(Locale.ROOT, "| %s | [%d,%d/%d,%d,%d,%d] | %s | ", kernel, sh[0], sh[1], sh[2],
              sh[3], sh[4], sh[5], maskName(opt));
          try {
            Tensor q = rounded(Tensor.random(rng, sh[0], sh[1], sh[3], sh[5]), type);
            Tensor k = rounded(Tensor.random(rng, sh[0], sh[2], sh[4], sh[5]), type);
            Tensor v = rounded(Tensor.random(rng, sh[0], sh[2], sh[4], sh[5]), type);
            long[] qPos = lastPositions(sh[3], sh[4]);
            AttentionState got = run(cuda, type, q, k, v, qPos, opt);
            ReferenceAttention.Result ref = ReferenceAttention.compute(q, k, v, qPos, null, opt);
            String bad = roundedP
                ? Tolerance.violationRoundedP(got.o(), got.lse(), ref,
                    ReferenceAttention.computeRoundedP(q, k, v, qPos, null, opt, type))
                : Tolerance.violation(got, ref, ReferenceAttention.computeFloat32(q, k, v, qPos, null, opt));
            report.row(head + Tolerance.errors(got.o(), got.lse(), ref) + " | " + rule + " | "
                + (bad == null ? "pass" : "FAIL: " + bad) + " |", bad == null);
          } catch (RuntimeException | OutOfMemoryError e) {
            report.errorRow(head + " | " + rule + " | " + CheckReport.errorText(e) + " |");
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

  /**
   * Forward timing, D 128, fp16 and bf16, causal and not; one row per configuration, each isolated.
   */
  static void timing(CudaAttention cuda, SplittableRandom rng, CheckReport report, boolean smoke) {
    report.line("");
    report.line("| kernel | B | H | T | D | causal | ms (median of 10) | TFLOP/s |");
    report.line("| --- | --- | --- | --- | --- | --- | --- | --- |");
    for (int t : smoke ? new int[] {128} : new int[] {4096, 8192, 16384}) {
      for (boolean causal : new boolean[] {false, true}) {
        for (CudaAttention.DType type : new CudaAttention.DType[] {CudaAttention.DType.BF16, CudaAttention.DType.F16}) {
          int b = 1, h = smoke ? 2 : 16, d = 128;
          String head = String.format(Locale.ROOT, "| %s | %d | %d | %d | %d | %b | ",
              CudaAttention.kernelFor(type, d), b, h, t, d, causal);
          try {
            double ms = time(cuda, type, b, h, t, d, AttentionOptions.DEFAULT.withCausal(causal), rng);
            double flops = 4.0 * b * h * t * (double) t * d * (causal ? 0.5 : 1.0);
            report.line(head + String.format(Locale.ROOT, "%.3f | %.1f |", ms, flops / ms / 1e9));
          } catch (RuntimeException | OutOfMemoryError e) {
            report.errorRow(head + CheckReport.errorText(e) + " | |");
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

  static String maskName(AttentionOptions o) {
    return (o.causal() ? "causal" : "full") + (o.window() > 0 ? " window " + o.window() : "")
        + (o.softcap() > 0 ? " softcap " + o.softcap() : "");
  }

  /** The last {@code tq} positions of a sequence of {@code tk}: rows see different key counts under masks. */
  static long[] lastPositions(int tq, int tk) {
    long[] p = new long[tq];
    for (int t = 0; t < tq; t++) {
      p[t] = tk - tq + t;
    }
    return p;
  }

  /** The values the kernel actually sees: each float rounded to the element type and back. */
  static Tensor rounded(Tensor x, CudaAttention.DType type) {
    float[] r = x.data().clone();
    for (int i = 0; i < r.length; i++) {
      r[i] = switch (type) {
        case F32 -> r[i];
        case F16 -> HalfFloats.halfToFloat(HalfFloats.floatToHalf(r[i]));
        case BF16 -> HalfFloats.bf16ToFloat(HalfFloats.floatToBf16(r[i]));
      };
    }
    return new Tensor(r, x.batch(), x.heads(), x.tokens(), x.dim());
  }

  /** x on the device as {@code type} (the checked conversion of CudaAttention: fp16 overflow is an error). */
  private static CudaAttention.DeviceBuffer upload(Tensor x, CudaAttention.DType type, CUstream stream) {
    return CudaAttention.upload(x, type, "input", stream);
  }

  static AttentionState run(CudaAttention cuda, CudaAttention.DType type, Tensor q, Tensor k, Tensor v, long[] qPos,
      AttentionOptions opt) {
    return run(cuda, type, q, k, v, qPos, opt, null);
  }

  /** The same on another build's kernel when {@code other} is not null ({@link GpuForwardAB}). */
  static AttentionState run(CudaAttention cuda, CudaAttention.DType type, Tensor q, Tensor k, Tensor v, long[] qPos,
      AttentionOptions opt, CudaAttention.OtherBuildKernel other) {
    float[][] out = cuda.forwardArrays(q, k, v, qPos, null, opt, type, other);
    int rows = q.batch() * q.tokens();
    // Not AttentionState.of on NaN (the device's poison where the kernel wrote nothing): that must
    // show as a failed check, not an exception.
    for (float x : out[1]) {
      if (Float.isNaN(x)) {
        return AttentionState.empty(rows, q.heads(), q.dim()); // errors() reports the mismatch
      }
    }
    return AttentionState.of(out[0], out[1], rows, q.heads(), q.dim());
  }

  /** Median kernel time in ms over 10 launches after 3 warm-up launches, by CUDA events. */
  static double time(CudaAttention cuda, CudaAttention.DType type, int b, int h, int t, int d, AttentionOptions opt,
      SplittableRandom rng) {
    return time(cuda, type, b, h, t, d, opt, rng, null);
  }

  /** The same on another build's kernel when {@code other} is not null ({@link GpuForwardAB}). */
  static double time(CudaAttention cuda, CudaAttention.DType type, int b, int h, int t, int d, AttentionOptions opt,
      SplittableRandom rng, CudaAttention.OtherBuildKernel other) {
    Tensor q = Tensor.random(rng, b, h, t, d);
    long[] pos = ReferenceAttention.iota(t);
    CUstream stream = new CUstream();
    CudaAttention.check("cuStreamCreate", JCudaDriver.cuStreamCreate(stream, 0));
    try (CudaAttention.DeviceBuffer dq = upload(q, type, stream);
         CudaAttention.DeviceBuffer dk = upload(q, type, stream);
         CudaAttention.DeviceBuffer dv = upload(q, type, stream);
         CudaAttention.DeviceBuffer dp = CudaAttention.upload(pos, stream);
         CudaAttention.DeviceBuffer dout = new CudaAttention.DeviceBuffer(4L * b * h * t * d);
         CudaAttention.DeviceBuffer dlse = new CudaAttention.DeviceBuffer(4L * b * h * t)) {
      CudaAttention.DeviceTensor tq = new CudaAttention.DeviceTensor(dq, type, b, h, t, d);
      CudaAttention.DeviceTensor tk = new CudaAttention.DeviceTensor(dk, type, b, h, t, d);
      CudaAttention.DeviceTensor tv = new CudaAttention.DeviceTensor(dv, type, b, h, t, d);
      return medianMs(stream, 3, 10, () -> cuda.forwardOnDevice(tq, tk, tv, dp, dp, opt, dout, dlse, stream,
          other));
    } finally {
      JCudaDriver.cuStreamDestroy(stream);
    }
  }

  /**
   * Median milliseconds of {@code reps} launches after {@code warmup} untimed ones, each timed by
   * CUDA events on {@code stream}. Shared by the forward and the decode checks.
   */
  static double medianMs(CUstream stream, int warmup, int reps, Runnable launch) {
    CUevent start = new CUevent(), stop = new CUevent();
    CudaAttention.check("cuEventCreate", JCudaDriver.cuEventCreate(start, 0));
    CudaAttention.check("cuEventCreate", JCudaDriver.cuEventCreate(stop, 0));
    try {
      double[] ms = new double[reps];
      for (int i = -warmup; i < reps; i++) {
        CudaAttention.check("cuEventRecord", JCudaDriver.cuEventRecord(start, stream));
        launch.run();
        CudaAttention.check("cuEventRecord", JCudaDriver.cuEventRecord(stop, stream));
        CudaAttention.check("cuEventSynchronize", JCudaDriver.cuEventSynchronize(stop));
        float[] elapsed = new float[1];
        CudaAttention.check("cuEventElapsedTime", JCudaDriver.cuEventElapsedTime(elapsed, start, stop));
        if (i >= 0) {
          ms[i] = elapsed[0];
        }
      }
      Arrays.sort(ms);
      return ms[ms.length / 2];
    } finally {
      JCudaDriver.cuEventDestroy(start);
      JCudaDriver.cuEventDestroy(stop);
    }
  }
}
