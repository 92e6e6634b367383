package io.longctx.kernels;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.List;
import java.util.SplittableRandom;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.CsvSource;

/**
 * flash_decode.cu's source run on the host (src/test/cuda/decode_emulation.cpp: g++, one thread per
 * CUDA thread, barriers for __syncthreads and warp exchanges, cp.async copies landing late (at
 * their wait) or early (at their issue), each launch run both ways and giving the same bits; shared
 * memory poisoned with NaN) with the launch geometry of {@link CudaDecode#plan}, against the
 * float64 reference. This checks the kernels' logic (indexing, chunks, masks, split narrowing,
 * unified-max flags and the recompute pass, the combine) without a GPU; it says nothing about the
 * GPU itself (PTX, real asynchrony, the device's exp, speed), which bin/gpu-check does.
 */
class CudaDecodeEmulationTest {

  private static Path exe;

  /**
   * When cp.async copies land in each emulated run (emulation.h's LONGCTX_EMU_COPY): at their wait and
   * at their issue, by default; {@code -Dlongctx.emuCopy=random} (LONGCTX_EMU_SEED in the environment
   * replays one) or any comma list of wait, issue, random.
   */
  private static final List<String> COPY_MODES = List.of(System.getProperty("longctx.emuCopy", "wait,issue").split(","));

  static Path cudaInclude() {
    List<Path> candidates = new ArrayList<>();
    String home = System.getenv("CUDA_HOME");
    if (home != null) {
      candidates.add(Paths.get(home, "include"));
    }
    candidates.add(Paths.get("/usr/local/cuda/include"));
    try (var dirs = Files.newDirectoryStream(Paths.get("/usr/local"), "cuda-*")) {
      dirs.forEach(d -> candidates.add(d.resolve("include")));
    } catch (IOException | RuntimeException e) {
      // no /usr/local/cuda-*: fine
    }
    return candidates.stream().filter(p -> Files.exists(p.resolve("cuda_fp16.h"))).findFirst().orElse(null);
  }

  static boolean onPath(String tool) {
    for (String dir : System.getenv().getOrDefault("PATH", "").split(":")) {
      if (Files.isExecutable(Paths.get(dir, tool))) {
        return true;
      }
    }
    return false;
  }

  @BeforeAll
  static void build() throws Exception {
    Path include = cudaInclude();
    assumeTrue(include != null, "no CUDA headers (cuda_fp16.h) here: the host emulation needs them");
    assumeTrue(onPath("g++"), "no g++ on PATH: the host emulation needs it");
    Path dir = Paths.get("target", "decode-emulation").toAbsolutePath();
    Files.createDirectories(dir);
    exe = dir.resolve("decode_emulation");
    Child p = Child.run(new ProcessBuilder("g++", "-std=c++20", "-O1", "-pthread", "-I" + include,
        "-I" + Paths.get("src", "main", "cuda").toAbsolutePath(), "-o", exe.toString(),
        Paths.get("src", "test", "cuda", "decode_emulation.cpp").toAbsolutePath().toString()), 170);
    assertTrue(p.exit() == 0, "g++ failed: " + p.output());
  }

  /** The emulated decode: same plan, same inputs, o/lse/count back; NaN anywhere fails. */
  static CpuAttention.DecodeResult emulate(Tensor q, List<Tensor> kc, List<Tensor> vc, long[] qPos, long[] kPos,
      AttentionOptions opt, int splitLen, UnifiedMax um, CudaAttention.DType type) throws Exception {
    Raw r = emulateRaw(q, kc, vc, qPos, kPos, opt, splitLen, um, type);
    // Not AttentionState.of: NaN (an unwritten output) must fail the comparison, not throw here.
    for (float x : r.lse) {
      assertTrue(!Float.isNaN(x), "NaN lse: an output the kernels did not write");
    }
    for (float x : r.o) {
      assertTrue(!Float.isNaN(x), "NaN o: an output the kernels did not write");
    }
    return new CpuAttention.DecodeResult(AttentionState.of(r.o, r.lse, q.batch() * q.tokens(), q.heads(), q.dim()),
        r.splits, r.recomputed);
  }

  /** What the emulated kernels wrote, unchecked. */
  record Raw(float[] o, float[] lse, int splits, long recomputed) {}

