package io.longctx.djl;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import ai.djl.Device;
import ai.djl.Model;
import ai.djl.inference.Predictor;
import ai.djl.ndarray.NDArray;
import ai.djl.ndarray.NDList;
import ai.djl.ndarray.NDManager;
import ai.djl.ndarray.types.DataType;
import ai.djl.ndarray.types.Shape;
import ai.djl.nn.Block;
import ai.djl.nn.Parameter;
import ai.djl.nn.transformer.ScaledDotProductAttentionBlock;
import ai.djl.repository.zoo.Criteria;
import ai.djl.repository.zoo.ZooModel;
import ai.djl.training.DefaultTrainingConfig;
import ai.djl.training.GradientCollector;
import ai.djl.training.ParameterStore;
import ai.djl.training.Trainer;
import ai.djl.training.loss.Loss;
import ai.djl.util.Pair;
import ai.djl.util.PairList;
import io.longctx.kernels.AttentionOptions;
import io.longctx.kernels.Seeds;
import io.longctx.kernels.Tensor;
import java.nio.FloatBuffer;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.SplittableRandom;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** The Block against DJL's ScaledDotProductAttentionBlock with the same weights; save and load; bad inputs. */
class MultiHeadAttentionBlockTest {

  private static final double TOL = 1e-5; // relative L2, float32 both sides
  private static NDManager manager;

  @BeforeAll
  static void open() {
    LibtorchSdpa.open().close();
    manager = NDManager.newBaseManager(Device.cpu(), "PyTorch");
  }

  @AfterAll
  static void close() {
    if (manager != null) {
      manager.close();
    }
  }

  private static NDArray randn(NDManager m, SplittableRandom rng, long... shape) {
    Shape s = new Shape(shape);
    float[] x = new float[(int) s.size()];
    for (int i = 0; i < x.length; i++) {
      x[i] = (float) rng.nextGaussian();
    }
    return m.create(x, s);
  }

  /** Copies every parameter of {@code from} into {@code to}, by position (same names and order). */
  private static void copyWeights(Block from, Block to) {
    PairList<String, Parameter> a = from.getParameters(), b = to.getParameters();
    assertEquals(a.keys(), b.keys(), "parameter names");
    for (int i = 0; i < a.size(); i++) {
      NDArray src = a.get(i).getValue().getArray();
      b.get(i).getValue().getArray().set(FloatBuffer.wrap(src.toFloatArray()));
    }
  }

  private static double relErr(NDArray got, NDArray want) {
    float[] g = got.toFloatArray(), w = want.toFloatArray();
    assertEquals(w.length, g.length);
    double num = 0, den = 0;
    for (int i = 0; i < g.length; i++) {
      num += (g[i] - w[i]) * (double) (g[i] - w[i]);
      den += w[i] * (double) w[i];
    }
    double e = Math.sqrt(num / den);
    return Double.isNaN(e) ? Double.POSITIVE_INFINITY : e;
  }

