package io.longctx.kernels;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.FloatBuffer;
import java.util.SplittableRandom;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.function.Executable;

/**
 * The kernels reading q, k and v in place from buffers ({@link BufferTensor}, both orders) give the
 * bits of the Tensor forms, forward and split-K decode, through both workers, and name bad input as
 * the Tensor forms do.
 */
class BufferTensorTest {

  @Test
  void forwardAndDecodeFromBuffersGiveTheTensorFormsBits() {
    long seed = Seeds.forTest();
    SplittableRandom rng = new SplittableRandom(seed);
    for (int round = 0; round < 40; round++) {
      int batch = 1 + rng.nextInt(2);
      int kvHeads = 1 + rng.nextInt(3);
      int group = 1 + rng.nextInt(6);
      // Few tokens (keys in the lanes) and many (query rows in the lanes, several blocks and sweeps).
      int tq = rng.nextBoolean() ? 1 + rng.nextInt(4) : 1 + rng.nextInt(300);
      int tk = rng.nextInt(500);
      int dim = 1 + rng.nextInt(140);
      int split = 1 + rng.nextInt(Math.max(1, tk));
      Tensor q = Tensor.random(rng, batch, kvHeads * group, tq, dim);
      Tensor k = Tensor.random(rng, batch, kvHeads, tk, dim);
      Tensor v = Tensor.random(rng, batch, kvHeads, tk, dim);
      long[] qp = new long[tq];
      for (int t = 0; t < tq; t++) {
        qp[t] = tk - tq + t + rng.nextInt(3);
      }
      AttentionOptions opt = AttentionOptions.DEFAULT.withCausal(rng.nextBoolean())
          .withWindow(rng.nextInt(3) == 0 ? 1 + rng.nextInt(200) : 0)
          .withSoftcap(rng.nextInt(3) == 0 ? 20f : 0f);
      boolean qTokenMajor = rng.nextBoolean(), kTokenMajor = rng.nextBoolean(), vTokenMajor = rng.nextBoolean();
      String where = "seed " + seed + ", round " + round + ": B " + batch + " heads " + kvHeads * group + "/" + kvHeads
          + " Tq " + tq + " Tk " + tk + " D " + dim + " split " + split + " " + opt + ", q token-major " + qTokenMajor
          + ", k token-major " + kTokenMajor + ", v token-major " + vTokenMajor;
      BufferTensor qb = direct(q, qTokenMajor), kb = direct(k, kTokenMajor), vb = direct(v, vTokenMajor);
      assertArrayEquals(q.data(), qb.toTensor().data(), "toTensor, " + where);
      assertArrayEquals(k.data(), kb.toTensor().data(), "toTensor, " + where);
      AttentionState want = CpuAttention.DEFAULT.forward(q, k, v, qp, null, opt);
      same(want, CpuAttention.DEFAULT.forward(qb, kb, vb, qp, null, opt), "forward, " + where);
      boolean oTokenMajor = rng.nextBoolean();
      sameInBuffers(want, qb, kb, vb, qp, opt, oTokenMajor, "forward into buffers, o token-major " + oTokenMajor + ", "
          + where);
      same(CpuAttention.DEFAULT.decode(q, k, v, qp, null, opt, split).state(),
          CpuAttention.DEFAULT.decode(qb, kb, vb, qp, null, opt, split).state(), "decode, " + where);
    }
  }

  /**
   * The forward's two ways of reading K/V from buffers, a tile at a time and (past
   * {@link CpuAttention#MAX_TILE_COPIES} copies per tile) copied whole first, both orders: the bits of
   * the Tensor form.
   */
  @Test
  void keysCopiedByTileOrWholeGiveTheSameBits() {
    long seed = Seeds.forTest();
    SplittableRandom rng = new SplittableRandom(seed);
    for (int group : new int[] {1, 2 * CpuAttention.MAX_TILE_COPIES}) { // one sweep a query head: group copies a tile
      Tensor q = Tensor.random(rng, 2, 2 * group, 70, 24);
      Tensor k = Tensor.random(rng, 2, 2, 333, 24), v = Tensor.random(rng, 2, 2, 333, 24);
      AttentionOptions opt = AttentionOptions.DEFAULT.withCausal(true);
      AttentionState want = CpuAttention.DEFAULT.forward(q, k, v, null, null, opt);
      for (boolean tokenMajor : new boolean[] {false, true}) {
        same(want, CpuAttention.DEFAULT.forward(direct(q, !tokenMajor), direct(k, tokenMajor), direct(v, tokenMajor),
            null, null, opt), "group " + group + ", token-major " + tokenMajor + ", seed " + seed);
      }
    }
  }

