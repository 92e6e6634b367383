package io.longctx.kernels;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.SplittableRandom;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * The forward kernel's loop order (several query blocks sweeping each key tile together) changes
 * where data sits in cache, never a bit of the result: a row's arithmetic depends only on the key
 * tiles.
 */
class SweepOrderTest {

  @Test
  void blocksPerSweepNeverChangesTheBits() {
    long seed = Seeds.forTest();
    SplittableRandom rng = new SplittableRandom(seed);
    AttentionOptions[] masks = {AttentionOptions.DEFAULT, AttentionOptions.DEFAULT.withCausal(true),
        AttentionOptions.DEFAULT.withCausal(true).withWindow(77), AttentionOptions.DEFAULT.withSoftcap(4f)};
    int[][] shapes = {{1, 1, 1, 1, 32}, {2, 4, 2, 339, 64}, {1, 8, 1, 799, 128}, {1, 2, 2, 7, 80}};
    for (int[] sh : shapes) {
      int b = sh[0], h = sh[1], hkv = sh[2], t = sh[3], d = sh[4];
      Tensor q = Tensor.random(rng, b, h, t, d, 1.5);
      Tensor k = Tensor.random(rng, b, hkv, t + 13, d, 1.5);
      Tensor v = Tensor.random(rng, b, hkv, t + 13, d);
      long[] qPos = new long[t];
      for (int i = 0; i < t; i++) {
        qPos[i] = 13 + i;
      }
      for (AttentionOptions opt : masks) {
        AttentionState alone = new CpuAttention(32, 128, 1).forward(q, k, v, qPos, null, opt);
        for (int per : new int[] {2, 3, 8, 64}) {
          AttentionState swept = new CpuAttention(32, 128, per).forward(q, k, v, qPos, null, opt);
          String where = "seed " + seed + " (replay with -Dlongctx.seed=" + seed + "), shape " + java.util.Arrays.toString(sh)
              + ", " + opt + ", " + per + " blocks per sweep";
          assertArrayEquals(alone.o(), swept.o(), where);
          assertArrayEquals(alone.lse(), swept.lse(), where);
        }
      }
    }
  }

  @Test
  void blocksPerSweepFollowsTheCacheAndLeavesEveryThreadWork() {
    CpuAttention cpu = new CpuAttention(32, 128, 8);
    int threads = CpuAttention.POOL.getParallelism();
    // Enough blocks: capped by the cache and by the bound.
    int many = cpu.blocksPerSweep(4096, 64, 128);
    assertTrue(many >= 1 && many <= 8, "got " + many);
    // Few blocks: one per sweep, so the pool's threads all get tasks.
    assertEquals(1, cpu.blocksPerSweep(2, threads, 128));
    assertEquals(1, cpu.blocksPerSweep(1, 1, 64));
  }

  @Test
  void tileStepsCountVisibleStepsAndWarmUpReachesTheJitThreshold() {
    Tensor q = Tensor.random(new SplittableRandom(7), 1, 2, 200, 64, 1);
    long before = CpuAttention.tileSteps();
    new CpuAttention(32, 128, 1).forward(q, q, q, null, null, AttentionOptions.DEFAULT.withCausal(true));
    // 2 heads x 7 query blocks of 32; causal: blocks 0-3 see key tile 0 only, blocks 4-6 both tiles
    long steps = CpuAttention.tileSteps() - before;
    assertTrue(steps >= 2 * 10, "counted " + steps + " tile steps"); // other tests may run kernels meanwhile
    assertTrue(CpuAttention.warmUpJit(60_000_000_000L));
    // counted in 64-row steps: twice as many of the 32-row blocks of 256-bit vectors; this JVM scales no thresholds
    assertEquals(CpuAttention.JIT_WARM_TILE_STEPS * 64 / CpuAttention.DEFAULT_BLOCK_Q, CpuAttention.jitWarmTileSteps());
    assertTrue(CpuAttention.tileSteps() >= CpuAttention.jitWarmTileSteps());
    long before2 = CpuAttention.tileSteps();
    assertTrue(CpuAttention.warmUpJit(0), "a warm JVM answers at once, whatever the budget");
    // "at once": no kernel call (a wall-clock bound would fail on a loaded machine; other tests' calls
    // could only raise the count, and none run in this class meanwhile)
    assertEquals(before2, CpuAttention.tileSteps(), "warm: the warm-up ran no tile step");
  }

  @Test
  void cacheSizesReadSysfsAndFallBack(@TempDir Path dir) throws Exception {
    Path l1 = Files.createDirectories(dir.resolve("index0"));
    Files.writeString(l1.resolve("level"), "1\n");
    Files.writeString(l1.resolve("type"), "Data\n");
    Files.writeString(l1.resolve("size"), "48K\n");
    assertEquals(-1, CacheSizes.readL2(dir));
    Path l2 = Files.createDirectories(dir.resolve("index2"));
    Files.writeString(l2.resolve("level"), "2\n");
    Files.writeString(l2.resolve("type"), "Unified\n");
    Files.writeString(l2.resolve("size"), "2048K\n");
    assertEquals(2048L * 1024, CacheSizes.readL2(dir));
    Files.writeString(l2.resolve("size"), "1M\n");
    assertEquals(1024L * 1024, CacheSizes.readL2(dir));
    Files.writeString(l2.resolve("size"), "lots\n");
    assertEquals(-1, CacheSizes.readL2(dir));
    assertEquals(-1, CacheSizes.readL2(dir.resolve("absent")));
    // getconf's forms: bytes, and 0 where glibc does not know
    assertEquals(1048576, CacheSizes.parseSize("1048576\n"));
    assertEquals(-1, CacheSizes.parseSize("0"));
    assertEquals(-1, CacheSizes.parseSize(""));
    assertTrue(CacheSizes.L2_BYTES >= 64 * 1024, "detected L2 " + CacheSizes.L2_BYTES);
  }
}
