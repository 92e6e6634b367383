package io.longctx.kernels;

import static org.junit.jupiter.api.Assertions.assertEquals;

import java.math.BigInteger;
import java.util.Arrays;
import java.util.SplittableRandom;
import org.junit.jupiter.api.Test;

/**
 * The one visibility rule ({@link AttentionOptions#visible} and its range and count forms) against
 * exact integer arithmetic, over the whole long range: positions at and near Long.MIN_VALUE and
 * Long.MAX_VALUE, windows up to Long.MAX_VALUE, where {@code q - window} overflows.
 */
class VisibilityRuleTest {

  static final long[] EDGES = {Long.MIN_VALUE, Long.MIN_VALUE + 1, Long.MIN_VALUE + 2, -3, -1, 0, 1, 2,
      Long.MAX_VALUE - 2, Long.MAX_VALUE - 1, Long.MAX_VALUE};
  static final long[] WINDOWS = {0, 1, 2, 3, 1L << 40, Long.MAX_VALUE / 2, Long.MAX_VALUE - 1, Long.MAX_VALUE};

  /** The rule by definition, in exact integers: causal k <= q; window k in (q - w, q]. */
  static boolean exact(AttentionOptions o, long q, long k) {
    if (!o.masked()) {
      return true;
    }
    if (k > q) {
      return false;
    }
    return o.window() <= 0 || BigInteger.valueOf(k).compareTo(BigInteger.valueOf(q).subtract(BigInteger.valueOf(o.window()))) > 0;
  }

  static long pick(SplittableRandom rng) {
    return switch (rng.nextInt(3)) {
      case 0 -> EDGES[rng.nextInt(EDGES.length)] + rng.nextInt(-2, 3) * (rng.nextBoolean() ? 1 : 0);
      case 1 -> rng.nextLong();
      default -> rng.nextLong(-50, 50);
    };
  }

  @Test
  void pairsAtTheEdgesOfTheLongRange() {
    for (long w : WINDOWS) {
      for (boolean causal : new boolean[] {false, true}) {
        AttentionOptions o = AttentionOptions.DEFAULT.withCausal(causal).withWindow(w);
        for (long q : EDGES) {
          for (long k : EDGES) {
            assertEquals(exact(o, q, k), o.visible(q, k), o + " q=" + q + " k=" + k);
          }
        }
      }
    }
  }

  @Test
  void rangesAndCountsAgreeWithThePairRule() {
    long seed = Seeds.forTest();
    SplittableRandom rng = new SplittableRandom(seed);
    for (int trial = 0; trial < 3000; trial++) {
      long w = rng.nextBoolean() ? WINDOWS[rng.nextInt(WINDOWS.length)] : rng.nextLong(0, 40);
      AttentionOptions o = AttentionOptions.DEFAULT.withCausal(rng.nextBoolean()).withWindow(w);
      long[] qs = new long[1 + rng.nextInt(4)];
      long[] ks = new long[1 + rng.nextInt(6)];
      long base = pick(rng);
      for (int i = 0; i < qs.length; i++) {
        qs[i] = rng.nextInt(4) == 0 ? pick(rng) : clampAdd(base, rng.nextLong(-30, 30));
      }
      for (int i = 0; i < ks.length; i++) {
        ks[i] = rng.nextInt(4) == 0 ? pick(rng) : clampAdd(base, rng.nextLong(-30, 30));
      }
      Arrays.sort(ks);
      long qMin = Arrays.stream(qs).min().getAsLong(), qMax = Arrays.stream(qs).max().getAsLong();
      long kMin = ks[0], kMax = ks[ks.length - 1];
      String where = "seed " + seed + " (replay: -Dlongctx.seed=" + seed + "), trial " + trial + ", " + o + ", q "
          + Arrays.toString(qs) + ", k " + Arrays.toString(ks);
      // Range forms over the extreme points: every (q, k) of the ranges' corners and the ones given.
      boolean any = false, all = true;
      for (long q : qs) {
        int count = 0;
        for (long k : ks) {
          boolean v = exact(o, q, k);
          any |= v;
          all &= v;
          count += v ? 1 : 0;
        }
        assertEquals(count, o.visibleCount(ks, q), "count, " + where);
      }
      // anyVisible may say true for ranges whose listed points see nothing (it is about ranges),
      // but never false when a listed pair is visible; with the range's end points it is exact.
      if (any) {
        assertEquals(true, o.anyVisible(qMin, qMax, kMin, kMax), "anyVisible, " + where);
      }
      if (o.allVisible(qMin, qMax, kMin, kMax)) {
        assertEquals(true, all, "allVisible, " + where);
      }
      boolean cornerAny = exact(o, qMin, kMin) || exact(o, qMin, kMax) || exact(o, qMax, kMin) || exact(o, qMax, kMax)
          || (kMin <= qMax && kMax >= qMin && o.masked()) || !o.masked();
      assertEquals(cornerAny, o.anyVisible(qMin, qMax, kMin, kMax), "anyVisible exact on ranges, " + where);
      boolean cornerAll = exact(o, qMin, kMax) && exact(o, qMax, kMin) && exact(o, qMin, kMin) && exact(o, qMax, kMax);
      assertEquals(cornerAll, o.allVisible(qMin, qMax, kMin, kMax), "allVisible exact on ranges, " + where);
    }
  }

  static long clampAdd(long a, long b) {
    long r = a + b;
    if (((a ^ r) & (b ^ r)) < 0) {
      return b > 0 ? Long.MAX_VALUE : Long.MIN_VALUE;
    }
    return r;
  }
}
