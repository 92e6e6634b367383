package io.longctx.spark;

import org.apache.spark.sql.SparkSession;

/** One local[2] session for every test class in the surefire JVM (never stopped: the JVM ends). */
final class TestSpark {
  private static SparkSession spark;

  static synchronized SparkSession get() {
    if (spark == null) {
      spark = SparkSession.builder().master("local[2]").appName("longctx-tests")
          .config("spark.driver.host", "127.0.0.1")
          .config("spark.driver.bindAddress", "127.0.0.1")
          .config("spark.ui.enabled", "false")
          .config("spark.ui.showConsoleProgress", "false")
          .config("spark.sql.shuffle.partitions", "4")
          .getOrCreate();
      Sessions.countTasks(spark.sparkContext()); // as a command's session does
    }
    return spark;
  }

  private TestSpark() {}
}
