package io.longctx.kernels;

import java.io.IOException;
import java.io.PrintStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Locale;
import java.util.SplittableRandom;
import jcuda.Pointer;
import jcuda.driver.CUevent;
import jcuda.driver.CUstream;
import jcuda.driver.JCudaDriver;

/**
 * The GPU check, run by {@code bin/gpu-check run} on a GPU machine: every CUDA kernel variant
 * against the float64 reference on fresh random inputs (DESIGN.md tolerance, on the inputs rounded
 * to the kernel's element type), then timing with CUDA events after warm-up. Prints a table and
 * writes it to {@code $OUT/gpu-check.txt} when OUT is set; exits 1 if any variant fails, 2 when
 * CUDA is unavailable. The PyTorch SDPA anchor runs beside it (bin/gpu-check, sdpa_baseline.py).
 */
public final class GpuCheck {

  private GpuCheck() {}

  public static void main(String[] args) throws IOException {
    CudaProbe.Status s = CudaProbe.status();
    if (!s.available()) {
      System.err.println("gpu-check: CUDA unavailable: " + s.reason());
      System.exit(2);
    }
    CudaAttention cuda = CudaAttention.instance();
    List<String> lines = new ArrayList<>();
    lines.add("# longctx GPU check on " + s.device() + " (" + java.time.LocalDate.now() + ")");
    long seed = System.nanoTime();
    lines.add("seed " + seed);
    lines.add("| kernel | shape [B,H/Hkv,Tq,Tk,D] | mask | errors | verdict |");
    lines.add("| --- | --- | --- | --- | --- |");
    SplittableRandom rng = new SplittableRandom(seed);
    int failures = 0;
    AttentionOptions[] masks = {
        AttentionOptions.DEFAULT, AttentionOptions.DEFAULT.withCausal(true),
        AttentionOptions.DEFAULT.withWindow(100), AttentionOptions.DEFAULT.withCausal(true).withSoftcap(30f)};
    int[][] shapes = {{1, 4, 1, 1, 1, 64}, {2, 8, 2, 7, 339, 128}, {1, 4, 4, 339, 339, 64}, {1, 8, 1, 799, 799, 128},
        {1, 2, 2, 1, 4097, 256}, {1, 2, 1, 1000, 1000, 32}, {1, 4, 2, 257, 257, 96}};
    for (CudaAttention.DType type : CudaAttention.DType.values()) {
      for (int[] sh : shapes) {
        for (AttentionOptions opt : masks) {
          Tensor q = rounded(random(rng, sh[0], sh[1], sh[3], sh[5]), type);
          Tensor k = rounded(random(rng, sh[0], sh[2], sh[4], sh[5]), type);
          Tensor v = rounded(random(rng, sh[0], sh[2], sh[4], sh[5]), type);
          long[] qPos = new long[sh[3]];
          for (int t = 0; t < qPos.length; t++) {
            qPos[t] = sh[4] - sh[3] + t; // the last queries of the sequence: rows see different key counts
          }
          AttentionState got = run(cuda, type, q, k, v, qPos, opt);
          ReferenceAttention.Result ref = ReferenceAttention.compute(q, k, v, qPos, null, opt);
          String bad = Tolerance.violation(got, ref, ReferenceAttention.computeFloat32(q, k, v, qPos, null, opt));
          failures += bad == null ? 0 : 1;
          lines.add(String.format(Locale.ROOT, "| %s | [%d,%d/%d,%d,%d,%d] | %s | %s | %s |",
              CudaAttention.kernelFor(type, sh[5]), sh[0], sh[1],
              sh[2], sh[3], sh[4], sh[5], maskName(opt), Tolerance.errors(got.o(), got.lse(), ref),
              bad == null ? "pass" : "FAIL: " + bad));
        }
      }
    }
    lines.add("");
    lines.add("| kernel | B | H | T | D | causal | ms (median of 10) | TFLOP/s |");
    lines.add("| --- | --- | --- | --- | --- | --- | --- | --- |");
    for (int t : new int[] {4096, 8192, 16384}) {
      for (boolean causal : new boolean[] {false, true}) {
        for (CudaAttention.DType type : new CudaAttention.DType[] {CudaAttention.DType.BF16, CudaAttention.DType.F16}) {
          int b = 1, h = 16, d = 128;
          double ms = time(cuda, type, b, h, t, d, AttentionOptions.DEFAULT.withCausal(causal), rng);
          double flops = 4.0 * b * h * t * (double) t * d * (causal ? 0.5 : 1.0);
          lines.add(String.format(Locale.ROOT, "| %s | %d | %d | %d | %d | %b | %.3f | %.1f |",
              CudaAttention.kernelFor(type, d), b, h, t, d,
              causal, ms, flops / ms / 1e9));
        }
      }
    }
    failures += GpuDecodeCheck.run(cuda, rng, lines);
    lines.add("");
    lines.add(failures == 0 ? "all variants pass" : failures + " variant(s) FAIL");
    print(lines, System.out);
    String out = System.getenv("OUT");
    if (out != null && !out.isEmpty()) {
      Files.write(Path.of(out, "gpu-check.txt"), lines);
    }
    System.exit(failures == 0 ? 0 : 1);
  }

