package io.longctx.kernels;

import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CancellationException;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ForkJoinPool;
import java.util.concurrent.ForkJoinTask;
import java.util.concurrent.ForkJoinWorkerThread;
import java.util.concurrent.atomic.AtomicReference;
import java.util.function.IntConsumer;
import java.util.stream.IntStream;

/**
 * Attention kernels in Java (Vector API), producing {@link AttentionState}s:
 *
 * <ul>
 *   <li>{@link #forward}: FlashAttention forward of queries [B, H, Tq, D] over one key/value chunk
 *       [B, Hkv, Tk, D], tiled, with an online softmax; never more than one tile of scores.
 *   <li>{@link #decode}: split-K (Flash-Decoding) for a few query rows over a long KV sequence: the
 *       keys are cut into splits of a fixed length, splits run in parallel, and their states merge
 *       in a fixed order. Query heads sharing a kv head are packed together so K/V are read once.
 *   <li>{@link #decodeUnifiedMax}: the same with the FlashDecoding++ unified maximum.
 * </ul>
 *
 * Positions are absolute token indices (null means 0..T-1), shared by every batch entry; masks
 * follow {@link AttentionOptions}. Work runs on one fork-join pool of the kernels ({@link #POOL}), parallel
 * over (batch, head, query block) or (batch, kv head, split). Instances are immutable and thread-safe.
 */
public final class CpuAttention implements AttentionBackend {

  static { // before the fields below touch TileMath, whose vectors need the module: its message, not a bare
    VectorSupport.require(); // NoClassDefFoundError of a Vector class, is then the first failure's cause
  }

  /** Head dims above this are rejected (workspaces are sized by it). */
  public static final int MAX_DIM = 1024;
  /** Default split length for split-K decoding, in keys. */
  public static final int DEFAULT_SPLIT_LEN = 4096;

  /** Upper bound of query blocks per key sweep (docs/BENCHMARKS.md, "Loop order"). */
  public static final int DEFAULT_MAX_BLOCKS_PER_SWEEP = 8;

  /**
   * Query rows per block by default: 32, or enough lanes for the four-vector inner loops where they
   * run (64 with 512-bit vectors). Measured, docs/BENCHMARKS.md.
   */
  public static final int DEFAULT_BLOCK_Q = Math.max(32, (TileMath.WIDE ? 2 : 1) * TileMath.GROUP);

  /**
   * Split-K decoding and the forward put the keys in the SIMD lanes ({@link KeyLaneWorker}) for a kv
   * head with at most this many query rows (its query heads times the query tokens): half a lane
   * group, 16 rows with 512-bit vectors, 8 with 256-bit. Measured, docs/BENCHMARKS.md.
   */
  public static final int DEFAULT_KEY_LANE_ROWS = TileMath.GROUP / 2;

  /** Tile sizes chosen by measurement (docs/BENCHMARKS.md). */
  public static final CpuAttention DEFAULT = new CpuAttention(DEFAULT_BLOCK_Q, 128);

  /**
   * The kernels' worker pool, one thread per core, shared by every caller. Not the common pool: with
   * two threads calling at once (two Spark tasks, two inference threads) on a 2-core machine, whose
   * common pool has one worker, the same kernel calls took twice as long as one after another; on
   * this pool they take the same time within noise (docs/BENCHMARKS.md, "Spark job").
   */
  static final ForkJoinPool POOL = newPool();

  private static ForkJoinPool newPool() {
    // Numbered here: a new worker's pool index is not assigned until it starts (every thread was "-0").
    java.util.concurrent.atomic.AtomicInteger made = new java.util.concurrent.atomic.AtomicInteger();
    return new ForkJoinPool(Runtime.getRuntime().availableProcessors(), pool -> {
      ForkJoinWorkerThread t = ForkJoinPool.defaultForkJoinWorkerThreadFactory.newThread(pool);
      t.setName("longctx-kernel-" + made.getAndIncrement());
      return t;
    }, null, false);
  }

  /**
   * body(0 .. tasks-1) on {@link #POOL}; the caller waits (or, on a pool thread, takes part). The first
   * exception of the body reaches the caller as itself (fork-join would hand back a copy). An
   * interrupted caller gets a {@link CancellationException} (its interrupt flag set again) once the
   * bodies already started have ended; the rest do not start. Public for
   * callers' bulk copies around a kernel call (AttentionOp's input and output copies), which then
   * share the kernels' threads instead of starting their own.
   */
  public static void parallelFor(int tasks, IntConsumer body) {
    AtomicReference<Throwable> failed = new AtomicReference<>();
    Runnable loop = () -> IntStream.range(0, tasks).parallel().forEach(i -> {
      if (failed.get() == null) {
        try {
          body.accept(i);
        } catch (Throwable t) {
          failed.compareAndSet(null, t);
        }
      }
    });
    if (Thread.currentThread() instanceof ForkJoinWorkerThread w && w.getPool() == POOL) {
      loop.run(); // already on the pool: the stream's forks stay on it
    } else {
      ForkJoinTask<?> job = POOL.submit(loop);
      boolean interrupted = false;
      while (true) {
        try {
          job.get();
          break;
        } catch (InterruptedException e) {
          // No new index starts, but the bodies under way still write into the caller's outputs (the
          // operator's libtorch array, freed once the caller gives up): return only when they are done.
          interrupted = true;
          failed.compareAndSet(null, new CancellationException("interrupted while the attention kernel ran"));
        } catch (ExecutionException e) {
          failed.compareAndSet(null, e.getCause());
          break;
        }
      }
      if (interrupted) {
        Thread.currentThread().interrupt();
      }
    }
    Throwable t = failed.get();
    if (t instanceof RuntimeException r) {
      throw r;
    }
    if (t instanceof Error err) {
      throw err;
    }
    if (t != null) {
      throw new IllegalStateException(t);
    }
  }

