package io.longctx.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;

import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.Test;

/** Loopback defaults for local masters only; the caller's driver address always wins. */
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
}
