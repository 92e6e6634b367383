package io.longctx.djl;

import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import ai.djl.Device;
import ai.djl.ndarray.BaseNDManager;
import ai.djl.ndarray.NDArray;
import ai.djl.ndarray.NDList;
import ai.djl.ndarray.NDManager;
import ai.djl.ndarray.types.Shape;
import io.longctx.djl.AttentionOp.Layout;
import io.longctx.djl.AttentionOp.Measured;
import io.longctx.djl.AttentionOp.Path;
import io.longctx.kernels.AttentionOptions;
import io.longctx.kernels.CpuAttention;
import io.longctx.kernels.Seeds;
import io.longctx.kernels.Tensor;
import java.util.List;
import java.util.SplittableRandom;
import java.util.function.Supplier;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/**
 * Inputs the operator met wrongly until 2026-11-27 (a review of djl-op): views whose head-dim axis
 * is not dense on libtorch's path, temporaries left in the caller's manager, q.k past float32 on
 * libtorch's path, a chunked cache whose chunks disagree on kv heads.
 */
class AttentionOpInputsTest {

  private static NDManager manager;
  /** AUTO as it runs once a shape class has been calibrated to libtorch (deterministic stand-in). */
  private static final AttentionOp AUTO_LIBTORCH =
      new AttentionOp(CpuAttention.DEFAULT, (shape, java, libtorch) -> Measured.untimed(Path.LIBTORCH));

  @BeforeAll
  static void open() {
    LibtorchSdpa.open().close();
    manager = NDManager.newBaseManager(Device.cpu(), "PyTorch");
  }

  @AfterAll
  static void close() {
    manager.close();
  }

  /** x [B, H, T, D] as a view whose D axis has stride T: the transpose of a contiguous [B, H, D, T] (a K^T cache). */
  static NDArray transposedStorage(NDManager m, Tensor x) {
    int bb = x.batch(), hh = x.heads(), tt = x.tokens(), dd = x.dim();
    float[] s = new float[x.data().length];
    for (int b = 0; b < bb; b++) {
      for (int h = 0; h < hh; h++) {
        for (int t = 0; t < tt; t++) {
          for (int i = 0; i < dd; i++) {
            s[((b * hh + h) * dd + i) * tt + t] = x.data()[((b * hh + h) * tt + t) * dd + i];
          }
        }
      }
    }
    return m.create(s, new Shape(bb, hh, dd, tt)).transpose(0, 1, 3, 2);
  }

  /**
   * libtorch's CPU flash kernel assumes the head-dim axis is dense (stride 1); the operator hands it
   * views "as they are". A k whose D axis is strided (K^T storage), a v broadcast along D (stride 0)
   * or a q sliced with a step on D give garbage, finite, so the NaN check lets it through.
   */
  @Test
  void libtorchPathReadsInputsWhoseHeadDimAxisIsNotDense() {
    long seed = Seeds.forTest();
    SplittableRandom rng = new SplittableRandom(seed);
    // H == Hkv: with GQA the module's repeat_interleave copies k and v densely and hides the problem.
    Tensor q = Tensor.random(rng, 2, 2, 40, 32, 1.5), k = Tensor.random(rng, 2, 2, 40, 32, 1.5);
    float[] c = new float[2 * 2 * 40];
    for (int i = 0; i < c.length; i++) {
      c[i] = (float) rng.nextGaussian();
    }
    AttentionOptions opt = AttentionOptions.DEFAULT.withCausal(true);
    try (NDManager m = manager.newSubManager()) {
      NDArray qa = OpChecks.nd(m, q, Layout.BHTD);
      NDArray kT = transposedStorage(m, k); // k [B, Hkv, T, D] viewed from [B, Hkv, D, T] storage
      NDArray vb = m.create(c, new Shape(2, 2, 40, 1)).broadcast(new Shape(2, 2, 40, 32)); // stride 0 on D
      Tensor v = new Tensor(vb.toFloatArray(), 2, 2, 40, 32);
      StringBuilder failures = new StringBuilder();
      for (Path p : new Path[] {Path.JAVA, Path.LIBTORCH, Path.AUTO}) {
        AttentionOp op = p == Path.AUTO ? AUTO_LIBTORCH : AttentionOp.cpu();
        NDList r = op.forward(qa, kT, vb, null, null, opt, Layout.BHTD, p);
        float[][] st = OpChecks.stateOrder(r.get(0), r.get(1), Layout.BHTD);
        String err = OpChecks.check(st[0], st[1], q, k, v, null, null, opt);
        if (err != null) {
          failures.append("\n  path ").append(p).append(": ").append(err);
        }
      }
      assertTrue(failures.length() == 0, "seed " + seed + ", k with strided D axis, v broadcast along D:" + failures);
    }
  }

