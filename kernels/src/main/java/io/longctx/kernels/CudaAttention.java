package io.longctx.kernels;

import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import jcuda.Pointer;
import jcuda.driver.CUcontext;
import jcuda.driver.CUdevice;
import jcuda.driver.CUdeviceptr;
import jcuda.driver.CUfunction;
import jcuda.driver.CUfunction_attribute;
import jcuda.driver.CUmodule;
import jcuda.driver.CUresult;
import jcuda.driver.CUstream;
import jcuda.driver.JCudaDriver;

/**
 * The CUDA attention backend through JCuda's driver API: loads the fatbin built by nvcc once into
 * a device's primary context (one instance per device ordinal), and runs the forward kernel from host arrays ({@link #forward}) or on
 * buffers already on the device ({@link #forwardOnDevice}). Device memory is released
 * deterministically (try-with-resources); every CUDA error becomes a {@link CudaException} naming
 * the call. Obtain it through {@link AttentionBackends} (the one selector), which probes first.
 */
public final class CudaAttention implements AttentionBackend {

  /** Largest head dim the CUDA kernels take (kMaxDim in flash_forward.cu). */
  public static final int MAX_DIM = 256;
  /** Head dims with a tensor-core kernel (flash_forward_tc.cu), for fp16 and bf16 inputs. */
  public static final Set<Integer> TENSOR_CORE_DIMS = Set.of(64, 128);
  static final int PLAIN_ROWS_PER_BLOCK = 4; // kWarps in flash_forward.cu (LaunchGeometryTest)
  static final int TC_ROWS_PER_BLOCK = 128; // kRows in flash_forward_tc.cu (LaunchGeometryTest)
  static final int THREADS = 128; // the plain forward kernel: one warp per row (LaunchGeometryTest)
  static final int TC_THREADS = 128; // kThreads in flash_forward_tc.cu: 4 warps of 32 rows (LaunchGeometryTest)
  /** Keys per tile of the tensor-core forward (kKeys in flash_forward_tc.cu). */
  static final int TC_KEYS = 64;

  private static final Map<Integer, CudaAttention> INSTANCES = new ConcurrentHashMap<>();

