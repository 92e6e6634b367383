package io.longctx.kernels;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.SplittableRandom;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.function.Executable;

/** Clear errors, naming what and where, for inputs the kernels cannot take. */
class BadInputTest {

  final SplittableRandom rng = new SplittableRandom(7);
  final CpuAttention cpu = CpuAttention.DEFAULT;

  static IllegalArgumentException assertMessage(Executable call, String... parts) {
    IllegalArgumentException e = assertThrows(IllegalArgumentException.class, call);
    for (String p : parts) {
      assertTrue(e.getMessage().contains(p), "message '" + e.getMessage() + "' lacks '" + p + "'");
    }
    return e;
  }

  /**
   * The q.k overflow bound the CUDA host paths and the DJL operator's libtorch path refuse by: the
   * sum of squares in float64 (an entry of 1e18 squares past float32 but not float64; across the
   * parallel blocks from 1M entries too), and the bound true for NaN, infinity and |q| |k| at 1e38.
   */
  @Test
  void theQkOverflowBound() {
    assertEquals(2e36, new Tensor(new float[] {1e18f, 1e18f}, 1, 1, 1, 2).sumOfSquares(), 1e30);
    assertTrue(Double.isNaN(new Tensor(new float[] {Float.NaN, 1}, 1, 1, 1, 2).sumOfSquares()));
    Tensor big = Tensor.random(rng, 1, 2, 4100, 128); // 1,049,600 entries: the parallel blocks
    double serial = 0;
    for (float x : big.data()) {
      serial += (double) x * x;
    }
    assertEquals(serial, big.sumOfSquares(), serial * 1e-12);
    assertTrue(!Tensor.qkMayOverflow(1e36, 1e36, 1) && !Tensor.qkMayOverflow(1e40, 1e30, 8));
    assertTrue(Tensor.qkMayOverflow(1e38, 1e38, 1) && Tensor.qkMayOverflow(1e36, 1e36, 1e3));
    assertTrue(Tensor.qkMayOverflow(Double.NaN, 1, 1) && Tensor.qkMayOverflow(Double.POSITIVE_INFINITY, 1, 1));
  }

  @Test
  void shapesMustAgree() {
    Tensor q = Tensor.random(rng, 1, 4, 5, 32);
    Tensor k = Tensor.random(rng, 1, 2, 6, 32);
    AttentionOptions o = AttentionOptions.DEFAULT;
    assertMessage(() -> cpu.forward(q, k, Tensor.random(rng, 1, 2, 7, 32), null, null, o), "same shape", "[1, 2, 7, 32]");
    assertMessage(() -> cpu.forward(q, Tensor.random(rng, 1, 3, 6, 32), Tensor.random(rng, 1, 3, 6, 32), null, null, o),
        "multiple of kv heads");
    assertMessage(() -> cpu.forward(q, Tensor.random(rng, 1, 2, 6, 16), Tensor.random(rng, 1, 2, 6, 16), null, null, o),
        "head dim");
    assertMessage(() -> cpu.forward(q, Tensor.random(rng, 2, 2, 6, 32), Tensor.random(rng, 2, 2, 6, 32), null, null, o),
        "batch");
    assertMessage(() -> cpu.forward(q, k, k, new long[4], null, o), "qPos has 4 positions for 5");
    assertMessage(() -> cpu.decode(q, k, k, null, new long[5], o, 16), "kPos has 5 positions for 6");
    assertMessage(() -> cpu.decode(q, k, k, null, null, o, 0), "splitLen");
    assertMessage(() -> new Tensor(new float[10], 1, 1, 3, 4), "needs 12 floats");
    Tensor big = new Tensor(new float[2048], 1, 1, 1, 2048);
    assertMessage(() -> cpu.forward(big, big, big, null, null, o), "unsupported head dim 2048");
    assertMessage(() -> new CpuAttention(CpuAttention.laneGroup() + 1, 64), "blockQ");
    assertMessage(() -> new CpuAttention(CpuAttention.laneGroup(), Integer.MAX_VALUE), "one array of scores");
    assertMessage(() -> AttentionOptions.DEFAULT.withWindow(-1), "window");
    assertMessage(() -> AttentionOptions.DEFAULT.withScale(0), "scale");
    assertMessage(() -> new UnifiedMax(0, 1, 2), "lower < 0 < upper");
  }

