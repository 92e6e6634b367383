package io.longctx.kernels;

import java.util.ArrayList;
import java.util.List;
import java.util.Objects;
import jcuda.NativePointerObject;
import jcuda.Pointer;
import jcuda.driver.CUdeviceptr;
import jcuda.driver.CUfunction;
import jcuda.driver.CUfunction_attribute;
import jcuda.driver.CUstream;
import jcuda.driver.JCudaDriver;

/**
 * Split-K decoding on the GPU (flash_decode.cu): a few query rows per sequence over a KV sequence
 * of any length, handed as a list of chunks that are never concatenated.
 *
 * <p>Splits are fixed-length windows of the concatenated key sequence ({@code [s * splitLen,
 * (s + 1) * splitLen)}); a split that crosses a chunk boundary reads from both chunks. So for a fixed
 * split length a sequence's result depends neither on what else is in the batch nor on how its
 * KV was chunked. One CTA per (batch, kv head, split, row block) handles every query row of the kv
 * head's GQA group, reading each K/V tile once; partial states are float32 (o) and float64 (lse);
 * a combine kernel merges them, one warp per row sharing out the splits, in a fixed order (deterministic). The
 * FlashDecoding++ variant ({@link UnifiedMax}) runs the partials with
 * a fixed phi, flags (row, split) pairs whose logits leave the bounds, recomputes exactly those
 * with the synchronized kernel, and counts them.
 *
 * <p>Everything here that does not launch a kernel (shape and chunk validation, the launch
 * geometry, the fp16 range check of host data) runs without a GPU and is tested in CI.
 */
public final class CudaDecode {

  /** Keys per tile and threads per CTA in flash_decode.cu. */
  static final int TILE = 32;
  static final int THREADS = 128;
  static final int WARPS = 4;
  static final int STAGES = 2;
  /** Tensor-core partials: the most rows per CTA (two m16 blocks) and the largest head dim. */
  static final int TC_MAX_ROWS = 32;
  static final int TC_MAX_DIM = 128;
  /** A quiet NaN's float32 bits, for poisoning buffers before kernels write them. */
  static final int NAN_BITS = 0x7FC00000;
  /** Shared memory a kernel may use without opting in. */
  static final int DEFAULT_SMEM = 48 * 1024;

  private CudaDecode() {}

  /** The shape of a tensor as the decode kernels see it. */
  public record Shape(CudaAttention.DType type, int batch, int heads, int tokens, int dim) {
    static Shape of(CudaAttention.DeviceTensor t) {
      return new Shape(t.type(), t.batch(), t.heads(), t.tokens(), t.dim());
    }

    static Shape of(Tensor t, CudaAttention.DType type) {
      return new Shape(type, t.batch(), t.heads(), t.tokens(), t.dim());
    }

    @Override
    public String toString() {
      return "[" + batch + ", " + heads + ", " + tokens + ", " + dim + "] " + type;
    }
  }

  /**
   * A validated decode call and its launch geometry: which kernels, how many splits and row blocks,
   * how much shared memory. Built without touching CUDA.
   */
  public record Plan(CudaAttention.DType type, int batch, int heads, int kvHeads, int tq, int dim, long tk,
      long[] chunkStart, int splitLen, int splits, int rowsPerCta, int rowBlocks, int dmax, int rowsPerWarp,
      boolean tensorCores, int smemBytes) {

    /** (row, head) entries of the final state: B * Tq * H. */
    public long states() {
      return (long) batch * tq * heads;
    }

    public String syncKernel() {
      return tensorCores ? tcKernelName(false, type) : kernelName(false, type, dmax, rowsPerWarp);
    }

    public String unifiedKernel() {
      return tensorCores ? tcKernelName(true, type) : kernelName(true, type, dmax, rowsPerWarp);
    }

    /**
     * Threads per CTA of the partial kernels: {@link #THREADS} on CUDA cores; on tensor cores two
     * warps per m16 block of rows (64 or 128), each over half of every tile's keys: a warp without rows
     * would only load, and one warp per block left an SM too few warps to hide latency (docs/CUDA.md).
     */
    public int threads() {
      return tensorCores ? 64 * ((rowsPerCta + 15) / 16) : THREADS;
    }

    /** The same call, same row blocks, on the CUDA-core partials (a GPU check's comparison row). */
    Plan onCudaCores() {
      return new Plan(type, batch, heads, kvHeads, tq, dim, tk, chunkStart, splitLen, splits, rowsPerCta, rowBlocks,
          dmax, cudaCoreRowsPerWarp(rowsPerCta, dmax), false, CudaDecode.smemBytes(type, dim, rowsPerCta, false));
    }

    /** Bytes of K and V one decode reads: each key of each kv head once, K and V. */
    public long kvBytes() {
      return 2L * batch * kvHeads * tk * dim * type.bytes;
    }
  }

