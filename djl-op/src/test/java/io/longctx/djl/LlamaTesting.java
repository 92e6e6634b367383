package io.longctx.djl;

import java.io.IOException;
import java.nio.file.Path;
import java.util.SplittableRandom;

/** Test support for the Llama tests: small generated checkpoints. */
final class LlamaTesting {

  private LlamaTesting() {}

  /** A tiny model: 2 layers, hidden 64, 4 heads over 2 kv heads (GQA), head dim 16, vocab 300. */
  static ModelGenerator.Spec tiny(long seed) {
    ModelGenerator.Spec s = new ModelGenerator.Spec();
    s.seed = seed;
    s.layers = 2;
    s.hidden = 64;
    s.heads = 4;
    s.kvHeads = 2;
    s.vocab = 300;
    // Larger than 1/sqrt(E): attention far from uniform, so mask and rotary mistakes show clearly.
    s.initStd = 2.0 / Math.sqrt(s.hidden);
    return s;
  }

  static Path generate(ModelGenerator.Spec s, Path dir) throws IOException {
    ModelGenerator.generate(s, dir);
    return dir;
  }

  static int[] randomTokens(SplittableRandom r, int n, int vocab) {
    int[] t = new int[n];
    for (int i = 0; i < n; i++) {
      t[i] = r.nextInt(vocab);
    }
    return t;
  }
}
