package io.longctx.kernels;

import jdk.incubator.vector.FloatVector;
import jdk.incubator.vector.VectorOperators;
import jdk.incubator.vector.VectorSpecies;

/**
 * The one inner loop of the CPU kernels: C[x][lanes] (+)= sum_k A(x, k) * B[k][lanes], where the
 * lanes are query rows held in SIMD lanes and A is read by scalar broadcast. With query rows in the
 * lanes, both products of attention take this form and the softmax needs no horizontal reductions:
 *
 * <pre>
 *   scores:  S[j][i]  = sum_d K[j][d] * Qt[d][i]     (x = key j,  k = dim d)
 *   output:  Ot[d][i] += sum_j V[j][d] * P[j][i]     (x = dim d,  k = key j)
 * </pre>
 *
 * Register block: 6 x-rows by 2 vectors (12 accumulators; fits the 16 registers of AVX2 and
 * leaves room on AVX-512), with 4-row and 1-row blocks for the rest; with 512-bit vectors also
 * 6 and 4 rows by 4 vectors ({@link #WIDE}). Lanes come in groups of {@link #GROUP} (two vectors).
 */
final class TileMath {

  static final VectorSpecies<Float> SPECIES = FloatVector.SPECIES_PREFERRED;
  static final int VL = SPECIES.length();
  /** Lanes covered by one call: two vectors. */
  static final int GROUP = 2 * VL;
  /**
   * Whether six-row blocks also come four vectors wide (24 accumulators): with 512-bit vectors the
   * machine has 32 vector registers, and the wider block needs half the loads and index updates
   * per fma (inner loops 123 -> 145 GFLOP/s on a Xeon 6/207 core). AVX2's 16 registers would spill it.
   * The same bits either way; {@code -Dlongctx.kernels.wide=true|false} forces it, so that a test can
   * run both forms on any machine.
   */
  static final boolean WIDE = Boolean.parseBoolean(System.getProperty("longctx.kernels.wide", String.valueOf(VL >= 16)));

  private TileMath() {}

  // exp and tanh from IEEE add, mul, fma, compare and bit operations only: the Vector API's own
  // EXP/TANH call SVML stubs in C2 but scalar Math in the interpreter and C1, and the bits differ,
  // so a task re-run on a fresh JVM (a Spark retry) could change the output. These give the same
  // bits in every JIT tier and on every x86 machine, at about the stubs' speed.
  private static final float EXP_HI = 88f; // exp(88) < Float.MAX_VALUE
  private static final float EXP_LO = -104f; // 2^n then has a non-positive biased exponent: 0
  private static final float LOG2E = 1.44269504088896341f;
  private static final float LN2_HI = 0.693359375f; // ln 2 = LN2_HI + LN2_LO, LN2_HI exact in few bits
  private static final float LN2_LO = -2.12194440e-4f;
  private static final float ROUND = 12582912f; // 1.5 * 2^23: adding it rounds to an integer

  /**
   * e^x, about 1 ulp (Cody-Waite reduction, degree-6 polynomial); results below float's normal
   * range (x < about -87.3), and -inf, give 0.
   */
  static FloatVector exp(FloatVector x) {
    FloatVector xc = x.min(EXP_HI).max(EXP_LO);
    FloatVector t = xc.fma(LOG2E, ROUND); // float bits of t hold n = round(x / ln 2)
    FloatVector n = t.sub(ROUND);
    FloatVector r = n.fma(bcast(-LN2_HI), xc);
    r = n.fma(bcast(-LN2_LO), r);
    FloatVector p = r.fma(1.9875691500e-4f, 1.3981999507e-3f);
    p = p.fma(r, bcast(8.3334519073e-3f));
    p = p.fma(r, bcast(4.1665795894e-2f));
    p = p.fma(r, bcast(1.6666665459e-1f));
    p = p.fma(r, bcast(5.0000001201e-1f));
    p = p.fma(r.mul(r), r).add(1f);
    // 2^n from the biased exponent n + 127, floored at 0 so that underflow gives exactly 0. (No
    // compare-and-blend here: inlined this deep, C2 left blend as a slow call.)
    FloatVector twoN = t.reinterpretAsInts().add(127 - 0x4B400000).max(0).lanewise(VectorOperators.LSHL, 23)
        .reinterpretAsFloats();
    return p.mul(twoN);
  }

  private static FloatVector bcast(float c) {
    return FloatVector.broadcast(SPECIES, c);
  }

  /** tanh(x), a few ulp: an odd polynomial below |x| = 0.625, else 1 - 2 / (e^2|x| + 1). */
  static FloatVector tanh(FloatVector x) {
    FloatVector a = x.abs();
    FloatVector z = x.mul(x);
    FloatVector small = z.mul(-5.70498872745e-3f).add(2.06390887954e-2f);
    small = small.mul(z).add(-5.37397155531e-2f);
    small = small.mul(z).add(1.33314422036e-1f);
    small = small.mul(z).add(-3.33332819422e-1f);
    small = small.mul(z).mul(x).add(x);
    FloatVector e = exp(a.mul(2f));
    FloatVector large = FloatVector.broadcast(SPECIES, 1f).sub(FloatVector.broadcast(SPECIES, 2f).div(e.add(1f)));
    large = large.blend(large.neg(), x.lt(0f));
    return small.blend(large, a.compare(VectorOperators.GE, 0.625f));
  }

