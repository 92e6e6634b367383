// longctx CUDA attention forward: the attention state (o, lse) of queries over one key/value chunk.
//
// This first version is a plain, readable reference kernel on CUDA cores (no tensor cores yet):
// one warp per query row, lanes split the head dim, keys streamed through shared memory in tiles
// shared by the block's warps, online softmax in float32. Its job is to fix the contract the
// tensor-core kernels must meet (layouts, masks by absolute positions, GQA, softcap, lse in natural
// log with -inf for rows that see no key); see docs/CUDA.md.
//
// Layouts (as the Java side, io.longctx.kernels.Tensor / AttentionState):
//   q [B, H, Tq, D], k and v [B, Hkv, Tk, D], element type T (float, __half, __nv_bfloat16)
//   o [B*Tq, H, D] float32, lse [B*Tq, H] float32; row = b*Tq + t
//   qPos [Tq], kPos [Tk] int64 absolute token positions
//
// Per row, keys j in order:  s = scale * q.k_j  (softcap: cap * tanh(s / cap); masked: skipped)
//   m' = max(m, s); l = l * exp(m - m') + exp(s - m'); o = o * exp(m - m') + exp(s - m') * v_j
// finally o /= l, lse = m + log(l); l == 0 means no visible key: o = 0, lse = -inf.

#include <math_constants.h>

#include "longctx_device.cuh"

namespace {

constexpr int kWarps = 4;        // query rows per block
constexpr int kKeyTile = 16;     // keys per shared-memory tile (2 x 16 x 256 floats = 32 KiB)
constexpr int kMaxDim = 256;     // head dims up to this
constexpr int kPerLane = kMaxDim / 32;




template <typename T>
__device__ void flash_forward(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                              const long long* __restrict__ q_pos, const long long* __restrict__ k_pos,
                              float* __restrict__ o, float* __restrict__ lse,
                              int heads, int kv_heads, int tq, int tk, int dim,
                              float scale, float softcap, int causal, long long window) {
  __shared__ float ks[kKeyTile][kMaxDim];
  __shared__ float vs[kKeyTile][kMaxDim];
  __shared__ long long kp_s[kKeyTile];

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int b = blockIdx.z, h = blockIdx.y;
  const int t = blockIdx.x * kWarps + warp;
  const bool active = t < tq;
  const int kvh = h / (heads / kv_heads);
  const long long qp = active ? q_pos[t] : 0;

  float qr[kPerLane], acc[kPerLane];
  const T* qrow = q + (((long long)b * heads + h) * tq + (active ? t : 0)) * dim;
  #pragma unroll
  for (int i = 0; i < kPerLane; i++) {
    int d = lane + 32 * i;
    qr[i] = (active && d < dim) ? to_float(qrow[d]) : 0.f;
    acc[i] = 0.f;
  }
  float m = -CUDART_INF_F, l = 0.f;

  const long long kv_base = ((long long)b * kv_heads + kvh) * tk * dim;
  for (int j0 = 0; j0 < tk; j0 += kKeyTile) {
    const int n = min(kKeyTile, tk - j0);
    __syncthreads();
    for (int idx = threadIdx.x; idx < n * dim; idx += blockDim.x) {
      int jj = idx / dim, d = idx % dim;
      ks[jj][d] = to_float(k[kv_base + (long long)(j0 + jj) * dim + d]);
      vs[jj][d] = to_float(v[kv_base + (long long)(j0 + jj) * dim + d]);
    }
    for (int jj = threadIdx.x; jj < n; jj += blockDim.x) kp_s[jj] = k_pos[j0 + jj];
    __syncthreads();
    if (!active) continue;
    for (int jj = 0; jj < n; jj++) {
      if (!visible(qp, kp_s[jj], causal, window)) continue;
      float part = 0.f;
      #pragma unroll
      for (int i = 0; i < kPerLane; i++) {
        int d = lane + 32 * i;
        if (d < dim) part += qr[i] * ks[jj][d];
      }
      float s = warp_sum(part) * scale;
      if (softcap > 0.f) s = soft_capped(softcap, s / softcap);
      float m_new = fmaxf(m, s);
      // The max did not move: exactly 1 (also when both are -inf, where exp(-inf - -inf) is NaN);
      // from m = -inf to a finite max: exp(-inf) = 0. expf, not __expf: the fast one's error grows
      // with |x| (2 + 1.17|x| ulp), above the float32 rule's budget for logits a few tens apart.
      float alpha = m == m_new ? 1.f : expf(m - m_new);
      float p = s == -CUDART_INF_F ? 0.f : expf(s - m_new);  // a -inf score (overflowed q.k) adds nothing
      l = l * alpha + p;
      #pragma unroll
      for (int i = 0; i < kPerLane; i++) {
        int d = lane + 32 * i;
        if (d < dim) acc[i] = acc[i] * alpha + p * vs[jj][d];
      }
      m = m_new;
    }
  }
  if (!active) return;
  const long long out = ((long long)b * tq + t) * heads + h;
  const float inv = l > 0.f ? 1.f / l : 0.f;
  #pragma unroll
  for (int i = 0; i < kPerLane; i++) {
    int d = lane + 32 * i;
    if (d < dim) o[out * dim + d] = acc[i] * inv;
  }
  if (lane == 0) lse[out] = l > 0.f ? m + logf(l) : l == 0.f ? -CUDART_INF_F : CUDART_NAN_F;  // NaN sum: NaN
}

}  // namespace

// Entry points, one per input element type; launch with grid (ceil(Tq / 4), H, B), block 128.
#define LONGCTX_FORWARD(NAME, T)                                                                    \
  extern "C" __global__ void __launch_bounds__(kWarps * 32)                                         \
  NAME(const T* q, const T* k, const T* v, const long long* q_pos, const long long* k_pos, float* o, \
       float* lse, int heads, int kv_heads, int tq, int tk, int dim, float scale, float softcap,    \
       int causal, long long window) {                                                              \
    flash_forward<T>(q, k, v, q_pos, k_pos, o, lse, heads, kv_heads, tq, tk, dim, scale, softcap,   \
                     causal, window);                                                               \
  }

LONGCTX_FORWARD(longctx_forward_f32, float)
LONGCTX_FORWARD(longctx_forward_f16, __half)
LONGCTX_FORWARD(longctx_forward_bf16, __nv_bfloat16)
