package io.longctx.kernels;

import static io.longctx.kernels.TileMath.GROUP;
import static io.longctx.kernels.TileMath.SPECIES;
import static io.longctx.kernels.TileMath.VL;

import java.util.Arrays;
import jdk.incubator.vector.FloatVector;
import jdk.incubator.vector.VectorMask;
import jdk.incubator.vector.VectorOperators;

/**
 * One thread's workspace: a block of up to {@code blockQ} query rows (each row one (batch, head,
 * token), held in SIMD lanes) run over a contiguous key range of one kv head with the online
 * softmax, tile by tile. Holds one tile of scores, never more.
 *
 * <p>Per key tile j in [jt, jt + n), per row i (lane):
 * <pre>
 *   S[j][i]  = scale * (q_i . k_j)               (softcap: cap * tanh(S / cap); masked: -inf)
 *   m'_i     = max(m_i, max_j S[j][i])           (unified max: m' = phi, fixed)
 *   P[j][i]  = exp(S[j][i] - m'_i)
 *   l_i      = l_i * exp(m_i - m'_i) + sum_j P[j][i]
 *   Ot[:][i] = Ot[:][i] * exp(m_i - m'_i) + sum_j V[j][:] * P[j][i]
 * </pre>
 * and at the end o_i = Ot[:][i] / l_i, lse_i = m_i + log(l_i); l_i = 0 means no key: (0, -inf).
 */
final class TileWorker implements BlockWorker {

  final int blockQ;
  final int blockK;
  final int dim;

  private final float[] qt; // [dim][blockQ]: queries (unscaled), transposed
  private final float[] qRow; // one query row on its way into qt
  private final float[] ot; // [dim][blockQ]: unnormalized outputs, transposed
  private final float[] s; // [blockK][blockQ]: scores, then probabilities, of one tile
  private final float[] max; // running max per lane
  private final float[] sum; // running sum per lane
  private final float[] alpha; // rescale factor of the current tile per lane
  private final float[] shift; // the max subtracted in the current tile per lane
  private final float[] tileSum; // sum of the current tile's probabilities per lane
  private final float[] tileMax; // largest score of the current tile per lane (from the scores pass)
  private final float[] tileScoreSum; // sum of the current tile's scores per lane: -inf or NaN flags a -inf score
  private final float[] seenMin; // unified max: smallest visible logit per lane
  private final float[] seenMax; // unified max: largest visible logit per lane
  private final boolean[] flags; // unified max: lane must be recomputed

  // Row descriptors, one per lane in use.
  private final int[] rowQ; // offset of the query row in q's array or buffer
  private final int[] rowOut; // (row * heads + head) index into the output state
  private final long[] rowPos;
  final KvTile kvTile = new KvTile(); // run()'s tiles, and a forward task's (the thread's first worker's)
  private int rows;
  private int steps; // visible (block, key tile) steps since the last takeSteps()
  private long rowPosMin;
  private long rowPosMax;

  TileWorker(int blockQ, int blockK, int dim) {
    this.blockQ = blockQ;
    this.blockK = blockK;
    this.dim = dim;
    qt = new float[dim * blockQ];
    qRow = new float[dim];
    ot = new float[dim * blockQ];
    s = new float[blockK * blockQ];
    max = new float[blockQ];
    sum = new float[blockQ];
    alpha = new float[blockQ];
    shift = new float[blockQ];
    tileSum = new float[blockQ];
    tileMax = new float[blockQ];
    tileScoreSum = new float[blockQ];
    seenMin = new float[blockQ];
    seenMax = new float[blockQ];
    flags = new boolean[blockQ];
    rowQ = new int[blockQ];
    rowOut = new int[blockQ];
    rowPos = new long[blockQ];
  }

  /**
   * Empties the block. Called before filling it, so a worker left mid-block by an exception (bad
   * input) starts clean on its next task.
   */
  @Override
  public void startBlock() {
    rows = 0;
  }

