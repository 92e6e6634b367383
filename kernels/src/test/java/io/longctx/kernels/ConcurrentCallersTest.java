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

  /**
   * An interrupted caller used to return at once while the bodies under way kept writing into its
   * outputs: the operator then freed its libtorch output under them (a JVM crash, or another call's
   * output overwritten once the memory was reused).
   */
  @Test
  @Timeout(60)
  void anInterruptedCallerReturnsOnlyWhenTheBodiesUnderWayHaveEnded() throws Exception {
    java.util.concurrent.atomic.AtomicInteger active = new java.util.concurrent.atomic.AtomicInteger();
    java.util.concurrent.atomic.AtomicInteger started = new java.util.concurrent.atomic.AtomicInteger();
    java.util.concurrent.CountDownLatch release = new java.util.concurrent.CountDownLatch(1);
    java.util.concurrent.atomic.AtomicReference<String> seen = new java.util.concurrent.atomic.AtomicReference<>();
    int tasks = 4 * CpuAttention.POOL.getParallelism() + 8; // more than the workers blocked below
    Thread caller = new Thread(() -> {
      try {
        CpuAttention.parallelFor(tasks, i -> {
          started.incrementAndGet();
          active.incrementAndGet();
          try {
            release.await(); // pool threads are not interrupted: each body runs to its end
          } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
          } finally {
            active.decrementAndGet();
          }
        });
        seen.set("returned normally");
      } catch (java.util.concurrent.CancellationException e) {
        seen.set("cancelled, active " + active.get() + ", interrupt flag " + Thread.currentThread().isInterrupted());
      }
    });
    caller.start();
    while (active.get() == 0) {
      Thread.sleep(1);
    }
    caller.interrupt();
    try {
      caller.join(300); // it must still be waiting for the bodies it started
      assertEquals(true, caller.isAlive(), "the caller returned while bodies were running: " + seen.get());
    } finally {
      release.countDown();
    }
    caller.join();
    assertEquals("cancelled, active 0, interrupt flag true", seen.get());
    int after = started.get();
    Thread.sleep(100);
    assertEquals(after, started.get(), "a body started after the caller returned");
    assertEquals(true, after < tasks, "every body ran: the interrupt did not stop the rest (" + after + ")");
  }

  /**
   * The pool's threads live as long as the JVM: they must not keep a call's arrays reachable (their
   * key tile pointed at the last K and V they read, which kept the operator's staged copies, hundreds
   * of MiB held only softly, from ever being collected).
   */
  @Test
  @Timeout(120)
  void thePoolThreadsKeepNoReferenceToACallsArrays() throws Exception {
    int h = 4, kvh = 2, tk = 700, d = 32;
    Random r = new Random(11);
    for (String call : new String[] {"forward", "decode, 1 row", "decode, 16 rows"}) {
      int tq = call.equals("forward") ? 200 : call.equals("decode, 1 row") ? 1 : 16;
      float[] k = randn(r, kvh * tk * d), v = randn(r, kvh * tk * d), q = randn(r, h * tq * d);
      java.lang.ref.WeakReference<float[]> kRef = new java.lang.ref.WeakReference<>(k);
      java.lang.ref.WeakReference<float[]> vRef = new java.lang.ref.WeakReference<>(v);
      Tensor qt = new Tensor(q, 1, h, tq, d), kt = new Tensor(k, 1, kvh, tk, d), vt = new Tensor(v, 1, kvh, tk, d);
      if (call.equals("forward")) {
        CpuAttention.DEFAULT.forward(qt, kt, vt, null, null, AttentionOptions.DEFAULT);
      } else {
        CpuAttention.DEFAULT.decode(qt, kt, vt, null, null, AttentionOptions.DEFAULT, 256);
      }
      k = v = null;
      kt = vt = null;
      for (int i = 0; i < 20 && (kRef.get() != null || vRef.get() != null); i++) {
        System.gc();
        Thread.sleep(10);
      }
      assertEquals(true, kRef.get() == null, call + ": k still reachable after the call");
      assertEquals(true, vRef.get() == null, call + ": v still reachable after the call");
    }
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
