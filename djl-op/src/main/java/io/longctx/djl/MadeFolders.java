package io.longctx.djl;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Comparator;
import java.util.List;
import java.util.stream.Stream;

/** The one place that deletes a whole folder: only ever one a command made itself (a temporary corpus, a staging folder). */
public final class MadeFolders {

  /** Deletes {@code dir} and everything in it, deepest first; a missing dir is nothing to do. */
  public static void delete(Path dir) throws IOException {
    if (!Files.exists(dir, java.nio.file.LinkOption.NOFOLLOW_LINKS)) {
      return;
    }
    List<Path> all;
    try (Stream<Path> walk = Files.walk(dir)) { // does not follow links: a link is deleted, never its target
      all = walk.sorted(Comparator.reverseOrder()).toList();
    }
    for (Path p : all) {
      Files.deleteIfExists(p);
    }
  }

  /**
   * {@link #delete} for clean-up after work that may itself have failed: a folder that cannot be
   * deleted is a warning on stderr naming it, never an exception that would hide the work's own.
   */
  public static void deleteOrWarn(Path dir) {
    try {
      delete(dir);
    } catch (IOException | RuntimeException e) {
      System.err.println("longctx: could not delete the temporary folder " + dir + " (" + e
          + "); it holds only what longctx made: delete it by hand");
    }
  }

  /**
   * A temporary folder this command made, deleted by {@link #close} and also when the JVM is shut
   * down first (Ctrl-C, SIGTERM), which skips the finally blocks that would have deleted it: an
   * interrupted spark-bench or demo left hundreds of MB in /tmp, bench-ppl its model and a running
   * child JVM. The hook also ends this JVM's child processes ({@code endChildren}), for a parent whose
   * children would otherwise run on; {@code dir} null: no folder to delete (bench-ppl with --model),
   * only the children to end.
   */
  public static final class Temporary implements AutoCloseable {
    private final Path dir;
    private final Thread hook;

    public Temporary(Path dir, boolean endChildren) {
      this.dir = dir;
      this.hook = new Thread(() -> {
        if (endChildren) {
          ProcessHandle.current().descendants().forEach(ProcessHandle::destroyForcibly);
        }
        if (dir != null) {
          deleteOrWarn(dir);
        }
      }, "longctx-temporary-folder");
      Runtime.getRuntime().addShutdownHook(hook);
    }

    public Path dir() {
      return dir;
    }

    @Override
    public void close() {
      try {
        Runtime.getRuntime().removeShutdownHook(hook);
      } catch (IllegalStateException e) {
        return; // shutting down already: the hook deletes it
      }
      if (dir != null) {
        deleteOrWarn(dir);
      }
    }
  }

  private MadeFolders() {}
}