  static Raw emulateRaw(Tensor q, List<Tensor> kc, List<Tensor> vc, long[] qPos, long[] kPos,
      AttentionOptions opt, int splitLen, UnifiedMax um, CudaAttention.DType type) throws Exception {
    CudaDecode.Plan plan = CudaAttention.hostPlan(q, kc, vc, qPos, kPos, opt, splitLen, type);
    long[] qp = qPos != null ? qPos : ReferenceAttention.iota(q.tokens());
    long bytes = 200 + 8L * plan.chunkStart().length + 8L * qp.length + (kPos != null ? 8L * kPos.length : 0)
        + (long) type.bytes * q.data().length;
    for (int c = 0; c < kc.size(); c++) {
      bytes += 2L * type.bytes * kc.get(c).data().length;
    }
    ByteBuffer b = ByteBuffer.allocate(Math.toIntExact(bytes)).order(ByteOrder.LITTLE_ENDIAN);
    int[] header = {type.ordinal(), um != null ? 1 : 0, plan.heads(), plan.kvHeads(), plan.tq(), plan.dim(), plan.batch(),
        kc.size(), plan.splitLen(), plan.splits(), plan.rowsPerCta(), plan.rowBlocks(), plan.dmax(), plan.rowsPerWarp(),
        opt.causal() ? 1 : 0, kPos != null ? 1 : 0, plan.tensorCores() ? 1 : 0, plan.smemBytes()};
    for (int x : header) {
      b.putInt(x);
    }
    b.putLong(plan.tk()).putLong(opt.window());
    b.putFloat(opt.scoreScale(plan.dim())).putFloat(opt.softcap());
    b.putFloat(um != null ? um.phi() : 0f).putFloat(um != null ? um.lower() : UnifiedMax.DEFAULT_LOWER)
        .putFloat(um != null ? um.upper() : UnifiedMax.DEFAULT_UPPER);
    for (long s : plan.chunkStart()) {
      b.putLong(s);
    }
    put(b, q, type, "q");
    for (int c = 0; c < kc.size(); c++) {
      put(b, kc.get(c), type, "k chunk " + c);
      put(b, vc.get(c), type, "v chunk " + c);
    }
    for (long x : qp) {
      b.putLong(x);
    }
    if (kPos != null) {
      for (long x : kPos) {
        b.putLong(x);
      }
    }
    Path in = Files.createTempFile(exe.getParent(), "in", ".bin");
    Path out = Files.createTempFile(exe.getParent(), "out", ".bin");
    boolean keepInput = false;
    try {
      Files.write(in, b.array());
      // The same launch with cp.async copies landing at each mode of emulation.h: a race-free kernel
      // gives the same bits whenever its copies land, so any difference is a missing barrier or wait.
      byte[] first = null;
      String firstMode = null;
      for (String mode : COPY_MODES) {
        ProcessBuilder pb = new ProcessBuilder(exe.toString(), in.toString(), out.toString());
        pb.environment().put("LONGCTX_EMU_COPY", mode);
        Child p = Child.run(pb, 170);
        keepInput = true;
        assertEquals(0, p.exit(), "emulation failed (LONGCTX_EMU_COPY=" + mode + "; input kept: " + in + "): " + p.output());
        byte[] bits = Files.readAllBytes(out);
        if (first == null) {
          first = bits;
          firstMode = mode;
        } else {
          assertArrayEquals(first, bits, "copies landing at " + mode + " changed the output bits against " + firstMode
              + " (a race: a missing __syncthreads or cp.async wait); replay: LONGCTX_EMU_COPY=" + mode + " " + exe + " "
              + in + " OUT; " + p.output());
        }
        keepInput = false;
      }
      ByteBuffer r = ByteBuffer.wrap(first).order(ByteOrder.LITTLE_ENDIAN);
      float[] o = new float[Math.toIntExact(plan.states() * plan.dim())];
      float[] lse = new float[Math.toIntExact(plan.states())];
      for (int i = 0; i < o.length; i++) {
        o[i] = r.getFloat();
      }
      for (int i = 0; i < lse.length; i++) {
        lse[i] = r.getFloat();
      }
      return new Raw(o, lse, plan.splits(), r.getLong());
    } finally {
      if (!keepInput) {
        Files.deleteIfExists(in);
      }
      Files.deleteIfExists(out);
    }
  }

  private static void put(ByteBuffer b, Tensor x, CudaAttention.DType type, String name) {
    if (type == CudaAttention.DType.F32) {
      for (float f : x.data()) {
        b.putFloat(f);
      }
    } else {
      for (short s : CudaAttention.halfBits(x, type, name)) {
        b.putShort(s);
      }
    }
  }