  /** Inputs that once gave a wrong answer without a word (a review of 2026-11-27): each refused now, saying where. */
  @Test
  void inputsThatOnceAnsweredWrongInSilenceAreRefused() {
    Tensor q = Tensor.random(rng, 1, 2, 3, 8);
    Tensor k = Tensor.random(rng, 1, 1, 5, 8);
    Tensor v = Tensor.random(rng, 1, 1, 5, 8);
    // Infinity in q or k under a softcap: the infinite score was capped to +-cap, a finite answer.
    AttentionOptions capped = AttentionOptions.DEFAULT.withSoftcap(30f);
    q.data()[q.offset(0, 1, 2) + 6] = Float.POSITIVE_INFINITY;
    assertMessage(() -> cpu.forward(q, k, v, null, null, capped), "q [1, 2, 3, 8] holds Infinity at (batch 0, head 1, token 2, dim 6)");
    assertMessage(() -> cpu.decode(q, k, v, null, null, capped, 2), "q [1, 2, 3, 8] holds Infinity at (batch 0, head 1, token 2, dim 6)");
    q.data()[q.offset(0, 1, 2) + 6] = 0;
    k.data()[k.offset(0, 0, 4) + 1] = Float.NEGATIVE_INFINITY;
    assertMessage(() -> cpu.forward(q, k, v, null, null, capped), "k [1, 1, 5, 8] holds -Infinity at (batch 0, head 0, token 4, dim 1)");
    k.data()[k.offset(0, 0, 4) + 1] = 0;
    // A score scale float32 holds only as 0 or a subnormal: every score was 0 (or lost bits).
    assertMessage(() -> cpu.forward(q, k, v, null, null, AttentionOptions.DEFAULT.withScale(1e-8).withSoftcap(1e38f)),
        "score scale", "softcap", "normal range");
    assertMessage(() -> cpu.forward(q, k, v, null, null, AttentionOptions.DEFAULT.withScale(2e-40)), "score scale");
    // Unified-max bounds past float32 exp's range: every weight e^88, or all 0 (an empty row).
    assertMessage(() -> new UnifiedMax(0f, -40f, 200f), "upper <= 88");
    assertMessage(() -> new UnifiedMax(95f, -1000f, 40f), "-87.0 <= lower");
    // Indexes out of the shape read a neighbour's entry.
    AttentionState st = AttentionState.empty(2, 2, 3);
    assertThrows(IndexOutOfBoundsException.class, () -> st.lse(0, 2));
    assertThrows(IndexOutOfBoundsException.class, () -> st.lse(-1, 1));
    assertThrows(IndexOutOfBoundsException.class, () -> st.o(0, 0, 3));
    assertThrows(IndexOutOfBoundsException.class, () -> st.o(2, 0, 0));
    assertThrows(IndexOutOfBoundsException.class, () -> q.offset(0, 2, 0));
    assertThrows(IndexOutOfBoundsException.class, () -> q.offset(0, 0, 4));
    assertEquals(q.offset(0, 1, 0), q.offset(0, 0, 3), "t = tokens is the end of the (b, h) rows");
    // The raw merge: out shifted over an input overwrote entries before reading them; ranges unchecked.
    float[] buf = {1, 2, 3, 0}, bufL = new float[4], b = {10, 20, 30}, bL = new float[3];
    assertMessage(() -> AttentionState.mergeInto(buf, bufL, 0, b, bL, 0, buf, bufL, 1, 3, 1), "overlaps a");
    assertMessage(() -> AttentionState.mergeInto(b, bL, 0, buf, bufL, 0, buf, bufL, 1, 3, 1), "overlaps b");
    assertMessage(() -> AttentionState.mergeInto(buf, bufL, 0, b, bL, 0, new float[3], new float[3], 0, -1, 1), "pairs >= 0");
    assertMessage(() -> AttentionState.mergeInto(buf, bufL, 0, b, bL, 0, new float[6], new float[3], 0, 3, 2),
        "entries 0..3 of a (dim 2)", "o of 4 floats");
    AttentionState.mergeInto(buf, bufL, 0, b, bL, 0, buf, bufL, 0, 3, 1); // in place, entry for entry: fine
    assertEquals(5.5f, buf[0]);
  }

