package io.longctx.kernels;

import static io.longctx.kernels.BadInputTest.assertMessage;
import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assumptions.assumeFalse;

import java.util.ArrayList;
import java.util.List;
import java.util.SplittableRandom;
import org.junit.jupiter.api.Test;

/**
 * CUDA split-K decoding without a GPU: argument validation and launch geometry (all before any CUDA
 * call), the checked fp16/bf16 conversion of host data, and the CPU fallback through
 * {@link AttentionBackend}. The kernels themselves are checked by bin/gpu-check on a GPU machine.
 */
class CudaDecodeTest {

  private static final CudaAttention.DType BF16 = CudaAttention.DType.BF16;
  private static final CudaAttention.DType F16 = CudaAttention.DType.F16;

  private static CudaDecode.Shape s(CudaAttention.DType t, int b, int h, int tokens, int d) {
    return new CudaDecode.Shape(t, b, h, tokens, d);
  }

  @Test
  void theIssuesShapeGetsOneCtaPerKvHeadAndSplitWithTheWholeGqaGroup() {
    CudaDecode.Shape q = s(BF16, 1, 32, 1, 128);
    CudaDecode.Shape kv = s(BF16, 1, 8, 262_144, 128);
    CudaDecode.Plan p = CudaDecode.plan(q, List.of(kv), List.of(kv), 4096);
    assertEquals(64, p.splits());
    assertEquals(4, p.rowsPerCta()); // 4 query heads share each kv head: read once for all 4
    assertEquals(1, p.rowBlocks());
    assertEquals("longctx_decode_tc_sync_bf16_d128", p.syncKernel());
    assertEquals("longctx_decode_tc_unified_bf16_d128", p.unifiedKernel());
    assertEquals(2L * 8 * 262_144 * 128 * 2, p.kvBytes());
    // 6 CTAs fit an H100/H200 SM (228 KiB, 1 KiB reserved per CTA).
    assertTrue(p.smemBytes() + 1024 <= 228 * 1024 / 6, "6 CTAs per SM: " + p.smemBytes());
    assertEquals(32, p.states());

    // Two warps per m16 block on tensor cores (splitting the keys), the fixed 128 on CUDA cores.
    assertEquals(64, p.threads());
    CudaDecode.Plan cc = p.onCudaCores(); // the GPU check's comparison row
    assertEquals("longctx_decode_sync_bf16_d128_r2", cc.syncKernel());
    assertEquals(CudaDecode.THREADS, cc.threads());
    assertEquals(CudaDecode.smemBytes(BF16, 128, 4, false), cc.smemBytes());

    // 16 query tokens x 4 heads = 64 rows: two row blocks of 32 on tensor cores (128 threads).
    CudaDecode.Plan p16 = CudaDecode.plan(s(BF16, 1, 32, 16, 128), List.of(kv), List.of(kv), 4096);
    assertEquals(32, p16.rowsPerCta());
    assertEquals(2, p16.rowBlocks());
    assertEquals(128, p16.threads());
    assertEquals("longctx_decode_sync_bf16_d128_r16", p16.onCudaCores().syncKernel());

    // On CUDA cores (D 120): 8 query heads per kv head x 16 tokens = 128 rows: two row blocks of 64.
    CudaDecode.Shape kv120 = s(BF16, 1, 8, 1000, 120);
    CudaDecode.Plan p128 = CudaDecode.plan(s(BF16, 1, 64, 16, 120), List.of(kv120), List.of(kv120), 4096);
    assertEquals(2, p128.rowBlocks());
    assertEquals(64, p128.rowsPerCta());
    // 9 rows split evenly would be 9 (<= 64): one block; 65 rows: two blocks of 33.
    CudaDecode.Plan p65 = CudaDecode.plan(s(BF16, 1, 13, 5, 120), List.of(s(BF16, 1, 1, 100, 120)),
        List.of(s(BF16, 1, 1, 100, 120)), 64);
    assertEquals(2, p65.rowBlocks());
    assertEquals(33, p65.rowsPerCta());
    assertEquals(2, p65.splits());
    // On tensor cores 65 rows are three blocks of 22.
    CudaDecode.Plan p65tc = CudaDecode.plan(s(BF16, 1, 13, 5, 128), List.of(s(BF16, 1, 1, 100, 128)),
        List.of(s(BF16, 1, 1, 100, 128)), 64);
    assertEquals(3, p65tc.rowBlocks());
    assertEquals(22, p65tc.rowsPerCta());
  }

