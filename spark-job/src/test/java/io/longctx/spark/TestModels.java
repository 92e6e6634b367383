package io.longctx.spark;

import io.longctx.djl.ModelGenerator;

/** The small generated checkpoints of the spark-job tests. */
final class TestModels {
  private TestModels() {}

  /** Hidden 32, 4 heads over 2 kv heads (head dim 8), vocabulary 300: seconds to score on Spark. */
  static ModelGenerator.Spec small(long seed, int layers) {
    ModelGenerator.Spec s = new ModelGenerator.Spec();
    s.seed = seed;
    s.layers = layers;
    s.hidden = 32;
    s.heads = 4;
    s.kvHeads = 2;
    s.vocab = 300;
    return s;
  }
}