  private static final java.util.concurrent.atomic.LongAdder TILE_STEPS = new java.util.concurrent.atomic.LongAdder();

  /**
   * (Query block, key tile) steps with visible keys that the kernels have run in this JVM, all
   * instances together. The JIT compiles the kernels' inner loops after counts of calls, so this says
   * how far a JVM's kernels can have come towards their compiled speed (AttentionOp's calibration
   * waits for it before it times the Java path).
   */
  public static long tileSteps() {
    return TILE_STEPS.sum();
  }

  /**
   * Tile steps of 64-row query blocks after which a JVM's forward kernel runs at its compiled speed:
   * on a Zen 5 (2026-11-25) [1,8,T,128] calls reached it after 7,500 steps (T = 1024 causal) to 33,000
   * (T = 2048), and ran at 2-3x their final time before (docs/BENCHMARKS.md, "Zen 5: forward sweep,
   * calibration on a cold JIT").
   */
  public static final long JIT_WARM_TILE_STEPS = 40_000;

  /**
   * {@link #JIT_WARM_TILE_STEPS} in steps of this JVM's default block (twice as many where it has 32
   * rows, as with 256-bit vectors: each does half the work; with AVX2 code, calls still ran 1.3-2x
   * their settled time for 12-30 calls after 40,000 such steps, docs/BENCHMARKS.md), scaled as the
   * JVM scales its compile thresholds ({@code -XX:CompileThresholdScaling}; unscaled where the JVM
   * does not say, without java.management).
   */
  static long jitWarmTileSteps() {
    double scaling = 1;
    try {
      String v = java.lang.management.ManagementFactory
          .getPlatformMXBean(com.sun.management.HotSpotDiagnosticMXBean.class)
          .getVMOption("CompileThresholdScaling").getValue();
      scaling = Double.parseDouble(v);
    } catch (LinkageError | RuntimeException e) {
      // not a HotSpot JVM, or a runtime without java.management: the unscaled count
    }
    double perBlock = 64.0 / DEFAULT_BLOCK_Q;
    return (long) Math.ceil(JIT_WARM_TILE_STEPS * perBlock * Math.max(scaling, 0.01));
  }

  /**
   * Brings the forward kernel to its compiled speed before someone times it: runs it on a fixed
   * synthetic problem ([1, 8, 1024, 128], causal and not, seeded inputs) until this JVM's kernels have
   * run {@link #jitWarmTileSteps} tile steps or {@code budgetNanos} have passed. Every other call reads
   * and writes buffers ({@link BufferTensor}), as a DJL operator's calls do: their row and tile copies
   * were still being compiled during the operator's first calibration otherwise (docs/BENCHMARKS.md,
   * "The operator's calibration and the JIT"). Returns at once in a JVM that is already there;
   * otherwise costs a few hundred milliseconds beyond the compilation the first real call would have
   * paid anyway.
   *
   * @return whether the JVM has run the steps
   */
  public static boolean warmUpJit(long budgetNanos) {
    long need = jitWarmTileSteps();
    if (tileSteps() >= need) {
      return true;
    }
    java.util.SplittableRandom rng = new java.util.SplittableRandom(20261125);
    int h = 8, t = 1024, d = 128;
    Tensor[] qkv = {Tensor.random(rng, 1, h, t, d), Tensor.random(rng, 1, h, t, d), Tensor.random(rng, 1, h, t, d)};
    BufferTensor[] buffers = new BufferTensor[3];
    for (int i = 0; i < 3; i++) {
      buffers[i] = BufferTensor.bhtd(directFloats(qkv[i].data().length).put(0, qkv[i].data()), 1, h, t, d);
    }
    BufferTensor o = BufferTensor.bhtd(directFloats(h * t * d), 1, h, t, d);
    java.nio.FloatBuffer lse = directFloats(h * t);
    long start = System.nanoTime();
    for (int call = 0; tileSteps() < need; call++) {
      if (System.nanoTime() - start > budgetNanos) {
        return false;
      }
      AttentionOptions opt = AttentionOptions.DEFAULT.withCausal(call % 2 == 1);
      if (call % 4 < 2) {
        DEFAULT.forward(qkv[0], qkv[1], qkv[2], null, null, opt);
      } else {
        DEFAULT.forward(buffers[0], buffers[1], buffers[2], null, null, opt, o, lse);
      }
    }
    return true;
  }

  private static java.nio.FloatBuffer directFloats(int n) {
    return java.nio.ByteBuffer.allocateDirect(4 * n).order(java.nio.ByteOrder.nativeOrder()).asFloatBuffer();
  }

  private final int blockQ;
  private final int blockK;
  private final int maxBlocksPerSweep;
  private final int keyLaneRows;
  private final ThreadLocal<TileWorker[]> workers = new ThreadLocal<>();
  private final ThreadLocal<KeyLaneWorker> keyLaneWorkers = new ThreadLocal<>();

