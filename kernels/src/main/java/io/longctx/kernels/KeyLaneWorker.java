package io.longctx.kernels;

import static io.longctx.kernels.TileMath.SPECIES;
import static io.longctx.kernels.TileMath.VL;

import java.util.Arrays;
import jdk.incubator.vector.FloatVector;

/**
 * A block of few query rows (a decode step: one kv head's query heads times a few tokens; split-K
 * decoding and the forward of few tokens) run over a key range with the online softmax, with the keys in the SIMD lanes: scores as [row][key], outputs
 * as [row][dim]. {@link TileWorker} holds the rows in the lanes, which a decode block of 4 rows fills
 * to an eighth with 512-bit vectors (32 lanes a call), so most of its multiply-adds were padding.
 *
 * <p>Per (row, key) and per (row, dim) the same operations in the same order as {@link TileWorker}, so
 * the same bits whichever worker runs a row: q.k is one fused multiply-add chain over the dims from
 * zero, then scaled; the tile's max, probability sum and visible range are folded in key order
 * (scalar here, where lanes are keys); each output is one multiply-add chain over the keys. Each key
 * tile is transposed once into {@code kt} ([dim][key]) so that q.k needs no horizontal sums.
 */
final class KeyLaneWorker implements BlockWorker {

  /** Keys per inner-loop block, four vectors of lanes; a tile's transposed keys are padded to it with zeros. */
  static final int KEY_BLOCK = 4 * VL;

  final int maxRows;
  final int blockK;
  final int dim;
  private final int kStride; // lanes per row of kt and s: blockK rounded up to KEY_BLOCK, plus one vector

  private final float[] q; // [maxRows][dim]: the block's queries, unscaled (the scale multiplies q.k)
  private final float[] kt; // [dim][kStride]: the current key tile, transposed
  private final float[] s; // [maxRows][kStride]: scores, then probabilities, of one tile
  private final float[] o; // [maxRows][dim]: unnormalized outputs
  private final float[] max;
  private final float[] sum;
  private final float[] tileSum;
  private final float[] oldMax; // the max before the current tile, then its rescale factor
  private final float[] shift; // the max subtracted in the current tile
  private final float[] seenMin; // unified max: smallest visible logit per row
  private final float[] seenMax; // unified max: largest visible logit per row
  private final boolean[] flags;
  private final float[] lanes = new float[VL]; // per-lane sums of a tile's scores: not finite flags an infinite one
  private final KvTile kvTile = new KvTile();

  private final int[] rowOut;
  private final long[] rowPos;
  private int rows;
  private int steps;
  private long rowPosMin;
  private long rowPosMax;

  KeyLaneWorker(int maxRows, int blockK, int dim) {
    this.maxRows = maxRows;
    this.blockK = blockK;
    this.dim = dim;
    kStride = (blockK + KEY_BLOCK - 1) / KEY_BLOCK * KEY_BLOCK + VL; // + VL: rows 512 B apart shared cache sets
    q = new float[maxRows * dim];
    kt = new float[dim * kStride];
    s = new float[maxRows * kStride];
    o = new float[maxRows * dim];
    max = new float[maxRows];
    sum = new float[maxRows];
    tileSum = new float[maxRows];
    oldMax = new float[maxRows];
    shift = new float[maxRows];
    seenMin = new float[maxRows];
    seenMax = new float[maxRows];
    flags = new boolean[maxRows];
    rowOut = new int[maxRows];
    rowPos = new long[maxRows];
  }

  @Override
  public void startBlock() {
    rows = 0;
  }

  @Override
  public void addRow(CpuAttention.Problem p, int b, int h, int t) {
    int i = rows++;
    p.readQ(p.qOffset(b, h, t), q, i * p.dim);
    rowOut[i] = (b * p.tq + t) * p.heads + h;
    long pos = p.qPos[t];
    rowPos[i] = pos;
    rowPosMin = i == 0 ? pos : Math.min(rowPosMin, pos);
    rowPosMax = i == 0 ? pos : Math.max(rowPosMax, pos);
  }

  @Override
  public void clearFlags() {
    Arrays.fill(flags, false);
  }

  /** Rows in the block. */
  int rows() {
    return rows;
  }

  @Override
  public boolean flagged(int row) {
    return flags[row];
  }