  /** Adds query row (b, h, t) of the problem to the block, in the next lane. */
  @Override
  public void addRow(CpuAttention.Problem p, int b, int h, int t) {
    int i = rows++;
    rowQ[i] = p.qOffset(b, h, t);
    rowOut[i] = (b * p.tq + t) * p.heads + h;
    long pos = p.qPos[t];
    rowPos[i] = pos;
    rowPosMin = i == 0 ? pos : Math.min(rowPosMin, pos);
    rowPosMax = i == 0 ? pos : Math.max(rowPosMax, pos);
  }

  /** Query rows in the block. */
  int rows() {
    return rows;
  }

  /** Visible tile steps run since the last call (for {@link CpuAttention#tileSteps()}), then zero. */
  @Override
  public int takeSteps() {
    int n = steps;
    steps = 0;
    return n;
  }

  @Override
  public boolean flagged(int lane) {
    return flags[lane];
  }

  @Override
  public void clearFlags() {
    Arrays.fill(flags, false);
  }

  /**
   * Runs the rows added so far over keys [j0, j1) of kv head {@code kvh} of batch entry b; with a
   * non-null {@code um} uses the unified maximum.
   */
  @Override
  public void run(CpuAttention.Problem p, int b, int kvh, int j0, int j1, UnifiedMax um) {
    begin(p, um);
    try {
      for (int jt = j0, n; jt < j1; jt += n) { // += n: jt + blockK could pass Integer.MAX_VALUE
        n = Math.min(blockK, j1 - jt);
        long[] kRange = keyRange(p.opt, p.kPos, jt, jt + n);
        if (classify(p.opt, kRange, rowPosMin, rowPosMax) != Visibility.NONE) { // (tile() skips it too: no load)
          tile(p, kvTile.load(p, b, kvh, jt, n), jt, n, kRange, um);
        }
      }
    } finally {
      kvTile.release();
    }
  }

  /**
   * Starts a sweep of the rows added so far: transposes their queries and resets the running
   * states. Then {@link #tile} for each key tile in order, then {@link #finish}.
   */
  void begin(CpuAttention.Problem p, UnifiedMax um) {
    int d = p.dim;
    // Transposed queries, not scaled: the scale multiplies the finished q.k (TileMath.scores), so with
    // fp16/bf16-valued inputs every product is exact and the fma chain rounds like the naive
    // algorithm's sum; a prescaled q (24-bit mantissa) rounded every fma and, at logits near 100,
    // put the output error above the DESIGN tolerance. Unused lanes are zero so scores stay finite.
    Arrays.fill(qt, 0, d * blockQ, 0f);
    for (int i = 0; i < rows; i++) {
      p.readQ(rowQ[i], qRow, 0);
      for (int c = 0; c < d; c++) {
        qt[c * blockQ + i] = qRow[c];
      }
    }
    Arrays.fill(ot, 0, d * blockQ, 0f);
    Arrays.fill(max, um == null ? Float.NEGATIVE_INFINITY : um.phi());
    Arrays.fill(sum, 0f);
    Arrays.fill(seenMin, Float.POSITIVE_INFINITY);
    Arrays.fill(seenMax, Float.NEGATIVE_INFINITY);
  }

  /**
   * The smallest and largest key position of keys [from, to), as {min, max}; computed once per key
   * tile and shared by every block that sweeps it. Null when the options mask nothing.
   */
  static long[] keyRange(AttentionOptions opt, long[] kPos, int from, int to) {
    if (!opt.masked()) {
      return null;
    }
    long kMin = Long.MAX_VALUE, kMax = Long.MIN_VALUE;
    for (int j = from; j < to; j++) {
      kMin = Math.min(kMin, kPos[j]);
      kMax = Math.max(kMax, kPos[j]);
    }
    return new long[] {kMin, kMax};
  }