  /**
   * @param blockQ query rows per block, a multiple of {@link #laneGroup()}
   * @param blockK keys per tile
   */
  public CpuAttention(int blockQ, int blockK) {
    this(blockQ, blockK, DEFAULT_MAX_BLOCKS_PER_SWEEP);
  }

  /**
   * @param blockQ query rows per block, a multiple of {@link #laneGroup()}
   * @param blockK keys per tile
   * @param maxBlocksPerSweep at most this many query blocks of one head sweep the keys together,
   *     tile by tile, in one task of {@link #forward} (1: each block sweeps all keys alone)
   */
  public CpuAttention(int blockQ, int blockK, int maxBlocksPerSweep) {
    this(blockQ, blockK, maxBlocksPerSweep, DEFAULT_KEY_LANE_ROWS);
  }

  /**
   * @param blockQ query rows per block, a multiple of {@link #laneGroup()}
   * @param blockK keys per tile
   * @param maxBlocksPerSweep see {@link #CpuAttention(int, int, int)}
   * @param keyLaneRows split-K decoding and the forward run a kv head's rows (its query heads times the
   *     query tokens) with the keys in the SIMD lanes when there are at most this many and at most
   *     blockQ (0: never); the same bits either way
   */
  public CpuAttention(int blockQ, int blockK, int maxBlocksPerSweep, int keyLaneRows) {
    VectorSupport.require();
    if (blockQ < TileMath.GROUP || blockQ % TileMath.GROUP != 0 || blockK < 1) {
      throw new IllegalArgumentException("blockQ must be a positive multiple of " + TileMath.GROUP
          + " and blockK positive, got blockQ=" + blockQ + " blockK=" + blockK);
    }
    if ((long) blockQ * blockK > Integer.MAX_VALUE - 8) { // one tile of scores is one array
      throw new IllegalArgumentException("blockQ x blockK must fit one array of scores, got " + blockQ + " x " + blockK);
    }
    if (maxBlocksPerSweep < 1) {
      throw new IllegalArgumentException("maxBlocksPerSweep must be >= 1, got " + maxBlocksPerSweep);
    }
    this.blockQ = blockQ;
    this.blockK = blockK;
    if (keyLaneRows < 0) {
      throw new IllegalArgumentException("keyLaneRows must be >= 0, got " + keyLaneRows);
    }
    this.maxBlocksPerSweep = maxBlocksPerSweep;
    this.keyLaneRows = keyLaneRows;
  }

  @Override
  public String name() {
    return "cpu";
  }

  /** SIMD lanes one inner-loop call covers: query blocks are multiples of this. */
  public static int laneGroup() {
    return TileMath.GROUP;
  }

  /** Result of split-K decoding. */
  public record DecodeResult(AttentionState state, int splits, long recomputedRows) {}

  /**
   * Attention of q [B, H, Tq, D] over k, v [B, Hkv, Tk, D]. Returns the state with rows
   * b * Tq + t. Rows that see no key get (0, -inf).
   */
  @Override
  public AttentionState forward(Tensor q, Tensor k, Tensor v, long[] qPos, long[] kPos, AttentionOptions opt) {
    return forward(new Problem(q, k, v, qPos, kPos, opt));
  }

  /**
   * {@link #forward(Tensor, Tensor, Tensor, long[], long[], AttentionOptions)} with q, k and v read in
   * place from buffers ({@link BufferTensor}, either order): a query row as its block starts, a key
   * tile into arrays of the worker's thread as the tile is reached. The same bits as the Tensor form;
   * spares a caller holding native memory (a DJL operator) copying the inputs whole.
   */
  public AttentionState forward(BufferTensor q, BufferTensor k, BufferTensor v, long[] qPos, long[] kPos,
      AttentionOptions opt) {
    return forward(new Problem(q, k, v, qPos, kPos, opt));
  }

  /**
   * The same, written into the caller's buffers instead of a new state: o of logical shape q's [B, H,
   * Tq, D] in either order, lse [B, H, Tq] (or, when o is token-major, [B, Tq, H]), every entry
   * written. Spares a DJL operator the copy of the state into its output arrays. o and lse must not
   * share memory with q, k or v (other tasks may still be reading them). On an exception the buffers
   * hold partial output: discard them.
   */
  public void forward(BufferTensor q, BufferTensor k, BufferTensor v, long[] qPos, long[] kPos, AttentionOptions opt,
      BufferTensor o, java.nio.FloatBuffer lse) {
    Problem p = new Problem(q, k, v, qPos, kPos, opt);
    java.util.Objects.requireNonNull(o, "o");
    java.util.Objects.requireNonNull(lse, "lse");
    if (o.batch() != p.batch || o.heads() != p.heads || o.tokens() != p.tq || o.dim() != p.dim) {
      throw new IllegalArgumentException("o must have q's shape " + q.shape() + ", got " + o.shape());
    }
    if (lse.limit() != p.rows * p.heads) {
      throw new IllegalArgumentException("lse must hold " + p.rows * p.heads + " floats (batch x heads x query tokens),"
          + " got a buffer of " + lse.limit());
    }
    if (o.data().isReadOnly() || lse.isReadOnly()) { // else a bare ReadOnlyBufferException, after some of the work
      throw new IllegalArgumentException((o.data().isReadOnly() ? "o" : "lse") + " is a read-only buffer: the kernel "
          + "writes its result there");
    }
    forward(p, RowsOut.buffers(o, lse));
  }

