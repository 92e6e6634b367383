package io.longctx.djl;

import ai.djl.MalformedModelException;
import ai.djl.ndarray.NDArray;
import ai.djl.ndarray.NDList;
import ai.djl.ndarray.NDManager;
import ai.djl.ndarray.types.DataType;
import ai.djl.ndarray.types.Shape;
import ai.djl.nn.AbstractBlock;
import ai.djl.nn.Activation;
import ai.djl.nn.Parameter;
import ai.djl.nn.core.Linear;
import ai.djl.nn.norm.LayerNorm;
import ai.djl.training.ParameterStore;
import ai.djl.util.PairList;
import java.io.DataInputStream;
import java.io.IOException;

/**
 * A pre-norm transformer layer on {@link MultiHeadAttentionBlock}:
 * {@code h = x + attn(norm1(x)); y = h + ffnOut(gelu(ffnIn(norm2(h))))}. Input {@code (x [B, T, E])}
 * or {@code (x, mask)}; output {@code (y [B, T, E])}. Positions pass through the forward params to
 * the attention block ({@link MultiHeadAttentionBlock#Q_POSITIONS}). Inference runs attention on the
 * longctx operator; training on differentiable plain ops (see {@link MultiHeadAttentionBlock}).
 */
public final class TransformerLayer extends AbstractBlock {

  private static final byte VERSION = 1;

  private final int embeddingSize;
  private final int hiddenSize;
  private final LayerNorm attentionNorm;
  private final MultiHeadAttentionBlock attention;
  private final LayerNorm ffnNorm;
  private final Linear ffnIn;
  private final Linear ffnOut;

  /**
   * @param attention the attention block (its embedding size is the layer's)
   * @param embeddingSize E
   * @param hiddenSize the feed-forward width (e.g. 4 * E)
   */
  public TransformerLayer(MultiHeadAttentionBlock attention, int embeddingSize, int hiddenSize) {
    super(VERSION);
    if (embeddingSize < 1 || hiddenSize < 1) {
      throw new IllegalArgumentException("embedding and hidden sizes must be >= 1, got " + embeddingSize + ", "
          + hiddenSize);
    }
    if (attention.embeddingSize() != embeddingSize) {
      throw new IllegalArgumentException("the attention block's embedding size is " + attention.embeddingSize()
          + ", the layer's " + embeddingSize + ": they must be equal (the residual adds one to the other)");
    }
    this.embeddingSize = embeddingSize;
    this.hiddenSize = hiddenSize;
    this.attentionNorm = addChildBlock("attentionNorm", LayerNorm.builder().axis(2).build());
    this.attention = addChildBlock("attention", attention);
    this.ffnNorm = addChildBlock("ffnNorm", LayerNorm.builder().axis(2).build());
    this.ffnIn = addChildBlock("ffnIn", Linear.builder().setUnits(hiddenSize).build());
    this.ffnOut = addChildBlock("ffnOut", Linear.builder().setUnits(embeddingSize).build());
  }

  /** A causal layer with rotary embedding: the usual decoder layer. */
  public static TransformerLayer decoder(int embeddingSize, int heads, int kvHeads, int hiddenSize) {
    return new TransformerLayer(MultiHeadAttentionBlock.builder().setEmbeddingSize(embeddingSize).setHeadCount(heads)
        .optKvHeadCount(kvHeads).optCausal(true).optRotary(10000).build(), embeddingSize, hiddenSize);
  }

  public MultiHeadAttentionBlock getAttention() {
    return attention;
  }

  @Override
  public Shape[] getOutputShapes(Shape[] inputShapes) {
    return new Shape[] {inputShapes[0]};
  }

  @Override
  public void initializeChildBlocks(NDManager manager, DataType dataType, Shape... inputShapes) {
    Shape x = inputShapes.length == 0 ? null : inputShapes[0];
    if (x == null || x.dimension() != 3 || x.get(2) != embeddingSize) {
      throw new IllegalArgumentException("TransformerLayer input must be [batch, tokens, " + embeddingSize + "], got "
          + (x == null ? "no shape" : x));
    }
    attentionNorm.initialize(manager, dataType, x);
    attention.initialize(manager, dataType, inputShapes);
    ffnNorm.initialize(manager, dataType, x);
    ffnIn.initialize(manager, dataType, x);
    Shape hidden = ffnIn.getOutputShapes(new Shape[] {x})[0];
    ffnOut.initialize(manager, dataType, hidden);
  }

  /**
   * Loads as DJL does (the attention block checks its own weights), then the feed-forward weights:
   * DJL takes parameters of any shape, and a layer saved with another hidden size failed only in
   * forward, as a matmul error inside libtorch.
   */
  @Override
  public void loadParameters(NDManager manager, DataInputStream is) throws IOException, MalformedModelException {
    super.loadParameters(manager, is);
    Object[][] expected = {{"ffnIn", ffnIn, new Shape(hiddenSize, embeddingSize)},
        {"ffnOut", ffnOut, new Shape(embeddingSize, hiddenSize)}};
    for (Object[] e : expected) {
      Parameter w = ((Linear) e[1]).getParameters().get("weight");
      if (w != null && w.isInitialized() && !w.getArray().getShape().equals(e[2])) {
        throw new MalformedModelException(e[0] + ".weight is " + w.getArray().getShape() + " in the saved parameters;"
            + " this layer (embedding " + embeddingSize + ", hidden " + hiddenSize + ") needs " + e[2]
            + ": build the layer with the sizes it was saved with");
      }
    }
  }

  @Override
  protected NDList forwardInternal(ParameterStore ps, NDList inputs, boolean training,
      PairList<String, Object> params) {
    if (inputs.isEmpty() || inputs.size() > 2) {
      throw new IllegalArgumentException("expected (x) or (x, mask), got " + inputs.size() + " inputs");
    }
    NDArray x = inputs.get(0);
    if (x.getShape().dimension() != 3 || x.getShape().get(2) != embeddingSize) {
      throw new IllegalArgumentException("x must be [B, T, " + embeddingSize + "], got " + x.getShape());
    }
    NDList attnIn = new NDList(attentionNorm.forward(ps, new NDList(x), training, params).head());
    if (inputs.size() > 1) {
      attnIn.add(inputs.get(1));
    }
    NDArray h = x.add(attention.forward(ps, attnIn, training, params).head());
    NDArray f = ffnNorm.forward(ps, new NDList(h), training, params).head();
    f = Activation.gelu(ffnIn.forward(ps, new NDList(f), training, params).head());
    f = ffnOut.forward(ps, new NDList(f), training, params).head();
    return new NDList(h.add(f));
  }
}
