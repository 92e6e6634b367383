package io.longctx.kernels;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import java.io.File;
import java.io.OutputStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.List;
import java.util.jar.JarEntry;
import java.util.jar.JarOutputStream;
import java.util.stream.Stream;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/**
 * {@code bin/gpu-check run --smoke forward decode} on the fake libcuda, with a bundle made here from
 * the build's classes and the JCuda jars: the header comes first, each section runs in its own
 * process under its own time limit (decode's is too short on purpose and is killed), the forward
 * section's rows and summary reach the results file, and the script ends with the sections' exit
 * statuses, a FAILED line and exit status 1.
 */
class GpuCheckScriptTest {

  /** bin/gpu-check; the test is skipped without it or without coreutils timeout. */
  private static Path script() {
    Path script = Paths.get("..", "bin", "gpu-check").toAbsolutePath().normalize();
    assumeTrue(Files.isRegularFile(script) && Files.isExecutable(Paths.get("/usr/bin/timeout")),
        "needs bin/gpu-check and coreutils timeout");
    return script;
  }

  @Test
  @Timeout(300)
  void runWritesHeaderSectionsTimeLimitsAndSummary() throws Exception {
    Path script = script();
    Path lib = CudaDecodeFakeDeviceTest.buildFakeLibcuda("fake-cuda-script");
    Path bundle = bundle(lib);
    Path out = Files.createTempDirectory(lib, "out");
    ProcessBuilder pb = fakeDeviceRun(script, lib, bundle, out, "run", "--smoke", "forward", "decode");
    pb.environment().put("GPU_CHECK_DECODE_S", "2"); // the emulated decode smoke run takes far longer
    Child p = Child.run(pb, 240);
    String text = p.output();
    List<String> file = Files.readAllLines(out.resolve("gpu-check.txt"));
    String all = String.join("\n", file);
    assertEquals(1, p.exit(), text);
    assertEquals("# longctx GPU check", file.get(0), all);
    assertLinesStartWith(file, "- date: ", "- commit: ", "- host: ", "- java: ", "- mode: sections forward decode --smoke",
        "=== section forward (time limit 180 s) ===", "## Forward on host emulation (fake libcuda), CUDA driver 13.0",
        "summary forward: 18 pass, 0 FAIL, 0 ERROR -> ok", "section forward: exit status 0",
        "=== section decode (time limit 2 s) ===", "section decode: TIMED OUT after 2 s",
        "section decode: exit status 124", "sections: forward=0 decode=124", "gpu-check: FAILED");
    assertTrue(file.indexOf("```") < file.indexOf("=== section forward (time limit 180 s) ==="), "header not first");
  }

  /**
   * {@code run --smoke ab} on the fake libcuda: the builds of {@code ab/revisions.txt} are loaded
   * (the fake device runs this build's emulated kernel under every name, so this tests the section's
   * plumbing, not old kernels), each checked and timed beside this build's; a listed build without a
   * fatbin is an ERROR row and the section fails, with every other row still made.
   */
  @Test
  @Timeout(300)
  void abChecksAndTimesEveryBuildAndReportsAMissingOne() throws Exception {
    Path script = script();
    Path lib = CudaDecodeFakeDeviceTest.buildFakeLibcuda("fake-cuda-ab");
    Path bundle = bundle(lib);
    Path ab = Files.createDirectories(bundle.resolve("ab"));
    Files.writeString(ab.resolve("revisions.txt"), "older 0123abc an older build\nabsent 4567def never compiled\n");
    Files.write(ab.resolve("older.fatbin"), new byte[] {1, 2, 3}); // the fake libcuda ignores a module's bytes
    Path out = Files.createTempDirectory(lib, "out");
    Child p = Child.run(fakeDeviceRun(script, lib, bundle, out, "run", "--smoke", "ab"), 240);
    List<String> file = Files.readAllLines(out.resolve("gpu-check.txt"));
    String all = String.join("\n", file);
    assertEquals(1, p.exit(), p.output());
    assertLinesStartWith(file, "=== section ab (time limit 150 s) ===", "| older | 0123abc | an older build | yes, ",
        "| absent | 4567def | never compiled | ERROR", "| this build | [1,2/2,5,130,128] | causal | ",
        "| older | [1,2/2,5,130,128] | causal | ", "| this build | 1 | 2 | 128 | 128 | true | ",
        "| older | 1 | 2 | 128 | 128 | true | ", "summary ab: 4 pass, 0 FAIL, 1 ERROR", "sections: ab=1");
    assertTrue(file.stream().noneMatch(l -> l.startsWith("| absent | 1 |")), all);
  }

