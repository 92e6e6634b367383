package io.longctx.kernels;

/** Run in a child JVM by {@link CudaBackendTest}: prints what the probe and the selection say. */
public final class CudaProbeMain {
  private CudaProbeMain() {}

  public static void main(String[] args) {
    CudaProbe.Status s = CudaProbe.status();
    System.out.println("available=" + s.available());
    System.out.println("reason=" + s.reason());
    System.out.println("auto=" + AttentionBackend.select("auto").name());
    try {
      AttentionBackend.select("cuda");
      System.out.println("cuda=selected");
    } catch (IllegalStateException e) {
      System.out.println("cuda=refused: " + e.getMessage());
    }
    // The second probe must not touch the driver again (it would throw NoClassDefFoundError there).
    System.out.println("again=" + CudaProbe.status().reason());
  }
}