  static String kernelName(boolean unified, CudaAttention.DType type, int dmax, int rowsPerWarp) {
    return "longctx_decode_" + (unified ? "unified_" : "sync_") + type.suffix + "_d" + dmax + "_r" + rowsPerWarp;
  }

  /** The tensor-core partial kernels (fp16/bf16, D a multiple of 16 up to {@link #TC_MAX_DIM}). */
  static String tcKernelName(boolean unified, CudaAttention.DType type) {
    return "longctx_decode_tc_" + (unified ? "unified_" : "sync_") + type.suffix + "_d" + TC_MAX_DIM;
  }

  /**
   * Whether a decode runs on the tensor-core partials (mma.sync m16n8k16): fp16/bf16 with D a multiple
   * of 16 up to 128, whatever the row count (on an H200 they beat the CUDA-core kernel at 4, 16 and
   * 64 rows, 1.5-9x; fewer rows were not timed; docs/BENCHMARKS.md). A function of (type, D) only, never of the batch or the rows, so a row's bits
   * do not depend on what else is decoded with it.
   */
  static boolean usesTensorCores(CudaAttention.DType type, int dim) {
    return type != CudaAttention.DType.F32 && dim % 16 == 0 && dim <= TC_MAX_DIM;
  }

  /** Every decode kernel in flash_decode.fatbin. */
  static List<String> kernelNames() {
    List<String> names = new ArrayList<>();
    for (CudaAttention.DType t : CudaAttention.DType.values()) {
      for (int dmax : new int[] {128, 256}) {
        for (int rpw : new int[] {2, largeRowsPerWarp(dmax)}) {
          names.add(kernelName(false, t, dmax, rpw));
          names.add(kernelName(true, t, dmax, rpw));
        }
      }
    }
    for (CudaAttention.DType t : new CudaAttention.DType[] {CudaAttention.DType.F16, CudaAttention.DType.BF16}) {
      names.add(tcKernelName(false, t));
      names.add(tcKernelName(true, t));
    }
    names.add("longctx_decode_combine");
    return names;
  }

  private static int largeRowsPerWarp(int dmax) {
    return dmax == 128 ? 16 : 8;
  }

  /**
   * Most rows one CTA takes: on CUDA cores 4 warps x rows per warp, float32 at D 256 held to 16 by
   * shared memory; on tensor cores two m16 blocks (q lives in V's last stage, {@link #TILE} rows).
   */
  static int maxRowsPerCta(CudaAttention.DType type, int dim) {
    if (usesTensorCores(type, dim)) {
      return TC_MAX_ROWS;
    }
    return type == CudaAttention.DType.F32 && dim > 128 ? 16 : WARPS * largeRowsPerWarp(dim <= 128 ? 128 : 256);
  }

  private static int cudaCoreRowsPerWarp(int rowsPerCta, int dmax) {
    return rowsPerCta <= 2 * WARPS ? 2 : largeRowsPerWarp(dmax);
  }

