package io.longctx.examples;

import ai.djl.ndarray.NDArray;
import ai.djl.ndarray.NDList;
import ai.djl.ndarray.NDManager;
import ai.djl.ndarray.types.DataType;
import ai.djl.ndarray.types.Shape;
import ai.djl.training.ParameterStore;
import io.longctx.djl.AttentionOp;
import io.longctx.djl.MultiHeadAttentionBlock;
import io.longctx.kernels.AttentionOptions;
import io.longctx.kernels.AttentionState;
import io.longctx.kernels.CpuAttention;
import io.longctx.kernels.Tensor;
import java.util.ArrayList;
import java.util.List;
import java.util.Random;

/**
 * A first program with longctx, meant to be copied: (1) the CPU kernel on a sequence cut into key
 * chunks, one partial attention state per chunk, merged, against one call over the whole sequence;
 * (2) the DJL operator on NDArrays; (3) a {@link MultiHeadAttentionBlock} in place of DJL's own.
 *
 * <p>Run (README "Use from Java"): {@code java --add-modules=jdk.incubator.vector
 * -Dai.djl.offline=true -cp CLASSPATH io.longctx.examples.QuickStart [tokens]}. It exits with an
 * exception if a comparison is off by more than float32 rounding, so it doubles as a smoke test.
 * Conventions (state layout, masks, tolerances): docs/CONVENTIONS.md.
 */
public final class QuickStart {

  private QuickStart() {}

  public static void main(String[] args) {
    int tokens = args.length > 0 ? Integer.parseInt(args[0]) : 1000;
    int heads = 4, kvHeads = 2, dim = 64, chunkLen = 256;
    Random rnd = new Random(42);

    // ---- 1. kernel: chunked keys + merge == one whole call (up to float32 rounding) ----------
    // Tensors are [batch, heads, tokens, dim] float32; K and V have kvHeads (grouped-query).
    Tensor q = random(rnd, heads, tokens, dim);
    Tensor k = random(rnd, kvHeads, tokens, dim);
    Tensor v = random(rnd, kvHeads, tokens, dim);
    long[] pos = range(0, tokens); // absolute token positions; masks are defined on them
    AttentionOptions opt = AttentionOptions.DEFAULT.withCausal(true);

    AttentionState whole = CpuAttention.DEFAULT.forward(q, k, v, pos, pos, opt);

    List<AttentionState> parts = new ArrayList<>();
    for (int start = 0; start < tokens; start += chunkLen) {
      int len = Math.min(chunkLen, tokens - start);
      // every query against this chunk of keys only; queries before the chunk see nothing: (0, -inf)
      parts.add(CpuAttention.DEFAULT.forward(q, k.sliceTokens(start, start + len), v.sliceTokens(start, start + len),
          pos, range(start, len), opt));
    }
    AttentionState merged = AttentionState.mergeAll(parts); // fixed order, balanced tree
    System.out.printf(java.util.Locale.ROOT,
        "kernel: %d tokens in %d chunks, merged vs whole: o rel-L2 %.2e, lse max-abs %.2e%n",
        tokens, parts.size(), relL2(merged.o(), whole.o()), maxAbs(merged.lse(), whole.lse()));
    check("merged vs whole", relL2(merged.o(), whole.o()));

    try (NDManager manager = NDManager.newBaseManager("PyTorch")) {
      // ---- 2. the DJL operator: NDList(o [B,H,T,D], lse [B,H,T]) -------------------------------
      NDArray nq = manager.create(q.data(), new Shape(1, heads, tokens, dim));
      NDArray nk = manager.create(k.data(), new Shape(1, kvHeads, tokens, dim));
      NDArray nv = manager.create(v.data(), new Shape(1, kvHeads, tokens, dim));
      NDList out = AttentionOp.cpu().forward(nq, nk, nv, opt);
      // the state stores o[(row*heads+head)*dim+d]; the op's o is [B,H,T,D]: compare per element
      float[] opO = out.get(0).toFloatArray();
      float[] wholeBhtd = new float[opO.length];
      for (int h = 0; h < heads; h++) {
        for (int t = 0; t < tokens; t++) {
          System.arraycopy(whole.o(), (t * heads + h) * dim, wholeBhtd, (h * tokens + t) * dim, dim);
        }
      }
      System.out.printf(java.util.Locale.ROOT, "op: o %s lse %s, vs kernel: o rel-L2 %.2e%n",
          out.get(0).getShape(), out.get(1).getShape(), relL2(opO, wholeBhtd));
      check("op vs kernel", relL2(opO, wholeBhtd));

      // ---- 3. a Block: drop-in for DJL's ScaledDotProductAttentionBlock --------------------------
      int embedding = heads * dim;
      MultiHeadAttentionBlock block = MultiHeadAttentionBlock.builder()
          .setEmbeddingSize(embedding).setHeadCount(heads).optKvHeadCount(kvHeads)
          .optCausal(true).optRotary(10000).build();
      block.initialize(manager, DataType.FLOAT32, new Shape(1, tokens, embedding));
      NDArray x = manager.randomNormal(new Shape(1, tokens, embedding));
      NDArray y = block.forward(new ParameterStore(manager, false), new NDList(x), false).head();
      System.out.println("block: " + x.getShape() + " -> " + y.getShape());
    }
  }

  /** Float32 rounding at these sizes is ~1e-7; 1e-5 leaves room and still catches a wrong result. */
  static void check(String what, double relErr) {
    if (!(relErr <= 1e-5)) {
      throw new IllegalStateException(what + ": relative error " + relErr + " is more than rounding");
    }
  }

  static Tensor random(Random rnd, int heads, int tokens, int dim) {
    float[] a = new float[heads * tokens * dim];
    for (int i = 0; i < a.length; i++) {
      a[i] = (float) rnd.nextGaussian();
    }
    return new Tensor(a, 1, heads, tokens, dim);
  }

  static long[] range(long start, int n) {
    long[] p = new long[n];
    for (int i = 0; i < n; i++) {
      p[i] = start + i;
    }
    return p;
  }

  static double relL2(float[] a, float[] b) {
    double num = 0, den = 0;
    for (int i = 0; i < a.length; i++) {
      num += (a[i] - (double) b[i]) * (a[i] - (double) b[i]);
      den += (double) b[i] * b[i];
    }
    return Math.sqrt(num / den);
  }

  static double maxAbs(float[] a, float[] b) {
    double m = 0;
    for (int i = 0; i < a.length; i++) {
      m = Math.max(m, Math.abs(a[i] - (double) b[i]));
    }
    return m;
  }
}
