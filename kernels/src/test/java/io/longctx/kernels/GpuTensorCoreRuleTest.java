package io.longctx.kernels;

import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.ArrayList;
import java.util.List;
import java.util.SplittableRandom;
import org.junit.jupiter.api.Test;

/**
 * The GPU check's rule for the tensor-core forward ({@link Tolerance#violationRoundedP}), validated
 * on the CPU against {@link TensorCoreModel}: the kernel's arithmetic passes on fresh random inputs
 * (fp16 and bf16, several shapes, masks), the float32 rule would have failed it, and seeded
 * mistakes fail. Small shapes: the whole class runs in seconds.
 */
class GpuTensorCoreRuleTest {

  private static final CudaAttention.DType F16 = CudaAttention.DType.F16, BF16 = CudaAttention.DType.BF16;

  /** [B, H, Hkv, Tq, Tk, D]; Tk spans several 64-key tiles so rescaling and tile order matter. */
  private static final int[][] SHAPES = {{1, 4, 2, 48, 333, 64}, {2, 2, 1, 17, 200, 128}, {1, 2, 2, 64, 129, 64},
      {1, 1, 1, 1, 1, 64}};

  private static final AttentionOptions[] MASKS = {AttentionOptions.DEFAULT,
      AttentionOptions.DEFAULT.withCausal(true), AttentionOptions.DEFAULT.withCausal(true).withWindow(100),
      AttentionOptions.DEFAULT.withSoftcap(30f)};

  private record Case(int[] shape, CudaAttention.DType type, AttentionOptions opt, Tensor q, Tensor k, Tensor v,
      long[] qPos) {
    String describe(long seed) {
      return java.util.Arrays.toString(shape) + " " + type + " " + GpuCheck.maskName(opt) + ", seed " + seed
          + " (replay: -Dlongctx.seed=" + seed + ")";
    }
  }

  private static Case make(SplittableRandom rng, int[] sh, CudaAttention.DType type, AttentionOptions opt) {
    Tensor q = GpuCheck.rounded(Tensor.random(rng, sh[0], sh[1], sh[3], sh[5]), type);
    Tensor k = GpuCheck.rounded(Tensor.random(rng, sh[0], sh[2], sh[4], sh[5]), type);
    Tensor v = GpuCheck.rounded(Tensor.random(rng, sh[0], sh[2], sh[4], sh[5]), type);
    return new Case(sh, type, opt, q, k, v, GpuCheck.lastPositions(sh[3], sh[4]));
  }

  private static float[][] model(Case c, TensorCoreModel.Mistake m) {
    return TensorCoreModel.forward(c.q(), c.k(), c.v(), c.qPos(), null, c.opt(), c.type(), m);
  }

  private static ReferenceAttention.Result ref(Case c) {
    return ReferenceAttention.compute(c.q(), c.k(), c.v(), c.qPos(), null, c.opt());
  }

  private static ReferenceAttention.Result naiveRoundedP(Case c) {
    return ReferenceAttention.computeRoundedP(c.q(), c.k(), c.v(), c.qPos(), null, c.opt(), c.type());
  }

  @Test
  void theKernelsArithmeticPassesOnRandomInputs() {
    long seed = Seeds.forTest();
    SplittableRandom rng = new SplittableRandom(seed);
    double worstRatio = 0;
    for (int[] sh : SHAPES) {
      for (CudaAttention.DType type : new CudaAttention.DType[] {F16, BF16}) {
        for (AttentionOptions opt : MASKS) {
          Case c = make(rng, sh, type, opt);
          float[][] got = model(c, TensorCoreModel.Mistake.NONE);
          ReferenceAttention.Result ref = ref(c), naive = naiveRoundedP(c);
          assertNull(Tolerance.violationRoundedP(got[0], got[1], ref, naive), c.describe(seed));
          Tolerance.Errors kernel = Tolerance.errors(got[0], got[1], ref);
          Tolerance.Errors base = Tolerance.errors(Tolerance.toFloat(naive.o()), Tolerance.toFloat(naive.lse()), ref);
          if (base.o() > 1e-5) { // rows where P rounding dominates (not the one-key shape)
            worstRatio = Math.max(worstRatio, kernel.o() / base.o());
          }
        }
      }
    }
    // The factor's margin: the model's error stays near the naive one, well inside 3x.
    assertTrue(worstRatio < 2, "kernel/naive error ratio " + worstRatio + ", seed " + seed);
  }

  @Test
  void theFloat32RuleWouldFailTheKernel() {
    long seed = Seeds.forTest();
    SplittableRandom rng = new SplittableRandom(seed);
    for (CudaAttention.DType type : new CudaAttention.DType[] {F16, BF16}) {
      Case c = make(rng, SHAPES[0], type, AttentionOptions.DEFAULT.withCausal(true));
      float[][] got = model(c, TensorCoreModel.Mistake.NONE);
      ReferenceAttention.Result naive32 = ReferenceAttention.computeFloat32(c.q(), c.k(), c.v(), c.qPos(), null, c.opt());
      assertNotNull(Tolerance.violation(got[0], got[1], ref(c), naive32), c.describe(seed));
    }
  }

  @Test
  void seededMistakesFail() {
    long seed = Seeds.forTest();
    SplittableRandom rng = new SplittableRandom(seed);
    List<String> passed = new ArrayList<>();
    for (TensorCoreModel.Mistake m : TensorCoreModel.Mistake.values()) {
      if (m == TensorCoreModel.Mistake.NONE) {
        continue;
      }
      // bf16 P for fp16 inputs is the harmful direction; fp16 P for bf16 inputs would only be more exact.
      CudaAttention.DType[] types = m == TensorCoreModel.Mistake.WRONG_P_TYPE
          ? new CudaAttention.DType[] {F16} : new CudaAttention.DType[] {F16, BF16};
      for (CudaAttention.DType type : types) {
        for (AttentionOptions opt : new AttentionOptions[] {MASKS[0], MASKS[1]}) {
          Case c = make(rng, SHAPES[0], type, opt);
          float[][] got = model(c, m);
          if (Tolerance.violationRoundedP(got[0], got[1], ref(c), naiveRoundedP(c)) == null) {
            passed.add(m + " " + c.describe(seed) + ": " + Tolerance.errors(got[0], got[1], ref(c)));
          }
        }
      }
    }
    assertTrue(passed.isEmpty(), "mistakes the rule let through: " + passed);
  }
}
