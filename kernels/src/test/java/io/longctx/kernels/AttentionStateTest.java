package io.longctx.kernels;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.SplittableRandom;
import org.junit.jupiter.api.Test;

/** The merge algebra and the chunking invariance it buys. */
class AttentionStateTest {

  static final int ROWS = 5, HEADS = 3, DIM = 16;

  /** A random state; about one entry in five is empty (lse -inf), lse spans +-1e4. */
  static AttentionState randomState(SplittableRandom rng) {
    float[] o = new float[ROWS * HEADS * DIM];
    float[] lse = new float[ROWS * HEADS];
    for (int i = 0; i < lse.length; i++) {
      if (rng.nextInt(5) == 0) {
        lse[i] = Float.NEGATIVE_INFINITY;
        continue;
      }
      lse[i] = (float) (rng.nextBoolean() ? rng.nextGaussian() * 5 : rng.nextGaussian() * 1e4);
      for (int d = 0; d < DIM; d++) {
        o[i * DIM + d] = (float) rng.nextGaussian();
      }
    }
    return AttentionState.of(o, lse, ROWS, HEADS, DIM);
  }

  static void assertClose(AttentionState a, AttentionState b, String msg) {
    for (int i = 0; i < a.lse().length; i++) {
      float x = a.lse()[i], y = b.lse()[i];
      if (x == Float.NEGATIVE_INFINITY || y == Float.NEGATIVE_INFINITY) {
        assertEquals(x, y, msg + " entry " + i);
      } else {
        assertEquals(x, y, 2e-6 * Math.max(1, Math.abs(x)), msg + " lse entry " + i);
      }
    }
    for (int i = 0; i < a.o().length; i++) {
      assertEquals(a.o()[i], b.o()[i], 2e-6 * Math.max(1, Math.abs(a.o()[i])), msg + " o element " + i);
    }
  }

  /** The documented tree, written out: halves [from, mid) and [mid, to) with mid = (from + to) / 2. */
  private static AttentionState tree(List<AttentionState> s, int from, int to) {
    if (to - from == 1) {
      return s.get(from);
    }
    int mid = (from + to) >>> 1;
    return tree(s, from, mid).merge(tree(s, mid, to));
  }

  @Test
  void streamedMergeAllIsTheBalancedTreeBitForBitAndPullsLazily() {
    SplittableRandom rng = new SplittableRandom(41);
    for (int n = 1; n <= 17; n++) {
      List<AttentionState> states = new java.util.ArrayList<>();
      for (int i = 0; i < n; i++) {
        states.add(randomState(rng));
      }
      AttentionState whole = tree(states, 0, n);
      int[] pulled = {0};
      java.util.Iterator<AttentionState> it = new java.util.Iterator<>() {
        @Override
        public boolean hasNext() {
          return true; // more than n on offer: mergeAll must take exactly n
        }

        @Override
        public AttentionState next() {
          return states.get(pulled[0]++ % states.size());
        }
      };
      AttentionState streamed = AttentionState.mergeAll(n, it);
      assertEquals(n, pulled[0], "states taken for n=" + n);
      assertArrayEquals(whole.o(), streamed.o(), "o, n=" + n);
      assertArrayEquals(whole.lse(), streamed.lse(), "lse, n=" + n);
      assertArrayEquals(whole.o(), AttentionState.mergeAll(states).o(), "list form, n=" + n);
    }
    assertThrows(IllegalArgumentException.class,
        () -> AttentionState.mergeAll(3, List.of(randomState(rng), randomState(rng)).iterator()));
  }

  @Test
  void treeMergesFedInTurnAreEachTheBalancedTree() {
    SplittableRandom rng = new SplittableRandom(43);
    for (int n = 1; n <= 40; n++) {
      int m = 1 + (n * 7) % 23; // a second tree of another size, fed in the same loop
      List<AttentionState> a = new java.util.ArrayList<>(), b = new java.util.ArrayList<>();
      AttentionState.TreeMerge ta = new AttentionState.TreeMerge(n), tb = new AttentionState.TreeMerge(m);
      for (int i = 0; i < Math.max(n, m); i++) {
        if (i < n) {
          a.add(randomState(rng));
          ta.add(a.get(i));
        }
        if (i < m) {
          b.add(randomState(rng));
          tb.add(b.get(i));
        }
      }
      assertArrayEquals(tree(a, 0, n).o(), ta.result().o(), "o, n=" + n);
      assertArrayEquals(tree(a, 0, n).lse(), ta.result().lse(), "lse, n=" + n);
      assertArrayEquals(tree(b, 0, m).o(), tb.result().o(), "o, m=" + m);
      AttentionState.TreeMerge full = ta;
      assertThrows(IllegalStateException.class, () -> full.add(a.get(0)), "more than n states");
    }
    AttentionState.TreeMerge part = new AttentionState.TreeMerge(3);
    part.add(randomState(rng));
    IllegalStateException e = assertThrows(IllegalStateException.class, part::result);
    assertTrue(e.getMessage().contains("1 of 3"), e.getMessage());
    assertThrows(IllegalArgumentException.class, () -> new AttentionState.TreeMerge(0));
  }