  /**
   * Dynamic shared memory of a partial kernel (the Smem struct in flash_decode.cu): K/V stages, then
   * q as float and p per row (CUDA cores; the tensor-core kernels keep q in V's last stage, so at
   * most {@link #TILE} rows), then positions and the row list.
   */
  static int smemBytes(CudaAttention.DType type, int dim, int rows, boolean tensorCores) {
    if (tensorCores && rows > TILE) {
      throw new IllegalArgumentException("tensor-core decode CTAs hold at most " + TILE + " rows, got " + rows);
    }
    int stride = dim + 16 / type.bytes;
    long kv = 2L * STAGES * TILE * stride * type.bytes;
    long q = tensorCores ? 0 : 4L * rows * dim + 4L * rows * TILE;
    return Math.toIntExact(kv + q + 8L * rows + 4L * rows);
  }

  /**
   * Validates a decode call and computes its geometry: q [B, H, Tq, D]; k and v chunk i
   * [B, Hkv, len_i, D], every chunk of one element type with q; D a multiple of 8 up to 256;
   * H a multiple of Hkv; splitLen >= 1.
   */
  public static Plan plan(Shape q, List<Shape> kChunks, List<Shape> vChunks, int splitLen) {
    Objects.requireNonNull(q, "q");
    Objects.requireNonNull(kChunks, "kChunks");
    Objects.requireNonNull(vChunks, "vChunks");
    if (kChunks.isEmpty() || kChunks.size() != vChunks.size()) {
      throw new IllegalArgumentException("decode needs one or more KV chunks and as many v chunks as k chunks, got "
          + kChunks.size() + " k and " + vChunks.size() + " v chunks");
    }
    if (splitLen < 1) {
      throw new IllegalArgumentException("splitLen must be >= 1, got " + splitLen);
    }
    if (q.tokens() < 1) {
      throw new IllegalArgumentException("decode needs at least one query token, got q " + q);
    }
    if (q.dim() % 8 != 0 || q.dim() > CudaAttention.MAX_DIM) {
      throw new IllegalArgumentException("unsupported head dim " + q.dim()
          + " for CUDA decoding: a multiple of 8 up to " + CudaAttention.MAX_DIM + " (16-byte K/V loads)");
    }
    Shape k0 = kChunks.get(0);
    long[] start = new long[kChunks.size() + 1];
    for (int c = 0; c < kChunks.size(); c++) {
      Shape k = Objects.requireNonNull(kChunks.get(c), "k chunk " + c);
      Shape v = Objects.requireNonNull(vChunks.get(c), "v chunk " + c);
      if (k.type() != q.type() || v.type() != q.type()) {
        throw new IllegalArgumentException("q and every KV chunk must share one element type: q is " + q.type()
            + ", k chunk " + c + " " + k.type() + ", v chunk " + c + " " + v.type());
      }
      if (!k.equals(v)) {
        throw new IllegalArgumentException("k chunk " + c + " " + k + " and v chunk " + c + " " + v + " differ");
      }
      if (k.batch() != q.batch() || k.dim() != q.dim() || k.heads() != k0.heads()) {
        throw new IllegalArgumentException("KV chunk " + c + " " + k + " does not fit q " + q + " and chunk 0 " + k0
            + " (need q's batch and dim, and chunk 0's kv heads)");
      }
      start[c + 1] = start[c] + k.tokens();
    }
    if (q.heads() % k0.heads() != 0) {
      throw new IllegalArgumentException("query heads (" + q.heads() + ") must be a multiple of kv heads ("
          + k0.heads() + "), got q " + q + " and k " + k0);
    }
    long tk = start[kChunks.size()];
    int group = q.heads() / k0.heads();
    long splits = Math.max(1, (tk + splitLen - 1) / splitLen);
    int dmax = q.dim() <= 128 ? 128 : 256;
    long groupRows = (long) group * q.tokens();
    int maxRows = maxRowsPerCta(q.type(), q.dim());
    int rowBlocks = Math.toIntExact((groupRows + maxRows - 1) / maxRows);
    int rowsPerCta = Math.toIntExact((groupRows + rowBlocks - 1) / rowBlocks);
    boolean tc = usesTensorCores(q.type(), q.dim());
    int rowsPerWarp = tc ? 16 : cudaCoreRowsPerWarp(rowsPerCta, dmax); // tensor cores: one m16 block per warp
    if (splits * rowBlocks > Integer.MAX_VALUE || k0.heads() > 65535 || q.batch() > 65535) {
      throw new IllegalArgumentException("decode grid too large: " + splits + " splits x " + rowBlocks
          + " row blocks, " + k0.heads() + " kv heads, batch " + q.batch() + " (raise splitLen)");
    }
    long states = (long) q.batch() * q.tokens() * q.heads();
    if (states * splits * q.dim() > Integer.MAX_VALUE * 4L) {
      throw new IllegalArgumentException("decode partial states too large: " + states + " rows x " + splits
          + " splits x " + q.dim() + " floats (raise splitLen)");
    }
    return new Plan(q.type(), q.batch(), q.heads(), k0.heads(), q.tokens(), q.dim(), tk, start, splitLen,
        (int) splits, rowsPerCta, rowBlocks, dmax, rowsPerWarp, tc, smemBytes(q.type(), q.dim(), rowsPerCta, tc));
  }

