package io.longctx.spark;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.longctx.kernels.Seeds;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import org.apache.spark.sql.SparkSession;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.api.io.TempDir;

/**
 * The job on real separate executor JVMs: a driver process (LongctxMain score) on
 * local-cluster[2,1,1024] with a SPARK_HOME this test builds (an empty jars/ and
 * launcher/target/scala-2.13; the classpath reaches executors through spark.executor.extraClassPath).
 * The output must be bit-identical to the in-process local[2] run. Every process is killed on a
 * timeout (a misconfigured local-cluster driver can hang rather than fail).
 */
class LocalClusterTest {
  @TempDir
  Path tmp;

  @Test
  @Timeout(value = 240, unit = TimeUnit.SECONDS)
  void separateExecutorJvmsGiveTheSameBits() throws Exception {
    SparkSession spark = TestSpark.get();
    long seed = Seeds.forTest();
    TestData data = new TestData(seed, 4, 2, 16).doc("x", 300, 0, 1).doc("y", 130, 50, 2).randomQueries(3);
    Path keys = data.writeKeys(spark, tmp, "parquet", false);
    Path queries = data.writeQueries(spark, tmp, "parquet");

    ScoreOptions o = new ScoreOptions();
    o.keys = keys.toString();
    o.queries = queries.toString();
    o.output = tmp.resolve("local").toString();
    o.dim = 16;
    o.causal = true;
    o.chunkLen = 50;
    ScoreJob.run(spark, o);
    Map<String, Outputs.Result> local = Outputs.read(spark, Path.of(o.output), "parquet", false);

    Path home = tmp.resolve("spark-home");
    Files.createDirectories(home.resolve("jars"));
    Files.createDirectories(home.resolve("launcher/target/scala-2.13"));
    String cp = System.getProperty("java.class.path");
    String java = Path.of(System.getProperty("java.home"), "bin", "java").toString();
    // C1 only in the child JVMs: tiny data, and 3 JVMs compiling with C2 on 2 cores doubled the run time.
    String flags = String.join(" ", ManagementFlags.jvmFlags()) + " -XX:TieredStopAtLevel=1";
    Path out = tmp.resolve("cluster");
    List<String> cmd = new ArrayList<>(List.of(java));
    cmd.addAll(ManagementFlags.jvmFlags());
    cmd.addAll(List.of("-XX:TieredStopAtLevel=1", "-Xmx1g", "-cp", cp, LongctxMain.class.getName(), "score",
        "--master", "local-cluster[2,1,1024]",
        "--conf", "spark.executor.extraClassPath=" + cp,
        "--conf", "spark.executor.extraJavaOptions=" + flags,
        "--conf", "spark.ui.enabled=false",
        "--conf", "spark.sql.shuffle.partitions=5",
        "--keys", keys.toString(), "--queries", queries.toString(), "--output", out.toString(),
        "--dim", "16", "--causal", "--chunk-len", "50"));
    ProcessBuilder pb = new ProcessBuilder(cmd).redirectErrorStream(true).redirectOutput(tmp.resolve("driver.log").toFile());
    pb.environment().put("SPARK_HOME", home.toString());
    pb.environment().put("SPARK_SCALA_VERSION", "2.13");
    pb.environment().put("SPARK_LOCAL_IP", "127.0.0.1");
    Process p = pb.start();
    boolean done;
    try {
      done = p.waitFor(180, TimeUnit.SECONDS);
    } finally {
      p.descendants().forEach(ProcessHandle::destroyForcibly);
      p.destroyForcibly();
    }
    String log = Files.readString(tmp.resolve("driver.log"));
    assertTrue(done, "driver did not finish in 180 s; log:\n" + tail(log));
    assertEquals(0, p.exitValue(), "driver failed; log:\n" + tail(log));
    assertTrue(log.contains("chunk pairs"), tail(log));

    Map<String, Outputs.Result> cluster = Outputs.read(spark, out, "parquet", false);
    assertEquals(local.keySet(), cluster.keySet());
    for (String q : local.keySet()) {
      assertArrayEquals(EndToEndTest.bits(local.get(q).o()), EndToEndTest.bits(cluster.get(q).o()), q + " (seed " + seed + ")");
      assertArrayEquals(EndToEndTest.bits(local.get(q).lse()), EndToEndTest.bits(cluster.get(q).lse()), q);
      assertEquals(local.get(q).nKeys(), cluster.get(q).nKeys(), q);
    }
  }

  static String tail(String s) {
    return s.length() <= 6000 ? s : s.substring(s.length() - 6000);
  }

  /** The JVM flags this test JVM runs with that executors need too (module opens, Vector API). */
  static final class ManagementFlags {
    static List<String> jvmFlags() {
      List<String> f = new ArrayList<>();
      for (String a : java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments()) {
        if (a.startsWith("--add-opens") || a.startsWith("--add-modules") || a.startsWith("-XX:+IgnoreUnrecognized")
            || a.startsWith("-Dio.netty")) {
          f.add(a);
        }
      }
      return f;
    }
  }

}
