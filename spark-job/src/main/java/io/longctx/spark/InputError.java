package io.longctx.spark;

import java.io.IOException;
import java.util.List;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;

/**
 * Bad input: the message names the input (file or path), the document and the position where
 * known. The launcher prints the message alone and exits with status 2.
 */
public sealed class InputError extends RuntimeException permits InputError.DuplicateKey {
  private static final long serialVersionUID = 1L;

  public InputError(String message) {
    super(message);
  }

  /**
   * A named input path that does not exist, a glob that matches nothing, and a file that Spark's
   * readers skip as hidden (a name starting with '_' or '.': the job would see no rows in it) are bad
   * input.
   */
  static void requireExists(Configuration conf, String path, String what) throws IOException {
    Path p = new Path(path);
    FileSystem fs = p.getFileSystem(conf);
    if (isGlob(path)) {
      FileStatus[] matched = fs.globStatus(p);
      if (matched == null || matched.length == 0) {
        throw new InputError(what + " " + path + ": no file or directory matches this pattern");
      }
      return;
    }
    if (!fs.exists(p)) {
      throw new InputError(what + " " + path + ": no such file or directory");
    }
    String name = p.getName();
    if ((name.startsWith("_") || name.startsWith(".")) && fs.getFileStatus(p).isFile()) {
      throw new InputError(what + " " + path + ": Spark skips files whose names start with '_' or '.' (as hidden), "
          + "so none of its rows would be read: rename the file");
    }
  }

  /**
   * Two key rows at one (doc_id, pos). Found where a chunk is assembled, after the shuffle that dropped
   * the rows' file names; the driver then looks the rows up ({@link #inFiles}) and names their files.
   */
  static final class DuplicateKey extends InputError {
    private static final long serialVersionUID = 1L;
    final String doc;
    final long pos;

    DuplicateKey(String keysPath, String doc, long pos) {
      super("KEYS " + keysPath + ": duplicate key for doc '" + doc + "' at pos " + pos + " ((doc_id, pos) must be unique)");
      this.doc = doc;
      this.pos = pos;
    }

    /** This error with the files holding the rows and their counts, as "file (n)", appended. */
    InputError inFiles(List<String> filesWithCounts) {
      return filesWithCounts.isEmpty() ? this
          : new InputError(getMessage() + "; the rows are in " + String.join(", ", filesWithCounts));
    }
  }

  /** Whether a Hadoop path is a glob pattern (holds one of * ? [ {). */
  static boolean isGlob(String path) {
    return GLOB.matcher(path).find();
  }

  private static final java.util.regex.Pattern GLOB = java.util.regex.Pattern.compile("[*?\\[{]");

  /** The InputError {@link #find} finds in {@code e} (a failed task's, say), as itself; otherwise {@code e}. */
  public static RuntimeException surfaced(RuntimeException e) {
    InputError ie = find(e);
    return ie != null && ie != e ? new InputError(ie.getMessage()) : e;
  }

  /** The first line holding {@code needle} of a failure's messages (causes and suppressed ones), or null. */
  static String causeLine(Throwable t, String needle) {
    return causeLine(t, needle, 0);
  }

  private static String causeLine(Throwable t, String needle, int depth) {
    if (t == null || depth > 20) {
      return null;
    }
    String m = t.getMessage();
    if (m != null && m.contains(needle)) {
      return m.lines().filter(l -> l.contains(needle)).findFirst().orElse(m).strip();
    }
    for (Throwable s : t.getSuppressed()) {
      String r = causeLine(s, needle, depth + 1);
      if (r != null) {
        return r;
      }
    }
    return causeLine(t.getCause(), needle, depth + 1);
  }

  /**
   * The first InputError in a cause chain (Spark wraps task failures); else, for Parquet files of one
   * input whose column types differ (Spark took the schema from one of them, which the jobs checked,
   * and a task failed reading another), a new one from Spark's line naming file and column; likewise
   * for a file among them that is not Parquet, and for a file that no longer matches its Hadoop checksum
   * file; or null.
   */
  public static InputError find(Throwable t) {
    InputError e = first(t);
    if (e != null) {
      return e;
    }
    String mismatch = causeLine(t, "PARQUET_COLUMN_DATA_TYPE_MISMATCH");
    if (mismatch != null) {
      return new InputError(mismatch.replaceFirst("^\\[[A-Z_.]+\\] *", "")
          + " (the input's Parquet files disagree on this column's type: write them with one schema)");
    }
    // Hadoop's local file system checks a file against the hidden .NAME.crc written with it: a file edited
    // since (a bad line fixed by hand) fails to read with a stack trace that says nothing of the cause.
    String checksum = causeLine(t, "Checksum error: ");
    java.util.regex.Matcher m = checksum == null ? null
        : java.util.regex.Pattern.compile("Checksum error: (.+?) at \\d+(?: exp:.*)?$").matcher(checksum); // "exp:" only for a chunk read whole
    if (m != null && m.find()) {
      org.apache.hadoop.fs.Path f = new org.apache.hadoop.fs.Path(m.group(1));
      return new InputError("file " + f + ": its bytes do not match its checksum file ." + f.getName() + ".crc beside it "
          + "(Hadoop and Spark write one; the file was changed since, e.g. edited by hand, or the disk corrupted it): "
          + "where you changed it, delete that .crc file");
    }
    // A file that is not Parquet among Parquet ones, found by the task reading it (where Spark took the
    // schema from it, Formats.load reports it before any job).
    String notParquet = causeLine(t, "is not a Parquet file");
    return notParquet == null ? null : new InputError(notParquet.replaceFirst("^\\[[A-Z_.]+\\] *", "")
        + " (a file that is not Parquet among the input's Parquet files: move it out, or start its name with '_' or"
        + " '.', which Spark skips)");
  }

  private static InputError first(Throwable t) {
    for (int i = 0; t != null && i < 50; i++, t = t.getCause()) {
      if (t instanceof InputError e) {
        return e;
      }
      for (Throwable s : t.getSuppressed()) {
        InputError e = first(s);
        if (e != null) {
          return e;
        }
      }
    }
    return null;
  }
}