  private static CudaAttention.DType type(String t) {
    return CudaAttention.DType.valueOf(t);
  }

  private static int[] chunks(String spec, int tk) {
    if (spec.equals("-")) {
      return new int[] {tk};
    }
    String[] parts = spec.split(" ");
    int[] lens = new int[parts.length];
    for (int i = 0; i < parts.length; i++) {
      lens[i] = Integer.parseInt(parts[i]);
    }
    return lens;
  }

  @ParameterizedTest(name = "{0} B={1} H={2}/{3} Tq={4} Tk={5} D={6} split={7} window={8} softcap={9} chunks={10}")
  @CsvSource({
      "BF16, 1, 32, 8, 1, 1, 128, 4096, 0, 0, -",
      "F16, 1, 32, 8, 4, 7, 128, 3, 0, 0, -",
      "F32, 2, 8, 2, 3, 300, 64, 64, 0, 0, -",
      "BF16, 1, 8, 2, 5, 300, 128, 100, 0, 0, 100 0 37 163",
      "F16, 1, 8, 2, 5, 300, 128, 100, 0, 0, 1 1 298",
      "BF16, 1, 13, 1, 5, 150, 96, 64, 0, 0, -",
      "F32, 1, 4, 1, 3, 200, 136, 50, 40, 0, 120 80",
      "BF16, 1, 4, 4, 2, 200, 256, 77, 0, 30, -",
      "F32, 1, 2, 1, 16, 97, 256, 33, 0, 0, -",
      "BF16, 1, 2, 1, 2, 0, 64, 64, 0, 0, -",
      // Many splits for the combine: lanes take splits lane, lane + 32, ...; four groups of 32
      // weights, the last partial; with a window most splits are empty (weight 0).
      "F16, 1, 4, 2, 2, 700, 64, 7, 0, 0, 300 0 400",
      "BF16, 1, 8, 2, 3, 1000, 136, 9, 250, 0, 333 667",
      // Tensor-core partials (fp16/bf16, D % 16 == 0, D <= 128, any row count, at most 32 per CTA;
      // every fp16/bf16 case above with such a D runs there too): group 8 x Tq 2, 4, 6, 8 = 16, 32,
      // 48, 64 rows (row blocks of 32 and fewer), 24 and 40 rows (a partial m16 block), under the
      // float32 rule like every decode kernel; D 16 and 48 with two m16 blocks, where the key shares'
      // state merge uses the most of the K/V stages.
      "F16, 1, 16, 2, 2, 300, 64, 100, 0, 0, 100 0 37 163",
      "BF16, 1, 16, 2, 4, 200, 128, 64, 0, 30, -",
      "F16, 1, 8, 1, 6, 250, 128, 77, 90, 0, 1 1 248",
      "BF16, 1, 8, 1, 8, 300, 64, 128, 0, 0, 120 80 100",
      "BF16, 2, 8, 1, 3, 97, 64, 50, 40, 0, -",
      "F16, 1, 8, 1, 5, 130, 128, 4096, 0, 0, 64 66",
      "BF16, 1, 12, 1, 2, 150, 16, 64, 0, 0, -",
      "F16, 1, 6, 2, 9, 170, 48, 100, 0, 0, 90 80",
      // A long split (4,096 keys into one running sum) at 24 rows: the case that failed the float32
      // rule on the first GPU run (the tensor cores' sums; fixed in the kernel), kept for its logic.
      "F16, 1, 16, 2, 3, 4097, 128, 4096, 0, 30, -",
      "BF16, 1, 16, 2, 3, 4097, 128, 4096, 0, 30, -",
  })
  @Timeout(300)
  void emulatedKernelsMatchTheReference(String t, int batch, int heads, int kvHeads, int tq, int tk, int dim, int split,
      long window, float softcap, String chunkSpec) throws Exception {
    CudaAttention.DType type = type(t);
    long seed = Seeds.forTest();
    SplittableRandom rng = new SplittableRandom(seed);
    Tensor q = GpuCheck.rounded(Tensor.random(rng, batch, heads, tq, dim), type);
    Tensor k = GpuCheck.rounded(Tensor.random(rng, batch, kvHeads, tk, dim), type);
    Tensor v = GpuCheck.rounded(Tensor.random(rng, batch, kvHeads, tk, dim), type);
    long[] qp = DecodeTest.decodePositions(tq, tk);
    AttentionOptions opt = AttentionOptions.DEFAULT.withCausal(true).withWindow(window).withSoftcap(softcap);
    int[] lens = chunks(chunkSpec, tk);
    List<Tensor> kc = GpuDecodeCheck.chunk(k, lens), vc = GpuDecodeCheck.chunk(v, lens);
    ReferenceAttention.Result ref = ReferenceAttention.compute(q, k, v, qp, null, opt);
    ReferenceAttention.Result naive = ReferenceAttention.computeFloat32(q, k, v, qp, null, opt);

    CpuAttention.DecodeResult got = emulate(q, kc, vc, qp, null, opt, split, null, type);
    assertEquals(Math.max(1, (tk + split - 1) / split), got.splits());
    assertNull(Tolerance.violation(got.state(), ref, naive), "sync, seed " + seed + ": " + Tolerance.violation(got.state(), ref, naive));
    if (lens.length > 1) {
      CpuAttention.DecodeResult whole = emulate(q, List.of(k), List.of(v), qp, null, opt, split, null, type);
      assertArrayEquals(whole.state().o(), got.state().o(), "chunking changed bits, seed " + seed);
      assertArrayEquals(whole.state().lse(), got.state().lse(), "chunking changed bits, seed " + seed);
    }

    UnifiedMax um = UnifiedMax.calibrate(q, k, opt);
    CpuAttention.DecodeResult fast = emulate(q, kc, vc, qp, null, opt, split, um, type);
    String err = Tolerance.violation(fast.state(), ref, naive);
    assertNull(err, "unified " + um + ", seed " + seed + ": " + err);
    assertEquals(CpuAttention.DEFAULT.decodeUnifiedMax(q, k, v, qp, null, opt, split, um).recomputedRows(),
        fast.recomputedRows(), "recompute count vs the CPU's, seed " + seed);
  }