  private AttentionState forward(Problem p) {
    // Not poisoned and scanned afterwards, as decode's partials are: the workers write every entry of
    // each row they hold and refuse a non-finite one, and the tasks' rows are counted (forward below).
    // (The poison fill and the scan ran on one thread after the parallel part: 5% of a call at T = 1024.)
    float[] o = new float[p.rows * p.heads * p.dim];
    float[] lse = new float[p.rows * p.heads];
    forward(p, RowsOut.state(o, lse));
    return AttentionState.ofWritten(o, lse, p.rows, p.heads, p.dim);
  }

  private void forward(Problem p, RowsOut out) {
    if (keyLanes(p)) {
      keyLaneForward(p, out);
      return;
    }
    int qBlocks = (p.tq + blockQ - 1) / blockQ;
    int perSweep = blocksPerSweep(qBlocks, p.batch * p.heads, p.dim);
    int sweeps = (qBlocks + perSweep - 1) / perSweep;
    if (p.kb != null && (long) sweeps * p.group > MAX_TILE_COPIES) {
      p = staged(p);
    }
    sweep(p, out, qBlocks, perSweep, sweeps);
  }

  /**
   * Key tiles a forward reading K/V from buffers may copy per tile (one copy for each sweep over it:
   * sweeps per query head times the query heads of its kv head); above this K and V are copied
   * whole into arrays first. Each tile copy is a serial read the kernel cannot overlap with its
   * arithmetic. At [1,8,T,128] (Zen 4) tile copies cost about what whole copies cost at T = 1024
   * (4 a tile); at 4096 (16) 3-9% of the kernel against 2-4% for whole copies; at 16384 (64) a third
   * of the call (docs/BENCHMARKS.md, "The operator reads its inputs and writes its output in place").
   */
  static final int MAX_TILE_COPIES = 4;

  /** The calling thread's reusable arrays for K and V copied whole ({@link #staged}); softly held. */
  private static final ThreadLocal<java.lang.ref.SoftReference<float[][]>> STAGED = new ThreadLocal<>();

  /** p with K and V copied from their buffers into arrays of the calling thread, in BHTD order. */
  private static Problem staged(Problem p) {
    int n = p.batch * p.kvHeads * p.tk * p.dim;
    java.lang.ref.SoftReference<float[][]> ref = STAGED.get();
    float[][] kv = ref == null ? null : ref.get();
    if (kv == null || kv[0].length != n) {
      kv = new float[][] {new float[n], new float[n]}; // reused: fresh heap pages cost more than the copy
      STAGED.set(new java.lang.ref.SoftReference<>(kv));
    }
    float[] k = kv[0], v = kv[1];
    p.kb.single().copyInto(k); // forward calls have one page
    p.vb.single().copyInto(v);
    return p.withKv(new Tensor(k, p.batch, p.kvHeads, p.tk, p.dim), new Tensor(v, p.batch, p.kvHeads, p.tk, p.dim));
  }

  private void sweep(Problem p, RowsOut out, int qBlocks, int perSweep, int sweeps) {
    int tasks = p.batch * p.heads * sweeps;
    int[] written = new int[tasks];
    parallelFor(tasks, task -> {
      int sw = task % sweeps;
      int bh = task / sweeps;
      int b = bh / p.heads, h = bh % p.heads, kvh = h / p.group;
      int qb0 = sw * perSweep, qb1 = Math.min(qBlocks, qb0 + perSweep);
      TileWorker[] ws = workers(qb1 - qb0, blockQ, p.dim);
      for (int qb = qb0; qb < qb1; qb++) {
        TileWorker w = ws[qb - qb0];
        w.startBlock();
        for (int t = qb * blockQ, t1 = Math.min(p.tq, t + blockQ); t < t1; t++) {
          w.addRow(p, b, h, t);
        }
        w.begin(p, null);
      }
      // Key tile outermost: a tile is read from memory once and swept by every block of the task
      // while it sits in cache (one block sweeping all keys streamed K/V from memory at long T).
      KvTile kv = ws[0].kvTile; // this thread's: a tile copied from buffers lands in arrays already in cache
      try {
        for (int jt = 0, n; jt < p.tk; jt += n) { // += n: jt + blockK could pass Integer.MAX_VALUE
          n = Math.min(blockK, p.tk - jt);
          long[] kRange = TileWorker.keyRange(p.opt, p.kPos, jt, jt + n);
          kv.load(p, b, kvh, jt, n);
          for (int i = 0; i < qb1 - qb0; i++) {
            ws[i].tile(p, kv, jt, n, kRange, null);
          }
        }
      } finally {
        kv.release();
      }
      int steps = 0;
      for (int i = 0; i < qb1 - qb0; i++) {
        ws[i].finish(p, out, null);
        written[task] += ws[i].rows();
        steps += ws[i].takeSteps();
      }
      TILE_STEPS.add(steps);
    });
    requireAllWritten(written, p); // a bug of the task split, never the caller's input
  }

  /**
   * Split-K partials start as NaN so that an entry the kernel failed to write (a row the unified
   * max left for its second pass) cannot pass for a result: {@link AttentionState#of} rejects NaN.
   */
  private static float[] poisoned(int n) {
    float[] x = new float[n];
    java.util.Arrays.fill(x, Float.NaN);
    return x;
  }

  /** Split-K decoding with {@link #DEFAULT_SPLIT_LEN}. */
  public AttentionState decode(Tensor q, Tensor k, Tensor v, long[] qPos, long[] kPos, AttentionOptions opt) {
    return decode(q, k, v, qPos, kPos, opt, DEFAULT_SPLIT_LEN).state();
  }