  /** A copy large enough to run in pieces on the kernels' threads, both orders. */
  @Test
  void largeCopiesIntoTensorsKeepEveryRow() {
    Tensor t = Tensor.random(new SplittableRandom(3), 2, 3, 700, 65, 1);
    assertTrue(t.data().length >= 1 << 18, "the shape must reach the parallel copy");
    for (boolean tokenMajor : new boolean[] {false, true}) {
      assertArrayEquals(t.data(), direct(t, tokenMajor).toTensor().data(), "token-major " + tokenMajor);
    }
  }

  @Test
  void badBuffersAreNamedAsTheTensorFormNamesThem() {
    SplittableRandom rng = new SplittableRandom(7);
    Tensor q = Tensor.random(rng, 1, 2, 3, 8); // one query head a kv head: one task sees the NaN below
    Tensor k = Tensor.random(rng, 1, 2, 10, 8);
    FloatBuffer short10 = ByteBuffer.allocateDirect(4 * 159).order(ByteOrder.nativeOrder()).asFloatBuffer();
    IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
        () -> BufferTensor.bhtd(short10, 1, 2, 10, 8));
    assertEquals("tensor of shape [1, 2, 10, 8] needs 160 floats, buffer has 159", e.getMessage());
    // k and v of other shapes: named with both (each may have its own memory order).
    e = assertThrows(IllegalArgumentException.class, () -> CpuAttention.DEFAULT.forward(direct(q, false),
        direct(k, false), direct(k.sliceTokens(0, 9), true), null, null, AttentionOptions.DEFAULT));
    assertEquals("k and v must have the same shape, got k [1, 2, 10, 8] and v [1, 2, 9, 8] (stored [batch, tokens, "
        + "heads, dim])", e.getMessage());
    Tensor k3 = Tensor.random(rng, 1, 3, 10, 8);
    sameError(() -> CpuAttention.DEFAULT.forward(q, k3, k3, null, null, AttentionOptions.DEFAULT),
        () -> CpuAttention.DEFAULT.forward(direct(q, false), direct(k3, false), direct(k3, false), null, null,
            AttentionOptions.DEFAULT));
    sameError(() -> CpuAttention.DEFAULT.forward(q, k, k, new long[2], null, AttentionOptions.DEFAULT),
        () -> CpuAttention.DEFAULT.forward(direct(q, true), direct(k, true), direct(k, true), new long[2], null,
            AttentionOptions.DEFAULT));
    // A NaN under a softcap is named by (batch, head, token, dim) in either order.
    k.data()[k.offset(0, 1, 3) + 2] = Float.NaN;
    AttentionOptions capped = AttentionOptions.DEFAULT.withSoftcap(5f);
    for (boolean tokenMajor : new boolean[] {false, true}) {
      e = assertThrows(IllegalArgumentException.class, () -> CpuAttention.DEFAULT.forward(direct(q, tokenMajor),
          direct(k, tokenMajor), direct(k, tokenMajor), null, null, capped));
      assertEquals("k [1, 2, 10, 8]" + (tokenMajor ? " (stored [batch, tokens, heads, dim])" : "")
          + " holds NaN at (batch 0, head 1, token 3, dim 2): attention inputs must be finite", e.getMessage());
    }
    // Without a cap the NaN reaches a score, named as the Tensor form names it.
    sameError(() -> CpuAttention.DEFAULT.forward(q, k, k, null, null, AttentionOptions.DEFAULT),
        () -> CpuAttention.DEFAULT.forward(direct(q, true), direct(k, false), direct(k, false), null, null,
            AttentionOptions.DEFAULT));
    sameError(() -> CpuAttention.DEFAULT.decode(q, k, k, null, null, AttentionOptions.DEFAULT, 4),
        () -> CpuAttention.DEFAULT.decode(direct(q, true), direct(k, true), direct(k, true), null, null,
            AttentionOptions.DEFAULT, 4));
  }

  /**
   * Decode over K/V cut into pages (random lengths, empty pages among them, each page and k and v in
   * their own memory orders) gives the bits of one buffer holding the same keys, with every split
   * length, through both workers.
   */
  @Test
  void decodeOverPagesGivesOneBuffersBits() {
    long seed = Seeds.forTest();
    SplittableRandom rng = new SplittableRandom(seed);
    for (int round = 0; round < 40; round++) {
      int batch = 1 + rng.nextInt(2);
      int kvHeads = 1 + rng.nextInt(3);
      int group = 1 + rng.nextInt(6);
      int tq = rng.nextBoolean() ? 1 + rng.nextInt(4) : 1 + rng.nextInt(40);
      int tk = 1 + rng.nextInt(700);
      int dim = 1 + rng.nextInt(140);
      int split = 1 + rng.nextInt(tk);
      Tensor q = Tensor.random(rng, batch, kvHeads * group, tq, dim);
      Tensor k = Tensor.random(rng, batch, kvHeads, tk, dim);
      Tensor v = Tensor.random(rng, batch, kvHeads, tk, dim);
      long[] qp = new long[tq], kp = new long[tk];
      for (int t = 0; t < tq; t++) {
        qp[t] = tk - tq + t + rng.nextInt(3);
      }
      for (int t = 0; t < tk; t++) {
        kp[t] = t + (t > tk / 2 ? 5 : 0); // a gap between two pages, as a chunk list's kStart can leave
      }
      AttentionOptions opt = AttentionOptions.DEFAULT.withCausal(rng.nextBoolean())
          .withWindow(rng.nextInt(3) == 0 ? 1 + rng.nextInt(200) : 0)
          .withSoftcap(rng.nextInt(3) == 0 ? 20f : 0f);
      java.util.List<BufferTensor> kPages = new java.util.ArrayList<>(), vPages = new java.util.ArrayList<>();
      StringBuilder cuts = new StringBuilder();
      for (int t0 = 0; t0 < tk; ) {
        int t1 = rng.nextInt(5) == 0 ? t0 : Math.min(tk, t0 + 1 + rng.nextInt(rng.nextBoolean() ? 8 : 300));
        kPages.add(direct(k.sliceTokens(t0, t1), rng.nextBoolean()));
        vPages.add(direct(v.sliceTokens(t0, t1), rng.nextBoolean()));
        cuts.append(' ').append(t1 - t0);
        t0 = t1;
      }
      String where = "seed " + seed + ", round " + round + ": B " + batch + " heads " + kvHeads * group + "/" + kvHeads
          + " Tq " + tq + " Tk " + tk + " D " + dim + " split " + split + " " + opt + ", pages" + cuts;
      BufferTensor qb = direct(q, rng.nextBoolean());
      CpuAttention.DecodeResult want = CpuAttention.DEFAULT.decode(qb, direct(k, false), direct(v, true), qp, kp, opt,
          split);
      CpuAttention.DecodeResult got = CpuAttention.DEFAULT.decode(qb, kPages, vPages, qp, kp, opt, split);
      same(want.state(), got.state(), where);
      assertEquals(want.splits(), got.splits(), where);
    }
  }

  /**
   * Pages holding more floats in all than an int counts (here one 8 MiB page given 1,025 times: 2^31
   * + 2^21 floats): decoded like the one page with each key weighed 1,025 times (o the same, lse + ln
   * 1025).
   */
  @Test
  void pagesMayHoldMoreThanAnIntOfFloatsInAll() {
    SplittableRandom rng = new SplittableRandom(17);
    Tensor q = Tensor.random(rng, 1, 2, 1, 64), k = Tensor.random(rng, 1, 1, 32768, 64);
    Tensor v = Tensor.random(rng, 1, 1, 32768, 64);
    BufferTensor qb = direct(q, false), kb = direct(k, false), vb = direct(v, false);
    int n = 1025;
    assertTrue((long) n * k.data().length > Integer.MAX_VALUE);
    AttentionState one = CpuAttention.DEFAULT.decode(qb, kb, vb, null, null, AttentionOptions.DEFAULT, 4096).state();
    AttentionState all = CpuAttention.DEFAULT.decode(qb, java.util.Collections.nCopies(n, kb),
        java.util.Collections.nCopies(n, vb), null, null, AttentionOptions.DEFAULT, 1 << 18).state();
    for (int i = 0; i < one.lse().length; i++) {
      assertEquals(one.lse()[i] + Math.log(n), all.lse()[i], 1e-4, "lse of row " + i);
    }
    for (int i = 0; i < one.o().length; i++) {
      assertEquals(one.o()[i], all.o()[i], 1e-5, "o entry " + i);
    }
  }

  /**
   * Of bad keys in several split-K tasks (kv head 1's first split, kv head 0's sixth), every call names
   * the same one, the lowest task's (kv head 0), whatever order the threads reach them in.
   */
  @Test
  void ofSeveralBadKeysTheLowestTasksIsNamedEveryTime() {
    SplittableRandom rng = new SplittableRandom(23);
    Tensor q = Tensor.random(rng, 1, 2, 1, 8), k = Tensor.random(rng, 1, 2, 64, 8), v = Tensor.random(rng, 1, 2, 64, 8);
    k.data()[k.offset(0, 1, 1) + 2] = Float.POSITIVE_INFINITY;
    k.data()[k.offset(0, 0, 21) + 5] = Float.POSITIVE_INFINITY;
    String first = null;
    for (int run = 0; run < 40; run++) {
      RuntimeException e = assertThrows(RuntimeException.class,
          () -> CpuAttention.DEFAULT.decode(q, k, v, null, null, AttentionOptions.DEFAULT, 4));
      String msg = e.getMessage() + " (suppressed " + e.getSuppressed().length + ")";
      if (first == null) {
        first = msg;
        assertTrue(msg.contains("head 0") && msg.contains("(suppressed 1)"), msg);
      }
      assertEquals(first, msg, "run " + run);
    }
  }

  @Test
  void badPagesAreNamed() {
    SplittableRandom rng = new SplittableRandom(5);
    BufferTensor q = direct(Tensor.random(rng, 1, 4, 1, 8), false);
    Tensor k = Tensor.random(rng, 1, 2, 10, 8);
    BufferTensor a = direct(k.sliceTokens(0, 4), false), b = direct(k.sliceTokens(4, 10), true);
    java.util.function.BiFunction<java.util.List<BufferTensor>, java.util.List<BufferTensor>, String> error =
        (kp, vp) -> assertThrows(IllegalArgumentException.class,
            () -> CpuAttention.DEFAULT.decode(q, kp, vp, null, null, AttentionOptions.DEFAULT, 4)).getMessage();
    assertEquals("need one or more k pages", error.apply(java.util.List.of(), java.util.List.of(a)));
    assertEquals("k has 2 pages and v 1: k page i and v page i hold the same tokens",
        error.apply(java.util.List.of(a, b), java.util.List.of(a)));
    assertEquals("k page 0 holds 4 tokens and v page 0 6",
        error.apply(java.util.List.of(a, b), java.util.List.of(b, a)));
    BufferTensor other = direct(Tensor.random(rng, 1, 1, 6, 8), false);
    assertEquals("v page 1 has shape [1, 1, 6, 8], page 0 has [1, 2, 4, 8]: pages may differ in tokens only",
        error.apply(java.util.List.of(a, b), java.util.List.of(a, other)));
    assertEquals("kPos has 9 positions for 10 key tokens", assertThrows(IllegalArgumentException.class,
        () -> CpuAttention.DEFAULT.decode(q, java.util.List.of(a, b), java.util.List.of(a, b), null, new long[9],
            AttentionOptions.DEFAULT, 4)).getMessage());
    // A NaN under a softcap is named with its page and the page's own (batch, head, token, dim).
    Tensor bad = k.sliceTokens(4, 10);
    bad.data()[bad.offset(0, 1, 2) + 3] = Float.NaN;
    BufferTensor badPage = direct(bad, true);
    assertEquals("k page 1 (tokens from 4): k [1, 2, 6, 8] (stored [batch, tokens, heads, dim]) holds NaN at (batch 0, "
        + "head 1, token 2, dim 3): attention inputs must be finite", assertThrows(IllegalArgumentException.class,
            () -> CpuAttention.DEFAULT.decode(q, java.util.List.of(a, badPage), java.util.List.of(a, b), null, null,
                AttentionOptions.DEFAULT.withSoftcap(5f), 4)).getMessage());
  }

  /** The forward written into buffers (first filled with NaN) holds the state's rows, every entry of them. */
  private static void sameInBuffers(AttentionState want, BufferTensor q, BufferTensor k, BufferTensor v, long[] qp,
      AttentionOptions opt, boolean tokenMajor, String where) {
    int batch = q.batch(), heads = q.heads(), tq = q.tokens(), dim = q.dim();
    FloatBuffer ob = floats(batch * heads * tq * dim), lb = floats(batch * heads * tq);
    BufferTensor o = tokenMajor ? BufferTensor.bthd(ob, batch, tq, heads, dim) : BufferTensor.bhtd(ob, batch, heads, tq, dim);
    CpuAttention.DEFAULT.forward(q, k, v, qp, null, opt, o, lb);
    for (int b = 0; b < batch; b++) {
      for (int h = 0; h < heads; h++) {
        for (int t = 0; t < tq; t++) {
          int out = (b * tq + t) * heads + h;
          int at = tokenMajor ? out : (b * heads + h) * tq + t;
          assertEquals(want.lse()[out], lb.get(at), where + ": lse of batch " + b + " head " + h + " token " + t);
          for (int c = 0; c < dim; c++) {
            assertEquals(want.o()[out * dim + c], ob.get(o.offset(b, h, t) + c), where + ": o of batch " + b + " head "
                + h + " token " + t + " dim " + c);
          }
        }
      }
    }
  }

  /** A direct buffer of n floats in native order, all NaN. */
  private static FloatBuffer floats(int n) {
    FloatBuffer b = ByteBuffer.allocateDirect(4 * n).order(ByteOrder.nativeOrder()).asFloatBuffer();
    for (int i = 0; i < n; i++) {
      b.put(i, Float.NaN);
    }
    return b;
  }

  @Test
  void outputBuffersOfTheWrongShapeAreNamed() {
    SplittableRandom rng = new SplittableRandom(11);
    BufferTensor q = direct(Tensor.random(rng, 1, 4, 3, 8), true);
    BufferTensor k = direct(Tensor.random(rng, 1, 2, 10, 8), true);
    IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> CpuAttention.DEFAULT.forward(q, k,
        k, null, null, AttentionOptions.DEFAULT, BufferTensor.bhtd(floats(96), 1, 4, 3, 8), floats(11)));
    assertEquals("lse must hold 12 floats (batch x heads x query tokens), got a buffer of 11", e.getMessage());
    e = assertThrows(IllegalArgumentException.class, () -> CpuAttention.DEFAULT.forward(q, k, k, null, null,
        AttentionOptions.DEFAULT, BufferTensor.bhtd(floats(96), 1, 3, 4, 8), floats(12)));
    assertEquals("o must have q's shape [1, 4, 3, 8] (stored [batch, tokens, heads, dim]), got [1, 3, 4, 8]",
        e.getMessage());
  }

  /** t's floats in a direct buffer of native order, as a DJL array's memory is: [B, T, H, D] when tokenMajor. */
  static BufferTensor direct(Tensor t, boolean tokenMajor) {
    FloatBuffer b = ByteBuffer.allocateDirect(4 * t.data().length).order(ByteOrder.nativeOrder()).asFloatBuffer();
    if (!tokenMajor) {
      b.put(t.data());
      return BufferTensor.bhtd(b.flip(), t.batch(), t.heads(), t.tokens(), t.dim());
    }
    BufferTensor bt = BufferTensor.bthd(b, t.batch(), t.tokens(), t.heads(), t.dim());
    for (int bi = 0; bi < t.batch(); bi++) {
      for (int h = 0; h < t.heads(); h++) {
        for (int tt = 0; tt < t.tokens(); tt++) {
          b.put(bt.offset(bi, h, tt), t.data(), t.offset(bi, h, tt), t.dim());
        }
      }
    }
    return bt;
  }

  private static void same(AttentionState want, AttentionState got, String where) {
    assertArrayEquals(want.o(), got.o(), where);
    assertArrayEquals(want.lse(), got.lse(), where);
  }

  private static void sameError(Executable want, Executable got) {
    RuntimeException a = assertThrows(RuntimeException.class, want);
    RuntimeException b = assertThrows(RuntimeException.class, got);
    assertEquals(a.getClass(), b.getClass());
    assertEquals(a.getMessage(), b.getMessage());
  }
}