  @Test
  @Timeout(300)
  void unifiedMaxRecomputesExactlyTheFlaggedPairs() throws Exception {
    long seed = Seeds.forTest();
    SplittableRandom rng = new SplittableRandom(seed);
    int heads = 8, kvHeads = 2, tq = 2, tk = 301, dim = 64, split = 50;
    Tensor q = Tensor.random(rng, 1, heads, tq, dim);
    for (int t = 0; t < tq; t++) { // head 3: logits in the hundreds
      int at = q.offset(0, 3, t);
      for (int d = 0; d < dim; d++) {
        q.data()[at + d] *= 30;
      }
    }
    Tensor k = Tensor.random(rng, 1, kvHeads, tk, dim);
    Tensor v = Tensor.random(rng, 1, kvHeads, tk, dim);
    long[] qp = DecodeTest.decodePositions(tq, tk);
    AttentionOptions opt = AttentionOptions.DEFAULT.withCausal(true);
    ReferenceAttention.Result ref = ReferenceAttention.compute(q, k, v, qp, null, opt);
    ReferenceAttention.Result naive = ReferenceAttention.computeFloat32(q, k, v, qp, null, opt);
    int splits = (tk + split - 1) / split;
    for (float phi : new float[] {0f, 1e4f}) {
      UnifiedMax um = UnifiedMax.of(phi);
      CpuAttention.DecodeResult got = emulate(q, List.of(k), List.of(v), qp, null, opt, split, um,
          CudaAttention.DType.F32);
      long cpu = CpuAttention.DEFAULT.decodeUnifiedMax(q, k, v, qp, null, opt, split, um).recomputedRows();
      assertEquals(cpu, got.recomputedRows(), "phi " + phi + ", seed " + seed);
      if (phi == 0f) {
        assertTrue(got.recomputedRows() >= tq, "head 3's rows: " + got.recomputedRows());
      } else {
        // Every (row, head, split) that sees a key; the last split (key 300) is invisible to row 0.
        assertEquals((long) (tq * splits - 1) * heads, got.recomputedRows());
      }
      String err = Tolerance.violation(got.state(), ref, naive);
      assertNull(err, "phi " + phi + ", seed " + seed + ": " + err);
    }
  }