  /**
   * Whether a kv head's rows (its query heads times the query tokens) go to the keys-in-lanes worker:
   * at most {@link #keyLaneRows} and at most blockQ, so that they form one block whichever worker
   * runs them, as in {@link #splitK} (which tiles a block skips depends on its rows' positions).
   */
  private boolean keyLanes(Problem p) {
    int groupRows = p.group * p.tq;
    return groupRows > 0 && groupRows <= Math.min(keyLaneRows, blockQ);
  }

  /**
   * {@link #forward} for few query tokens (a decode step scored by the Spark job): the keys-in-lanes
   * worker over all keys, one task per (batch, kv head, slice of its query heads). The bits of the
   * rows-in-lanes forward: each row sees the same key tiles in the same order, and every slice holds
   * all the query tokens, so its positions (which decide the tiles it skips) are a query block's.
   */
  private void keyLaneForward(Problem p, RowsOut out) {
    int kvTasks = p.batch * p.kvHeads;
    int slices = Math.min(p.group, Math.max(1, (4 * POOL.getParallelism() + kvTasks - 1) / kvTasks));
    int tasks = kvTasks * slices;
    int[] written = new int[tasks];
    parallelFor(tasks, task -> {
      int slice = task % slices, bkv = task / slices, b = bkv / p.kvHeads, kvh = bkv % p.kvHeads;
      int h0 = kvh * p.group + p.group * slice / slices, h1 = kvh * p.group + p.group * (slice + 1) / slices;
      KeyLaneWorker w = keyLaneWorker((h1 - h0) * p.tq, p.dim);
      w.startBlock();
      for (int h = h0; h < h1; h++) {
        for (int t = 0; t < p.tq; t++) {
          w.addRow(p, b, h, t);
        }
      }
      w.run(p, b, kvh, 0, p.tk, null);
      w.finish(p, out, null);
      written[task] = w.rows();
      TILE_STEPS.add(w.takeSteps());
    });
    requireAllWritten(written, p);
  }

  /** The forward tasks' written (row, head) entries add up to all of them: a bug of the task split otherwise. */
  private static void requireAllWritten(int[] written, Problem p) {
    long total = 0;
    for (int w : written) {
      total += w;
    }
    if (total != (long) p.rows * p.heads) {
      throw new IllegalStateException("forward wrote " + total + " (row, head) entries of " + (long) p.rows * p.heads);
    }
  }

  /**
   * Split-K decoding: keys cut into splits of {@code splitLen} from key 0 (so a sequence's result
   * never depends on other sequences in the batch), each split an attention state with its lse kept
   * in float64, merged in split order as a balanced tree; the lse is rounded to float32 once, at the
   * end.
   */
  @Override
  public DecodeResult decode(Tensor q, Tensor k, Tensor v, long[] qPos, long[] kPos, AttentionOptions opt,
      int splitLen) {
    return splitK(new Problem(q, k, v, qPos, kPos, opt), splitLen, null);
  }

  /**
   * Split-K decoding ({@link #decode(Tensor, Tensor, Tensor, long[], long[], AttentionOptions, int)})
   * with q, k and v read in place from buffers, e.g. DJL arrays' native memory ({@link BufferTensor}):
   * each key tile is copied into arrays of the worker's thread as it is reached ({@link KvTile}), so a
   * long KV cache is read once and never copied whole. The same bits as the Tensor form.
   */
  public DecodeResult decode(BufferTensor q, BufferTensor k, BufferTensor v, long[] qPos, long[] kPos,
      AttentionOptions opt, int splitLen) {
    return splitK(new Problem(q, k, v, qPos, kPos, opt), splitLen, null);
  }

  /**
   * Split-K decoding ({@link #decode(BufferTensor, BufferTensor, BufferTensor, long[], long[],
   * AttentionOptions, int)}) over keys and values held as pages laid end to end along the token axis
   * (a paged or chunked KV cache), read in place: the same bits as one buffer holding the same keys,
   * however they are paged, since splits are cut by key index across page boundaries. k page i and v
   * page i hold the same tokens; pages share batch, kv heads and head dim, and each keeps its own
   * memory order. kPos gives all the keys' positions in page order (null: 0, 1, ...).
   */
  public DecodeResult decode(BufferTensor q, List<BufferTensor> kPages, List<BufferTensor> vPages, long[] qPos,
      long[] kPos, AttentionOptions opt, int splitLen) {
    java.util.Objects.requireNonNull(q, "q");
    java.util.Objects.requireNonNull(opt, "opt");
    TokenPages k = TokenPages.of(kPages, "k"), v = TokenPages.of(vPages, "v");
    if (k.pageCount() != v.pageCount()) {
      throw new IllegalArgumentException("k has " + k.pageCount() + " pages and v " + v.pageCount()
          + ": k page i and v page i hold the same tokens");
    }
    for (int i = 0; i < k.pageCount(); i++) {
      if (k.pageTokens(i) != v.pageTokens(i)) {
        throw new IllegalArgumentException("k page " + i + " holds " + k.pageTokens(i) + " tokens and v page " + i + " "
            + v.pageTokens(i));
      }
    }
    if (k.batch != v.batch || k.heads != v.heads || k.dim != v.dim) {
      throw new IllegalArgumentException("k and v must have the same shape, got k " + k.shape() + " and v "
          + v.shape());
    }
    return splitK(new Problem(q, k, v, qPos, kPos, opt), splitLen, null);
  }

