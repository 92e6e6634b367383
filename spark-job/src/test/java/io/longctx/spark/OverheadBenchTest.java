package io.longctx.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.ByteArrayOutputStream;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** spark-bench end to end on a tiny prefill: its report, and the data folder it makes and removes. */
class OverheadBenchTest {
  @TempDir
  Path tmp;

  private static final String[] TINY = {"--tokens", "600", "--heads", "2", "--kv-heads", "1", "--dim", "16",
      "--chunk-len", "256", "--runs", "2"};

  private String bench(String... extra) {
    TestSpark.get();
    ByteArrayOutputStream bytes = new ByteArrayOutputStream();
    String[] args = new String[1 + TINY.length + extra.length];
    args[0] = "spark-bench";
    System.arraycopy(TINY, 0, args, 1, TINY.length);
    System.arraycopy(extra, 0, args, 1 + TINY.length, extra.length);
    int rc = LongctxMain.run(args, new PrintStream(bytes, true, StandardCharsets.UTF_8), System.err);
    String out = bytes.toString(StandardCharsets.UTF_8);
    assertEquals(0, rc, out);
    return out;
  }

  @Test
  void reportsBothRunsAndDeletesTheFolderItMade() {
    String out = bench();
    // 3 chunks: 6 visible (block, chunk) pairs, 3 skipped; both runs with their JIT and GC figures and stages
    assertTrue(out.contains("(6 pairs computed, 3 skipped"), out);
    assertTrue(out.matches("(?s).*job run 1 \\(cold\\).*JIT compiler threads [0-9.]+ s, GC pauses [0-9.]+ s.*"), out);
    assertTrue(out.contains("job run 2 (warm)"), out);
    assertTrue(out.contains("stages of run 2"), out);
    Matcher m = Pattern.compile("data\\s+(\\S+) \\(made for this run, deleted at its end\\)").matcher(out);
    assertTrue(m.find(), out);
    assertFalse(Files.exists(Path.of(m.group(1))), "left behind: " + m.group(1));
  }

  /** A --tokens whose document cannot be held for the kernel-only pass is refused before a byte is written. */
  @Test
  void tokensPastTheHeapAreRefusedFirst() throws Exception {
    Path dir = tmp.resolve("huge");
    for (String tokens : List.of("9223372036854775807", "2147483648")) {
      ByteArrayOutputStream err = new ByteArrayOutputStream();
      int rc = LongctxMain.run(new String[] {"spark-bench", "--tokens", tokens, "--dir", dir.toString()},
          System.out, new PrintStream(err, true, StandardCharsets.UTF_8));
      String msg = err.toString(StandardCharsets.UTF_8);
      assertEquals(2, rc, msg);
      assertTrue(msg.contains("--tokens " + tokens + ": the kernel-only pass holds the document in memory"), msg);
      assertFalse(Files.exists(dir), msg);
    }
  }

  @Test
  void keepsACallersFolder() throws Exception {
    Path dir = tmp.resolve("bench");
    String out = bench("--dir", dir.toString());
    assertTrue(out.contains("data               " + dir + System.lineSeparator()), out);
    assertTrue(Files.isDirectory(dir.resolve("prefill-out.parquet")), out);
  }
}
