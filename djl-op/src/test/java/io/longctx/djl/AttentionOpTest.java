package io.longctx.djl;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import ai.djl.Device;
import ai.djl.ndarray.NDArray;
import ai.djl.ndarray.NDList;
import ai.djl.ndarray.NDManager;
import ai.djl.ndarray.types.DataType;
import ai.djl.ndarray.types.Shape;
import io.longctx.djl.AttentionOp.Layout;
import io.longctx.djl.AttentionOp.Measured;
import io.longctx.djl.AttentionOp.Path;
import io.longctx.kernels.AttentionOptions;
import io.longctx.kernels.AttentionState;
import io.longctx.kernels.CpuAttention;
import io.longctx.kernels.Seeds;
import io.longctx.kernels.Tensor;
import java.util.ArrayList;
import java.util.List;
import java.util.SplittableRandom;
import java.util.stream.Stream;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.Arguments;
import org.junit.jupiter.params.provider.MethodSource;

/** The operator against the float64 reference on fresh random inputs; bad inputs. */
class AttentionOpTest {

  private static NDManager manager;
  private static final AttentionOp OP = AttentionOp.cpu();

  @BeforeAll
  static void open() {
    LibtorchSdpa.open().close(); // sets offline mode and loads the engine
    manager = NDManager.newBaseManager(Device.cpu(), "PyTorch");
  }

  @AfterAll
  static void close() {
    if (manager != null) {
      manager.close();
    }
  }

  static Stream<Arguments> forwardCases() {
    Stream.Builder<Arguments> s = Stream.builder();
    // batch, heads, kvHeads, tq, tk, dim
    int[][] shapes = {{1, 4, 4, 1, 1, 32}, {2, 4, 2, 7, 7, 64}, {1, 8, 1, 70, 70, 32}, {1, 2, 2, 130, 130, 128},
        {2, 4, 4, 65, 339, 64}, {1, 4, 2, 3, 200, 96}};
    AttentionOptions[] opts = {AttentionOptions.DEFAULT, AttentionOptions.DEFAULT.withCausal(true),
        AttentionOptions.DEFAULT.withScale(0.3), AttentionOptions.DEFAULT.withCausal(true).withWindow(17),
        AttentionOptions.DEFAULT.withSoftcap(5f)};
    for (int[] sh : shapes) {
      for (AttentionOptions o : opts) {
        for (Layout l : Layout.values()) {
          s.add(Arguments.of(sh[0], sh[1], sh[2], sh[3], sh[4], sh[5], o, l));
        }
      }
    }
    return s.build();
  }

  @ParameterizedTest(name = "B={0} H={1} Hkv={2} Tq={3} Tk={4} D={5} {6} {7}")
  @MethodSource("forwardCases")
  void forwardMatchesReferenceOnEveryPath(int b, int h, int hkv, int tq, int tk, int d, AttentionOptions opt,
      Layout layout) {
    long seed = Seeds.forTest();
    SplittableRandom rng = new SplittableRandom(seed);
    Tensor q = Tensor.random(rng, b, h, tq, d, 1.5);
    Tensor k = Tensor.random(rng, b, hkv, tk, d, 1.5);
    Tensor v = Tensor.random(rng, b, hkv, tk, d);
    // Causal with Tq < Tk: queries are the last Tq positions (a continuation).
    long[] qPos = null;
    if (tq != tk && opt.masked()) {
      qPos = new long[tq];
      for (int i = 0; i < tq; i++) {
        qPos[i] = tk - tq + i;
      }
    }
    try (NDManager m = manager.newSubManager()) {
      NDArray qa = OpChecks.nd(m, q, layout), ka = OpChecks.nd(m, k, layout), va = OpChecks.nd(m, v, layout);
      List<Path> paths = new ArrayList<>(List.of(Path.AUTO, Path.JAVA));
      if (AttentionOp.libtorchSupports(qa, ka, va, qPos, null, opt, layout)) {
        paths.add(Path.LIBTORCH);
      }
      if (io.longctx.kernels.CudaProbe.status().available()) {
        paths.add(Path.CUDA); // only where a GPU is present
      }
      for (Path p : paths) {
        NDList r = OP.forward(qa, ka, va, qPos, null, opt, layout, p);
        Shape want = layout == Layout.BHTD ? new Shape(b, h, tq, d) : new Shape(b, tq, h, d);
        assertEquals(want, r.get(0).getShape(), "o shape, path " + p);
        assertEquals(want.slice(0, 3), r.get(1).getShape(), "lse shape, path " + p);
        assertEquals(DataType.FLOAT32, r.get(0).getDataType());
        float[][] st = OpChecks.stateOrder(r.get(0), r.get(1), layout);
        String err = OpChecks.check(st[0], st[1], q, k, v, qPos, null, opt);
        assertNull(err, "path " + p + " (chosen " + OP.choose(qa, ka, va, qPos, null, opt, layout) + "), seed " + seed
            + ": " + err);
      }
    }
  }

  @Test
  void dispatchFollowsTheRule() {
    assumeAutoStaysOnTheCpu();
    // Where both paths compute the call, the calibration decides: here a stand-in that says libtorch.
    AttentionOp op = new AttentionOp(CpuAttention.DEFAULT, (shape, java, libtorch) -> Measured.untimed(Path.LIBTORCH));
    try (NDManager m = manager.newSubManager()) {
      NDArray big = m.randomNormal(new Shape(1, 4, 256, 64));
      NDArray one = m.randomNormal(new Shape(1, 4, 1, 64));
      AttentionOptions opt = AttentionOptions.DEFAULT;
      assertEquals(Path.LIBTORCH, op.choose(big, big, big, null, null, opt, Layout.BHTD));
      assertEquals(Path.LIBTORCH, op.choose(big, big, big, null, null, opt.withCausal(true), Layout.BHTD));
      assertEquals(Path.LIBTORCH, op.choose(one, big, big, null, null, opt, Layout.BHTD), "one row, H == Hkv");
      // What libtorch cannot compute exactly goes to the Java kernel, whatever the calibration says.
      assertEquals(Path.JAVA, op.choose(big, big, big, null, null, opt.withWindow(16).withCausal(true), Layout.BHTD));
      assertEquals(Path.JAVA, op.choose(big, big, big, null, null, opt.withSoftcap(3f), Layout.BHTD));
      long[] shifted = new long[256];
      for (int i = 0; i < shifted.length; i++) {
        shifted[i] = 1000 + i;
      }
      assertEquals(Path.JAVA, op.choose(big, big, big, shifted, shifted, opt.withCausal(true), Layout.BHTD));
      assertThrows(IllegalArgumentException.class,
          () -> op.forward(big, big, big, null, null, opt.withSoftcap(3f), Layout.BHTD, Path.LIBTORCH));
      IllegalStateException noGpu = assertThrows(IllegalStateException.class,
          () -> op.forward(big, big, big, null, null, opt, Layout.BHTD, Path.CUDA));
      assertTrue(noGpu.getMessage().contains("CUDA is unavailable"), noGpu.getMessage());
    }
  }

