package io.longctx.kernels;

import java.util.Arrays;
import java.util.List;
import java.util.SplittableRandom;
import jcuda.driver.CUstream;
import jcuda.driver.JCudaDriver;

/**
 * Run in a child JVM by {@link CudaDecodeFakeDeviceTest} with the emulating fake libcuda on
 * LD_LIBRARY_PATH: drives the real CUDA backend (JCuda, CudaAttention, CudaDecode) whose kernel
 * launches execute flash_decode.cu on the host. Prints one line per check: {@code name=pass} or
 * {@code name=FAIL: why}.
 */
public final class CudaDecodeFakeDeviceMain {
  private CudaDecodeFakeDeviceMain() {}

  public static void main(String[] args) {
    CudaProbe.Status s = CudaProbe.status();
    System.out.println("available=" + s.available() + " device=" + s.device() + " reason=" + s.reason());
    AttentionBackend backend = AttentionBackend.select("cuda");
    System.out.println("backend=" + backend.name());
    CudaAttention cuda = (CudaAttention) backend;
    long seed = Seeds.forTest();
    System.out.println("seed=" + seed);
    SplittableRandom rng = new SplittableRandom(seed);
    AttentionOptions causal = AttentionOptions.DEFAULT.withCausal(true);

    // Host chunk list, bf16 on the "device".
    run("chunked-bf16", () -> {
      CudaAttention.DType t = CudaAttention.DType.BF16;
      Tensor q = GpuCheck.rounded(Tensor.random(rng, 1, 8, 3, 64), t);
      Tensor k = GpuCheck.rounded(Tensor.random(rng, 1, 2, 300, 64), t);
      Tensor v = GpuCheck.rounded(Tensor.random(rng, 1, 2, 300, 64), t);
      long[] qp = DecodeTest.decodePositions(3, 300);
      int[] lens = {100, 0, 200};
      CpuAttention.DecodeResult got = cuda.decodeChunks(q, GpuDecodeCheck.chunk(k, lens), GpuDecodeCheck.chunk(v, lens),
          qp, null, causal, 64, null, t);
      String bad = Tolerance.violation(got.state(), ReferenceAttention.compute(q, k, v, qp, null, causal),
          ReferenceAttention.computeFloat32(q, k, v, qp, null, causal));
      return bad != null ? bad : got.splits() == 5 ? null : "splits " + got.splits();
    });

    // The AttentionBackend entry points (float32 on the device) against the CPU backend's.
    run("backend-f32", () -> {
      Tensor q = Tensor.random(rng, 2, 4, 2, 96);
      Tensor k = Tensor.random(rng, 2, 4, 150, 96);
      Tensor v = Tensor.random(rng, 2, 4, 150, 96);
      AttentionOptions opt = causal.withSoftcap(20f);
      long[] qp = DecodeTest.decodePositions(2, 150);
      ReferenceAttention.Result ref = ReferenceAttention.compute(q, k, v, qp, null, opt);
      ReferenceAttention.Result naive = ReferenceAttention.computeFloat32(q, k, v, qp, null, opt);
      String bad = Tolerance.violation(backend.decode(q, k, v, qp, null, opt, 40).state(), ref, naive);
      if (bad == null) {
        bad = Tolerance.violation(CpuAttention.DEFAULT.decode(q, k, v, qp, null, opt, 40).state(), ref, naive);
      }
      return bad;
    });

    // Logits out of the unified-max bounds: recomputed pairs counted as on the CPU, answer unchanged.
    run("unified-recompute", () -> {
      Tensor q = Tensor.random(rng, 1, 8, 2, 64);
      for (int t = 0; t < 2; t++) {
        int at = q.offset(0, 3, t);
        for (int d = 0; d < 64; d++) {
          q.data()[at + d] *= 30;
        }
      }
      Tensor k = Tensor.random(rng, 1, 2, 201, 64);
      Tensor v = Tensor.random(rng, 1, 2, 201, 64);
      long[] qp = DecodeTest.decodePositions(2, 201);
      UnifiedMax um = UnifiedMax.of(0f);
      CpuAttention.DecodeResult got = backend.decodeUnifiedMax(q, k, v, qp, null, causal, 50, um);
      long cpu = CpuAttention.DEFAULT.decodeUnifiedMax(q, k, v, qp, null, causal, 50, um).recomputedRows();
      System.out.println("recomputed=" + got.recomputedRows() + " cpu=" + cpu);
      if (got.recomputedRows() != cpu || cpu < 2) {
        return "recomputed " + got.recomputedRows() + ", CPU " + cpu;
      }
      return Tolerance.violation(got.state(), ReferenceAttention.compute(q, k, v, qp, null, causal),
          ReferenceAttention.computeFloat32(q, k, v, qp, null, causal));
    });

    // Device chunk buffers through decodeOnDevice: the same bits as the host entry point.
    run("device-chunks", () -> {
      CudaAttention.DType t = CudaAttention.DType.F16;
      Tensor q = GpuCheck.rounded(Tensor.random(rng, 1, 4, 1, 128), t);
      Tensor k = GpuCheck.rounded(Tensor.random(rng, 1, 1, 130, 128), t);
      Tensor v = GpuCheck.rounded(Tensor.random(rng, 1, 1, 130, 128), t);
      int[] lens = {33, 97};
      List<Tensor> kc = GpuDecodeCheck.chunk(k, lens), vc = GpuDecodeCheck.chunk(v, lens);
      CpuAttention.DecodeResult host = cuda.decodeChunks(q, kc, vc, null, null, AttentionOptions.DEFAULT, 64, null, t);
      float[] o = new float[4 * 128];
      float[] lse = new float[4];
      CUstream stream = new CUstream();
      CudaAttention.check("cuStreamCreate", JCudaDriver.cuStreamCreate(stream, 0));
      try (CudaAttention.DeviceBuffer dq = CudaAttention.upload(q, t, "q", stream);
           CudaAttention.DeviceBuffer k0 = CudaAttention.upload(kc.get(0), t, "k0", stream);
           CudaAttention.DeviceBuffer k1 = CudaAttention.upload(kc.get(1), t, "k1", stream);
           CudaAttention.DeviceBuffer v0 = CudaAttention.upload(vc.get(0), t, "v0", stream);
           CudaAttention.DeviceBuffer v1 = CudaAttention.upload(vc.get(1), t, "v1", stream);
           CudaAttention.DeviceBuffer qp = CudaAttention.upload(new long[] {0}, stream);
           CudaAttention.DeviceBuffer dout = new CudaAttention.DeviceBuffer(4L * o.length);
           CudaAttention.DeviceBuffer dlse = new CudaAttention.DeviceBuffer(4L * lse.length)) {
        long n = cuda.decodeOnDevice(new CudaAttention.DeviceTensor(dq, t, 1, 4, 1, 128),
            List.of(new CudaAttention.DeviceTensor(k0, t, 1, 1, 33, 128), new CudaAttention.DeviceTensor(k1, t, 1, 1, 97, 128)),
            List.of(new CudaAttention.DeviceTensor(v0, t, 1, 1, 33, 128), new CudaAttention.DeviceTensor(v1, t, 1, 1, 97, 128)),
            qp, null, AttentionOptions.DEFAULT, 64, null, dout, dlse, stream);
        CudaAttention.check("cuMemcpyDtoH", JCudaDriver.cuMemcpyDtoH(jcuda.Pointer.to(o), dout.pointer(), dout.bytes()));
        CudaAttention.check("cuMemcpyDtoH", JCudaDriver.cuMemcpyDtoH(jcuda.Pointer.to(lse), dlse.pointer(), dlse.bytes()));
        if (n != 0) {
          return "synchronized decode reported " + n + " recomputations";
        }
      } finally {
        JCudaDriver.cuStreamDestroy(stream);
      }
      // No mask: every key, splits of 64 across the chunk boundary at 33.
      return Arrays.equals(o, host.state().o()) && Arrays.equals(lse, host.state().lse()) ? null
          : "device and host entry points differ";
    });

    // Errors: fp16 overflow is caught before any launch; a failing launch names the call.
    run("fp16-overflow", () -> {
      Tensor q = Tensor.zeros(1, 2, 1, 64);
      Tensor k = Tensor.zeros(1, 1, 10, 64);
      k.data()[k.offset(0, 0, 7) + 5] = 1e5f;
      try {
        cuda.decodeChunks(q, List.of(k), List.of(k), null, null, causal, 64, null, CudaAttention.DType.F16);
        return "no error";
      } catch (IllegalArgumentException e) {
        return e.getMessage().contains("k chunk 0") && e.getMessage().contains("position 7, dim 5") ? null : e.getMessage();
      }
    });
    // The host-array forward runs the plain float32 kernel, emulated: against the float64 reference.
    run("forward-f32", () -> {
      Tensor q = Tensor.random(rng, 1, 4, 37, 64);
      Tensor k = Tensor.random(rng, 1, 2, 53, 64);
      Tensor v = Tensor.random(rng, 1, 2, 53, 64);
      long[] qp = GpuCheck.lastPositions(37, 53);
      AttentionOptions opt = causal.withWindow(20);
      return Tolerance.violation(cuda.forward(q, k, v, qp, null, opt), ReferenceAttention.compute(q, k, v, qp, null, opt),
          ReferenceAttention.computeFloat32(q, k, v, qp, null, opt));
    });

    // A -inf score for a row's first visible key (q.k overflows float32): the plain kernel's running
    // max stays -inf, and its rescale factor must be 1, not exp(-inf - -inf) = NaN. The answer is
    // attention over the other keys. (The public host-array forward refuses such inputs before sending
    // them; forwardArrays is its unchecked work, as the device-buffer entry points see such a score.)
    run("forward-f32-first-score-minus-inf", () -> {
      int heads = 2, tq = 5, tk = 40, dim = 64;
      Tensor q = Tensor.random(rng, 1, heads, tq, dim);
      for (int i = 0; i < q.data().length; i++) {
        q.data()[i] = 0.5f + Math.abs(q.data()[i]); // positive: q.k0 = -3e38 * sum(q) overflows
      }
      Tensor k = Tensor.random(rng, 1, 1, tk, dim);
      Tensor v = Tensor.random(rng, 1, 1, tk, dim);
      Arrays.fill(k.data(), 0, dim, -3e38f);
      Tensor kRest = new Tensor(Arrays.copyOfRange(k.data(), dim, tk * dim), 1, 1, tk - 1, dim);
      Tensor vRest = new Tensor(Arrays.copyOfRange(v.data(), dim, tk * dim), 1, 1, tk - 1, dim);
      long[] kPosRest = new long[tk - 1];
      Arrays.setAll(kPosRest, j -> j + 1);
      long[] qp = GpuCheck.lastPositions(tq, tk);
      float[][] got = cuda.forwardArrays(q, k, v, qp, null, causal, CudaAttention.DType.F32);
      return Tolerance.violation(AttentionState.of(got[0], got[1], tq, heads, dim),
          ReferenceAttention.compute(q, kRest, vRest, qp, kPosRest, causal),
          ReferenceAttention.computeFloat32(q, kRest, vRest, qp, kPosRest, causal));
    });

    // The tensor-core forward (bf16, D 64) from host arrays through the public DType overload, judged
    // by the rounded-P rule.
    run("forward-tc-bf16", () -> {
      CudaAttention.DType t = CudaAttention.DType.BF16;
      Tensor q = GpuCheck.rounded(Tensor.random(rng, 1, 4, 37, 64), t);
      Tensor k = GpuCheck.rounded(Tensor.random(rng, 1, 2, 70, 64), t);
      Tensor v = GpuCheck.rounded(Tensor.random(rng, 1, 2, 70, 64), t);
      long[] qp = GpuCheck.lastPositions(37, 70);
      AttentionOptions opt = causal.withWindow(40);
      AttentionState got = cuda.forward(q, k, v, qp, null, opt, t);
      return Tolerance.violationRoundedP(got.o(), got.lse(), ReferenceAttention.compute(q, k, v, qp, null, opt),
          ReferenceAttention.computeRoundedP(q, k, v, qp, null, opt, t));
    });
  }

  private interface Check {
    String run() throws Exception;
  }

  private static void run(String name, Check c) {
    String bad;
    try {
      bad = c.run();
    } catch (Exception | AssertionError e) {
      bad = e.toString();
    }
    System.out.println(name + "=" + (bad == null ? "pass" : "FAIL: " + bad));
  }
}