  /**
   * Tensor-core partials exactly for fp16/bf16 with D a multiple of 16 up to 128, whatever the rows,
   * the batch or Tk; at most 32 rows per CTA there.
   */
  @Test
  void tensorCoresForFp16AndBf16AtHeadDimsOf16Multiples() {
    for (CudaAttention.DType t : CudaAttention.DType.values()) {
      for (int d : new int[] {8, 16, 48, 64, 96, 128, 136, 256}) {
        for (int[] ht : new int[][] {{8, 1}, {8, 2}, {8, 3}, {4, 4}, {5, 3}, {8, 8}, {16, 8}, {13, 5}, {32, 1}}) {
          int heads = ht[0], tq = ht[1];
          boolean expected = t != CudaAttention.DType.F32 && d % 16 == 0 && d <= 128;
          for (int batch : new int[] {1, 7}) {
            for (int tk : new int[] {1, 5000}) {
              CudaDecode.Shape kv = s(t, batch, 1, tk, d);
              CudaDecode.Plan p = CudaDecode.plan(s(t, batch, heads, tq, d), List.of(kv), List.of(kv), 512);
              boolean tc = expected;
              assertEquals(tc, p.tensorCores(), t + " D " + d + " " + heads + " x " + tq + " rows, batch " + batch);
              assertTrue(p.rowsPerCta() <= (tc ? CudaDecode.TC_MAX_ROWS : 64), p.rowsPerCta() + " rows");
              assertEquals(tc ? "longctx_decode_tc_sync_" + t.suffix + "_d128" : "longctx_decode_sync_" + t.suffix + "_d"
                  + p.dmax() + "_r" + p.rowsPerWarp(), p.syncKernel());
              assertEquals(p.syncKernel().replace("sync", "unified"), p.unifiedKernel());
              assertEquals(CudaDecode.smemBytes(t, d, p.rowsPerCta(), tc), p.smemBytes());
            }
          }
        }
      }
    }
    // 1 row and 15 rows on tensor cores too; 130 rows: 5 blocks of 26.
    CudaDecode.Shape kv = s(F16, 1, 1, 100, 64);
    assertTrue(CudaDecode.plan(s(F16, 1, 1, 1, 64), List.of(kv), List.of(kv), 64).tensorCores());
    assertTrue(CudaDecode.plan(s(F16, 1, 5, 3, 64), List.of(kv), List.of(kv), 64).tensorCores());
    CudaDecode.Plan p130 = CudaDecode.plan(s(F16, 1, 13, 10, 64), List.of(kv), List.of(kv), 64);
    assertEquals(5, p130.rowBlocks());
    assertEquals(26, p130.rowsPerCta());
    assertTrue(p130.tensorCores());
  }

