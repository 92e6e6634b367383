package io.longctx.djl;

import ai.djl.ndarray.NDArray;
import ai.djl.ndarray.NDManager;
import ai.djl.ndarray.types.Shape;
import io.longctx.kernels.AttentionOptions;
import io.longctx.kernels.ReferenceAttention;
import io.longctx.kernels.Tolerance;
import io.longctx.kernels.Tensor;

/**
 * Test support: NDArray conversions and the docs/CONVENTIONS.md tolerance rule (error against
 * the float64 reference at most 2x that of the naive float32 algorithm, plus a small epsilon).
 */
final class OpChecks {

  private OpChecks() {}

  /** Our [B, H, T, D] tensor as an NDArray in the layout. */
  static NDArray nd(NDManager m, Tensor x, AttentionOp.Layout layout) {
    NDArray a = m.create(x.data(), new Shape(x.batch(), x.heads(), x.tokens(), x.dim()));
    return layout == AttentionOp.Layout.BHTD ? a : a.transpose(0, 2, 1, 3).duplicate();
  }

  /** o and lse of an operator result in attention-state order (row = b*T+t, head, dim). */
  static float[][] stateOrder(NDArray o, NDArray lse, AttentionOp.Layout layout) {
    if (layout == AttentionOp.Layout.BHTD) {
      return new float[][] {o.transpose(0, 2, 1, 3).toFloatArray(), lse.transpose(0, 2, 1).toFloatArray()};
    }
    return new float[][] {o.toFloatArray(), lse.toFloatArray()};
  }

  /** Null when within tolerance, else a message. */
  static String check(float[] o, float[] lse, Tensor q, Tensor k, Tensor v, long[] qPos, long[] kPos,
      AttentionOptions opt) {
    ReferenceAttention.Result ref = ReferenceAttention.compute(q, k, v, qPos, kPos, opt);
    ReferenceAttention.Result naive = ReferenceAttention.computeFloat32(q, k, v, qPos, kPos, opt);
    return Tolerance.violation(o, lse, ref, naive);
  }
}
