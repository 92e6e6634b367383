package io.longctx.spark;

import java.io.FileNotFoundException;
import java.io.IOException;
import java.io.OutputStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.time.Instant;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.UUID;
import java.util.regex.Pattern;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FileContext;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Options;
import org.apache.hadoop.fs.Path;
import org.apache.spark.sql.DataFrameWriter;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.SparkSession;

/**
 * The one way a command's result becomes its output directory OUT (score, gen, ppl).
 *
 * <p>Before any work ({@link #prepare}): OUT may not be, contain or sit inside an input (compared
 * by real path); an existing OUT is replaced only with {@code --overwrite} and only if it is a
 * longctx output: a directory holding the {@value #MARKER} marker and nothing but the files a
 * Spark write and this class make. Anything else is refused (exit 2) and left untouched.
 *
 * <p>The job writes into a hidden sibling {@code .OUT-tmp-UUID} ({@link #staging()}). {@link
 * #commit()} adds the marker, then: OUT absent: rename staging to OUT; OUT present: rename OUT
 * aside to {@code .OUT-old-UUID}, rename staging to OUT, delete the old. Every rename refuses an
 * existing target (a plain rename onto a directory would move into it). A failed step is an error
 * (exit 1) that leaves OUT either the old output or the new one, complete: a failed move-in puts
 * the old back. Only a process death between the two renames leaves no OUT; both complete
 * directories are then beside it, named in RELIABILITY.md. Atomic where renames are (local file
 * systems, HDFS); on object stores a rename is a copy and a delete, and none of this holds.
 */
public final class OutputCommit {

  /** Marks a directory as a complete longctx output; written last into the staging directory. */
  public static final String MARKER = "_LONGCTX";

  /**
   * Files a longctx output may hold: Spark's parts (part-NNNNN-UUID-cNNN and an extension, as Spark
   * names them: a user's "part-notes.txt" is not one), _SUCCESS, our marker, their checksums.
   */
  static final Pattern OWN_FILE = Pattern.compile("\\.?(part-\\d{5,}-\\p{XDigit}{8}(-\\p{XDigit}{4}){3}-\\p{XDigit}{12}"
      + "(-c\\d{3})?(\\.[A-Za-z0-9]+)*|_SUCCESS|" + MARKER + ")(\\.crc)?");

  /**
   * TEST-ONLY: a JVM system property (never a Spark --conf) naming a failure to inject in {@link
   * #commit()}: {@code fail-after-aside} (the move-in fails after OUT was moved aside),
   * {@code fail-restore} (the move-in and the move back both fail), {@code halt-after-aside} (the
   * JVM halts there, as a killed driver would).
   */
  static final String FAULT_PROPERTY = "longctx.test.commitFault";

  private final FileSystem fs;
  private final FileContext fc;
  private final Path out;
  private final Path staging;
  private final String command;
  private final boolean overwrite;

  private OutputCommit(FileSystem fs, FileContext fc, Path out, String command, boolean overwrite) {
    this.fs = fs;
    this.fc = fc;
    this.out = out;
    this.command = command;
    this.overwrite = overwrite;
    this.staging = new Path(out.getParent(), "." + out.getName() + "-tmp-" + UUID.randomUUID());
  }

  /**
   * Checks OUT against the rules above before any work is done; {@code inputs} maps a label
   * ("KEYS") to a path (globs allowed). Throws {@link InputError} naming OUT and what is wrong.
   */
  public static OutputCommit prepare(Configuration conf, String output, boolean overwrite, String command,
      Map<String, String> inputs) throws IOException {
    Path p = new Path(output);
    FileSystem fs = p.getFileSystem(conf);
    Path out = fs.makeQualified(p);
    if (out.getParent() == null) {
      throw new InputError("output " + out + " is a file system root: give a directory to create");
    }
    String outReal = realPath(fs, out);
    for (Map.Entry<String, String> in : inputs.entrySet()) {
      if (in.getValue() == null) {
        continue;
      }
      Path raw = globFree(new Path(in.getValue()));
      Path ip = raw.getFileSystem(conf).makeQualified(raw);
      if (!sameFileSystem(ip, out)) {
        continue; // cannot overlap
      }
      String inReal = realPath(fs, ip);
      if (inReal.equals(outReal) || inReal.startsWith(slash(outReal)) || outReal.startsWith(slash(inReal))) {
        throw new InputError("output " + out + (inReal.equals(outReal) ? " is " : inReal.startsWith(slash(outReal))
            ? " contains " : " is inside ") + in.getKey() + " " + in.getValue() + ": choose an output directory apart from the inputs");
      }
    }
    OutputCommit c = new OutputCommit(fs, FileContext.getFileContext(out.toUri(), conf), out, command, overwrite);
    c.checkReplaceable();
    return c;
  }

