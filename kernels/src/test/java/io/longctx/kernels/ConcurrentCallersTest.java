package io.longctx.kernels;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

import java.util.ArrayList;
import java.util.List;
import java.util.Random;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/**
 * The kernels run on their own pool ({@link CpuAttention#POOL}) whoever calls them: several threads at
 * once (Spark tasks), or a thread of that pool itself. Every way gives the bits of one call at a time,
 * and an error inside the parallel loop reaches the caller as itself.
 */
class ConcurrentCallersTest {

  private static float[] randn(Random r, int n) {
    float[] x = new float[n];
    for (int i = 0; i < n; i++) {
      x[i] = (float) r.nextGaussian();
    }
    return x;
  }

  @Test
  @Timeout(120)
  void concurrentAndNestedCallsGiveTheBitsOfSequentialCalls() throws Exception {
    int h = 4, kvh = 2, tq = 70, tk = 300, d = 32, calls = 6;
    Random r = new Random(7);
    List<float[][]> inputs = new ArrayList<>();
    List<AttentionState> expected = new ArrayList<>();
    AttentionOptions causal = AttentionOptions.DEFAULT.withCausal(true);
    long[] qPos = new long[tq];
    for (int t = 0; t < tq; t++) {
      qPos[t] = tk - tq + t;
    }
    for (int c = 0; c < calls; c++) {
      float[][] x = {randn(r, h * tq * d), randn(r, kvh * tk * d), randn(r, kvh * tk * d)};
      inputs.add(x);
      expected.add(forward(x, h, kvh, tq, tk, d, qPos, causal));
    }
    ExecutorService callers = Executors.newFixedThreadPool(3);
    try {
      List<Future<AttentionState>> got = new ArrayList<>();
      for (int c = 0; c < calls; c++) {
        float[][] x = inputs.get(c);
        got.add(callers.submit(() -> forward(x, h, kvh, tq, tk, d, qPos, causal)));
      }
      for (int c = 0; c < calls; c++) {
        assertArrayEquals(expected.get(c).o(), got.get(c).get().o(), "o of call " + c);
        assertArrayEquals(expected.get(c).lse(), got.get(c).get().lse(), "lse of call " + c);
      }
    } finally {
      callers.shutdownNow();
    }
    // A caller that is itself a thread of the kernels' pool runs the loop there instead of waiting on it.
    AttentionState nested = CpuAttention.POOL.submit(() -> forward(inputs.get(0), h, kvh, tq, tk, d, qPos, causal)).get();
    assertArrayEquals(expected.get(0).o(), nested.o());
    assertArrayEquals(expected.get(0).lse(), nested.lse());
  }

  @Test
  void anErrorInsideTheLoopReachesTheCallerUnwrapped() {
    IllegalStateException e = assertThrows(IllegalStateException.class, () -> CpuAttention.parallelFor(8, i -> {
      if (i == 5) {
        throw new IllegalStateException("task 5 failed");
      }
    }));
    assertEquals("task 5 failed", e.getMessage());
  }

  private static AttentionState forward(float[][] x, int h, int kvh, int tq, int tk, int d, long[] qPos,
      AttentionOptions o) {
    return CpuAttention.DEFAULT.forward(new Tensor(x[0], 1, h, tq, d), new Tensor(x[1], 1, kvh, tk, d),
        new Tensor(x[2], 1, kvh, tk, d), qPos, null, o);
  }
}