  @Test
  void mergeIsCommutativeBitForBitAndAssociativeWithinRounding() {
    long seed = Seeds.forTest();
    SplittableRandom rng = new SplittableRandom(seed);
    for (int trial = 0; trial < 50; trial++) {
      AttentionState a = randomState(rng), b = randomState(rng), c = randomState(rng);
      AttentionState ab = a.merge(b), ba = b.merge(a);
      assertArrayEquals(ab.o(), ba.o(), "seed " + seed);
      assertArrayEquals(ab.lse(), ba.lse(), "seed " + seed);
      assertClose(ab.merge(c), a.merge(b.merge(c)), "seed " + seed);
    }
  }

  @Test
  void emptyIsTheIdentityAndTwoEmptiesStayEmpty() {
    long seed = Seeds.forTest();
    AttentionState a = randomState(new SplittableRandom(seed));
    AttentionState e = AttentionState.empty(ROWS, HEADS, DIM);
    AttentionState ae = a.merge(e), ea = e.merge(a);
    assertArrayEquals(a.o(), ae.o(), "seed " + seed);
    assertArrayEquals(a.lse(), ae.lse(), "seed " + seed);
    assertArrayEquals(a.o(), ea.o(), "seed " + seed);
    AttentionState ee = e.merge(e);
    for (float l : ee.lse()) {
      assertEquals(Float.NEGATIVE_INFINITY, l);
    }
    for (float x : ee.o()) {
      assertEquals(0f, x); // not NaN
    }
  }

  @Test
  void mergeMatchesTheDefinition() {
    float[] o1 = {1, 2}, o2 = {3, -4};
    AttentionState a = AttentionState.of(o1, new float[] {0f}, 1, 1, 2);
    AttentionState b = AttentionState.of(o2, new float[] {(float) Math.log(3)}, 1, 1, 2);
    AttentionState m = a.merge(b);
    // weights 1 and 3: o = (1*o1 + 3*o2) / 4, lse = log 4
    assertEquals(2.5f, m.o(0, 0, 0), 1e-6);
    assertEquals(-2.5f, m.o(0, 0, 1), 1e-6);
    assertEquals(Math.log(4), m.lse(0, 0), 1e-6);
    // Far apart lse (1e4): the smaller one vanishes without overflow.
    AttentionState far = AttentionState.of(new float[] {7, 7}, new float[] {1e4f}, 1, 1, 2).merge(a);
    assertEquals(7f, far.o(0, 0, 0));
    assertEquals(1e4f, far.lse(0, 0));
  }

  @Test
  void mergeAllIsABalancedTreeInListOrder() {
    long seed = Seeds.forTest();
    SplittableRandom rng = new SplittableRandom(seed);
    List<AttentionState> states = new ArrayList<>();
    for (int i = 0; i < 5; i++) {
      states.add(randomState(rng));
    }
    AttentionState tree = AttentionState.mergeAll(states);
    AttentionState expected = states.get(0).merge(states.get(1))
        .merge(states.get(2).merge(states.get(3).merge(states.get(4))));
    assertArrayEquals(expected.o(), tree.o(), "seed " + seed);
    assertArrayEquals(expected.lse(), tree.lse(), "seed " + seed);
    assertThrows(IllegalArgumentException.class, () -> AttentionState.mergeAll(List.of()));
  }