  @Test
  void causalWithFewerQueriesThanKeysAtDefaultPositionsOnBothPaths() {
    // Default positions: query i sees keys 0..i (libtorch's top-left mask is the same mask).
    long seed = Seeds.forTest();
    SplittableRandom rng = new SplittableRandom(seed);
    Tensor q = Tensor.random(rng, 1, 4, 70, 64, 1.5), k = Tensor.random(rng, 1, 4, 200, 64, 1.5);
    Tensor v = Tensor.random(rng, 1, 4, 200, 64);
    AttentionOptions opt = AttentionOptions.DEFAULT.withCausal(true);
    for (Layout layout : Layout.values()) {
      try (NDManager m = manager.newSubManager()) {
        NDArray qa = OpChecks.nd(m, q, layout), ka = OpChecks.nd(m, k, layout), va = OpChecks.nd(m, v, layout);
        assertTrue(AttentionOp.libtorchSupports(qa, ka, va, null, null, opt, layout), "both paths compute this call");
        for (Path p : new Path[] {Path.JAVA, Path.LIBTORCH}) {
          NDList r = OP.forward(qa, ka, va, null, null, opt, layout, p);
          float[][] st = OpChecks.stateOrder(r.get(0), r.get(1), layout);
          String err = OpChecks.check(st[0], st[1], q, k, v, null, null, opt);
          assertNull(err, layout + " path " + p + ", seed " + seed + ": " + err);
        }
      }
    }
  }

  @Test
  void float16InputsAreWidened() {
    long seed = Seeds.forTest();
    SplittableRandom rng = new SplittableRandom(seed);
    Tensor q = Tensor.random(rng, 1, 4, 80, 64), k = Tensor.random(rng, 1, 2, 80, 64);
    Tensor v = Tensor.random(rng, 1, 2, 80, 64);
    try (NDManager m = manager.newSubManager()) {
      NDArray qh = OpChecks.nd(m, q, Layout.BHTD).toType(DataType.FLOAT16, false);
      NDArray kh = OpChecks.nd(m, k, Layout.BHTD).toType(DataType.FLOAT16, false);
      NDArray vh = OpChecks.nd(m, v, Layout.BHTD).toType(DataType.FLOAT16, false);
      // The reference sees the same fp16-rounded values.
      Tensor q16 = new Tensor(qh.toType(DataType.FLOAT32, false).toFloatArray(), 1, 4, 80, 64);
      Tensor k16 = new Tensor(kh.toType(DataType.FLOAT32, false).toFloatArray(), 1, 2, 80, 64);
      Tensor v16 = new Tensor(vh.toType(DataType.FLOAT32, false).toFloatArray(), 1, 2, 80, 64);
      AttentionOptions opt = AttentionOptions.DEFAULT.withCausal(true);
      for (Path p : new Path[] {Path.JAVA, Path.LIBTORCH}) {
        NDList r = OP.forward(qh, kh, vh, null, null, opt, Layout.BHTD, p);
        assertEquals(DataType.FLOAT32, r.get(0).getDataType());
        float[][] st = OpChecks.stateOrder(r.get(0), r.get(1), Layout.BHTD);
        String err = OpChecks.check(st[0], st[1], q16, k16, v16, null, null, opt);
        assertNull(err, "fp16 path " + p + ", seed " + seed + ": " + err);
      }
    }
  }

  @Test
  void theJavaPathsReusedInputCopiesNeverCarryOneCallIntoTheNext() {
    // The Java path copies q, k and v into arrays it keeps per thread; calls of one shape with
    // different inputs (and q, k, v of another shape in between) must each give the kernel's own
    // bits for their own inputs.
    long seed = Seeds.forTest();
    SplittableRandom rng = new SplittableRandom(seed);
    AttentionOptions opt = AttentionOptions.DEFAULT.withCausal(true);
    try (NDManager m = manager.newSubManager()) {
      for (int call = 0; call < 4; call++) {
        int t = call == 2 ? 40 : 72;
        Tensor q = Tensor.random(rng, 1, 4, t, 64), k = Tensor.random(rng, 1, 2, t, 64);
        Tensor v = Tensor.random(rng, 1, 2, t, 64);
        NDList r = OP.forward(OpChecks.nd(m, q, Layout.BHTD), OpChecks.nd(m, k, Layout.BHTD),
            OpChecks.nd(m, v, Layout.BHTD), null, null, opt, Layout.BHTD, Path.JAVA);
        float[][] st = OpChecks.stateOrder(r.get(0), r.get(1), Layout.BHTD);
        AttentionState want = CpuAttention.DEFAULT.forward(q, k, v, null, null, opt);
        assertTrue(java.util.Arrays.equals(want.o(), st[0]) && java.util.Arrays.equals(want.lse(), st[1]),
            "call " + call + " (T = " + t + "), seed " + seed + ": not the kernel's bits for these inputs");
      }
    }
  }

  @Test
  void largeArraysCopiedOnTheKernelThreadsHoldTheKernelsBitsInBothLayouts() {
    // Arrays of 1 MiB and more (here q and o) are copied in pieces on the kernels' pool: B * H = 4
    // heads of 2101 rows, each cut in pieces where the pool has more than 4 tasks' worth of threads,
    // and the BTHD copy in ranges that cut rows in two.
    long seed = Seeds.forTest();
    SplittableRandom rng = new SplittableRandom(seed);
    AttentionOptions opt = AttentionOptions.DEFAULT;
    Tensor q = Tensor.random(rng, 2, 2, 2101, 64), k = Tensor.random(rng, 2, 1, 40, 64);
    Tensor v = Tensor.random(rng, 2, 1, 40, 64);
    assertTrue(q.data().length >= 1 << 18, "the shape must reach the parallel copy");
    AttentionState want = CpuAttention.DEFAULT.forward(q, k, v, null, null, opt);
    try (NDManager m = manager.newSubManager()) {
      for (Layout layout : Layout.values()) {
        NDList r = OP.forward(OpChecks.nd(m, q, layout), OpChecks.nd(m, k, layout), OpChecks.nd(m, v, layout), null,
            null, opt, layout, Path.JAVA);
        float[][] st = OpChecks.stateOrder(r.get(0), r.get(1), layout);
        assertTrue(java.util.Arrays.equals(want.o(), st[0]) && java.util.Arrays.equals(want.lse(), st[1]),
            layout + ", seed " + seed + ": not the kernel's bits");
      }
    }
  }

