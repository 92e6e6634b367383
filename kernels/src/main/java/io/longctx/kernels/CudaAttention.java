package io.longctx.kernels;

import jcuda.Pointer;
import jcuda.driver.CUcontext;
import jcuda.driver.CUdevice;
import jcuda.driver.CUdeviceptr;
import jcuda.driver.CUfunction;
import jcuda.driver.CUmodule;
import jcuda.driver.CUresult;
import jcuda.driver.CUstream;
import jcuda.driver.JCudaDriver;

/**
 * The CUDA attention backend through JCuda's driver API: loads the fatbin built by nvcc once into
 * device 0's primary context, and runs the forward kernel from host arrays ({@link #forward}) or on
 * buffers already on the device ({@link #forwardOnDevice}). Device memory is released
 * deterministically (try-with-resources); every CUDA error becomes a {@link CudaException} naming
 * the call. Obtain it through {@link AttentionBackend#select()}, which probes first.
 */
public final class CudaAttention implements AttentionBackend {

  /** Largest head dim the CUDA kernels take (kMaxDim in flash_forward.cu). */
  public static final int MAX_DIM = 256;
  /** Head dims with a tensor-core kernel (flash_forward_tc.cu), for fp16 and bf16 inputs. */
  public static final java.util.Set<Integer> TENSOR_CORE_DIMS = java.util.Set.of(64, 128);
  private static final int PLAIN_ROWS_PER_BLOCK = 4; // kWarps in flash_forward.cu
  private static final int TC_ROWS_PER_BLOCK = 64; // kRows in flash_forward_tc.cu
  private static final int THREADS = 128; // both kernels

  private static volatile CudaAttention instance;

  private final CUcontext context = new CUcontext();
  private final java.util.Map<String, CUfunction> kernels = new java.util.HashMap<>();
  private final String device;

  /** Element types the kernels read; outputs are always float32. */
  public enum DType {
    F32(4, "f32"), F16(2, "f16"), BF16(2, "bf16");

    final int bytes;
    final String suffix;

    DType(int bytes, String suffix) {
      this.bytes = bytes;
      this.suffix = suffix;
    }
  }

  /** The kernel that runs inputs of this type and head dim: tensor cores where one exists. */
  public static String kernelFor(DType type, int dim) {
    return type != DType.F32 && TENSOR_CORE_DIMS.contains(dim)
        ? "longctx_forward_tc_" + type.suffix + "_d" + dim : "longctx_forward_" + type.suffix;
  }

  /** Every kernel in the fatbins. */
  public static java.util.List<String> kernelNames() {
    java.util.List<String> names = new java.util.ArrayList<>();
    for (DType t : DType.values()) {
      names.add(kernelFor(t, 1));
      if (t != DType.F32) {
        TENSOR_CORE_DIMS.stream().sorted().forEach(d -> names.add(kernelFor(t, d)));
      }
    }
    return names;
  }

  /** A CUDA error, naming the driver call that failed and its error code. */
  public static final class CudaException extends RuntimeException {
    CudaException(String call, int rc) {
      super(call + " failed: " + CUresult.stringFor(rc));
    }
  }

  private CudaAttention(String device) {
    this.device = device;
    check("cuInit", JCudaDriver.cuInit(0));
    CUdevice dev = new CUdevice();
    check("cuDeviceGet", JCudaDriver.cuDeviceGet(dev, 0));
    check("cuDevicePrimaryCtxRetain", JCudaDriver.cuDevicePrimaryCtxRetain(context, dev));
    check("cuCtxSetCurrent", JCudaDriver.cuCtxSetCurrent(context));
    java.util.List<CUmodule> modules = new java.util.ArrayList<>();
    for (String fatbin : CudaProbe.FATBINS) {
      CUmodule module = new CUmodule();
      check("cuModuleLoadData(" + fatbin + ")", JCudaDriver.cuModuleLoadData(module, CudaProbe.fatbin(fatbin)));
      modules.add(module);
    }
    for (String name : kernelNames()) {
      CUfunction f = new CUfunction();
      int rc = CUresult.CUDA_ERROR_NOT_FOUND;
      for (CUmodule m : modules) {
        rc = JCudaDriver.cuModuleGetFunction(f, m, name);
        if (rc == CUresult.CUDA_SUCCESS) {
          break;
        }
      }
      check("cuModuleGetFunction(" + name + ")", rc);
      kernels.put(name, f);
    }
  }

