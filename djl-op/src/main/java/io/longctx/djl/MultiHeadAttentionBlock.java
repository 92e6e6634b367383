package io.longctx.djl;

import ai.djl.ndarray.NDArray;
import ai.djl.ndarray.NDList;
import ai.djl.ndarray.NDManager;
import ai.djl.ndarray.types.DataType;
import ai.djl.ndarray.types.Shape;
import ai.djl.nn.AbstractBlock;
import ai.djl.nn.core.Linear;
import ai.djl.training.ParameterStore;
import ai.djl.util.PairList;
import io.longctx.kernels.AttentionOptions;

/**
 * Multi-head attention with q/k/v/out projections on the longctx operator ({@link AttentionOp}),
 * a drop-in for DJL's {@code ai.djl.nn.transformer.ScaledDotProductAttentionBlock}: the same inputs,
 * the same child blocks in the same order ({@code keyProjection}, {@code queryProjection},
 * {@code valueProjection}, {@code resultProjection}, with bias), the same output shape; with
 * {@code kvHeads == heads}, no causal mask and no rotary embedding it computes the same function.
 * On top of it: GQA/MQA ({@link Builder#optKvHeadCount}), causal and sliding-window masks by
 * absolute positions, softcap, scale, and optional rotary position embedding (RoPE, half-split
 * "NeoX" form).
 *
 * <p>Inputs, as the DJL block: {@code (x)} self-attention, {@code (x, mask)}, {@code (key, query,
 * value)} or {@code (key, query, value, mask)}; embeddings are [B, T, E]; the mask is [B, Tq, Tk]
 * with 1 for visible keys (or an additive 4-d offset; a row whose 0/1 mask hides every key attends
 * them as if unmasked, as in DJL's block: the same offset on every score cancels in the softmax). Output: {@code (y [B, Tq, E])}. Positions
 * come from the forward {@code params}: {@link #Q_POSITIONS} and {@link #K_POSITIONS} as
 * {@code long[]} (default 0..T-1); they drive the causal/window masks and the rotary angles. In
 * self-attention, {@code (x)} or {@code (x, x, x)} with one array as key and query, the keys take the
 * query positions unless K_POSITIONS is given.
 *
 * <p><b>Paths and gradients.</b> In inference ({@code training == false}) without an explicit mask,
 * attention runs on {@link AttentionOp} (memory O(T*D), libtorch's fused attention or our Java
 * kernel by measured dispatch). That path records no gradients: it is inference-only. With
 * {@code training == true} (DJL's Trainer passes it; pass it yourself inside a
 * {@code GradientCollector}) or with an explicit mask, the block uses differentiable plain DJL ops
 * ({@link PlainAttention}), which materialize the T x T scores like DJL's block. No attention
 * dropout (use {@code ScaledDotProductAttentionBlock} if that is needed).
 */
public final class MultiHeadAttentionBlock extends AbstractBlock {

  /** Forward param key: query positions, {@code long[]} of length Tq. */
  public static final String Q_POSITIONS = "longctx.qPositions";
  /** Forward param key: key positions, {@code long[]} of length Tk. */
  public static final String K_POSITIONS = "longctx.kPositions";

  private static final byte VERSION = 1;

  private final int embeddingSize;
  private final int heads;
  private final int kvHeads;
  private final int headDim;
  private final AttentionOptions options;
  private final double rotaryBase;
  private final AttentionOp op;
  private final Linear keyProjection;
  private final Linear queryProjection;
  private final Linear valueProjection;
  private final Linear resultProjection;

  private MultiHeadAttentionBlock(Builder b) {
    super(VERSION);
    this.embeddingSize = b.embeddingSize;
    this.heads = b.heads;
    this.kvHeads = b.kvHeads > 0 ? b.kvHeads : b.heads;
    this.headDim = b.embeddingSize / b.heads;
    this.options = b.options;
    this.rotaryBase = b.rotaryBase;
    this.op = b.op;
    long kvUnits = (long) kvHeads * headDim;
    // Same names and order as DJL's ScaledDotProductAttentionBlock, so parameters line up.
    this.keyProjection = addChildBlock("keyProjection", Linear.builder().setUnits(kvUnits).optBias(b.bias).build());
    this.queryProjection =
        addChildBlock("queryProjection", Linear.builder().setUnits(embeddingSize).optBias(b.bias).build());
    this.valueProjection =
        addChildBlock("valueProjection", Linear.builder().setUnits(kvUnits).optBias(b.bias).build());
    this.resultProjection =
        addChildBlock("resultProjection", Linear.builder().setUnits(embeddingSize).optBias(b.bias).build());
  }

