package io.longctx.kernels;

import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assumptions.assumeFalse;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import java.nio.file.Files;
import java.nio.file.Path;

/**
 * The emulating fake libcuda (src/test/cuda/fake_libcuda_emulated.cpp): it allocates host memory and
 * runs launched kernels in the host emulation of the .cu sources, so a child JVM with it on
 * LD_LIBRARY_PATH drives the real CUDA backend through JCuda without a GPU. Public for the djl-op
 * module's tests (through this module's test jar).
 */
public final class FakeLibcuda {
  private FakeLibcuda() {}

  /**
   * Builds the library into {@code into}/libcuda.so.1 from the sources of the kernels module at
   * {@code kernelsDir} and returns {@code into} (for LD_LIBRARY_PATH); skips the calling test where a
   * real GPU is present, or without g++, the CUDA headers or nvcc (the probe accepts the fake driver
   * only where the fatbins were built).
   */
  public static Path build(Path kernelsDir, Path into) throws Exception {
    assumeFalse(CudaProbe.status().available(), "a real GPU is present: bin/gpu-check covers this");
    assumeTrue(CudaBackendTest.nvccOnPath(), "needs the fatbins (nvcc), so that the probe accepts the fake driver");
    Path include = CudaDecodeEmulationTest.cudaInclude();
    assumeTrue(include != null && CudaDecodeEmulationTest.onPath("g++"), "needs g++ and the CUDA headers");
    Path dir = into.toAbsolutePath();
    Path src = kernelsDir.toAbsolutePath().resolve("src");
    Files.createDirectories(dir);
    Child gcc = Child.run(new ProcessBuilder("g++", "-shared", "-fPIC", "-std=c++20", "-O1", "-pthread", "-I" + include,
        "-I" + src.resolve("main/cuda"), "-I" + src.resolve("test/cuda"), "-o", dir.resolve("libcuda.so.1").toString(),
        src.resolve("test/cuda/fake_libcuda_emulated.cpp").toString()), 170);
    assertTrue(gcc.exit() == 0, "g++ failed: " + gcc.output());
    return dir;
  }
}