  @Test
  void splitsAreWindowsOfTheConcatenatedSequence() {
    List<CudaDecode.Shape> chunks = List.of(s(BF16, 2, 2, 1000, 64), s(BF16, 2, 2, 0, 64), s(BF16, 2, 2, 3097, 64));
    CudaDecode.Plan p = CudaDecode.plan(s(BF16, 2, 4, 3, 64), chunks, chunks, 1000);
    assertEquals(4097, p.tk());
    assertArrayEquals(new long[] {0, 1000, 1000, 4097}, p.chunkStart());
    assertEquals(5, p.splits()); // ceil(4097 / 1000), whatever the chunking
    CudaDecode.Plan one = CudaDecode.plan(s(BF16, 2, 4, 3, 64), List.of(s(BF16, 2, 2, 4097, 64)),
        List.of(s(BF16, 2, 2, 4097, 64)), 1000);
    assertEquals(p.splits(), one.splits());
    // KV of one token, and of none: one split, rows get the empty state.
    assertEquals(1, CudaDecode.plan(s(BF16, 1, 1, 1, 64), List.of(s(BF16, 1, 1, 1, 64)),
        List.of(s(BF16, 1, 1, 1, 64)), 4096).splits());
    assertEquals(1, CudaDecode.plan(s(BF16, 1, 1, 1, 64), List.of(s(BF16, 1, 1, 0, 64)),
        List.of(s(BF16, 1, 1, 0, 64)), 4096).splits());
    // A million tokens.
    CudaDecode.Shape m = s(BF16, 1, 1, 1_000_003, 64);
    assertEquals(245, CudaDecode.plan(s(BF16, 1, 2, 2, 64), List.of(m), List.of(m), 4096).splits());
  }

  @Test
  void sharedMemoryOfEveryKernelFitsAnA100() {
    int a100 = 163 * 1024; // the largest opt-in dynamic shared memory per block on sm_80
    for (CudaAttention.DType t : CudaAttention.DType.values()) {
      for (int dim : new int[] {120, 128, 248, 256}) {
        int rows = CudaDecode.maxRowsPerCta(t, dim);
        boolean tc = CudaDecode.usesTensorCores(t, dim);
        int bytes = CudaDecode.smemBytes(t, dim, rows, tc);
        assertTrue(bytes <= a100, t + " D " + dim + " " + rows + " rows: " + bytes + " bytes");
      }
    }
    CudaDecode.Plan f32 = CudaDecode.plan(s(CudaAttention.DType.F32, 1, 32, 16, 256),
        List.of(s(CudaAttention.DType.F32, 1, 1, 50, 256)), List.of(s(CudaAttention.DType.F32, 1, 1, 50, 256)), 64);
    assertEquals(16, f32.rowsPerCta());
    assertEquals(32, f32.rowBlocks());
    assertEquals("longctx_decode_sync_f32_d256_r8", f32.syncKernel());
  }

  @Test
  void everyDecodeKernelIsListedForLoadingAndTheFatbinTest() {
    List<String> names = CudaAttention.kernelNames();
    assertTrue(CudaProbe.FATBINS.contains("flash_decode.fatbin"));
    assertTrue(names.contains("longctx_decode_combine"));
    for (CudaAttention.DType t : CudaAttention.DType.values()) {
      for (int d : new int[] {8, 64, 128, 136, 256}) {
        for (int heads : new int[] {1, 4, 32, 64}) {
          for (int tq : new int[] {1, 3, 16}) {
            CudaDecode.Shape kv = s(t, 1, 1, 10, d);
            CudaDecode.Plan p = CudaDecode.plan(s(t, 1, heads, tq, d), List.of(kv), List.of(kv), 32);
            assertTrue(names.contains(p.syncKernel()), p.syncKernel());
            assertTrue(names.contains(p.unifiedKernel()), p.unifiedKernel());
          }
        }
      }
    }
  }