  private static void print(List<String> lines, PrintStream ps) {
    lines.forEach(ps::println);
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

  static Tensor random(SplittableRandom rng, int b, int h, int t, int d) {
    float[] x = new float[b * h * t * d];
    for (int i = 0; i < x.length; i++) {
      x[i] = (float) rng.nextGaussian();
    }
    return new Tensor(x, b, h, t, d);
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
    int rows = q.batch() * q.tokens();
    float[] o = new float[rows * q.heads() * q.dim()];
    float[] lse = new float[rows * q.heads()];
    Arrays.fill(o, Float.NaN); // poisoned: anything the kernel fails to write shows
    Arrays.fill(lse, Float.NaN);
    long[] kPos = ReferenceAttention.iota(k.tokens());
    CUstream stream = new CUstream();
    CudaAttention.check("cuStreamCreate", JCudaDriver.cuStreamCreate(stream, 0));
    try (CudaAttention.DeviceBuffer dq = upload(q, type, stream);
         CudaAttention.DeviceBuffer dk = upload(k, type, stream);
         CudaAttention.DeviceBuffer dv = upload(v, type, stream);
         CudaAttention.DeviceBuffer dqp = CudaAttention.upload(qPos, stream);
         CudaAttention.DeviceBuffer dkp = CudaAttention.upload(kPos, stream);
         CudaAttention.DeviceBuffer dout = new CudaAttention.DeviceBuffer(4L * o.length);
         CudaAttention.DeviceBuffer dlse = new CudaAttention.DeviceBuffer(4L * lse.length)) {
      CudaAttention.check("cuMemcpyHtoDAsync(poison o)", JCudaDriver.cuMemcpyHtoDAsync(dout.ptr, Pointer.to(o), dout.bytes, stream));
      CudaAttention.check("cuMemcpyHtoDAsync(poison lse)", JCudaDriver.cuMemcpyHtoDAsync(dlse.ptr, Pointer.to(lse), dlse.bytes, stream));
      cuda.forwardOnDevice(new CudaAttention.DeviceTensor(dq, type, q.batch(), q.heads(), q.tokens(), q.dim()),
          new CudaAttention.DeviceTensor(dk, type, k.batch(), k.heads(), k.tokens(), k.dim()),
          new CudaAttention.DeviceTensor(dv, type, v.batch(), v.heads(), v.tokens(), v.dim()), dqp, dkp, opt, dout, dlse,
          stream);
      CudaAttention.check("cuMemcpyDtoHAsync", JCudaDriver.cuMemcpyDtoHAsync(Pointer.to(o), dout.ptr, dout.bytes, stream));
      CudaAttention.check("cuMemcpyDtoHAsync", JCudaDriver.cuMemcpyDtoHAsync(Pointer.to(lse), dlse.ptr, dlse.bytes, stream));
      CudaAttention.check("cuStreamSynchronize", JCudaDriver.cuStreamSynchronize(stream));
    } finally {
      JCudaDriver.cuStreamDestroy(stream);
    }
    // Not AttentionState.of: a NaN left by the kernel must show as a failed check, not an exception.
    float[] oo = o, ll = lse;
    for (float x : ll) {
      if (Float.isNaN(x)) {
        return AttentionState.empty(rows, q.heads(), q.dim()); // errors() reports the mismatch
      }
    }
    return AttentionState.of(oo, ll, rows, q.heads(), q.dim());
  }

  /** Median kernel time in ms over 10 launches after 3 warm-up launches, by CUDA events. */
  static double time(CudaAttention cuda, CudaAttention.DType type, int b, int h, int t, int d, AttentionOptions opt,
      SplittableRandom rng) {
    Tensor q = random(rng, b, h, t, d);
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
      return medianMs(stream, 3, 10, () -> cuda.forwardOnDevice(tq, tk, tv, dp, dp, opt, dout, dlse, stream));
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
