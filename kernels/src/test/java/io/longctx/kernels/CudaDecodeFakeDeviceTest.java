package io.longctx.kernels;

import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/**
 * The whole CUDA decode path from Java without a GPU: a fake libcuda built here
 * (src/test/cuda/fake_libcuda_emulated.cpp) allocates host memory and runs launched decode kernels
 * in the host emulation of flash_decode.cu, so JCuda, the probe, module loading, CudaDecode's
 * chunk tables, kernel parameters and launches, and CudaAttention's entry points all run for real
 * ({@link CudaDecodeFakeDeviceMain}, in a child JVM). It shows the Java side and the kernel source
 * agree; it shows nothing about a GPU.
 */
class CudaDecodeFakeDeviceTest {

  /** {@link FakeLibcuda#build} into target/{@code name} (skips the calling test where it cannot). */
  static Path buildFakeLibcuda(String name) throws Exception {
    return FakeLibcuda.build(Paths.get(""), Paths.get("target", name));
  }

  @Test
  @Timeout(300)
  void javaEntryPointsDriveTheKernelSourceThroughJcuda() throws Exception {
    Path dir = buildFakeLibcuda("fake-cuda-emulated");

    // The child prints its seed; -Dlongctx.seed=S replays one (passed on to the child).
    ProcessBuilder pb = new ProcessBuilder(Paths.get(System.getProperty("java.home"), "bin", "java").toString(),
        "--add-modules=jdk.incubator.vector", "-Dlongctx.seed=" + System.getProperty("longctx.seed", ""), "-cp",
        System.getProperty("java.class.path"), CudaDecodeFakeDeviceMain.class.getName()).redirectErrorStream(true);
    pb.environment().putAll(Map.of("LD_LIBRARY_PATH", dir.toString()));
    Child child = Child.run(pb, 240);
    String text = child.output();
    assertTrue(child.exit() == 0, "child JVM failed (exit " + child.exit() + "): " + text);
    List<String> lines = text.lines().toList();
    assertTrue(lines.contains("backend=cuda:0 host emulation (fake libcuda)"), text);
    for (String check : List.of("chunked-bf16", "backend-f32", "unified-recompute", "device-chunks", "fp16-overflow",
        "forward-f32", "forward-f32-first-score-minus-inf", "forward-tc-bf16")) {
      assertTrue(lines.contains(check + "=pass"), check + ":\n" + text);
    }

    // The GPU check's decode section itself, at smoke sizes: its code has run before a GPU sees it.
    ProcessBuilder check = new ProcessBuilder(Paths.get(System.getProperty("java.home"), "bin", "java").toString(),
        "--add-modules=jdk.incubator.vector", "-cp", System.getProperty("java.class.path"),
        GpuDecodeCheck.class.getName(), "--smoke").redirectErrorStream(true);
    check.environment().put("LD_LIBRARY_PATH", dir.toString());
    Path outDir = Files.createTempDirectory(dir, "decode-check-out");
    check.environment().put("OUT", outDir.toString());
    Child c = Child.run(check, 240);
    String out = c.output();
    assertTrue(c.exit() == 0 && out.contains("summary decode: ") && out.contains(" 0 FAIL, 0 ERROR -> ok"),
        "decode check failed:\n" + out);
    // Every row printed was also appended to the results file as it was made.
    List<String> file = Files.readAllLines(outDir.resolve("gpu-check.txt"));
    assertTrue(out.lines().toList().containsAll(file) && file.stream().anyMatch(l -> l.startsWith("summary decode: "))
        && file.stream().filter(l -> l.contains("| pass |")).count() == out.lines().filter(l -> l.contains("| pass |")).count()
        && file.stream().anyMatch(l -> l.contains("| pass |")), "results file differs from stdout:\n" + file);
    assertTrue(out.contains("batch invariance (bf16, sequence 0 alone vs in a batch of 2, split 700): pass"), out);
    assertTrue(out.contains("| sync split-K | 1 | 256 |") && out.contains("| device-to-device copy"), out);
    // The 4-row call also timed on the CUDA-core partials: its output agrees with the tensor cores'.
    java.util.regex.Matcher m = java.util.regex.Pattern
        .compile("\\| sync split-K on CUDA cores \\(o rel-L2 ([^,]+), lse max-abs ([^ ]+) vs tensor cores\\) \\| 1 \\| 256 \\|")
        .matcher(out);
    assertTrue(m.find(), out);
    assertTrue(Double.parseDouble(m.group(1)) < 1e-5 && Double.parseDouble(m.group(2)) < 1e-5, m.group());
    // One row per CTA (8/8 heads): timed on tensor cores, and on CUDA cores with the same output.
    assertTrue(out.contains("| sync split-K (H 8 / Hkv 8) | 1 | 256 |"), out);
    java.util.regex.Matcher one = java.util.regex.Pattern.compile("\\| sync split-K on CUDA cores \\(H 8 / Hkv 8\\) "
        + "\\(o rel-L2 ([^,]+), lse max-abs ([^ ]+) vs tensor cores\\) \\| 1 \\| 256 \\|").matcher(out);
    assertTrue(one.find(), out);
    assertTrue(Double.parseDouble(one.group(1)) < 1e-5 && Double.parseDouble(one.group(2)) < 1e-5, one.group());

    // --timing-only (what bin/gpu-check run --profile runs): the timing table and nothing else.
    check.command().add("--timing-only");
    Path timingOut = Files.createTempDirectory(dir, "decode-timing-out");
    check.environment().put("OUT", timingOut.toString());
    Child t = Child.run(check, 240);
    String tout = t.output();
    assertTrue(t.exit() == 0 && tout.contains("| sync split-K | 1 | 256 |") && tout.contains("summary decode: 0 pass, 0 FAIL"),
        tout);
    assertTrue(!tout.contains("batch invariance") && !tout.contains("correctness against float64"), tout);
  }
}