  @Test
  void badShapesChunkListsAndSplitLengthsAreRejectedBeforeAnyCudaCall() {
    CudaDecode.Shape q = s(BF16, 1, 8, 2, 128);
    CudaDecode.Shape kv = s(BF16, 1, 2, 100, 128);
    assertMessage(() -> CudaDecode.plan(q, List.of(kv), List.of(kv), 0), "splitLen must be >= 1");
    assertMessage(() -> CudaDecode.plan(q, List.of(), List.of(), 64), "one or more KV chunks");
    assertMessage(() -> CudaDecode.plan(q, List.of(kv, kv), List.of(kv), 64), "2 k and 1 v chunks");
    assertMessage(() -> CudaDecode.plan(s(BF16, 1, 8, 2, 100), List.of(s(BF16, 1, 2, 100, 100)),
        List.of(s(BF16, 1, 2, 100, 100)), 64), "head dim 100", "multiple of 8");
    assertMessage(() -> CudaDecode.plan(s(BF16, 1, 8, 2, 264), List.of(s(BF16, 1, 2, 100, 264)),
        List.of(s(BF16, 1, 2, 100, 264)), 64), "head dim 264");
    assertMessage(() -> CudaDecode.plan(s(BF16, 1, 8, 0, 128), List.of(kv), List.of(kv), 64), "at least one query token");
    assertMessage(() -> CudaDecode.plan(s(BF16, 1, 6, 2, 128), List.of(s(BF16, 1, 4, 100, 128)),
        List.of(s(BF16, 1, 4, 100, 128)), 64), "query heads (6) must be a multiple of kv heads (4)");
    assertMessage(() -> CudaDecode.plan(q, List.of(kv, s(BF16, 1, 2, 50, 128)), List.of(kv, s(BF16, 1, 2, 51, 128)), 64),
        "k chunk 1", "v chunk 1", "differ");
    assertMessage(() -> CudaDecode.plan(q, List.of(kv, s(BF16, 1, 1, 50, 128)), List.of(kv, s(BF16, 1, 1, 50, 128)), 64),
        "KV chunk 1", "chunk 0's kv heads");
    assertMessage(() -> CudaDecode.plan(q, List.of(s(BF16, 2, 2, 100, 128)), List.of(s(BF16, 2, 2, 100, 128)), 64),
        "KV chunk 0", "q's batch");
    assertMessage(() -> CudaDecode.plan(q, List.of(s(CudaAttention.DType.F16, 1, 2, 100, 128)),
        List.of(s(CudaAttention.DType.F16, 1, 2, 100, 128)), 64), "one element type");
    CudaDecode.Shape huge = s(BF16, 1, 2, 1 << 30, 128);
    assertMessage(() -> CudaDecode.plan(q, List.of(huge), List.of(huge), 1), "decode partial states too large");

    // Host entry point: positions are checked against the concatenated key count.
    Tensor qt = Tensor.zeros(1, 8, 2, 64);
    List<Tensor> ks = List.of(Tensor.zeros(1, 2, 30, 64), Tensor.zeros(1, 2, 20, 64));
    assertMessage(() -> CudaAttention.hostPlan(qt, ks, ks, null, new long[30], AttentionOptions.DEFAULT, 16, BF16),
        "kPos has 30 positions for 50 key tokens");
    assertMessage(() -> CudaAttention.hostPlan(qt, ks, ks, new long[3], null, AttentionOptions.DEFAULT, 16, BF16),
        "qPos has 3 positions for 2 query tokens");
    assertEquals(4, CudaAttention.hostPlan(qt, ks, ks, null, new long[50], AttentionOptions.DEFAULT, 16, BF16).splits());
  }

  @Test
  void fp16OverflowOfHostDataIsAnErrorNamingTheTensorAndIndex() {
    Tensor x = Tensor.zeros(2, 3, 5, 8);
    x.data()[x.offset(1, 2, 3) + 4] = 70000f;
    assertMessage(() -> CudaAttention.halfBits(x, CudaAttention.DType.F16, "k chunk 0"),
        "k chunk 0 [2, 3, 5, 8]", "70000", "batch 1, head 2, position 3, dim 4", "fp16");
    x.data()[x.offset(1, 2, 3) + 4] = -65504f; // the largest finite fp16: fine
    x.data()[x.offset(0, 1, 0)] = Float.NEGATIVE_INFINITY;
    assertMessage(() -> CudaAttention.halfBits(x, CudaAttention.DType.F16, "q"), "batch 0, head 1, position 0, dim 0");
    x.data()[x.offset(0, 1, 0)] = 65504f;
    short[] bits = CudaAttention.halfBits(x, CudaAttention.DType.F16, "q");
    assertEquals(65504f, HalfFloats.halfToFloat(bits[x.offset(0, 1, 0)]));
    assertEquals(-65504f, HalfFloats.halfToFloat(bits[x.offset(1, 2, 3) + 4]));
    // bf16 has float32's exponent range: 70000 is fine, float32's largest value rounds to infinity.
    x.data()[7] = 70000f;
    assertEquals(70144f, HalfFloats.bf16ToFloat(CudaAttention.halfBits(x, BF16, "v")[7]));
    x.data()[7] = Float.MAX_VALUE;
    assertMessage(() -> CudaAttention.halfBits(x, BF16, "v"), "batch 0, head 0, position 0, dim 7", "bf16");
  }