  /**
   * The float64-lse entry point (split-K decoding) runs the same merge: on two states with lse
   * widened from float it gives the float32 path's bits; on five it is the same balanced tree,
   * rounding lse only at the end; empty entries stay (0, -inf) without NaN.
   */
  @Test
  void wideLseMergeIsTheSameMergeRoundedOnce() {
    long seed = Seeds.forTest();
    SplittableRandom rng = new SplittableRandom(seed);
    List<AttentionState> states = new ArrayList<>();
    for (int i = 0; i < 5; i++) {
      states.add(randomState(rng));
    }
    List<float[]> o = new ArrayList<>();
    List<double[]> lse = new ArrayList<>();
    for (AttentionState s : states) {
      o.add(s.o().clone());
      double[] l = new double[s.lse().length];
      for (int i = 0; i < l.length; i++) {
        l[i] = s.lse()[i];
      }
      lse.add(l);
    }
    AttentionState two = AttentionState.mergeAllWideLse(
        List.of(o.get(0).clone(), o.get(1).clone()), List.of(lse.get(0).clone(), lse.get(1).clone()), ROWS, HEADS, DIM);
    AttentionState want = states.get(0).merge(states.get(1));
    assertArrayEquals(want.o(), two.o(), "seed " + seed);
    assertArrayEquals(want.lse(), two.lse(), "seed " + seed);

    AttentionState five = AttentionState.mergeAllWideLse(o, lse, ROWS, HEADS, DIM);
    AttentionState tree = AttentionState.mergeAll(states);
    assertClose(tree, five, "seed " + seed);
    for (int i = 0; i < five.lse().length; i++) {
      boolean allEmpty = true;
      for (AttentionState s : states) {
        allEmpty &= s.lse()[i] == Float.NEGATIVE_INFINITY;
      }
      assertEquals(allEmpty, five.lse()[i] == Float.NEGATIVE_INFINITY, "seed " + seed + " entry " + i);
    }
    // All empty: the identity, no NaN.
    AttentionState e = AttentionState.empty(ROWS, HEADS, DIM);
    double[] ninf = new double[ROWS * HEADS];
    Arrays.fill(ninf, Double.NEGATIVE_INFINITY);
    AttentionState ee = AttentionState.mergeAllWideLse(List.of(new float[ROWS * HEADS * DIM], new float[ROWS * HEADS * DIM],
        new float[ROWS * HEADS * DIM]), List.of(ninf.clone(), ninf.clone(), ninf.clone()), ROWS, HEADS, DIM);
    assertArrayEquals(e.o(), ee.o());
    assertArrayEquals(e.lse(), ee.lse());
  }

