// longctx CUDA attention forward on tensor cores (FlashAttention-2 style), fp16 and bf16 inputs,
// float32 accumulation and float32 (o, lse) outputs, head dims 64 and 128. Same contract as
// flash_forward.cu (layouts, masks by absolute positions, GQA, softcap, natural-log lse, -inf for
// rows that see no key); other dims and float32 inputs use that kernel.
//
// Block: 8 warps, 128 query rows (16 per warp); key tiles of 64 in shared memory (rows padded by 8
// elements so ldmatrix is free of bank conflicts), one K and one V tile shared by all 8 warps, so each
// tile is copied once per 128 query rows. Q fragments are read straight from global memory into
// registers. Per tile and warp:
//   S (16 x 64)  = Q (16 x D) K^T           mma.sync m16n8k16, Q fragments kept in registers
//   online softmax in base 2 (scale * log2 e folded in), rows reduced across the 4-thread quad
//   O (16 x D)  += P (16 x 64) V            P reused from S's accumulators as A fragments,
//                                           V read with ldmatrix.trans
// Each (query block, key tile) pair is classified once from position ranges: skipped, fully
// visible (no mask work) or partial (per-element mask by positions). The ranges are warp-wide
// min/max reductions that every warp computes itself (find_tile): a skipped tile costs no copy and
// no barrier. K and V travel in separate cp.async groups: S = Q K^T runs while V lands, and the next
// visible tile's K lands during P V. With a causal mask or a window the last query block (the one
// that sees the most keys) is launched first.
//
// Not yet run on a GPU (docs/CUDA.md): bin/gpu-check checks every variant against the float64
// reference on the first GPU machine.

#include <math_constants.h>

#include "longctx_mma.cuh"