  /**
   * Writes a result with Spark into the staging directory and commits it. When the write fails, the
   * job's other tasks are given time to end first (a failed job's running tasks are killed
   * asynchronously and may still create files), then the staging directory is deleted.
   */
  public void write(SparkSession spark, DataFrameWriter<Row> writer) throws IOException {
    try {
      writer.save(staging.toString());
    } catch (Throwable e) { // also Spark's SparkException, checked to Java but undeclared by Scala
      long deadline = System.nanoTime() + 60_000_000_000L;
      while (spark.sparkContext().statusTracker().getActiveStageIds().length > 0 && System.nanoTime() < deadline) {
        try {
          Thread.sleep(20);
        } catch (InterruptedException ie) {
          Thread.currentThread().interrupt();
          break;
        }
      }
      abort();
      throw e;
    }
    commit();
  }

  /**
   * A hidden sibling of OUT for a run's scratch data ({@code .OUT-tmp-UUID-name}, the staging
   * directory's name plus a suffix): not created here; the caller that creates it deletes it.
   */
  public Path scratch(String name) {
    return new Path(staging.getParent(), staging.getName() + "-" + name);
  }

  /** Where the job writes its result; becomes OUT on {@link #commit()}. */
  public Path staging() {
    return staging;
  }

  public Path output() {
    return out;
  }

  /** OUT absent, or (with --overwrite) a longctx output of our own files only; else InputError. */
  private void checkReplaceable() throws IOException {
    FileStatus st;
    try {
      st = fs.getFileStatus(out);
    } catch (FileNotFoundException e) {
      return;
    }
    if (!overwrite) {
      throw new InputError("output " + out + " exists: refusing to overwrite it (pass --overwrite to replace a "
          + "previous longctx output)");
    }
    if (!st.isDirectory()) {
      throw new InputError("output " + out + " is a file, not a longctx output directory: refusing to replace it");
    }
    if (!fs.exists(new Path(out, MARKER))) {
      throw new InputError("output " + out + " is not a longctx output (no " + MARKER + " marker): refusing to "
          + "replace it, even with --overwrite");
    }
    for (FileStatus f : fs.listStatus(out)) {
      if (f.isDirectory() || !OWN_FILE.matcher(f.getPath().getName()).matches()) {
        throw new InputError("output " + out + " holds " + (f.isDirectory() ? "a directory" : "a file") + " longctx did "
            + "not write (" + f.getPath().getName() + "): refusing to replace it, even with --overwrite");
      }
    }
  }

