package io.longctx.djl;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.file.Files;
import java.nio.file.Path;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

class MadeFoldersTest {

  @TempDir Path tmp;

  @Test
  void deletesTheFolderWholeButNeverWhatALinkInItPointsTo() throws Exception {
    Path keep = Files.writeString(Files.createDirectories(tmp.resolve("users/data")).resolve("mine.txt"), "mine");
    Path made = tmp.resolve("made");
    Files.writeString(Files.createDirectories(made.resolve("a/b")).resolve("part-0"), "x");
    Files.createSymbolicLink(made.resolve("a/link-to-users"), tmp.resolve("users"));
    Files.createSymbolicLink(made.resolve("file-link"), keep);

    MadeFolders.delete(made);

    assertFalse(Files.exists(made, java.nio.file.LinkOption.NOFOLLOW_LINKS));
    assertEquals("mine", Files.readString(keep), "a link's target is not ours to delete");
    MadeFolders.delete(made); // already gone: nothing to do
    MadeFolders.deleteOrWarn(tmp.resolve("never-made"));
    assertTrue(Files.isDirectory(tmp.resolve("users/data")));
  }

  /** Without a folder (bench-ppl --model) it only holds the children-ending hook: closing it says nothing. */
  @Test
  void temporaryWithoutAFolderClosesQuietly() {
    java.io.PrintStream err = System.err;
    java.io.ByteArrayOutputStream buf = new java.io.ByteArrayOutputStream();
    System.setErr(new java.io.PrintStream(buf, true, java.nio.charset.StandardCharsets.UTF_8));
    try (MadeFolders.Temporary t = new MadeFolders.Temporary(null, true)) {
      assertEquals(null, t.dir());
    } finally {
      System.setErr(err);
    }
    assertEquals("", buf.toString(java.nio.charset.StandardCharsets.UTF_8)); // it warned of "the temporary folder null"
  }
}