  /**
   * Inputs whose memory is in either order, given contiguous or as transposed views (read in their
   * memory's order, not copied by libtorch; k and v of different orders, one copied), forward and
   * decode: the kernel's bits on float[] copies.
   */
  @Test
  void inputsInEitherMemoryOrderAndTransposedViewsHoldTheKernelsBits() {
    assertTrue(AttentionOp.contiguityKnown(), "DJL's is_contiguous binding is gone: transposed views would be copied");
    long seed = Seeds.forTest();
    SplittableRandom rng = new SplittableRandom(seed);
    AttentionOptions opt = AttentionOptions.DEFAULT.withCausal(true);
    for (int tq : new int[] {3, 77}) { // split-K decode and the forward
      Tensor q = Tensor.random(rng, 2, 4, tq, 32), k = Tensor.random(rng, 2, 2, 90, 32);
      Tensor v = Tensor.random(rng, 2, 2, 90, 32);
      long[] qPos = new long[tq];
      for (int t = 0; t < tq; t++) {
        qPos[t] = 90 - tq + t;
      }
      AttentionState want = tq <= AttentionOp.SPLIT_K_MAX_QUERY_ROWS
          ? CpuAttention.DEFAULT.decode(q, k, v, qPos, null, opt)
          : CpuAttention.DEFAULT.forward(q, k, v, qPos, null, opt);
      try (NDManager m = manager.newSubManager()) {
        // Each of q, k and v contiguous or a transposed view of the other order's memory, in both layouts:
        // a k and v in different memory orders (a grown K cache beside a transposed V) included.
        for (int form = 0; form < 16; form++) {
          Layout layout = (form & 8) == 0 ? Layout.BHTD : Layout.BTHD;
          NDArray[] in = new NDArray[3];
          Tensor[] x = {q, k, v};
          StringBuilder name = new StringBuilder(layout.toString());
          for (int i = 0; i < 3; i++) {
            boolean view = (form & (1 << i)) != 0;
            name.append(view ? ", " + "qkv".charAt(i) + " a view" : "");
            NDArray bhtd = m.create(x[i].data(), new Shape(x[i].batch(), x[i].heads(), x[i].tokens(), x[i].dim()));
            NDArray bthd = m.create(bhtd.transpose(0, 2, 1, 3).toFloatArray(),
                new Shape(x[i].batch(), x[i].tokens(), x[i].heads(), x[i].dim()));
            in[i] = !view ? (layout == Layout.BHTD ? bhtd : bthd) : (layout == Layout.BHTD ? bthd : bhtd).transpose(0, 2, 1, 3);
            assertEquals(!view, AttentionOp.contiguous(in[i]), name.toString());
          }
          NDList r = OP.forward(in[0], in[1], in[2], qPos, null, opt, layout, Path.JAVA);
          float[][] st = OpChecks.stateOrder(r.get(0), r.get(1), layout);
          assertTrue(java.util.Arrays.equals(want.o(), st[0]) && java.util.Arrays.equals(want.lse(), st[1]),
              name + ", Tq " + tq + ", seed " + seed + ": not the kernel's bits");
          if (tq <= AttentionOp.SPLIT_K_MAX_QUERY_ROWS) {
            NDList dr = OP.decode(in[0], in[1], in[2], qPos, null, opt, layout);
            float[][] ds = OpChecks.stateOrder(dr.get(0), dr.get(1), layout);
            assertTrue(java.util.Arrays.equals(want.o(), ds[0]) && java.util.Arrays.equals(want.lse(), ds[1]),
                "decode, " + name + ", seed " + seed + ": not the kernel's bits");
          }
        }
      }
    }
  }

  @Test
  void decodeOverArrayAndChunksMatchesReference() {
    long seed = Seeds.forTest();
    SplittableRandom rng = new SplittableRandom(seed);
    int tk = 9000; // three splits of 4096
    Tensor q = Tensor.random(rng, 2, 8, 1, 64, 1.5), k = Tensor.random(rng, 2, 2, tk, 64, 1.5);
    Tensor v = Tensor.random(rng, 2, 2, tk, 64);
    long[] qPos = {tk - 1};
    AttentionOptions opt = AttentionOptions.DEFAULT.withCausal(true);
    for (Layout layout : Layout.values()) {
      try (NDManager m = manager.newSubManager()) {
        NDArray qa = OpChecks.nd(m, q, layout), ka = OpChecks.nd(m, k, layout), va = OpChecks.nd(m, v, layout);
        NDList r = OP.decode(qa, ka, va, qPos, null, opt, layout);
        float[][] st = OpChecks.stateOrder(r.get(0), r.get(1), layout);
        String err = OpChecks.check(st[0], st[1], q, k, v, qPos, null, opt);
        assertNull(err, "decode " + layout + ", seed " + seed + ": " + err);
        // q, K and V read in place: the kernel's bits on float[] copies.
        AttentionState want = CpuAttention.DEFAULT.decode(q, k, v, qPos, null, opt);
        assertTrue(java.util.Arrays.equals(want.o(), st[0]) && java.util.Arrays.equals(want.lse(), st[1]),
            "decode " + layout + ", seed " + seed + ": not the kernel's bits");
        // Chunks of 1000, 5000, 3000 keys laid end to end. Arrays of their own and transposed views of
        // arrays in the other order, alone or mixed (k and v chunks apart), are read as pages of one K
        // and V: the one array's bits. Strided slices of one array (batch 2) are copied a chunk at a
        // time, each chunk decoded alone and the states merged in order: those bits, within tolerance.
        int tAxis = layout == Layout.BHTD ? 2 : 1;
        int[] cuts = {0, 1000, 6000, tk};
        List<AttentionState> parts = new ArrayList<>();
        for (int c = 0; c < 3; c++) {
          long[] kPos = new long[cuts[c + 1] - cuts[c]];
          for (int j = 0; j < kPos.length; j++) {
            kPos[j] = cuts[c] + j;
          }
          parts.add(CpuAttention.DEFAULT.decode(q, k.sliceTokens(cuts[c], cuts[c + 1]),
              v.sliceTokens(cuts[c], cuts[c + 1]), qPos, kPos, opt));
        }
        AttentionState merged = AttentionState.mergeAll(parts);
        String[] kinds = {"own arrays", "transposed views", "slices"};
        for (String kind : new String[] {"own arrays", "transposed views", "views mixed", "slices", "slices mixed"}) {
          List<NDArray> kc = new ArrayList<>(), vc = new ArrayList<>();
          for (int c = 0; c < 3; c++) {
            String idx = tAxis == 2 ? ":, :, " + cuts[c] + ":" + cuts[c + 1] : ":, " + cuts[c] + ":" + cuts[c + 1];
            String kKind = kind.equals("views mixed") ? kinds[c % 2] : kind.equals("slices mixed") ? kinds[c] : kind;
            String vKind = kind.equals("views mixed") ? kinds[1 - c % 2]
                : kind.equals("slices mixed") ? kinds[2 - c] : kind;
            NDArray ks = chunkAs(m, ka.get(idx), kKind), vs = chunkAs(m, va.get(idx), vKind);
            kc.add(ks);
            vc.add(vs);
            assertEquals(kKind.equals("own arrays"), AttentionOp.contiguous(ks), "chunk " + c + ", " + kind);
          }
          String what = "chunked decode " + layout + ", " + kind + ", seed " + seed;
          NDList rc = OP.decode(qa, kc, vc, qPos, null, opt, layout);
          float[][] sc = OpChecks.stateOrder(rc.get(0), rc.get(1), layout);
          err = OpChecks.check(sc[0], sc[1], q, k, v, qPos, null, opt);
          assertNull(err, what + ": " + err);
          AttentionState bits = kind.startsWith("slices") ? merged : want;
          assertTrue(java.util.Arrays.equals(bits.o(), sc[0]) && java.util.Arrays.equals(bits.lse(), sc[1]),
              what + (bits == want ? ": not the one array's bits" : ": not each chunk's decode merged in order"));
        }
      }
    }
  }