  @Test
  void matchesDjlScaledDotProductAttentionBlockWithTheSameWeights() {
    long seed = Seeds.forTest();
    SplittableRandom rng = new SplittableRandom(seed);
    int e = 64, heads = 4;
    try (NDManager m = manager.newSubManager()) {
      ScaledDotProductAttentionBlock djl = ScaledDotProductAttentionBlock.builder().setEmbeddingSize(e)
          .setHeadCount(heads).optAttentionProbsDropoutProb(0f).build();
      MultiHeadAttentionBlock ours = MultiHeadAttentionBlock.builder().setEmbeddingSize(e).setHeadCount(heads).build();
      ai.djl.engine.Engine.getInstance().setRandomSeed((int) seed); // the initial weights replay with the seed too
      djl.initialize(m, DataType.FLOAT32, new Shape(2, 100, e));
      ours.initialize(m, DataType.FLOAT32, new Shape(2, 100, e));
      copyWeights(djl, ours);
      ParameterStore ps = new ParameterStore(m, false);
      // Self-attention, long enough for the libtorch path (T >= 64) and short (Java path).
      for (int t : new int[] {100, 9}) {
        NDArray x = randn(m, rng, 2, t, e);
        NDArray want = djl.forward(ps, new NDList(x), false).head();
        NDArray got = ours.forward(ps, new NDList(x), false).head();
        assertEquals(want.getShape(), got.getShape());
        double err = relErr(got, want);
        assertTrue(err < TOL, "self-attention T=" + t + ": rel err " + err + ", seed " + seed);
      }
      // Separate key, query, value (DJL's order: key, query, value), Tq != Tk.
      NDArray key = randn(m, rng, 2, 150, e), query = randn(m, rng, 2, 70, e), value = randn(m, rng, 2, 150, e);
      NDList in = new NDList(key, query, value);
      double err = relErr(ours.forward(ps, in, false).head(), djl.forward(ps, in, false).head());
      assertTrue(err < TOL, "cross-attention: rel err " + err + ", seed " + seed);
      // With DJL's 0/1 mask [B, Tq, Tk]: both on plain ops.
      NDArray x = randn(m, rng, 2, 30, e);
      float[] mask = new float[2 * 30 * 30];
      for (int i = 0; i < mask.length; i++) {
        mask[i] = rng.nextDouble() < 0.7 || i % 30 == 0 ? 1f : 0f;
      }
      NDArray ma = m.create(mask, new Shape(2, 30, 30));
      err = relErr(ours.forward(ps, new NDList(x, ma), false).head(), djl.forward(ps, new NDList(x, ma), false).head());
      assertTrue(err < TOL, "masked: rel err " + err + ", seed " + seed);
    }
  }

  @Test
  void loadsParametersSavedFromDjlsBlock(@TempDir Path dir) throws Exception {
    long seed = Seeds.forTest();
    SplittableRandom rng = new SplittableRandom(seed);
    int e = 32;
    try (NDManager m = manager.newSubManager(); Model model = Model.newInstance("sdpa", Device.cpu(), "PyTorch")) {
      ScaledDotProductAttentionBlock djl = ScaledDotProductAttentionBlock.builder().setEmbeddingSize(e)
          .setHeadCount(2).optAttentionProbsDropoutProb(0f).build();
      model.setBlock(djl);
      djl.initialize(model.getNDManager(), DataType.FLOAT32, new Shape(1, 80, e));
      model.save(dir, "sdpa");
      NDArray x = randn(m, rng, 1, 80, e);
      NDArray want = djl.forward(new ParameterStore(m, false), new NDList(x), false).head();
      Criteria<NDList, NDList> criteria = Criteria.builder().setTypes(NDList.class, NDList.class).optModelPath(dir)
          .optModelName("sdpa").optEngine("PyTorch")
          .optBlock(MultiHeadAttentionBlock.builder().setEmbeddingSize(e).setHeadCount(2).build()).build();
      try (ZooModel<NDList, NDList> ours = criteria.loadModel(); Predictor<NDList, NDList> p = ours.newPredictor()) {
        NDArray got = p.predict(new NDList(x)).head();
        double err = relErr(got, want);
        assertTrue(err < TOL, "rel err " + err + ", seed " + seed);
      }
    }
  }

  @Test
  void operatorPathMatchesPlainPathWithGqaCausalRotaryAndPositions() {
    long seed = Seeds.forTest();
    SplittableRandom rng = new SplittableRandom(seed);
    int e = 128;
    for (int t : new int[] {96, 13}) {
      try (NDManager m = manager.newSubManager()) {
        MultiHeadAttentionBlock b = MultiHeadAttentionBlock.builder().setEmbeddingSize(e).setHeadCount(8)
            .optKvHeadCount(2).optCausal(true).optRotary(10000).build();
        b.initialize(m, DataType.FLOAT32, new Shape(2, t, e));
        ParameterStore ps = new ParameterStore(m, false);
        NDArray x = randn(m, rng, 2, t, e);
        long[] pos = new long[t];
        for (int i = 0; i < t; i++) {
          pos[i] = 5000 + 3L * i; // gaps and an offset: masks and angles come from positions
        }
        for (long[] p : new long[][] {null, pos}) {
          PairList<String, Object> params = new PairList<>();
          if (p != null) {
            params.add(MultiHeadAttentionBlock.Q_POSITIONS, p);
          }
          NDArray op = b.forward(ps, new NDList(x), false, params).head();
          NDArray plain = b.forward(ps, new NDList(x), true, params).head();
          double err = relErr(op, plain);
          assertTrue(err < TOL, "T=" + t + " positions " + (p != null) + ": rel err " + err + ", seed " + seed);
        }
      }
    }
  }