  /**
   * S[x][lanes] = scale * sum_k K[x][k] * Qt[k][lanes] for lanes in [0, lanes): A rows are contiguous
   * (stride 1 along k). Lane groups run inside each block of six x-rows so those rows of A are
   * still in L1 for every group. Also folds each stored score into {@code hi[lane]} (max) and
   * {@code sum[lane]} (plain sum), so that the softmax needs no pass of its own for the tile max, and
   * a -inf score (an overflowed q.k) shows as a sum that is -inf or NaN without a scan; a sum that
   * overflowed says so too, and the caller's exact scan then finds nothing. The stored scores, and
   * so the bits, are those of a plain scale pass over the tile.
   */
  static void scores(float[] k, int kOff, int kStride, int nx, int nk,
      float[] qt, int qtStride, float[] s, int sStride, int lanes, float scale, float[] hi, float[] sum) {
    int end = sixRowsEnd(nx);
    int wide = wideLanes(lanes);
    for (int g = 0; g < wide; g += 2 * GROUP) {
      scores6x4(k, kOff, kStride, end, nk, qt, g, qtStride, s, g, sStride, scale);
      fold(s, g, sStride, end, g, 4, hi, sum);
    }
    int x = 0;
    for (; x < end; x += 6) {
      for (int g = wide; g < lanes; g += GROUP) {
        scores6(k, kOff + x * kStride, kStride, nk, qt, g, qtStride, s, x * sStride + g, sStride, scale, hi, sum);
      }
    }
    for (; x + 4 <= nx; x += 4) {
      for (int g = 0; g < wide; g += 2 * GROUP) {
        scores4x4(k, kOff + x * kStride, kStride, nk, qt, g, qtStride, s, x * sStride + g, sStride, scale);
        fold(s, x * sStride + g, sStride, 4, g, 4, hi, sum);
      }
      for (int g = wide; g < lanes; g += GROUP) {
        scores4(k, kOff + x * kStride, kStride, nk, qt, g, qtStride, s, x * sStride + g, sStride, scale, hi, sum);
      }
    }
    for (; x < nx; x++) {
      for (int g = 0; g < lanes; g += GROUP) {
        scores1(k, kOff + x * kStride, nk, qt, g, qtStride, s, x * sStride + g, scale, hi, sum);
      }
    }
  }

  /** The lanes, from 0, that the four-vector blocks take: whole pairs of groups, none unless {@link #WIDE}. */
  private static int wideLanes(int lanes) {
    return WIDE ? lanes / (2 * GROUP) * (2 * GROUP) : 0;
  }

  /**
   * Where the six-row blocks stop: the rest goes to four-row blocks and then single rows, whose two
   * accumulators wait on FMA latency. A remainder of 2 or 3 is better taken as 8 or 9 = 4 + 4 (+ 1).
   */
  static int sixRowsEnd(int nx) {
    int six = nx / 6 * 6;
    int rest = nx - six;
    return (rest == 2 || rest == 3) && six >= 6 ? six - 6 : six;
  }

  private static void scores4(float[] k, int kOff, int kStride, int nk, float[] qt, int qtOff, int qtStride,
      float[] s, int sOff, int sStride, float scale, float[] hi, float[] sum) {
    FloatVector c00 = FloatVector.zero(SPECIES), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00,
        c31 = c00;
    int a0 = kOff, a1 = a0 + kStride, a2 = a1 + kStride, a3 = a2 + kStride;
    int bi = qtOff;
    for (int kk = 0; kk < nk; kk++, bi += qtStride) {
      FloatVector b0 = FloatVector.fromArray(SPECIES, qt, bi);
      FloatVector b1 = FloatVector.fromArray(SPECIES, qt, bi + VL);
      FloatVector a = FloatVector.broadcast(SPECIES, k[a0 + kk]);
      c00 = a.fma(b0, c00);
      c01 = a.fma(b1, c01);
      a = FloatVector.broadcast(SPECIES, k[a1 + kk]);
      c10 = a.fma(b0, c10);
      c11 = a.fma(b1, c11);
      a = FloatVector.broadcast(SPECIES, k[a2 + kk]);
      c20 = a.fma(b0, c20);
      c21 = a.fma(b1, c21);
      a = FloatVector.broadcast(SPECIES, k[a3 + kk]);
      c30 = a.fma(b0, c30);
      c31 = a.fma(b1, c31);
    }
    FloatVector sc = FloatVector.broadcast(SPECIES, scale);
    c00 = c00.mul(sc);
    c01 = c01.mul(sc);
    c10 = c10.mul(sc);
    c11 = c11.mul(sc);
    c20 = c20.mul(sc);
    c21 = c21.mul(sc);
    c30 = c30.mul(sc);
    c31 = c31.mul(sc);
    int ci = sOff;
    c00.intoArray(s, ci);
    c01.intoArray(s, ci + VL);
    c10.intoArray(s, ci += sStride);
    c11.intoArray(s, ci + VL);
    c20.intoArray(s, ci += sStride);
    c21.intoArray(s, ci + VL);
    c30.intoArray(s, ci += sStride);
    c31.intoArray(s, ci + VL);
    FloatVector h0 = FloatVector.fromArray(SPECIES, hi, qtOff), h1 = FloatVector.fromArray(SPECIES, hi, qtOff + VL);
    FloatVector l0 = FloatVector.fromArray(SPECIES, sum, qtOff), l1 = FloatVector.fromArray(SPECIES, sum, qtOff + VL);
    h0 = h0.max(c00);
    h1 = h1.max(c01);
    l0 = l0.add(c00);
    l1 = l1.add(c01);
    h0 = h0.max(c10);
    h1 = h1.max(c11);
    l0 = l0.add(c10);
    l1 = l1.add(c11);
    h0 = h0.max(c20);
    h1 = h1.max(c21);
    l0 = l0.add(c20);
    l1 = l1.add(c21);
    h0 = h0.max(c30);
    h1 = h1.max(c31);
    l0 = l0.add(c30);
    l1 = l1.add(c31);
    h0.intoArray(hi, qtOff);
    h1.intoArray(hi, qtOff + VL);
    l0.intoArray(sum, qtOff);
    l1.intoArray(sum, qtOff + VL);
  }