  /**
   * Chunks that are contiguous slices of one array (batch 1, BTHD, cut along T: each starts inside
   * the array's memory) are read in place from their own first element: the one array's bits.
   */
  @Test
  void contiguousSlicesAreReadFromTheirOwnStart() {
    long seed = Seeds.forTest();
    SplittableRandom rng = new SplittableRandom(seed);
    int tk = 700;
    Tensor q = Tensor.random(rng, 1, 4, 2, 32), k = Tensor.random(rng, 1, 2, tk, 32);
    Tensor v = Tensor.random(rng, 1, 2, tk, 32);
    try (NDManager m = manager.newSubManager()) {
      NDArray qa = OpChecks.nd(m, q, Layout.BTHD), ka = OpChecks.nd(m, k, Layout.BTHD);
      NDArray va = OpChecks.nd(m, v, Layout.BTHD);
      ka = m.create(ka.toFloatArray(), ka.getShape()); // contiguous in BTHD order
      va = m.create(va.toFloatArray(), va.getShape());
      List<NDArray> kc = new ArrayList<>(), vc = new ArrayList<>();
      int[] cuts = {0, 129, 130, 511, tk};
      for (int c = 0; c + 1 < cuts.length; c++) {
        NDArray ks = ka.get(":, " + cuts[c] + ":" + cuts[c + 1]), vs = va.get(":, " + cuts[c] + ":" + cuts[c + 1]);
        assertTrue(AttentionOp.contiguous(ks) && AttentionOp.contiguous(vs),
            "chunk " + c + " must be a contiguous slice");
        kc.add(ks);
        vc.add(vs);
      }
      NDList one = OP.decode(qa, ka, va, null, null, AttentionOptions.DEFAULT, Layout.BTHD);
      float[][] want = OpChecks.stateOrder(one.get(0), one.get(1), Layout.BTHD);
      NDList r = OP.decode(qa, kc, vc, null, null, AttentionOptions.DEFAULT, Layout.BTHD);
      float[][] got = OpChecks.stateOrder(r.get(0), r.get(1), Layout.BTHD);
      assertTrue(java.util.Arrays.equals(want[0], got[0]) && java.util.Arrays.equals(want[1], got[1]),
          "seed " + seed + ": chunks as contiguous slices are not the one array's bits");
      String err = OpChecks.check(got[0], got[1], q, k, v, null, null, AttentionOptions.DEFAULT);
      assertNull(err, "seed " + seed + ": " + err);
    }
  }

  /** A chunk (a strided slice) as it is, as an array of its own, or as a transposed view ({@link #otherOrder}). */
  private static NDArray chunkAs(NDManager m, NDArray slice, String kind) {
    return switch (kind) {
      case "slices" -> slice;
      case "own arrays" -> m.create(slice.toFloatArray(), slice.getShape());
      default -> otherOrder(m, slice);
    };
  }

  /** a's values as a transposed view (T and H axes) of a new contiguous array in the other order. */
  private static NDArray otherOrder(NDManager m, NDArray a) {
    NDArray t = a.transpose(0, 2, 1, 3);
    return m.create(t.toFloatArray(), t.getShape()).transpose(0, 2, 1, 3);
  }

