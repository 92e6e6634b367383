package io.longctx.djl;

import ai.djl.ndarray.NDArray;
import ai.djl.ndarray.NDList;
import ai.djl.ndarray.NDManager;
import ai.djl.ndarray.types.Shape;
import java.util.Arrays;

/**
 * Prints the time of libtorch's fused CPU attention at one shape (a quick look at the anchor, not a
 * benchmark and not a test): inputs are created once in the engine, only the forward call is timed,
 * median of 5 after 3 warm-up calls.
 *
 * <p>Run: {@code mvn -q -pl djl-op -am test-compile} then {@code java -Dai.djl.offline=true -cp
 * <test class path> io.longctx.djl.LibtorchSdpaTiming [B H T D]}.
 */
public final class LibtorchSdpaTiming {

  public static void main(String[] args) {
    int b = 1, h = 8, t = 4096, d = 128;
    if (args.length == 4) {
      b = Integer.parseInt(args[0]);
      h = Integer.parseInt(args[1]);
      t = Integer.parseInt(args[2]);
      d = Integer.parseInt(args[3]);
    }
    try (LibtorchSdpa sdpa = LibtorchSdpa.open(); NDManager m = sdpa.manager().newSubManager()) {
      Shape shape = new Shape(b, h, t, d);
      NDArray q = m.randomNormal(shape);
      NDArray k = m.randomNormal(shape);
      NDArray v = m.randomNormal(shape);
      for (boolean causal : new boolean[] {true, false}) {
        double[] ms = new double[5];
        for (int i = -3; i < ms.length; i++) {
          long t0 = System.nanoTime();
          NDList out = sdpa.forward(q, k, v, causal);
          long t1 = System.nanoTime();
          out.close();
          if (i >= 0) {
            ms[i] = (t1 - t0) / 1e6;
          }
        }
        double[] sorted = ms.clone();
        Arrays.sort(sorted);
        double median = sorted[sorted.length / 2];
        double flops = 4.0 * b * h * t * (double) t * d * (causal ? 0.5 : 1.0);
        System.out.printf("libtorch SDPA [%d,%d,%d,%d] causal=%-5b median %.1f ms (%.0f GFLOP/s) all %s%n",
            b, h, t, d, causal, median, flops / (median * 1e6), Arrays.toString(ms));
      }
      // Calibration: the machine's plain fp32 matmul rate on the q.k^T-shaped product.
      NDArray kt = k.reshape(b * h, t, d).transpose(0, 2, 1);
      NDArray q3 = q.reshape(b * h, t, d);
      double[] ms = new double[5];
      for (int i = -2; i < ms.length; i++) {
        long t0 = System.nanoTime();
        q3.matMul(kt).close();
        long t1 = System.nanoTime();
        if (i >= 0) {
          ms[i] = (t1 - t0) / 1e6;
        }
      }
      Arrays.sort(ms);
      System.out.printf("matmul [%d,%d,%d]x[%d,%d,%d] median %.1f ms (%.0f GFLOP/s)%n",
          b * h, t, d, b * h, d, t, ms[2], 2.0 * b * h * t * (double) t * d / (ms[2] * 1e6));
    }
  }
}
