package io.longctx.kernels;

import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import java.util.ServiceLoader;
import java.util.logging.Logger;

/**
 * The one backend selector of longctx: the operator, the Blocks and the Spark job all take their
 * backend from here. Names come from the registered {@link AttentionBackendProvider}s; {@code auto}
 * is the usable provider of highest priority (CUDA where a device and the fatbins are, else the CPU
 * kernels, with one log line saying why).
 */
public final class AttentionBackends {

  /** The system property naming the backend: auto (default), cpu, cuda, or another provider's name. */
  public static final String PROPERTY = "longctx.backend";

  private static final Logger LOG = Logger.getLogger(AttentionBackends.class.getName());
  private static volatile List<AttentionBackendProvider> providers;
  private static volatile boolean loggedAuto;

  private AttentionBackends() {}

  /** The choice of this JVM: the {@value #PROPERTY} system property, else {@code auto}. */
  public static String choice() {
    return System.getProperty(PROPERTY, "auto");
  }

  /** Every registered provider, highest priority first. */
  public static List<AttentionBackendProvider> providers() {
    List<AttentionBackendProvider> p = providers;
    if (p == null) {
      List<AttentionBackendProvider> found = new ArrayList<>();
      ServiceLoader.load(AttentionBackendProvider.class, AttentionBackends.class.getClassLoader()).forEach(found::add);
      found.sort(Comparator.comparingInt(AttentionBackendProvider::priority).reversed());
      providers = p = List.copyOf(found);
    }
    return p;
  }

  /**
   * The provider a choice names; {@code auto}: the usable one of highest priority. Throws
   * IllegalArgumentException for a name no provider has, listing the names there are.
   */
  public static AttentionBackendProvider provider(String choice) {
    if (choice.equals("auto")) {
      StringBuilder why = new StringBuilder();
      for (AttentionBackendProvider p : providers()) {
        String reason = p.unavailableReason();
        if (reason == null) {
          if (why.length() > 0 && !loggedAuto) {
            loggedAuto = true;
            LOG.info("longctx: using the " + p.name() + " backend (" + why + ")");
          }
          return p;
        }
        why.append(why.length() > 0 ? "; " : "").append(p.name()).append(" unavailable: ").append(reason);
      }
      throw new IllegalStateException("no attention backend is usable: " + why);
    }
    for (AttentionBackendProvider p : providers()) {
      if (p.name().equals(choice)) {
        return p;
      }
    }
    throw new IllegalArgumentException(PROPERTY + " must be auto or one of " + names() + ", got '" + choice + "'");
  }

  /** The backend of a choice on device 0 (see {@link #open(String, int)}). */
  public static AttentionBackend select(String choice) {
    return open(choice, 0);
  }

  /** The backend of a choice on a device; a named backend that cannot run here fails loudly. */
  public static AttentionBackend open(String choice, int device) {
    AttentionBackendProvider p = provider(choice);
    String reason = p.unavailableReason();
    if (reason != null) {
      throw new IllegalStateException(PROPERTY + "=" + p.name() + " but the " + p.name() + " backend is unavailable: "
          + reason);
    }
    return p.open(device);
  }

  public static List<String> names() {
    return providers().stream().map(AttentionBackendProvider::name).toList();
  }
}
