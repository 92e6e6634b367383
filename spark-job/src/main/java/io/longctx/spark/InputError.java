package io.longctx.spark;

import java.io.IOException;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;

/**
 * Bad input: the message names the input (file or path), the document and the position where
 * known. The launcher prints the message alone and exits with status 2.
 */
public final class InputError extends RuntimeException {
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

  /** Whether a Hadoop path is a glob pattern (holds one of * ? [ {). */
  static boolean isGlob(String path) {
    return GLOB.matcher(path).find();
  }

  private static final java.util.regex.Pattern GLOB = java.util.regex.Pattern.compile("[*?\\[{]");

  /** An InputError wrapped in {@code e} (a failed task's), as itself; otherwise {@code e}. */
  public static RuntimeException surfaced(RuntimeException e) {
    InputError ie = find(e);
    return ie != null && ie != e ? new InputError(ie.getMessage()) : e;
  }

  /** The first InputError in a cause chain (Spark wraps task failures), or null. */
  public static InputError find(Throwable t) {
    for (int i = 0; t != null && i < 50; i++, t = t.getCause()) {
      if (t instanceof InputError e) {
        return e;
      }
      for (Throwable s : t.getSuppressed()) {
        InputError e = find(s);
        if (e != null) {
          return e;
        }
      }
    }
    return null;
  }
}
