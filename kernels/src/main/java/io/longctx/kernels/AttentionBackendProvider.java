package io.longctx.kernels;

/**
 * A kind of backend, found by {@link java.util.ServiceLoader} (as DJL finds engines): the CPU
 * kernels and the CUDA kernels register one each in {@code META-INF/services}; another jar can add
 * its own. {@link AttentionBackends} selects among them by name.
 */
public interface AttentionBackendProvider {

  /** The name users select it by ({@code -Dlongctx.backend=NAME}, {@code --backend NAME}). */
  String name();

  /** Preference of {@code auto} among the usable providers: highest first. */
  int priority();

  /** Null when usable in this JVM, else why not (no driver, no device, no fatbin...). */
  String unavailableReason();

  /**
   * The backend on device ordinal {@code device} (ignored by backends without devices). Throws
   * IllegalStateException with the reason when it cannot be used here.
   */
  AttentionBackend open(int device);
}