  @Override
  public int takeSteps() {
    int n = steps;
    steps = 0;
    return n;
  }

  @Override
  public void run(CpuAttention.Problem p, int b, int kvh, int j0, int j1, UnifiedMax um) {
    Arrays.fill(o, 0, rows * p.dim, 0f);
    Arrays.fill(max, 0, rows, um == null ? Float.NEGATIVE_INFINITY : um.phi());
    Arrays.fill(sum, 0, rows, 0f);
    Arrays.fill(seenMin, 0, rows, Float.POSITIVE_INFINITY);
    Arrays.fill(seenMax, 0, rows, Float.NEGATIVE_INFINITY);
    try {
      for (int jt = j0, n; jt < j1; jt += n) { // += n: jt + blockK could pass Integer.MAX_VALUE
        n = Math.min(blockK, j1 - jt);
        tile(p, b, kvh, jt, n, TileWorker.keyRange(p.opt, p.kPos, jt, jt + n), um);
      }
    } finally {
      kvTile.release();
    }
  }

  /** One online-softmax step over keys [jt, jt + n): the steps of {@link TileWorker#tile}, in its order. */
  private void tile(CpuAttention.Problem p, int b, int kvh, int jt, int n, long[] kRange, UnifiedMax um) {
    TileWorker.Visibility vis = TileWorker.classify(p.opt, kRange, rowPosMin, rowPosMax);
    if (vis == TileWorker.Visibility.NONE) {
      return;
    }
    steps++;
    int d = p.dim;
    int nPad = (n + KEY_BLOCK - 1) / KEY_BLOCK * KEY_BLOCK;
    KvTile kv = kvTile.load(p, b, kvh, jt, n);
    transpose(kv.k, kv.off, d, n, nPad);
    if (!scores(d, nPad, p.qScale)) {
      rejectInfinity(p, n, jt);
    }
    if (p.softcap > 0) {
      for (int r = 0; r < rows; r++) {
        for (int j = r * kStride, end = j + nPad; j < end; j += VL) {
          TileMath.tanh(FloatVector.fromArray(SPECIES, s, j)).mul(p.softcap).intoArray(s, j);
        }
      }
    }
    if (vis == TileWorker.Visibility.PARTIAL) {
      for (int j = 0; j < n; j++) {
        long kp = p.kPos[jt + j];
        for (int r = 0; r < rows; r++) {
          if (!p.opt.visible(rowPos[r], kp)) {
            s[r * kStride + j] = Float.NEGATIVE_INFINITY;
          }
        }
      }
    }
    softmax(p, n, nPad, jt, um, p.softcap == 0 && vis == TileWorker.Visibility.ALL);
    if (um == null) {
      rescaleOutput(d);
    }
    accumulate(kv.v, kv.off, d, n);
  }

  /** kt[c][j] = k[j][c] for the tile's keys; lanes [n, nPad) zero, so their scores are finite. */
  private void transpose(float[] k, int kOff, int d, int n, int nPad) {
    for (int j = 0; j < n; j++) {
      for (int c = 0, src = kOff + j * d, dst = j; c < d; c++, dst += kStride) {
        kt[dst] = k[src + c];
      }
    }
    if (n < nPad) {
      for (int c = 0; c < d; c++) {
        Arrays.fill(kt, c * kStride + n, c * kStride + nPad, 0f);
      }
    }
  }

  /**
   * s[r][j] = scale * (q_r . k_j) for keys [0, nPad); false when a score may be infinite (their sum,
   * kept per lane in {@code lanes}, is not finite), for the exact scan of {@link #rejectInfinity}.
   */
  private boolean scores(int d, int nPad, float scale) {
    Arrays.fill(lanes, 0f);
    int r = 0;
    for (; r + 4 <= rows; r += 4) {
      for (int j = 0; j < nPad; j += KEY_BLOCK) {
        scores4(d, r, j, scale);
      }
    }
    for (; r < rows; r++) {
      for (int j = 0; j < nPad; j += KEY_BLOCK) {
        scores1(d, r, j, scale);
      }
    }
    for (float x : lanes) {
      if (!Float.isFinite(x)) {
        return false;
      }
    }
    return true;
  }