  /**
   * Makes the staged result OUT; see the class comment. Throws IOException (exit 1) on a failed
   * step, having deleted the staging directory unless it is the only complete copy of the result.
   */
  public void commit() throws IOException {
    try (OutputStream m = fs.create(new Path(staging, MARKER), false)) {
      m.write(("longctx " + command + " output\nwritten " + Instant.now() + "\n").getBytes(StandardCharsets.UTF_8));
    }
    if (!fs.exists(out)) {
      try {
        moveNoReplace(staging, out, "could not move the result " + staging + " to " + out);
      } catch (IOException e) {
        abort(); // OUT (if it appeared meanwhile) is not ours to touch
        throw e;
      }
      return;
    }
    Path aside = new Path(out.getParent(), "." + out.getName() + "-old-" + UUID.randomUUID());
    try {
      checkReplaceable(); // again: OUT may have changed while the job ran
      moveNoReplace(out, aside, "could not move the previous output " + out + " aside to " + aside
          + "; it is unchanged");
    } catch (IOException | RuntimeException e) {
      abort();
      throw e;
    }
    String fault = System.getProperty(FAULT_PROPERTY, "");
    if (fault.equals("halt-after-aside")) {
      Runtime.getRuntime().halt(137);
    }
    try {
      if (!fault.isEmpty()) {
        throw new IOException("injected test failure (" + FAULT_PROPERTY + "=" + fault + ") moving " + staging + " to "
            + out);
      }
      moveNoReplace(staging, out, "could not move the result " + staging + " to " + out);
    } catch (IOException moveIn) {
      try {
        if (fault.equals("fail-restore")) {
          throw new IOException("injected test failure (" + FAULT_PROPERTY + "=" + fault + ") restoring " + out);
        }
        moveNoReplace(aside, out, "restore");
      } catch (IOException restore) {
        IOException e = new IOException("could not replace " + out + " (" + moveIn.getMessage() + ") nor restore it ("
            + restore.getMessage() + "): the previous output is complete in " + aside + ", the new result complete in "
            + staging + "; move one of them to " + out, moveIn);
        e.addSuppressed(restore);
        throw e;
      }
      abort();
      throw new IOException(moveIn.getMessage() + "; the previous output is back in " + out, moveIn);
    }
    boolean deleted;
    try {
      deleted = fs.delete(aside, true);
    } catch (IOException e) {
      deleted = false;
    }
    if (!deleted && fs.exists(aside)) {
      throw new IOException(out + " holds the new result, complete, but the previous output moved aside to " + aside
          + " could not be deleted: delete it yourself");
    }
  }

  /** Deletes the staging directory after a failed job: ours alone (a random name made by this run). */
  public void abort() {
    try {
      if (fs.exists(staging)) {
        fs.delete(staging, true);
      }
    } catch (IOException e) {
      // best effort: a hidden staging directory without a marker is documented as safe to delete
    }
  }

  /** A rename that fails, instead of moving into it, when the target exists. */
  private void moveNoReplace(Path from, Path to, String what) throws IOException {
    try {
      fc.rename(from, to, Options.Rename.NONE);
    } catch (IOException e) {
      throw new IOException(what + ": " + e, e);
    }
  }

  /**
   * Whether {@code dir} is {@code top} or lies inside it, both qualified on their file systems and,
   * where those have them (local), with symbolic links resolved: the same comparison {@link #prepare}
   * makes between OUT and its inputs.
   */
  static boolean within(Configuration conf, String dir, String top) throws IOException {
    Path d = new Path(dir), t = new Path(top);
    FileSystem fs = t.getFileSystem(conf);
    d = d.getFileSystem(conf).makeQualified(d);
    t = fs.makeQualified(t);
    if (!sameFileSystem(d, t)) {
      return false;
    }
    String dReal = realPath(fs, d), tReal = realPath(fs, t);
    return dReal.equals(tReal) || dReal.startsWith(slash(tReal));
  }

  private static boolean sameFileSystem(Path a, Path b) {
    return java.util.Objects.equals(a.toUri().getScheme(), b.toUri().getScheme())
        && java.util.Objects.equals(a.toUri().getAuthority(), b.toUri().getAuthority());
  }

  /** The path with symbolic links resolved where the file system has them (local), else as given. */
  private static String realPath(FileSystem fs, Path p) throws IOException {
    if (!"file".equals(p.toUri().getScheme())) {
      return p.toUri().getPath().replaceAll("/+$", "");
    }
    java.nio.file.Path local = java.nio.file.Path.of(p.toUri()).toAbsolutePath().normalize();
    List<String> tail = new ArrayList<>();
    while (local != null && !Files.exists(local)) { // resolve the part that exists, keep the rest
      tail.add(0, local.getFileName().toString());
      local = local.getParent();
    }
    java.nio.file.Path real = local == null ? java.nio.file.Path.of("/") : local.toRealPath();
    for (String t : tail) {
      real = real.resolve(t);
    }
    return real.toString().replaceAll("/+$", "");
  }

  private static String slash(String p) {
    return p.endsWith("/") ? p : p + "/";
  }

  /** The longest leading part of a path without glob characters (the directory a glob reads from). */
  private static Path globFree(Path p) {
    Path q = p;
    while (q != null && InputError.isGlob(q.toString())) {
      q = q.getParent();
    }
    return q == null ? p : q;
  }
}
