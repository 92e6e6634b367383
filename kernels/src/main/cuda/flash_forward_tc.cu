// longctx CUDA attention forward on tensor cores (FlashAttention-2 style), fp16 and bf16 inputs,
// float32 accumulation and float32 (o, lse) outputs, head dims 64 and 128. Same contract as
// flash_forward.cu (layouts, masks by absolute positions, GQA, softcap, natural-log lse, -inf for
// rows that see no key); other dims and float32 inputs use that kernel.
//
// Block: 128 query rows; key tiles of 64 in shared memory (rows padded by 8 elements so ldmatrix is
// free of bank conflicts), one K and one V tile shared by all warps, so each tile is copied once per
// 128 query rows. 4 warps of 32 query rows (two m16 row blocks each), as FlashAttention-2 lays out
// D 128: every K and V fragment a warp loads feeds two mma (one per row block), and each warp has two
// independent chains of mma and softmax to interleave. Q does not fit in registers beside the two row
// blocks' accumulators: it waits in shared memory and its fragments are loaded per 16 dims of S.
// On an H200 this layout ran 1.03-1.18x (2026-11-26) and 1.33-1.49x (2026-11-27) a layout of 8 warps
// of 16 rows with Q in registers (docs/BENCHMARKS.md), which was then deleted.
// Per tile and warp:
//   S (16 x 64)  = Q (16 x D) K^T           mma.sync m16n8k16, per row block
//   online softmax in base 2, rows reduced across the 4-thread quad: the max over the raw scores,
//                                           p = ex2(fma(s, scale * log2 e, -max)) (one FFMA, one MUFU);
//                                           a thread's four rows (two per row block) side by side
//   O (16 x D)  += P (16 x 64) V            P reused from S's accumulators as A fragments,
//                                           V read with ldmatrix.trans
// Each (query block, key tile) pair is classified once from position ranges: skipped, fully
// visible (no mask work: every key of the tile is below tk and seen by every row) or partial
// (per-element mask by positions and tk), by warp votes over the tile's key positions that every
// warp takes itself (find_tile): a skipped tile costs no copy and no barrier. K and V travel in
// separate cp.async groups, two barriers per tile: S = Q K^T runs while V lands, and the next
// visible tile's K lands during the softmax and P V. With a causal mask or a window the query blocks that see the most
// keys are launched first, over all heads. Shared memory is dynamic (smem_bytes();
// CudaAttention.tcSmemBytes computes the same).

#include <math_constants.h>

#include "longctx_mma.cuh"