  /**
   * A row whose unified-max sum (40 weights near 1e38) or output (one weight near 1e38 times v up
   * to 10) overflows float32 is flagged and recomputed, as on the CPU (DecodeTest's case of the same
   * name); unflagged, the CUDA-core kernel wrote lse +inf and o NaN.
   */
  @Test
  @Timeout(300)
  void unifiedMaxRecomputesRowsWhoseSumOrOutputOverflows() throws Exception {
    long seed = Seeds.forTest();
    SplittableRandom rng = new SplittableRandom(seed);
    for (int tk : new int[] {40, 1}) {
      Tensor[] qkv = DecodeTest.sameLogitInputs(rng, tk);
      Tensor q = qkv[0], k = qkv[1], v = qkv[2];
      int heads = q.heads();
      AttentionOptions opt = AttentionOptions.DEFAULT;
      UnifiedMax um = DecodeTest.sameLogitBound(q, k, opt);
      CpuAttention.DecodeResult got = emulate(q, List.of(k), List.of(v), null, null, opt, 64, um,
          CudaAttention.DType.F32);
      assertEquals(heads, got.recomputedRows(), "tk " + tk + ", seed " + seed);
      String err = Tolerance.violation(got.state(), ReferenceAttention.compute(q, k, v, null, null, opt),
          ReferenceAttention.computeFloat32(q, k, v, null, null, opt));
      assertNull(err, "tk " + tk + ", seed " + seed + ": " + err);
    }
  }

  /**
   * Under a softcap a q.k whose float32 sum overflowed (2e38 + 2e38 - 2e38 - 2e38: 0 exactly, inf in
   * float32) gives NaN for its row, which the host path reports, not the finite +cap it gave (the
   * CPU kernels refuse it: BadInputTest), with the key in a split of calm keys and in a split of
   * its own (the combine's max skips NaN: that row used to come out empty). Other rows are untouched.
   */
  @Test
  @Timeout(300)
  void softcapOfAnOverflowedScoreIsNaNNotTheCap() throws Exception {
    int dim = 16;
    Tensor q = new Tensor(new float[2 * dim], 1, 2, 1, dim);
    Tensor k = new Tensor(new float[3 * dim], 1, 1, 3, dim);
    Tensor v = new Tensor(new float[3 * dim], 1, 1, 3, dim);
    for (int d = 0; d < dim; d++) {
      q.data()[d] = d < 4 ? (d < 2 ? 2e38f : -2e38f) : 0f; // head 0
      q.data()[dim + d] = 0.25f; // head 1: calm
      for (int j = 0; j < 3; j++) {
        k.data()[j * dim + d] = j == 0 || d >= 4 ? 1f : 0f; // keys 1 and 2 meet head 0 only where q is 0
        v.data()[j * dim + d] = j + d;
      }
    }
    for (int split : new int[] {64, 1}) { // one split; and three, the other two calm
      Raw got = emulateRaw(q, List.of(k), List.of(v), null, null, AttentionOptions.DEFAULT.withSoftcap(30f), split,
          null, CudaAttention.DType.F32);
      assertTrue(Float.isNaN(got.lse()[0]) && Float.isNaN(got.o()[0]), "split " + split + ", head 0: lse "
          + got.lse()[0] + ", o " + got.o()[0]);
      assertTrue(Float.isFinite(got.lse()[1]) && Float.isFinite(got.o()[dim]), "split " + split + ", head 1 lse "
          + got.lse()[1]);
    }
  }

  /**
   * Logits in the hundreds with 2-byte inputs: the kernel's q.k must round like the naive
   * algorithm's (exact products, then the scale). Folding the scale into q first, and a float32
   * partial lse, each put the error above the tolerance on some seeds.
   */
  @Test
  @Timeout(300)
  void largeLogitsStayWithinTolerance() throws Exception {
    for (int trial = 0; trial < 6; trial++) {
      long seed = Seeds.forTest();
      SplittableRandom rng = new SplittableRandom(seed);
      CudaAttention.DType type = trial % 2 == 0 ? CudaAttention.DType.BF16 : CudaAttention.DType.F16;
      int heads = 8, kvHeads = 2, tq = 2, tk = 301, dim = 128;
      Tensor q = Tensor.random(rng, 1, heads, tq, dim);
      for (int t = 0; t < tq; t++) {
        int at = q.offset(0, 3, t);
        for (int d = 0; d < dim; d++) {
          q.data()[at + d] *= 30;
        }
      }
      q = GpuCheck.rounded(q, type);
      Tensor k = GpuCheck.rounded(Tensor.random(rng, 1, kvHeads, tk, dim), type);
      Tensor v = GpuCheck.rounded(Tensor.random(rng, 1, kvHeads, tk, dim), type);
      long[] qp = DecodeTest.decodePositions(tq, tk);
      AttentionOptions opt = AttentionOptions.DEFAULT.withCausal(true);
      CpuAttention.DecodeResult got = emulate(q, List.of(k), List.of(v), qp, null, opt, 50, null, type);
      String err = Tolerance.violation(got.state(), ReferenceAttention.compute(q, k, v, qp, null, opt),
          ReferenceAttention.computeFloat32(q, k, v, qp, null, opt));
      assertNull(err, type + ", seed " + seed + ": " + err);
    }
  }

