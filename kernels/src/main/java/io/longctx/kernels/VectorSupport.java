package io.longctx.kernels;

/** Checks once that the JDK Vector API module is present, with a message that says how to add it. */
final class VectorSupport {

  private static final boolean PRESENT = ModuleLayer.boot().findModule("jdk.incubator.vector").isPresent();

  private VectorSupport() {}

  static void require() {
    if (!PRESENT) {
      throw new IllegalStateException("longctx CPU kernels need the JDK Vector API: start java with "
          + "--add-modules=jdk.incubator.vector (bin/longctx and the Maven build already do)");
    }
  }
}