  /**
   * One online-softmax step over keys [jt, jt + n) of one kv head and batch entry, read from kv
   * ({@link KvTile#load}), whose positions span {@code kRange} (from {@link #keyRange}). The same
   * operations in the same order for a row whatever else shares its sweep: a row's bits depend only
   * on the key tiles.
   */
  void tile(CpuAttention.Problem p, KvTile kv, int jt, int n, long[] kRange, UnifiedMax um) {
    Visibility vis = classify(p.opt, kRange, rowPosMin, rowPosMax);
    if (vis == Visibility.NONE) {
      return;
    }
    steps++;
    int d = p.dim;
    int lanes = (rows + GROUP - 1) / GROUP * GROUP;
    Arrays.fill(tileMax, 0, lanes, Float.NEGATIVE_INFINITY);
    Arrays.fill(tileScoreSum, 0, lanes, 0f);
    TileMath.scores(kv.k, kv.off, d, n, d, qt, blockQ, s, blockQ, lanes, p.qScale, tileMax, tileScoreSum);
    // The scale (1/cap folded in when capping) multiplied each finished q.k: with fp16/bf16-valued
    // inputs every product is exact and the fma chain rounds like the naive sum (see begin).
    // Before the mask writes -inf of its own, and before a softcap turns an overflowed q.k into a
    // finite -cap or +cap: the q.k that overflowed may be small (its partial sums overflowed).
    if (sawInfinity(lanes)) {
      rejectInfinity(p, n, jt);
    }
    if (p.softcap > 0) {
      softcap(p.softcap, n, lanes);
    }
    if (vis == Visibility.PARTIAL) {
      mask(p, n, jt);
    }
    // The max folded into the scores pass is the tile's max unless softcap or the mask changed scores.
    boolean maxKnown = p.softcap == 0 && vis == Visibility.ALL;
    softmaxTile(p, n, lanes, jt, um, maxKnown);
    if (um == null) {
      rescaleOutput(d, lanes);
    }
    TileMath.accumulate(kv.v, kv.off, d, d, n, s, blockQ, ot, blockQ, lanes);
  }

  enum Visibility { NONE, PARTIAL, ALL }

  /**
   * Classifies a whole (query block, key tile) pair once, from the block's query positions
   * [rowPosMin, rowPosMax] and the tile's key range (from {@link #keyRange}).
   */
  static Visibility classify(AttentionOptions opt, long[] kRange, long rowPosMin, long rowPosMax) {
    if (kRange == null) {
      return Visibility.ALL;
    }
    if (!opt.anyVisible(rowPosMin, rowPosMax, kRange[0], kRange[1])) {
      return Visibility.NONE;
    }
    return opt.allVisible(rowPosMin, rowPosMax, kRange[0], kRange[1]) ? Visibility.ALL : Visibility.PARTIAL;
  }

  /**
   * Whether a score of the tile may be infinite, which only a q.k that overflowed float32 gives here
   * (q and k are finite, or NaN, which the softmax names): a lane's score sum is then not finite. (A
   * sum that overflowed, or a NaN score, says yes too; the exact scan then throws only for an infinity.)
   */
  private boolean sawInfinity(int lanes) {
    for (int i = 0; i < lanes; i++) {
      if (!Float.isFinite(tileScoreSum[i])) {
        return true;
      }
    }
    return false;
  }

  /** Throws for the first visible (query, key) pair of the tile whose score is infinite. */
  private void rejectInfinity(CpuAttention.Problem p, int n, int jt) {
    for (int j = 0; j < n; j++) {
      for (int i = 0; i < rows; i++) {
        float x = s[j * blockQ + i];
        if (Float.isInfinite(x) && p.opt.visible(rowPos[i], p.kPos[jt + j])) {
          throw nonFiniteAt(p, i, jt + j, x);
        }
      }
    }
  }

  private NonFiniteScoreException nonFiniteAt(CpuAttention.Problem p, int lane, int key, float score) {
    return nonFiniteAt(p, rowOut[lane], rowPos[lane], key, score);
  }