  @Test
  void libtorchPathWithAStepSliceOnTheHeadDim() {
    long seed = Seeds.forTest();
    SplittableRandom rng = new SplittableRandom(seed);
    Tensor wide = Tensor.random(rng, 1, 2, 40, 64, 1.5);
    Tensor k = Tensor.random(rng, 1, 2, 40, 32, 1.5), v = Tensor.random(rng, 1, 2, 40, 32);
    AttentionOptions opt = AttentionOptions.DEFAULT;
    try (NDManager m = manager.newSubManager()) {
      NDArray qs = OpChecks.nd(m, wide, Layout.BHTD).get(":, :, :, 0:64:2"); // every other feature
      Tensor q = new Tensor(qs.toFloatArray(), 1, 2, 40, 32);
      NDList r = AttentionOp.cpu().forward(qs, OpChecks.nd(m, k, Layout.BHTD), OpChecks.nd(m, v, Layout.BHTD), null,
          null, opt, Layout.BHTD, Path.LIBTORCH);
      float[][] st = OpChecks.stateOrder(r.get(0), r.get(1), Layout.BHTD);
      String err = OpChecks.check(st[0], st[1], q, k, v, null, null, opt);
      assertNull(err, "seed " + seed + ", q = x[..., 0:64:2] on the libtorch path: " + err);
    }
  }

  /**
   * Temporaries made by DJL's toByteBuffer(true) for strided arrays (and the BHTD transposes of merge)
   * land in the caller's manager and stay there until it closes: O(T*D) per call.
   */
  @Test
  void noTemporariesAreLeftInTheCallersManager() {
    SplittableRandom rng = new SplittableRandom(Seeds.forTest());
    Tensor q = Tensor.random(rng, 1, 2, 40, 32, 1.5), k = Tensor.random(rng, 1, 2, 40, 32, 1.5);
    Tensor v = Tensor.random(rng, 1, 2, 40, 32);
    AttentionOptions opt = AttentionOptions.DEFAULT.withCausal(true);
    try (NDManager m = manager.newSubManager()) {
      NDArray qc = OpChecks.nd(m, q, Layout.BHTD), kc = OpChecks.nd(m, k, Layout.BHTD), vc = OpChecks.nd(m, v, Layout.BHTD);
      NDArray qv = transposedStorage(m, q), kv = transposedStorage(m, k), vv = transposedStorage(m, v); // strided views
      NDArray k1 = kc.get(":, :, 0:20"), k2 = kc.get(":, :, 20:"), v1 = vc.get(":, :, 0:20"), v2 = vc.get(":, :, 20:");
      NDArray q1 = qc.get(":, :, 39:40");
      NDList state = AttentionOp.cpu().forward(qc, kc, vc, null, null, opt, Layout.BHTD, Path.JAVA);
      StringBuilder leaks = new StringBuilder();
      leaks.append(leak(m, "merge BHTD", () -> AttentionOp.cpu().merge(state, state, Layout.BHTD)));
      leaks.append(leak(m, "decode over chunk slices", () -> AttentionOp.cpu().decode(q1, List.of(k1, k2),
          List.of(v1, v2), new long[] {39}, null, opt, Layout.BHTD)));
      leaks.append(leak(m, "decode, strided BHTD", () -> AttentionOp.cpu().decode(qv, kv, vv, null, null, opt, Layout.BHTD)));
      leaks.append(leak(m, "forward JAVA, strided BHTD", () -> AttentionOp.cpu().forward(qv, kv, vv, null, null, opt,
          Layout.BHTD, Path.JAVA)));
      assertTrue(leaks.length() == 0, "arrays left in the caller's manager after 5 calls whose outputs were closed:" + leaks);
    }
  }