  @Test
  void nonFiniteInputsAreNamedByPosition() {
    Tensor q = Tensor.random(rng, 1, 2, 9, 32);
    Tensor k = Tensor.random(rng, 1, 1, 300, 32);
    Tensor v = Tensor.random(rng, 1, 1, 300, 32);
    k.data()[k.offset(0, 0, 211) + 3] = Float.NaN;
    assertMessage(() -> cpu.forward(q, k, v, null, null, AttentionOptions.DEFAULT), "key token 211", "non-finite",
        "k is NaN at dim 3");
    assertMessage(() -> cpu.decode(q, k, v, null, null, AttentionOptions.DEFAULT, 64), "key token 211", "k is NaN at dim 3");
    k.data()[k.offset(0, 0, 211) + 3] = 0;
    q.data()[q.offset(0, 1, 4)] = Float.POSITIVE_INFINITY;
    assertMessage(() -> cpu.forward(q, k, v, null, null, AttentionOptions.DEFAULT), "head 1", "query token 4",
        "q is Infinity at dim 0");
    q.data()[q.offset(0, 1, 4)] = 0;
    v.data()[v.offset(0, 0, 17) + 5] = Float.NaN;
    String seen = assertMessage(() -> cpu.forward(q, k, v, null, null, AttentionOptions.DEFAULT),
        "non-finite attention output", "dim 5", "v is NaN at kv head 0, key token 17 (position 17)").getMessage();
    assertTrue(!seen.contains("does not see"), "key 17 is seen: " + seen);

    // Workers left mid-block by those failures start clean: good input still gives the right answer.
    v.data()[v.offset(0, 0, 17) + 5] = 0;
    for (int i = 0; i < 4; i++) {
      AttentionState s = cpu.forward(q, k, v, null, null, AttentionOptions.DEFAULT);
      assertNull(Tolerance.violation(s, ReferenceAttention.compute(q, k, v, null, null, AttentionOptions.DEFAULT),
          ReferenceAttention.computeFloat32(q, k, v, null, null, AttentionOptions.DEFAULT)));
    }
  }

  /**
   * A non-finite v at a key no query sees, in a tile a query sees (it enters the sums with weight 0):
   * refused with the v entry named, in float[] and buffer inputs, forward and decode; a finite v
   * whose weighted sum overflows is named as such.
   */
  @Test
  void aNonFiniteVAtAnUnseenKeyIsNamed() {
    Tensor q = Tensor.random(rng, 1, 1, 4, 8);
    Tensor k = Tensor.random(rng, 1, 1, 20, 8);
    Tensor v = Tensor.random(rng, 1, 1, 20, 8);
    v.data()[v.offset(0, 0, 19) + 2] = Float.POSITIVE_INFINITY;
    AttentionOptions causal = AttentionOptions.DEFAULT.withCausal(true); // queries 0..3 see keys 0..3
    assertMessage(() -> cpu.forward(q, k, v, null, null, causal), "v is Infinity at kv head 0, key token 19 (position 19)",
        "dim 2", "a key this query does not see", "pad with zeros");
    assertMessage(() -> cpu.decode(q, k, v, null, null, causal), "v is Infinity at kv head 0, key token 19", "dim 2");
    BufferTensor qb = BufferTensor.bhtd(java.nio.FloatBuffer.wrap(q.data()), 1, 1, 4, 8);
    BufferTensor kb = BufferTensor.bthd(java.nio.FloatBuffer.wrap(k.data()), 1, 20, 1, 8);
    BufferTensor vb = BufferTensor.bthd(java.nio.FloatBuffer.wrap(v.data()), 1, 20, 1, 8);
    assertMessage(() -> cpu.forward(qb, kb, vb, null, null, causal), "v is Infinity at kv head 0, key token 19", "dim 2");
    v.data()[v.offset(0, 0, 19) + 2] = 0;
    java.util.Arrays.fill(q.data(), 0f); // equal weights: query 3's sum of four 3e38 overflows
    for (int t = 0; t < 4; t++) {
      v.data()[v.offset(0, 0, t) + 6] = 3e38f;
    }
    assertMessage(() -> cpu.forward(q, k, v, null, null, causal), "dim 6", "v holds values too large for float32");
  }