namespace {

constexpr int kThreads = 128;     // 4 warps
constexpr int kRowBlocks = 2;     // m16 row blocks per warp: 32 query rows
constexpr int kRows = 128;        // query rows per block
constexpr int kKeys = 64;         // keys per tile
constexpr int kScanTiles = 4;     // key tiles whose positions one step of find_tile loads at once
constexpr float kLn2 = 0.6931471805599453f;
static_assert(kRows == kThreads / 32 * 16 * kRowBlocks, "warps x rows per warp = kRows");

// Dynamic shared memory: the K and V tiles and the block's Q rows, rows padded to D + 8.
template <typename T, int D>
constexpr int smem_bytes() {
  return (2 * kKeys + kRows) * (D + 8) * (int)sizeof(T);
}

// Copies rows [row0, row0 + ROWS) of a [rows, D] matrix into shared memory (row stride D + 8), NT
// threads sharing the work (valid > row0: a copied tile starts at a real row); rows at or past
// `valid` (in a sequence's last tile) repeat row valid - 1: a Q row past tq is never written out,
// and a key past tk is masked (a tile holding one is never kAll), so its P is 0, as for the tile's
// other masked keys. Thread t copies the 16-byte chunk t % kChunks of rows t / kChunks + i NT /
// kChunks. Every chunk is a cp.async: zeroing the rows
// past `valid` instead (a shared store under a per-row test) made ptxas compute each chunk's address
// under its own predicate, about 10 integer instructions a chunk, 16 chunks a tile per thread; a
// separate path for whole tiles, as cheap as this in the loop, cost the D 128 kernel 124 bytes of
// register spills (sm_90a).
template <typename T, int D, int NT, int ROWS = kKeys>
__device__ __forceinline__ void load_tile(T* smem, const T* g, int row0, int valid) {
  constexpr int kChunks = D / 8;            // 16-byte chunks per row
  constexpr int kRowStep = NT / kChunks;    // rows between one thread's chunks
  static_assert(NT % kChunks == 0 && ROWS % kRowStep == 0, "whole rows per pass, whole passes per tile");
  const int r0 = threadIdx.x / kChunks, c = threadIdx.x % kChunks;
  T* dst = smem + r0 * (D + 8) + c * 8;
#pragma unroll
  for (int i = 0; i < ROWS / kRowStep; i++) {
    const int row = min(row0 + r0 + i * kRowStep, valid - 1);
    cp_async16(dst + i * kRowStep * (D + 8), g + (long long)row * D + c * 8);
  }
}

enum Visibility { kNone = 0, kPartial = 1, kAll = 2 };

struct Tile {
  int j0;   // first key of the tile; tk when no tile is left
  int vis;  // kPartial or kAll
};

// The first key tile at or after j0 that some query in [qlo, qhi] may see, and whether it needs the
// per-element mask. Every warp runs this itself on the same inputs and reaches the same answer, so
// the choice is block-uniform with no shared memory and no barrier: a skipped tile costs one
// coalesced 512-byte read of positions (L1/L2 after the first warp) and three warp votes, not a
// serial scan of 64 positions by one thread between two barriers. The positions of kScanTiles tiles
// are loaded together before any is tested, so a run of skipped tiles (a causal block's future)
// waits one memory latency per kScanTiles tiles, not per tile.
// The verdicts are any_visible / all_visible of the tile's position range, taken as votes over its
// keys instead of a min/max reduction (5 rounds of 64-bit shuffles): klo <= qhi is "some k <= qhi";
// khi >= qlo || within_window(qlo, khi) is "some k >= qlo or within the window of qlo" (when every k
// is below qlo the nearest one, khi, is the one that decides); khi <= qlo && within_window(qhi, klo)
// is "every k <= qlo and within the window of qhi" (for k <= qlo <= qhi the farthest, klo, decides).
__device__ __forceinline__ Tile find_tile(int j0, const long long* __restrict__ k_pos, int tk, long long qlo,
                                          long long qhi, int causal, long long window) {
  // kAll also promises that every key of the tile is below tk: such a tile takes no per-element work.
  if (!causal && window <= 0) return {j0 < tk ? j0 : tk, j0 + kKeys <= tk ? kAll : kPartial};
  const int lane = threadIdx.x % 32;
  for (; j0 < tk; j0 += kScanTiles * kKeys) {
    long long p[2 * kScanTiles];  // lane's keys j0 + lane + 32 m: tile m / 2
#pragma unroll
    for (int m = 0; m < 2 * kScanTiles; m++) p[m] = j0 + lane + 32 * m < tk ? k_pos[j0 + lane + 32 * m] : 0;
#pragma unroll
    for (int t = 0; t < kScanTiles; t++) {
      if (j0 + t * kKeys >= tk) break;  // warp-uniform
      bool below_qhi = false, reaches_qlo = false, all_seen = true;  // identities: keys past tk count for nothing
#pragma unroll
      for (int m = 2 * t; m < 2 * t + 2; m++) {
        if (j0 + lane + 32 * m < tk) {
          below_qhi |= p[m] <= qhi;
          reaches_qlo |= (p[m] >= qlo) | within_window(qlo, p[m], window);
          all_seen &= (p[m] <= qlo) & within_window(qhi, p[m], window);
        }
      }
      if (__any_sync(0xffffffffu, below_qhi) && __any_sync(0xffffffffu, reaches_qlo)) {
        const bool whole = j0 + (t + 1) * kKeys <= tk;
        return {j0 + t * kKeys, whole && __all_sync(0xffffffffu, all_seen) ? kAll : kPartial};
      }
    }
  }
  return {tk, kPartial};
}

template <typename T, int D>
__device__ void flash_forward_tc(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                                 const long long* __restrict__ q_pos, const long long* __restrict__ k_pos,
                                 float* __restrict__ o, float* __restrict__ lse, int heads, int kv_heads, int tq,
                                 int tk, float scale, float softcap, int causal, long long window) {
  constexpr int NT = kThreads;
  constexpr int kStride = D + 8;
  LONGCTX_DYNAMIC_SHARED(float4, smem_raw);  // 16-byte aligned, as cp.async and ldmatrix need
  T* ks = reinterpret_cast<T*>(smem_raw);
  T* vs = ks + kKeys * kStride;
  T* qs = vs + kKeys * kStride;  // the block's Q rows

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t4 = lane % 4;
  // With a causal mask (a window is one-sided too) the last query block sees the most keys when
  // positions rise along the sequence, as they do in a prefill. Blocks start roughly in the order of
  // their linear index (x fastest), so that index is dealt out longest first over the whole grid:
  // the last query block of every (batch, head), then the one before it, and so on. The short blocks
  // then fill the tail of the last wave (longest-processing-time-first scheduling) instead of a few
  // long ones running alone at the end. Reversing blockIdx.x alone (before 2026-11-26, seventh
  // session) did that per head only: the heads launched in a later wave started their long blocks
  // late; in a model of the launch (264 block slots, an H200's 132 SMs x 2, B 1, H 16, causal) the
  // last block ended at 1.6x the ideal at T 4096, 1.3x at 8192 and 1.1x at 16384, against 1.0x now
  // (kernels/src/gpu/launch-order-model.py).
  int qb = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  if (causal || window > 0) {
    const unsigned long long heads_batch = (unsigned long long)gridDim.y * gridDim.z;
    const unsigned long long linear =
        blockIdx.x + gridDim.x * (blockIdx.y + (unsigned long long)gridDim.y * blockIdx.z);
    qb = gridDim.x - 1 - (int)(linear / heads_batch);
    h = (int)(linear % heads_batch % gridDim.y);
    b = (int)(linear % heads_batch / gridDim.y);
  }
  const int q0 = qb * kRows;
  // b and h wait for the output in local memory: once they are no longer blockIdx (which the output
  // code reread for free), keeping them in registers across the tile loop spilled the D 128
  // kernel's loop state (sm_90a: 100 / 128 bytes, 14 local accesses per tile).
  volatile int out_b = b, out_h = h;
  const int kvh = h / (heads / kv_heads);
  const T* qg = q + ((long long)b * heads + h) * tq * D;
  const T* kg = k + ((long long)b * kv_heads + kvh) * tk * D;
  const T* vg = v + ((long long)b * kv_heads + kvh) * tk * D;

  // Each warp reduces the block's query position range itself (no shared memory, no barrier).
  long long qlo = LLONG_MAX, qhi = LLONG_MIN;
  for (int i = lane; i < kRows && q0 + i < tq; i += 32) {
    qlo = min(qlo, q_pos[q0 + i]);
    qhi = max(qhi, q_pos[q0 + i]);
  }
  warp_min_max(qlo, qhi);
  // This warp's rows: 32 from wrow0; this thread's are wrow0 + 16 mb + g and 8 below that.
  const int wrow0 = q0 + warp * 16 * kRowBlocks;

  // Single K and V buffers, two barriers per tile (FlashAttention-2's order): the loop finds its
  // tile's K in flight; once K has landed, one barrier makes it visible and also tells that every
  // warp is past P V of the last tile, so V is issued then and lands during S; a second barrier
  // after V's wait makes V visible and tells that every warp is past S, so the next tile's K is
  // issued then and lands during the softmax and P V (on an H200 2-7% faster than waiting for V
  // only after the softmax, 2026-11-27). The block's Q rows travel in the first K group (only when
  // some tile is visible: a block must not end with copies into its shared memory still in flight).
  Tile tile = find_tile(0, k_pos, tk, qlo, qhi, causal, window);
  if (tile.j0 < tk) {
    load_tile<T, D, NT, kRows>(qs, qg, q0, tq);
    load_tile<T, D, NT>(ks, kg, tile.j0, tk);
  }
  cp_async_commit();  // group: (Q and) K (empty when no tile is visible)

  float acc[kRowBlocks][D / 8][4];
#pragma unroll
  for (int mb = 0; mb < kRowBlocks; mb++) {
#pragma unroll
    for (int i = 0; i < D / 8; i++) acc[mb][i][0] = acc[mb][i][1] = acc[mb][i][2] = acc[mb][i][3] = 0.f;
  }
  // row_sum: this thread's share; the quad sums at the end
  float row_max[kRowBlocks][2], row_sum[kRowBlocks][2];
#pragma unroll
  for (int mb = 0; mb < kRowBlocks; mb++) {
    row_max[mb][0] = row_max[mb][1] = -CUDART_INF_F;
    row_sum[mb][0] = row_sum[mb][1] = 0.f;
  }
  const float s_scale = softcap > 0.f ? scale / softcap : scale * kLog2e;
  // The factor between a stored score and its base-2 logit: the raw q.k keeps s_scale until the exp's
  // fma (max(s) * c is max(s * c) exactly for c > 0, so the running max is the same); a softcapped
  // score is already a logit.
  const float s_mul = softcap > 0.f ? 1.f : s_scale;

  // Skipped tiles never reach the loop body: no copy, no barrier.
  while (tile.j0 < tk) {
    const int j0 = tile.j0, vis = tile.vis;
    const Tile next = find_tile(j0 + kKeys, k_pos, tk, qlo, qhi, causal, window);  // while K flies

    // A partial tile's mask as bits (bit 4 nb + i of keep[mb]: element i of s[mb][nb] below), worked out
    // while K lands and the score registers are free: this thread's 16 keys and 4 rows, each
    // position read once, from global memory (every warp of the block reads the same ones: L1/L2).
    uint32_t keep[kRowBlocks];
    if (vis == kPartial) {
      long long qp[kRowBlocks][2];
#pragma unroll
      for (int mb = 0; mb < kRowBlocks; mb++) {
        keep[mb] = 0u;
#pragma unroll
        for (int r = 0; r < 2; r++) {
          const int t = wrow0 + 16 * mb + g + 8 * r;
          qp[mb][r] = t < tq ? q_pos[t] : 0;  // a row past tq is never written
        }
      }
#pragma unroll
      for (int nb = 0; nb < kKeys / 8; nb++) {
#pragma unroll
        for (int c = 0; c < 2; c++) {
          const int key = nb * 8 + 2 * t4 + c;
          const bool in = j0 + key < tk;
          const long long kp = in ? k_pos[j0 + key] : 0;
#pragma unroll
          for (int mb = 0; mb < kRowBlocks; mb++) {
#pragma unroll
            for (int r = 0; r < 2; r++) {
              keep[mb] |= (uint32_t)(in & visible(qp[mb][r], kp, causal, window)) << (4 * nb + 2 * r + c);
            }
          }
        }
      }
    }
    cp_async_wait_0();  // this thread's K (and Q) copies landed
    __syncthreads();    // everyone's K copies and zero rows are visible; every warp is past P V (reads of vs)
    load_tile<T, D, NT>(vs, vg, j0, tk);
    cp_async_commit();  // group: V, landing during S

    // S = Q K^T for this warp's rows and the tile's 64 keys (8 blocks of 8 keys per row block).
    float s[kRowBlocks][kKeys / 8][4];
#pragma unroll
    for (int mb = 0; mb < kRowBlocks; mb++) {
#pragma unroll
      for (int i = 0; i < kKeys / 8; i++) s[mb][i][0] = s[mb][i][1] = s[mb][i][2] = s[mb][i][3] = 0.f;
    }
#pragma unroll
    for (int kc = 0; kc < D / 16; kc++) {
      uint32_t qa[kRowBlocks][4];
#pragma unroll
      for (int mb = 0; mb < kRowBlocks; mb++) {
        // Matrices 0-3: rows 0-7 / 8-15 of the row block at dims 0-7, then both at dims 8-15.
        ldmatrix_x4(qa[mb], &qs[(warp * 16 * kRowBlocks + 16 * mb + lane % 16) * kStride + kc * 16 + lane / 16 * 8]);
      }
#pragma unroll
      for (int nb = 0; nb < kKeys / 16; nb++) {
        uint32_t kf[4];
        ldmatrix_x4(kf, &ks[(nb * 16 + lane / 16 * 8 + lane % 8) * kStride + kc * 16 + (lane / 8) % 2 * 8]);
#pragma unroll
        for (int mb = 0; mb < kRowBlocks; mb++) {
          mma<T>(s[mb][2 * nb], qa[mb], kf[0], kf[1]);
          mma<T>(s[mb][2 * nb + 1], qa[mb], kf[2], kf[3]);
        }
      }
    }

    cp_async_wait_0();  // V landed
    __syncthreads();    // everyone's V is visible, and every warp is past its reads of ks
    if (next.j0 < tk) load_tile<T, D, NT>(ks, kg, next.j0, tk);
    cp_async_commit();  // group: the next K, landing during the softmax and P V

#pragma unroll
    for (int mb = 0; mb < kRowBlocks; mb++) {
      // Element i of s[mb][nb] is row g + 8 * (i / 2), key nb * 8 + 2 * t4 + i % 2. Each pass below is one
      // block-uniform branch around straight-line code: a fully visible tile without softcap (the common
      // case) takes neither, and its scores go from the mma straight into the max and the exp's fma.
      if (softcap > 0.f) {
#pragma unroll
        for (int nb = 0; nb < kKeys / 8; nb++) {
#pragma unroll
          for (int i = 0; i < 4; i++) s[mb][nb][i] = soft_capped(softcap, s[mb][nb][i] * s_scale) * kLog2e;
        }
      }
      if (vis == kPartial) {  // masked keys and keys past tk become -inf
#pragma unroll
        for (int nb = 0; nb < kKeys / 8; nb++) {
#pragma unroll
          for (int i = 0; i < 4; i++) {
            if (!((keep[mb] >> (4 * nb + i)) & 1u)) s[mb][nb][i] = -CUDART_INF_F;
          }
        }
      }
    }

    // Online softmax, the four rows of this thread (two per row block) side by side: four
    // independent chains of max, exp and sum for the scheduler to interleave, with the quad's max
    // shuffles of all four rows in flight together.
    float mx[kRowBlocks][2], alpha[kRowBlocks][2];
#pragma unroll
    for (int mb = 0; mb < kRowBlocks; mb++) {
#pragma unroll
      for (int r = 0; r < 2; r++) {
        mx[mb][r] = -CUDART_INF_F;
#pragma unroll
        for (int nb = 0; nb < kKeys / 8; nb++) mx[mb][r] = fmaxf(mx[mb][r], fmaxf(s[mb][nb][2 * r], s[mb][nb][2 * r + 1]));
      }
    }
#pragma unroll
    for (int x = 1; x <= 2; x *= 2) {
#pragma unroll
      for (int mb = 0; mb < kRowBlocks; mb++) {
#pragma unroll
        for (int r = 0; r < 2; r++) mx[mb][r] = fmaxf(mx[mb][r], __shfl_xor_sync(0xffffffffu, mx[mb][r], x));
      }
    }
    bool moved = false;
#pragma unroll
    for (int mb = 0; mb < kRowBlocks; mb++) {
#pragma unroll
      for (int r = 0; r < 2; r++) {
        float m_new = fmaxf(row_max[mb][r], mx[mb][r] * s_mul);
        float m_use = m_new == -CUDART_INF_F ? 0.f : m_new;  // no key yet: exp2(-inf) = 0, never NaN
        // Exactly 1 while the max stands still (also while it stays -inf): see the rescale below.
        alpha[mb][r] = m_new == row_max[mb][r] ? 1.f : exp2_ftz(row_max[mb][r] - m_use);
        moved |= alpha[mb][r] != 1.f;
        float sum = 0.f;
#pragma unroll
        for (int nb = 0; nb < kKeys / 8; nb++) {
          s[mb][nb][2 * r] = exp2_ftz(fmaf(s[mb][nb][2 * r], s_mul, -m_use));
          s[mb][nb][2 * r + 1] = exp2_ftz(fmaf(s[mb][nb][2 * r + 1], s_mul, -m_use));
          sum += s[mb][nb][2 * r] + s[mb][nb][2 * r + 1];
        }
        row_sum[mb][r] = row_sum[mb][r] * alpha[mb][r] + sum;
        row_max[mb][r] = m_new;
      }
    }
    // P as A fragments of the input type now: 32 registers cross the rescale's branch, not S's 64
    // (on an H200 1-3% faster non-causal than packing per 16 keys inside P V, 2026-11-27).
    uint32_t pa[kRowBlocks][kKeys / 16][4];
#pragma unroll
    for (int mb = 0; mb < kRowBlocks; mb++) {
#pragma unroll
      for (int kk = 0; kk < kKeys / 16; kk++) {
        pa[mb][kk][0] = pack<T>(s[mb][2 * kk][0], s[mb][2 * kk][1]);
        pa[mb][kk][1] = pack<T>(s[mb][2 * kk][2], s[mb][2 * kk][3]);
        pa[mb][kk][2] = pack<T>(s[mb][2 * kk + 1][0], s[mb][2 * kk + 1][1]);
        pa[mb][kk][3] = pack<T>(s[mb][2 * kk + 1][2], s[mb][2 * kk + 1][3]);
      }
    }
    // The output rescale (D / 4 multiplies per thread and row block) only where some row of the warp
    // has a new max: a warp-uniform skip, and an exact one (the skipped factors are all 1). Once a row
    // has seen its largest scores, most tiles skip it.
    if (__any_sync(0xffffffffu, moved)) {
#pragma unroll
      for (int mb = 0; mb < kRowBlocks; mb++) {
#pragma unroll
        for (int nd = 0; nd < D / 8; nd++) {
#pragma unroll
          for (int i = 0; i < 4; i++) acc[mb][nd][i] *= alpha[mb][i / 2];
        }
      }
    }

    // O += P V, 16 keys per step (S's accumulators laid out as A fragments, packed above).
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; kk++) {
#pragma unroll
      for (int nd = 0; nd < D / 16; nd++) {
        uint32_t vf[4];
        ldmatrix_x4_trans(vf, &vs[(kk * 16 + (lane / 8) % 2 * 8 + lane % 8) * kStride + nd * 16 + lane / 16 * 8]);
#pragma unroll
        for (int mb = 0; mb < kRowBlocks; mb++) {
          mma<T>(acc[mb][2 * nd], pa[mb][kk], vf[0], vf[1]);
          mma<T>(acc[mb][2 * nd + 1], pa[mb][kk], vf[2], vf[3]);
        }
      }
    }
    tile = next;
  }

#pragma unroll
  for (int mb = 0; mb < kRowBlocks; mb++) {
#pragma unroll
    for (int r = 0; r < 2; r++) {
      float l = row_sum[mb][r];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const int t = wrow0 + 16 * mb + g + 8 * r;
      if (t >= tq) continue;
      const long long out = ((long long)out_b * tq + t) * heads + out_h;
      const float inv = l > 0.f ? 1.f / l : 0.f;
#pragma unroll
      for (int nd = 0; nd < D / 8; nd++) {
        int d = nd * 8 + 2 * t4;
        *reinterpret_cast<float2*>(&o[out * D + d]) =
            make_float2(acc[mb][nd][2 * r] * inv, acc[mb][nd][2 * r + 1] * inv);
      }
      // A NaN sum (a NaN score) stays NaN, never the empty state's -inf.
      if (t4 == 0) lse[out] = l > 0.f ? (row_max[mb][r] + log2f(l)) * kLn2 : l == 0.f ? -CUDART_INF_F : CUDART_NAN_F;
    }
  }
}

}  // namespace

