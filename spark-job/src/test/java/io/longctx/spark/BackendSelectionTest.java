package io.longctx.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assumptions.assumeFalse;

import io.longctx.kernels.CudaProbe;
import java.io.ByteArrayOutputStream;
import java.io.PrintStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Map;
import org.apache.spark.sql.SparkSession;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** The job takes its backend from the one selector; one backend per job, named in the summary. */
class BackendSelectionTest {
  @TempDir
  Path tmp;

  final SparkSession spark = TestSpark.get();

  ScoreOptions options(Path keys, Path queries, String out, String backend) {
    ScoreOptions o = new ScoreOptions();
    o.keys = keys.toString();
    o.queries = queries.toString();
    o.output = tmp.resolve(out).toString();
    o.dim = 8;
    o.causal = true;
    o.chunkLen = 16;
    o.backend = backend;
    return o;
  }

  @Test
  void theTasksRunOnTheSelectedBackendAndTheSummarySaysSo() throws Exception {
    TestData d = new TestData(3, 4, 2, 8).doc("a", 70, 0, 1).doc("b", 30, 5, 2).randomQueries(3);
    Path keys = d.writeKeys(spark, tmp, "parquet", false);
    Path queries = d.writeQueries(spark, tmp, "parquet");
    ScoreJob.Summary cpu = ScoreJob.run(spark, options(keys, queries, "cpu", "cpu"));
    assertEquals("cpu (tasks ran on cpu)", cpu.backend());
    long before = CountingBackend.FORWARD_CALLS.get();
    ScoreJob.Summary counting = ScoreJob.run(spark, options(keys, queries, "counting", "counting"));
    assertEquals("counting (tasks ran on counting)", counting.backend());
    assertEquals(counting.pairsComputed(), CountingBackend.FORWARD_CALLS.get() - before,
        "every computed (block, chunk) pair ran on the selected backend");
    // The property is the default choice; auto without GPU task resources is the CPU kernels.
    System.setProperty("longctx.backend", "counting");
    try {
      assertEquals("counting (tasks ran on counting)", ScoreJob.run(spark, options(keys, queries, "prop", null))
          .backend());
    } finally {
      System.clearProperty("longctx.backend");
    }
    assertEquals("cpu (tasks ran on cpu)", ScoreJob.run(spark, options(keys, queries, "auto", "auto")).backend());
    Map<String, Outputs.Result> a = Outputs.read(spark, tmp.resolve("cpu"), "parquet", false);
    Map<String, Outputs.Result> b = Outputs.read(spark, tmp.resolve("counting"), "parquet", false);
    EndToEndTest.assertSameBits(a, b, " (cpu vs counting backend)");
  }

  /**
   * An unknown backend is bad input; so is one this machine cannot run under a local master (every
   * executor is here). On a cluster the driver cannot tell: a task that cannot open it fails the job
   * with the reason (the executor side, without a session here).
   */
  @Test
  void anUnknownBackendIsBadInputAndAnUnusableOneFailsTheJob() throws Exception {
    TestData d = new TestData(4, 2, 1, 8).doc("a", 20, 0, 1).query("q", "a", 10L);
    Path keys = d.writeKeys(spark, tmp, "parquet", false);
    Path queries = d.writeQueries(spark, tmp, "parquet");
    String[] args = {"score", "--keys", keys.toString(), "--queries", queries.toString(), "--output",
        tmp.resolve("o").toString(), "--dim", "8", "--backend", "tpu"};
    ByteArrayOutputStream err = new ByteArrayOutputStream();
    assertEquals(2, LongctxMain.run(args, System.out, new PrintStream(err, true)), err.toString());
    assertTrue(err.toString().contains("--backend must be auto or one of [cuda, cpu, counting], got 'tpu'"),
        err.toString());
    // The property is named as itself (it was said to be --backend's fault, and ppl's model's), before any work.
    String before = System.getProperty("longctx.backend");
    System.setProperty("longctx.backend", "cdua");
    try {
      err.reset();
      String[] noOption = java.util.Arrays.copyOf(args, args.length - 2);
      assertEquals(2, LongctxMain.run(noOption, System.out, new PrintStream(err, true)), err.toString());
      assertTrue(err.toString().contains("error: -Dlongctx.backend must be auto or one of [cuda, cpu, counting], got "
          + "'cdua'"), err.toString());
    } finally {
      if (before == null) {
        System.clearProperty("longctx.backend");
      } else {
        System.setProperty("longctx.backend", before);
      }
    }

    assumeFalse(CudaProbe.status().available(), "a GPU is present: cuda would run");
    args[args.length - 1] = "cuda";
    err.reset();
    assertEquals(2, LongctxMain.run(args, System.out, new PrintStream(err, true)), err.toString());
    assertTrue(err.toString().contains("--backend (cuda): not usable in this JVM, where the tasks of master local[")
        && err.toString().contains(CudaProbe.status().reason()), err.toString());
    assertTrue(!Files.exists(tmp.resolve("o")), "no output");
    IllegalStateException e = org.junit.jupiter.api.Assertions.assertThrows(IllegalStateException.class,
        () -> new JobBackend("cuda").open());
    assertTrue(e.getMessage().contains("this job runs on the 'cuda' backend (chosen on the driver), which ")
        && e.getMessage().contains(" cannot run: "), e.getMessage());
  }

  /**
   * conf/gpu-discovery.sh prints Spark's resource JSON from nvidia-smi (a stand-in here) as CUDA
   * ordinals: over CUDA_VISIBLE_DEVICES where set (CUDA numbers only those from 0); a failing
   * nvidia-smi is exit 1 (its message was printed as an address, exit 0).
   */
  @Test
  void theGpuDiscoveryScriptPrintsSparksFormat() throws Exception {
    Path bin = Files.createDirectories(tmp.resolve("bin"));
    Path smi = bin.resolve("nvidia-smi");
    Files.writeString(smi, "#!/bin/sh\nprintf '0\\n1\\n'\n");
    smi.toFile().setExecutable(true);
    assertEquals("0: {\"name\": \"gpu\", \"addresses\": [\"0\", \"1\"]}", discover(bin, null));
    assertEquals("0: {\"name\": \"gpu\", \"addresses\": [\"0\"]}", discover(bin, "1"));
    Files.writeString(smi, "#!/bin/sh\necho 'NVIDIA-SMI has failed because it could not communicate'\nexit 9\n");
    String failed = discover(bin, null);
    assertTrue(failed.startsWith("1: ") && failed.contains("nvidia-smi failed: NVIDIA-SMI has failed"), failed);
  }

  /** The script's exit status and output, "STATUS: OUTPUT". */
  private static String discover(Path bin, String visibleDevices) throws Exception {
    Path script = Path.of("..", "conf", "gpu-discovery.sh").toAbsolutePath().normalize();
    ProcessBuilder pb = new ProcessBuilder("bash", script.toString()).redirectErrorStream(true);
    pb.environment().put("PATH", bin + ":/usr/bin:/bin");
    pb.environment().remove("CUDA_VISIBLE_DEVICES");
    if (visibleDevices != null) {
      pb.environment().put("CUDA_VISIBLE_DEVICES", visibleDevices);
    }
    Process p = pb.start();
    String out = new String(p.getInputStream().readAllBytes()).strip();
    return p.waitFor() + ": " + out;
  }
}
