package io.longctx.kernels;

import static org.junit.jupiter.api.Assertions.assertNull;

import java.util.SplittableRandom;
import org.junit.jupiter.api.Test;

class SmokeTest {
  @Test
  void forwardMatchesReference() {
    long seed = Accuracy.seed();
    SplittableRandom rng = new SplittableRandom(seed);
    for (boolean causal : new boolean[] {false, true}) {
      Tensor q = Accuracy.random(rng, 2, 4, 77, 64, 1);
      Tensor k = Accuracy.random(rng, 2, 2, 77, 64, 1);
      Tensor v = Accuracy.random(rng, 2, 2, 77, 64, 1);
      AttentionOptions opt = AttentionOptions.DEFAULT.withCausal(causal);
      AttentionState st = CpuAttention.DEFAULT.forward(q, k, v, null, null, opt);
      String err = Accuracy.check(st, ReferenceAttention.compute(q, k, v, null, null, opt),
          ReferenceAttention.computeFloat32(q, k, v, null, null, opt));
      System.out.println("causal=" + causal + " " + Accuracy.errors(st.o(), st.lse(), ReferenceAttention.compute(q, k, v, null, null, opt)));
      assertNull(err, "seed " + seed + ": " + err);
      AttentionState dec = CpuAttention.DEFAULT.decode(q, k, v, null, null, opt, 10).state();
      err = Accuracy.check(dec, ReferenceAttention.compute(q, k, v, null, null, opt),
          ReferenceAttention.computeFloat32(q, k, v, null, null, opt));
      assertNull(err, "decode seed " + seed + ": " + err);
    }
  }
}