  /** The error for score {@code score} of output entry {@code out} (query at qPos) and key {@code key}. */
  static NonFiniteScoreException nonFiniteAt(CpuAttention.Problem p, int out, long qPos, int key, float score) {
    int row = out / p.heads, h = out % p.heads, b = row / p.tq, t = row % p.tq;
    // The cause, read off the two rows (an error path only).
    String cause = null;
    double dot = 0;
    for (int c = 0; c < p.dim && cause == null; c++) {
      float x = entry(p.q, p.qb, b, h, t, c), y = entry(p.k, p.kb, b, h / p.group, key, c);
      cause = !Float.isFinite(x) ? "q is " + x + " at dim " + c : !Float.isFinite(y) ? "k is " + y + " at dim " + c : null;
      dot += (double) x * y;
    }
    if (cause == null) {
      // q.k itself within float32: the scale the kernel multiplies it by (over the softcap, when capping) overflowed it.
      cause = Math.abs(dot) <= Float.MAX_VALUE && Math.abs(dot) * p.qScale > Float.MAX_VALUE
          ? "q.k (" + (float) dot + ") times the score scale (" + p.qScale + (p.softcap > 0 ? ", the scale over the softcap"
              : "") + ") overflows float32" + (p.softcap > 0 ? ": the softcap is too small for this scale and these values"
              : "")
          : "q.k overflows float32 (q and k hold values too large for float32 attention)";
    }
    return new NonFiniteScoreException(b, h, t, qPos, key, p.kPos[key], score, cause);
  }

  /** Element (b, h, t, c) of an input given as a Tensor or, where that is null, as a BufferTensor. */
  static float entry(Tensor x, BufferTensor xb, int b, int h, int t, int c) {
    return x != null ? x.data()[x.offset(b, h, t) + c] : xb.data().get(xb.offset(b, h, t) + c);
  }

  /** The same for keys or values, given as a Tensor or, where that is null, as {@link TokenPages}. */
  static float entry(Tensor x, TokenPages xb, int b, int h, int t, int c) {
    return x != null ? x.data()[x.offset(b, h, t) + c] : xb.get(b, h, t, c);
  }

  /** score = cap * tanh(score / cap); the 1/cap is already folded into the score scale. */
  private void softcap(float cap, int n, int lanes) {
    for (int c = 0; c < lanes; c += VL) {
      for (int j = 0, at = c; j < n; j++, at += blockQ) {
        TileMath.tanh(FloatVector.fromArray(SPECIES, s, at)).mul(cap).intoArray(s, at);
      }
    }
  }

  /**
   * Names the first non-finite entry of the tile. Called when a tile's probabilities summed to NaN:
   * a NaN score stays NaN through exp, and a +inf score makes the max +inf and exp(inf - inf) NaN.
   */
  private IllegalArgumentException nonFinite(CpuAttention.Problem p, int n, int jt) {
    for (int j = 0; j < n; j++) {
      for (int i = 0; i < rows; i++) {
        if (!Float.isFinite(s[j * blockQ + i])) {
          return nonFiniteAt(p, i, jt + j, s[j * blockQ + i]);
        }
      }
    }
    return new IllegalArgumentException("non-finite attention score in key tile at " + jt);
  }

  /** Sets scores of invisible (query, key) pairs to -inf; only tiles classified PARTIAL. */
  private void mask(CpuAttention.Problem p, int n, int jt) {
    AttentionOptions opt = p.opt;
    for (int j = 0; j < n; j++) {
      long kp = p.kPos[jt + j];
      int at = j * blockQ;
      for (int i = 0; i < rows; i++) {
        if (!opt.visible(rowPos[i], kp)) {
          s[at + i] = Float.NEGATIVE_INFINITY;
        }
      }
    }
  }

