package io.longctx.kernels;

import static org.junit.jupiter.api.Assertions.fail;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.concurrent.TimeUnit;

/**
 * A child process of a test, run to its end or killed at a time limit. Its output goes to a file,
 * not a pipe read before the wait: a hung child (an emulated kernel that deadlocks, a JVM that
 * never exits) then fails the test at the limit with what it printed, instead of blocking the
 * build on a read that no timeout interrupts.
 */
record Child(int exit, String output) {

  /** Runs {@code pb} (stderr merged into stdout); fails the test if it has not ended in {@code seconds}. */
  static Child run(ProcessBuilder pb, int seconds) throws IOException, InterruptedException {
    Path log = Files.createTempFile("longctx-child", ".log");
    try {
      Process p = pb.redirectErrorStream(true).redirectOutput(log.toFile()).start();
      if (!p.waitFor(seconds, TimeUnit.SECONDS)) {
        p.descendants().forEach(ProcessHandle::destroyForcibly);
        p.destroyForcibly();
        p.waitFor(10, TimeUnit.SECONDS);
        fail(String.join(" ", pb.command()) + "\ndid not end in " + seconds + " s (killed); its output:\n" + read(log));
      }
      return new Child(p.exitValue(), read(log));
    } finally {
      Files.deleteIfExists(log);
    }
  }

  private static String read(Path log) throws IOException {
    return new String(Files.readAllBytes(log), StandardCharsets.UTF_8);
  }
}