  /**
   * Scores of rows [r, r + 4) for keys [j, j + KEY_BLOCK): 16 accumulators. No vector crosses a call
   * (stores and the sum written out here): a helper taking vectors was past C2's inlining budget, and
   * the boxed vectors made a whole decode call 2.4x slower (docs/BENCHMARKS.md).
   */
  private void scores4(int d, int r, int j, float scale) {
    FloatVector z = FloatVector.zero(SPECIES);
    FloatVector c00 = z, c01 = z, c02 = z, c03 = z, c10 = z, c11 = z, c12 = z, c13 = z, c20 = z, c21 = z, c22 = z,
        c23 = z, c30 = z, c31 = z, c32 = z, c33 = z;
    int q0 = r * d, q1 = q0 + d, q2 = q1 + d, q3 = q2 + d;
    for (int c = 0, ki = j; c < d; c++, ki += kStride) {
      FloatVector k0 = FloatVector.fromArray(SPECIES, kt, ki);
      FloatVector k1 = FloatVector.fromArray(SPECIES, kt, ki + VL);
      FloatVector k2 = FloatVector.fromArray(SPECIES, kt, ki + 2 * VL);
      FloatVector k3 = FloatVector.fromArray(SPECIES, kt, ki + 3 * VL);
      FloatVector a = FloatVector.broadcast(SPECIES, q[q0 + c]);
      c00 = a.fma(k0, c00);
      c01 = a.fma(k1, c01);
      c02 = a.fma(k2, c02);
      c03 = a.fma(k3, c03);
      a = FloatVector.broadcast(SPECIES, q[q1 + c]);
      c10 = a.fma(k0, c10);
      c11 = a.fma(k1, c11);
      c12 = a.fma(k2, c12);
      c13 = a.fma(k3, c13);
      a = FloatVector.broadcast(SPECIES, q[q2 + c]);
      c20 = a.fma(k0, c20);
      c21 = a.fma(k1, c21);
      c22 = a.fma(k2, c22);
      c23 = a.fma(k3, c23);
      a = FloatVector.broadcast(SPECIES, q[q3 + c]);
      c30 = a.fma(k0, c30);
      c31 = a.fma(k1, c31);
      c32 = a.fma(k2, c32);
      c33 = a.fma(k3, c33);
    }
    FloatVector sc = FloatVector.broadcast(SPECIES, scale);
    c00 = c00.mul(sc);
    c01 = c01.mul(sc);
    c02 = c02.mul(sc);
    c03 = c03.mul(sc);
    c10 = c10.mul(sc);
    c11 = c11.mul(sc);
    c12 = c12.mul(sc);
    c13 = c13.mul(sc);
    c20 = c20.mul(sc);
    c21 = c21.mul(sc);
    c22 = c22.mul(sc);
    c23 = c23.mul(sc);
    c30 = c30.mul(sc);
    c31 = c31.mul(sc);
    c32 = c32.mul(sc);
    c33 = c33.mul(sc);
    int s0 = r * kStride + j, s1 = s0 + kStride, s2 = s1 + kStride, s3 = s2 + kStride;
    c00.intoArray(s, s0);
    c01.intoArray(s, s0 + VL);
    c02.intoArray(s, s0 + 2 * VL);
    c03.intoArray(s, s0 + 3 * VL);
    c10.intoArray(s, s1);
    c11.intoArray(s, s1 + VL);
    c12.intoArray(s, s1 + 2 * VL);
    c13.intoArray(s, s1 + 3 * VL);
    c20.intoArray(s, s2);
    c21.intoArray(s, s2 + VL);
    c22.intoArray(s, s2 + 2 * VL);
    c23.intoArray(s, s2 + 3 * VL);
    c30.intoArray(s, s3);
    c31.intoArray(s, s3 + VL);
    c32.intoArray(s, s3 + 2 * VL);
    c33.intoArray(s, s3 + 3 * VL);
    FloatVector t = FloatVector.fromArray(SPECIES, lanes, 0);
    t = t.add(c00).add(c01).add(c02).add(c03).add(c10).add(c11).add(c12).add(c13);
    t = t.add(c20).add(c21).add(c22).add(c23).add(c30).add(c31).add(c32).add(c33);
    t.intoArray(lanes, 0);
  }