  private static void scores6(float[] k, int kOff, int kStride, int nk, float[] qt, int qtOff, int qtStride,
      float[] s, int sOff, int sStride, float scale, float[] hi, float[] sum) {
    FloatVector c00 = FloatVector.zero(SPECIES), c01 = FloatVector.zero(SPECIES);
    FloatVector c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00, c31 = c00, c40 = c00, c41 = c00,
        c50 = c00, c51 = c00;
    int a0 = kOff, a1 = a0 + kStride, a2 = a1 + kStride, a3 = a2 + kStride, a4 = a3 + kStride,
        a5 = a4 + kStride;
    int bi = qtOff;
    for (int kk = 0; kk < nk; kk++, bi += qtStride) {
      FloatVector b0 = FloatVector.fromArray(SPECIES, qt, bi);
      FloatVector b1 = FloatVector.fromArray(SPECIES, qt, bi + VL);
      FloatVector a = FloatVector.broadcast(SPECIES, k[a0 + kk]);
      c00 = a.fma(b0, c00);
      c01 = a.fma(b1, c01);
      a = FloatVector.broadcast(SPECIES, k[a1 + kk]);
      c10 = a.fma(b0, c10);
      c11 = a.fma(b1, c11);
      a = FloatVector.broadcast(SPECIES, k[a2 + kk]);
      c20 = a.fma(b0, c20);
      c21 = a.fma(b1, c21);
      a = FloatVector.broadcast(SPECIES, k[a3 + kk]);
      c30 = a.fma(b0, c30);
      c31 = a.fma(b1, c31);
      a = FloatVector.broadcast(SPECIES, k[a4 + kk]);
      c40 = a.fma(b0, c40);
      c41 = a.fma(b1, c41);
      a = FloatVector.broadcast(SPECIES, k[a5 + kk]);
      c50 = a.fma(b0, c50);
      c51 = a.fma(b1, c51);
    }
    FloatVector sc = FloatVector.broadcast(SPECIES, scale);
    c00 = c00.mul(sc);
    c01 = c01.mul(sc);
    c10 = c10.mul(sc);
    c11 = c11.mul(sc);
    c20 = c20.mul(sc);
    c21 = c21.mul(sc);
    c30 = c30.mul(sc);
    c31 = c31.mul(sc);
    c40 = c40.mul(sc);
    c41 = c41.mul(sc);
    c50 = c50.mul(sc);
    c51 = c51.mul(sc);
    int ci = sOff;
    c00.intoArray(s, ci);
    c01.intoArray(s, ci + VL);
    c10.intoArray(s, ci += sStride);
    c11.intoArray(s, ci + VL);
    c20.intoArray(s, ci += sStride);
    c21.intoArray(s, ci + VL);
    c30.intoArray(s, ci += sStride);
    c31.intoArray(s, ci + VL);
    c40.intoArray(s, ci += sStride);
    c41.intoArray(s, ci + VL);
    c50.intoArray(s, ci += sStride);
    c51.intoArray(s, ci + VL);
    FloatVector h0 = FloatVector.fromArray(SPECIES, hi, qtOff), h1 = FloatVector.fromArray(SPECIES, hi, qtOff + VL);
    FloatVector l0 = FloatVector.fromArray(SPECIES, sum, qtOff), l1 = FloatVector.fromArray(SPECIES, sum, qtOff + VL);
    h0 = h0.max(c00);
    h1 = h1.max(c01);
    l0 = l0.add(c00);
    l1 = l1.add(c01);
    h0 = h0.max(c10);
    h1 = h1.max(c11);
    l0 = l0.add(c10);
    l1 = l1.add(c11);
    h0 = h0.max(c20);
    h1 = h1.max(c21);
    l0 = l0.add(c20);
    l1 = l1.add(c21);
    h0 = h0.max(c30);
    h1 = h1.max(c31);
    l0 = l0.add(c30);
    l1 = l1.add(c31);
    h0 = h0.max(c40);
    h1 = h1.max(c41);
    l0 = l0.add(c40);
    l1 = l1.add(c41);
    h0 = h0.max(c50);
    h1 = h1.max(c51);
    l0 = l0.add(c50);
    l1 = l1.add(c51);
    h0.intoArray(hi, qtOff);
    h1.intoArray(hi, qtOff + VL);
    l0.intoArray(sum, qtOff);
    l1.intoArray(sum, qtOff + VL);
  }