  /** Of several bad chunks, the first is named, every time (not the first a thread met). */
  @Test
  void chunkListDecodeNamesTheFirstBadChunk() {
    try (NDManager m = manager.newSubManager()) {
      NDArray q = m.randomNormal(new Shape(1, 2, 1, 16));
      List<NDArray> kc = new ArrayList<>(), vc = new ArrayList<>();
      for (int c = 0; c < 8; c++) {
        float[] k = m.randomNormal(new Shape(1, 2, 16, 16)).toFloatArray();
        if (c == 2 || c == 6) {
          k[(16 + 5) * 16 + 3] = Float.POSITIVE_INFINITY; // head 1, the chunk's token 5
        }
        kc.add(m.create(k, new Shape(1, 2, 16, 16)));
        vc.add(m.randomNormal(new Shape(1, 2, 16, 16)));
      }
      for (int run = 0; run < 5; run++) {
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
            () -> OP.decode(q, kc, vc, null, null, AttentionOptions.DEFAULT, Layout.BHTD));
        assertTrue(e.getMessage().contains(String.valueOf(2 * 16 + 5)) && !e.getMessage().contains(String.valueOf(6 * 16 + 5)),
            "run " + run + ": " + e.getMessage());
      }
    }
  }

  /** Decode converts float16 K/V (here BTHD) through libtorch before reading them; an empty cache gives empty rows. */
  @Test
  void decodeOfHalfPrecisionAndEmptyCaches() {
    long seed = Seeds.forTest();
    SplittableRandom rng = new SplittableRandom(seed);
    Tensor q = Tensor.random(rng, 1, 4, 1, 32), k = Tensor.random(rng, 1, 2, 50, 32);
    Tensor v = Tensor.random(rng, 1, 2, 50, 32);
    AttentionOptions opt = AttentionOptions.DEFAULT.withCausal(true);
    long[] qPos = {49};
    try (NDManager m = manager.newSubManager()) {
      NDArray kh = OpChecks.nd(m, k, Layout.BTHD).toType(DataType.FLOAT16, false);
      NDArray vh = OpChecks.nd(m, v, Layout.BTHD).toType(DataType.FLOAT16, false);
      Tensor k16 = new Tensor(kh.transpose(0, 2, 1, 3).toType(DataType.FLOAT32, false).toFloatArray(), 1, 2, 50, 32);
      Tensor v16 = new Tensor(vh.transpose(0, 2, 1, 3).toType(DataType.FLOAT32, false).toFloatArray(), 1, 2, 50, 32);
      NDList r = OP.decode(OpChecks.nd(m, q, Layout.BTHD), kh, vh, qPos, null, opt, Layout.BTHD);
      float[][] st = OpChecks.stateOrder(r.get(0), r.get(1), Layout.BTHD);
      AttentionState want = CpuAttention.DEFAULT.decode(q, k16, v16, qPos, null, opt);
      assertTrue(java.util.Arrays.equals(want.o(), st[0]) && java.util.Arrays.equals(want.lse(), st[1]),
          "seed " + seed + ": float16 K/V are not the kernel's bits on their float32 values");

      NDArray empty = m.zeros(new Shape(1, 2, 0, 32));
      NDList e = OP.decode(OpChecks.nd(m, q, Layout.BHTD), empty, empty, qPos, null, opt, Layout.BHTD);
      float[][] es = OpChecks.stateOrder(e.get(0), e.get(1), Layout.BHTD);
      for (float x : es[0]) {
        assertEquals(0f, x);
      }
      for (float x : es[1]) {
        assertEquals(Float.NEGATIVE_INFINITY, x);
      }
    }
  }

  @Test
  void mergeOfKeyHalvesEqualsFullAttention() {
    long seed = Seeds.forTest();
    SplittableRandom rng = new SplittableRandom(seed);
    int tk = 300;
    Tensor q = Tensor.random(rng, 1, 4, 50, 32, 1.5), k = Tensor.random(rng, 1, 4, tk, 32, 1.5);
    Tensor v = Tensor.random(rng, 1, 4, tk, 32);
    long[] qPos = new long[50];
    for (int i = 0; i < 50; i++) {
      qPos[i] = tk - 50 + i;
    }
    long[] kPos1 = new long[120], kPos2 = new long[tk - 120];
    for (int i = 0; i < tk; i++) {
      if (i < 120) {
        kPos1[i] = i;
      } else {
        kPos2[i - 120] = i;
      }
    }
    AttentionOptions opt = AttentionOptions.DEFAULT.withCausal(true);
    for (Layout layout : Layout.values()) {
      try (NDManager m = manager.newSubManager()) {
        NDArray qa = OpChecks.nd(m, q, layout), ka = OpChecks.nd(m, k, layout), va = OpChecks.nd(m, v, layout);
        String a = layout == Layout.BHTD ? ":, :, 0:120" : ":, 0:120";
        String b = layout == Layout.BHTD ? ":, :, 120:" : ":, 120:";
        NDList s1 = OP.forward(qa, ka.get(a), va.get(a), qPos, kPos1, opt, layout, Path.AUTO);
        NDList s2 = OP.forward(qa, ka.get(b), va.get(b), qPos, kPos2, opt, layout, Path.AUTO);
        NDList merged = OP.merge(s1, s2, layout);
        float[][] st = OpChecks.stateOrder(merged.get(0), merged.get(1), layout);
        String err = OpChecks.check(st[0], st[1], q, k, v, qPos, null, opt);
        assertNull(err, "merge " + layout + ", seed " + seed + ": " + err);
      }
    }
  }

  @Test
  void badInputsAreRejectedClearly() {
    try (NDManager m = manager.newSubManager()) {
      NDArray q = m.randomNormal(new Shape(1, 4, 8, 32));
      NDArray k = m.randomNormal(new Shape(1, 2, 8, 32));
      AttentionOptions opt = AttentionOptions.DEFAULT;
      assertMessage(() -> OP.forward(m.randomNormal(new Shape(4, 8, 32)), k, k, opt), "4-d");
      assertMessage(() -> OP.forward(q, k, m.randomNormal(new Shape(1, 2, 9, 32)), opt), "same shape");
      assertMessage(() -> OP.forward(q, m.randomNormal(new Shape(1, 3, 8, 32)), m.randomNormal(new Shape(1, 3, 8, 32)),
          opt), "multiple of kv heads");
      assertMessage(() -> OP.forward(q, m.randomNormal(new Shape(1, 2, 8, 16)), m.randomNormal(new Shape(1, 2, 8, 16)),
          opt), "head dim");
      assertMessage(() -> OP.forward(q, m.randomNormal(new Shape(2, 2, 8, 32)), m.randomNormal(new Shape(2, 2, 8, 32)),
          opt), "batch");
      assertMessage(() -> OP.forward(q.toType(DataType.FLOAT64, false), k, k, opt), "float32 or float16");
      assertMessage(() -> OP.forward(q, k.toType(DataType.INT32, false), k, opt), "float32 or float16");
      assertMessage(() -> OP.forward(q, k, k, new long[3], null, opt, Layout.BHTD, Path.AUTO), "qPos");
      // bfloat16: rejected from the dtype alone. The rule is tested without an array: making a bfloat16
      // NDArray (toType) crashes the JVM in DJL 0.35.1 (tried: the surefire fork died with exit 134).
      assertMessage(() -> AttentionOp.checkType(DataType.BFLOAT16, "PyTorch", "q"), "q is bfloat16");
      assertMessage(() -> AttentionOp.checkType(DataType.FLOAT32, "MXNet", "k"), "PyTorch-engine");
      assertMessage(() -> OP.merge(List.of(), Layout.BHTD), "at least one");
      NDArray nanLse = m.create(new float[] {Float.NaN, 0, 0, 0}, new Shape(1, 4, 1));
      NDArray o = m.zeros(new Shape(1, 4, 1, 32));
      assertMessage(() -> OP.merge(new NDList(o, nanLse), new NDList(o, nanLse), Layout.BHTD), "NaN");
      assertMessage(() -> OP.decode(q, List.of(k), List.of(), null, null, opt, Layout.BHTD), "chunks");
    }
  }

  /**
   * NaN and Infinity in the inputs are named on every path: libtorch's kernel passed them on to its
   * output without a word. So are a scale float32 cannot hold and chunk positions past Long.MAX_VALUE.
   */
  @Test
  void nonFiniteInputsAreNamedOnTheLibtorchPathToo() {
    try (NDManager m = manager.newSubManager()) {
      AttentionOptions causal = AttentionOptions.DEFAULT.withCausal(true);
      for (int which = 0; which < 3; which++) {
        NDArray q = m.randomNormal(new Shape(1, 2, 64, 16));
        NDArray k = m.randomNormal(new Shape(1, 2, 64, 16));
        NDArray v = m.randomNormal(new Shape(1, 2, 64, 16));
        NDArray bad = which == 0 ? q : which == 1 ? k : v;
        float[] x = bad.toFloatArray();
        x[(64 + 9) * 16 + 3] = which == 0 ? Float.NaN : Float.POSITIVE_INFINITY; // head 1, token 9, dim 3
        NDArray b = m.create(x, bad.getShape());
        NDArray qq = which == 0 ? b : q, kk = which == 1 ? b : k, vv = which == 2 ? b : v;
        for (Path path : new Path[] {Path.JAVA, Path.LIBTORCH}) {
          IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
              () -> OP.forward(qq, kk, vv, null, null, causal, Layout.BHTD, path), path + ", case " + which);
          assertTrue(e.getMessage().contains("head 1"), path + ", case " + which + ": " + e.getMessage());
        }
      }
      NDArray q = m.randomNormal(new Shape(1, 2, 64, 16));
      assertMessage(() -> OP.forward(q, q, q, null, null, AttentionOptions.DEFAULT.withScale(1e-45), Layout.BHTD,
          Path.LIBTORCH), "score scale");
      NDArray one = m.randomNormal(new Shape(1, 2, 1, 16));
      NDArray chunk = m.randomNormal(new Shape(1, 2, 4, 16));
      assertMessage(() -> OP.decode(one, List.of(chunk), List.of(chunk), new long[] {Long.MAX_VALUE - 1},
          new long[] {Long.MAX_VALUE - 1}, causal, Layout.BHTD), "pass Long.MAX_VALUE");
    }
  }

  private static void assertMessage(org.junit.jupiter.api.function.Executable call, String part) {
    IllegalArgumentException e = assertThrows(IllegalArgumentException.class, call);
    assertTrue(e.getMessage().contains(part), "message '" + e.getMessage() + "' should mention '" + part + "'");
  }

  /**
   * libtorch declines a call whose q.k could overflow, after timing only its check: that round once
   * decided the class for the JVM (libtorch, ~1.7x slower than Java on the class's later calls).
   */
  private static void assumeAutoStaysOnTheCpu() {
    org.junit.jupiter.api.Assumptions.assumeFalse(io.longctx.kernels.CudaProbe.status().available(),
        "a GPU is present: AUTO takes the CUDA path");
  }

  /**
   * A stand-in measurement answering by rule; it counts its calls and runs both paths once, as the
   * real one does, so their set-up (and libtorch's declining a call) is exercised too.
   */
  private static AttentionOp.Calibrator runsBothPaths(java.util.concurrent.atomic.AtomicInteger calls,
      java.util.function.Function<AttentionOp.ShapeClass, Path> answer) {
    return (shape, java, libtorch) -> {
      calls.incrementAndGet();
      java.run();
      libtorch.run();
      return Measured.untimed(answer.apply(shape));
    };
  }

  /**
   * Arrays of 2^29 float32 elements and more (2 GiB) passed the 2^31 check and failed inside DJL
   * ("torchDirectByteBuffer() is not supported for large tensor"); the rule on shapes alone, as such
   * arrays are too large to make in a test (checked by hand on 2026-11-28: decode refused k [1, 1,
   * 8388608, 64] so, one key fewer ran; since 2026-11-29 decode reads such a batch-1 token-major cache
   * in pages, {@link #decodeReadsACacheTooLargeForOneBufferInPages}).
   */
  @Test
  void arraysTooLargeForADirectBufferAreNamed() {
    Shape q = new Shape(1, 8, 1, 64), k = new Shape(1, 1, 8388608, 64);
    String why = AttentionOp.bufferProblem(q, k);
    assertTrue(why != null && why.startsWith("k (1, 1, 8388608, 64) has 536,870,912 elements") && why.contains(
        "at most 536,870,911 float32 elements per array"), why);
    assertNull(AttentionOp.bufferProblem(q, new Shape(1, 1, 8388607, 64)));
    assertTrue(AttentionOp.bufferProblem(new Shape(1, 8, 1048576, 64), q).startsWith("q (1, 8, 1048576, 64)"));
  }

  /**
   * K/V past the direct-buffer limit (lowered here to a few hundred floats) are read as pages of
   * tokens where their memory is token-major with batch 1, in either layout: the one array's bits.
   * Elsewhere the pages would be copies, and the call is refused naming k.
   */
  @Test
  void decodeReadsACacheTooLargeForOneBufferInPages() {
    long seed = Seeds.forTest();
    SplittableRandom rng = new SplittableRandom(seed);
    int tk = 1000;
    AttentionOptions opt = AttentionOptions.DEFAULT.withCausal(true);
    long[] qPos = {tk - 2, tk - 1};
    for (Layout layout : Layout.values()) {
      for (int batch : new int[] {1, 2}) {
        Tensor q = Tensor.random(rng, batch, 4, 2, 16), k = Tensor.random(rng, batch, 2, tk, 16);
        Tensor v = Tensor.random(rng, batch, 2, tk, 16);
        try (NDManager m = manager.newSubManager()) {
          NDArray qa = OpChecks.nd(m, q, layout);
          for (boolean tokenMajorMemory : new boolean[] {true, false}) {
            NDArray ka = memoryOrder(m, OpChecks.nd(m, k, layout), layout, tokenMajorMemory);
            NDArray va = memoryOrder(m, OpChecks.nd(m, v, layout), layout, tokenMajorMemory);
            String what = layout + ", batch " + batch + ", token-major memory " + tokenMajorMemory + ", seed " + seed;
            NDList one = OP.decode(qa, ka, va, qPos, null, opt, layout);
            if (batch == 1 && tokenMajorMemory) {
              NDList paged = OP.decode(qa, ka, va, qPos, null, opt, layout, 16 * 2 * 300); // pages of 300 tokens
              assertArrayEquals(one.get(0).toFloatArray(), paged.get(0).toFloatArray(), what);
              assertArrayEquals(one.get(1).toFloatArray(), paged.get(1).toFloatArray(), what);
            } else {
              IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
                  () -> OP.decode(qa, ka, va, qPos, null, opt, layout, 16 * 2 * 300));
              assertTrue(e.getMessage().startsWith("k (") && e.getMessage().contains("token-major memory with batch 1"),
                  what + ": " + e.getMessage());
            }
          }
        }
      }
    }
  }

  /** a (in the layout's shape) with its memory in [B, T, H, D] order where tokenMajor, else in [B, H, T, D]. */
  private static NDArray memoryOrder(NDManager m, NDArray a, Layout layout, boolean tokenMajor) {
    boolean same = tokenMajor == (layout == Layout.BTHD);
    if (same) {
      return m.create(a.toFloatArray(), a.getShape());
    }
    NDArray t = a.transpose(0, 2, 1, 3);
    return m.create(t.toFloatArray(), t.getShape()).transpose(0, 2, 1, 3);
  }

  @Test
  void aCallLibtorchDoesNotAnswerDoesNotDecideItsShapeClass() {
    assumeAutoStaysOnTheCpu();
    java.util.concurrent.atomic.AtomicInteger calls = new java.util.concurrent.atomic.AtomicInteger();
    AttentionOp op = new AttentionOp(CpuAttention.DEFAULT, runsBothPaths(calls, shape -> Path.LIBTORCH));
    try (NDManager m = manager.newSubManager()) {
      NDArray a = m.randomNormal(new Shape(1, 2, 64, 32));
      NDArray huge = a.mul(1e18f); // q.k may overflow by libtorch's bound: it gives no answer
      AttentionOptions causal = AttentionOptions.DEFAULT.withCausal(true);
      assertEquals(Path.JAVA, op.choose(huge, a, a, null, null, causal, Layout.BHTD));
      assertEquals(1, calls.get());
      assertEquals(Path.LIBTORCH, op.choose(a, a, a, null, null, causal, Layout.BHTD));
      assertEquals(2, calls.get(), "the class is measured on the next call, which libtorch answers");
      assertEquals(Path.LIBTORCH, op.choose(huge, a, a, null, null, causal, Layout.BHTD));
      assertEquals(2, calls.get(), "then kept");
      try (NDList viaAuto = op.forward(huge, a, a, null, null, causal, Layout.BHTD, Path.AUTO);
          NDList java = op.forward(huge, a, a, null, null, causal, Layout.BHTD, Path.JAVA)) {
        assertArrayEquals(java.get(0).toFloatArray(), viaAuto.get(0).toFloatArray(), "AUTO falls back to Java");
      }
    }
  }

  /**
   * A measurement takes up to seconds: calls of other shape classes go on meanwhile (it ran inside the
   * map's lock, which held calls of classes sharing its bin), calls of the same class wait for its answer.
   */
  @Test
  @org.junit.jupiter.api.Timeout(120)
  void aMeasurementHoldsOnlyTheCallsOfItsOwnShapeClass() throws Exception {
    assumeAutoStaysOnTheCpu();
    java.util.concurrent.CountDownLatch measuring = new java.util.concurrent.CountDownLatch(1);
    java.util.concurrent.CountDownLatch release = new java.util.concurrent.CountDownLatch(1);
    java.util.concurrent.ConcurrentHashMap<Boolean, java.util.concurrent.atomic.AtomicInteger> calls =
        new java.util.concurrent.ConcurrentHashMap<>();
    AttentionOp op = new AttentionOp(CpuAttention.DEFAULT, (shape, java, libtorch) -> {
      calls.computeIfAbsent(shape.causal(), c -> new java.util.concurrent.atomic.AtomicInteger()).incrementAndGet();
      if (shape.causal()) {
        measuring.countDown();
        try {
          release.await();
        } catch (InterruptedException e) {
          Thread.currentThread().interrupt();
        }
      }
      return Measured.untimed(shape.causal() ? Path.JAVA : Path.LIBTORCH);
    });
    java.util.concurrent.ExecutorService pool = java.util.concurrent.Executors.newFixedThreadPool(2);
    try (NDManager m = manager.newSubManager()) {
      NDArray a = m.randomNormal(new Shape(1, 2, 64, 32));
      AttentionOptions full = AttentionOptions.DEFAULT, causal = full.withCausal(true);
      java.util.concurrent.Future<Path> first = pool.submit(() -> op.choose(a, a, a, null, null, causal, Layout.BHTD));
      measuring.await();
      java.util.concurrent.Future<Path> second = pool.submit(() -> op.choose(a, a, a, null, null, causal, Layout.BHTD));
      try {
        assertEquals(Path.LIBTORCH, op.choose(a, a, a, null, null, full, Layout.BHTD), "another class, meanwhile");
        Thread.sleep(100);
        assertFalse(second.isDone(), "a call of the class being measured waits for the measurement");
      } finally {
        release.countDown();
      }
      assertEquals(Path.JAVA, first.get());
      assertEquals(Path.JAVA, second.get());
      assertEquals(1, calls.get(true).get(), "measured once");
    } finally {
      pool.shutdownNow();
    }
  }

  @Test
  void calibrationPicksTheFasterPathOncePerShapeClassAndAPropertyForcesIt() {
    assumeAutoStaysOnTheCpu();
    java.util.concurrent.atomic.AtomicInteger calls = new java.util.concurrent.atomic.AtomicInteger();
    // Java faster for causal calls, libtorch for the rest.
    AttentionOp op = new AttentionOp(CpuAttention.DEFAULT,
        runsBothPaths(calls, shape -> shape.causal() ? Path.JAVA : Path.LIBTORCH));
    try (NDManager m = manager.newSubManager()) {
      NDArray a = m.randomNormal(new Shape(1, 2, 100, 32));
      NDArray b = m.randomNormal(new Shape(1, 2, 120, 32)); // same power-of-two class (128) as 100
      AttentionOptions full = AttentionOptions.DEFAULT, causal = full.withCausal(true);
      assertEquals(Path.LIBTORCH, op.choose(a, a, a, null, null, full, Layout.BHTD));
      assertEquals(Path.JAVA, op.choose(a, a, a, null, null, causal, Layout.BHTD));
      assertEquals(2, calls.get());
      assertEquals(Path.JAVA, op.choose(b, b, b, null, null, causal, Layout.BHTD));
      op.forward(a, a, a, null, null, causal, Layout.BHTD, Path.AUTO).close();
      assertEquals(2, calls.get(), "a class is measured once per operator and kept");
      String old = System.getProperty(AttentionOp.PATH_PROPERTY);
      try {
        System.setProperty(AttentionOp.PATH_PROPERTY, "libtorch");
        assertEquals(Path.LIBTORCH, op.choose(a, a, a, null, null, causal, Layout.BHTD));
        assertEquals(Path.JAVA, op.choose(a, a, a, null, null, causal.withWindow(8), Layout.BHTD),
            "forcing libtorch never sends it a call it cannot compute");
        System.setProperty(AttentionOp.PATH_PROPERTY, "java");
        assertEquals(Path.JAVA, op.choose(a, a, a, null, null, full, Layout.BHTD));
        System.setProperty(AttentionOp.PATH_PROPERTY, "fast");
        assertThrows(IllegalArgumentException.class, () -> op.choose(a, a, a, null, null, full, Layout.BHTD));
      } finally {
        if (old == null) {
          System.clearProperty(AttentionOp.PATH_PROPERTY);
        } else {
          System.setProperty(AttentionOp.PATH_PROPERTY, old);
        }
      }
      assertEquals(2, calls.get());
    }
  }

  @Test
  void theTimedCalibrationOutlastsASlowStartAndAlternatesOrder() {
    // libtorch's first two timed calls hit the slow tail (30 ms), then it runs 5 ms; Java always 20 ms.
    // Two rounds alone would pick Java; the budget buys more rounds (2 s, so that even sleeps badly
    // overshot on a loaded machine leave room for a third round; unloaded, 8 rounds take ~0.3 s).
    // Sleeps only overshoot, so load cannot turn the answer around (5 ms would have to take 20 in
    // every later round).
    StringBuilder order = new StringBuilder();
    int[] libtorchCalls = {0};
    Measured m = AttentionOp.timed(2, 8, 2_000_000_000L, 0, NO_JIT_CLOCK).faster(null,
        () -> {
          order.append('J');
          sleep(20);
        },
        () -> {
          order.append('L');
          int n = libtorchCalls[0]++;
          sleep(n >= 1 && n <= 2 ? 30 : 5); // call 0 is the untimed one
        });
    assertEquals(Path.LIBTORCH, m.faster(), m.toString());
    assertTrue(m.rounds() >= 3 && m.rounds() <= 8, m.toString());
    assertTrue(m.javaMs() >= 20 && m.libtorchMs() >= 5 && m.libtorchMs() < m.javaMs(), m.toString());
    StringBuilder expected = new StringBuilder("JL");
    for (int r = 0; r < m.rounds(); r++) {
      expected.append(r % 2 == 0 ? "JL" : "LJ");
    }
    assertEquals(expected.toString(), order.toString(), "untimed pair, then the order swaps every round");

    // A call longer than the budget gets the minimum of rounds, no more, where the paths are far apart
    // (3x: a sleep would have to overshoot by 40 ms in both rounds to make it close).
    Measured slow = AttentionOp.timed(2, 8, 50_000_000L, 0, NO_JIT_CLOCK).faster(null, () -> sleep(20), () -> sleep(60));
    assertEquals(2, slow.rounds(), slow.toString());
    assertEquals(Path.JAVA, slow.faster(), slow.toString());
  }

  /** A JVM that does not say how long its JIT has compiled: every round counts. */
  private static final java.util.function.LongSupplier NO_JIT_CLOCK = () -> -1;

  /**
   * Rounds during which the JIT compiled are set aside: while a compiler thread runs, libtorch takes 30
   * ms and Java 5 ms; afterwards libtorch runs 10 ms, Java 40. Counting those rounds would pick Java.
   * The compile's time shows (the simulated JIT clock moves a second) only when it finishes, in the
   * second round: the first, which it overlapped, is set aside too. A clock that moves less than a
   * tenth of the calls' time (tiny compiles) sets nothing aside.
   */
  @Test
  void roundsDuringWhichTheJitCompiledAreSetAside() {
    long[] jit = {0};
    boolean[] compiling = {true};
    int[] libtorchCalls = {0};
    Measured m = AttentionOp.timed(2, 8, 1L, 0, () -> jit[0]).faster(null,
        () -> sleep(compiling[0] ? 5 : 40),
        () -> {
          int n = libtorchCalls[0]++; // call 0 is the untimed one; 1 and 2 are the first two rounds'
          sleep(compiling[0] ? 30 : 10);
          if (n == 2) {
            jit[0] += 1000;
            compiling[0] = false;
          }
        });
    assertEquals(Path.LIBTORCH, m.faster(), m.toString());
    assertEquals(2, m.setAside(), m.toString());
    assertTrue(m.rounds() >= 2 && m.libtorchMs() < m.javaMs() && m.javaMs() >= 40, m.toString());

    long[] tiny = {0};
    Measured none = AttentionOp.timed(2, 3, 1L, 0, () -> tiny[0]).faster(null, () -> sleep(20), () -> {
      tiny[0] += 1; // 1 ms of compiling in a round of 40 ms of calls
      sleep(20);
    });
    assertEquals(0, none.setAside(), none.toString());

    // A JIT that never stands still: at most 2 x maxRounds rounds in all, and their best times decide.
    long[] busy = {0};
    Measured allAside = AttentionOp.timed(2, 3, 1L, 0, () -> busy[0] += 100).faster(null, () -> sleep(5),
        () -> sleep(15));
    assertEquals(0, allAside.rounds(), allAside.toString());
    assertEquals(6, allAside.setAside(), allAside.toString());
    assertEquals(Path.JAVA, allAside.faster(), allAside.toString());
  }

  @Test
  void aCloseCallGetsMoreRoundsPastTheBudget() {
    assertTrue(AttentionOp.close(100, 90) && AttentionOp.close(90, 100) && AttentionOp.close(85, 100));
    assertFalse(AttentionOp.close(84, 100) || AttentionOp.close(100, 50));
    assertFalse(AttentionOp.close(10, Long.MAX_VALUE), "a path not timed yet is no close call");
    // Two paths that sleep alike are a close call (unless load overshoots one side's sleeps by 15% in every
    // round), so the loop goes past its 1 ns budget until 4 rounds: the rule is that it never stops on a
    // close call before CLOSE_MIN_ROUNDS, and never goes past them on the budget's account.
    int[] calls = {0};
    Measured m = AttentionOp.timed(2, 8, 1L, 0, NO_JIT_CLOCK).faster(null, () -> {
      calls[0]++;
      sleep(40);
    }, () -> sleep(40));
    boolean closeAtEnd = AttentionOp.close(Math.round(m.javaMs() * 1e6), Math.round(m.libtorchMs() * 1e6));
    assertTrue(m.rounds() >= 2 && m.rounds() <= AttentionOp.CLOSE_MIN_ROUNDS, m.toString());
    assertTrue(!closeAtEnd || m.rounds() == AttentionOp.CLOSE_MIN_ROUNDS, m + " stopped on a close call");
    assertEquals(1 + m.rounds(), calls[0], "one untimed call, then one per round");
    // maxRounds still caps it.
    Measured capped = AttentionOp.timed(2, 3, 1L, 0, NO_JIT_CLOCK).faster(null, () -> sleep(40), () -> sleep(40));
    assertTrue(capped.rounds() <= 3, capped.toString());
  }

  private static void sleep(long ms) {
    try {
      Thread.sleep(ms);
    } catch (InterruptedException e) {
      throw new IllegalStateException(e);
    }
  }
}