  public static Builder builder() {
    return new Builder();
  }

  public Linear getKeyProjection() {
    return keyProjection;
  }

  public Linear getQueryProjection() {
    return queryProjection;
  }

  public Linear getValueProjection() {
    return valueProjection;
  }

  public Linear getResultProjection() {
    return resultProjection;
  }

  public AttentionOptions getOptions() {
    return options;
  }

  @Override
  public Shape[] getOutputShapes(Shape[] inputShapes) {
    if (inputShapes.length == 1 || inputShapes.length == 2) {
      return new Shape[] {inputShapes[0]};
    }
    if (inputShapes.length == 3 || inputShapes.length == 4) {
      return new Shape[] {inputShapes[1]};
    }
    throw new IllegalArgumentException("expected 1 to 4 inputs, got " + inputShapes.length);
  }

  /**
   * Loads as DJL does, then checks each projection's weight against this block's sizes: DJL takes
   * parameters of any shape, and weights saved from a block of other head counts failed only in
   * forward, as a reshape error inside libtorch.
   */
  @Override
  public void loadParameters(NDManager manager, java.io.DataInputStream is)
      throws java.io.IOException, ai.djl.MalformedModelException {
    super.loadParameters(manager, is);
    long kvUnits = (long) kvHeads * headDim;
    Object[][] expected = {{"keyProjection", keyProjection, kvUnits}, {"queryProjection", queryProjection,
        (long) embeddingSize}, {"valueProjection", valueProjection, kvUnits}, {"resultProjection", resultProjection,
        (long) embeddingSize}};
    for (Object[] e : expected) {
      ai.djl.nn.Parameter w = ((Linear) e[1]).getParameters().get("weight");
      Shape want = new Shape((long) e[2], embeddingSize);
      if (w != null && w.isInitialized() && !w.getArray().getShape().equals(want)) {
        throw new ai.djl.MalformedModelException(e[0] + ".weight is " + w.getArray().getShape()
            + " in the saved parameters; this block (embedding " + embeddingSize + ", " + heads + " heads, " + kvHeads
            + " kv heads) needs " + want + ": build the block with the sizes it was saved with");
      }
    }
  }

  /** E: the size of the inputs' last axis and of the output's. */
  int embeddingSize() {
    return embeddingSize;
  }

  @Override
  public void initializeChildBlocks(NDManager manager, DataType dataType, Shape... inputShapes) {
    Shape in = new Shape(-1L, embeddingSize);
    keyProjection.initialize(manager, dataType, in);
    queryProjection.initialize(manager, dataType, in);
    valueProjection.initialize(manager, dataType, in);
    resultProjection.initialize(manager, dataType, new Shape(-1L, embeddingSize));
  }