  /**
   * {@code run --smoke ab-decode} on the fake libcuda: this build timed, a listed build's jar checked
   * in full and timed, both timed again, then the table of this build's times over the other's; a
   * listed build without a jar is reported and fails the run, the rest still runs. (The fake device
   * emulates this build's decode kernels whatever module it is given: this tests the plumbing.)
   */
  @Test
  @Timeout(400)
  void abDecodeTimesEveryBuildAndReportsAMissingOne() throws Exception {
    Path script = script();
    Path lib = CudaDecodeFakeDeviceTest.buildFakeLibcuda("fake-cuda-ab-decode");
    Path bundle = bundle(lib);
    Path ab = Files.createDirectories(bundle.resolve("ab-decode"));
    Files.writeString(ab.resolve("revisions.txt"), "older 0123abc an older build\nabsent 4567def never compiled\n");
    Path fatbins = Files.createDirectories(lib.resolve("older-jar").resolve("io/longctx/kernels/cuda"));
    Files.write(fatbins.resolve("flash_decode.fatbin"), new byte[] {1, 2, 3});
    jar(lib.resolve("older-jar"), ab.resolve("older.jar"));
    Path out = Files.createTempDirectory(lib, "out");
    Files.writeString(out.resolve("decode-times.tsv"), "a decode section's timings\n"); // kept through ab-decode
    Child p = Child.run(fakeDeviceRun(script, lib, bundle, out, "run", "--smoke", "ab-decode"), 360);
    List<String> file = Files.readAllLines(out.resolve("gpu-check.txt"));
    String all = String.join("\n", file);
    assertEquals(1, p.exit(), p.output());
    assertLinesStartWith(file, "ab-decode build older: commit 0123abc, an older build",
        "ab-decode build absent: commit 4567def: ERROR no jar", "section ab-decode-this-1-timing: exit status 0",
        "section ab-decode-older-1: exit status 0", "summary decode: 37 pass, 0 FAIL, 0 ERROR",
        "section ab-decode-this-2-timing: exit status 0", "section ab-decode-older-2-timing: exit status 0",
        "| what | Tq | split | this ms | older ms | this / older |", "| sync | 1 | 256 | ",
        "sections: ab-decode-absent=missing ab-decode-this-1-timing=0");
    assertTrue(file.stream().noneMatch(l -> l.contains("absent ms")), all);
    assertEquals("a decode section's timings\n", Files.readString(out.resolve("decode-times.tsv")));
  }

  /**
   * Every build the A/B lists name is a commit of this repository holding the source the bundle
   * compiles for it, with a label the bundle can use as a file name: a wrong line would surface only
   * on a GPU machine, as a missing build. Skipped outside a git checkout and in a shallow clone.
   */
  @Test
  void abListsNameCommitsOfThisRepository() throws Exception {
    Path root = Paths.get("..").toAbsolutePath().normalize();
    assumeTrue(Files.isDirectory(root.resolve(".git")) && CudaDecodeEmulationTest.onPath("git"), "needs a git checkout");
    Child shallow = Child.run(new ProcessBuilder("git", "-C", root.toString(), "rev-parse", "--is-shallow-repository")
        .redirectErrorStream(true), 30);
    assumeTrue(shallow.exit() == 0 && shallow.output().trim().equals("false"), "needs the history, not a shallow clone");
    for (String[] list : new String[][] {{"ab-revisions.txt", "flash_forward_tc.cu"},
        {"ab-decode-revisions.txt", "flash_decode.cu"}}) {
      for (String line : Files.readAllLines(root.resolve("kernels/src/gpu").resolve(list[0]))) {
        if (line.isBlank() || line.startsWith("#")) {
          continue;
        }
        String[] f = line.trim().split("\\s+", 3);
        assertTrue(f.length == 3 && f[0].matches("[A-Za-z0-9._-]+"), list[0] + ": label, commit, note: " + line);
        Child git = Child.run(new ProcessBuilder("git", "-C", root.toString(), "cat-file", "-e",
            f[1] + ":kernels/src/main/cuda/" + list[1]).redirectErrorStream(true), 30);
        assertEquals(0, git.exit(), list[0] + ": commit " + f[1] + " (" + f[0] + ") has no " + list[1] + ": " + git.output());
      }
    }
  }

