package io.longctx.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.List;
import java.util.Map;
import org.apache.spark.api.java.function.ForeachFunction;
import org.apache.spark.sql.SparkSession;
import org.junit.jupiter.api.Test;

/**
 * Loopback defaults for local masters only; the caller's driver address always wins. A failed
 * command lets its job's other tasks end before the session stops.
 */
class SessionsTest {
  @Test
  void loopbackOnlyWhereEveryJvmIsLocal() {
    for (String local : new String[] {"local", "local[2]", "local[*]", "local[2,3]", "local-cluster[2,1,1024]"}) {
      Map<String, String> c = Sessions.settings(local, List.of());
      assertEquals("127.0.0.1", c.get("spark.driver.host"), local);
      assertEquals("127.0.0.1", c.get("spark.driver.bindAddress"), local);
    }
    Map<String, String> cluster = Sessions.settings("spark://10.0.0.5:7077", List.of("spark.driver.host=10.0.0.9"));
    assertEquals("10.0.0.9", cluster.get("spark.driver.host"));
    assertNull(cluster.get("spark.driver.bindAddress"), "Spark binds to spark.driver.host itself");
    assertFalse(Sessions.settings("yarn", List.of()).containsKey("spark.driver.host"));
    assertEquals("10.1.1.1", Sessions.settings(null, List.of("spark.master=local[1]", "spark.driver.host=10.1.1.1"))
        .get("spark.driver.host"), "an explicit driver host wins over the local default");
  }

  @Test
  void parquetBatchSizeIsADefaultTheCallerCanChange() {
    assertEquals("256", Sessions.settings(null, List.of()).get("spark.sql.parquet.columnarReaderBatchSize"));
    assertEquals("4096", Sessions.settings(null, List.of("spark.sql.parquet.columnarReaderBatchSize=4096"))
        .get("spark.sql.parquet.columnarReaderBatchSize"));
  }

  /** The second task of the test job below runs until the test releases it (tasks run in this JVM: local[2]). */
  static final java.util.concurrent.atomic.AtomicBoolean RELEASE = new java.util.concurrent.atomic.AtomicBoolean();
  static final java.util.concurrent.atomic.AtomicBoolean SECOND_ENDED = new java.util.concurrent.atomic.AtomicBoolean();

  /**
   * A job fails at its first failed task while the other runs on (Spark's cancel reaches a task only
   * between rows): drainTasks waits until it has ended, and no longer than it is told.
   */
  @Test
  void aFailedJobsOtherTasksEndBeforeTheSessionStops() throws Exception {
    SparkSession spark = TestSpark.get();
    RELEASE.set(false);
    SECOND_ENDED.set(false);
    try {
      assertThrows(Exception.class, () -> spark.range(0, 2, 1, 2).foreach((ForeachFunction<Long>) i -> {
        if (i == 0) {
          throw new IllegalStateException("the first task fails");
        }
        // busy, as a kernel is: Spark's cancel interrupts the thread, which a sleep would end on
        for (long end = System.nanoTime() + 60_000_000_000L; !RELEASE.get() && System.nanoTime() < end; ) {
          Thread.onSpinWait();
        }
        SECOND_ENDED.set(true);
      }));
      // both tasks were launched in one offer of local[2]: the second is held, so it still runs
      assertEquals(1, Sessions.drainTasks(spark, 300));
      Thread release = new Thread(() -> {
        try {
          Thread.sleep(300);
        } catch (InterruptedException e) {
          Thread.currentThread().interrupt();
        }
        RELEASE.set(true);
      });
      release.start();
      assertEquals(0, Sessions.drainTasks(spark, 60_000));
      assertTrue(SECOND_ENDED.get(), "drained only once the second task had ended");
      release.join();
    } finally {
      RELEASE.set(true);
    }
  }
}