  /**
   * The q.k of {@link #scores6} for rows [0, nx) (a multiple of six), four vectors wide: lanes
   * [qtOff, qtOff + 2 * GROUP), scaled and stored. The loop over six-row blocks is in here because
   * C2 compiled this loop nest 20% faster than one call per block.
   */
  private static void scores6x4(float[] k, int kOff, int kStride, int nx, int nk, float[] qt, int qtOff,
      int qtStride, float[] s, int sOff, int sStride, float scale) {
    for (int x = 0; x < nx; x += 6) {
      FloatVector z = FloatVector.zero(SPECIES);
      FloatVector c00 = z, c01 = z, c02 = z, c03 = z, c10 = z, c11 = z, c12 = z, c13 = z, c20 = z, c21 = z, c22 = z,
          c23 = z, c30 = z, c31 = z, c32 = z, c33 = z, c40 = z, c41 = z, c42 = z, c43 = z, c50 = z, c51 = z, c52 = z,
          c53 = z;
      int a0 = kOff + x * kStride, a1 = a0 + kStride, a2 = a1 + kStride, a3 = a2 + kStride, a4 = a3 + kStride,
          a5 = a4 + kStride;
      int bi = qtOff;
      for (int kk = 0; kk < nk; kk++, bi += qtStride) {
        FloatVector b0 = FloatVector.fromArray(SPECIES, qt, bi);
        FloatVector b1 = FloatVector.fromArray(SPECIES, qt, bi + VL);
        FloatVector b2 = FloatVector.fromArray(SPECIES, qt, bi + 2 * VL);
        FloatVector b3 = FloatVector.fromArray(SPECIES, qt, bi + 3 * VL);
        FloatVector a = FloatVector.broadcast(SPECIES, k[a0 + kk]);
        c00 = a.fma(b0, c00);
        c01 = a.fma(b1, c01);
        c02 = a.fma(b2, c02);
        c03 = a.fma(b3, c03);
        a = FloatVector.broadcast(SPECIES, k[a1 + kk]);
        c10 = a.fma(b0, c10);
        c11 = a.fma(b1, c11);
        c12 = a.fma(b2, c12);
        c13 = a.fma(b3, c13);
        a = FloatVector.broadcast(SPECIES, k[a2 + kk]);
        c20 = a.fma(b0, c20);
        c21 = a.fma(b1, c21);
        c22 = a.fma(b2, c22);
        c23 = a.fma(b3, c23);
        a = FloatVector.broadcast(SPECIES, k[a3 + kk]);
        c30 = a.fma(b0, c30);
        c31 = a.fma(b1, c31);
        c32 = a.fma(b2, c32);
        c33 = a.fma(b3, c33);
        a = FloatVector.broadcast(SPECIES, k[a4 + kk]);
        c40 = a.fma(b0, c40);
        c41 = a.fma(b1, c41);
        c42 = a.fma(b2, c42);
        c43 = a.fma(b3, c43);
        a = FloatVector.broadcast(SPECIES, k[a5 + kk]);
        c50 = a.fma(b0, c50);
        c51 = a.fma(b1, c51);
        c52 = a.fma(b2, c52);
        c53 = a.fma(b3, c53);
      }
      // Scaled and stored; the fold into hi and sum is a pass of its own (fold), cheaper than here:
      // in registers it outgrew C2's inlining budget (vector calls left as calls, 20x slower), and
      // as loads after these stores it ran 10% slower.
      FloatVector sc = FloatVector.broadcast(SPECIES, scale);
      int ci = sOff + x * sStride;
      c00.mul(sc).intoArray(s, ci);
      c01.mul(sc).intoArray(s, ci + VL);
      c02.mul(sc).intoArray(s, ci + 2 * VL);
      c03.mul(sc).intoArray(s, ci + 3 * VL);
      c10.mul(sc).intoArray(s, ci += sStride);
      c11.mul(sc).intoArray(s, ci + VL);
      c12.mul(sc).intoArray(s, ci + 2 * VL);
      c13.mul(sc).intoArray(s, ci + 3 * VL);
      c20.mul(sc).intoArray(s, ci += sStride);
      c21.mul(sc).intoArray(s, ci + VL);
      c22.mul(sc).intoArray(s, ci + 2 * VL);
      c23.mul(sc).intoArray(s, ci + 3 * VL);
      c30.mul(sc).intoArray(s, ci += sStride);
      c31.mul(sc).intoArray(s, ci + VL);
      c32.mul(sc).intoArray(s, ci + 2 * VL);
      c33.mul(sc).intoArray(s, ci + 3 * VL);
      c40.mul(sc).intoArray(s, ci += sStride);
      c41.mul(sc).intoArray(s, ci + VL);
      c42.mul(sc).intoArray(s, ci + 2 * VL);
      c43.mul(sc).intoArray(s, ci + 3 * VL);
      c50.mul(sc).intoArray(s, ci += sStride);
      c51.mul(sc).intoArray(s, ci + VL);
      c52.mul(sc).intoArray(s, ci + 2 * VL);
      c53.mul(sc).intoArray(s, ci + 3 * VL);
    }
  }