  /**
   * Split-K decoding with the FlashDecoding++ unified maximum: partials use {@code um.phi()}
   * instead of a running max; a (row, split) whose logits leave the bounds is recomputed with the
   * synchronized method, and {@link DecodeResult#recomputedRows()} counts them.
   */
  @Override
  public DecodeResult decodeUnifiedMax(Tensor q, Tensor k, Tensor v, long[] qPos, long[] kPos,
      AttentionOptions opt, int splitLen, UnifiedMax um) {
    return splitK(new Problem(q, k, v, qPos, kPos, opt), splitLen, java.util.Objects.requireNonNull(um, "um"));
  }

  private DecodeResult splitK(Problem p, int splitLen, UnifiedMax um) {
    if (splitLen < 1) {
      throw new IllegalArgumentException("splitLen must be >= 1, got " + splitLen);
    }
    int splits = p.tk == 0 ? 1 : (p.tk - 1) / splitLen + 1; // not tk + splitLen - 1: that can overflow int
    // Rows of one (batch, kv head): the query heads of its group times the query tokens.
    int groupRows = p.group * p.tq;
    boolean keyLanes = keyLanes(p);
    int bq = keyLanes ? groupRows : groupRows <= TileMath.GROUP ? TileMath.GROUP : blockQ;
    int rowBlocks = Math.max(1, (groupRows + bq - 1) / bq);
    List<float[]> partO = new ArrayList<>(splits);
    // Split lse stays float64 until the merged result (a float32 lse near 100 has an ulp of 8e-6,
    // which the merge weights would inherit); o is float32 as in every state.
    List<double[]> partL = new ArrayList<>(splits);
    List<RowsOut> partOut = new ArrayList<>(splits);
    for (int s = 0; s < splits; s++) {
      partO.add(poisoned(p.rows * p.heads * p.dim));
      double[] l = new double[p.rows * p.heads];
      java.util.Arrays.fill(l, Double.NaN); // poisoned: the merge and AttentionState.of reject NaN
      partL.add(l);
      partOut.add(RowsOut.wideLse(partO.get(s), l));
    }
    long[] recomputed = new long[p.batch * p.kvHeads * splits * rowBlocks];
    int tasks = recomputed.length;
    // Every task runs and the lowest failing one's error is thrown, so that of several bad keys the same
    // one is named whatever the threads' timing (a paged cache's first bad chunk, say).
    RuntimeException[] failed = new RuntimeException[tasks];
    parallelFor(tasks, task -> {
      try {
        splitTask(p, task, rowBlocks, splits, splitLen, groupRows, bq, keyLanes, partOut, recomputed, um);
      } catch (RuntimeException e) {
        failed[task] = e;
      }
    });
    RuntimeException first = null;
    for (RuntimeException e : failed) {
      if (first == null) {
        first = e;
      } else if (e != null && first.getSuppressed().length < 8) {
        first.addSuppressed(e);
      }
    }
    if (first != null) {
      throw first;
    }
    long total = 0;
    for (long r : recomputed) {
      total += r;
    }
    // The same balanced tree in split order as AttentionState.mergeAll, with float64 lse; lse is
    // rounded to float32 once, at the end.
    AttentionState merged = AttentionState.mergeAllWideLse(partO, partL, p.rows, p.heads, p.dim);
    return new DecodeResult(merged, splits, total);
  }

  /**
   * The end (exclusive) of the split starting at key {@code j0}: in long, since j0 + splitLen passes
   * Integer.MAX_VALUE for the last split of a cache of more than 2^30 keys (pages hold that many),
   * and a wrapped end made that split empty, its keys silently left out.
   */
  static int splitEnd(int tk, int j0, int splitLen) {
    return (int) Math.min(tk, (long) j0 + splitLen);
  }

  /** Task {@code task} of {@link #splitK}: one row block of one (batch, kv head) over one split's keys. */
  private void splitTask(Problem p, int task, int rowBlocks, int splits, int splitLen, int groupRows, int bq,
      boolean keyLanes, List<RowsOut> partOut, long[] recomputed, UnifiedMax um) {
    int rb = task % rowBlocks;
    int rest = task / rowBlocks;
    int s = rest % splits;
    rest /= splits;
    int kvh = rest % p.kvHeads, b = rest / p.kvHeads;
    int j0 = s * splitLen, j1 = splitEnd(p.tk, j0, splitLen);
    int r0 = rb * bq, r1 = Math.min(groupRows, r0 + bq);
    BlockWorker w = keyLanes ? keyLaneWorker(bq, p.dim) : worker(bq, p.dim);
    try {
      w.startBlock();
      w.clearFlags();
      for (int r = r0; r < r1; r++) {
        w.addRow(p, b, kvh * p.group + r / p.tq, r % p.tq);
      }
      w.run(p, b, kvh, j0, j1, um);
      recomputed[task] = w.finish(p, partOut.get(s), um);
      if (recomputed[task] > 0) {
        // Rows flagged by the unified-max check: redo them with the running max.
        w.startBlock();
        for (int r = r0; r < r1; r++) {
          if (w.flagged(r - r0)) {
            w.addRow(p, b, kvh * p.group + r / p.tq, r % p.tq);
          }
        }
        w.run(p, b, kvh, j0, j1, null);
        w.finish(p, partOut.get(s), null);
      }
    } finally {
      TILE_STEPS.add(w.takeSteps()); // a failed task's steps are its own, not the next task's
    }
  }

