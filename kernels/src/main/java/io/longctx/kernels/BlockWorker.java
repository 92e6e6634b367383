package io.longctx.kernels;

/**
 * A thread's workspace for one block of query rows of one kv head, run over a key range with the
 * online softmax: what split-K decoding needs of it. Two forms with the same bits per row:
 * {@link TileWorker} (query rows in the SIMD lanes) and {@link KeyLaneWorker} (keys in the lanes, for
 * blocks of few rows).
 */
interface BlockWorker {

  /** Empties the block (also after a worker was left mid-block by an exception). */
  void startBlock();

  /** Adds query row (b, h, t) of the problem to the block. */
  void addRow(CpuAttention.Problem p, int b, int h, int t);

  /** Clears the unified-max recompute flags. */
  void clearFlags();

  /** Runs the block's rows over keys [j0, j1) of kv head kvh of batch entry b; unified max when um is non-null. */
  void run(CpuAttention.Problem p, int b, int kvh, int j0, int j1, UnifiedMax um);

  /**
   * Writes the block's rows to out; with a unified max, rows to recompute are flagged and not
   * written, and their number returned.
   */
  int finish(CpuAttention.Problem p, RowsOut out, UnifiedMax um);

  /** Whether the block's row number {@code row} (in the order added) was flagged by {@link #finish}. */
  boolean flagged(int row);

  /** Visible (block, key tile) steps run since the last call, then zero. */
  int takeSteps();
}