  /** The process-wide backend on device 0; fails with the probe's reason when CUDA is unavailable. */
  public static CudaAttention instance() {
    CudaAttention c = instance;
    if (c == null) {
      synchronized (CudaAttention.class) {
        if (instance == null) {
          CudaProbe.Status s = CudaProbe.status();
          if (!s.available()) {
            throw new IllegalStateException("CUDA is unavailable: " + s.reason());
          }
          instance = new CudaAttention(s.device());
        }
        c = instance;
      }
    }
    return c;
  }

  static void check(String call, int rc) {
    if (rc != CUresult.CUDA_SUCCESS) {
      throw new CudaException(call, rc);
    }
  }

  @Override
  public String name() {
    return "cuda:" + device;
  }

  /** Device memory, freed exactly once on close. */
  public static final class DeviceBuffer implements AutoCloseable {
    final CUdeviceptr ptr = new CUdeviceptr();
    final long bytes;
    private boolean freed;

    public DeviceBuffer(long bytes) {
      this.bytes = bytes;
      check("cuMemAlloc(" + bytes + " bytes)", JCudaDriver.cuMemAlloc(ptr, Math.max(1, bytes)));
    }

    public long bytes() {
      return bytes;
    }

    public CUdeviceptr pointer() {
      return ptr;
    }

    @Override
    public void close() {
      if (!freed) {
        freed = true;
        check("cuMemFree", JCudaDriver.cuMemFree(ptr));
      }
    }
  }

  /** A [batch, heads, tokens, dim] tensor of {@code type} already on the device. */
  public record DeviceTensor(DeviceBuffer buffer, DType type, int batch, int heads, int tokens, int dim) {
    long elements() {
      return (long) batch * heads * tokens * dim;
    }
  }

  /**
   * Host arrays in, attention state out: copies q, k, v and positions to the device on a stream of
   * its own, runs the float32 kernel, copies o and lse back, and frees everything it allocated.
   */
  @Override
  public AttentionState forward(Tensor q, Tensor k, Tensor v, long[] qPos, long[] kPos, AttentionOptions opt) {
    CpuAttention.Problem p = new CpuAttention.Problem(q, k, v, qPos, kPos, opt);
    requireDim(p.dim);
    float[] o = new float[p.rows * p.heads * p.dim];
    float[] lse = new float[p.rows * p.heads];
    check("cuCtxSetCurrent", JCudaDriver.cuCtxSetCurrent(context));
    CUstream stream = new CUstream();
    check("cuStreamCreate", JCudaDriver.cuStreamCreate(stream, 0));
    try (DeviceBuffer dq = upload(q.data(), stream);
         DeviceBuffer dk = upload(k.data(), stream);
         DeviceBuffer dv = upload(v.data(), stream);
         DeviceBuffer dqp = upload(p.qPos, stream);
         DeviceBuffer dkp = upload(p.kPos, stream);
         DeviceBuffer dout = new DeviceBuffer(4L * o.length);
         DeviceBuffer dlse = new DeviceBuffer(4L * lse.length)) {
      forwardOnDevice(new DeviceTensor(dq, DType.F32, q.batch(), q.heads(), q.tokens(), q.dim()),
          new DeviceTensor(dk, DType.F32, k.batch(), k.heads(), k.tokens(), k.dim()),
          new DeviceTensor(dv, DType.F32, v.batch(), v.heads(), v.tokens(), v.dim()),
          dqp, dkp, opt, dout, dlse, stream);
      check("cuMemcpyDtoHAsync(o)", JCudaDriver.cuMemcpyDtoHAsync(Pointer.to(o), dout.ptr, 4L * o.length, stream));
      check("cuMemcpyDtoHAsync(lse)", JCudaDriver.cuMemcpyDtoHAsync(Pointer.to(lse), dlse.ptr, 4L * lse.length, stream));
      check("cuStreamSynchronize", JCudaDriver.cuStreamSynchronize(stream));
    } finally {
      JCudaDriver.cuStreamDestroy(stream);
    }
    return AttentionState.of(o, lse, p.rows, p.heads, p.dim);
  }

