package io.longctx.kernels;

import java.util.SplittableRandom;

/** Test support: fresh seeds, random inputs, and the docs/CONVENTIONS.md rule of {@link Tolerance}. */
final class Accuracy {

  private Accuracy() {}

  /** Fresh seed for a test run (print it in failures); {@code -Dlongctx.seed=S} replays one. */
  static long seed() {
    Long fixed = Long.getLong("longctx.seed"); // null when unset or empty
    long seed = fixed != null ? fixed : System.nanoTime() ^ Thread.currentThread().getId() * 0x9E3779B97F4A7C15L;
    // printed here, so that a failure whose message leaves the seed out can still be replayed
    StackWalker.StackFrame caller = StackWalker.getInstance().walk(f -> f.skip(1).findFirst()).orElseThrow();
    System.out.println(caller.getClassName().substring(caller.getClassName().lastIndexOf('.') + 1) + "."
        + caller.getMethodName() + ": seed " + seed + " (replay with -Dlongctx.seed=" + seed + ")");
    return seed;
  }

  static Tensor random(SplittableRandom rng, int b, int h, int t, int d, double amplitude) {
    float[] x = new float[b * h * t * d];
    for (int i = 0; i < x.length; i++) {
      x[i] = (float) (rng.nextGaussian() * amplitude);
    }
    return new Tensor(x, b, h, t, d);
  }

  static double maxAbs(double[] x) {
    return Tolerance.maxAbs(x);
  }

  /** Null when the state meets the tolerance against the reference, else a message. */
  static String check(AttentionState got, ReferenceAttention.Result ref, ReferenceAttention.Result naive32) {
    return Tolerance.violation(got, ref, naive32);
  }
}