  @Test
  void nanAndPlusInfinityAreRejectedNamingRowAndHead() {
    float[] o = new float[2 * 3 * 4];
    float[] lse = new float[2 * 3];
    lse[4] = Float.NaN; // row 1, head 1
    IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> AttentionState.of(o, lse, 2, 3, 4));
    assertTrue(e.getMessage().contains("row 1, head 1"), e.getMessage());
    lse[4] = 0;
    o[4 * 4 + 2] = Float.NaN;
    e = assertThrows(IllegalArgumentException.class, () -> AttentionState.of(o, lse, 2, 3, 4));
    assertTrue(e.getMessage().contains("row 1, head 1"), e.getMessage());
    o[4 * 4 + 2] = 0;
    lse[5] = Float.POSITIVE_INFINITY;
    e = assertThrows(IllegalArgumentException.class, () -> AttentionState.of(o, lse, 2, 3, 4));
    assertTrue(e.getMessage().contains("row 1, head 2") && e.getMessage().contains("fromForeign"), e.getMessage());
    float[] bad = {Float.NaN};
    e = assertThrows(IllegalArgumentException.class,
        () -> AttentionState.mergeInto(new float[1], bad, 0, new float[1], new float[] {0}, 0, new float[1], new float[1], 0, 1, 1));
    assertTrue(e.getMessage().contains("NaN"), e.getMessage());
    // mergeInto from an offset names the entries of a and b, not the index within the range.
    float[] aL = new float[8], bO = new float[8];
    aL[5] = Float.NaN;
    e = assertThrows(IllegalArgumentException.class,
        () -> AttentionState.mergeInto(new float[8], aL, 4, new float[8], new float[8], 2, new float[8], new float[8], 4, 4, 1));
    assertTrue(e.getMessage().contains("entry 5 of a with entry 3 of b") && e.getMessage().contains("NaN"), e.getMessage());
    bO[3] = Float.POSITIVE_INFINITY;
    e = assertThrows(IllegalArgumentException.class,
        () -> AttentionState.mergeInto(new float[8], new float[8], 0, bO, new float[8], 0, new float[8], new float[8], 0, 8, 1));
    assertTrue(e.getMessage().contains("entry 3 of b") && e.getMessage().contains("Infinity in o at dim 0"), e.getMessage());
    assertThrows(IllegalArgumentException.class, () -> AttentionState.of(new float[3], new float[1], 1, 1, 2));
  }

  /**
   * An infinite o is refused like NaN, when a state is made and when raw arrays merge: merged, it
   * gave NaN without a word (inf times a weight of 0 when its lse is far below the other's, or +inf
   * beside -inf).
   */
  @Test
  void infiniteOIsRejectedNamingWhere() {
    float[] o = new float[2 * 3 * 4];
    o[5 * 4 + 3] = Float.POSITIVE_INFINITY; // row 1, head 2, dim 3
    IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
        () -> AttentionState.of(o, new float[2 * 3], 2, 3, 4));
    assertTrue(e.getMessage().contains("Infinity in attention state o at row 1, head 2, dim 3"), e.getMessage());
    e = assertThrows(IllegalArgumentException.class, () -> AttentionState.fromForeign(o, new float[2 * 3], 2, 3, 4,
        AttentionState.LseBase.E));
    assertTrue(e.getMessage().contains("row 1, head 2, dim 3"), e.getMessage());
    // "No keys" is (0, -inf): a non-zero o beside -inf came back as it was from a merge of one state.
    float[] lse = new float[2 * 3];
    lse[4] = Float.NEGATIVE_INFINITY; // row 1, head 1
    float[] o2 = new float[2 * 3 * 4];
    o2[4 * 4 + 1] = 5f;
    e = assertThrows(IllegalArgumentException.class, () -> AttentionState.of(o2, lse, 2, 3, 4));
    assertTrue(e.getMessage().contains("o is 5.0 at row 1, head 1, dim 1, where lse is -Infinity"), e.getMessage());
    o2[4 * 4 + 1] = -0f;
    AttentionState.of(o2, lse, 2, 3, 4); // -0 is a zero
    float[][] cases = { // o of a, lse of a, o of b, lse of b
        {Float.POSITIVE_INFINITY, 1f, 0f, 2f, 3f, 1000f}, // weight of a underflows to 0: 0 * inf
        {Float.POSITIVE_INFINITY, 1f, 0f, Float.NEGATIVE_INFINITY, 3f, 0f}, // +inf beside -inf
        {1f, 2f, 0f, 3f, Float.NEGATIVE_INFINITY, 5f}};
    for (float[] c : cases) {
      float[] outO = new float[2], outL = new float[1];
      e = assertThrows(IllegalArgumentException.class, () -> AttentionState.mergeInto(new float[] {c[0], c[1]},
          new float[] {c[2]}, 0, new float[] {c[3], c[4]}, new float[] {c[5]}, 0, outO, outL, 0, 1, 2));
      int dim = Float.isFinite(c[0]) && Float.isFinite(c[3]) ? 1 : 0;
      assertTrue(e.getMessage().contains("entry 0 of " + (Float.isFinite(c[0]) ? "b" : "a") + " (row * heads + head): "
          + (Float.isFinite(c[0]) ? c[dim + 3] : c[0]) + " in o at dim " + dim), e.getMessage());
    }
  }

  /**
   * The merge's o loop is the scalar formula, bit for bit, at dims around vector widths, and a NaN
   * is named by its dim: any faster form of the loop must keep both.
   */
  @Test
  void mergeOfOIsTheScalarFormulaBitForBitAndNamesTheDimOfANaN() {
    long seed = 20261124;
    SplittableRandom rng = new SplittableRandom(seed);
    int pairs = 7;
    for (int dim : new int[] {1, 3, 4, 7, 8, 13, 64, 67}) {
      float[] aO = new float[pairs * dim], bO = new float[pairs * dim], aL = new float[pairs], bL = new float[pairs];
      for (int i = 0; i < aO.length; i++) {
        aO[i] = (float) rng.nextGaussian();
        bO[i] = (float) (rng.nextGaussian() * 100);
      }
      for (int p = 0; p < pairs; p++) {
        aL[p] = (float) (rng.nextGaussian() * 10);
        bL[p] = (float) (rng.nextGaussian() * 10);
      }
      float[] outO = new float[pairs * dim], outL = new float[pairs];
      AttentionState.mergeInto(aO, aL, 0, bO, bL, 0, outO, outL, 0, pairs, dim);
      for (int p = 0; p < pairs; p++) {
        double m = Math.max(aL[p], bL[p]);
        double wa = StrictMath.exp(aL[p] - m), wb = StrictMath.exp(bL[p] - m);
        double inv = 1.0 / (wa + wb);
        wa *= inv;
        wb *= inv;
        for (int d = 0; d < dim; d++) {
          int i = p * dim + d;
          float want = (float) (wa * aO[i] + wb * bO[i]);
          assertEquals(Float.floatToIntBits(want), Float.floatToIntBits(outO[i]),
              "dim " + dim + ", entry " + p + ", element " + d + " (seed " + seed + ")");
        }
      }
      int at = rng.nextInt(dim);
      bO[2 * dim + at] = Float.NaN;
      IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
          () -> AttentionState.mergeInto(aO, aL, 0, bO, bL, 0, outO, outL, 0, pairs, dim));
      assertTrue(e.getMessage().contains("entry 2 of b (row * heads + head): NaN in o at dim " + at),
          e.getMessage() + " (seed " + seed + ")");
    }
  }

  @Test
  void theMergeStaysOffTheVectorApi() throws Exception {
    // A Vector API merge (float-to-double shape changes) shared the library's conversion code with the
    // kernel's exp, and in a JVM where merges ran first C2 compiled the kernel without its intrinsics:
    // 8.7 against 155-163 GFLOP/s (docs/BENCHMARKS.md, "Vector API profile pollution"). Keep the merge
    // scalar unless a new form is measured in that order.
    for (Class<?> c : AttentionState.class.getNestMembers()) { // nested classes have class files of their own
      String file = c.getName().substring(c.getPackageName().length() + 1) + ".class";
      try (var in = AttentionState.class.getResourceAsStream(file)) {
        String bytes = new String(in.readAllBytes(), java.nio.charset.StandardCharsets.ISO_8859_1);
        assertTrue(!bytes.contains("jdk/incubator/vector"), file + " uses the Vector API");
      }
    }
  }

  @Test
  void foreignStatesAreConverted() {
    // FlashInfer: base-2 lse. FlashAttention-2: +inf for rows with no key.
    float[] o = {1, 2, 3, 4, 5, 6};
    float[] lse2 = {3f, Float.POSITIVE_INFINITY, Float.NEGATIVE_INFINITY};
    AttentionState s = AttentionState.fromForeign(o, lse2, 3, 1, 2, AttentionState.LseBase.TWO);
    assertEquals(3 * Math.log(2), s.lse(0, 0), 1e-6);
    assertEquals(Float.NEGATIVE_INFINITY, s.lse(1, 0));
    assertEquals(Float.NEGATIVE_INFINITY, s.lse(2, 0));
    assertArrayEquals(new float[] {1, 2, 0, 0, 0, 0}, s.o());
    assertEquals(1f, o[2] / 3f, "input untouched");
    AttentionState e = AttentionState.fromForeign(o, new float[] {1f, 2f, Float.POSITIVE_INFINITY}, 3, 1, 2, AttentionState.LseBase.E);
    assertEquals(2f, e.lse(1, 0));
    assertThrows(IllegalArgumentException.class,
        () -> AttentionState.fromForeign(o, new float[] {Float.NaN, 0, 0}, 3, 1, 2, AttentionState.LseBase.E));
  }

  /** Attention over a sequence equals the merge of attention over any split of it. */
  @Test
  void attentionOverChunksMergesToAttentionOverTheWhole() {
    long seed = Seeds.forTest();
    SplittableRandom rng = new SplittableRandom(seed);
    int heads = 4, kvHeads = 2, tq = 150, tk = 900, dim = 64;
    Tensor q = Tensor.random(rng, 1, heads, tq, dim);
    Tensor k = Tensor.random(rng, 1, kvHeads, tk, dim);
    Tensor v = Tensor.random(rng, 1, kvHeads, tk, dim);
    long[] qp = new long[tq];
    long[] kp = new long[tk];
    for (int t = 0; t < tq; t++) {
      qp[t] = 700 + t; // the last queries of the document
    }
    for (int j = 0; j < tk; j++) {
      kp[j] = j;
    }
    for (AttentionOptions opt : new AttentionOptions[] {
        AttentionOptions.DEFAULT.withCausal(true), AttentionOptions.DEFAULT.withCausal(true).withWindow(333)}) {
      ReferenceAttention.Result ref = ReferenceAttention.compute(q, k, v, qp, kp, opt);
      ReferenceAttention.Result naive = ReferenceAttention.computeFloat32(q, k, v, qp, kp, opt);
      for (int trial = 0; trial < 3; trial++) {
        // Random cut points, including empty chunks and a chunk wholly after every query.
        int[] cuts = rng.ints(4, 0, tk + 1).sorted().toArray();
        List<AttentionState> parts = new ArrayList<>();
        int from = 0;
        for (int i = 0; i <= cuts.length; i++) {
          int to = i < cuts.length ? cuts[i] : tk;
          parts.add(CpuAttention.DEFAULT.forward(q, k.sliceTokens(from, to), v.sliceTokens(from, to), qp,
              Arrays.copyOfRange(kp, from, to), opt));
          from = to;
        }
        AttentionState merged = AttentionState.mergeAll(parts);
        String err = Tolerance.violation(merged, ref, naive);
        assertNull(err, "seed " + seed + ", cuts " + Arrays.toString(cuts) + ": " + err);
      }
    }
  }
}
