package io.longctx.djl;

import ai.djl.Device;
import ai.djl.ndarray.NDArray;
import ai.djl.ndarray.NDManager;
import java.util.List;
import java.util.function.UnaryOperator;
import java.util.logging.Logger;

/**
 * Calls libtorch's MKL-backed element-wise functions once, on one thread, before this project's
 * first real use of them in the process.
 *
 * <p>Why: libtorch 2.7.1's CPU build hands tanh, exp, log, sqrt and the trigonometric functions to
 * MKL's vector math. The first such call of a process, when libtorch split it over its two
 * intra-op threads, now and then came back inexact on the second thread's half: tanh with 5.2e-5
 * relative error instead of about 6e-8, in 10 of 94 fresh JVMs (Xeon 6/167, 2026-11-26), every
 * later call exact. It showed as a test flake (plain attention's softcap) and would be a silent
 * error for a user. After one call too small to be split, 0 of 110 fresh JVMs showed it: the
 * library's first-use set-up, raced by two threads, looks like the cause.
 *
 * <p>A few milliseconds once per JVM. Concurrent first callers of {@link #ensure()} wait for it
 * (class initialization).
 */
final class LibtorchWarmup {

  /** Every function libtorch's CPU build sends to MKL that DJL's NDArray exposes. */
  private static final List<UnaryOperator<NDArray>> FUNCTIONS = List.of(NDArray::exp, NDArray::log,
      NDArray::log10, NDArray::log2, NDArray::sqrt, NDArray::sin, NDArray::cos, NDArray::tan, NDArray::asin,
      NDArray::acos, NDArray::atan, NDArray::tanh, NDArray::erf, NDArray::erfinv, NDArray::trunc);

  static {
    Logger log = Logger.getLogger(LibtorchWarmup.class.getName());
    long t0 = System.nanoTime();
    try (NDManager manager = NDManager.newBaseManager(Device.cpu(), "PyTorch")) {
      float[] f = new float[64];
      double[] d = new double[64];
      for (int i = 0; i < f.length; i++) {
        d[i] = 0.1 + 0.8 * i / f.length; // inside every function's domain (asin, acos, erfinv: |x| < 1)
        f[i] = (float) d[i];
      }
      NDArray x32 = manager.create(f), x64 = manager.create(d);
      for (UnaryOperator<NDArray> fn : FUNCTIONS) {
        fn.apply(x32);
        fn.apply(x64);
      }
      long micros = (System.nanoTime() - t0) / 1000;
      log.fine(() -> "libtorch's MKL math warmed up on one thread in " + micros + " us");
    } catch (RuntimeException | LinkageError e) {
      // An engine that cannot run these cannot run the caller's ops either: let those report it, in
      // their words, rather than fail this class's initialization for good.
      log.warning("libtorch warm-up skipped: " + e);
    }
  }

  private LibtorchWarmup() {}

  /** Runs the warm-up on the first call in the JVM; later calls return at once. */
  static void ensure() {
    // The work is in the static initializer: the JVM runs it once and makes other threads wait.
  }
}