  @Test
  void plainAttentionMatchesReference() {
    long seed = Seeds.forTest();
    SplittableRandom rng = new SplittableRandom(seed);
    Tensor q = Tensor.random(rng, 1, 4, 33, 32, 1.5), k = Tensor.random(rng, 1, 2, 33, 32, 1.5);
    Tensor v = Tensor.random(rng, 1, 2, 33, 32);
    AttentionOptions opt = AttentionOptions.DEFAULT.withCausal(true).withWindow(9).withSoftcap(4f);
    try (NDManager m = manager.newSubManager()) {
      NDList r = PlainAttention.forward(OpChecks.nd(m, q, AttentionOp.Layout.BHTD),
          OpChecks.nd(m, k, AttentionOp.Layout.BHTD), OpChecks.nd(m, v, AttentionOp.Layout.BHTD), null, null, opt, null);
      float[][] st = OpChecks.stateOrder(r.get(0), r.get(1), AttentionOp.Layout.BHTD);
      String err = OpChecks.check(st[0], st[1], q, k, v, null, null, opt);
      assertNull(err, "seed " + seed + ": " + err);
    }
  }

  @Test
  void transformerLayerTrainsSavesAndLoads(@TempDir Path dir) throws Exception {
    long seed = Seeds.forTest();
    SplittableRandom rng = new SplittableRandom(seed);
    int e = 64, t = 80;
    try (NDManager m = manager.newSubManager(); Model model = Model.newInstance("layer", Device.cpu(), "PyTorch")) {
      TransformerLayer layer = TransformerLayer.decoder(e, 4, 2, 128);
      model.setBlock(layer);
      NDArray x = randn(m, rng, 2, t, e);
      // Gradients flow on the training path (plain ops).
      try (Trainer trainer = model.newTrainer(new DefaultTrainingConfig(Loss.l2Loss()))) {
        trainer.initialize(new Shape(2, t, e));
        try (GradientCollector gc = trainer.newGradientCollector()) {
          NDArray y = trainer.forward(new NDList(x)).head();
          gc.backward(y.square().sum());
        }
        NDArray g = layer.getAttention().getQueryProjection().getParameters().get("weight").getArray().getGradient();
        float[] gv = g.toFloatArray();
        double norm = 0;
        for (float f : gv) {
          assertTrue(Float.isFinite(f), "gradient not finite, seed " + seed);
          norm += f * (double) f;
        }
        assertTrue(norm > 0, "query projection gradient is zero, seed " + seed);
      }
      ParameterStore ps = new ParameterStore(m, false);
      NDArray before = layer.forward(ps, new NDList(x), false).head();
      NDArray plain = layer.forward(ps, new NDList(x), true).head();
      assertTrue(relErr(before, plain) < TOL, "inference path vs training path, seed " + seed);
      model.save(dir, "layer");
      assertTrue(Files.exists(dir.resolve("layer-0000.params")), "params file");
      Criteria<NDList, NDList> criteria = Criteria.builder().setTypes(NDList.class, NDList.class).optModelPath(dir)
          .optModelName("layer").optEngine("PyTorch").optBlock(TransformerLayer.decoder(e, 4, 2, 128)).build();
      try (ZooModel<NDList, NDList> loaded = criteria.loadModel(); Predictor<NDList, NDList> p = loaded.newPredictor()) {
        NDArray after = p.predict(new NDList(x)).head();
        float[] a = before.toFloatArray(), b = after.toFloatArray();
        assertEquals(a.length, b.length);
        for (int i = 0; i < a.length; i++) {
          assertEquals(a[i], b[i], 1e-6f * (1 + Math.abs(a[i])), "output " + i + " after load, seed " + seed);
        }
      }
      // Into a layer of other kv heads: refused at load, naming the parameter (was a reshape error in forward).
      Criteria<NDList, NDList> other = Criteria.builder().setTypes(NDList.class, NDList.class).optModelPath(dir)
          .optModelName("layer").optEngine("PyTorch").optBlock(TransformerLayer.decoder(e, 4, 4, 128)).build();
      Exception bad = assertThrows(Exception.class, () -> other.loadModel().close());
      String chain = "";
      for (Throwable c = bad; c != null; c = c.getCause()) {
        chain += c + "\n";
      }
      assertTrue(chain.contains("keyProjection.weight is (32, 64) in the saved parameters; this block (embedding 64, 4 "
          + "heads, 4 kv heads) needs (64, 64)"), chain);
      // Into a layer of another feed-forward width: refused at load too (was a matmul error in forward).
      Criteria<NDList, NDList> wider = Criteria.builder().setTypes(NDList.class, NDList.class).optModelPath(dir)
          .optModelName("layer").optEngine("PyTorch").optBlock(TransformerLayer.decoder(e, 4, 2, 96)).build();
      bad = assertThrows(Exception.class, () -> wider.loadModel().close());
      chain = "";
      for (Throwable c = bad; c != null; c = c.getCause()) {
        chain += c + "\n";
      }
      assertTrue(chain.contains("ffnIn.weight is (128, 64) in the saved parameters; this layer (embedding 64, hidden "
          + "96) needs (96, 64)"), chain);
    }
  }

