package io.longctx.kernels;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

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
    long seed = Accuracy.seed();
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
      Tensor q = Accuracy.random(rng, batch, kvHeads * group, tq, dim, 1);
      Tensor k = Accuracy.random(rng, batch, kvHeads, tk, dim, 1);
      Tensor v = Accuracy.random(rng, batch, kvHeads, tk, dim, 1);
      long[] qp = new long[tq];
      for (int t = 0; t < tq; t++) {
        qp[t] = tk - tq + t + rng.nextInt(3);
      }
      AttentionOptions opt = AttentionOptions.DEFAULT.withCausal(rng.nextBoolean())
          .withWindow(rng.nextInt(3) == 0 ? 1 + rng.nextInt(200) : 0)
          .withSoftcap(rng.nextInt(3) == 0 ? 20f : 0f);
      boolean qTokenMajor = rng.nextBoolean(), kvTokenMajor = rng.nextBoolean();
      String where = "seed " + seed + ", round " + round + ": B " + batch + " heads " + kvHeads * group + "/" + kvHeads
          + " Tq " + tq + " Tk " + tk + " D " + dim + " split " + split + " " + opt + ", q token-major " + qTokenMajor
          + ", k/v token-major " + kvTokenMajor;
      BufferTensor qb = direct(q, qTokenMajor), kb = direct(k, kvTokenMajor), vb = direct(v, kvTokenMajor);
      same(CpuAttention.DEFAULT.forward(q, k, v, qp, null, opt), CpuAttention.DEFAULT.forward(qb, kb, vb, qp, null, opt),
          "forward, " + where);
      same(CpuAttention.DEFAULT.decode(q, k, v, qp, null, opt, split).state(),
          CpuAttention.DEFAULT.decode(qb, kb, vb, qp, null, opt, split).state(), "decode, " + where);
    }
  }

  @Test
  void badBuffersAreNamedAsTheTensorFormNamesThem() {
    SplittableRandom rng = new SplittableRandom(7);
    Tensor q = Accuracy.random(rng, 1, 2, 3, 8, 1); // one query head a kv head: one task sees the NaN below
    Tensor k = Accuracy.random(rng, 1, 2, 10, 8, 1);
    FloatBuffer short10 = ByteBuffer.allocateDirect(4 * 159).order(ByteOrder.nativeOrder()).asFloatBuffer();
    IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
        () -> BufferTensor.bhtd(short10, 1, 2, 10, 8));
    assertEquals("tensor of shape [1, 2, 10, 8] needs 160 floats, buffer has 159", e.getMessage());
    // k and v of other orders, other shapes: named with both.
    e = assertThrows(IllegalArgumentException.class, () -> CpuAttention.DEFAULT.forward(direct(q, false),
        direct(k, false), direct(k, true), null, null, AttentionOptions.DEFAULT));
    assertEquals("k and v must have the same shape and order, got k [1, 2, 10, 8] and v [1, 2, 10, 8] (stored "
        + "[batch, tokens, heads, dim])", e.getMessage());
    Tensor k3 = Accuracy.random(rng, 1, 3, 10, 8, 1);
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