  /** Each prefix begins some line of {@code file}; the message names the first that does not, with the file. */
  private static void assertLinesStartWith(List<String> file, String... prefixes) {
    for (String prefix : prefixes) {
      assertTrue(file.stream().anyMatch(l -> l.startsWith(prefix)), "no line '" + prefix + "' in\n" + String.join("\n", file));
    }
  }

  /** A bundle of the build's classes and the JCuda jars (no runtime: the script falls back to java on PATH). */
  private static Path bundle(Path dir) throws Exception {
    Path bundle = Files.createTempDirectory(dir, "bundle");
    Path jars = Files.createDirectories(bundle.resolve("lib"));
    jar(Paths.get("target", "classes"), jars.resolve("longctx-kernels.jar"));
    for (String entry : System.getProperty("java.class.path").split(File.pathSeparator)) {
      if (entry.contains("jcuda") && entry.endsWith(".jar")) {
        Files.copy(Paths.get(entry), jars.resolve(Paths.get(entry).getFileName()));
      }
    }
    return bundle;
  }

  /** bin/gpu-check with the given arguments on the fake libcuda in {@code lib}. */
  private static ProcessBuilder fakeDeviceRun(Path script, Path lib, Path bundle, Path out, String... args) {
    ProcessBuilder pb = scriptRun(script, bundle, out, Paths.get(System.getProperty("java.home"), "bin")
        + File.pathSeparator + System.getenv("PATH"), args);
    pb.environment().put("LD_LIBRARY_PATH", lib.toString());
    return pb;
  }

  /** bin/gpu-check with the given arguments, bundle, results folder and PATH. */
  private static ProcessBuilder scriptRun(Path script, Path bundle, Path out, String path, String... args) {
    List<String> cmd = new java.util.ArrayList<>(List.of("bash", script.toString()));
    cmd.addAll(List.of(args));
    ProcessBuilder pb = new ProcessBuilder(cmd).redirectErrorStream(true);
    pb.environment().put("GPU_CHECK_BUNDLE", bundle.toString());
    pb.environment().put("OUT", out.toString());
    pb.environment().put("PATH", path);
    return pb;
  }

