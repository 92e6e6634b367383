package io.longctx.kernels;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.file.Paths;
import java.util.List;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/**
 * The kernels give the same bits whether their vector code runs compiled by C2 or as the Vector
 * API's plain-Java fallback (a cold JVM: a Spark task retried on a fresh executor). The API's own
 * EXP and TANH break this (SVML stubs in C2, scalar Math elsewhere); ours must not.
 */
class JitDeterminismTest {

  @Test
  @Timeout(300)
  void bitsDoNotDependOnTheJitTier() throws Exception {
    String warm = null;
    for (int i = 0; i < 15; i++) { // enough rounds for C2 to compile the hot loops here
      warm = KernelBitsMain.digest();
    }
    List<String> cmd = List.of(Paths.get(System.getProperty("java.home"), "bin", "java").toString(),
        "--add-modules=jdk.incubator.vector", "-XX:TieredStopAtLevel=1", "-cp", System.getProperty("java.class.path"),
        KernelBitsMain.class.getName());
    Process p = new ProcessBuilder(cmd).redirectErrorStream(true).start();
    String out = new String(p.getInputStream().readAllBytes());
    assertTrue(p.waitFor(240, TimeUnit.SECONDS), "child JVM hung: " + out);
    assertEquals(0, p.exitValue(), out);
    String cold = out.lines().filter(l -> l.startsWith("digest=")).findFirst().orElseThrow(() -> new AssertionError(out));
    assertEquals("digest=" + warm, cold, "C1-only JVM and warm C2 JVM disagree");
  }
}
