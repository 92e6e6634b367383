package io.longctx.djl;

import ai.djl.ndarray.NDArray;
import ai.djl.ndarray.NDArrays;
import ai.djl.ndarray.NDList;
import ai.djl.ndarray.NDManager;
import ai.djl.ndarray.types.DataType;
import ai.djl.ndarray.types.Shape;
import io.longctx.kernels.AttentionOptions;

/**
 * Attention with plain DJL ops, as DJL's own {@code ScaledDotProductAttentionBlock} computes it:
 * matMul, scale, (mask), softmax, matMul. It materializes the [B, H, Tq, Tk] score matrix (memory
 * O(T^2)) and is differentiable, so {@link MultiHeadAttentionBlock} uses it when training; the
 * benchmark runs it as {@code djl-plain}. Not a production inference path: use {@link AttentionOp}.
 */
public final class PlainAttention {

  private PlainAttention() {}

  /**
   * Attention of q [B, H, Tq, D] over k, v [B, Hkv, Tk, D] (GQA by repeating kv heads, contiguous
   * groups). Positions may be null (0..T-1). {@code additiveMask} is null or broadcastable to
   * [B, H, Tq, Tk] and added to the scores (DJL's block convention). Returns NDList(o [B, H, Tq, D],
   * lse [B, H, Tq]), float32 whatever the inputs' type. A row that sees no key gets o = 0 and lse = -inf.
   */
  public static NDList forward(NDArray q, NDArray k, NDArray v, long[] qPos, long[] kPos, AttentionOptions opt,
      NDArray additiveMask) {
    LibtorchWarmup.ensure();
    for (NDArray a : new NDArray[] {q, k, v}) { // an int array was cast without a word
      if (!a.getDataType().isFloating()) {
        throw new IllegalArgumentException("q, k, v must be floating point, got " + q.getDataType() + ", "
            + k.getDataType() + ", " + v.getDataType());
      }
    }
    // float32 arithmetic whatever the inputs: the masks are float32, and mixing them into float16
    // scores made libtorch refuse the P V product (float against Half).
    q = q.toType(DataType.FLOAT32, false);
    k = k.toType(DataType.FLOAT32, false);
    v = v.toType(DataType.FLOAT32, false);
    if (q.getShape().dimension() != 4 || k.getShape().dimension() != 4 || v.getShape().dimension() != 4) {
      throw new IllegalArgumentException("q, k, v must be 4-d [B, H, T, D], got q " + q.getShape() + ", k "
          + k.getShape() + ", v " + v.getShape());
    }
    if (!k.getShape().equals(v.getShape()) || q.getShape().get(0) != k.getShape().get(0)
        || q.getShape().get(3) != k.getShape().get(3)) { // libtorch's broadcast error named no argument
      throw new IllegalArgumentException("k and v must have one shape, and share q's batch and head dim: q "
          + q.getShape() + ", k " + k.getShape() + ", v " + v.getShape());
    }
    long heads = q.getShape().get(1), kvHeads = k.getShape().get(1);
    long tq = q.getShape().get(2), tk = k.getShape().get(2);
    int dim = (int) q.getShape().get(3);
    if (kvHeads == 0 || heads % kvHeads != 0) {
      throw new IllegalArgumentException("q's " + heads + " heads are not a multiple of k's " + kvHeads);
    }
    if (qPos != null && qPos.length != tq || kPos != null && kPos.length != tk) {
      throw new IllegalArgumentException("positions: qPos has " + (qPos == null ? "default" : qPos.length)
          + " for " + tq + " queries, kPos " + (kPos == null ? "default" : kPos.length) + " for " + tk + " keys");
    }
    if (tk == 0) { // no key: the max over an empty axis would fail; every row is the empty state
      NDArray o = q.zerosLike();
      NDArray lse = q.getManager().full(new Shape(q.getShape().get(0), heads, tq), Float.NEGATIVE_INFINITY);
      return new NDList(o, lse);
    }
    if (heads != kvHeads) {
      long group = heads / kvHeads;
      k = k.repeat(1, group); // element-wise repeat: head h reads kv head h / group
      v = v.repeat(1, group);
    }
    NDArray s = q.matMul(k.transpose(0, 1, 3, 2)).mul((float) opt.scaleFor(dim));
    if (opt.softcap() > 0) {
      s = s.div(opt.softcap()).tanh().mul(opt.softcap());
    }
    if (opt.masked()) {
      s = s.add(positionMask(q.getManager(), (int) tq, (int) tk, qPos, kPos, opt));
    }
    if (additiveMask != null) {
      s = s.add(additiveMask);
    }
    NDArray m = s.max(new int[] {3}, true);
    // Rows with every key masked: max is -inf; shift by 0 there so no NaN appears.
    NDArray finite = m.isInfinite().logicalNot();
    NDArray shift = NDArrays.where(finite, m, m.zerosLike());
    NDArray e = s.sub(shift).exp();
    NDArray sum = e.sum(new int[] {3}, true);
    NDArray lse = sum.log().add(shift); // -inf where the row saw no key
    NDArray p = e.div(NDArrays.where(sum.gt(0), sum, sum.onesLike()));
    NDArray o = p.matMul(v);
    return new NDList(o, lse.squeeze(3));
  }

  /** Additive [1, 1, Tq, Tk] mask: 0 where the query sees the key, -inf elsewhere. */
  static NDArray positionMask(NDManager manager, int tq, int tk, long[] qPos, long[] kPos, AttentionOptions opt) {
    float[] mask = new float[Math.multiplyExact(tq, tk)];
    for (int i = 0; i < tq; i++) {
      long qp = qPos != null ? qPos[i] : i;
      for (int j = 0; j < tk; j++) {
        long kp = kPos != null ? kPos[j] : j;
        mask[i * tk + j] = opt.visible(qp, kp) ? 0f : Float.NEGATIVE_INFINITY;
      }
    }
    return manager.create(mask, new Shape(1, 1, tq, tk));
  }
}
