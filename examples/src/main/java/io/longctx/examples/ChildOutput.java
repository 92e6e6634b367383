package io.longctx.examples;

import java.util.List;

/** What a benchmark's failed child JVM said, for the error field of its JSON line. */
final class ChildOutput {
  private ChildOutput() {}

  /**
   * The last line of the child's output that is not a stack frame ({@code at ...}, {@code ... 3 more}):
   * for a Java exception, the exception and its message (its root cause where the trace has one); at
   * most {@code max} characters, as the body of a JSON string.
   */
  static String why(List<String> lines, int max) {
    String why = "";
    for (int i = lines.size() - 1; i >= 0; i--) {
      String l = lines.get(i).strip();
      if (!l.isEmpty() && !l.startsWith("at ") && !(l.startsWith("...") && l.endsWith("more"))) {
        why = l;
        break;
      }
    }
    if (why.length() > max) {
      why = why.substring(0, max);
    }
    String quoted = JSON.toJson(why);
    return quoted.substring(1, quoted.length() - 1);
  }

  private static final com.google.gson.Gson JSON = new com.google.gson.GsonBuilder().disableHtmlEscaping().create();
}
