package io.longctx.kernels;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.HashMap;
import java.util.Map;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.junit.jupiter.api.Test;

/**
 * The launch geometry the Java side uses agrees with the CUDA sources it launches: the constants
 * are read from the .cu files themselves, so a kernel edit that changes one fails here instead of
 * launching with the wrong block size or shared memory on a GPU nobody has tried yet.
 */
class LaunchGeometryTest {

  static Map<String, Integer> constants(String file) throws IOException {
    String src = Files.readString(Path.of("src", "main", "cuda", file));
    Map<String, Integer> m = new HashMap<>();
    Matcher c = Pattern.compile("^constexpr int (k\\w+) = (\\d+);", Pattern.MULTILINE).matcher(src);
    while (c.find()) {
      m.put(c.group(1), Integer.parseInt(c.group(2)));
    }
    return m;
  }

  /** Each kernel is looked up only in the fatbin named for it: its .cu file must define it. */
  @Test
  void everyKernelIsDefinedInTheFatbinItIsLookedUpIn() throws IOException {
    for (String name : CudaAttention.kernelNames()) {
      String fatbin = CudaAttention.fatbinOf(name);
      assertTrue(CudaProbe.FATBINS.contains(fatbin), fatbin);
      String src = Files.readString(Path.of("src", "main", "cuda", fatbin.replace(".fatbin", ".cu")));
      // Entry points are written out or built by a macro from the element type's suffix.
      String macro = name.replaceFirst("_(f32|f16|bf16)(_|$)", "_##SUFFIX##$2");
      assertTrue(src.contains(name + ",") || src.contains(name + "(") || src.contains(macro + ","),
          name + " is not defined in " + fatbin);
    }
  }

  @Test
  void forwardKernels() throws IOException {
    Map<String, Integer> plain = constants("flash_forward.cu");
    assertEquals(plain.get("kWarps"), CudaAttention.PLAIN_ROWS_PER_BLOCK, "rows per block of the plain kernel");
    assertEquals(plain.get("kWarps") * 32, CudaAttention.THREADS, "threads of the plain kernel (one warp per row)");
    assertEquals(plain.get("kMaxDim"), CudaAttention.MAX_DIM);
    Map<String, Integer> tc = constants("flash_forward_tc.cu");
    assertEquals(tc.get("kRows"), CudaAttention.TC_ROWS_PER_BLOCK, "rows per block of the tensor-core kernel");
    assertEquals(tc.get("kThreads"), CudaAttention.TC_THREADS, "threads of the tensor-core kernel");
    assertEquals(tc.get("kKeys"), CudaAttention.TC_KEYS, "keys per tile of the tensor-core kernel");
    assertEquals(CudaAttention.TC_THREADS / 32 * 16 * tc.get("kRowBlocks"), CudaAttention.TC_ROWS_PER_BLOCK,
        "warps x 16 rows x row blocks per warp");
    assertEquals(2, tc.get("kRowBlocks"), "32 query rows per warp");
    // CudaAttention.tcSmemBytes is the formula of smem_bytes(); the source must still say so.
    String src = Files.readString(Path.of("src", "main", "cuda", "flash_forward_tc.cu"));
    assertTrue(src.replaceAll("\\s+", " ").contains("return (2 * kKeys + kRows) * (D + 8) * (int)sizeof(T);"),
        "smem_bytes() changed: change tcSmemBytes with it");
    assertEquals((2 * 64 + 128) * 136 * 2, CudaAttention.tcSmemBytes(CudaAttention.DType.BF16, 128));
    assertEquals((2 * 64 + 128) * 72 * 2, CudaAttention.tcSmemBytes(CudaAttention.DType.F16, 64));
    assertEquals("longctx_forward_tc_m32_bf16_d128", CudaAttention.kernelFor(CudaAttention.DType.BF16, 128));
    assertEquals("longctx_forward_bf16", CudaAttention.kernelFor(CudaAttention.DType.BF16, 96));
  }

  @Test
  void decodeKernels() throws IOException {
    Map<String, Integer> d = constants("flash_decode.cu");
    assertEquals(d.get("kTile"), CudaDecode.TILE);
    assertEquals(d.get("kThreads"), CudaDecode.THREADS);
    assertEquals(d.get("kWarps"), CudaDecode.WARPS);
    assertEquals(d.get("kStages"), CudaDecode.STAGES);
    // CudaDecode.smemBytes sums the members of the Smem struct in this order; a change to the struct
    // must change that sum too.
    String src = Files.readString(Path.of("src", "main", "cuda", "flash_decode.cu"));
    Matcher m = Pattern.compile("struct Smem \\{(.*?)__device__ Smem", Pattern.DOTALL).matcher(src);
    assertTrue(m.find(), "the Smem struct of flash_decode.cu");
    String members = m.group(1).replaceAll("//[^\\n]*", "").replaceAll("\\s+", " ").strip();
    assertEquals("T* ks; T* vs; float* qs; float* ps; T* qt; long long* qp; int* row; int stride;", members);
    int bf16 = CudaDecode.smemBytes(CudaAttention.DType.BF16, 128, 8, false);
    assertEquals(2 * 2 * 32 * (128 + 8) * 2 + 4 * 8 * 128 + 4 * 8 * 32 + 8 * 8 + 4 * 8, bf16);
    // Tensor cores: no float q or p; q in the input type sits in V's last stage.
    int tc = CudaDecode.smemBytes(CudaAttention.DType.F16, 64, 32, true);
    assertEquals(2 * 2 * 32 * (64 + 8) * 2 + 8 * 32 + 4 * 32, tc);
    assertThrows(IllegalArgumentException.class, () -> CudaDecode.smemBytes(CudaAttention.DType.F16, 64, 33, true));
  }

  @Test
  void tensorCoreDecodeKernels() throws IOException {
    Map<String, Integer> d = constants("flash_decode.cu");
    assertEquals(d.get("kTcDim"), CudaDecode.TC_MAX_DIM, "largest head dim of the tensor-core decode kernels");
    // Two m16 blocks at most per CTA: q fits V's last stage (kTile rows) and the warps' state merge
    // fits the K/V stages.
    assertEquals(d.get("kTile"), CudaDecode.TC_MAX_ROWS);
    assertEquals(2, d.get("kTcKeySplit"), "warps per m16 block (CudaDecode.Plan.threads)");
    assertEquals(CudaDecode.TC_MAX_ROWS, CudaDecode.maxRowsPerCta(CudaAttention.DType.BF16, 128));
  }
}
