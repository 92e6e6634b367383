package io.longctx.kernels;

/**
 * Replayable random seeds for the tests and the GPU checks: {@code -Dlongctx.seed=S} replays a run,
 * otherwise each call draws a fresh one.
 */
public final class Seeds {
  /** The system property that replays a run. */
  public static final String PROPERTY = "longctx.seed";

  private Seeds() {}

  /** The seed given with {@code -Dlongctx.seed}, else a fresh one. */
  public static long fromPropertyOrFresh() {
    Long fixed = Long.getLong(PROPERTY); // null when unset or empty
    // The thread id keeps two tests that start in the same nanosecond on different seeds.
    return fixed != null ? fixed : System.nanoTime() ^ Thread.currentThread().getId() * 0x9E3779B97F4A7C15L;
  }

  /**
   * A test's seed ({@link #fromPropertyOrFresh}), printed with the calling class and method, so that
   * a failure whose message leaves the seed out can still be replayed.
   */
  public static long forTest() {
    long seed = fromPropertyOrFresh();
    StackWalker.StackFrame caller = StackWalker.getInstance().walk(f -> f.skip(1).findFirst()).orElseThrow();
    String cls = caller.getClassName(), method = caller.getMethodName();
    String where = cls.substring(cls.lastIndexOf('.') + 1) + (method.startsWith("<") ? "" : "." + method); // not <init>
    System.out.println(where + ": seed " + seed + " (replay with -D" + PROPERTY + "=" + seed + ")");
    return seed;
  }
}