  /**
   * Online-softmax step over one tile: scores in s become probabilities; max, sum, alpha update.
   * Rejects non-finite scores (NaN or Inf in q or k) from the tile sum, at no extra pass.
   *
   * <p>Kept small on purpose: with two inlined vector exps and the unified-max branch in one method,
   * C2 ran out of inlining budget and left Vector API calls as slow calls (0.55x instead of 0.8x
   * libtorch). So the per-lane rescale factor alpha is scalar (StrictMath, once per lane and tile)
   * and the unified-max range tracking has its own method.
   */
  private void softmaxTile(CpuAttention.Problem p, int n, int lanes, int jt, UnifiedMax um, boolean maxKnown) {
    FloatVector negInf = FloatVector.broadcast(SPECIES, Float.NEGATIVE_INFINITY);
    for (int c = 0; c < lanes; c += VL) {
      FloatVector mOld = FloatVector.fromArray(SPECIES, max, c);
      FloatVector mNew;
      if (um == null) {
        FloatVector tMax = negInf;
        if (maxKnown) {
          tMax = FloatVector.fromArray(SPECIES, tileMax, c);
        } else {
          for (int j = 0, at = c; j < n; j++, at += blockQ) {
            // compare and blend: cheaper than max(), whose NaN rules cost extra instructions
            FloatVector x = FloatVector.fromArray(SPECIES, s, at);
            tMax = tMax.blend(x, tMax.lt(x));
          }
        }
        mNew = mOld.blend(tMax, mOld.lt(tMax));
      } else {
        trackVisibleRange(n, c);
        mNew = mOld;
      }
      // A row that has seen no key yet keeps max = -inf; subtract 0 then so exp gives 0, not NaN.
      FloatVector mUse = mNew.blend(FloatVector.zero(SPECIES), mNew.eq(negInf));
      FloatVector total = FloatVector.zero(SPECIES);
      for (int j = 0, at = c; j < n; j++, at += blockQ) {
        FloatVector e = TileMath.exp(FloatVector.fromArray(SPECIES, s, at).sub(mUse));
        e.intoArray(s, at);
        total = total.add(e);
      }
      mOld.intoArray(alpha, c); // alpha holds the old max until the scalar pass below
      mUse.intoArray(shift, c);
      total.intoArray(tileSum, c);
      mNew.intoArray(max, c);
    }
    for (int i = 0; i < lanes; i++) {
      // Rows only: an unused lane (q = 0) scores a NaN or infinite key as NaN, and that key may be
      // one every row masks; whether a block has unused lanes must not decide whether it is refused.
      if (i < rows && Float.isNaN(tileSum[i])) {
        throw nonFinite(p, n, jt);
      }
      float a = (float) StrictMath.exp((double) alpha[i] - shift[i]);
      alpha[i] = a;
      sum[i] = Math.fma(sum[i], a, tileSum[i]);
    }
  }

  /** Unified max: the smallest and largest visible logit per lane (masked scores are -inf). */
  private void trackVisibleRange(int n, int c) {
    FloatVector negInf = FloatVector.broadcast(SPECIES, Float.NEGATIVE_INFINITY);
    FloatVector lo = FloatVector.fromArray(SPECIES, seenMin, c);
    FloatVector hi = FloatVector.fromArray(SPECIES, seenMax, c);
    for (int j = 0, at = c; j < n; j++, at += blockQ) {
      FloatVector x = FloatVector.fromArray(SPECIES, s, at);
      hi = hi.blend(x, hi.lt(x));
      lo = lo.blend(x, x.lt(lo).and(x.compare(VectorOperators.NE, negInf)));
    }
    lo.intoArray(seenMin, c);
    hi.intoArray(seenMax, c);
  }

  private void rescaleOutput(int d, int lanes) {
    for (int c = 0; c < lanes; c += VL) {
      FloatVector a = FloatVector.fromArray(SPECIES, alpha, c);
      for (int x = 0, at = c; x < d; x++, at += blockQ) {
        FloatVector.fromArray(SPECIES, ot, at).mul(a).intoArray(ot, at);
      }
    }
  }