  /**
   * The q.k of {@link #scores4} four vectors wide (16 accumulators), scaled and stored: the rows after
   * the six-row blocks on the lanes of {@link #scores6x4}. In the two-vector form the 8 rows left of
   * 128 took 7.8% of a call's profile for 6.25% of its work, and ran at 70-85% of the six-row loops'
   * rate alone (Xeon 6/167, docs/BENCHMARKS.md).
   */
  private static void scores4x4(float[] k, int kOff, int kStride, int nk, float[] qt, int qtOff, int qtStride,
      float[] s, int sOff, int sStride, float scale) {
    FloatVector z = FloatVector.zero(SPECIES);
    FloatVector c00 = z, c01 = z, c02 = z, c03 = z, c10 = z, c11 = z, c12 = z, c13 = z, c20 = z, c21 = z, c22 = z,
        c23 = z, c30 = z, c31 = z, c32 = z, c33 = z;
    int a0 = kOff, a1 = a0 + kStride, a2 = a1 + kStride, a3 = a2 + kStride;
    int bi = qtOff;
    for (int kk = 0; kk < nk; kk++, bi += qtStride) {
      FloatVector b0 = FloatVector.fromArray(SPECIES, qt, bi);
      FloatVector b1 = FloatVector.fromArray(SPECIES, qt, bi + VL);
      FloatVector b2 = FloatVector.fromArray(SPECIES, qt, bi + 2 * VL);
      FloatVector b3 = FloatVector.fromArray(SPECIES, qt, bi + 3 * VL);
      FloatVector a = FloatVector.broadcast(SPECIES, k[a0 + kk]);
      c00 = a.fma(b0, c00);
      c01 = a.fma(b1, c01);
      c02 = a.fma(b2, c02);
      c03 = a.fma(b3, c03);
      a = FloatVector.broadcast(SPECIES, k[a1 + kk]);
      c10 = a.fma(b0, c10);
      c11 = a.fma(b1, c11);
      c12 = a.fma(b2, c12);
      c13 = a.fma(b3, c13);
      a = FloatVector.broadcast(SPECIES, k[a2 + kk]);
      c20 = a.fma(b0, c20);
      c21 = a.fma(b1, c21);
      c22 = a.fma(b2, c22);
      c23 = a.fma(b3, c23);
      a = FloatVector.broadcast(SPECIES, k[a3 + kk]);
      c30 = a.fma(b0, c30);
      c31 = a.fma(b1, c31);
      c32 = a.fma(b2, c32);
      c33 = a.fma(b3, c33);
    }
    FloatVector sc = FloatVector.broadcast(SPECIES, scale);
    int ci = sOff;
    c00.mul(sc).intoArray(s, ci);
    c01.mul(sc).intoArray(s, ci + VL);
    c02.mul(sc).intoArray(s, ci + 2 * VL);
    c03.mul(sc).intoArray(s, ci + 3 * VL);
    c10.mul(sc).intoArray(s, ci += sStride);
    c11.mul(sc).intoArray(s, ci + VL);
    c12.mul(sc).intoArray(s, ci + 2 * VL);
    c13.mul(sc).intoArray(s, ci + 3 * VL);
    c20.mul(sc).intoArray(s, ci += sStride);
    c21.mul(sc).intoArray(s, ci + VL);
    c22.mul(sc).intoArray(s, ci + 2 * VL);
    c23.mul(sc).intoArray(s, ci + 3 * VL);
    c30.mul(sc).intoArray(s, ci += sStride);
    c31.mul(sc).intoArray(s, ci + VL);
    c32.mul(sc).intoArray(s, ci + 2 * VL);
    c33.mul(sc).intoArray(s, ci + 3 * VL);
  }

  /**
   * Folds stored scores, rows [0, rows), into hi (max) and sum in row order, over {@code vectors}
   * vectors of lanes from {@code lane}: per lane the same operations as the end of {@link #scores6},
   * so the same bits.
   */
  private static void fold(float[] s, int sOff, int sStride, int rows, int lane, int vectors, float[] hi,
      float[] sum) {
    for (int c = 0; c < vectors * VL; c += VL) {
      FloatVector h = FloatVector.fromArray(SPECIES, hi, lane + c);
      FloatVector l = FloatVector.fromArray(SPECIES, sum, lane + c);
      for (int r = 0, ci = sOff + c; r < rows; r++, ci += sStride) {
        FloatVector x = FloatVector.fromArray(SPECIES, s, ci);
        h = h.max(x);
        l = l.add(x);
      }
      h.intoArray(hi, lane + c);
      l.intoArray(sum, lane + c);
    }
  }

  private static void scores1(float[] k, int a0, int nk, float[] qt, int qtOff, int qtStride, float[] s, int ci,
      float scale, float[] hi, float[] sum) {
    FloatVector c0 = FloatVector.zero(SPECIES), c1 = c0;
    int bi = qtOff;
    for (int kk = 0; kk < nk; kk++, bi += qtStride) {
      FloatVector a = FloatVector.broadcast(SPECIES, k[a0 + kk]);
      c0 = a.fma(FloatVector.fromArray(SPECIES, qt, bi), c0);
      c1 = a.fma(FloatVector.fromArray(SPECIES, qt, bi + VL), c1);
    }
    FloatVector sc = FloatVector.broadcast(SPECIES, scale);
    c0 = c0.mul(sc);
    c1 = c1.mul(sc);
    c0.intoArray(s, ci);
    c1.intoArray(s, ci + VL);
    FloatVector h0 = FloatVector.fromArray(SPECIES, hi, qtOff), h1 = FloatVector.fromArray(SPECIES, hi, qtOff + VL);
    FloatVector l0 = FloatVector.fromArray(SPECIES, sum, qtOff), l1 = FloatVector.fromArray(SPECIES, sum, qtOff + VL);
    h0 = h0.max(c0);
    h1 = h1.max(c1);
    l0 = l0.add(c0);
    l1 = l1.add(c1);
    h0.intoArray(hi, qtOff);
    h1.intoArray(hi, qtOff + VL);
    l0.intoArray(sum, qtOff);
    l1.intoArray(sum, qtOff + VL);
  }


  /**
   * Ot[x][lanes] += sum_k V[k][x] * P[k][lanes] for x in [0, nx): A is read down columns of V
   * (six neighbouring dims of one key per step).
   */
  static void accumulate(float[] v, int vOff, int vStride, int nx, int nk,
      float[] p, int pStride, float[] ot, int otStride, int lanes) {
    int end = sixRowsEnd(nx);
    int wide = wideLanes(lanes);
    for (int g = 0; g < wide; g += 2 * GROUP) {
      accumulate6x4(v, vOff, vStride, end, nk, p, g, pStride, ot, g, otStride);
    }
    int x = 0;
    for (; x < end; x += 6) {
      for (int g = wide; g < lanes; g += GROUP) {
        accumulate6(v, vOff + x, vStride, nk, p, g, pStride, ot, x * otStride + g, otStride);
      }
    }
    for (; x + 4 <= nx; x += 4) {
      for (int g = 0; g < wide; g += 2 * GROUP) {
        accumulate4x4(v, vOff + x, vStride, nk, p, g, pStride, ot, x * otStride + g, otStride);
      }
      for (int g = wide; g < lanes; g += GROUP) {
        accumulate4(v, vOff + x, vStride, nk, p, g, pStride, ot, x * otStride + g, otStride);
      }
    }
    for (; x < nx; x++) {
      for (int g = 0; g < lanes; g += GROUP) {
        accumulate1(v, vOff + x, vStride, nk, p, g, pStride, ot, x * otStride + g);
      }
    }
  }