  /**
   * A row's bits do not depend on the other query rows of its CTA. With a sliding window a split
   * narrows its keys to what the CTA's rows can see, so the key range moves with those rows; the
   * tiles must stay on the split's 32-key grid (tiles starting at the narrowed bound put the keys in
   * other lanes and tiles: other bits). Query 1 of a two-token decode (positions 49 apart, not a
   * multiple of 32) must give the bits of the same query decoded alone, with sync and with the
   * unified max pushed so far off that every pair is recomputed (the recompute pass keeps only the
   * flagged rows).
   */
  @Test
  @Timeout(300)
  void aRowsBitsDoNotDependOnTheOtherRowsOfItsCta() throws Exception {
    long seed = Seeds.forTest();
    SplittableRandom rng = new SplittableRandom(seed);
    int heads = 4, kvHeads = 2, tk = 300, dim = 64, split = 128;
    Tensor q = Tensor.random(rng, 1, heads, 2, dim);
    Tensor k = Tensor.random(rng, 1, kvHeads, tk, dim);
    Tensor v = Tensor.random(rng, 1, kvHeads, tk, dim);
    float[] last = new float[heads * dim]; // q[:, :, 1:2, :]
    for (int h = 0; h < heads; h++) {
      System.arraycopy(q.data(), q.offset(0, h, 1), last, h * dim, dim);
    }
    Tensor q1 = new Tensor(last, 1, heads, 1, dim);
    long[] qp = {250, 299};
    AttentionOptions opt = AttentionOptions.DEFAULT.withCausal(true).withWindow(70);
    for (UnifiedMax um : new UnifiedMax[] {null, UnifiedMax.of(1e4f)}) {
      CpuAttention.DecodeResult both = emulate(q, List.of(k), List.of(v), qp, null, opt, split, um,
          CudaAttention.DType.F32);
      CpuAttention.DecodeResult alone = emulate(q1, List.of(k), List.of(v), new long[] {299}, null, opt, split, um,
          CudaAttention.DType.F32);
      String err = Tolerance.violation(alone.state(), ReferenceAttention.compute(q1, k, v, new long[] {299}, null, opt),
          ReferenceAttention.computeFloat32(q1, k, v, new long[] {299}, null, opt));
      assertNull(err, um + ", seed " + seed + ": " + err);
      assertArrayEquals(alone.state().o(), java.util.Arrays.copyOfRange(both.state().o(), heads * dim, 2 * heads * dim),
          "query 1's o depends on query 0, " + um + ", seed " + seed);
      assertArrayEquals(alone.state().lse(), java.util.Arrays.copyOfRange(both.state().lse(), heads, 2 * heads),
          "query 1's lse depends on query 0, " + um + ", seed " + seed);
    }
  }