  /**
   * A finite q and k whose q.k overflows float32 to -Infinity is bad input, named by position, on a
   * visible pair, softcapped or not; invisible pairs (masked) are not.
   */
  @Test
  void scoreOverflowingToMinusInfinityIsNamed() {
    Tensor q = Tensor.random(rng, 1, 2, 5, 32);
    Tensor k = Tensor.random(rng, 1, 1, 70, 32);
    Tensor v = Tensor.random(rng, 1, 1, 70, 32);
    long[] pos = new long[70];
    for (int i = 0; i < pos.length; i++) {
      pos[i] = Long.MIN_VALUE + 3 * i; // and at the bottom of the long range
    }
    long[] qPos = {pos[10], pos[20], pos[30], pos[40], pos[50]};
    for (int c = 0; c < 32; c++) {
      q.data()[q.offset(0, 1, 2) + c] = 3e19f;
      k.data()[k.offset(0, 0, 25) + c] = -3e19f; // q.k = -2.9e40: -Infinity in float32
    }
    AttentionOptions causal = AttentionOptions.DEFAULT.withCausal(true);
    NonFiniteScoreException e = assertThrows(NonFiniteScoreException.class,
        () -> cpu.forward(q, k, v, qPos, pos, causal));
    assertTrue(e.getMessage().contains("overflows float32"), e.getMessage());
    assertEquals(1, e.head);
    assertEquals(2, e.queryToken);
    assertEquals(25, e.keyToken);
    assertEquals(pos[25], e.keyPos);
    assertEquals(Float.NEGATIVE_INFINITY, e.score);
    assertThrows(NonFiniteScoreException.class, () -> cpu.decode(q, k, v, qPos, pos, causal, 16));
    // The same key is invisible to that query under a window of 5 positions (keys 26..30): no error.
    AttentionOptions window = causal.withWindow(15);
    AttentionState s = cpu.forward(q, k, v, qPos, pos, window);
    assertTrue(Float.isFinite(s.lse(2, 1)), "lse " + s.lse(2, 1));
    // Softcapped: refused too. Capping the infinity at -cap was not exact: a q.k can overflow in its
    // partial sums and still be small (below, 2e38 + 2e38 - 2e38 - 2e38 = 0, whose capped score is 0,
    // not +cap); the kernel cannot tell the two apart.
    assertThrows(NonFiniteScoreException.class, () -> cpu.forward(q, k, v, qPos, pos, causal.withSoftcap(20f)));
    Tensor q1 = new Tensor(new float[] {2e38f, 2e38f, -2e38f, -2e38f}, 1, 1, 1, 4);
    Tensor k1 = new Tensor(new float[] {1, 1, 1, 1, 0.5f, 0, 0, 0}, 1, 1, 2, 4);
    Tensor v1 = new Tensor(new float[] {1, 0, 0, 0, 0, 1, 0, 0}, 1, 1, 2, 4);
    NonFiniteScoreException c = assertThrows(NonFiniteScoreException.class,
        () -> cpu.forward(q1, k1, v1, null, null, AttentionOptions.DEFAULT.withSoftcap(30f)));
    assertEquals(0, c.keyToken);
    assertEquals(Float.POSITIVE_INFINITY, c.score);
  }