  /** Scores of row r for keys [j, j + KEY_BLOCK). */
  private void scores1(int d, int r, int j, float scale) {
    FloatVector c0 = FloatVector.zero(SPECIES), c1 = c0, c2 = c0, c3 = c0;
    for (int c = 0, qi = r * d, ki = j; c < d; c++, ki += kStride) {
      FloatVector a = FloatVector.broadcast(SPECIES, q[qi + c]);
      c0 = a.fma(FloatVector.fromArray(SPECIES, kt, ki), c0);
      c1 = a.fma(FloatVector.fromArray(SPECIES, kt, ki + VL), c1);
      c2 = a.fma(FloatVector.fromArray(SPECIES, kt, ki + 2 * VL), c2);
      c3 = a.fma(FloatVector.fromArray(SPECIES, kt, ki + 3 * VL), c3);
    }
    FloatVector sc = FloatVector.broadcast(SPECIES, scale);
    c0 = c0.mul(sc);
    c1 = c1.mul(sc);
    c2 = c2.mul(sc);
    c3 = c3.mul(sc);
    int at = r * kStride + j;
    c0.intoArray(s, at);
    c1.intoArray(s, at + VL);
    c2.intoArray(s, at + 2 * VL);
    c3.intoArray(s, at + 3 * VL);
    FloatVector.fromArray(SPECIES, lanes, 0).add(c0).add(c1).add(c2).add(c3).intoArray(lanes, 0);
  }

  /** Throws for the first visible (query, key) pair of the tile, in key order, whose score is infinite. */
  private void rejectInfinity(CpuAttention.Problem p, int n, int jt) {
    for (int j = 0; j < n; j++) {
      for (int r = 0; r < rows; r++) {
        float x = s[r * kStride + j];
        if (Float.isInfinite(x) && p.opt.visible(rowPos[r], p.kPos[jt + j])) {
          throw TileWorker.nonFiniteAt(p, rowOut[r], rowPos[r], jt + j, x);
        }
      }
    }
  }

  /**
   * Scores become probabilities; max, sum and the rescale factor update, per row as in
   * {@link TileWorker}'s softmax step: the tile max (or the visible range) and the probability sum
   * folded in key order.
   */
  private void softmax(CpuAttention.Problem p, int n, int nPad, int jt, UnifiedMax um, boolean maxKnown) {
    for (int r = 0; r < rows; r++) {
      int at = r * kStride;
      float mOld = max[r];
      float mNew = mOld;
      if (um == null) {
        float tMax = Float.NEGATIVE_INFINITY;
        if (maxKnown) { // TileWorker folds Math.max while storing scores
          for (int j = at; j < at + n; j++) {
            tMax = Math.max(tMax, s[j]);
          }
        } else { // and otherwise compares and blends: NaN is passed over
          for (int j = at; j < at + n; j++) {
            if (tMax < s[j]) {
              tMax = s[j];
            }
          }
        }
        mNew = mOld < tMax ? tMax : mOld;
      } else {
        float lo = seenMin[r], hi = seenMax[r];
        for (int j = at; j < at + n; j++) {
          float x = s[j];
          if (hi < x) {
            hi = x;
          }
          if (x < lo && x != Float.NEGATIVE_INFINITY) {
            lo = x;
          }
        }
        seenMin[r] = lo;
        seenMax[r] = hi;
      }
      // A row that has seen no key yet keeps max = -inf; subtract 0 then so exp gives 0, not NaN.
      float mUse = mNew == Float.NEGATIVE_INFINITY ? 0f : mNew;
      FloatVector m = FloatVector.broadcast(SPECIES, mUse);
      for (int j = at; j < at + nPad; j += VL) {
        TileMath.exp(FloatVector.fromArray(SPECIES, s, j).sub(m)).intoArray(s, j);
      }
      float total = 0f;
      for (int j = at; j < at + n; j++) {
        total += s[j];
      }
      tileSum[r] = total;
      oldMax[r] = mOld;
      shift[r] = mUse;
      max[r] = mNew;
    }
    for (int r = 0; r < rows; r++) {
      if (Float.isNaN(tileSum[r])) {
        throw nonFinite(p, n, jt);
      }
      float a = (float) StrictMath.exp((double) oldMax[r] - shift[r]);
      oldMax[r] = a;
      sum[r] = Math.fma(sum[r], a, tileSum[r]);
    }
  }