  @Test
  void badInputsAndConfigurationsAreRejected() {
    // Bad builder arguments are IllegalArgumentExceptions, as every other bad input (they were IllegalStateExceptions).
    String[] messages = {
        assertThrows(IllegalArgumentException.class, () -> MultiHeadAttentionBlock.builder().setEmbeddingSize(32)
            .build()).getMessage(), // no head count
        assertThrows(IllegalArgumentException.class, () -> MultiHeadAttentionBlock.builder().setEmbeddingSize(30)
            .setHeadCount(4).build()).getMessage(),
        assertThrows(IllegalArgumentException.class, () -> MultiHeadAttentionBlock.builder().setEmbeddingSize(32)
            .setHeadCount(4).optKvHeadCount(3).build()).getMessage(),
        assertThrows(IllegalArgumentException.class, () -> MultiHeadAttentionBlock.builder().setEmbeddingSize(32)
            .setHeadCount(4).optKvHeadCount(-3).build()).getMessage(), // was taken as the head count
        assertThrows(IllegalArgumentException.class, () -> MultiHeadAttentionBlock.builder().setEmbeddingSize(12)
            .setHeadCount(4).optRotary(10000).build()).getMessage()};
    String[] expected = {"embedding size and head count must be set (>= 1), got 32 and 0",
        "embedding size 30 is not divisible by head count 4", "head count 4 is not a multiple of kv head count 3",
        "kv head count must be >= 1 (or 0: the head count), got -3", "rotary embedding needs an even head dim, got 3"};
    assertEquals(java.util.List.of(expected), java.util.List.of(messages));
    assertThrows(IllegalArgumentException.class, () -> TransformerLayer.decoder(32, 4, 3, 64)); // through the builder
    try (NDManager m = manager.newSubManager()) {
      MultiHeadAttentionBlock b = MultiHeadAttentionBlock.builder().setEmbeddingSize(32).setHeadCount(4).build();
      b.initialize(m, DataType.FLOAT32, new Shape(1, 8, 32));
      ParameterStore ps = new ParameterStore(m, false);
      IllegalArgumentException ex = assertThrows(IllegalArgumentException.class,
          () -> b.forward(ps, new NDList(m.zeros(new Shape(1, 8, 16))), false));
      assertTrue(ex.getMessage().contains("[B, T, 32]"), ex.getMessage());
      PairList<String, Object> params = new PairList<>();
      params.add(new Pair<>(MultiHeadAttentionBlock.Q_POSITIONS, new long[3]));
      ex = assertThrows(IllegalArgumentException.class,
          () -> b.forward(ps, new NDList(m.zeros(new Shape(1, 8, 32))), false, params));
      assertTrue(ex.getMessage().contains("positions"), ex.getMessage());
      // A mask of the wrong shape is named as the mask, not as a libtorch reshape.
      ex = assertThrows(IllegalArgumentException.class,
          () -> b.forward(ps, new NDList(m.zeros(new Shape(2, 8, 32)), m.ones(new Shape(8, 8))), false));
      assertTrue(ex.getMessage().contains("mask must be [B, Tq, Tk] = [2, 8, 8]") && ex.getMessage().contains("(8, 8)"),
          ex.getMessage());
      // A layer: its attention of another size, and an input shape that is not [B, T, E], named.
      ex = assertThrows(IllegalArgumentException.class, () -> new TransformerLayer(b, 48, 64));
      assertTrue(ex.getMessage().contains("embedding size is 32, the layer's 48"), ex.getMessage());
      TransformerLayer layer = TransformerLayer.decoder(32, 4, 2, 64);
      ex = assertThrows(IllegalArgumentException.class, () -> layer.initialize(m, DataType.FLOAT32, new Shape(8, 32)));
      assertTrue(ex.getMessage().contains("must be [batch, tokens, 32], got (8, 32)"), ex.getMessage());
    }
  }