  /**
   * Device buffers one decode needs besides its inputs and outputs: partial states, flags and the
   * recompute counter, and the chunk tables (pointers and starts). Freed on close.
   */
  public static final class Workspace implements AutoCloseable {
    final Plan plan;
    final CudaAttention.DeviceBuffer partO, partLse, flags, counter, kPtrs, vPtrs, starts;

    Workspace(Plan plan, List<CudaAttention.DeviceTensor> kChunks, List<CudaAttention.DeviceTensor> vChunks,
        CUstream stream) {
      this.plan = plan;
      List<CudaAttention.DeviceBuffer> made = new ArrayList<>();
      try {
        long partials = plan.states() * plan.splits();
        partO = add(made, new CudaAttention.DeviceBuffer(4L * partials * plan.dim()));
        partLse = add(made, new CudaAttention.DeviceBuffer(8L * partials)); // float64: see flash_decode.cu
        flags = add(made, new CudaAttention.DeviceBuffer(partials));
        counter = add(made, new CudaAttention.DeviceBuffer(8));
        int n = kChunks.size();
        kPtrs = add(made, new CudaAttention.DeviceBuffer(8L * n));
        vPtrs = add(made, new CudaAttention.DeviceBuffer(8L * n));
        starts = add(made, new CudaAttention.DeviceBuffer(8L * (n + 1)));
        // Poisoned: a partial state no kernel wrote shows up as NaN in the combined result.
        CudaAttention.check("cuMemsetD32Async(poison partial o)",
            JCudaDriver.cuMemsetD32Async(partO.ptr, NAN_BITS, partials * plan.dim(), stream));
        CudaAttention.check("cuMemsetD32Async(poison partial lse)",
            JCudaDriver.cuMemsetD32Async(partLse.ptr, NAN_BITS, 2 * partials, stream)); // NaN doubles too
        NativePointerObject[] kp = new NativePointerObject[n], vp = new NativePointerObject[n];
        for (int c = 0; c < n; c++) {
          kp[c] = kChunks.get(c).buffer().ptr;
          vp[c] = vChunks.get(c).buffer().ptr;
        }
        CudaAttention.check("cuMemcpyHtoD(k chunk table)", JCudaDriver.cuMemcpyHtoD(kPtrs.ptr, Pointer.to(kp), 8L * n));
        CudaAttention.check("cuMemcpyHtoD(v chunk table)", JCudaDriver.cuMemcpyHtoD(vPtrs.ptr, Pointer.to(vp), 8L * n));
        CudaAttention.check("cuMemcpyHtoDAsync(chunk starts)",
            JCudaDriver.cuMemcpyHtoDAsync(starts.ptr, Pointer.to(plan.chunkStart()), 8L * (n + 1), stream));
      } catch (RuntimeException e) {
        made.forEach(CudaAttention.DeviceBuffer::close);
        throw e;
      }
    }