  private static void accumulate4(float[] v, int vOff, int vStride, int nk, float[] p, int pOff, int pStride,
      float[] ot, int otOff, int otStride) {
    int ci = otOff;
    FloatVector c00 = FloatVector.fromArray(SPECIES, ot, ci), c01 = FloatVector.fromArray(SPECIES, ot, ci + VL);
    FloatVector c10 = FloatVector.fromArray(SPECIES, ot, ci + otStride);
    FloatVector c11 = FloatVector.fromArray(SPECIES, ot, ci + otStride + VL);
    FloatVector c20 = FloatVector.fromArray(SPECIES, ot, ci + 2 * otStride);
    FloatVector c21 = FloatVector.fromArray(SPECIES, ot, ci + 2 * otStride + VL);
    FloatVector c30 = FloatVector.fromArray(SPECIES, ot, ci + 3 * otStride);
    FloatVector c31 = FloatVector.fromArray(SPECIES, ot, ci + 3 * otStride + VL);
    int ai = vOff;
    int bi = pOff;
    for (int kk = 0; kk < nk; kk++, bi += pStride, ai += vStride) {
      FloatVector b0 = FloatVector.fromArray(SPECIES, p, bi);
      FloatVector b1 = FloatVector.fromArray(SPECIES, p, bi + VL);
      FloatVector a = FloatVector.broadcast(SPECIES, v[ai]);
      c00 = a.fma(b0, c00);
      c01 = a.fma(b1, c01);
      a = FloatVector.broadcast(SPECIES, v[ai + 1]);
      c10 = a.fma(b0, c10);
      c11 = a.fma(b1, c11);
      a = FloatVector.broadcast(SPECIES, v[ai + 2]);
      c20 = a.fma(b0, c20);
      c21 = a.fma(b1, c21);
      a = FloatVector.broadcast(SPECIES, v[ai + 3]);
      c30 = a.fma(b0, c30);
      c31 = a.fma(b1, c31);
    }
    c00.intoArray(ot, ci);
    c01.intoArray(ot, ci + VL);
    c10.intoArray(ot, ci += otStride);
    c11.intoArray(ot, ci + VL);
    c20.intoArray(ot, ci += otStride);
    c21.intoArray(ot, ci + VL);
    c30.intoArray(ot, ci += otStride);
    c31.intoArray(ot, ci + VL);
  }

  private static void accumulate6(float[] v, int vOff, int vStride, int nk, float[] p, int pOff, int pStride,
      float[] ot, int otOff, int otStride) {
    int ci = otOff;
    FloatVector c00 = FloatVector.fromArray(SPECIES, ot, ci), c01 = FloatVector.fromArray(SPECIES, ot, ci + VL);
    FloatVector c10 = FloatVector.fromArray(SPECIES, ot, ci + otStride);
    FloatVector c11 = FloatVector.fromArray(SPECIES, ot, ci + otStride + VL);
    FloatVector c20 = FloatVector.fromArray(SPECIES, ot, ci + 2 * otStride);
    FloatVector c21 = FloatVector.fromArray(SPECIES, ot, ci + 2 * otStride + VL);
    FloatVector c30 = FloatVector.fromArray(SPECIES, ot, ci + 3 * otStride);
    FloatVector c31 = FloatVector.fromArray(SPECIES, ot, ci + 3 * otStride + VL);
    FloatVector c40 = FloatVector.fromArray(SPECIES, ot, ci + 4 * otStride);
    FloatVector c41 = FloatVector.fromArray(SPECIES, ot, ci + 4 * otStride + VL);
    FloatVector c50 = FloatVector.fromArray(SPECIES, ot, ci + 5 * otStride);
    FloatVector c51 = FloatVector.fromArray(SPECIES, ot, ci + 5 * otStride + VL);
    int ai = vOff;
    int bi = pOff;
    for (int kk = 0; kk < nk; kk++, bi += pStride, ai += vStride) {
      FloatVector b0 = FloatVector.fromArray(SPECIES, p, bi);
      FloatVector b1 = FloatVector.fromArray(SPECIES, p, bi + VL);
      FloatVector a = FloatVector.broadcast(SPECIES, v[ai]);
      c00 = a.fma(b0, c00);
      c01 = a.fma(b1, c01);
      a = FloatVector.broadcast(SPECIES, v[ai + 1]);
      c10 = a.fma(b0, c10);
      c11 = a.fma(b1, c11);
      a = FloatVector.broadcast(SPECIES, v[ai + 2]);
      c20 = a.fma(b0, c20);
      c21 = a.fma(b1, c21);
      a = FloatVector.broadcast(SPECIES, v[ai + 3]);
      c30 = a.fma(b0, c30);
      c31 = a.fma(b1, c31);
      a = FloatVector.broadcast(SPECIES, v[ai + 4]);
      c40 = a.fma(b0, c40);
      c41 = a.fma(b1, c41);
      a = FloatVector.broadcast(SPECIES, v[ai + 5]);
      c50 = a.fma(b0, c50);
      c51 = a.fma(b1, c51);
    }
    c00.intoArray(ot, ci);
    c01.intoArray(ot, ci + VL);
    c10.intoArray(ot, ci += otStride);
    c11.intoArray(ot, ci + VL);
    c20.intoArray(ot, ci += otStride);
    c21.intoArray(ot, ci + VL);
    c30.intoArray(ot, ci += otStride);
    c31.intoArray(ot, ci + VL);
    c40.intoArray(ot, ci += otStride);
    c41.intoArray(ot, ci + VL);
    c50.intoArray(ot, ci += otStride);
    c51.intoArray(ot, ci + VL);
  }

