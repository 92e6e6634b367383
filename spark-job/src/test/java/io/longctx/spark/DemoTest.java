package io.longctx.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.ByteArrayOutputStream;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** {@code longctx demo} at toy lengths: both parts check themselves against a reference in this process. */
class DemoTest {

  @TempDir
  Path tmp;

  /**
   * The score part: {@code gen}'s corpus (Parquet without dictionaries, two-level lists) read by the
   * decode job, three documents of 20,000, 12,000 and 4,000 tokens (3, 2 and 1 chunks), every query
   * checked against the float64 reference.
   */
  @Test
  void scorePartMatchesTheFloat64Reference() throws Exception {
    ByteArrayOutputStream buf = new ByteArrayOutputStream();
    boolean ok = Demo.run(TestSpark.get(), tmp.resolve("score"), 20_000, 12, new PrintStream(buf, true,
        StandardCharsets.UTF_8));
    String text = buf.toString(StandardCharsets.UTF_8);
    assertTrue(ok, text);
    assertTrue(text.contains("demo: all 12 checked queries match the float64 reference"), text);
    assertTrue(!text.contains("(not checked)"), "every query is checked: " + text);
  }

  /** The ppl part: the job's rows equal LlamaModel's in this process. */
  @Test
  void pplPartMatchesTheModel() throws Exception {
    ByteArrayOutputStream buf = new ByteArrayOutputStream();
    // A user's directory where the demo once wrote its documents (mode overwrite): left alone now.
    java.nio.file.Path mine = java.nio.file.Files.createDirectories(tmp.resolve("ppl-docs.parquet"));
    java.nio.file.Files.writeString(mine.resolve("notes.txt"), "mine");
    boolean ok = Demo.runPpl(TestSpark.get(), tmp, 300, new PrintStream(buf, true, StandardCharsets.UTF_8));
    String text = buf.toString(StandardCharsets.UTF_8);
    assertTrue(ok, text);
    assertTrue(text.contains("ppl-long") && text.contains("ppl-short") && text.contains("identical"), text);
    assertTrue(java.util.regex.Pattern.compile("longctx ppl: scoring 2 documents \\(\\d+ tokens\\) in 2 tasks").matcher(text).find(), text);
    assertEquals("mine", java.nio.file.Files.readString(mine.resolve("notes.txt")));
    try (var left = java.nio.file.Files.list(tmp)) { // its checkpoint and documents are gone; its scores stay
      assertEquals(java.util.Set.of("ppl-docs.parquet", "ppl-scores.parquet"),
          left.map(p -> p.getFileName().toString()).collect(java.util.stream.Collectors.toSet()));
    }
  }
}
