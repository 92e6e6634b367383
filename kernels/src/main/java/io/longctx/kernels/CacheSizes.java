package io.longctx.kernels;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Locale;

/**
 * The per-core L2 cache size of the machine the kernels run on, read once from Linux's sysfs
 * ({@code /sys/devices/system/cpu/cpu0/cache/index*}); 512 KiB where it cannot be read. Only tile
 * counts follow from it, never a result's bits.
 */
final class CacheSizes {
  private CacheSizes() {}

  static final long FALLBACK_L2_BYTES = 512 * 1024;
  static final long L2_BYTES = readL2(Path.of("/sys/devices/system/cpu/cpu0/cache"));

  /** The unified or data cache of level 2 under {@code cacheDir}, or {@link #FALLBACK_L2_BYTES}. */
  static long readL2(Path cacheDir) {
    for (int i = 0; i < 8; i++) {
      Path dir = cacheDir.resolve("index" + i);
      try {
        if (!Files.isDirectory(dir) || !Files.readString(dir.resolve("level")).trim().equals("2")
            || Files.readString(dir.resolve("type")).trim().equals("Instruction")) {
          continue;
        }
        long bytes = parseSize(Files.readString(dir.resolve("size")).trim());
        if (bytes > 0) {
          return bytes;
        }
      } catch (IOException | RuntimeException e) {
        return FALLBACK_L2_BYTES;
      }
    }
    return FALLBACK_L2_BYTES;
  }

  /** "2048K", "1M", "524288" as bytes; -1 for anything else. */
  static long parseSize(String s) {
    String t = s.toUpperCase(Locale.ROOT);
    long unit = t.endsWith("K") ? 1024 : t.endsWith("M") ? 1024 * 1024 : 1;
    String digits = unit == 1 ? t : t.substring(0, t.length() - 1);
    try {
      return Long.parseLong(digits) * unit;
    } catch (NumberFormatException e) {
      return -1;
    }
  }
}