// Entry points: grid (ceil(Tq / kRows), H, B), block kThreads threads, smem_bytes() of dynamic shared
// memory; bounded for two blocks per SM. The names keep "m32" (32 rows per warp) so that bin/gpu-check's
// A/B finds the same kernel in fatbins of earlier commits.
#define LONGCTX_FORWARD_TC(NAME, T, D)                                                                  \
  extern "C" __global__ void __launch_bounds__(kThreads, 2)                                             \
  NAME(const T* q, const T* k, const T* v, const long long* q_pos, const long long* k_pos, float* o,     \
       float* lse, int heads, int kv_heads, int tq, int tk, int dim, float scale, float softcap,        \
       int causal, long long window) {                                                                  \
    flash_forward_tc<T, D>(q, k, v, q_pos, k_pos, o, lse, heads, kv_heads, tq, tk, scale, softcap, causal, \
                           window);                                                                     \
  }

LONGCTX_FORWARD_TC(longctx_forward_tc_m32_f16_d64, __half, 64)
LONGCTX_FORWARD_TC(longctx_forward_tc_m32_f16_d128, __half, 128)
LONGCTX_FORWARD_TC(longctx_forward_tc_m32_bf16_d64, __nv_bfloat16, 64)
LONGCTX_FORWARD_TC(longctx_forward_tc_m32_bf16_d128, __nv_bfloat16, 128)
