package io.longctx.djl;

import com.sun.jna.Library;
import com.sun.jna.Native;
import com.sun.jna.Pointer;
import java.nio.Buffer;
import java.util.Locale;

/**
 * Asks Linux for 2 MiB pages under the operator's large output arrays ({@code madvise(MADV_HUGEPAGE)}
 * on the whole 2 MiB pages inside), where that was measured faster on this machine.
 *
 * <p>Why: libtorch gives each call's output fresh memory, and on some VMs the first touch of a 4 KiB
 * page costs 10-15 us: 60-100 ms of a 0.9-2 s call at T = 8192..16384 (docs/BENCHMARKS.md, "The
 * operator's output pages"). One fault per 2 MiB page instead of 512 removes most of that. On other
 * machines a huge page's first touch has cost more than its 512 small ones (the kernel compacting
 * memory to find one), so the hint is used only where a probe, once per JVM, finds it at least
 * twice as fast: fresh anonymous mappings touched page by page, with and without the hint, in turns.
 * The hint never changes a value; where the probe cannot run (no Linux, no libc through JNA, a kernel
 * without THP) nothing is advised. The advice stays on those pages' addresses after the array is
 * freed: if glibc reuses them for other arrays (rather than unmapping them), those get 2 MiB pages
 * too, and the kernel's khugepaged may gather such a range into 2 MiB pages (more resident memory).
 *
 * <p>{@value #PROPERTY}: {@code auto} (default: the probe decides), {@code on}, {@code off}.
 */
final class HugePages {
  static final String PROPERTY = "longctx.op.hugePages";
  /** Outputs smaller than this are left alone: at most two whole 2 MiB pages would lie inside. */
  static final long MIN_BYTES = 6L << 20;
  private static final long HUGE = 2L << 20;
  private static final int MADV_HUGEPAGE = 14;
  private static final System.Logger LOG = System.getLogger(HugePages.class.getName());

  private interface LibC extends Library {
    int madvise(Pointer addr, long length, int advice);

    Pointer mmap(Pointer addr, long length, int prot, int flags, int fd, long offset);

    int munmap(Pointer addr, long length);
  }

  private HugePages() {}

  /** The answer for this JVM, and the probe's figures behind it (for the log and the bench). */
  record Decision(boolean advise, String why) {}

  private static volatile Decision decision;
  private static volatile LibC libc; // set by decide

  /** This JVM's decision (probing on first use under {@code auto}). */
  static Decision decision() {
    Decision d = decision;
    if (d == null) {
      synchronized (HugePages.class) {
        d = decision;
        if (d == null) {
          d = decide(mode());
          Decision made = d;
          LOG.log(System.Logger.Level.INFO, () -> "huge pages under the attention operator's large outputs: "
              + (made.advise() ? "yes" : "no") + " (" + made.why() + ")");
          decision = d;
        }
      }
    }
    return d;
  }

  /** Replaces this JVM's decision (tests; null: none made yet); returns the one before. */
  static synchronized Decision override(Decision d) {
    Decision before = decision;
    if (d != null && d.advise()) {
      decide("on"); // loads libc
    }
    decision = d;
    return before;
  }

  /**
   * madvise(MADV_HUGEPAGE) on the whole 2 MiB pages of a direct buffer's first {@code bytes}, once
   * {@link #decision()} said yes; whether it was advised. Never throws: it is only a hint.
   */
  static boolean madvise(Buffer direct, long bytes) {
    try {
      long addr = Pointer.nativeValue(Native.getDirectBufferPointer(direct));
      long from = (addr + HUGE - 1) & -HUGE;
      long to = (addr + bytes) & -HUGE;
      return direct.isDirect() && to > from && libc.madvise(new Pointer(from), to - from, MADV_HUGEPAGE) == 0;
    } catch (RuntimeException | LinkageError e) {
      return false;
    }
  }

  /** {@value #PROPERTY}'s mode: auto (the default), on or off; anything else is refused, naming it. */
  static String mode() {
    String v = System.getProperty(PROPERTY, "auto");
    String mode = v.trim().toLowerCase(Locale.ROOT);
    if (!mode.equals("on") && !mode.equals("off") && !mode.equals("auto")) {
      throw new IllegalArgumentException("-D" + PROPERTY + " must be auto, on or off, got '" + v + "'");
    }
    return mode;
  }

  /** The decision for a {@link #mode()} (probing under auto); loads libc where it can. */
  static Decision decide(String mode) {
    if (mode.equals("off")) {
      return new Decision(false, PROPERTY + "=off");
    }
    String os = System.getProperty("os.name", "");
    if (!os.toLowerCase(Locale.ROOT).contains("linux")) {
      return new Decision(false, "not Linux (" + os + ")");
    }
    if (!"64".equals(System.getProperty("sun.arch.data.model"))) { // size_t and off_t as Java longs
      return new Decision(false, "not a 64-bit JVM");
    }
    try {
      libc = Native.load("c", LibC.class);
    } catch (LinkageError | RuntimeException e) { // JNA's native part or libc missing
      return new Decision(false, "libc not reachable through JNA: " + e);
    }
    if (mode.equals("on")) {
      return new Decision(true, PROPERTY + "=on");
    }
    try {
      return probe();
    } catch (RuntimeException | LinkageError e) { // JNA binds each function on its first call
      return new Decision(false, "the probe failed: " + e);
    }
  }

  /** Times the first touch of fresh 8 MiB mappings with and without the hint, two of each in turns. */
  private static Decision probe() {
    long plain = Long.MAX_VALUE, hinted = Long.MAX_VALUE;
    for (int round = 0; round < 2; round++) {
      for (boolean hint : new boolean[] {false, true}) {
        long t = touchFresh(4 * HUGE, hint);
        if (t < 0) {
          return new Decision(false, "the probe's mapping or advice failed");
        }
        if (hint) {
          hinted = Math.min(hinted, t);
        } else {
          plain = Math.min(plain, t);
        }
      }
    }
    boolean faster = hinted * 2 <= plain;
    return new Decision(faster, String.format(Locale.ROOT, "probe: first touch of 8 MiB %.2f ms in 4 KiB pages, "
        + "%.2f ms with the hint", plain / 1e6, hinted / 1e6));
  }

  /** Nanoseconds to write one byte per 4 KiB page of a fresh mapping's aligned {@code bytes}; -1 on failure. */
  private static long touchFresh(long bytes, boolean hint) {
    final int protReadWrite = 3, mapPrivateAnonymous = 0x22;
    long size = bytes + HUGE;
    Pointer map = libc.mmap(null, size, protReadWrite, mapPrivateAnonymous, -1, 0);
    long base = Pointer.nativeValue(map);
    if (base == -1L || base == 0) {
      return -1;
    }
    try {
      long from = (base + HUGE - 1) & -HUGE;
      Pointer p = new Pointer(from);
      if (hint && libc.madvise(p, bytes, MADV_HUGEPAGE) != 0) {
        return -1; // a kernel without THP
      }
      long t0 = System.nanoTime();
      for (long off = 0; off < bytes; off += 4096) {
        p.setByte(off, (byte) 1);
      }
      return System.nanoTime() - t0;
    } finally {
      libc.munmap(map, size);
    }
  }
}