  /**
   * Cases a review found answered wrong or failing inside libtorch (2026-11-27): self-attention
   * written (x, x, x) with query positions only gave its keys positions 0..T-1; float16 blocks
   * fed float32 into their projections (the operator's output, the rotary tables); no keys at all
   * failed in the plain path's max.
   */
  @Test
  void selfAttentionPositionsFloat16AndEmptyInputs() {
    SplittableRandom rng = new SplittableRandom(7);
    try (NDManager m = manager.newSubManager()) {
      MultiHeadAttentionBlock b = MultiHeadAttentionBlock.builder().setEmbeddingSize(32).setHeadCount(4)
          .optCausal(true).optRotary(10000).build();
      b.initialize(m, DataType.FLOAT32, new Shape(1, 8, 32));
      ParameterStore ps = new ParameterStore(m, false);
      NDArray x = randn(m, rng, 1, 8, 32);
      long[] pos = {100, 101, 102, 103, 104, 105, 106, 107};
      PairList<String, Object> qOnly = new PairList<>();
      qOnly.add(new Pair<>(MultiHeadAttentionBlock.Q_POSITIONS, pos));
      for (boolean training : new boolean[] {false, true}) {
        NDArray self = b.forward(ps, new NDList(x), training, qOnly).head();
        NDArray kqv = b.forward(ps, new NDList(x, x, x), training, qOnly).head();
        assertTrue(relErr(kqv, self) < 1e-6, "training " + training + ": " + relErr(kqv, self));
      }
      // float16 end to end, with rotary: the output keeps the block's type.
      MultiHeadAttentionBlock h = MultiHeadAttentionBlock.builder().setEmbeddingSize(32).setHeadCount(4)
          .optCausal(true).optRotary(10000).build();
      h.initialize(m, DataType.FLOAT16, new Shape(1, 8, 32));
      NDArray xh = x.toType(DataType.FLOAT16, false);
      for (boolean training : new boolean[] {false, true}) {
        NDArray y = h.forward(new ParameterStore(m, false), new NDList(xh), training).head();
        assertEquals(DataType.FLOAT16, y.getDataType(), "training " + training);
        assertEquals(new Shape(1, 8, 32), y.getShape());
      }
      // No tokens: both paths give an empty output.
      for (boolean training : new boolean[] {false, true}) {
        NDArray y = b.forward(ps, new NDList(m.zeros(new Shape(2, 0, 32))), training).head();
        assertEquals(new Shape(2, 0, 32), y.getShape(), "training " + training);
      }
      NDList st = PlainAttention.forward(randn(m, rng, 1, 2, 3, 8), m.zeros(new Shape(1, 2, 0, 8)),
          m.zeros(new Shape(1, 2, 0, 8)), null, null, AttentionOptions.DEFAULT, null);
      assertEquals(new Shape(1, 2, 3, 8), st.get(0).getShape());
      assertEquals(0f, st.get(0).abs().max().getFloat());
      assertEquals(Float.NEGATIVE_INFINITY, st.get(1).max().getFloat());
    }
  }
}