  /**
   * A softcap much smaller than the scale: q.k (1e36) is finite, but the kernel multiplies it by
   * scale / softcap (1e5) and that overflows. The error said "q.k overflows float32"; it names the
   * scale now. (Refused rather than capped: the kernel cannot tell it from an overflowed q.k.)
   */
  @Test
  void aScaleOverTheSoftcapThatOverflowsIsNamed() {
    Tensor q = new Tensor(new float[] {1e18f}, 1, 1, 1, 1), v = new Tensor(new float[] {2f}, 1, 1, 1, 1);
    AttentionOptions opt = AttentionOptions.DEFAULT.withScale(1e-3).withSoftcap(1e-8f);
    for (Executable call : new Executable[] {() -> cpu.forward(q, q, v, null, null, opt),
        () -> cpu.decode(q, q, v, null, null, opt)}) {
      NonFiniteScoreException e = assertThrows(NonFiniteScoreException.class, call);
      assertTrue(e.getMessage().contains("q.k (1.0E36) times the score scale (100000.0, the scale over the softcap) "
          + "overflows float32: the softcap is too small"), e.getMessage());
    }
  }

  /** UnifiedMax.calibrate checks shapes as decode does (it indexed past arrays or divided by zero). */
  @Test
  void calibrateChecksShapes() {
    AttentionOptions opt = AttentionOptions.DEFAULT;
    assertMessage(() -> UnifiedMax.calibrate(Tensor.random(rng, 1, 3, 2, 4), Tensor.random(rng, 1, 2, 5, 4), opt),
        "query heads (3) must be a multiple of kv heads (2)");
    assertMessage(() -> UnifiedMax.calibrate(Tensor.random(rng, 1, 2, 2, 4), Tensor.random(rng, 1, 4, 5, 4), opt),
        "must be a multiple of kv heads");
    assertMessage(() -> UnifiedMax.calibrate(Tensor.random(rng, 1, 2, 2, 4), Tensor.random(rng, 1, 2, 5, 3), opt),
        "same head dim");
    assertMessage(() -> UnifiedMax.calibrate(Tensor.random(rng, 1, 2, 2, 4), Tensor.random(rng, 2, 2, 5, 4), opt),
        "same batch");
  }

  /** A read-only output buffer is refused before any work (it was a bare ReadOnlyBufferException). */
  @Test
  void readOnlyOutputBuffersAreRefused() {
    Tensor q = Tensor.random(rng, 1, 2, 5, 8), k = Tensor.random(rng, 1, 2, 7, 8);
    BufferTensor qb = BufferTensor.bhtd(java.nio.FloatBuffer.wrap(q.data()), 1, 2, 5, 8);
    BufferTensor kb = BufferTensor.bhtd(java.nio.FloatBuffer.wrap(k.data()), 1, 2, 7, 8);
    java.nio.FloatBuffer o = java.nio.FloatBuffer.allocate(2 * 5 * 8), lse = java.nio.FloatBuffer.allocate(10);
    assertMessage(() -> cpu.forward(qb, kb, kb, null, null, AttentionOptions.DEFAULT,
        BufferTensor.bhtd(o.asReadOnlyBuffer(), 1, 2, 5, 8), lse), "o is a read-only buffer");
    assertMessage(() -> cpu.forward(qb, kb, kb, null, null, AttentionOptions.DEFAULT, BufferTensor.bhtd(o, 1, 2, 5, 8),
        lse.asReadOnlyBuffer()), "lse is a read-only buffer");
  }

  /**
   * The end of a split is computed in long: for a cache of more than 2^30 keys the last split's
   * j0 + splitLen passed Integer.MAX_VALUE and the split was taken as empty, its keys left out of the
   * answer in silence (too large to run here: about 2^30 keys).
   */
  @Test
  void theLastSplitOfAVeryLongCacheKeepsItsKeys() {
    int splitLen = (1 << 30) + 5, tk = Integer.MAX_VALUE - 3;
    assertEquals(tk, CpuAttention.splitEnd(tk, splitLen, splitLen));
    assertEquals(splitLen, CpuAttention.splitEnd(tk, 0, splitLen));
    assertEquals(100, CpuAttention.splitEnd(100, 64, 64));
  }
}