  private static String leak(NDManager m, String what, Supplier<NDList> call) {
    int before = ((BaseNDManager) m).getManagedArrays().size();
    for (int i = 0; i < 5; i++) {
      call.get().close();
    }
    int left = ((BaseNDManager) m).getManagedArrays().size() - before;
    return left == 0 ? "" : "\n  " + what + ": " + left;
  }

  /**
   * A row whose every q.k overflows float32 (finite q and k; the scaled scores, ~ -5e37, are finite):
   * the Java path refuses it (NonFiniteScoreException), and so does the libtorch path now; before, it
   * returned lse = 0 and o = 0 for the row, neither the answer nor the empty state. AUTO, calibrated to
   * libtorch, hands the call to the Java kernel, which names the overflow.
   */
  @Test
  void overflowingScoresAreRefusedOnEveryPath() {
    int d = 64, t = 4;
    float[] qd = new float[t * d], kd = new float[t * d], vd = new float[t * d];
    for (int i = 0; i < t; i++) {
      qd[i * d] = i < 2 ? 2e19f : 1f; // rows 0, 1: q.k = -4e38 * (1 + 0.1 j) overflows for every key
      kd[i * d] = -2e19f * (1 + 0.1f * i);
      java.util.Arrays.fill(vd, i * d, (i + 1) * d, 1 + i);
    }
    try (NDManager m = manager.newSubManager()) {
      NDArray q = m.create(qd, new Shape(1, 1, t, d)), k = m.create(kd, new Shape(1, 1, t, d));
      NDArray v = m.create(vd, new Shape(1, 1, t, d));
      for (Path p : new Path[] {Path.JAVA, Path.LIBTORCH, Path.AUTO}) {
        AttentionOp op = p == Path.AUTO ? AUTO_LIBTORCH : AttentionOp.cpu();
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
            () -> op.forward(q, k, v, null, null, AttentionOptions.DEFAULT, Layout.BHTD, p).close(), p.toString());
        assertTrue(e.getMessage().contains("overflow"), p + ": " + e.getMessage());
      }
    }
  }

  /**
   * NaN in v at keys no query sees (a padded cache): the Java kernel computes the call where those
   * keys lie in tiles it skips, and AUTO calibrated to libtorch, whose sums take them with weight 0,
   * hands the call to it (before, it threw); an explicit LIBTORCH path says why it cannot. Where such
   * a key shares a tile with seen ones, the Java kernel names the v entry.
   */
  @Test
  void aNaNInVAtKeysNoQuerySeesIsComputedOrNamed() {
    long seed = Seeds.forTest();
    SplittableRandom rng = new SplittableRandom(seed);
    Tensor q = Tensor.random(rng, 1, 1, 64, 16), k = Tensor.random(rng, 1, 1, 512, 16);
    Tensor v = Tensor.random(rng, 1, 1, 512, 16);
    AttentionOptions causal = AttentionOptions.DEFAULT.withCausal(true); // queries 0..63 see keys 0..63
    Tensor kSeen = new Tensor(java.util.Arrays.copyOf(k.data(), 64 * 16), 1, 1, 64, 16);
    Tensor vSeen = new Tensor(java.util.Arrays.copyOf(v.data(), 64 * 16), 1, 1, 64, 16);
    java.util.Arrays.fill(v.data(), 256 * 16, 512 * 16, Float.NaN);
    try (NDManager m = manager.newSubManager()) {
      NDArray qa = OpChecks.nd(m, q, Layout.BHTD), ka = OpChecks.nd(m, k, Layout.BHTD);
      NDArray va = OpChecks.nd(m, v, Layout.BHTD);
      for (AttentionOp op : new AttentionOp[] {AttentionOp.cpu(), AUTO_LIBTORCH}) {
        Path p = op == AUTO_LIBTORCH ? Path.AUTO : Path.JAVA;
        NDList r = op.forward(qa, ka, va, null, null, causal, Layout.BHTD, p);
        float[][] st = OpChecks.stateOrder(r.get(0), r.get(1), Layout.BHTD);
        assertNull(OpChecks.check(st[0], st[1], q, kSeen, vSeen, null, null, causal), p + ", seed " + seed);
      }
      IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
          () -> AttentionOp.cpu().forward(qa, ka, va, null, null, causal, Layout.BHTD, Path.LIBTORCH));
      assertTrue(e.getMessage().contains("libtorch's attention gave NaN or Infinity where the Java kernel computes"),
          e.getMessage());
      // 4 queries over 20 keys: key 19 shares the queries' one tile.
      NDArray q4 = qa.get(":, :, 0:4"), k20 = ka.get(":, :, 0:20"), v20 = va.get(":, :, 236:256").duplicate();
      v20.set(new ai.djl.ndarray.index.NDIndex(":, :, 19, 3"), Float.NaN);
      e = assertThrows(IllegalArgumentException.class,
          () -> AttentionOp.cpu().forward(q4, k20, v20, null, null, causal, Layout.BHTD, Path.JAVA));
      assertTrue(e.getMessage().contains("v is NaN at kv head 0, key token 19") && e.getMessage().contains("dim 3"),
          e.getMessage());
    }
  }

  /** Moderate inputs stay on libtorch's path: the bound refuses only values near 1e17 and beyond. */
  @Test
  void largeButSafeInputsStayOnTheLibtorchPath() {
    long seed = Seeds.forTest();
    SplittableRandom rng = new SplittableRandom(seed);
    Tensor q = Tensor.random(rng, 1, 2, 24, 32, 1e6), k = Tensor.random(rng, 1, 2, 24, 32, 1e-6);
    Tensor v = Tensor.random(rng, 1, 2, 24, 32);
    try (NDManager m = manager.newSubManager()) {
      NDList r = AttentionOp.cpu().forward(OpChecks.nd(m, q, Layout.BHTD), OpChecks.nd(m, k, Layout.BHTD),
          OpChecks.nd(m, v, Layout.BHTD), null, null, AttentionOptions.DEFAULT, Layout.BHTD, Path.LIBTORCH);
      float[][] st = OpChecks.stateOrder(r.get(0), r.get(1), Layout.BHTD);
      assertNull(OpChecks.check(st[0], st[1], q, k, v, null, null, AttentionOptions.DEFAULT), "seed " + seed);
    }
  }

  /** Chunks of one KV cache with different kv head counts (2 and 4 for 4 query heads) are merged silently. */
  @Test
  void decodeChunksWithDifferentKvHeadCountsAreRefused() {
    try (NDManager m = manager.newSubManager()) {
      NDArray q = m.randomNormal(new Shape(1, 4, 1, 16));
      NDArray c1 = m.randomNormal(new Shape(1, 2, 5, 16)), c2 = m.randomNormal(new Shape(1, 4, 5, 16));
      assertThrows(IllegalArgumentException.class, () -> AttentionOp.cpu().decode(q, List.of(c1, c2), List.of(c1, c2),
          null, null, AttentionOptions.DEFAULT, Layout.BHTD));
    }
  }

  /** PlainAttention (public) names positions of the wrong length (an index error before). */
  @Test
  void plainAttentionNamesPositionsOfTheWrongLength() {
    try (NDManager m = manager.newSubManager()) {
      NDArray x = m.randomNormal(new Shape(1, 2, 4, 8));
      IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
          () -> PlainAttention.forward(x, x, x, new long[] {0, 1, 2}, null, AttentionOptions.DEFAULT.withCausal(true), null));
      assertTrue(e.getMessage().contains("qPos has 3 for 4 queries"), e.getMessage());
      // Shapes libtorch would only broadcast-fail on, and an int array it would have cast without a word.
      NDArray shortD = m.randomNormal(new Shape(1, 2, 4, 6)), otherBatch = m.randomNormal(new Shape(2, 2, 4, 8));
      for (NDArray[] bad : new NDArray[][] {{x, shortD, shortD}, {x, otherBatch, otherBatch}, {x, x, shortD}}) {
        e = assertThrows(IllegalArgumentException.class,
            () -> PlainAttention.forward(bad[0], bad[1], bad[2], null, null, AttentionOptions.DEFAULT, null));
        assertTrue(e.getMessage().startsWith("k and v must have one shape"), e.getMessage());
      }
      NDArray ints = m.zeros(new Shape(1, 2, 4, 8), ai.djl.ndarray.types.DataType.INT32);
      e = assertThrows(IllegalArgumentException.class,
          () -> PlainAttention.forward(ints, x, x, null, null, AttentionOptions.DEFAULT, null));
      assertTrue(e.getMessage().contains("must be floating point"), e.getMessage());
    }
  }

  /** A sparse array is refused naming it (libtorch failed inside "reshape", naming nothing). */
  @Test
  void sparseArraysAreRefusedByName() {
    try (NDManager m = manager.newSubManager()) {
      NDArray q = m.randomNormal(new Shape(1, 1, 2, 4));
      NDArray k = m.createCoo(java.nio.FloatBuffer.wrap(new float[] {1f, 2f}), new long[][] {{0, 0}, {0, 0}, {0, 1},
          {1, 3}}, new Shape(1, 1, 2, 4));
      for (Path path : Path.values()) {
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
            () -> AttentionOp.cpu().forward(q, k, q, null, null, AttentionOptions.DEFAULT, Layout.BHTD, path));
        assertTrue(e.getMessage().startsWith("k is a sparse (COO) array"), path + ": " + e.getMessage());
      }
      IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
          () -> AttentionOp.cpu().decode(q, k, q, null, null, AttentionOptions.DEFAULT, Layout.BHTD));
      assertTrue(e.getMessage().startsWith("k is a sparse (COO) array"), e.getMessage());
    }
  }

  /**
   * Two threads calling the operator on the same strided inputs at once: an earlier fix of the
   * temporaries above lent the caller's array to a scope of the call, and the other thread then made
   * its outputs on that scope after it closed ("NDManager has been closed already", intermittently).
   */
  @Test
  void twoCallersShareOneStridedInput() throws Exception {
    SplittableRandom rng = new SplittableRandom(Seeds.forTest());
    Tensor q = Tensor.random(rng, 1, 2, 40, 32, 1.5), k = Tensor.random(rng, 1, 2, 40, 32, 1.5);
    Tensor v = Tensor.random(rng, 1, 2, 40, 32);
    try (NDManager m = manager.newSubManager()) {
      NDArray qv = transposedStorage(m, q), kv = transposedStorage(m, k), vv = transposedStorage(m, v);
      java.util.concurrent.ExecutorService pool = java.util.concurrent.Executors.newFixedThreadPool(2);
      try {
        List<java.util.concurrent.Future<?>> calls = new java.util.ArrayList<>();
        for (int t = 0; t < 2; t++) {
          calls.add(pool.submit(() -> {
            for (int i = 0; i < 30; i++) {
              AttentionOp.cpu().forward(qv, kv, vv, null, null, AttentionOptions.DEFAULT, Layout.BHTD, Path.JAVA)
                  .close();
            }
            return null;
          }));
        }
        for (java.util.concurrent.Future<?> f : calls) {
          f.get(); // an exception in a caller fails here
        }
      } finally {
        pool.shutdownNow();
      }
    }
  }
}
