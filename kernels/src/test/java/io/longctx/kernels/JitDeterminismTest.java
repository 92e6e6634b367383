package io.longctx.kernels;

import static org.junit.jupiter.api.Assertions.assertEquals;

import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.List;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/**
 * The kernels give the same bits whatever the JVM under them: their vector code compiled by C2 or run
 * as the Vector API's plain-Java fallback (a cold JVM: a Spark task retried on a fresh executor), at
 * 512-, 256- or 128-bit vectors, on one core (where the forward kernel groups its query blocks
 * differently), and with the inner loops four vectors wide or two. The API's own EXP and TANH break this (SVML stubs in C2, scalar Math
 * elsewhere); ours must not.
 */
class JitDeterminismTest {

  /**
   * {@link KernelBitsMain#digest()} as of 2026-11-27 (three decode cases and a forward of few rows
   * added, computed on 9f12110, before {@link KeyLaneWorker} existed; the four older cases are
   * unchanged since 2026-11-24), the
   * same on AVX-512 and AVX2 machines: a change of loop order or blocking must leave it alone. A
   * change that alters the bits on purpose updates it and says so in its commit.
   */
  static final String DIGEST = "da4456ca";

  @Test
  @Timeout(600)
  void bitsDoNotDependOnTheJitTierTheVectorWidthOrTheCoreCount() throws Exception {
    String warm = null;
    for (int i = 0; i < 15; i++) { // enough rounds for C2 to compile the hot loops here
      warm = KernelBitsMain.digest();
    }
    assertEquals(DIGEST, warm, "the kernels' bits changed (warm C2 JVM, preferred species "
        + TileMath.SPECIES + ")");
    // UseAVX=2: an AVX2-only machine's 256-bit vectors. (UseAVX=0 gives the same bits too, checked by
    // hand, but without hardware fma the JVM computes Math.fma in software: minutes for this digest.)
    // The last child runs the other form of the inner loops (four vectors wide or two) than this JVM.
    for (String flag : List.of("-XX:TieredStopAtLevel=1", "-XX:UseAVX=2", "-XX:MaxVectorSize=16",
        "-XX:ActiveProcessorCount=1", "-Dlongctx.kernels.wide=" + !TileMath.WIDE)) {
      List<String> cmd = new ArrayList<>(List.of(Paths.get(System.getProperty("java.home"), "bin", "java").toString(),
          "--add-modules=jdk.incubator.vector", "-XX:+IgnoreUnrecognizedVMOptions", flag));
      cmd.addAll(List.of("-cp", System.getProperty("java.class.path"), KernelBitsMain.class.getName()));
      Child c = Child.run(new ProcessBuilder(cmd), 240);
      assertEquals(0, c.exit(), c.output());
      String got = c.output().lines().filter(l -> l.startsWith("digest=")).findFirst()
          .orElseThrow(() -> new AssertionError(c.output()));
      assertEquals("digest=" + DIGEST, got, "a JVM with " + flag + " gives other bits");
    }
  }
}