  /**
   * Writes the block's rows to {@code out}. With a unified max, rows whose logits left the bounds are
   * flagged (see {@link #flagged}) and not written; returns their number.
   */
  @Override
  public int finish(CpuAttention.Problem p, RowsOut out, UnifiedMax um) {
    int flaggedRows = 0;
    for (int i = 0; i < rows; i++) {
      if (!writeRow(p, ot, i, blockQ, max[i], sum[i], seenMin[i], seenMax[i], rowOut[i], out, um)) {
        flags[i] = true;
        flaggedRows++;
      }
    }
    return flaggedRows;
  }

  /**
   * Writes one finished row (both workers) to dst: o = acc / l and lse = m + log(l), or the empty row
   * (0, -inf) when l = 0. With a unified max, returns false instead for a row to recompute: its
   * logits left the bounds, or its sum or an output overflowed (the recompute writes the whole row
   * over what this one wrote).
   *
   * @param acc the row's unnormalized output for dim c at {@code accOff + c * accStride}
   * @param out the row's (row * heads + head) index into the state
   */
  static boolean writeRow(CpuAttention.Problem p, float[] acc, int accOff, int accStride, float m, float l,
      float seenMin, float seenMax, int out, RowsOut dst, UnifiedMax um) {
    // A unified-max row is also recomputed when its sum overflowed (many keys near the upper bound).
    if (um != null && (!um.accepts(seenMin, seenMax) || !Float.isFinite(l))) {
      return false;
    }
    int d = p.dim;
    int at = dst.at(out);
    if (l == 0f) {
      dst.lse(at, Double.NEGATIVE_INFINITY);
      for (int c = 0; c < d; c++) {
        dst.o(at * d + c, 0f);
      }
      return true;
    }
    float inv = 1f / l;
    for (int c = 0, a = accOff; c < d; c++, a += accStride) {
      float x = acc[a] * inv;
      if (!Float.isFinite(x)) {
        if (um != null) {
          // Weights near e^88 (an upper bound near 88) times v: the recompute's running max keeps
          // the row finite, or names a v too large.
          return false;
        }
        throw nonFiniteOutput(p, out, c);
      }
      dst.o(at * d + c, x);
    }
    double rowLse = m + StrictMath.log(l); // StrictMath: same bits on every JVM
    if (!Float.isFinite((float) rowLse)) { // unreachable while scores are finite; forward relies on the check
      int row = out / p.heads;
      throw new IllegalArgumentException("non-finite lse " + rowLse + " at batch " + row / p.tq + ", head "
          + out % p.heads + ", query token " + row % p.tq);
    }
    dst.lse(at, rowLse);
    return true;
  }

  private static IllegalArgumentException nonFiniteOutput(CpuAttention.Problem p, int out, int dim) {
    int row = out / p.heads, h = out % p.heads, b = row / p.tq, kvh = h / p.group, tq = row % p.tq;
    String where = "non-finite attention output at batch " + b + ", head " + h + ", query token " + tq + ", dim " + dim
        + ": ";
    // Name the v entry (an error path only: the scan costs nothing on a good call).
    for (int t = 0; t < p.tk; t++) {
      float x = entry(p.v, p.vb, b, kvh, t, dim);
      if (!Float.isFinite(x)) {
        return new IllegalArgumentException(where + "v is " + x + " at kv head " + kvh + ", key token " + t
            + " (position " + p.kPos[t] + ")" + (p.opt.visible(p.qPos[tq], p.kPos[t]) ? ""
                : ", a key this query does not see: it still enters the sums of a tile it shares with seen keys, "
                    + "with weight 0 (0 x NaN is NaN), so v must be finite at every key given (pad with zeros)"));
      }
    }
    return new IllegalArgumentException(where + "v holds values too large for float32 (their weighted sum overflows)");
  }


}