  /**
   * {@link #accumulate6} for rows [0, nx) of Ot (a multiple of six), four vectors wide: lanes
   * [pOff, pOff + 2 * GROUP). The loop over six-row blocks is in here, as in {@link #scores6x4}.
   */
  private static void accumulate6x4(float[] v, int vOff, int vStride, int nx, int nk, float[] p, int pOff, int pStride,
      float[] ot, int otOff, int otStride) {
    for (int x = 0; x < nx; x += 6) {
      int r0 = otOff + x * otStride, r1 = r0 + otStride, r2 = r1 + otStride, r3 = r2 + otStride, r4 = r3 + otStride,
          r5 = r4 + otStride;
      FloatVector c00 = FloatVector.fromArray(SPECIES, ot, r0), c01 = FloatVector.fromArray(SPECIES, ot, r0 + VL);
      FloatVector c02 = FloatVector.fromArray(SPECIES, ot, r0 + 2 * VL), c03 = FloatVector.fromArray(SPECIES, ot, r0 + 3 * VL);
      FloatVector c10 = FloatVector.fromArray(SPECIES, ot, r1), c11 = FloatVector.fromArray(SPECIES, ot, r1 + VL);
      FloatVector c12 = FloatVector.fromArray(SPECIES, ot, r1 + 2 * VL), c13 = FloatVector.fromArray(SPECIES, ot, r1 + 3 * VL);
      FloatVector c20 = FloatVector.fromArray(SPECIES, ot, r2), c21 = FloatVector.fromArray(SPECIES, ot, r2 + VL);
      FloatVector c22 = FloatVector.fromArray(SPECIES, ot, r2 + 2 * VL), c23 = FloatVector.fromArray(SPECIES, ot, r2 + 3 * VL);
      FloatVector c30 = FloatVector.fromArray(SPECIES, ot, r3), c31 = FloatVector.fromArray(SPECIES, ot, r3 + VL);
      FloatVector c32 = FloatVector.fromArray(SPECIES, ot, r3 + 2 * VL), c33 = FloatVector.fromArray(SPECIES, ot, r3 + 3 * VL);
      FloatVector c40 = FloatVector.fromArray(SPECIES, ot, r4), c41 = FloatVector.fromArray(SPECIES, ot, r4 + VL);
      FloatVector c42 = FloatVector.fromArray(SPECIES, ot, r4 + 2 * VL), c43 = FloatVector.fromArray(SPECIES, ot, r4 + 3 * VL);
      FloatVector c50 = FloatVector.fromArray(SPECIES, ot, r5), c51 = FloatVector.fromArray(SPECIES, ot, r5 + VL);
      FloatVector c52 = FloatVector.fromArray(SPECIES, ot, r5 + 2 * VL), c53 = FloatVector.fromArray(SPECIES, ot, r5 + 3 * VL);
      int ai = vOff + x;
      int bi = pOff;
      for (int kk = 0; kk < nk; kk++, bi += pStride, ai += vStride) {
        FloatVector b0 = FloatVector.fromArray(SPECIES, p, bi);
        FloatVector b1 = FloatVector.fromArray(SPECIES, p, bi + VL);
        FloatVector b2 = FloatVector.fromArray(SPECIES, p, bi + 2 * VL);
        FloatVector b3 = FloatVector.fromArray(SPECIES, p, bi + 3 * VL);
        FloatVector a = FloatVector.broadcast(SPECIES, v[ai]);
        c00 = a.fma(b0, c00);
        c01 = a.fma(b1, c01);
        c02 = a.fma(b2, c02);
        c03 = a.fma(b3, c03);
        a = FloatVector.broadcast(SPECIES, v[ai + 1]);
        c10 = a.fma(b0, c10);
        c11 = a.fma(b1, c11);
        c12 = a.fma(b2, c12);
        c13 = a.fma(b3, c13);
        a = FloatVector.broadcast(SPECIES, v[ai + 2]);
        c20 = a.fma(b0, c20);
        c21 = a.fma(b1, c21);
        c22 = a.fma(b2, c22);
        c23 = a.fma(b3, c23);
        a = FloatVector.broadcast(SPECIES, v[ai + 3]);
        c30 = a.fma(b0, c30);
        c31 = a.fma(b1, c31);
        c32 = a.fma(b2, c32);
        c33 = a.fma(b3, c33);
        a = FloatVector.broadcast(SPECIES, v[ai + 4]);
        c40 = a.fma(b0, c40);
        c41 = a.fma(b1, c41);
        c42 = a.fma(b2, c42);
        c43 = a.fma(b3, c43);
        a = FloatVector.broadcast(SPECIES, v[ai + 5]);
        c50 = a.fma(b0, c50);
        c51 = a.fma(b1, c51);
        c52 = a.fma(b2, c52);
        c53 = a.fma(b3, c53);
      }
      c00.intoArray(ot, r0);
      c01.intoArray(ot, r0 + VL);
      c02.intoArray(ot, r0 + 2 * VL);
      c03.intoArray(ot, r0 + 3 * VL);
      c10.intoArray(ot, r1);
      c11.intoArray(ot, r1 + VL);
      c12.intoArray(ot, r1 + 2 * VL);
      c13.intoArray(ot, r1 + 3 * VL);
      c20.intoArray(ot, r2);
      c21.intoArray(ot, r2 + VL);
      c22.intoArray(ot, r2 + 2 * VL);
      c23.intoArray(ot, r2 + 3 * VL);
      c30.intoArray(ot, r3);
      c31.intoArray(ot, r3 + VL);
      c32.intoArray(ot, r3 + 2 * VL);
      c33.intoArray(ot, r3 + 3 * VL);
      c40.intoArray(ot, r4);
      c41.intoArray(ot, r4 + VL);
      c42.intoArray(ot, r4 + 2 * VL);
      c43.intoArray(ot, r4 + 3 * VL);
      c50.intoArray(ot, r5);
      c51.intoArray(ot, r5 + VL);
      c52.intoArray(ot, r5 + 2 * VL);
      c53.intoArray(ot, r5 + 3 * VL);
    }
  }