  /**
   * The tensor-core partials keep the CUDA-core kernels' invariances: a row's bits do not depend on
   * the other rows of its CTA (three queries against the last two alone, 24 and 16 rows, both on
   * tensor cores, window narrowing the split), nor on the other sequence of a batch (explicit
   * reversed key positions, a query that sees no key, two chunks); the unified max with phi so far
   * off that every visible pair is recomputed gives the sync kernel's bits, and with phi 25 above
   * every logit (tiny p, nothing recomputed) stays within the float32 rule.
   */
  @ParameterizedTest(name = "{0} D={1}")
  @CsvSource({"F16, 64", "BF16, 128"})
  @Timeout(600)
  void tensorCoreRowsAreIndependentAndBatchInvariant(String t, int dim) throws Exception {
    CudaAttention.DType type = type(t);
    long seed = Seeds.forTest();
    SplittableRandom rng = new SplittableRandom(seed);
    int heads = 8, kvHeads = 1, tk = 300, split = 128;
    Tensor q = GpuCheck.rounded(Tensor.random(rng, 1, heads, 3, dim), type);
    Tensor k = GpuCheck.rounded(Tensor.random(rng, 1, kvHeads, tk, dim), type);
    Tensor v = GpuCheck.rounded(Tensor.random(rng, 1, kvHeads, tk, dim), type);
    float[] last = new float[heads * 2 * dim]; // q[:, :, 1:3, :]
    for (int h = 0; h < heads; h++) {
      System.arraycopy(q.data(), q.offset(0, h, 1), last, h * 2 * dim, 2 * dim);
    }
    Tensor q12 = new Tensor(last, 1, heads, 2, dim);
    long[] qp = {200, 250, 299}, qp12 = {250, 299};
    AttentionOptions opt = AttentionOptions.DEFAULT.withCausal(true).withWindow(70);
    assertTrue(CudaAttention.hostPlan(q, List.of(k), List.of(v), qp, null, opt, split, type).tensorCores());
    assertTrue(CudaAttention.hostPlan(q12, List.of(k), List.of(v), qp12, null, opt, split, type).tensorCores());
    CpuAttention.DecodeResult sync = null;
    for (UnifiedMax um : new UnifiedMax[] {null, UnifiedMax.of(1e4f)}) {
      CpuAttention.DecodeResult all = emulate(q, List.of(k), List.of(v), qp, null, opt, split, um, type);
      CpuAttention.DecodeResult alone = emulate(q12, List.of(k), List.of(v), qp12, null, opt, split, um, type);
      String err = Tolerance.violation(all.state(), ReferenceAttention.compute(q, k, v, qp, null, opt),
          ReferenceAttention.computeFloat32(q, k, v, qp, null, opt));
      assertNull(err, um + ", seed " + seed + ": " + err);
      assertArrayEquals(alone.state().o(), java.util.Arrays.copyOfRange(all.state().o(), heads * dim, 3 * heads * dim),
          "queries 1-2's o depend on query 0, " + um + ", seed " + seed);
      assertArrayEquals(alone.state().lse(), java.util.Arrays.copyOfRange(all.state().lse(), heads, 3 * heads),
          "queries 1-2's lse depend on query 0, " + um + ", seed " + seed);
      if (um == null) {
        sync = all;
      } else {
        assertEquals(CpuAttention.DEFAULT.decodeUnifiedMax(q, k, v, qp, null, opt, split, um).recomputedRows(),
            all.recomputedRows(), "every visible pair recomputed, seed " + seed);
        assertArrayEquals(sync.state().o(), all.state().o(), "unified, phi far off, vs sync, seed " + seed);
        assertArrayEquals(sync.state().lse(), all.state().lse(), "unified, phi far off, vs sync, seed " + seed);
      }
    }

    // phi 25 above the largest logit: every p ~ e^-25..e^-33, inside the bounds, none recomputed. The
    // unified kernel's power-of-two scale must follow the p a row has seen, not jump to 2^0 on a tile
    // the row cannot see (query 2's first tiles are query 0's): else fp16's low terms go subnormal.
    UnifiedMax high = UnifiedMax.of(UnifiedMax.calibrate(q, k, opt).phi() + 25f);
    CpuAttention.DecodeResult far = emulate(q, List.of(k), List.of(v), qp, null, opt, split, high, type);
    String farErr = Tolerance.violation(far.state(), ReferenceAttention.compute(q, k, v, qp, null, opt),
        ReferenceAttention.computeFloat32(q, k, v, qp, null, opt));
    assertNull(farErr, high + ", seed " + seed + ": " + farErr);
    assertEquals(CpuAttention.DEFAULT.decodeUnifiedMax(q, k, v, qp, null, opt, split, high).recomputedRows(),
        far.recomputedRows(), high + ", seed " + seed);

    // A batch of two with explicit key positions (reversed, no split narrowing) in two chunks;
    // query 0 sees no key. Sequence 0 alone gives the bits it gives in the batch.
    int bt = 2, tq = 2, tk2 = 180;
    Tensor qb = GpuCheck.rounded(Tensor.random(rng, bt, heads, tq, dim), type);
    Tensor kb = GpuCheck.rounded(Tensor.random(rng, bt, kvHeads, tk2, dim), type);
    Tensor vb = GpuCheck.rounded(Tensor.random(rng, bt, kvHeads, tk2, dim), type);
    long[] kPos = new long[tk2];
    for (int j = 0; j < tk2; j++) {
      kPos[j] = 1000 + (tk2 - 1 - j);
    }
    long[] qpb = {5, 1150};
    AttentionOptions wopt = AttentionOptions.DEFAULT.withCausal(true).withWindow(90);
    CpuAttention.DecodeResult got = emulate(qb, GpuDecodeCheck.chunk(kb, new int[] {60, 120}),
        GpuDecodeCheck.chunk(vb, new int[] {60, 120}), qpb, kPos, wopt, 64, null, type);
    String err = Tolerance.violation(got.state(), ReferenceAttention.compute(qb, kb, vb, qpb, kPos, wopt),
        ReferenceAttention.computeFloat32(qb, kb, vb, qpb, kPos, wopt));
    assertNull(err, "batch, seed " + seed + ": " + err);
    assertEquals(Float.NEGATIVE_INFINITY, got.state().lse(0, 3), "query 0 sees no key");
    Tensor q0 = new Tensor(java.util.Arrays.copyOf(qb.data(), qb.data().length / 2), 1, heads, tq, dim);
    Tensor k0 = new Tensor(java.util.Arrays.copyOf(kb.data(), kb.data().length / 2), 1, kvHeads, tk2, dim);
    Tensor v0 = new Tensor(java.util.Arrays.copyOf(vb.data(), vb.data().length / 2), 1, kvHeads, tk2, dim);
    CpuAttention.DecodeResult alone = emulate(q0, List.of(k0), List.of(v0), qpb, kPos, wopt, 64, null, type);
    assertArrayEquals(alone.state().o(), java.util.Arrays.copyOf(got.state().o(), alone.state().o().length),
        "sequence 0 alone vs in the batch, seed " + seed);
    assertArrayEquals(alone.state().lse(), java.util.Arrays.copyOf(got.state().lse(), alone.state().lse().length),
        "sequence 0 alone vs in the batch, seed " + seed);
  }

