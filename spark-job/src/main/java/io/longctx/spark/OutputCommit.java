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
import java.util.Set;
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
 * OUT may not be a symbolic link, nor lie under a file.
 *
 * <p>The job writes into a hidden sibling {@code .OUT-tmp-UUID} ({@link #staging()}). {@link
 * #commit()} first checks that no input file changed since {@link #prepare} (a file replaced or
 * grown while Spark read it gives rows of two versions, or a row cut off: exit 2), then adds the
 * marker (written under a hidden name and renamed, so a marker is never partial), then: OUT absent:
 * rename staging to OUT; OUT present: rename OUT aside to {@code .OUT-old-UUID}, rename staging to
 * OUT, delete the old. Every rename refuses an existing target (a plain rename onto a directory
 * would move into it). A failed step is an error (exit 1) that leaves OUT either the old output or
 * the new one, complete: a failed move-in puts the old back. Only a process death between the two
 * renames leaves no OUT; both complete directories are then beside it, named in RELIABILITY.md.
 * {@link #commitAll} commits several outputs as one (gen's keys and queries): every OUT is moved
 * aside before any new one moves in, so a death part-way leaves outputs missing, never an old one
 * beside a new one. Atomic where renames are (local file systems, HDFS); on object stores a rename
 * is a copy and a delete, and none of this holds.
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
   * JVM halts there, as a killed driver would), {@code fail-marker} (writing the marker fails, as on
   * a full disk).
   */
  static final String FAULT_PROPERTY = "longctx.test.commitFault";

  private final FileSystem fs;
  private final FileContext fc;
  private final Path out;
  private final Path staging;
  private final String command;
  private final boolean overwrite;
  private final Configuration conf;
  private final Map<String, String> inputs;
  /** Every input file's length and modification time at {@link #prepare}, checked again at commit. */
  private Map<Path, InputFile> inputFiles = Map.of();
  /** OUT's nearest ancestor that existed at {@link #prepare}: a failed run removes the empty folders below it. */
  private Path existingAncestor;

  private OutputCommit(FileSystem fs, FileContext fc, Path out, String command, boolean overwrite, Configuration conf,
      Map<String, String> inputs) {
    this.fs = fs;
    this.fc = fc;
    this.out = out;
    this.command = command;
    this.overwrite = overwrite;
    this.conf = conf;
    this.inputs = inputs;
    this.staging = new Path(out.getParent(), "." + out.getName() + "-tmp-" + UUID.randomUUID());
  }

  /**
   * Takes a local {@code --dir} into which {@code command} writes files by fixed names (demo's
   * keys.parquet and scores.parquet, spark-bench's prefill-out.parquet) and replaces them on a re-run:
   * made if missing, or an empty directory, or one this command marked on an earlier run (a marker
   * file {@code .longctx-COMMAND}). A directory holding anything else is refused, since a user's
   * outputs of the same names would be replaced. {@code create} false: only checks, before a session
   * starts (a session that failed to start left the folder and its marker behind); true: also makes it
   * and marks it, once the session runs.
   */
  static void claimWorkDir(java.nio.file.Path dir, String command, boolean create) throws IOException {
    java.nio.file.Path marker = dir.resolve(".longctx-" + command);
    if (Files.exists(dir) && !Files.isDirectory(dir)) {
      throw new InputError("--dir " + dir + " exists and is not a directory");
    }
    if (Files.isDirectory(dir) && !Files.exists(marker)) {
      try (java.util.stream.Stream<java.nio.file.Path> s = Files.list(dir)) {
        List<String> names = s.map(p -> p.getFileName().toString()).sorted().limit(4).toList();
        if (!names.isEmpty()) {
          throw new InputError("--dir " + dir + " holds files " + command + " did not make (" + String.join(", ", names)
              + (names.size() == 4 ? ", ..." : "") + "): give a new or empty directory (a re-run may use the one "
              + command + " made)");
        }
      }
    }
    if (create) {
      Files.createDirectories(dir);
      Files.writeString(marker, "made by longctx " + command + ": a re-run replaces its outputs here\n");
    }
  }

  /** An input file as listed: its input's label ("KEYS"), length and modification time. */
  record InputFile(String label, long length, long modified) {}

  /**
   * Checks OUT against the rules above before any work is done; {@code inputs} maps a label
   * ("KEYS") to a path (globs allowed). Throws {@link InputError} naming OUT and what is wrong.
   */
  public static OutputCommit prepare(Configuration conf, String output, boolean overwrite, String command,
      Map<String, String> inputs) throws IOException {
    Path p = hadoopPath("output", output);
    FileSystem fs = p.getFileSystem(conf);
    Path out = fs.makeQualified(p);
    if (out.getParent() == null) {
      throw new InputError("output " + out + " is a file system root: give a directory to create");
    }
    if (out.getName().contains(":")) { // the staging and set-aside folders are named after it, and Hadoop reads
      throw new InputError("output " + output + ": a ':' in its name, which Hadoop reads as a URI scheme in the "
          + "folders named after it: rename it"); // "x:y-tmp-..." as a scheme and fails
    }
    String outReal = realPath(fs, out);
    for (Map.Entry<String, String> in : inputs.entrySet()) {
      if (in.getValue() == null) {
        continue;
      }
      Path given = hadoopPath(in.getKey(), in.getValue());
      FileSystem inFs = given.getFileSystem(conf);
      if (!sameFileSystem(inFs.makeQualified(given), out)) {
        continue; // cannot overlap
      }
      // A glob is the paths it matches now (its folder above the pattern, compared before, took a glob in
      // the first name, c[1]/keys, as the whole working directory); a path matched later is never read.
      List<Path> paths = new ArrayList<>();
      FileStatus[] matched = InputError.isGlob(in.getValue()) ? glob(inFs, given, in.getKey(), in.getValue()) : null;
      if (matched == null) {
        paths.add(inFs.makeQualified(given));
      } else {
        for (FileStatus m : matched) {
          paths.add(m.getPath());
        }
      }
      for (Path ip : paths) {
        String inReal = realPath(fs, ip);
        if (inReal.equals(outReal) || inReal.startsWith(slash(outReal)) || outReal.startsWith(slash(inReal))) {
          throw new InputError("output " + out + (inReal.equals(outReal) ? " is " : inReal.startsWith(slash(outReal))
              ? " contains " : " is inside ") + in.getKey() + " " + in.getValue() + ": choose an output directory apart "
              + "from the inputs");
        }
      }
    }
    if ("file".equals(out.toUri().getScheme())) {
      java.nio.file.Path local = java.nio.file.Path.of(out.toUri());
      if (Files.isSymbolicLink(local)) { // a rename would replace the link, not what it points to
        throw new InputError("output " + out + " is a symbolic link (to " + Files.readSymbolicLink(local) + "): longctx "
            + "neither writes through nor replaces a link; give the path it points to, or another");
      }
    }
    Path existing = null;
    for (Path a = out.getParent(); a != null; a = a.getParent()) { // the nearest existing ancestor
      FileStatus st;
      try {
        st = fs.getFileStatus(a);
      } catch (FileNotFoundException e) {
        continue;
      }
      if (!st.isDirectory()) {
        throw new InputError("output " + out + " lies under " + a + ", which is a file: give a path in a directory");
      }
      existing = a;
      break;
    }
    OutputCommit c = new OutputCommit(fs, FileContext.getFileContext(out.toUri(), conf), out, command, overwrite, conf,
        inputs);
    c.existingAncestor = existing;
    c.checkReplaceable();
    c.inputFiles = listInputs(conf, inputs); // after the cheap refusals: a listing can take long
    return c;
  }

  /**
   * A command-line path as a Hadoop Path, or bad input naming it: Hadoop reads a name with a ':' in it
   * ("m o:d") as a URI and fails with a bare URISyntaxException.
   */
  static Path hadoopPath(String what, String path) {
    try {
      return new Path(path);
    } catch (IllegalArgumentException e) {
      throw unusable(what, path, e);
    }
  }

  /** {@code fs.globStatus(p)}; a name on the way Hadoop cannot take ("m o:d") is bad input naming the argument. */
  private static FileStatus[] glob(FileSystem fs, Path p, String what, String given) throws IOException {
    try {
      return fs.globStatus(p);
    } catch (IllegalArgumentException e) { // the glob walks the path a name at a time and fails there
      throw unusable(what, given, e);
    }
  }

  private static InputError unusable(String what, String path, IllegalArgumentException e) {
    return new InputError(what + " " + path + ": Hadoop cannot take this path (" + (e.getCause() != null ? e.getCause()
        : e).getMessage() + "; a ':' in a file or folder name reads as a URI scheme): rename it");
  }

  /**
   * The files each input names (a file, a directory read recursively, or a glob), as Spark reads
   * them: the names Spark does not read are skipped by Spark's own rule. An input absent now is left
   * to the reader to report.
   */
  private static Map<Path, InputFile> listInputs(Configuration conf, Map<String, String> inputs) throws IOException {
    Map<Path, InputFile> files = new java.util.LinkedHashMap<>();
    for (Map.Entry<String, String> in : inputs.entrySet()) {
      if (in.getValue() == null) {
        continue;
      }
      Path p = hadoopPath(in.getKey(), in.getValue());
      FileSystem fs = p.getFileSystem(conf);
      FileStatus[] matches = glob(fs, p, in.getKey(), in.getValue());
      if (matches == null) {
        continue;
      }
      boolean glob = InputError.isGlob(in.getValue());
      for (FileStatus m : matches) {
        if (glob && org.apache.spark.util.HadoopFSUtils.shouldFilterOutPathName(m.getPath().getName())) {
          continue; // Spark reads no such match of a glob either
        }
        if (m.isDirectory()) {
          org.apache.hadoop.fs.RemoteIterator<org.apache.hadoop.fs.LocatedFileStatus> it = fs.listFiles(m.getPath(), true);
          while (it.hasNext()) {
            FileStatus f = it.next();
            if (!hiddenBelow(m.getPath(), f.getPath())) {
              files.put(f.getPath(), new InputFile(in.getKey(), f.getLen(), f.getModificationTime()));
            }
          }
        } else {
          files.put(m.getPath(), new InputFile(in.getKey(), m.getLen(), m.getModificationTime()));
        }
      }
    }
    return files;
  }

  /** Whether a name on the path below top down to f is one Spark does not read (hidden, _temporary, ._COPYING_). */
  private static boolean hiddenBelow(Path top, Path f) {
    for (Path p = f; p != null && !p.equals(top); p = p.getParent()) {
      if (org.apache.spark.util.HadoopFSUtils.shouldFilterOutPathName(p.getName())) {
        return true;
      }
    }
    return false;
  }

  /**
   * Refuses input {@code label} (as given to {@link #prepare}) where its listing there holds a file
   * that Spark's reader of it will not read ({@code read}: the reader's {@code inputFiles()}): Spark
   * reads the files directly in a folder given and those in key=value partition folders below it, and
   * leaves out other subfolders' files without a word, so a document's keys there were missing from
   * its answer.
   */
  public void requireAllRead(String label, String path, String[] read) {
    Set<String> seen = new java.util.HashSet<>();
    for (String f : read) { // URIs (a space is %20): decoded, as the listing's paths are
      Path p;
      try {
        p = new Path(java.net.URI.create(f));
      } catch (IllegalArgumentException e) {
        p = new Path(f);
      }
      seen.add(Path.getPathWithoutSchemeAndAuthority(p).toString());
    }
    for (Map.Entry<Path, InputFile> e : inputFiles.entrySet()) {
      if (e.getValue().label().equals(label)
          && !seen.contains(Path.getPathWithoutSchemeAndAuthority(e.getKey()).toString())) {
        throw new InputError(label + " " + path + ": " + e.getKey() + " would not be read: Spark reads the files "
            + "directly in a folder given, and in key=value partition folders below it, but not those of other "
            + "subfolders: move the file up into the folder given, or the folder's other files down beside it");
      }
    }
  }

  /**
   * Throws {@link InputError} naming the first input file listed at {@link #prepare} that disappeared
   * or changed in length or modification time since: the job may have read parts of two versions. A
   * file that appeared is not a change (Spark lists an input once per read, before reading it: a
   * directory that keeps receiving files is read as it was then).
   */
  private void checkInputsUnchanged() throws IOException {
    Map<Path, InputFile> now = listInputs(conf, inputs);
    String what = null;
    for (Map.Entry<Path, InputFile> e : inputFiles.entrySet()) {
      InputFile later = now.get(e.getKey());
      InputFile was = e.getValue();
      if (later == null) {
        what = was.label() + " file " + e.getKey() + " disappeared";
      } else if (!later.equals(was)) {
        what = was.label() + " file " + e.getKey() + " changed (" + was.length() + " bytes, modified "
            + Instant.ofEpochMilli(was.modified()) + ", then " + later.length() + " bytes, modified "
            + Instant.ofEpochMilli(later.modified()) + ")";
      }
      if (what != null) {
        break;
      }
    }
    if (what == null) {
      return;
    }
    throw new InputError(what + " while the job ran: the result could mix two versions of the input, so nothing was "
        + "written" + (fs.exists(out) ? " (" + out + " is unchanged)" : "") + "; run again once the input is stable");
  }

  /**
   * Writes a result with Spark into the staging directory and commits it. When the write fails, the
   * job's other tasks are given time to end first (a failed job's running tasks are killed
   * asynchronously and may still create files), then the staging directory is deleted.
   */
  public void write(SparkSession spark, DataFrameWriter<Row> writer) throws IOException {
    stage(spark, writer);
    commit();
  }

  private Thread stagingHook;

  /**
   * Until the commit starts, a JVM shut down mid-write (Ctrl-C, SIGTERM) deletes the staging folder
   * ({@link #abort}): an interrupted gen left 1.2 GB of it. Best effort: Spark's own shutdown stops
   * the tasks writing there at the same time.
   */
  private synchronized void armStagingHook() {
    if (stagingHook == null) {
      stagingHook = new Thread(this::abort, "longctx-staging-cleanup");
      Runtime.getRuntime().addShutdownHook(stagingHook);
    }
  }

  private synchronized void disarmStagingHook() {
    if (stagingHook != null) {
      try {
        Runtime.getRuntime().removeShutdownHook(stagingHook);
      } catch (IllegalStateException e) {
        // the JVM is shutting down: this is the hook running, or it runs anyway
      }
      stagingHook = null;
    }
  }

  /** The first half of {@link #write}: the result written into the staging directory, not yet committed. */
  public void stage(SparkSession spark, DataFrameWriter<Row> writer) throws IOException {
    armStagingHook();
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
    commitAll(List.of(this));
  }

  /**
   * Commits staged outputs as one: each is checked and marked; then every OUT that exists is moved
   * aside; then every staged result moved in; then the old outputs deleted. A failed step moves
   * back what it had moved (exit 1, the old outputs in place); a process death part-way leaves some
   * OUTs missing and their complete old and new copies beside them, never an old output with a new one.
   */
  public static void commitAll(List<OutputCommit> outs) throws IOException {
    for (OutputCommit o : outs) {
      o.disarmStagingHook(); // from here an interrupt leaves what the commit protocol says, never a deleted result
    }
    try {
      for (OutputCommit o : outs) {
        o.checkInputsUnchanged();
        o.writeMarker();
      }
    } catch (IOException | RuntimeException e) {
      outs.forEach(OutputCommit::abort);
      throw e;
    }
    String fault = System.getProperty(FAULT_PROPERTY, "");
    Map<OutputCommit, Path> asides = new java.util.LinkedHashMap<>();
    try {
      for (OutputCommit o : outs) {
        if (o.fs.exists(o.out)) {
          o.checkReplaceable(); // again: OUT may have changed while the job ran
          Path aside = new Path(o.out.getParent(), "." + o.out.getName() + "-old-" + UUID.randomUUID());
          o.moveNoReplace(o.out, aside, "could not move the previous output " + o.out + " aside to " + aside
              + "; it is unchanged");
          asides.put(o, aside);
        }
      }
    } catch (IOException | RuntimeException e) {
      try {
        restore(asides);
      } catch (IOException restore) {
        e.addSuppressed(restore);
        throw new IOException(e.getMessage() + "; and an output moved aside could not be put back: "
            + whereEach(outs, asides), e);
      }
      outs.forEach(OutputCommit::abort);
      throw e;
    }
    if (fault.equals("halt-after-aside")) {
      Runtime.getRuntime().halt(137);
    }
    List<OutputCommit> movedIn = new ArrayList<>();
    try {
      for (OutputCommit o : outs) {
        if (!asides.isEmpty() && (fault.equals("fail-after-aside") || fault.equals("fail-restore"))) {
          throw new IOException("injected test failure (" + FAULT_PROPERTY + "=" + fault + ") moving " + o.staging
              + " to " + o.out);
        }
        o.moveNoReplace(o.staging, o.out, "could not move the result " + o.staging + " to " + o.out);
        movedIn.add(o);
      }
    } catch (IOException | RuntimeException failed) {
      IOException moveIn = failed instanceof IOException io ? io : new IOException(failed.toString(), failed);
      try {
        for (int k = movedIn.size() - 1; k >= 0; k--) {
          movedIn.get(k).moveNoReplace(movedIn.get(k).out, movedIn.get(k).staging, "take back");
        }
        if (fault.equals("fail-restore")) {
          throw new IOException("injected test failure (" + FAULT_PROPERTY + "=" + fault + ") restoring "
              + asides.keySet().iterator().next().out);
        }
        restore(asides);
      } catch (IOException restore) {
        IOException e = new IOException("could not replace " + String.join(", ", outs.stream().map(o -> o.out.toString())
            .toList()) + " (" + moveIn.getMessage() + ") nor restore " + (outs.size() == 1 ? "it" : "them") + " ("
            + restore.getMessage() + "): " + whereEach(outs, asides), moveIn);
        e.addSuppressed(restore);
        throw e;
      }
      outs.forEach(OutputCommit::abort);
      throw new IOException(moveIn.getMessage() + (asides.isEmpty() ? ""
          : "; the previous output is back in " + String.join(", ", asides.keySet().stream().map(o -> o.out.toString())
              .toList())), moveIn);
    }
    List<Path> stuck = new ArrayList<>();
    for (Map.Entry<OutputCommit, Path> a : asides.entrySet()) {
      boolean deleted;
      try {
        deleted = a.getKey().fs.delete(a.getValue(), true);
      } catch (IOException e) {
        deleted = false;
      }
      if (!deleted && a.getKey().fs.exists(a.getValue())) {
        stuck.add(a.getValue());
      }
    }
    if (!stuck.isEmpty()) {
      throw new IOException(outs.stream().map(o -> o.out.toString()).toList() + " hold" + (outs.size() == 1 ? "s" : "")
          + " the new result, complete, but the previous output moved aside to " + stuck
          + " could not be deleted: delete it yourself");
    }
  }

  /** Moves each output set aside back to its OUT. */
  private static void restore(Map<OutputCommit, Path> asides) throws IOException {
    for (Map.Entry<OutputCommit, Path> a : asides.entrySet()) {
      a.getKey().moveNoReplace(a.getValue(), a.getKey().out, "restore");
    }
  }

  /** For a commit stuck half-way: where each output's complete previous and new copies are now. */
  private static String whereEach(List<OutputCommit> outs, Map<OutputCommit, Path> asides) throws IOException {
    List<String> r = new ArrayList<>();
    for (OutputCommit o : outs) {
      Path old = asides.get(o);
      String oldAt = old != null && o.fs.exists(old) ? old.toString() : null;
      String newAt = o.fs.exists(o.staging) ? o.staging.toString() : o.out.toString();
      r.add((oldAt != null ? "the previous output of " + o.out + " is complete in " + oldAt + ", " : "")
          + "the new result complete in " + newAt);
    }
    return String.join("; ", r) + "; move one of each to its OUT";
  }

  /** The marker, written under a hidden name and renamed: a full disk or a death leaves no partial marker. */
  private void writeMarker() throws IOException {
    Path writing = new Path(staging, "." + MARKER + "-writing");
    try {
      try (OutputStream m = fs.create(writing, false)) {
        if (System.getProperty(FAULT_PROPERTY, "").equals("fail-marker")) {
          throw new IOException("injected test failure (" + FAULT_PROPERTY + "=fail-marker)");
        }
        m.write(("longctx " + command + " output\nwritten " + Instant.now() + "\n").getBytes(StandardCharsets.UTF_8));
      }
      if (!fs.rename(writing, new Path(staging, MARKER))) {
        throw new IOException("renaming " + writing + " failed");
      }
    } catch (IOException e) {
      abort();
      throw new IOException("could not write the marker " + MARKER + " of " + out + " (" + e.getMessage()
          + "): the result is deleted" + (fs.exists(out) ? " and " + out + " is unchanged" : ""), e);
    }
  }

  /**
   * Deletes the staging directory after a failed job (ours alone: a random name made by this run),
   * then the folders above it that did not exist at {@link #prepare} and are empty now (made for OUT
   * by the write; a folder that holds anything is left, whoever made it).
   */
  public void abort() {
    disarmStagingHook();
    try {
      if (fs.exists(staging)) {
        fs.delete(staging, true);
      }
      for (Path a = out.getParent(); a != null && existingAncestor != null && !a.equals(existingAncestor);
          a = a.getParent()) {
        FileStatus[] left = fs.exists(a) ? fs.listStatus(a) : null;
        if (left == null || left.length > 0 || !fs.delete(a, false)) {
          break;
        }
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
}
