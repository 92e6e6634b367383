package io.longctx.examples;

import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.ByteArrayOutputStream;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import org.junit.jupiter.api.Assertions;
import org.junit.jupiter.api.Test;

/** The README's example program runs as written (it throws if a comparison is off). */
class QuickStartTest {

  @Test
  void mainRunsAndPrintsEachPart() {
    PrintStream old = System.out;
    ByteArrayOutputStream buf = new ByteArrayOutputStream();
    System.setOut(new PrintStream(buf, true, StandardCharsets.UTF_8));
    try {
      // small sequence (two chunks of 256 and a ragged one): seconds even on a loaded 2-core machine.
      // (A Block forward on another thread after libtorch's attention ran on this one used to fail with
      // "Inference tensors cannot be saved for backward"; fixed in AttentionOp, tested by djl-op's ThreadsTest.)
      Assertions.assertTimeout(Duration.ofSeconds(120), () -> QuickStart.main(new String[] {"700"}));
    } finally {
      System.setOut(old);
    }
    String out = buf.toString(StandardCharsets.UTF_8);
    System.out.print(out);
    assertTrue(out.contains("kernel: 700 tokens in 3 chunks"), out);
    assertTrue(out.contains("op: o (1, 4, 700, 64) lse (1, 4, 700)"), out);
    assertTrue(out.contains("block: (1, 700, 256) -> (1, 700, 256)"), out);
  }
}
