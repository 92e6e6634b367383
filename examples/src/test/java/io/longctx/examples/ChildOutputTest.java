package io.longctx.examples;

import static org.junit.jupiter.api.Assertions.assertEquals;

import java.util.List;
import org.junit.jupiter.api.Test;

class ChildOutputTest {

  @Test
  void aJavaTraceIsNamedByItsExceptionNotItsLastFrame() {
    List<String> trace = List.of("loading", "Exception in thread \"main\" java.lang.OutOfMemoryError: Java heap space",
        "\tat io.longctx.djl.LlamaModel.score(LlamaModel.java:480)",
        "\tat io.longctx.examples.PplBench.main(PplBench.java:177)");
    assertEquals("Exception in thread \\\"main\\\" java.lang.OutOfMemoryError: Java heap space",
        ChildOutput.why(trace, 300));
    List<String> caused = List.of("Exception in thread \"main\" java.lang.IllegalStateException: load failed",
        "\tat a.B.c(B.java:1)", "Caused by: java.io.IOException: C:\\models\\x: no such file", "\tat a.B.d(B.java:2)",
        "\t... 3 more", "");
    assertEquals("Caused by: java.io.IOException: C:\\\\models\\\\x: no such file", ChildOutput.why(caused, 300),
        "the root cause, backslashes escaped for JSON");
    assertEquals("Caused by", ChildOutput.why(caused, 9));
    assertEquals("tab\tin", new com.google.gson.Gson().fromJson("\"" + ChildOutput.why(List.of("tab\tin"), 300) + "\"",
        String.class), "a control character escaped: the JSON string reads back as the line");
    assertEquals("", ChildOutput.why(List.of(), 300));
  }
}