    private static CudaAttention.DeviceBuffer add(List<CudaAttention.DeviceBuffer> made, CudaAttention.DeviceBuffer b) {
      made.add(b);
      return b;
    }

    /** The FlashDecoding++ recompute count of the last unified launch; synchronizes the stream. */
    public long recomputedRows(CUstream stream) {
      long[] n = new long[1];
      CudaAttention.check("cuMemcpyDtoHAsync(recompute count)",
          JCudaDriver.cuMemcpyDtoHAsync(Pointer.to(n), counter.ptr, 8, stream));
      CudaAttention.check("cuStreamSynchronize", JCudaDriver.cuStreamSynchronize(stream));
      return n[0];
    }

    @Override
    public void close() {
      for (CudaAttention.DeviceBuffer b : new CudaAttention.DeviceBuffer[] {partO, partLse, flags, counter, kPtrs, vPtrs, starts}) {
        b.close();
      }
    }
  }

  /**
   * Launches one decode asynchronously on {@code stream}: partial kernel(s), then the combine into
   * o [B*Tq, H, D] and lse [B*Tq, H] float32. {@code kPos} may be null (positions 0..Tk-1 of the
   * concatenated keys, which also lets splits skip keys no row can see). With {@code um} non-null the
   * unified-max kernel runs first and the synchronized kernel redoes the flagged (row, split) pairs;
   * read the count with {@link Workspace#recomputedRows}.
   */
  static void launch(CudaAttention cuda, Plan plan, Workspace ws, CudaAttention.DeviceTensor q,
      CudaAttention.DeviceBuffer qPos, CudaAttention.DeviceBuffer kPos, AttentionOptions opt, UnifiedMax um,
      CudaAttention.DeviceBuffer o, CudaAttention.DeviceBuffer lse, CUstream stream) {
    Objects.requireNonNull(opt, "opt");
    if (ws.plan != plan) {
      throw new IllegalArgumentException("the workspace was made for another decode plan");
    }
    requireBytes("q", q.buffer(), q.elements() * q.type().bytes);
    requireBytes("qPos", qPos, 8L * plan.tq());
    if (kPos != null) {
      requireBytes("kPos", kPos, 8L * plan.tk());
    }
    requireBytes("o", o, 4L * plan.states() * plan.dim());
    requireBytes("lse", lse, 4L * plan.states());
    float qscale = opt.scoreScale(plan.dim()); // folded into q: s = cap * tanh(q'.k) when capping
    CUdeviceptr none = new CUdeviceptr();
    CUdeviceptr kp = kPos != null ? kPos.ptr : none;
    CudaAttention.check("cuCtxSetCurrent", JCudaDriver.cuCtxSetCurrent(cuda.context()));
    if (um != null) {
      CudaAttention.check("cuMemsetD32Async(recompute count)", JCudaDriver.cuMemsetD32Async(ws.counter.ptr, 0, 2, stream));
      partial(cuda, plan, plan.unifiedKernel(), ws, q, qPos, kp, ws.flags.ptr, ws.counter.ptr, none, opt, qscale, um, stream);
      partial(cuda, plan, plan.syncKernel(), ws, q, qPos, kp, none, none, ws.flags.ptr, opt, qscale, null, stream);
    } else {
      partial(cuda, plan, plan.syncKernel(), ws, q, qPos, kp, none, none, none, opt, qscale, null, stream);
    }
    long states = plan.states();
    Pointer params = Pointer.to(Pointer.to(ws.partO.ptr), Pointer.to(ws.partLse.ptr),
        Pointer.to(new int[] {plan.splits()}), Pointer.to(new int[] {plan.dim()}), Pointer.to(new long[] {states}),
        Pointer.to(o.ptr), Pointer.to(lse.ptr));
    CudaAttention.check("cuLaunchKernel(longctx_decode_combine)", JCudaDriver.cuLaunchKernel(
        cuda.kernel("longctx_decode_combine"), Math.toIntExact((states + WARPS - 1) / WARPS), 1, 1,
        THREADS, 1, 1, 0, stream, params, null));
  }

