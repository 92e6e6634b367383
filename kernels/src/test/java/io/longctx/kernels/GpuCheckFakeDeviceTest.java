package io.longctx.kernels;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.List;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;

/**
 * The forward section of the GPU check ({@link GpuCheck} --smoke) on the fake libcuda. Every forward
 * kernel, plain and tensor-core, runs in the host emulation and its rows pass. With every forward
 * launch made to fail
 * ({@code LONGCTX_FAKE_FORWARD_RC}): every case is an ERROR row naming the CUDA error, the run goes
 * on to the next case and to the timing table, ends with a summary and exit status 1, and the
 * results file holds the same rows. With a sticky error (illegal address) the section stops after
 * the first row and says why. None shows a stack trace.
 */
class GpuCheckFakeDeviceTest {

  /** Correctness rows that run the tensor-core kernel: f16/bf16 at head dims 64 and 128, two masks. */
  private static final int TC_ROWS = 2 * 2 * 2;

  /** Timing rows: 2 causal x 2 types. */
  private static final int TIMING_ROWS = 2 * 2;

  /** 3 element types x 3 smoke shapes x 2 masks (TC_ROWS of them on tensor cores), then the timing rows. */
  private static final int CASES = 3 * 3 * 2 + TIMING_ROWS;

  private record Run(int exit, String stdout, List<String> file) {}

  private static Run check(Path lib, String forwardRc) throws Exception {
    return check(lib, forwardRc, null);
  }

  private static Run check(Path lib, String forwardRc, String copyMode) throws Exception {
    Path out = Files.createTempDirectory(lib, "out");
    ProcessBuilder pb = new ProcessBuilder(Paths.get(System.getProperty("java.home"), "bin", "java").toString(),
        "--add-modules=jdk.incubator.vector", "-cp", System.getProperty("java.class.path"), GpuCheck.class.getName(),
        "--smoke").redirectErrorStream(true);
    pb.environment().put("LD_LIBRARY_PATH", lib.toString());
    pb.environment().put("OUT", out.toString());
    if (forwardRc != null) {
      pb.environment().put("LONGCTX_FAKE_FORWARD_RC", forwardRc);
    }
    if (copyMode != null) {
      pb.environment().put("LONGCTX_EMU_COPY", copyMode);
    }
    Child c = Child.run(pb, 120);
    return new Run(c.exit(), c.output(), Files.readAllLines(out.resolve("gpu-check.txt")));
  }

  private static void noStackTrace(Run r) {
    assertFalse(r.stdout().contains("\tat ") || r.stdout().contains("Exception in thread"), r.stdout());
  }

  @Test
  @Timeout(300)
  void failingLaunchesAreRowsNotTheEndOfTheRun() throws Exception {
    Path lib = CudaDecodeFakeDeviceTest.buildFakeLibcuda("fake-cuda-forward-check");
    Run r = check(lib, "801");
    noStackTrace(r);
    assertEquals(1, r.exit(), r.stdout());
    List<String> errors = r.file().stream().filter(l -> l.contains("ERROR: CudaException: cuLaunchKernel(longctx_forward")
        && l.contains("CUDA_ERROR_NOT_SUPPORTED")).toList();
    assertEquals(CASES, errors.size(), String.join("\n", r.file()));
    assertTrue(r.file().contains("| kernel | shape [B,H/Hkv,Tq,Tk,D] | mask | errors | rule | verdict |"), r.stdout());
    assertTrue(r.file().stream().anyMatch(l -> l.startsWith("## Forward on host emulation (fake libcuda), CUDA driver 13.0, seed ")),
        r.stdout());
    // Tensor-core rows are judged by the rounded-P rule, the others by the float32 one.
    assertTrue(errors.stream().anyMatch(l -> l.startsWith("| longctx_forward_tc_m32_bf16_d128 ") && l.contains("naive rounded-P")));
    assertTrue(errors.stream().anyMatch(l -> l.startsWith("| longctx_forward_f32 ") && l.contains("2x naive float32")));
    assertTrue(r.file().contains("summary forward: 0 pass, 0 FAIL, " + CASES + " ERROR -> FAILED"), r.stdout());
    assertTrue(r.stdout().lines().toList().containsAll(r.file()), "stdout and the results file differ");
  }

  /**
   * Every forward kernel, plain and tensor-core, runs in the emulation and passes its rule, with
   * cp.async copies landing at their wait and at their issue (emulation.h): no ERROR row, the
   * timing table complete, exit status 0.
   */
  @ParameterizedTest(name = "copies land at {0}")
  @ValueSource(strings = {"wait", "issue"})
  @Timeout(300)
  void everyForwardKernelRunsOnTheEmulationAndPasses(String copyMode) throws Exception {
    Path lib = CudaDecodeFakeDeviceTest.buildFakeLibcuda("fake-cuda-forward-check");
    Run r = check(lib, null, copyMode);
    noStackTrace(r);
    List<String> passed = r.file().stream().filter(l -> l.startsWith("| longctx_forward_") && l.endsWith("| pass |"))
        .toList();
    int correctness = CASES - TIMING_ROWS;
    assertEquals(correctness, passed.size(), String.join("\n", r.file()));
    assertEquals(TC_ROWS, passed.stream().filter(l -> l.contains("_tc_m32_") && l.contains("naive rounded-P")).count(),
        String.join("\n", passed));
    assertTrue(passed.stream().anyMatch(l -> l.startsWith("| longctx_forward_tc_m32_bf16_d128 | [1,2/2,5,130,128] | causal ")),
        r.stdout());
    assertTrue(passed.stream().anyMatch(l -> l.startsWith("| longctx_forward_bf16 | [1,2/1,4,50,32] | causal ")), r.stdout());
    assertFalse(r.stdout().contains("ERROR:") || r.stdout().contains("NOT_SUPPORTED"), r.stdout());
    // The timing rows ran the tensor-core kernel too (fake 1 ms events: the figures mean nothing).
    assertEquals(TIMING_ROWS, r.file().stream().filter(l -> l.startsWith("| longctx_forward_tc_")
        && l.contains(" | 1.000 | ")).count(), r.stdout());
    assertTrue(r.file().contains("summary forward: " + correctness + " pass, 0 FAIL, 0 ERROR -> ok"), r.stdout());
    assertEquals(0, r.exit(), r.stdout());
  }

  @Test
  @Timeout(300)
  void aStickyErrorEndsTheSectionCleanly() throws Exception {
    Path lib = CudaDecodeFakeDeviceTest.buildFakeLibcuda("fake-cuda-forward-check");
    Run r = check(lib, "700");
    noStackTrace(r);
    assertEquals(1, r.exit(), r.stdout());
    assertEquals(1, r.file().stream().filter(l -> l.contains("CUDA_ERROR_ILLEGAL_ADDRESS |")).count(), r.stdout());
    assertTrue(r.file().stream().anyMatch(l -> l.startsWith("forward section stopped: sticky CUDA error CUDA_ERROR_ILLEGAL_ADDRESS")),
        r.stdout());
    assertTrue(r.file().contains("summary forward: 0 pass, 0 FAIL, 1 ERROR, stopped early -> FAILED"), r.stdout());
    assertFalse(r.stdout().contains("| ms (median of 10) |"), "the timing table ran after the context was lost");
  }
}