namespace {

// An A/B against the earlier 64-row blocks needs only kThreads 128 and kRows 64 here and the same in
// CudaAttention's TC_THREADS / TC_ROWS_PER_BLOCK (a scratch build; docs/CUDA.md).
constexpr int kThreads = 256;  // 8 warps
constexpr int kRows = 128;     // query rows per block: one m16 row block per warp
constexpr int kKeys = 64;      // keys per tile
constexpr int kScanTiles = 4;  // key tiles whose positions one step of find_tile loads at once
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
static_assert(kRows == kThreads / 32 * 16, "each warp owns 16 query rows");

// Copies key rows [row0, row0 + kKeys) of a [rows, D] matrix into shared memory (row stride D + 8);
// rows at or past `valid` are zero.
template <typename T, int D>
__device__ __forceinline__ void load_tile(T* smem, const T* g, int row0, int valid) {
  constexpr int kChunks = D / 8;  // 16-byte chunks per row
  for (int idx = threadIdx.x; idx < kKeys * kChunks; idx += kThreads) {
    int r = idx / kChunks, c = idx % kChunks;
    T* dst = smem + r * (D + 8) + c * 8;
    if (row0 + r < valid) {
      cp_async16(dst, g + (long long)(row0 + r) * D + c * 8);
    } else {
      *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
    }
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
// coalesced 512-byte read of positions (L1/L2 after the first warp) and 10 shuffle pairs, not a
// serial scan of 64 positions by one thread between two barriers. The positions of kScanTiles tiles
// are loaded together before any is reduced, so a run of skipped tiles (a causal block's future)
// waits one memory latency per kScanTiles tiles, not per tile.
__device__ __forceinline__ Tile find_tile(int j0, const long long* __restrict__ k_pos, int tk, long long qlo,
                                          long long qhi, int causal, long long window) {
  if (!causal && window <= 0) return {j0 < tk ? j0 : tk, kAll};
  const int lane = threadIdx.x % 32;
  for (; j0 < tk; j0 += kScanTiles * kKeys) {
    long long p[2 * kScanTiles];  // lane's keys j0 + lane + 32 m: tile m / 2
#pragma unroll
    for (int m = 0; m < 2 * kScanTiles; m++) p[m] = j0 + lane + 32 * m < tk ? k_pos[j0 + lane + 32 * m] : 0;
#pragma unroll
    for (int t = 0; t < kScanTiles; t++) {
      if (j0 + t * kKeys >= tk) break;  // warp-uniform
      long long lo = LLONG_MAX, hi = LLONG_MIN;  // identities: keys past tk leave the range alone
#pragma unroll
      for (int m = 2 * t; m < 2 * t + 2; m++) {
        if (j0 + lane + 32 * m < tk) {
          lo = min(lo, p[m]);
          hi = max(hi, p[m]);
        }
      }
      warp_min_max(lo, hi);
      if (any_visible(qlo, qhi, lo, hi, causal, window)) {
        return {j0 + t * kKeys, all_visible(qlo, qhi, lo, hi, causal, window) ? kAll : kPartial};
      }
    }
  }
  return {tk, kPartial};
}

// Issues a key tile's K copies and, for a partial tile, stores its key positions (plain stores, only
// the per-element mask reads them; published by the barrier after K's wait).
template <typename T, int D>
__device__ __forceinline__ void load_kp(T* ks, long long* kp_s, const T* kg, const long long* __restrict__ k_pos,
                                        Tile tile, int tk) {
  load_tile<T, D>(ks, kg, tile.j0, tk);
  if (tile.vis == kPartial) {
    for (int i = threadIdx.x; i < kKeys; i += kThreads) kp_s[i] = tile.j0 + i < tk ? k_pos[tile.j0 + i] : 0;
  }
}

template <typename T, int D>
__device__ void flash_forward_tc(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                                 const long long* __restrict__ q_pos, const long long* __restrict__ k_pos,
                                 float* __restrict__ o, float* __restrict__ lse, int heads, int kv_heads, int tq,
                                 int tk, float scale, float softcap, int causal, long long window) {
  constexpr int kStride = D + 8;
  __shared__ __align__(16) T ks[kKeys * kStride];
  __shared__ __align__(16) T vs[kKeys * kStride];
  __shared__ long long kp_s[kKeys];  // key positions of a partial tile

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t4 = lane % 4;
  // With a causal mask (a window is one-sided too) the last query block sees the most keys when
  // positions rise along the sequence, as they do in a prefill. Blocks start roughly in blockIdx.x
  // order, so blockIdx.x 0 takes the last block: the longest blocks start first and the short ones
  // fill the tail of the last wave (longest-first scheduling), instead of a few long blocks
  // running alone at the end.
  const int qb = causal || window > 0 ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
  const int b = blockIdx.z, h = blockIdx.y, q0 = qb * kRows;
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
  const int row0 = q0 + warp * 16 + g;  // this thread's rows: row0 and row0 + 8
  const long long my_qp[2] = {row0 < tq ? q_pos[row0] : 0, row0 + 8 < tq ? q_pos[row0 + 8] : 0};

  // cp.async groups complete in commit order: the loop below always finds [K, V] of its tile in
  // flight, waits for K (wait_group 1) to compute S while V lands, and issues the next tile's K
  // once every warp is past S, so that K lands during P V (single buffers: 3 tiles of D 128 would
  // pass the 48 KB of static shared memory).
  Tile tile = find_tile(0, k_pos, tk, qlo, qhi, causal, window);
  if (tile.j0 < tk) load_kp<T, D>(ks, kp_s, kg, k_pos, tile, tk);
  cp_async_commit();  // group: K (empty when no tile is visible)
  if (tile.j0 < tk) load_tile<T, D>(vs, vg, tile.j0, tk);
  cp_async_commit();  // group: V

  // Q -> registers while the first K and V fly: this warp's 16 rows as D/16 mma A fragments,
  // register j holding row g + 8 (j % 2), columns 16 kc + 2 t4 + 8 (j / 2) and the next (one 4-byte
  // read); rows past tq are zero. Straight from global memory: a 128-row Q tile would not fit the V
  // buffer that staged the 64-row one, and Q is read once per block.
  uint32_t qf[D / 16][4];
#pragma unroll
  for (int kc = 0; kc < D / 16; kc++) {
#pragma unroll
    for (int j = 0; j < 4; j++) {
      const int r = row0 + 8 * (j % 2);
      qf[kc][j] = r < tq ? *reinterpret_cast<const uint32_t*>(qg + (long long)r * D + kc * 16 + 2 * t4 + 8 * (j / 2))
                         : 0u;
    }
  }

  float acc[D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; i++) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
  float row_max[2] = {-CUDART_INF_F, -CUDART_INF_F};
  float row_sum[2] = {0.f, 0.f};  // this thread's share; the quad sums at the end
  const float s_scale = softcap > 0.f ? scale / softcap : scale * kLog2e;

  // Skipped tiles never reach the loop body: no copy, no barrier.
  while (tile.j0 < tk) {
    const int j0 = tile.j0, vis = tile.vis;
    const Tile next = find_tile(j0 + kKeys, k_pos, tk, qlo, qhi, causal, window);  // while K and V fly
    cp_async_wait_1();  // this thread's K copies landed; V may still be in flight
    __syncthreads();    // everyone's K copies, zero rows and kp_s are visible

    // S = Q K^T for this warp's 16 rows and the tile's 64 keys (8 blocks of 8 keys).
    float s[kKeys / 8][4];
#pragma unroll
    for (int i = 0; i < kKeys / 8; i++) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
#pragma unroll
    for (int kc = 0; kc < D / 16; kc++) {
#pragma unroll
      for (int nb = 0; nb < kKeys / 16; nb++) {
        uint32_t kf[4];
        ldmatrix_x4(kf, &ks[(nb * 16 + lane / 16 * 8 + lane % 8) * kStride + kc * 16 + (lane / 8) % 2 * 8]);
        mma<T>(s[2 * nb], qf[kc], kf[0], kf[1]);
        mma<T>(s[2 * nb + 1], qf[kc], kf[2], kf[3]);
      }
    }

    // Scores to base-2 logits; masked and out-of-range keys become -inf.
    // Element i of s[nb] is row g + 8 * (i / 2), key nb * 8 + 2 * t4 + i % 2.
#pragma unroll
    for (int nb = 0; nb < kKeys / 8; nb++) {
#pragma unroll
      for (int i = 0; i < 4; i++) {
        int key = nb * 8 + 2 * t4 + i % 2;
        float x = s[nb][i] * s_scale;
        if (softcap > 0.f) x = softcap * tanhf(x) * kLog2e;
        bool keep = j0 + key < tk && (vis == kAll || visible(my_qp[i / 2], kp_s[key], causal, window));
        s[nb][i] = keep ? x : -CUDART_INF_F;
      }
    }

    // Online softmax per row (two rows per thread), max over the 4-thread quad.
#pragma unroll
    for (int r = 0; r < 2; r++) {
      float mx = -CUDART_INF_F;
#pragma unroll
      for (int nb = 0; nb < kKeys / 8; nb++) mx = fmaxf(mx, fmaxf(s[nb][2 * r], s[nb][2 * r + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      float m_new = fmaxf(row_max[r], mx);
      float m_use = m_new == -CUDART_INF_F ? 0.f : m_new;  // no key yet: exp2(-inf) = 0, never NaN
      float alpha = exp2f(row_max[r] - m_use);
      float sum = 0.f;
#pragma unroll
      for (int nb = 0; nb < kKeys / 8; nb++) {
        s[nb][2 * r] = exp2f(s[nb][2 * r] - m_use);
        s[nb][2 * r + 1] = exp2f(s[nb][2 * r + 1] - m_use);
        sum += s[nb][2 * r] + s[nb][2 * r + 1];
      }
      row_sum[r] = row_sum[r] * alpha + sum;
      row_max[r] = m_new;
#pragma unroll
      for (int nd = 0; nd < D / 8; nd++) {
        acc[nd][2 * r] *= alpha;
        acc[nd][2 * r + 1] *= alpha;
      }
    }

    cp_async_wait_0();  // V landed
    __syncthreads();    // everyone's V is visible, and every warp is past its reads of ks and kp_s
    if (next.j0 < tk) load_kp<T, D>(ks, kp_s, kg, k_pos, next, tk);
    cp_async_commit();  // group: the next K, landing during P V

    // O += P V, 16 keys per step; P's accumulators are already laid out as A fragments.
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; kk++) {
      uint32_t pa[4] = {pack<T>(s[2 * kk][0], s[2 * kk][1]), pack<T>(s[2 * kk][2], s[2 * kk][3]),
                        pack<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]), pack<T>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int nd = 0; nd < D / 16; nd++) {
        uint32_t vf[4];
        ldmatrix_x4_trans(vf, &vs[(kk * 16 + (lane / 8) % 2 * 8 + lane % 8) * kStride + nd * 16 + lane / 16 * 8]);
        mma<T>(acc[2 * nd], pa, vf[0], vf[1]);
        mma<T>(acc[2 * nd + 1], pa, vf[2], vf[3]);
      }
    }
    if (next.j0 >= tk) break;  // block-uniform
    __syncthreads();  // every warp is past its reads of vs
    load_tile<T, D>(vs, vg, next.j0, tk);
    cp_async_commit();  // group: the next V, landing during the next S
    tile = next;
  }

#pragma unroll
  for (int r = 0; r < 2; r++) {
    float l = row_sum[r];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const int t = q0 + warp * 16 + g + 8 * r;
    if (t >= tq) continue;
    const long long out = ((long long)b * tq + t) * heads + h;
    const float inv = l > 0.f ? 1.f / l : 0.f;
#pragma unroll
    for (int nd = 0; nd < D / 8; nd++) {
      int d = nd * 8 + 2 * t4;
      *reinterpret_cast<float2*>(&o[out * D + d]) = make_float2(acc[nd][2 * r] * inv, acc[nd][2 * r + 1] * inv);
    }
    if (t4 == 0) lse[out] = l > 0.f ? (row_max[r] + log2f(l)) * kLn2 : -CUDART_INF_F;
  }
}

}  // namespace

// Entry points: grid (ceil(Tq / kRows), H, B), block kThreads threads, static shared memory only.
// One block per SM at ~200 registers (D 128): 8 warps, as 2 blocks of 4 were before.
#define LONGCTX_FORWARD_TC(NAME, T, D)                                                                   \
  extern "C" __global__ void __launch_bounds__(kThreads, 1)                                              \
  NAME(const T* q, const T* k, const T* v, const long long* q_pos, const long long* k_pos, float* o,      \
       float* lse, int heads, int kv_heads, int tq, int tk, int dim, float scale, float softcap,         \
       int causal, long long window) {                                                                   \
    flash_forward_tc<T, D>(q, k, v, q_pos, k_pos, o, lse, heads, kv_heads, tq, tk, scale, softcap, causal, \
                           window);                                                                      \
  }

LONGCTX_FORWARD_TC(longctx_forward_tc_f16_d64, __half, 64)
LONGCTX_FORWARD_TC(longctx_forward_tc_f16_d128, __half, 128)
LONGCTX_FORWARD_TC(longctx_forward_tc_bf16_d64, __nv_bfloat16, 64)
LONGCTX_FORWARD_TC(longctx_forward_tc_bf16_d128, __nv_bfloat16, 128)
