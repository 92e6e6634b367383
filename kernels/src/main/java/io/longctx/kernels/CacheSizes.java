package io.longctx.kernels;

import java.io.IOException;
import java.io.InputStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Locale;
import java.util.concurrent.TimeUnit;

/**
 * The per-core L2 cache size of the machine the kernels run on, read once: from Linux's sysfs
 * ({@code /sys/devices/system/cpu/cpu0/cache/index*}), else from {@code getconf LEVEL2_CACHE_SIZE}
 * (glibc asks the CPU itself: some virtual machines of our kind have no sysfs cache folders, and
 * the fallback then halved the key sweep on a 1 MiB-L2 Zen 5), else 512 KiB. Only tile counts
 * follow from it, never a result's bits.
 */
final class CacheSizes {
  private CacheSizes() {}

  static final long FALLBACK_L2_BYTES = 512 * 1024;
  static final long L2_BYTES = detectL2();

  private static long detectL2() {
    long sysfs = readL2(Path.of("/sys/devices/system/cpu/cpu0/cache"));
    if (sysfs > 0) {
      return sysfs;
    }
    long getconf = parseSize(runGetconf());
    return getconf > 0 ? getconf : FALLBACK_L2_BYTES;
  }

  /** The unified or data cache of level 2 under {@code cacheDir} in bytes, or -1 where not readable. */
  static long readL2(Path cacheDir) {
    for (int i = 0; i < 8; i++) {
      Path dir = cacheDir.resolve("index" + i);
      try {
        if (!Files.isDirectory(dir) || !Files.readString(dir.resolve("level")).trim().equals("2")
            || Files.readString(dir.resolve("type")).trim().equals("Instruction")) {
          continue;
        }
        return parseSize(Files.readString(dir.resolve("size")).trim());
      } catch (IOException | RuntimeException e) {
        return -1;
      }
    }
    return -1;
  }

  /** What {@code getconf LEVEL2_CACHE_SIZE} prints (bytes; "0" or "" where unknown), or "" if it cannot run. */
  private static String runGetconf() {
    try {
      Process p = new ProcessBuilder("getconf", "LEVEL2_CACHE_SIZE").redirectErrorStream(true).start();
      try (InputStream in = p.getInputStream()) {
        if (!p.waitFor(2, TimeUnit.SECONDS)) {
          p.destroyForcibly();
          return "";
        }
        return p.exitValue() == 0 ? new String(in.readNBytes(64), StandardCharsets.US_ASCII).trim() : "";
      }
    } catch (IOException | RuntimeException e) {
      return "";
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      return "";
    }
  }

  /** "2048K", "1M", "524288" as bytes; -1 for anything else, zero included. */
  static long parseSize(String s) {
    String t = s.trim().toUpperCase(Locale.ROOT);
    long unit = t.endsWith("K") ? 1024 : t.endsWith("M") ? 1024 * 1024 : 1;
    String digits = unit == 1 ? t : t.substring(0, t.length() - 1);
    try {
      long bytes = Long.parseLong(digits) * unit;
      return bytes > 0 ? bytes : -1;
    } catch (NumberFormatException e) {
      return -1;
    }
  }
}