  /**
   * Launches the forward kernel on device buffers, asynchronously on {@code stream}: o
   * [B*Tq, H, D] and lse [B*Tq, H] float32 (the attention-state layout), positions int64.
   */
  public void forwardOnDevice(DeviceTensor q, DeviceTensor k, DeviceTensor v, DeviceBuffer qPos, DeviceBuffer kPos,
      AttentionOptions opt, DeviceBuffer o, DeviceBuffer lse, CUstream stream) {
    if (q.type() != k.type() || k.type() != v.type()) {
      throw new IllegalArgumentException("q, k and v must share one element type, got " + q.type() + ", "
          + k.type() + ", " + v.type());
    }
    if (k.batch() != v.batch() || k.heads() != v.heads() || k.tokens() != v.tokens() || k.dim() != v.dim()
        || q.batch() != k.batch() || q.dim() != k.dim() || q.heads() % k.heads() != 0) {
      throw new IllegalArgumentException("shapes do not fit: q " + shape(q) + ", k " + shape(k) + ", v " + shape(v)
          + " (need equal batch and dim, k and v alike, query heads a multiple of kv heads)");
    }
    requireDim(q.dim());
    long rows = (long) q.batch() * q.tokens();
    requireBytes("q", q.buffer(), q.elements() * q.type().bytes);
    requireBytes("k", k.buffer(), k.elements() * k.type().bytes);
    requireBytes("v", v.buffer(), v.elements() * v.type().bytes);
    requireBytes("qPos", qPos, 8L * q.tokens());
    requireBytes("kPos", kPos, 8L * k.tokens());
    requireBytes("o", o, 4L * rows * q.heads() * q.dim());
    requireBytes("lse", lse, 4L * rows * q.heads());
    if (q.tokens() == 0) {
      return;
    }
    double scale = opt.scaleFor(q.dim());
    Pointer params = Pointer.to(
        Pointer.to(q.buffer().ptr), Pointer.to(k.buffer().ptr), Pointer.to(v.buffer().ptr),
        Pointer.to(qPos.ptr), Pointer.to(kPos.ptr), Pointer.to(o.ptr), Pointer.to(lse.ptr),
        Pointer.to(new int[] {q.heads()}), Pointer.to(new int[] {k.heads()}),
        Pointer.to(new int[] {q.tokens()}), Pointer.to(new int[] {k.tokens()}), Pointer.to(new int[] {q.dim()}),
        Pointer.to(new float[] {(float) scale}), Pointer.to(new float[] {opt.softcap()}),
        Pointer.to(new int[] {opt.causal() ? 1 : 0}), Pointer.to(new long[] {opt.window()}));
    String name = kernelFor(q.type(), q.dim());
    int rowsPerBlock = name.contains("_tc_") ? TC_ROWS_PER_BLOCK : PLAIN_ROWS_PER_BLOCK;
    check("cuCtxSetCurrent", JCudaDriver.cuCtxSetCurrent(context));
    check("cuLaunchKernel(" + name + ")", JCudaDriver.cuLaunchKernel(kernels.get(name),
        (q.tokens() + rowsPerBlock - 1) / rowsPerBlock, q.heads(), q.batch(), THREADS, 1, 1, 0, stream, params, null));
  }

  static DeviceBuffer upload(float[] host, CUstream stream) {
    DeviceBuffer b = new DeviceBuffer(4L * host.length);
    copyIn(b, Pointer.to(host), stream);
    return b;
  }

  static DeviceBuffer upload(long[] host, CUstream stream) {
    DeviceBuffer b = new DeviceBuffer(8L * host.length);
    copyIn(b, Pointer.to(host), stream);
    return b;
  }

  /** Copies host data into b on the stream; frees b if the copy cannot be issued. */
  static void copyIn(DeviceBuffer b, Pointer host, CUstream stream) {
    if (b.bytes > 0) {
      try {
        check("cuMemcpyHtoDAsync", JCudaDriver.cuMemcpyHtoDAsync(b.ptr, host, b.bytes, stream));
      } catch (RuntimeException e) {
        b.close();
        throw e;
      }
    }
  }

  private static void requireDim(int dim) {
    if (dim > MAX_DIM) {
      throw new IllegalArgumentException("unsupported head dim " + dim + ": the CUDA kernels support 1.." + MAX_DIM);
    }
  }

  private static void requireBytes(String what, DeviceBuffer b, long need) {
    if (b.bytes < need) {
      throw new IllegalArgumentException(what + " buffer holds " + b.bytes + " bytes, needs " + need);
    }
  }

  private static String shape(DeviceTensor t) {
    return "[" + t.batch() + ", " + t.heads() + ", " + t.tokens() + ", " + t.dim() + "] " + t.type();
  }
}
