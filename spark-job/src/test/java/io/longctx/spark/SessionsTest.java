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

  @Test
  void aDefaultsFileThatIsNotThereIsAnError(@org.junit.jupiter.api.io.TempDir java.nio.file.Path dir) throws Exception {
    String before = System.getProperty("longctx.conf");
    try {
      java.nio.file.Path file = dir.resolve("spark-defaults.conf");
      java.nio.file.Files.writeString(file, "# a comment\nspark.sql.shuffle.partitions   7\nspark.a.b=c\n");
      System.setProperty("longctx.conf", file.toString());
      Map<String, String> c = Sessions.settings(null, List.of());
      assertEquals("7", c.get("spark.sql.shuffle.partitions"));
      assertEquals("c", c.get("spark.a.b"));
      // A misspelled name once dropped every setting of the file in silence.
      System.setProperty("longctx.conf", dir.resolve("spark-default.conf").toString());
      InputError e = assertThrows(InputError.class, () -> Sessions.settings(null, List.of()));
      assertTrue(e.getMessage().contains("spark-default.conf (LONGCTX_CONF or -Dlongctx.conf) does not exist"),
          e.getMessage());
      System.setProperty("longctx.conf", "/dev/null"); // no defaults file, on purpose
      assertEquals(null, Sessions.settings(null, List.of()).get("spark.sql.shuffle.partitions"));
    } finally {
      if (before == null) {
        System.clearProperty("longctx.conf");
      } else {
        System.setProperty("longctx.conf", before);
      }
    }
  }

  /** The test job below: its second task says it runs, and runs until the test releases it (local[2]: this JVM). */
  static final java.util.concurrent.atomic.AtomicBoolean SECOND_STARTED = new java.util.concurrent.atomic.AtomicBoolean();
  static final java.util.concurrent.atomic.AtomicBoolean RELEASE = new java.util.concurrent.atomic.AtomicBoolean();
  static final java.util.concurrent.atomic.AtomicBoolean SECOND_ENDED = new java.util.concurrent.atomic.AtomicBoolean();

  /**
   * A job fails at its first failed task while the other runs on (Spark's cancel reaches a task only
   * between rows): drainTasks waits until it has ended, and no longer than it is told.
   */
  @Test
  void aFailedJobsOtherTasksEndBeforeTheSessionStops() throws Exception {
    SparkSession spark = TestSpark.get();
    // tasks of other tests' failed jobs may still hold a core of the shared session: let them end first
    assertEquals(0, Sessions.drainTasks(spark, 120_000), "tasks of earlier tests still running");
    SECOND_STARTED.set(false);
    RELEASE.set(false);
    SECOND_ENDED.set(false);
    try {
      // A job just before, as ppl runs one stage after another: its end saved a count of 0, and Spark's store
      // saves the next count at most 100 ms later, so its status tracker still read 0 below.
      spark.range(0, 1, 1, 1).count();
      assertThrows(Exception.class, () -> spark.range(0, 2, 1, 2).foreach((ForeachFunction<Long>) i -> {
        long end = System.nanoTime() + 60_000_000_000L;
        if (i == 0) { // fails once the second task runs, so that the job fails under it
          while (!SECOND_STARTED.get() && System.nanoTime() < end) {
            Thread.onSpinWait();
          }
          throw new IllegalStateException("the first task fails");
        }
        SECOND_STARTED.set(true);
        // busy, as a kernel is: Spark's cancel interrupts the thread, which a sleep would end on
        while (!RELEASE.get() && System.nanoTime() < end) {
          Thread.onSpinWait();
        }
        SECOND_ENDED.set(true);
      }));
      assertTrue(SECOND_STARTED.get(), "the second task ran beside the first");
      // No wait: the second task's start was posted before the first failed, and the count is the bus's (Spark's
      // status tracker read 0 here at times: its store saves a count at most every 100 ms).
      assertEquals(1, Sessions.drainTasks(spark, 300), "the second task is held, so it still runs");
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