  /** {@link #accumulate4} four vectors wide, for the dims after the six-row blocks (see {@link #scores4x4}). */
  private static void accumulate4x4(float[] v, int vOff, int vStride, int nk, float[] p, int pOff, int pStride,
      float[] ot, int otOff, int otStride) {
    int r0 = otOff, r1 = r0 + otStride, r2 = r1 + otStride, r3 = r2 + otStride;
    FloatVector c00 = FloatVector.fromArray(SPECIES, ot, r0), c01 = FloatVector.fromArray(SPECIES, ot, r0 + VL);
    FloatVector c02 = FloatVector.fromArray(SPECIES, ot, r0 + 2 * VL), c03 = FloatVector.fromArray(SPECIES, ot, r0 + 3 * VL);
    FloatVector c10 = FloatVector.fromArray(SPECIES, ot, r1), c11 = FloatVector.fromArray(SPECIES, ot, r1 + VL);
    FloatVector c12 = FloatVector.fromArray(SPECIES, ot, r1 + 2 * VL), c13 = FloatVector.fromArray(SPECIES, ot, r1 + 3 * VL);
    FloatVector c20 = FloatVector.fromArray(SPECIES, ot, r2), c21 = FloatVector.fromArray(SPECIES, ot, r2 + VL);
    FloatVector c22 = FloatVector.fromArray(SPECIES, ot, r2 + 2 * VL), c23 = FloatVector.fromArray(SPECIES, ot, r2 + 3 * VL);
    FloatVector c30 = FloatVector.fromArray(SPECIES, ot, r3), c31 = FloatVector.fromArray(SPECIES, ot, r3 + VL);
    FloatVector c32 = FloatVector.fromArray(SPECIES, ot, r3 + 2 * VL), c33 = FloatVector.fromArray(SPECIES, ot, r3 + 3 * VL);
    int ai = vOff;
    int bi = pOff;
    for (int kk = 0; kk < nk; kk++, bi += pStride, ai += vStride) {
      FloatVector b0 = FloatVector.fromArray(SPECIES, p, bi);
      FloatVector b1 = FloatVector.fromArray(SPECIES, p, bi + VL);
      FloatVector b2 = FloatVector.fromArray(SPECIES, p, bi + 2 * VL);
      FloatVector b3 = FloatVector.fromArray(SPECIES, p, bi + 3 * VL);
      FloatVector a = FloatVector.broadcast(SPECIES, v[ai]);
      c00 = a.fma(b0, c00);
      c01 = a.fma(b1, c01);
      c02 = a.fma(b2, c02);
      c03 = a.fma(b3, c03);
      a = FloatVector.broadcast(SPECIES, v[ai + 1]);
      c10 = a.fma(b0, c10);
      c11 = a.fma(b1, c11);
      c12 = a.fma(b2, c12);
      c13 = a.fma(b3, c13);
      a = FloatVector.broadcast(SPECIES, v[ai + 2]);
      c20 = a.fma(b0, c20);
      c21 = a.fma(b1, c21);
      c22 = a.fma(b2, c22);
      c23 = a.fma(b3, c23);
      a = FloatVector.broadcast(SPECIES, v[ai + 3]);
      c30 = a.fma(b0, c30);
      c31 = a.fma(b1, c31);
      c32 = a.fma(b2, c32);
      c33 = a.fma(b3, c33);
    }
    c00.intoArray(ot, r0);
    c01.intoArray(ot, r0 + VL);
    c02.intoArray(ot, r0 + 2 * VL);
    c03.intoArray(ot, r0 + 3 * VL);
    c10.intoArray(ot, r1);
    c11.intoArray(ot, r1 + VL);
    c12.intoArray(ot, r1 + 2 * VL);
    c13.intoArray(ot, r1 + 3 * VL);
    c20.intoArray(ot, r2);
    c21.intoArray(ot, r2 + VL);
    c22.intoArray(ot, r2 + 2 * VL);
    c23.intoArray(ot, r2 + 3 * VL);
    c30.intoArray(ot, r3);
    c31.intoArray(ot, r3 + VL);
    c32.intoArray(ot, r3 + 2 * VL);
    c33.intoArray(ot, r3 + 3 * VL);
  }

  private static void accumulate1(float[] v, int vOff, int vStride, int nk, float[] p, int pOff, int pStride,
      float[] ot, int ci) {
    FloatVector c0 = FloatVector.fromArray(SPECIES, ot, ci), c1 = FloatVector.fromArray(SPECIES, ot, ci + VL);
    int ai = vOff;
    int bi = pOff;
    for (int kk = 0; kk < nk; kk++, bi += pStride, ai += vStride) {
      FloatVector a = FloatVector.broadcast(SPECIES, v[ai]);
      c0 = a.fma(FloatVector.fromArray(SPECIES, p, bi), c0);
      c1 = a.fma(FloatVector.fromArray(SPECIES, p, bi + VL), c1);
    }
    c0.intoArray(ot, ci);
    c1.intoArray(ot, ci + VL);
  }
}
