package io.longctx.djl;

import java.io.IOException;
import java.nio.file.Path;
import java.util.SplittableRandom;

/** Test support for the Llama tests: replayable seeds and small generated checkpoints. */
final class LlamaTesting {

  /** System property that replays a failed run: {@code -Dlongctx.seed=N}. */
  static final String SEED_PROPERTY = "longctx.seed";

  private LlamaTesting() {}

  /** A fresh seed, or the one given with -Dlongctx.seed; printed so a failure can be replayed. */
  static long seed(String test) {
    Long fixed = Long.getLong(SEED_PROPERTY);
    long s = fixed != null ? fixed : System.nanoTime() * 0x9E3779B97F4A7C15L;
    System.out.println(test + ": seed " + s + " (replay with -D" + SEED_PROPERTY + "=" + s + ")");
    return s;
  }

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
