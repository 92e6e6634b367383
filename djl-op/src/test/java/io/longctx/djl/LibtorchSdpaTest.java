package io.longctx.djl;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.longctx.kernels.AttentionOptions;
import io.longctx.kernels.ReferenceAttention;
import io.longctx.kernels.Seeds;
import io.longctx.kernels.Tensor;
import java.util.Random;
import java.util.stream.Stream;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.Arguments;
import org.junit.jupiter.params.provider.MethodSource;

/** libtorch's fused CPU attention against the float64 reference, on fresh random inputs. */
class LibtorchSdpaTest {

  private static final double TOL = 1e-4;
  private static LibtorchSdpa sdpa;

  @BeforeAll
  static void open() {
    sdpa = LibtorchSdpa.open();
  }

  @AfterAll
  static void close() {
    if (sdpa != null) {
      sdpa.close();
    }
  }

  static Stream<Arguments> shapes() {
    Stream.Builder<Arguments> s = Stream.builder();
    int[][] bhk = {{1, 4, 4}, {2, 4, 2}, {1, 4, 1}};
    for (int[] b : bhk) {
      for (int t : new int[] {1, 7, 130}) {
        for (int d : new int[] {32, 64}) {
          for (boolean causal : new boolean[] {false, true}) {
            s.add(Arguments.of(b[0], b[1], b[2], t, d, causal));
          }
        }
      }
    }
    return s.build();
  }

  @ParameterizedTest(name = "B={0} H={1} Hkv={2} T={3} D={4} causal={5}")
  @MethodSource("shapes")
  void matchesFloat64Reference(int batch, int heads, int kvHeads, int tokens, int dim, boolean causal) {
    long seed = Seeds.forTest();
    Random rnd = new Random(seed);
    Tensor q = random(rnd, batch, heads, tokens, dim);
    Tensor k = random(rnd, batch, kvHeads, tokens, dim);
    Tensor v = random(rnd, batch, kvHeads, tokens, dim);
    check(q, k, v, causal, seed);
  }

  @Test
  void nonCausalWithMoreKeysThanQueries() {
    long seed = Seeds.forTest();
    Random rnd = new Random(seed);
    Tensor q = random(rnd, 2, 4, 5, 32);
    Tensor k = random(rnd, 2, 2, 77, 32);
    Tensor v = random(rnd, 2, 2, 77, 32);
    check(q, k, v, false, seed);
  }

  private static void check(Tensor q, Tensor k, Tensor v, boolean causal, long seed) {
    LibtorchSdpa.Result got = sdpa.forward(q, k, v, causal);
    ReferenceAttention.Result ref =
        ReferenceAttention.compute(q, k, v, null, null, AttentionOptions.DEFAULT.withCausal(causal));
    int batch = q.batch(), heads = q.heads(), tq = q.tokens(), dim = q.dim();
    assertEquals(batch * heads * tq * dim, got.o().length, "o length");
    assertEquals(batch * heads * tq, got.lse().length, "lse length");
    double maxO = 0, maxLse = 0;
    for (int b = 0; b < batch; b++) {
      for (int h = 0; h < heads; h++) {
        for (int t = 0; t < tq; t++) {
          int refRow = (b * tq + t) * heads + h; // reference: [b*Tq + t][h]
          int gotRow = (b * heads + h) * tq + t; // libtorch: [b][h][t]
          maxLse = Math.max(maxLse, Math.abs(got.lse()[gotRow] - ref.lse()[refRow]));
          for (int d = 0; d < dim; d++) {
            maxO = Math.max(maxO, Math.abs(got.o()[gotRow * dim + d] - ref.o()[refRow * dim + d]));
          }
        }
      }
    }
    String what = "seed " + seed + " (replay: -Dlongctx.seed=" + seed + "), q " + q.shape() + ", k " + k.shape() + ", causal " + causal;
    // NaN fails these comparisons too.
    assertTrue(maxO < TOL, "max |o - ref| = " + maxO + " (" + what + ")");
    assertTrue(maxLse < TOL, "max |lse - ref| = " + maxLse + " (" + what + ")");
  }

  /** Entries uniform in [-2, 2): logits up to a few units, never all zero. */
  private static Tensor random(Random rnd, int batch, int heads, int tokens, int dim) {
    float[] x = new float[batch * heads * tokens * dim];
    for (int i = 0; i < x.length; i++) {
      x[i] = 4f * rnd.nextFloat() - 2f;
    }
    return new Tensor(x, batch, heads, tokens, dim);
  }
}