  /**
   * {@code run --sanitize} and {@code run --profile} take the sections asked for (stand-in
   * compute-sanitizer and ncu on PATH record what they were run on); {@code --sanitize sdpa} alone and
   * {@code --profile} with {@code ab}, with {@code --smoke} or with {@code --sanitize} are exit 2 before anything
   * is written.
   */
  @Test
  @Timeout(120)
  void sanitizeAndProfileRunTheSectionsAskedFor() throws Exception {
    Path script = script();
    Path dir = Files.createTempDirectory(Paths.get("target"), "gpu-check-tools");
    Path tools = Files.createDirectories(dir.resolve("bin"));
    Path bundle = Files.createDirectories(dir.resolve("bundle"));
    // compute-sanitizer: its --log-file gets one ========= line naming the class it was to run.
    Files.writeString(tools.resolve("compute-sanitizer"), "#!/bin/bash\nlog=\n"
        + "a=(\"$@\"); for ((i=0;i<${#a[@]};i++)); do [ \"${a[$i]}\" = --log-file ] && log=\"${a[$((i+1))]}\"; done\n"
        + "echo \"========= stand-in $2 on ${a[-2]}\" > \"$log\"\n");
    Files.writeString(tools.resolve("ncu"), "#!/bin/bash\necho \"  stand_in_kernel (1) $*\"\n");
    for (String t : List.of("compute-sanitizer", "ncu")) {
      assertTrue(tools.resolve(t).toFile().setExecutable(true));
    }
    String path = tools + File.pathSeparator + Paths.get(System.getProperty("java.home"), "bin") + File.pathSeparator
        + System.getenv("PATH");

    Path out = Files.createDirectories(dir.resolve("out"));
    String sanitize = runScript(script, bundle, out, path, 0, "run", "--sanitize", "decode");
    assertTrue(sanitize.contains("========= stand-in memcheck on io.longctx.kernels.GpuDecodeCheck")
        && sanitize.contains("========= stand-in synccheck on io.longctx.kernels.GpuDecodeCheck")
        && !sanitize.contains("GpuCheck ") && !sanitize.contains("-GpuCheck="), sanitize);
    // The three reports in one log, each under a header: the device tool brings back at most 8 files.
    String reports = Files.readString(out.resolve("sanitizer.log"));
    for (String tool : List.of("memcheck", "racecheck", "synccheck")) {
      assertTrue(reports.contains("### " + tool + " over GpuDecodeCheck\n========= stand-in " + tool
          + " on io.longctx.kernels.GpuDecodeCheck"), reports);
    }
    try (var files = Files.list(out)) {
      assertEquals(List.of(), files.map(f -> f.getFileName().toString()).filter(n -> n.startsWith("sanitizer-")).toList());
    }

    String profile = runScript(script, bundle, out, path, 0, "run", "--profile", "decode");
    assertTrue(profile.contains("--- ncu-decode.txt") && profile.contains("sections: ncu-decode=0")
        && !profile.contains("ncu-forward") && !profile.contains("ncu-sdpa"), profile);

    // Nothing of ours to sanitize: exit 2, and the results of the run before are left alone.
    String before = Files.readString(out.resolve("gpu-check.txt"));
    String refused = runScript(script, bundle, out, path, 2, "run", "--sanitize", "sdpa");
    assertTrue(refused.contains("--sanitize checks our kernels (forward, decode), not PyTorch's (sdpa)"), refused);
    assertEquals(before, Files.readString(out.resolve("gpu-check.txt")));
    String noAb = runScript(script, bundle, out, path, 2, "run", "--profile", "forward", "ab");
    assertTrue(noAb.contains("ab is a plain run's section"), noAb);
    String noAbDecode = runScript(script, bundle, out, path, 2, "run", "--sanitize", "decode", "ab-decode");
    assertTrue(noAbDecode.contains("ab-decode is a plain run's section"), noAbDecode);
    String both = runScript(script, bundle, out, path, 2, "run", "--sanitize", "--profile");
    assertTrue(both.contains("--sanitize and --profile are two different runs"), both);
    String smokeProfile = runScript(script, bundle, out, path, 2, "run", "--profile", "--smoke", "decode");
    assertTrue(smokeProfile.contains("--smoke does not apply to it"), smokeProfile);
    assertEquals(before, Files.readString(out.resolve("gpu-check.txt")));
  }

  /** Runs bin/gpu-check with the given arguments; asserts its exit status and returns its output. */
  private static String runScript(Path script, Path bundle, Path out, String path, int exit, String... args)
      throws Exception {
    Child p = Child.run(scriptRun(script, bundle, out, path, args), 60);
    assertEquals(exit, p.exit(), String.join(" ", args) + ":\n" + p.output());
    return p.output();
  }

  /** A jar of a class folder (what the bundle's kernels jar holds: classes and fatbins). */
  private static void jar(Path dir, Path jar) throws Exception {
    try (JarOutputStream out = new JarOutputStream(Files.newOutputStream(jar));
         Stream<Path> files = Files.walk(dir)) {
      for (Path f : (Iterable<Path>) files.filter(Files::isRegularFile)::iterator) {
        out.putNextEntry(new JarEntry(dir.relativize(f).toString().replace(File.separatorChar, '/')));
        Files.copy(f, (OutputStream) out);
        out.closeEntry();
      }
    }
  }
}