  /** Names the first non-finite probability of the tile, in key order (as {@link TileWorker} does). */
  private IllegalArgumentException nonFinite(CpuAttention.Problem p, int n, int jt) {
    for (int j = 0; j < n; j++) {
      for (int r = 0; r < rows; r++) {
        float x = s[r * kStride + j];
        if (!Float.isFinite(x)) {
          return TileWorker.nonFiniteAt(p, rowOut[r], rowPos[r], jt + j, x);
        }
      }
    }
    return new IllegalArgumentException("non-finite attention score in key tile at " + jt);
  }

  private void rescaleOutput(int d) {
    for (int r = 0; r < rows; r++) {
      float a = oldMax[r];
      FloatVector av = FloatVector.broadcast(SPECIES, a);
      int c = r * d, end = c + d;
      for (; c + VL <= end; c += VL) {
        FloatVector.fromArray(SPECIES, o, c).mul(av).intoArray(o, c);
      }
      for (; c < end; c++) {
        o[c] *= a;
      }
    }
  }

  /** o[r][c] += sum_j P[r][j] * V[j][c] over the tile's n keys, one multiply-add chain per entry in key order. */
  private void accumulate(float[] v, int vOff, int d, int n) {
    int r = 0;
    for (; r + 4 <= rows; r += 4) {
      int c = 0;
      for (; c + 4 * VL <= d; c += 4 * VL) {
        accumulate4x4(v, vOff, d, n, r, c);
      }
      for (int rr = r; rr < r + 4; rr++) {
        accumulateRest(v, vOff, d, n, rr, c);
      }
    }
    for (; r < rows; r++) {
      int c = 0;
      for (; c + 4 * VL <= d; c += 4 * VL) {
        accumulate1x4(v, vOff, d, n, r, c);
      }
      accumulateRest(v, vOff, d, n, r, c);
    }
  }

  /** Rows [r, r + 4), dims [c, c + 4 VL): 16 accumulators. */
  private void accumulate4x4(float[] v, int vOff, int d, int n, int r, int c) {
    int o0 = r * d + c, o1 = o0 + d, o2 = o1 + d, o3 = o2 + d;
    FloatVector c00 = FloatVector.fromArray(SPECIES, o, o0), c01 = FloatVector.fromArray(SPECIES, o, o0 + VL);
    FloatVector c02 = FloatVector.fromArray(SPECIES, o, o0 + 2 * VL), c03 = FloatVector.fromArray(SPECIES, o, o0 + 3 * VL);
    FloatVector c10 = FloatVector.fromArray(SPECIES, o, o1), c11 = FloatVector.fromArray(SPECIES, o, o1 + VL);
    FloatVector c12 = FloatVector.fromArray(SPECIES, o, o1 + 2 * VL), c13 = FloatVector.fromArray(SPECIES, o, o1 + 3 * VL);
    FloatVector c20 = FloatVector.fromArray(SPECIES, o, o2), c21 = FloatVector.fromArray(SPECIES, o, o2 + VL);
    FloatVector c22 = FloatVector.fromArray(SPECIES, o, o2 + 2 * VL), c23 = FloatVector.fromArray(SPECIES, o, o2 + 3 * VL);
    FloatVector c30 = FloatVector.fromArray(SPECIES, o, o3), c31 = FloatVector.fromArray(SPECIES, o, o3 + VL);
    FloatVector c32 = FloatVector.fromArray(SPECIES, o, o3 + 2 * VL), c33 = FloatVector.fromArray(SPECIES, o, o3 + 3 * VL);
    int p0 = r * kStride, p1 = p0 + kStride, p2 = p1 + kStride, p3 = p2 + kStride;
    for (int j = 0, vi = vOff + c; j < n; j++, vi += d) {
      FloatVector v0 = FloatVector.fromArray(SPECIES, v, vi);
      FloatVector v1 = FloatVector.fromArray(SPECIES, v, vi + VL);
      FloatVector v2 = FloatVector.fromArray(SPECIES, v, vi + 2 * VL);
      FloatVector v3 = FloatVector.fromArray(SPECIES, v, vi + 3 * VL);
      FloatVector a = FloatVector.broadcast(SPECIES, s[p0 + j]);
      c00 = v0.fma(a, c00);
      c01 = v1.fma(a, c01);
      c02 = v2.fma(a, c02);
      c03 = v3.fma(a, c03);
      a = FloatVector.broadcast(SPECIES, s[p1 + j]);
      c10 = v0.fma(a, c10);
      c11 = v1.fma(a, c11);
      c12 = v2.fma(a, c12);
      c13 = v3.fma(a, c13);
      a = FloatVector.broadcast(SPECIES, s[p2 + j]);
      c20 = v0.fma(a, c20);
      c21 = v1.fma(a, c21);
      c22 = v2.fma(a, c22);
      c23 = v3.fma(a, c23);
      a = FloatVector.broadcast(SPECIES, s[p3 + j]);
      c30 = v0.fma(a, c30);
      c31 = v1.fma(a, c31);
      c32 = v2.fma(a, c32);
      c33 = v3.fma(a, c33);
    }
    c00.intoArray(o, o0);
    c01.intoArray(o, o0 + VL);
    c02.intoArray(o, o0 + 2 * VL);
    c03.intoArray(o, o0 + 3 * VL);
    c10.intoArray(o, o1);
    c11.intoArray(o, o1 + VL);
    c12.intoArray(o, o1 + 2 * VL);
    c13.intoArray(o, o1 + 3 * VL);
    c20.intoArray(o, o2);
    c21.intoArray(o, o2 + VL);
    c22.intoArray(o, o2 + 2 * VL);
    c23.intoArray(o, o2 + 3 * VL);
    c30.intoArray(o, o3);
    c31.intoArray(o, o3 + VL);
    c32.intoArray(o, o3 + 2 * VL);
    c33.intoArray(o, o3 + 3 * VL);
  }

