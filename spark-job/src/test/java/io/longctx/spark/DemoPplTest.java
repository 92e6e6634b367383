package io.longctx.spark;

import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.ByteArrayOutputStream;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** The demo's ppl part at a toy length: the job's rows equal LlamaModel's in this process. */
class DemoPplTest {

  @TempDir
  Path tmp;

  @Test
  void pplPartMatchesTheModel() throws Exception {
    ByteArrayOutputStream buf = new ByteArrayOutputStream();
    boolean ok = Demo.runPpl(TestSpark.get(), tmp, 300, new PrintStream(buf, true, StandardCharsets.UTF_8));
    String text = buf.toString(StandardCharsets.UTF_8);
    assertTrue(ok, text);
    assertTrue(text.contains("ppl-long") && text.contains("ppl-short") && text.contains("identical"), text);
    assertTrue(text.contains("longctx ppl: scoring 2 documents in 2 tasks"), text);
  }
}