  private final CUcontext context = new CUcontext();
  private final Map<String, CUfunction> kernels = new HashMap<>();
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
    // "m32": 32 query rows per warp, a name kept so that the A/B of bin/gpu-check finds the same
    // kernel in earlier commits' fatbins.
    return usesTensorCores(type, dim) ? "longctx_forward_tc_m32_" + type.suffix + "_d" + dim
        : "longctx_forward_" + type.suffix;
  }

  static boolean usesTensorCores(DType type, int dim) {
    return type != DType.F32 && TENSOR_CORE_DIMS.contains(dim);
  }

  /**
   * Dynamic shared memory of the tensor-core forward (smem_bytes() in flash_forward_tc.cu): K and V
   * tiles and the block's Q rows, rows padded by 16 bytes.
   */
  static int tcSmemBytes(DType type, int dim) {
    return (2 * TC_KEYS + TC_ROWS_PER_BLOCK) * (dim + 8) * type.bytes;
  }

  /** The fatbin that defines a kernel, by the naming of the three .cu files. */
  static String fatbinOf(String kernel) {
    return kernel.startsWith("longctx_forward_tc_") ? "flash_forward_tc.fatbin"
        : kernel.startsWith("longctx_forward_") ? "flash_forward.fatbin" : "flash_decode.fatbin";
  }

  /** Every kernel in the fatbins: forward (plain, tensor-core) and decode (partials, combine). */
  public static List<String> kernelNames() {
    List<String> names = new ArrayList<>();
    for (DType t : DType.values()) {
      names.add(kernelFor(t, 1));
      if (t != DType.F32) {
        TENSOR_CORE_DIMS.stream().sorted().forEach(d -> names.add(kernelFor(t, d)));
      }
    }
    names.addAll(CudaDecode.kernelNames());
    return names;
  }

  /** A CUDA error, naming the driver call that failed and its error code. */
  public static final class CudaException extends RuntimeException {
    private final int code;

    CudaException(String call, int rc) {
      super(call + " failed: " + CUresult.stringFor(rc));
      this.code = rc;
    }

    /** The CUresult code. */
    public int code() {
      return code;
    }

    /**
     * Whether the error is sticky: a fault inside a kernel (illegal address or instruction,
     * misaligned access, device assert, launch failure or timeout, uncorrectable ECC) leaves the
     * context unusable, and every later call in this process returns the same error.
     */
    public boolean sticky() {
      return code == 214 || code == 700 || code == 702 || code == 710 || (code >= 714 && code <= 719);
    }
  }

  private CudaAttention(int ordinal, String device) {
    this.device = ordinal + " " + device;
    check("cuInit", JCudaDriver.cuInit(0));
    CUdevice dev = new CUdevice();
    check("cuDeviceGet(" + ordinal + ")", JCudaDriver.cuDeviceGet(dev, ordinal));
    check("cuDevicePrimaryCtxRetain", JCudaDriver.cuDevicePrimaryCtxRetain(context, dev));
    check("cuCtxSetCurrent", JCudaDriver.cuCtxSetCurrent(context));
    Map<String, CUmodule> modules = new HashMap<>();
    for (String fatbin : CudaProbe.FATBINS) {
      CUmodule module = new CUmodule();
      check("cuModuleLoadData(" + fatbin + ")", JCudaDriver.cuModuleLoadData(module, CudaProbe.fatbin(fatbin)));
      modules.put(fatbin, module);
    }
    for (String name : kernelNames()) {
      // Looked up only in the fatbin that defines it: a miss elsewhere is an API error that
      // compute-sanitizer reports (and fails the run on).
      CUfunction f = new CUfunction();
      check("cuModuleGetFunction(" + name + ")", JCudaDriver.cuModuleGetFunction(f, modules.get(fatbinOf(name)), name));
      kernels.put(name, f);
    }
    // The tensor-core kernels past 48 KB of shared memory (D 128) opt in once.
    for (DType t : List.of(DType.F16, DType.BF16)) {
      for (int d : TENSOR_CORE_DIMS) {
        int bytes = tcSmemBytes(t, d);
        if (bytes > CudaDecode.DEFAULT_SMEM) {
          String name = kernelFor(t, d);
          check("cuFuncSetAttribute(" + name + ", max dynamic shared memory " + bytes + ")",
              JCudaDriver.cuFuncSetAttribute(kernels.get(name),
                  CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, bytes));
        }
      }
    }
  }

  /** Queues the copies of a result (o, lse float32) from the device into o and lse on {@code stream}. */
  static void copyOutputs(DeviceBuffer dout, DeviceBuffer dlse, float[] o, float[] lse, CUstream stream) {
    check("cuMemcpyDtoHAsync(o)", JCudaDriver.cuMemcpyDtoHAsync(Pointer.to(o), dout.ptr, 4L * o.length, stream));
    check("cuMemcpyDtoHAsync(lse)", JCudaDriver.cuMemcpyDtoHAsync(Pointer.to(lse), dlse.ptr, 4L * lse.length, stream));
  }

  /** The process-wide backend on device 0; fails with the probe's reason when CUDA is unavailable. */
  public static CudaAttention instance() {
    return instance(0);
  }

  /**
   * The process-wide backend on device {@code ordinal} (a Spark task's assigned GPU address); fails
   * with the probe's reason when CUDA is unavailable.
   */
  public static CudaAttention instance(int ordinal) {
    CudaAttention c = INSTANCES.get(ordinal);
    if (c == null) {
      synchronized (CudaAttention.class) {
        c = INSTANCES.get(ordinal);
        if (c == null) {
          CudaProbe.Status s = CudaProbe.status();
          if (!s.available()) {
            throw new IllegalStateException("CUDA is unavailable: " + s.reason());
          }
          if (ordinal < 0 || ordinal >= s.devices()) {
            throw new IllegalStateException("CUDA device " + ordinal + " does not exist: this machine has "
                + s.devices() + " device(s)");
          }
          c = new CudaAttention(ordinal, ordinal == 0 ? s.device() : "device " + ordinal);
          INSTANCES.put(ordinal, c);
        }
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

  CUcontext context() {
    return context;
  }

  CUfunction kernel(String name) {
    CUfunction f = kernels.get(name);
    if (f == null) {
      throw new IllegalStateException("no CUDA kernel " + name + " was loaded");
    }
    return f;
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
   * its own, runs the float32 kernel, copies o and lse back, and frees everything it allocated. The
   * same contract and tolerance as {@link CpuAttention#forward}.
   */
  @Override
  public AttentionState forward(Tensor q, Tensor k, Tensor v, long[] qPos, long[] kPos, AttentionOptions opt) {
    return forward(q, k, v, qPos, kPos, opt, DType.F32);
  }

  /**
   * The same with q, k and v converted to {@code type} on the way: F16 and BF16 run the tensor-core
   * kernel at D 64 and 128 ({@link #kernelFor}). That is a different accuracy contract, so it is never
   * the default: the inputs are rounded to the type, and the kernel rounds the probabilities P to it
   * before P V, as FlashAttention does, so its result is judged by the rounded-P rule
   * ({@link Tolerance#violationRoundedP}), not by the float32 rule. An fp16 overflow is an error
   * naming the element, raised before anything is allocated on the device. o and lse start as NaN
   * on the device, so an entry the kernel failed to write is an error, not a result.
   */
  public AttentionState forward(Tensor q, Tensor k, Tensor v, long[] qPos, long[] kPos, AttentionOptions opt,
      DType type) {
    requireNoQkOverflow(q, List.of(k), opt);
    float[][] out = forwardArrays(q, k, v, qPos, kPos, opt, type);
    return AttentionState.of(out[0], out[1], q.batch() * q.tokens(), q.heads(), q.dim());
  }

  /**
   * The work of {@link #forward(Tensor, Tensor, Tensor, long[], long[], AttentionOptions, DType)}, returning
   * {o, lse} as copied back, unchecked: an entry the kernel did not write is NaN, which the GPU check
   * reports as a failed row rather than an exception. q and k are not checked for a q.k past float32
   * ({@link #requireNoQkOverflow}): the kernels' own handling of one is tested through here.
   */
  float[][] forwardArrays(Tensor q, Tensor k, Tensor v, long[] qPos, long[] kPos, AttentionOptions opt, DType type) {
    return forwardArrays(q, k, v, qPos, kPos, opt, type, null);
  }

  /** The same on {@code other}'s kernel instead of this build's when not null (see {@link OtherBuildKernel}). */
  float[][] forwardArrays(Tensor q, Tensor k, Tensor v, long[] qPos, long[] kPos, AttentionOptions opt, DType type,
      OtherBuildKernel other) {
    CpuAttention.Problem p = new CpuAttention.Problem(q, k, v, qPos, kPos, opt);
    requireDim(p.dim);
    Objects.requireNonNull(type, "type");
    Pointer hq = hostData(q, type, "q"), hk = hostData(k, type, "k"), hv = hostData(v, type, "v");
    float[] o = new float[p.rows * p.heads * p.dim];
    float[] lse = new float[p.rows * p.heads];
    check("cuCtxSetCurrent", JCudaDriver.cuCtxSetCurrent(context));
    CUstream stream = new CUstream();
    check("cuStreamCreate", JCudaDriver.cuStreamCreate(stream, 0));
    try (DeviceBuffer dq = upload(hq, q.data().length * (long) type.bytes, stream);
         DeviceBuffer dk = upload(hk, k.data().length * (long) type.bytes, stream);
         DeviceBuffer dv = upload(hv, v.data().length * (long) type.bytes, stream);
         DeviceBuffer dqp = upload(p.qPos, stream);
         DeviceBuffer dkp = upload(p.kPos, stream);
         DeviceBuffer dout = new DeviceBuffer(4L * o.length);
         DeviceBuffer dlse = new DeviceBuffer(4L * lse.length)) {
      check("cuMemsetD32Async(poison o)", JCudaDriver.cuMemsetD32Async(dout.ptr, CudaDecode.NAN_BITS, o.length, stream));
      check("cuMemsetD32Async(poison lse)", JCudaDriver.cuMemsetD32Async(dlse.ptr, CudaDecode.NAN_BITS, lse.length, stream));
      forwardOnDevice(new DeviceTensor(dq, type, q.batch(), q.heads(), q.tokens(), q.dim()),
          new DeviceTensor(dk, type, k.batch(), k.heads(), k.tokens(), k.dim()),
          new DeviceTensor(dv, type, v.batch(), v.heads(), v.tokens(), v.dim()),
          dqp, dkp, opt, dout, dlse, stream, other);
      copyOutputs(dout, dlse, o, lse, stream);
      check("cuStreamSynchronize", JCudaDriver.cuStreamSynchronize(stream));
    } finally {
      JCudaDriver.cuStreamDestroy(stream);
    }
    return new float[][] {o, lse};
  }

  /**
   * Launches the forward kernel on device buffers, asynchronously on {@code stream}: o
   * [B*Tq, H, D] and lse [B*Tq, H] float32 (the attention-state layout), positions int64.
   * The inputs are not scanned (the host-array methods refuse NaN and Infinity): NaN or Infinity in
   * q or k, or a q.k past float32's range, gives NaN in the row's o and lse, except a q.k that
   * overflows to -Infinity without a softcap: its key is weighted as if masked (docs/CUDA.md).
   */
  public void forwardOnDevice(DeviceTensor q, DeviceTensor k, DeviceTensor v, DeviceBuffer qPos, DeviceBuffer kPos,
      AttentionOptions opt, DeviceBuffer o, DeviceBuffer lse, CUstream stream) {
    forwardOnDevice(q, k, v, qPos, kPos, opt, o, lse, stream, null);
  }

  /**
   * A tensor-core forward kernel as another commit built it, loaded from that build's fatbin (the
   * A/B of {@code bin/gpu-check run ab}, {@link GpuForwardAB}): launched in place of this build's
   * kernel of the same name, with the same arguments and grid, and {@code smemBytes} of dynamic
   * shared memory (what that build's kernel needs, or more).
   */
  record OtherBuildKernel(String label, String name, CUfunction function, int smemBytes) {}

  /** Loads the kernel {@code name} of another build's fatbin, and opts it in to {@code smemBytes}. */
  OtherBuildKernel loadOtherBuild(String label, byte[] fatbin, String name, int smemBytes) {
    check("cuCtxSetCurrent", JCudaDriver.cuCtxSetCurrent(context));
    CUmodule module = new CUmodule();
    check("cuModuleLoadData(" + label + ")", JCudaDriver.cuModuleLoadData(module, fatbin));
    CUfunction f = new CUfunction();
    check("cuModuleGetFunction(" + name + " of " + label + ")", JCudaDriver.cuModuleGetFunction(f, module, name));
    check("cuFuncSetAttribute(" + name + " of " + label + ", max dynamic shared memory " + smemBytes + ")",
        JCudaDriver.cuFuncSetAttribute(f, CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            smemBytes));
    return new OtherBuildKernel(label, name, f, smemBytes);
  }

  void forwardOnDevice(DeviceTensor q, DeviceTensor k, DeviceTensor v, DeviceBuffer qPos, DeviceBuffer kPos,
      AttentionOptions opt, DeviceBuffer o, DeviceBuffer lse, CUstream stream, OtherBuildKernel other) {
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
    opt.scoreScale(q.dim()); // refuses a scale float32 holds only as 0, a subnormal or infinity
    Pointer params = Pointer.to(
        Pointer.to(q.buffer().ptr), Pointer.to(k.buffer().ptr), Pointer.to(v.buffer().ptr),
        Pointer.to(qPos.ptr), Pointer.to(kPos.ptr), Pointer.to(o.ptr), Pointer.to(lse.ptr),
        Pointer.to(new int[] {q.heads()}), Pointer.to(new int[] {k.heads()}),
        Pointer.to(new int[] {q.tokens()}), Pointer.to(new int[] {k.tokens()}), Pointer.to(new int[] {q.dim()}),
        Pointer.to(new float[] {(float) scale}), Pointer.to(new float[] {opt.softcap()}),
        Pointer.to(new int[] {opt.causal() ? 1 : 0}), Pointer.to(new long[] {opt.window()}));
    String name = kernelFor(q.type(), q.dim());
    if (other != null && !other.name().equals(name)) {
      throw new IllegalArgumentException(other.label() + "'s " + other.name() + " cannot stand in for " + name);
    }
    boolean tc = usesTensorCores(q.type(), q.dim());
    int rowsPerBlock = tc ? TC_ROWS_PER_BLOCK : PLAIN_ROWS_PER_BLOCK;
    int threads = tc ? TC_THREADS : THREADS;
    check("cuCtxSetCurrent", JCudaDriver.cuCtxSetCurrent(context));
    check("cuLaunchKernel(" + name + (other != null ? " of " + other.label() : "") + ")",
        JCudaDriver.cuLaunchKernel(other != null ? other.function() : kernels.get(name),
            (q.tokens() + rowsPerBlock - 1) / rowsPerBlock, q.heads(), q.batch(), threads, 1, 1,
            other != null ? other.smemBytes() : tc ? tcSmemBytes(q.type(), q.dim()) : 0, stream,
            params, null));
  }

  /**
   * Split-K decoding from host arrays, float32 on the device: see {@link CpuAttention#decode}; the
   * same contract and tolerance. The kernels are in flash_decode.cu, the geometry in {@link CudaDecode}.
   */
  @Override
  public CpuAttention.DecodeResult decode(Tensor q, Tensor k, Tensor v, long[] qPos, long[] kPos, AttentionOptions opt,
      int splitLen) {
    return decodeChunks(q, List.of(k), List.of(v), qPos, kPos, opt, splitLen, null, DType.F32);
  }

  /** FlashDecoding++ decoding from host arrays: see {@link CpuAttention#decodeUnifiedMax}. */
  @Override
  public CpuAttention.DecodeResult decodeUnifiedMax(Tensor q, Tensor k, Tensor v, long[] qPos, long[] kPos,
      AttentionOptions opt, int splitLen, UnifiedMax um) {
    return decodeChunks(q, List.of(k), List.of(v), qPos, kPos, opt, splitLen,
        Objects.requireNonNull(um, "um"), DType.F32);
  }

  /**
   * Decoding over KV handed as chunks (chunk i: [B, Hkv, len_i, D]; positions, when given, over the
   * concatenated keys): each chunk goes to its own device buffer, nothing is concatenated. Host
   * float32 data is converted to {@code type} on the way (fp16 overflow is an error naming the
   * element). {@code um} null: synchronized split-K; else the unified maximum with its recompute count.
   */
  public CpuAttention.DecodeResult decodeChunks(Tensor q, List<Tensor> kChunks, List<Tensor> vChunks,
      long[] qPos, long[] kPos, AttentionOptions opt, int splitLen, UnifiedMax um, DType type) {
    CudaDecode.Plan plan = hostPlan(q, kChunks, vChunks, qPos, kPos, opt, splitLen, type);
    requireNoQkOverflow(q, kChunks, opt);
    if (opt.softcap() > 0) { // as the CPU kernels: a capped infinite q.k would be a finite score
      q.requireFinite("q");
      for (int c = 0; c < kChunks.size(); c++) {
        kChunks.get(c).requireFinite("k chunk " + c);
      }
    }
    float[] o = new float[Math.toIntExact(plan.states() * plan.dim())];
    float[] lse = new float[Math.toIntExact(plan.states())];
    long[] qp = qPos != null ? qPos : ReferenceAttention.iota(q.tokens());
    check("cuCtxSetCurrent", JCudaDriver.cuCtxSetCurrent(context));
    CUstream stream = new CUstream();
    check("cuStreamCreate", JCudaDriver.cuStreamCreate(stream, 0));
    List<DeviceBuffer> chunkBuffers = new ArrayList<>();
    long recomputed;
    try (DeviceBuffer dq = upload(q, type, "q", stream);
         DeviceBuffer dqp = upload(qp, stream);
         DeviceBuffer dkp = kPos != null ? upload(kPos, stream) : null;
         DeviceBuffer dout = new DeviceBuffer(4L * o.length);
         DeviceBuffer dlse = new DeviceBuffer(4L * lse.length)) {
      List<DeviceTensor> dk = new ArrayList<>(), dv = new ArrayList<>();
      for (int c = 0; c < kChunks.size(); c++) {
        Tensor k = kChunks.get(c), v = vChunks.get(c);
        DeviceBuffer bk = upload(k, type, "k chunk " + c, stream);
        chunkBuffers.add(bk);
        DeviceBuffer bv = upload(v, type, "v chunk " + c, stream);
        chunkBuffers.add(bv);
        dk.add(new DeviceTensor(bk, type, k.batch(), k.heads(), k.tokens(), k.dim()));
        dv.add(new DeviceTensor(bv, type, v.batch(), v.heads(), v.tokens(), v.dim()));
      }
      check("cuMemsetD32Async(poison o)", JCudaDriver.cuMemsetD32Async(dout.ptr, CudaDecode.NAN_BITS, o.length, stream));
      check("cuMemsetD32Async(poison lse)", JCudaDriver.cuMemsetD32Async(dlse.ptr, CudaDecode.NAN_BITS, lse.length, stream));
      try (CudaDecode.Workspace ws = new CudaDecode.Workspace(plan, dk, dv, stream)) {
        CudaDecode.launch(this, plan, ws, new DeviceTensor(dq, type, q.batch(), q.heads(), q.tokens(), q.dim()),
            dqp, dkp, opt, um, dout, dlse, stream);
        copyOutputs(dout, dlse, o, lse, stream);
        recomputed = um != null ? ws.recomputedRows(stream) : 0;
        check("cuStreamSynchronize", JCudaDriver.cuStreamSynchronize(stream));
      }
    } finally {
      chunkBuffers.forEach(DeviceBuffer::close);
      JCudaDriver.cuStreamDestroy(stream);
    }
    int rows = q.batch() * q.tokens();
    return new CpuAttention.DecodeResult(AttentionState.of(o, lse, rows, q.heads(), q.dim()), plan.splits(), recomputed);
  }

  /**
   * Validates a host decode call before any CUDA call: shapes, chunk lists, split length, positions.
   * Runs without a GPU.
   */
  static CudaDecode.Plan hostPlan(Tensor q, List<Tensor> kChunks, List<Tensor> vChunks,
      long[] qPos, long[] kPos, AttentionOptions opt, int splitLen, DType type) {
    Objects.requireNonNull(q, "q");
    Objects.requireNonNull(kChunks, "kChunks");
    Objects.requireNonNull(vChunks, "vChunks");
    Objects.requireNonNull(opt, "opt");
    Objects.requireNonNull(type, "type");
    List<CudaDecode.Shape> ks = new ArrayList<>(), vs = new ArrayList<>();
    for (int c = 0; c < kChunks.size(); c++) {
      ks.add(CudaDecode.Shape.of(Objects.requireNonNull(kChunks.get(c), "k chunk " + c), type));
    }
    for (int c = 0; c < vChunks.size(); c++) {
      vs.add(CudaDecode.Shape.of(Objects.requireNonNull(vChunks.get(c), "v chunk " + c), type));
    }
    CudaDecode.Plan plan = CudaDecode.plan(CudaDecode.Shape.of(q, type), ks, vs, splitLen);
    CudaDecode.checkPositions(plan, qPos, kPos);
    return plan;
  }

  /**
   * Decoding on buffers already on the device, KV as a list of chunks (never concatenated): runs on
   * {@code stream} and waits for it; returns the number of recomputed (row, split) pairs of the
   * unified variant (0 when {@code um} is null). o [B*Tq, H, D] and lse [B*Tq, H] float32;
   * {@code kPos} null means positions 0..Tk-1 of the concatenated keys. For repeated launches of one
   * shape (timing), use {@link CudaDecode#plan}, a {@link CudaDecode.Workspace} and {@link #launchDecode}.
   * The inputs are not scanned, as in {@link #forwardOnDevice}.
   */
  public long decodeOnDevice(DeviceTensor q, List<DeviceTensor> kChunks, List<DeviceTensor> vChunks,
      DeviceBuffer qPos, DeviceBuffer kPos, AttentionOptions opt, int splitLen, UnifiedMax um, DeviceBuffer o,
      DeviceBuffer lse, CUstream stream) {
    CudaDecode.Plan plan = devicePlan(q, kChunks, vChunks, splitLen);
    check("cuCtxSetCurrent", JCudaDriver.cuCtxSetCurrent(context));
    try (CudaDecode.Workspace ws = new CudaDecode.Workspace(plan, kChunks, vChunks, stream)) {
      CudaDecode.launch(this, plan, ws, q, qPos, kPos, opt, um, o, lse, stream);
      long n = um != null ? ws.recomputedRows(stream) : 0;
      check("cuStreamSynchronize", JCudaDriver.cuStreamSynchronize(stream));
      return n;
    }
  }

  /** The plan of a device decode call (validation only, no CUDA call). */
  public static CudaDecode.Plan devicePlan(DeviceTensor q, List<DeviceTensor> kChunks,
      List<DeviceTensor> vChunks, int splitLen) {
    Objects.requireNonNull(q, "q");
    List<CudaDecode.Shape> ks = new ArrayList<>(), vs = new ArrayList<>();
    for (DeviceTensor t : Objects.requireNonNull(kChunks, "kChunks")) {
      ks.add(CudaDecode.Shape.of(t));
    }
    for (DeviceTensor t : Objects.requireNonNull(vChunks, "vChunks")) {
      vs.add(CudaDecode.Shape.of(t));
    }
    CudaDecode.Plan plan = CudaDecode.plan(CudaDecode.Shape.of(q), ks, vs, splitLen);
    for (int c = 0; c < kChunks.size(); c++) {
      requireBytes("k chunk " + c, kChunks.get(c).buffer(), kChunks.get(c).elements() * plan.type().bytes);
      requireBytes("v chunk " + c, vChunks.get(c).buffer(), vChunks.get(c).elements() * plan.type().bytes);
    }
    return plan;
  }

  /** A workspace for repeated {@link #launchDecode} calls of one plan (chunk tables uploaded once). */
  public CudaDecode.Workspace decodeWorkspace(CudaDecode.Plan plan, List<DeviceTensor> kChunks,
      List<DeviceTensor> vChunks, CUstream stream) {
    check("cuCtxSetCurrent", JCudaDriver.cuCtxSetCurrent(context));
    return new CudaDecode.Workspace(plan, kChunks, vChunks, stream);
  }

  /** Launches one decode asynchronously (no host synchronization): see {@link CudaDecode}. */
  public void launchDecode(CudaDecode.Plan plan, CudaDecode.Workspace ws, DeviceTensor q, DeviceBuffer qPos,
      DeviceBuffer kPos, AttentionOptions opt, UnifiedMax um, DeviceBuffer o, DeviceBuffer lse, CUstream stream) {
    CudaDecode.launch(this, plan, ws, q, qPos, kPos, opt, um, o, lse, stream);
  }

  /**
   * Host float32 data as the device element type: float32 as is, or fp16/bf16 bit patterns rounded
   * to nearest even. A value that does not fit (|x| > 65504 for fp16; beyond bf16's range) is an
   * error naming the tensor and the (batch, head, position, dim) index: the kernels would otherwise
   * see infinity.
   */
  static short[] halfBits(Tensor x, DType type, String name) {
    if (type == DType.F32) {
      throw new IllegalArgumentException("halfBits converts to fp16 or bf16, not " + type);
    }
    float[] f = x.data();
    short[] bits = new short[f.length];
    for (int i = 0; i < f.length; i++) {
      float val = f[i];
      short h;
      if (type == DType.F16) {
        if (Math.abs(val) > 65504f) {
          throw overflow(x, name, i, val, "fp16 (largest finite value 65504)");
        }
        h = HalfFloats.floatToHalf(val);
      } else {
        h = HalfFloats.floatToBf16(val);
        if (Float.isFinite(val) && Float.isInfinite(HalfFloats.bf16ToFloat(h))) {
          throw overflow(x, name, i, val, "bf16");
        }
      }
      bits[i] = h;
    }
    return bits;
  }

  private static IllegalArgumentException overflow(Tensor x, String name, int i, float val, String what) {
    int d = i % x.dim(), rest = i / x.dim();
    int t = rest % x.tokens(), bh = rest / x.tokens();
    return new IllegalArgumentException(name + " " + x.shape() + " holds " + val + " at (batch " + bh / x.heads()
        + ", head " + bh % x.heads() + ", position " + t + ", dim " + d + "), which overflows " + what);
  }

  /** x on the device as {@code type} (fp16/bf16 through {@link #halfBits}, float32 as is). */
  static DeviceBuffer upload(Tensor x, DType type, String name, CUstream stream) {
    return upload(hostData(x, type, name), x.data().length * (long) type.bytes, stream);
  }

  /**
   * Refuses host q and k large enough for some q.k to overflow float32 ({@link Tensor#qkMayOverflow}),
   * before anything is sent: without a softcap the kernels weigh a key whose q.k overflowed to
   * -Infinity as if it were masked, a finite wrong answer (docs/CUDA.md). The kernels multiply the raw
   * q.k by the scale (the tensor-core one by scale times log2 e), so the larger of 1 and twice the
   * scale bounds every intermediate. Entries near 1e15 and beyond at T = 16384, 8 heads, D 128; the
   * CPU kernels, which check each score, compute or refuse such a call.
   */
  static void requireNoQkOverflow(Tensor q, List<Tensor> kChunks, AttentionOptions opt) {
    double k2 = 0;
    for (Tensor k : kChunks) {
      k2 += k.sumOfSquares();
    }
    double q2 = q.sumOfSquares(), factor = Math.max(1, 2 * opt.scaleFor(q.dim()));
    if (Tensor.qkMayOverflow(q2, k2, factor)) {
      throw new QkMayOverflowException("q " + q.shape() + " and k hold values large enough for a q.k to overflow "
          + "float32, or NaN or Infinity (|q| |k| = " + (float) Math.sqrt(q2 * k2) + ", times " + (float) factor
          + ", is not below " + (float) Tensor.QK_BOUND + "): the CUDA kernels would take an overflowed q.k as a "
          + "masked key; the CPU backend checks each score");
    }
  }

  /** x's elements on the host as {@code type}: its own float array, or fp16/bf16 bits from {@link #halfBits}. */
  static Pointer hostData(Tensor x, DType type, String name) {
    return type == DType.F32 ? Pointer.to(x.data()) : Pointer.to(halfBits(x, type, name));
  }

  static DeviceBuffer upload(Pointer host, long bytes, CUstream stream) {
    DeviceBuffer b = new DeviceBuffer(bytes);
    copyIn(b, host, stream);
    return b;
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

  /** The CUDA kernels through JCuda: usable where the driver, a device and the fatbins are. */
  public static final class Provider implements AttentionBackendProvider {
    @Override
    public String name() {
      return "cuda";
    }

    @Override
    public int priority() {
      return 100;
    }

    @Override
    public String unavailableReason() {
      CudaProbe.Status s = CudaProbe.status();
      return s.available() ? null : s.reason();
    }

    @Override
    public AttentionBackend open(int device) {
      return CudaAttention.instance(device);
    }
  }
}
