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

/**
 * The forward section of the GPU check ({@link GpuCheck} --smoke) on the fake libcuda. As it is, the
 * plain forward kernels run in the host emulation and their rows pass; the tensor-core kernels are
 * not emulated and are ERROR rows. With every forward launch made to fail
 * ({@code LONGCTX_FAKE_FORWARD_RC}): every case is an ERROR row naming the CUDA error, the run goes
 * on to the next case and to the timing table, ends with a summary and exit status 1, and the
 * results file holds the same rows. With a sticky error (illegal address) the section stops after
 * the first row and says why. None shows a stack trace.
 */
class GpuCheckFakeDeviceTest {

  /** 3 element types x 3 smoke shapes x 2 masks, then 2 causal x 2 types timing rows. */
  private static final int CASES = 3 * 3 * 2 + 2 * 2;

  private record Run(int exit, String stdout, List<String> file) {}

  private static Run check(Path lib, String forwardRc) throws Exception {
    Path out = Files.createTempDirectory(lib, "out");
    ProcessBuilder pb = new ProcessBuilder(Paths.get(System.getProperty("java.home"), "bin", "java").toString(),
        "--add-modules=jdk.incubator.vector", "-cp", System.getProperty("java.class.path"), GpuCheck.class.getName(),
        "--smoke").redirectErrorStream(true);
    pb.environment().put("LD_LIBRARY_PATH", lib.toString());
    pb.environment().put("OUT", out.toString());
    if (forwardRc != null) {
      pb.environment().put("LONGCTX_FAKE_FORWARD_RC", forwardRc);
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
    assertTrue(errors.stream().anyMatch(l -> l.startsWith("| longctx_forward_tc_bf16_d128 ") && l.contains("naive rounded-P")));
    assertTrue(errors.stream().anyMatch(l -> l.startsWith("| longctx_forward_f32 ") && l.contains("2x naive float32")));
    assertTrue(r.file().contains("summary forward: 0 pass, 0 FAIL, " + CASES + " ERROR -> FAILED"), r.stdout());
    assertTrue(r.stdout().lines().toList().containsAll(r.file()), "stdout and the results file differ");
  }

  /** f32 at every dim and f16/bf16 at head dim 32 run the plain kernel: 6 + 4 rows. */
  private static final int PLAIN_ROWS = 3 * 2 + 2 * 2;

  @Test
  @Timeout(300)
  void plainForwardKernelsRunOnTheEmulationAndPass() throws Exception {
    Path lib = CudaDecodeFakeDeviceTest.buildFakeLibcuda("fake-cuda-forward-check");
    Run r = check(lib, null);
    noStackTrace(r);
    List<String> passed = r.file().stream().filter(l -> l.startsWith("| longctx_forward_") && l.endsWith("| pass |"))
        .toList();
    assertEquals(PLAIN_ROWS, passed.size(), String.join("\n", r.file()));
    assertTrue(passed.stream().noneMatch(l -> l.contains("_tc_")), String.join("\n", passed));
    assertTrue(passed.stream().anyMatch(l -> l.startsWith("| longctx_forward_bf16 | [1,2/1,4,50,32] | causal ")), r.stdout());
    // Until the tensor-core kernels are emulated, they remain errors, not passes.
    assertTrue(r.file().contains("summary forward: " + PLAIN_ROWS + " pass, 0 FAIL, " + (CASES - PLAIN_ROWS)
        + " ERROR -> FAILED"), r.stdout());
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