  private TileWorker worker(int bq, int dim) {
    return workers(1, bq, dim)[0];
  }

  /** This thread's {@link KeyLaneWorker} for at least {@code rows} rows of head dim {@code dim}. */
  private KeyLaneWorker keyLaneWorker(int rows, int dim) {
    KeyLaneWorker w = keyLaneWorkers.get();
    if (w == null || w.maxRows < rows || w.dim < dim) {
      w = new KeyLaneWorker(Math.max(rows, w == null ? 0 : w.maxRows), blockK, Math.max(dim, w == null ? 0 : w.dim));
      keyLaneWorkers.set(w);
    }
    return w;
  }

  /** This thread's first {@code count} workspaces for blocks of {@code bq} rows of head dim {@code dim}. */
  private TileWorker[] workers(int count, int bq, int dim) {
    TileWorker[] ws = workers.get();
    if (ws == null || ws.length < count || ws[0].blockQ != bq || ws[0].dim < dim) {
      int d = Math.max(dim, ws == null ? 0 : ws[0].dim);
      ws = new TileWorker[Math.max(count, ws == null ? 0 : ws.length)];
      for (int i = 0; i < ws.length; i++) {
        ws[i] = new TileWorker(bq, blockK, d);
      }
      workers.set(ws);
    }
    return ws;
  }

  /**
   * How many query blocks {@link #forward} lets sweep the keys together for q [batch, heads, tq, dim],
   * and so what the detected L2 size ({@link #l2CacheBytes()}) chose; for benchmarks and logs.
   */
  public int blocksPerSweep(int batch, int heads, int tq, int dim) {
    return blocksPerSweep((tq + blockQ - 1) / blockQ, batch * heads, dim);
  }

  /** The per-core L2 cache size the tile counts follow (sysfs, else getconf, else 512 KiB). */
  public static long l2CacheBytes() {
    return CacheSizes.L2_BYTES;
  }

  /**
   * Query blocks that sweep the keys together in one task ({@link #forward}): as many as keep their
   * workspaces and one K/V tile within half the L2 cache, capped at {@link #maxBlocksPerSweep}, and
   * few enough to leave every pool thread several tasks. Any count gives the same bits: a row's
   * arithmetic does not depend on which blocks share its sweep.
   *
   * @param batchHeads batch x query heads: the number of independent key sweeps per block index
   */
  int blocksPerSweep(int qBlocks, int batchHeads, int dim) {
    long blockBytes = 4L * (2L * dim * blockQ + (long) blockK * blockQ); // qt, ot, one tile of scores
    long kvTileBytes = 2L * 4 * blockK * dim;
    long byCache = (CacheSizes.L2_BYTES / 2 - kvTileBytes) / blockBytes;
    long byTasks = (long) qBlocks * batchHeads / (4L * POOL.getParallelism());
    long n = Math.min(maxBlocksPerSweep, Math.min(byCache, byTasks));
    return (int) Math.max(1, Math.min(n, qBlocks));
  }

  /**
   * A validated call: shapes, positions, options and the derived sizes. Queries, keys and values are
   * all Tensors (arrays) or all {@link BufferTensor}s (buffers read in place: a query row as its block
   * starts, a key tile at a time, {@link KvTile}); or, once staged, q in a buffer and K/V in arrays.
   */
  static final class Problem {
    final Tensor q, k, v; // null when read from buffers
    final BufferTensor qb; // null when the inputs are Tensors
    final TokenPages kb, vb; // likewise
    final long[] qPos, kPos;
    final AttentionOptions opt;
    final int batch, heads, kvHeads, group, tq, tk, dim, rows;
    final float qScale;
    final float softcap;

    Problem(Tensor q, Tensor k, Tensor v, long[] qPos, long[] kPos, AttentionOptions opt) {
      this(sameKv(q, k, v, opt), k, v, null, null, null, q.batch(), q.heads(), q.tokens(), q.dim(), k.batch(),
          k.heads(), k.tokens(), k.dim(), qPos, kPos, opt);
    }

    Problem(BufferTensor q, BufferTensor k, BufferTensor v, long[] qPos, long[] kPos, AttentionOptions opt) {
      this(q, sameKv(q, k, v, opt), TokenPages.of(v), qPos, kPos, opt);
    }

    Problem(BufferTensor q, TokenPages k, TokenPages v, long[] qPos, long[] kPos, AttentionOptions opt) {
      this(null, null, null, q, k, v, q.batch(), q.heads(), q.tokens(), q.dim(), k.batch, k.heads, k.tokens, k.dim,
          qPos, kPos, opt);
    }

    /** The first checks, in their order of old (non-null inputs, then k and v alike); returns q. */
    private static Tensor sameKv(Tensor q, Tensor k, Tensor v, AttentionOptions opt) {
      requireNonNull(q, k, v, opt);
      if (k.batch() != v.batch() || k.heads() != v.heads() || k.tokens() != v.tokens() || k.dim() != v.dim()) {
        throw new IllegalArgumentException("k and v must have the same shape, got k " + k.shape() + " and v " + v.shape());
      }
      return q;
    }

