package io.longctx.kernels;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assumptions.assumeFalse;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import java.io.IOException;
import java.io.InputStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/**
 * The CUDA backend's behaviour without a GPU: the fatbin is built into the classes, the probe
 * explains why CUDA is unavailable (no libcuda at all; a driver without a device, from a fake
 * libcuda built here), auto falls back to the CPU kernels, and cuda fails loudly.
 */
class CudaBackendTest {

  static boolean nvccOnPath() {
    for (String dir : System.getenv().getOrDefault("PATH", "").split(":")) {
      if (Files.isExecutable(Paths.get(dir, "nvcc"))) {
        return true;
      }
    }
    return false;
  }

  @Test
  void fatbinsAreBuiltIntoTheClassesWithEveryKernel() throws IOException {
    assumeTrue(nvccOnPath(), "nvcc is not on PATH: the build skipped the fatbins (with a warning)");
    StringBuilder all = new StringBuilder();
    for (String name : CudaProbe.FATBINS) {
      byte[] fatbin;
      try (InputStream in = CudaProbe.class.getResourceAsStream(CudaProbe.FATBIN_DIR + name)) {
        assertNotNull(in, "fatbin resource " + name);
        fatbin = in.readAllBytes();
      }
      // Fatbin magic 0xBA55ED50, little endian.
      assertEquals(0x50, fatbin[0] & 0xff, name);
      assertEquals(0xED, fatbin[1] & 0xff, name);
      assertEquals(0x55, fatbin[2] & 0xff, name);
      assertEquals(0xBA, fatbin[3] & 0xff, name);
      all.append(new String(fatbin, java.nio.charset.StandardCharsets.ISO_8859_1));
    }
    for (String kernel : CudaAttention.kernelNames()) {
      assertTrue(all.indexOf(kernel) >= 0, "no fatbin holds kernel " + kernel);
    }
    assertEquals("longctx_forward_tc_m32_bf16_d128", CudaAttention.kernelFor(CudaAttention.DType.BF16, 128));
    assertEquals("longctx_forward_f16", CudaAttention.kernelFor(CudaAttention.DType.F16, 96));
    assertEquals("longctx_forward_f32", CudaAttention.kernelFor(CudaAttention.DType.F32, 128));
    assertEquals("longctx_forward_tc_m32_f16_d64", CudaAttention.kernelFor(CudaAttention.DType.F16, 64));
  }

  @Test
  void selectionByProperty() {
    assertSame(CpuAttention.DEFAULT, AttentionBackend.select("cpu"));
    IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> AttentionBackend.select("gpu"));
    assertTrue(e.getMessage().contains("auto or one of [cuda, cpu]"), e.getMessage());
    assertEquals(List.of("cuda", "cpu"), AttentionBackends.names(), "both built-in providers, by priority");
  }

  @Test
  @Timeout(120)
  void withoutLibcudaAutoFallsBackAndCudaFailsLoudly() throws Exception {
    assumeFalse(CudaProbe.status().available(), "a real GPU is present");
    List<String> out = runProbe(Map.of());
    assertTrue(out.contains("available=false"), out.toString());
    String reason = out.stream().filter(l -> l.startsWith("reason=")).findFirst().orElseThrow();
    assertTrue(reason.contains("libcuda") || reason.contains("fatbin"), reason);
    assertTrue(out.contains("auto=cpu"), out.toString());
    assertTrue(out.stream().anyMatch(l -> l.startsWith("cuda=refused: longctx.backend=cuda but the cuda backend is unavailable")), out.toString());
    assertTrue(out.contains("again=" + reason.substring("reason=".length())), out.toString());
  }

  @Test
  @Timeout(180)
  void withADriverButNoDeviceAutoFallsBack() throws Exception {
    assumeTrue(nvccOnPath(), "needs the fatbin, so that the probe reaches the driver");
    Path lib = buildFakeLibcuda();
    // cuInit reports CUDA_ERROR_NO_DEVICE, as a driver on a machine without a GPU does.
    List<String> noDevice = runProbe(Map.of("LD_LIBRARY_PATH", lib.toString(), "FAKE_CUDA_INIT", "100"));
    assertTrue(noDevice.contains("reason=cuInit failed: CUDA_ERROR_NO_DEVICE"), noDevice.toString());
    assertTrue(noDevice.contains("auto=cpu"), noDevice.toString());
    assertTrue(noDevice.stream().anyMatch(l -> l.startsWith("cuda=refused")), noDevice.toString());
    // cuInit succeeds but there are zero devices.
    List<String> zero = runProbe(Map.of("LD_LIBRARY_PATH", lib.toString(), "FAKE_CUDA_INIT", "0", "FAKE_CUDA_DEVICES", "0"));
    assertTrue(zero.contains("reason=no CUDA device"), zero.toString());
    assertTrue(zero.contains("auto=cpu"), zero.toString());
  }

  /** Compiles the fake driver with gcc into target/fake-cuda/libcuda.so.1. */
  static Path buildFakeLibcuda() throws Exception {
    Path dir = Paths.get("target", "fake-cuda").toAbsolutePath();
    Files.createDirectories(dir);
    Path so = dir.resolve("libcuda.so.1");
    Child p = Child.run(new ProcessBuilder("gcc", "-shared", "-fPIC", "-O1", "-o", so.toString(),
        Paths.get("src", "test", "c", "fake_libcuda.c").toAbsolutePath().toString()), 60);
    assertTrue(p.exit() == 0, "gcc failed: " + p.output());
    return dir;
  }

  /** Runs {@link CudaProbeMain} in a fresh JVM (the probe's answer is per process). */
  static List<String> runProbe(Map<String, String> env) throws Exception {
    List<String> cmd = new ArrayList<>(List.of(Paths.get(System.getProperty("java.home"), "bin", "java").toString(),
        "--add-modules=jdk.incubator.vector", "-cp", System.getProperty("java.class.path"),
        CudaProbeMain.class.getName()));
    ProcessBuilder pb = new ProcessBuilder(cmd).redirectErrorStream(true);
    pb.environment().putAll(env);
    Child p = Child.run(pb, 90);
    String text = p.output();
    assertEquals(0, p.exit(), "probe JVM failed: " + text);
    return text.lines().toList();
  }
}
