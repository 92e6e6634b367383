package io.longctx.spark;

import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/** A small --name value / --flag parser shared by the commands. */
final class Args {
  final Map<String, String> values = new LinkedHashMap<>();
  final List<String> confs = new ArrayList<>();
  boolean help;

  static Args parse(String[] argv, List<String> valued, List<String> flags) {
    Args a = new Args();
    for (int i = 0; i < argv.length; i++) {
      String s = argv[i];
      String name = s, inline = null;
      int eq = s.indexOf('=');
      if (s.startsWith("--") && eq > 0) {
        name = s.substring(0, eq);
        inline = s.substring(eq + 1);
      }
      if (name.equals("-h") || name.equals("--help")) {
        a.help = true;
      } else if (flags.contains(name)) {
        if (inline != null) {
          throw new IllegalArgumentException(name + " takes no value");
        }
        if (a.values.containsKey(name)) {
          throw new IllegalArgumentException(name + " is given twice");
        }
        a.values.put(name, "true");
      } else if (valued.contains(name) || name.equals("--conf") || name.equals("--master")) {
        String v = inline;
        if (v == null) {
          if (i + 1 >= argv.length) {
            throw new IllegalArgumentException(name + " needs a value");
          }
          v = argv[++i];
          // "--output --prefill" took the next option as the value (a folder named --prefill, the flag
          // never applied); a value that starts with "--" can still be given inline: --output=--x.
          if (v.startsWith("--")) {
            throw new IllegalArgumentException(name + " needs a value, got the option " + v
                + " (a value starting with -- goes inline: " + name + "=VALUE)");
          }
        }
        if (name.equals("--conf")) {
          if (v.indexOf('=') <= 0) {
            throw new IllegalArgumentException("--conf needs key=value, got " + v);
          }
          a.confs.add(v);
        } else {
          a.putOnce(name, v);
        }
      } else {
        throw new IllegalArgumentException("unknown option " + s + " (see --help)");
      }
    }
    return a;
  }

  /** Only --conf repeats: a second --output (or any other) would win over the first in silence. */
  private void putOnce(String name, String v) {
    if (values.containsKey(name)) {
      throw new IllegalArgumentException(name + " is given twice (" + values.get(name) + ", then " + v + ")");
    }
    values.put(name, v);
  }

  String get(String name) {
    return values.get(name);
  }

  boolean flag(String name) {
    return values.containsKey(name);
  }

  int intValue(String name, int dflt) {
    String v = values.get(name);
    if (v == null) {
      return dflt;
    }
    try {
      return Integer.parseInt(v.trim());
    } catch (NumberFormatException e) {
      throw new IllegalArgumentException(name + " needs an integer" + (isLong(v) ? " between " + Integer.MIN_VALUE
          + " and " + Integer.MAX_VALUE : "") + ", got " + v);
    }
  }

  /**
   * An option whose absence means "work it out" (0 to the caller): given, it must be >= 1, so that
   * an explicit 0 is an error rather than read as not given.
   */
  int positiveIntOrAbsent(String name) {
    int v = intValue(name, 0);
    if (values.containsKey(name) && v < 1) {
      throw new IllegalArgumentException(name + " must be >= 1, got " + values.get(name) + " (leave it out for the default)");
    }
    return v;
  }

  private static boolean isLong(String v) {
    try {
      Long.parseLong(v.trim());
      return true;
    } catch (NumberFormatException e) {
      return false;
    }
  }

  long longValue(String name, long dflt) {
    String v = values.get(name);
    if (v == null) {
      return dflt;
    }
    try {
      return Long.parseLong(v.trim());
    } catch (NumberFormatException e) {
      throw new IllegalArgumentException(name + " needs an integer, got " + v);
    }
  }

  double doubleValue(String name, double dflt) {
    String v = values.get(name);
    if (v == null) {
      return dflt;
    }
    double x;
    try {
      x = Double.parseDouble(v.trim());
    } catch (NumberFormatException e) {
      throw new IllegalArgumentException(name + " needs a number, got " + v);
    }
    if (!Double.isFinite(x)) { // NaN is the options' own "not given" (e.g. --scale NaN read as the default)
      throw new IllegalArgumentException(name + " needs a finite number, got " + v);
    }
    return x;
  }
}