    /** The first checks (non-null inputs, then k and v of one shape); k as one page. */
    private static TokenPages sameKv(BufferTensor q, BufferTensor k, BufferTensor v, AttentionOptions opt) {
      requireNonNull(q, k, v, opt);
      if (k.batch() != v.batch() || k.heads() != v.heads() || k.tokens() != v.tokens() || k.dim() != v.dim()) {
        throw new IllegalArgumentException("k and v must have the same shape, got k " + k.shape() + " and v "
            + v.shape());
      }
      return TokenPages.of(k);
    }

    private static void requireNonNull(Object q, Object k, Object v, AttentionOptions opt) {
      java.util.Objects.requireNonNull(q, "q");
      java.util.Objects.requireNonNull(k, "k");
      java.util.Objects.requireNonNull(v, "v");
      java.util.Objects.requireNonNull(opt, "opt");
    }

    private Problem(Tensor q, Tensor k, Tensor v, BufferTensor qb, TokenPages kb, TokenPages vb, int qBatch,
        int qHeads, int qTokens, int qDim, int kBatch, int kHeads, int kTokens, int kDim, long[] qPos, long[] kPos,
        AttentionOptions opt) {
      String qShape = q != null ? q.shape() : qb.shape();
      String kShape = k != null ? k.shape() : kb.shape();
      if (qBatch != kBatch) {
        throw new IllegalArgumentException("q and k must have the same batch, got q " + qShape + " and k " + kShape);
      }
      if (qDim != kDim) {
        throw new IllegalArgumentException("q and k must have the same head dim, got q " + qShape + " and k " + kShape);
      }
      if (qHeads % kHeads != 0) {
        throw new IllegalArgumentException("query heads (" + qHeads + ") must be a multiple of kv heads ("
            + kHeads + "), got q " + qShape + " and k " + kShape);
      }
      if (qDim > MAX_DIM) {
        throw new IllegalArgumentException("unsupported head dim " + qDim + ": the CPU kernels support 1.." + MAX_DIM);
      }
      if (qPos != null && qPos.length != qTokens) {
        throw new IllegalArgumentException("qPos has " + qPos.length + " positions for " + qTokens + " query tokens");
      }
      if (kPos != null && kPos.length != kTokens) {
        throw new IllegalArgumentException("kPos has " + kPos.length + " positions for " + kTokens + " key tokens");
      }
      this.q = q;
      this.k = k;
      this.v = v;
      this.qb = qb;
      this.kb = kb;
      this.vb = vb;
      this.opt = opt;
      this.qPos = qPos != null ? qPos : ReferenceAttention.iota(qTokens);
      this.kPos = kPos != null ? kPos : ReferenceAttention.iota(kTokens);
      this.batch = qBatch;
      this.heads = qHeads;
      this.kvHeads = kHeads;
      this.group = heads / kvHeads;
      this.tq = qTokens;
      this.tk = kTokens;
      this.dim = qDim;
      this.rows = Math.multiplyExact(batch, tq);
      Math.multiplyExact(Math.multiplyExact(rows, heads), dim);
      if (k != null) { // arrays index K and V with ints; pages each bound their own buffer, not their sum
        Math.multiplyExact(Math.multiplyExact(Math.multiplyExact(batch, kvHeads), tk), dim);
      }
      // The scale (divided by the softcap when capping) multiplies each finished q.k (TileWorker).
      this.softcap = opt.softcap();
      this.qScale = opt.scoreScale(dim);
      if (softcap > 0) { // a capped infinite q.k is a finite score: an Infinity in q or k would pass unseen
        if (q != null) {
          q.requireFinite("q");
          k.requireFinite("k");
        } else {
          qb.requireFinite("q");
          kb.requireFinite("k");
        }
      }
    }

    /** This call with K and V as the given arrays (their copies, {@link CpuAttention#staged}); q as it is. */
    Problem withKv(Tensor k, Tensor v) {
      return new Problem(this, k, v);
    }

    private Problem(Problem p, Tensor k, Tensor v) {
      this.q = p.q;
      this.qb = p.qb;
      this.k = k;
      this.v = v;
      this.kb = null;
      this.vb = null;
      this.qPos = p.qPos;
      this.kPos = p.kPos;
      this.opt = p.opt;
      this.batch = p.batch;
      this.heads = p.heads;
      this.kvHeads = p.kvHeads;
      this.group = p.group;
      this.tq = p.tq;
      this.tk = p.tk;
      this.dim = p.dim;
      this.rows = p.rows;
      this.qScale = p.qScale;
      this.softcap = p.softcap;
    }

    /** Offset of query row (b, h, t) in q's array or buffer. */
    int qOffset(int b, int h, int t) {
      return q != null ? q.offset(b, h, t) : qb.offset(b, h, t);
    }

    /** Copies the query row at {@code at} (from {@link #qOffset}) into dst from {@code dstOff}. */
    void readQ(int at, float[] dst, int dstOff) {
      if (q != null) {
        System.arraycopy(q.data(), at, dst, dstOff, dim);
      } else {
        qb.data().get(at, dst, dstOff, dim);
      }
    }

    /** Offset of key (or value) row 0 of kv head kvh of batch entry b in k's (v's) array. */
    int kvOffset(int b, int kvh) {
      return k.offset(b, kvh, 0);
    }
  }

  /** The CPU kernels: always usable. */
  public static final class Provider implements AttentionBackendProvider {
    @Override
    public String name() {
      return "cpu";
    }

    @Override
    public int priority() {
      return 0;
    }

    @Override
    public String unavailableReason() {
      return null;
    }

    @Override
    public AttentionBackend open(int device) {
      return CpuAttention.DEFAULT;
    }
  }
}