  private static void partial(CudaAttention cuda, Plan plan, String name, Workspace ws, CudaAttention.DeviceTensor q,
      CudaAttention.DeviceBuffer qPos, CUdeviceptr kPos, CUdeviceptr flags, CUdeviceptr counter, CUdeviceptr redo,
      AttentionOptions opt, float qscale, UnifiedMax um, CUstream stream) {
    CUfunction f = cuda.kernel(name);
    if (plan.smemBytes() > DEFAULT_SMEM) {
      CudaAttention.check("cuFuncSetAttribute(" + name + ", max dynamic shared memory " + plan.smemBytes() + ")",
          JCudaDriver.cuFuncSetAttribute(f, CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
              plan.smemBytes()));
    }
    Pointer params = Pointer.to(
        Pointer.to(q.buffer().ptr), Pointer.to(ws.kPtrs.ptr), Pointer.to(ws.vPtrs.ptr), Pointer.to(ws.starts.ptr),
        Pointer.to(new int[] {plan.chunkStart().length - 1}), Pointer.to(qPos.ptr), Pointer.to(kPos),
        Pointer.to(ws.partO.ptr), Pointer.to(ws.partLse.ptr), Pointer.to(flags), Pointer.to(counter), Pointer.to(redo),
        Pointer.to(new int[] {plan.heads()}), Pointer.to(new int[] {plan.kvHeads()}), Pointer.to(new int[] {plan.tq()}),
        Pointer.to(new int[] {plan.dim()}), Pointer.to(new long[] {plan.tk()}), Pointer.to(new int[] {plan.splitLen()}),
        Pointer.to(new int[] {plan.splits()}), Pointer.to(new int[] {plan.rowsPerCta()}),
        Pointer.to(new float[] {qscale}), Pointer.to(new float[] {opt.softcap()}),
        Pointer.to(new int[] {opt.causal() ? 1 : 0}), Pointer.to(new long[] {opt.window()}),
        Pointer.to(new float[] {um != null ? um.phi() : 0f}),
        Pointer.to(new float[] {um != null ? um.lower() : UnifiedMax.DEFAULT_LOWER}),
        Pointer.to(new float[] {um != null ? um.upper() : UnifiedMax.DEFAULT_UPPER}));
    CudaAttention.check("cuLaunchKernel(" + name + ")", JCudaDriver.cuLaunchKernel(f,
        plan.splits() * plan.rowBlocks(), plan.kvHeads(), plan.batch(), plan.threads(), 1, 1, plan.smemBytes(), stream,
        params, null));
  }

  static void requireBytes(String what, CudaAttention.DeviceBuffer b, long need) {
    Objects.requireNonNull(b, what);
    if (b.bytes < need) {
      throw new IllegalArgumentException(what + " buffer holds " + b.bytes + " bytes, needs " + need);
    }
  }

  /** Validates the host-side positions of a decode call. */
  static void checkPositions(Plan plan, long[] qPos, long[] kPos) {
    if (qPos != null && qPos.length != plan.tq()) {
      throw new IllegalArgumentException("qPos has " + qPos.length + " positions for " + plan.tq() + " query tokens");
    }
    if (kPos != null && kPos.length != plan.tk()) {
      throw new IllegalArgumentException("kPos has " + kPos.length + " positions for " + plan.tk()
          + " key tokens (all chunks together)");
    }
  }
}
