package io.longctx.kernels;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.Locale;
import jcuda.driver.CUresult;
import jcuda.driver.JCudaDriver;

/**
 * Where a GPU check section ({@link GpuCheck}, {@link GpuDecodeCheck}) puts its rows: each line is
 * printed and appended to the results file ({@code $OUT/gpu-check.txt} when OUT is set, else
 * {@code ./gpu-check.txt}) the moment it is made, so a crash, a hung kernel killed by the section's
 * time limit or a lost device keeps every row made before it. Counts verdicts for the summary and
 * the exit status; remembers when a sticky CUDA error ended the section.
 */
final class CheckReport {

  private final String section;
  private final Path file;
  private boolean fileBroken;
  private int pass;
  private int fail;
  private int error;
  private String stopped;

  CheckReport(String section) {
    this(section, resultsFile());
  }

  CheckReport(String section, Path file) {
    this.section = section;
    this.file = file;
  }

  /** $OUT/gpu-check.txt when OUT is set, else gpu-check.txt in the working directory (as bin/gpu-check). */
  static Path resultsFile() {
    String out = System.getenv("OUT");
    return out != null && !out.isEmpty() ? Path.of(out, "gpu-check.txt") : Path.of("gpu-check.txt");
  }

  /** A line without a verdict (headings, table heads, timing rows). */
  void line(String text) {
    System.out.println(text);
    System.out.flush();
    if (!fileBroken) {
      try {
        Files.writeString(file, text + "\n", StandardCharsets.UTF_8, StandardOpenOption.CREATE,
            StandardOpenOption.APPEND);
      } catch (IOException e) {
        fileBroken = true; // stdout still has every row
        System.err.println("gpu-check: cannot append to " + file + ": " + e + "; rows go to stdout only");
      }
    }
  }

  /** A row with a pass/FAIL verdict already in its text. */
  void row(String text, boolean ok) {
    if (ok) {
      pass++;
    } else {
      fail++;
    }
    line(text);
  }

  /** A row for a case that threw: the text should end in {@link #errorText}. */
  void errorRow(String text) {
    error++;
    line(text);
  }

  /** "ERROR: Type: message" on one line, safe inside a markdown table cell. */
  static String errorText(Throwable e) {
    String msg = e.getMessage() == null ? "" : ": " + e.getMessage();
    return ("ERROR: " + e.getClass().getSimpleName() + msg).replace('\n', ' ').replace('|', '/');
  }

  /**
   * Null when CUDA can still be used after {@code e}, else why not: a sticky error (see
   * {@link CudaAttention.CudaException#sticky}), or a context that no longer synchronizes.
   */
  static String contextLost(Throwable e) {
    for (Throwable t = e; t != null; t = t.getCause()) {
      if (t instanceof CudaAttention.CudaException ce && ce.sticky()) {
        return "sticky CUDA error " + CUresult.stringFor(ce.code());
      }
    }
    if (!(e instanceof CudaAttention.CudaException)) {
      return null; // not a CUDA failure (validation, Java heap): the context is untouched
    }
    try {
      int rc = JCudaDriver.cuCtxSynchronize();
      return rc == CUresult.CUDA_SUCCESS ? null : "the context no longer synchronizes: " + CUresult.stringFor(rc);
    } catch (Throwable t) {
      return "the context cannot be queried: " + t;
    }
  }

  /** "CUDA driver 13.0" (the driver's own version, beside nvidia-smi's in the header); asked after the probe succeeded. */
  static String driver() {
    int[] v = new int[1];
    try {
      return JCudaDriver.cuDriverGetVersion(v) == CUresult.CUDA_SUCCESS
          ? "CUDA driver " + v[0] / 1000 + "." + v[0] % 1000 / 10 : "CUDA driver version unknown";
    } catch (Throwable t) {
      return "CUDA driver version unknown (" + t + ")";
    }
  }

  /** Ends the section: later cases are not run; says so in the results. */
  void stop(String reason) {
    stopped = reason;
    line("");
    line(section + " section stopped: " + reason + "; the rest of this section did not run"
        + " (a new process gets a new context: the other sections run)");
  }

  boolean stopped() {
    return stopped != null;
  }

  int failures() {
    return fail + error;
  }

  /** The summary line (bin/gpu-check collects these) and the exit status: 0 when every row passed. */
  int finish() {
    line("");
    line(String.format(Locale.ROOT, "summary %s: %d pass, %d FAIL, %d ERROR%s -> %s", section, pass, fail, error,
        stopped != null ? ", stopped early" : "", failures() == 0 && stopped == null ? "ok" : "FAILED"));
    return failures() == 0 && stopped == null ? 0 : 1;
  }
}
