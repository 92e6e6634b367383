package io.longctx.djl;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assumptions.assumeFalse;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import ai.djl.ndarray.NDArray;
import ai.djl.ndarray.NDList;
import ai.djl.ndarray.NDManager;
import ai.djl.ndarray.types.DataType;
import ai.djl.ndarray.types.Shape;
import io.longctx.djl.AttentionOp.Layout;
import io.longctx.djl.AttentionOp.Path;
import io.longctx.kernels.AttentionOptions;
import io.longctx.kernels.AttentionState;
import io.longctx.kernels.CpuAttention;
import io.longctx.kernels.Seeds;
import io.longctx.kernels.Tensor;
import java.nio.ByteOrder;
import java.nio.FloatBuffer;
import java.util.SplittableRandom;
import org.junit.jupiter.api.Test;

class HugePagesTest {

  private static boolean linux() {
    return System.getProperty("os.name", "").toLowerCase(java.util.Locale.ROOT).contains("linux");
  }

  @Test
  void eachBadSettingIsNamedBeforeAnyWork() {
    String[][] bad = {{AttentionOp.PATH_PROPERTY, "fastest"}, {HugePages.PROPERTY, "sometimes"},
        {LlamaModel.KV_GROUP_FLOATS_PROPERTY, "0"}, {LlamaModel.KV_GROUP_FLOATS_PROPERTY, "lots"}};
    AttentionOp.checkSettings(); // none set here
    for (String[] b : bad) {
      String before = System.setProperty(b[0], b[1]);
      try {
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class, AttentionOp::checkSettings, b[0]);
        assertTrue(e.getMessage().startsWith("-D" + b[0] + " ") && e.getMessage().contains("'" + b[1] + "'"),
            e.getMessage());
      } finally {
        if (before == null) {
          System.clearProperty(b[0]);
        } else {
          System.setProperty(b[0], before);
        }
      }
    }
    System.setProperty(HugePages.PROPERTY, " OFF ");
    try {
      assertEquals("off", HugePages.mode());
    } finally {
      System.clearProperty(HugePages.PROPERTY);
    }
  }

  @Test
  void offAdvisesNothingAndAutoProbes() {
    assertFalse(HugePages.decide("off").advise());
    assumeTrue(linux(), "the probe runs on Linux only");
    HugePages.Decision auto = HugePages.decide("auto");
    assumeFalse(auto.why().startsWith("libc not reachable") || auto.why().startsWith("the probe"), auto.why());
    // Either answer is right on some machine; the figures behind it must be there.
    assertTrue(auto.why().matches("probe: first touch of 8 MiB [0-9.]+ ms in 4 KiB pages, [0-9.]+ ms with the hint"),
        auto.why());
  }

  @Test
  void adviceKeepsWhatIsWritten() {
    assumeTrue(linux() && HugePages.decide("on").advise(), "libc through JNA");
    try (NDManager m = NDManager.newBaseManager()) {
      NDArray a = m.create(new Shape(3, 1 << 20), DataType.FLOAT32); // 12 MiB, fresh
      FloatBuffer f = a.toByteBuffer(true).order(ByteOrder.nativeOrder()).asFloatBuffer();
      HugePages.madvise(f, 12L << 20); // whether the kernel takes the hint is its own affair
      for (int i = 0; i < f.capacity(); i += 997) {
        f.put(i, i * 0.5f);
      }
      float[] back = a.toFloatArray();
      for (int i = 0; i < back.length; i += 997) {
        assertEquals(i * 0.5f, back[i], "value " + i);
      }
    }
  }

  @Test
  void largeOutputsHoldTheKernelsBitsInBothLayouts() {
    // o of 2 x 6200 x 128 floats (6.1 MiB): past MIN_BYTES, so advised (the decision forced to yes).
    long seed = Seeds.forTest();
    SplittableRandom rng = new SplittableRandom(seed);
    AttentionOptions opt = AttentionOptions.DEFAULT.withCausal(true);
    Tensor q = Tensor.random(rng, 1, 2, 6200, 128), k = Tensor.random(rng, 1, 1, 6200, 128);
    Tensor v = Tensor.random(rng, 1, 1, 6200, 128);
    assertTrue(4L * q.data().length >= HugePages.MIN_BYTES, "the output must reach the advice");
    long[] qPos = new long[6200];
    for (int i = 0; i < qPos.length; i++) {
      qPos[i] = i;
    }
    // Only the last 64 keys of each row's window: cheap, yet every output row is written.
    opt = opt.withWindow(64);
    AttentionState want = CpuAttention.DEFAULT.forward(q, k, v, qPos, qPos, opt);
    AttentionOp op = new AttentionOp(CpuAttention.DEFAULT);
    assumeTrue(linux() && HugePages.decide("on").advise(), "libc through JNA");
    HugePages.Decision before = HugePages.override(new HugePages.Decision(true, "test"));
    try (NDManager m = NDManager.newBaseManager()) {
      for (Layout layout : Layout.values()) {
        NDList r = op.forward(OpChecks.nd(m, q, layout), OpChecks.nd(m, k, layout), OpChecks.nd(m, v, layout), qPos,
            qPos, opt, layout, Path.JAVA);
        float[][] st = OpChecks.stateOrder(r.get(0), r.get(1), layout);
        assertArrayEquals(want.o(), st[0], layout + ", seed " + seed + " (huge pages: "
            + HugePages.decision() + "): not the kernel's o");
        assertArrayEquals(want.lse(), st[1], layout + ", seed " + seed + ": not the kernel's lse");
      }
    } finally {
      HugePages.override(before);
    }
  }
}
