package io.longctx.kernels;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.List;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/**
 * The tensor-core forward without a GPU. First the emulated warp operations themselves
 * (src/test/cuda/tc_emulation_test.cpp: ldmatrix and mma.sync m16n8k16 against the PTX ISA's fragment
 * tables and a double matmul, fp16 and bf16); then flash_forward_tc.cu on the fake libcuda through
 * CudaAttention ({@link TensorCoreFakeDeviceMain}) on awkward small shapes, with cp.async copies
 * landing at their wait and at their issue (LONGCTX_EMU_COPY, emulation.h), and at random points.
 * Says nothing about the GPU (real PTX, asynchrony, the tensor cores' summation order).
 */
class CudaTensorCoreEmulationTest {

  @Test
  @Timeout(300)
  void emulatedLdmatrixAndMmaMatchTheFragmentTablesAndAMatmul() throws Exception {
    long seed = Seeds.forTest();
    String out = runHostTest("tc_emulation_test", seed, 16, 60);
    assertTrue(out.contains("16 trials x 2 types x 8 warps, seed " + Long.toUnsignedString(seed) + ": 0 failures"),
        out);
  }

  /**
   * The kernel's key-tile scan (find_tile, which decides by warp votes) against the range rule
   * (any_visible / all_visible of each tile's min and max position) on random positions, query
   * ranges, masks and tile starts: src/test/cuda/tile_scan_test.cpp, one emulated warp per scan.
   */
  @Test
  @Timeout(300)
  void keyTileScanAgreesWithTheRangeRule() throws Exception {
    long seed = Seeds.forTest();
    String out = runHostTest("tile_scan_test", seed, 300, 120);
    assertTrue(out.contains("300 trials, ") && out.contains("seed " + Long.toUnsignedString(seed) + ": 0 failures"),
        out);
  }

  /**
   * Builds src/test/cuda/{@code name}.cpp against the emulation and the kernel sources, runs it with
   * {@code SEED TRIALS}, asserts exit status 0 (the seed to replay in the message) and returns its
   * output; skips the test without g++ or the CUDA headers.
   */
  private static String runHostTest(String name, long seed, int trials, int seconds) throws Exception {
    Path include = CudaDecodeEmulationTest.cudaInclude();
    assumeTrue(include != null, "no CUDA headers (cuda_fp16.h) here: the host emulation needs them");
    assumeTrue(CudaDecodeEmulationTest.onPath("g++"), "no g++ on PATH: the host emulation needs it");
    Path dir = Files.createDirectories(Paths.get("target", "tc-emulation").toAbsolutePath());
    Path exe = dir.resolve(name);
    Child gcc = Child.run(new ProcessBuilder("g++", "-std=c++20", "-O1", "-pthread", "-I" + include,
        "-I" + Paths.get("src", "main", "cuda").toAbsolutePath(),
        "-I" + Paths.get("src", "test", "cuda").toAbsolutePath(),
        "-o", exe.toString(), Paths.get("src", "test", "cuda", name + ".cpp").toAbsolutePath().toString()), 170);
    assertEquals(0, gcc.exit(), "g++ failed: " + gcc.output());
    Child run = Child.run(new ProcessBuilder(exe.toString(), Long.toUnsignedString(seed), String.valueOf(trials)),
        seconds);
    assertEquals(0, run.exit(), "seed " + seed + " (replay: -Dlongctx.seed=" + seed + "):\n" + run.output());
    return run.output();
  }

  /**
   * The kernel on the fake device with cp.async copies landing at their wait, at their issue and at
   * random points: each run passes on every case, and all three give the same bits (a race-free
   * kernel's output does not depend on when its copies land).
   */
  @Test
  @Timeout(400)
  void tensorCoreKernelMatchesTheReferenceOnTheFakeDevice() throws Exception {
    Path lib = CudaDecodeFakeDeviceTest.buildFakeLibcuda("fake-cuda-tc");
    long seed = Seeds.forTest();
    List<String> first = null;
    for (String copyMode : List.of("wait", "issue", "random")) {
      ProcessBuilder pb = new ProcessBuilder(Paths.get(System.getProperty("java.home"), "bin", "java").toString(),
          "--add-modules=jdk.incubator.vector", "-Dlongctx.seed=" + seed, "-cp", System.getProperty("java.class.path"),
          TensorCoreFakeDeviceMain.class.getName()).redirectErrorStream(true);
      pb.environment().put("LD_LIBRARY_PATH", lib.toString());
      pb.environment().put("LONGCTX_EMU_COPY", copyMode);
      pb.environment().put("LONGCTX_EMU_SEED", Long.toUnsignedString(seed)); // used by random
      Child c = Child.run(pb, 120);
      String text = "LONGCTX_EMU_COPY=" + copyMode + ", seed " + seed + " (replay: -Dlongctx.seed=" + seed + "):\n"
          + c.output();
      assertEquals(0, c.exit(), text);
      List<String> cases = c.output().lines().filter(l -> l.startsWith("longctx_forward_tc_")).toList();
      assertEquals(13, cases.size(), text);
      assertTrue(cases.stream().allMatch(l -> l.contains("=pass ")), text);
      assertTrue(c.output().contains("fp16-overflow=pass"), text);
      assertTrue(c.output().contains("qk-overflow=pass"), text);
      if (copyMode.equals("random")) {
        assertTrue(c.output().contains("LONGCTX_EMU_SEED=" + Long.toUnsignedString(seed)), text);
      }
      List<String> bits = cases.stream().map(l -> l.substring(0, l.indexOf('=')) + l.substring(l.indexOf(" bits "))).toList();
      if (first == null) {
        first = bits;
      } else {
        assertEquals(first, bits, "output bits differ from copies landing at their wait (a race): " + text);
      }
    }
  }
}