  @Test
  void autoFallsBackToTheCpuDecodeAndCudaFailsLoudly() {
    assumeFalse(CudaProbe.status().available(), "a real GPU is present");
    String before = System.getProperty("longctx.backend");
    System.setProperty("longctx.backend", "auto");
    try {
      AttentionBackend auto = AttentionBackend.select();
      assertSame(CpuAttention.DEFAULT, auto);
      SplittableRandom rng = new SplittableRandom(Seeds.forTest());
      Tensor q = Tensor.random(rng, 1, 8, 3, 64);
      Tensor k = Tensor.random(rng, 1, 2, 1500, 64);
      Tensor v = Tensor.random(rng, 1, 2, 1500, 64);
      long[] qp = DecodeTest.decodePositions(3, 1500);
      AttentionOptions opt = AttentionOptions.DEFAULT.withCausal(true);
      CpuAttention.DecodeResult viaBackend = auto.decode(q, k, v, qp, null, opt, 256);
      CpuAttention.DecodeResult direct = CpuAttention.DEFAULT.decode(q, k, v, qp, null, opt, 256);
      assertArrayEquals(direct.state().o(), viaBackend.state().o());
      assertArrayEquals(direct.state().lse(), viaBackend.state().lse());
      UnifiedMax um = UnifiedMax.of(0f);
      assertArrayEquals(CpuAttention.DEFAULT.decodeUnifiedMax(q, k, v, qp, null, opt, 256, um).state().o(),
          auto.decodeUnifiedMax(q, k, v, qp, null, opt, 256, um).state().o());
    } finally {
      if (before == null) {
        System.clearProperty("longctx.backend");
      } else {
        System.setProperty("longctx.backend", before);
      }
    }
    IllegalStateException e = assertThrows(IllegalStateException.class, () -> AttentionBackend.select("cuda"));
    assertTrue(e.getMessage().contains(CudaProbe.status().reason()), e.getMessage());
    IllegalStateException direct = assertThrows(IllegalStateException.class, CudaAttention::instance);
    assertTrue(direct.getMessage().startsWith("CUDA is unavailable: "), direct.getMessage());
  }

  @Test
  void chunkingHelperOfTheGpuCheckKeepsEveryKey() {
    SplittableRandom rng = new SplittableRandom(Seeds.forTest());
    Tensor k = Tensor.random(rng, 2, 3, 4097, 16);
    List<Tensor> parts = GpuDecodeCheck.chunk(k, new int[] {1000, 0, 2048, 1049});
    List<Float> flat = new ArrayList<>();
    for (int b = 0; b < 2; b++) {
      for (int h = 0; h < 3; h++) {
        for (Tensor c : parts) {
          for (int t = 0; t < c.tokens(); t++) {
            for (int d = 0; d < 16; d++) {
              flat.add(c.data()[c.offset(b, h, t) + d]);
            }
          }
        }
      }
    }
    float[] back = new float[flat.size()];
    for (int i = 0; i < back.length; i++) {
      back[i] = flat.get(i);
    }
    assertArrayEquals(k.data(), back);
  }
}