  @Override
  protected NDList forwardInternal(ParameterStore ps, NDList inputs, boolean training,
      PairList<String, Object> params) {
    if (inputs.isEmpty() || inputs.size() > 4) {
      throw new IllegalArgumentException("expected (x), (x, mask), (key, query, value) or (key, query, value, mask), got "
          + inputs.size() + " inputs");
    }
    NDArray keyIn, queryIn, valueIn;
    if (inputs.size() < 3) {
      keyIn = queryIn = valueIn = inputs.get(0);
    } else {
      keyIn = inputs.get(0);
      queryIn = inputs.get(1);
      valueIn = inputs.get(2);
    }
    NDArray mask = inputs.size() == 2 || inputs.size() == 4 ? inputs.get(inputs.size() - 1) : null;
    Shape qs = queryIn.getShape(), ks = keyIn.getShape();
    if (qs.dimension() != 3 || ks.dimension() != 3 || qs.get(2) != embeddingSize || ks.get(2) != embeddingSize
        || !ks.equals(valueIn.getShape()) || qs.get(0) != ks.get(0)) {
      throw new IllegalArgumentException("embeddings must be [B, T, " + embeddingSize + "] with one batch size and "
          + "key and value alike, got query " + qs + ", key " + ks + ", value " + valueIn.getShape());
    }
    long batch = qs.get(0), tq = qs.get(1), tk = ks.get(1);
    long[] qPos = positions(params, Q_POSITIONS, tq);
    long[] kPos = positions(params, K_POSITIONS, tk);
    if (kPos == null && (inputs.size() < 3 || keyIn == queryIn)) {
      kPos = qPos; // self-attention, (x) or (x, x, x): the keys are the queries' tokens
    }
    NDArray q = queryProjection.forward(ps, new NDList(queryIn), training, params).head()
        .reshape(batch, tq, heads, headDim);
    NDArray k = keyProjection.forward(ps, new NDList(keyIn), training, params).head()
        .reshape(batch, tk, kvHeads, headDim);
    NDArray v = valueProjection.forward(ps, new NDList(valueIn), training, params).head()
        .reshape(batch, tk, kvHeads, headDim);
    if (rotaryBase > 0) {
      q = rotary(q, qPos, rotaryBase);
      k = rotary(k, kPos, rotaryBase);
    }
    NDArray o; // [B, Tq, H, D]
    if (training || mask != null) {
      NDArray additive = mask == null ? null : additiveMask(mask, batch, heads, tq, tk);
      o = PlainAttention.forward(q.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3),
          qPos, kPos, options, additive).get(0).transpose(0, 2, 1, 3);
    } else {
      o = op.forward(q, k, v, qPos, kPos, options, AttentionOp.Layout.BTHD, AttentionOp.Path.AUTO).get(0);
    }
    // The operator's output is float32 whatever its inputs: back to the block's type for the projection.
    NDArray merged = o.reshape(batch, tq, embeddingSize).toType(queryIn.getDataType(), false);
    return resultProjection.forward(ps, new NDList(merged), training, params);
  }

  /**
   * DJL's convention: a [B, Tq, Tk] 0/1 mask becomes an offset of -100000 on hidden keys; a 4-d mask
   * [B or 1, 1 or H, Tq, Tk] is taken as additive already. The offset is finite, as in DJL's block,
   * so a query row whose 0/1 mask hides every key attends them as if unmasked (one offset on every
   * score cancels in the softmax, up to float32 rounding near 1e5); under the operator's
   * convention (docs/CONVENTIONS.md) such a row sees no key and its output is 0: pass an additive
   * mask of -Infinity (or a causal option) to get that.
   */
  private static NDArray additiveMask(NDArray mask, long batch, long heads, long tq, long tk) {
    Shape s = mask.getShape();
    boolean ok = s.dimension() == 3 ? s.get(0) == batch && s.get(1) == tq && s.get(2) == tk
        : s.dimension() == 4 && (s.get(0) == batch || s.get(0) == 1) && (s.get(1) == 1 || s.get(1) == heads)
            && s.get(2) == tq && s.get(3) == tk;
    if (!ok) {
      throw new IllegalArgumentException("mask must be [B, Tq, Tk] = [" + batch + ", " + tq + ", " + tk
          + "] (0/1), or additive [B or 1, 1 or H, Tq, Tk], got " + s);
    }
    if (s.dimension() == 4) {
      return mask;
    }
    return mask.toType(DataType.FLOAT32, false).reshape(batch, 1, tq, tk).mul(-1f).add(1f).mul(-100000f);
  }

  private static long[] positions(PairList<String, Object> params, String key, long n) {
    if (params == null) {
      return null;
    }
    Object p = params.get(key);
    if (p == null) {
      return null;
    }
    if (!(p instanceof long[] pos)) {
      throw new IllegalArgumentException(key + " must be a long[], got " + p.getClass().getName());
    }
    if (pos.length != n) {
      throw new IllegalArgumentException(key + " has " + pos.length + " positions for " + n + " tokens");
    }
    return pos;
  }

  /**
   * Rotary position embedding on x [B, T, H, D] (D even), half-split form: with
   * {@code theta_i = base^(-2i/D)} and angle {@code pos * theta_i}, the pairs (x_i, x_{i+D/2}) are
   * rotated by the angle. Angles are computed in float64 from the absolute positions.
   */
  static NDArray rotary(NDArray x, long[] pos, double base) {
    Shape s = x.getShape();
    int t = (int) s.get(1), d = (int) s.get(3), half = d / 2;
    if (d % 2 != 0) {
      throw new IllegalArgumentException("rotary embedding needs an even head dim, got " + d);
    }
    float[] cos = new float[t * half];
    float[] sin = new float[t * half];
    for (int i = 0; i < t; i++) {
      double p = pos != null ? pos[i] : i;
      for (int j = 0; j < half; j++) {
        double a = p * Math.pow(base, -2.0 * j / d);
        cos[i * half + j] = (float) Math.cos(a);
        sin[i * half + j] = (float) Math.sin(a);
      }
    }
    NDManager m = x.getManager();
    // In x's type: float32 tables would turn float16 q and k into float32.
    NDArray c = m.create(cos, new Shape(1, t, 1, half)).toType(x.getDataType(), false);
    NDArray sn = m.create(sin, new Shape(1, t, 1, half)).toType(x.getDataType(), false);
    NDArray x1 = x.get(":, :, :, 0:" + half);
    NDArray x2 = x.get(":, :, :, " + half + ":");
    return x1.mul(c).sub(x2.mul(sn)).concat(x2.mul(c).add(x1.mul(sn)), 3);
  }

  /** Builder; {@link #setEmbeddingSize} and {@link #setHeadCount} are required. */
  public static final class Builder {
    private int embeddingSize;
    private int heads;
    private int kvHeads;
    private boolean bias = true;
    private AttentionOptions options = AttentionOptions.DEFAULT;
    private double rotaryBase;
    private AttentionOp op = AttentionOp.cpu();

    private Builder() {}

    public Builder setEmbeddingSize(int e) {
      this.embeddingSize = e;
      return this;
    }

    public Builder setHeadCount(int h) {
      this.heads = h;
      return this;
    }

    /** Key/value heads for GQA/MQA; must divide the head count. Default: the head count. */
    public Builder optKvHeadCount(int hkv) {
      this.kvHeads = hkv;
      return this;
    }

    /** Causal mask by positions (default off). */
    public Builder optCausal(boolean causal) {
      this.options = options.withCausal(causal);
      return this;
    }

    /** Scale, softcap, causal and window at once. */
    public Builder optAttentionOptions(AttentionOptions opt) {
      this.options = java.util.Objects.requireNonNull(opt, "opt");
      return this;
    }

    /** Rotary position embedding with this base (e.g. 10000); 0 (default) disables it. */
    public Builder optRotary(double base) {
      if (!(base >= 0) || Double.isInfinite(base)) {
        throw new IllegalArgumentException("rotary base must be >= 0 and finite, got " + base);
      }
      this.rotaryBase = base;
      return this;
    }

    /** Bias in the projections (default true, as DJL's block). */
    public Builder optBias(boolean b) {
      this.bias = b;
      return this;
    }

    /** The operator to run attention on (default {@link AttentionOp#cpu()}). */
    public Builder optOperator(AttentionOp o) {
      this.op = java.util.Objects.requireNonNull(o, "op");
      return this;
    }

    /**
     * The block.
     *
     * @throws IllegalArgumentException when the embedding size or head count is unset or below 1, the
     *     embedding size is not a multiple of the head count, the kv head count is negative or does
     *     not divide the head count, or rotary embedding is asked for with an odd head dim
     */
    public MultiHeadAttentionBlock build() {
      if (embeddingSize < 1 || heads < 1) {
        throw new IllegalArgumentException("embedding size and head count must be set (>= 1), got " + embeddingSize
            + " and " + heads);
      }
      if (embeddingSize % heads != 0) {
        throw new IllegalArgumentException("embedding size " + embeddingSize + " is not divisible by head count " + heads);
      }
      if (kvHeads < 0) {
        throw new IllegalArgumentException("kv head count must be >= 1 (or 0: the head count), got " + kvHeads);
      }
      int hkv = kvHeads > 0 ? kvHeads : heads;
      if (heads % hkv != 0) {
        throw new IllegalArgumentException("head count " + heads + " is not a multiple of kv head count " + hkv);
      }
      if (rotaryBase > 0 && (embeddingSize / heads) % 2 != 0) {
        throw new IllegalArgumentException("rotary embedding needs an even head dim, got " + embeddingSize / heads);
      }
      return new MultiHeadAttentionBlock(this);
    }
  }
}