  @Test
  @Timeout(300)
  void positionsMasksAndBatchInvariance() throws Exception {
    long seed = Seeds.forTest();
    SplittableRandom rng = new SplittableRandom(seed);
    int heads = 4, kvHeads = 2, tq = 3, tk = 180, dim = 64;
    Tensor q = Tensor.random(rng, 2, heads, tq, dim);
    Tensor k = Tensor.random(rng, 2, kvHeads, tk, dim);
    Tensor v = Tensor.random(rng, 2, kvHeads, tk, dim);
    // Explicit key positions, not 0..Tk-1 (no split narrowing), reversed; query 0 sees no key.
    long[] kPos = new long[tk];
    for (int j = 0; j < tk; j++) {
      kPos[j] = 1000 + (tk - 1 - j);
    }
    long[] qp = {5, 1100, 1179};
    AttentionOptions opt = AttentionOptions.DEFAULT.withCausal(true).withWindow(90);
    CpuAttention.DecodeResult got = emulate(q, GpuDecodeCheck.chunk(k, new int[] {60, 120}),
        GpuDecodeCheck.chunk(v, new int[] {60, 120}), qp, kPos, opt, 64, null, CudaAttention.DType.F32);
    ReferenceAttention.Result ref = ReferenceAttention.compute(q, k, v, qp, kPos, opt);
    String err = Tolerance.violation(got.state(), ref, ReferenceAttention.computeFloat32(q, k, v, qp, kPos, opt));
    assertNull(err, "seed " + seed + ": " + err);
    for (int b = 0; b < 2; b++) {
      for (int h = 0; h < heads; h++) {
        assertEquals(Float.NEGATIVE_INFINITY, got.state().lse(b * tq, h), "query 0 sees no key");
        assertEquals(0f, got.state().o(b * tq, h, 7));
      }
    }
    // Sequence 0 alone gives the bits it gives in the batch.
    Tensor q0 = new Tensor(java.util.Arrays.copyOf(q.data(), q.data().length / 2), 1, heads, tq, dim);
    Tensor k0 = new Tensor(java.util.Arrays.copyOf(k.data(), k.data().length / 2), 1, kvHeads, tk, dim);
    Tensor v0 = new Tensor(java.util.Arrays.copyOf(v.data(), v.data().length / 2), 1, kvHeads, tk, dim);
    CpuAttention.DecodeResult alone = emulate(q0, List.of(k0), List.of(v0), qp, kPos, opt, 64, null,
        CudaAttention.DType.F32);
    assertArrayEquals(alone.state().o(), java.util.Arrays.copyOf(got.state().o(), alone.state().o().length));
    assertArrayEquals(alone.state().lse(), java.util.Arrays.copyOf(got.state().lse(), alone.state().lse().length));
  }
}