  /** Row r, dims [c, c + 4 VL). */
  private void accumulate1x4(float[] v, int vOff, int d, int n, int r, int c) {
    int oi = r * d + c;
    FloatVector c0 = FloatVector.fromArray(SPECIES, o, oi), c1 = FloatVector.fromArray(SPECIES, o, oi + VL);
    FloatVector c2 = FloatVector.fromArray(SPECIES, o, oi + 2 * VL), c3 = FloatVector.fromArray(SPECIES, o, oi + 3 * VL);
    for (int j = 0, pi = r * kStride, vi = vOff + c; j < n; j++, vi += d) {
      FloatVector a = FloatVector.broadcast(SPECIES, s[pi + j]);
      c0 = FloatVector.fromArray(SPECIES, v, vi).fma(a, c0);
      c1 = FloatVector.fromArray(SPECIES, v, vi + VL).fma(a, c1);
      c2 = FloatVector.fromArray(SPECIES, v, vi + 2 * VL).fma(a, c2);
      c3 = FloatVector.fromArray(SPECIES, v, vi + 3 * VL).fma(a, c3);
    }
    c0.intoArray(o, oi);
    c1.intoArray(o, oi + VL);
    c2.intoArray(o, oi + 2 * VL);
    c3.intoArray(o, oi + 3 * VL);
  }

  /** Row r, dims [c, d): one vector at a time, then one dim at a time. */
  private void accumulateRest(float[] v, int vOff, int d, int n, int r, int c) {
    int pi = r * kStride;
    for (; c + VL <= d; c += VL) {
      int oi = r * d + c;
      FloatVector acc = FloatVector.fromArray(SPECIES, o, oi);
      for (int j = 0, vi = vOff + c; j < n; j++, vi += d) {
        acc = FloatVector.fromArray(SPECIES, v, vi).fma(FloatVector.broadcast(SPECIES, s[pi + j]), acc);
      }
      acc.intoArray(o, oi);
    }
    for (; c < d; c++) {
      int oi = r * d + c;
      float acc = o[oi];
      for (int j = 0, vi = vOff + c; j < n; j++, vi += d) {
        acc = Math.fma(v[vi], s[pi + j], acc);
      }
      o[oi] = acc;
    }
  }

  @Override
  public int finish(CpuAttention.Problem p, RowsOut out, UnifiedMax um) {
    int flaggedRows = 0;
    for (int r = 0; r < rows; r++) {
      if (!TileWorker.writeRow(p, o, r * p.dim, 1, max[r], sum[r], seenMin[r], seenMax[r], rowOut[r], out, um)) {
        flags[r] = true;
        flaggedRows++;
      }
    }
    return flaggedRows;
  }
}
