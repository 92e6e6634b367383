// longctx CUDA split-K decoding (Flash-Decoding) and the FlashDecoding++ unified-max softmax.
//
// A few query rows per sequence (decode: 1..16 tokens) over a long KV sequence, handed as a list of
// chunks. Three kernels:
//
//   longctx_decode_{sync,unified}_<type>_d<DMAX>_r<RPW>   partial states, one CTA per
//       (batch, kv head, split, row block): every query row of the kv head's GQA group (query heads
//       h = kvh * group + g, times the Tq query tokens; rows r = g * Tq + t) is handled by the same
//       CTA, so each K/V tile is read from global memory once for the whole group.
//   longctx_decode_combine                                 merges the splits of each (row, head) in
//       split order 0, 1, 2, ... into the final attention state.
//
// Splits are fixed-length windows of the concatenated sequence: split s holds key indices
// [s * split_len, min((s + 1) * split_len, Tk)), whatever the chunking and whatever else is in the
// batch, and its 32-key tiles start at s * split_len + 32 i (narrowing to visible keys drops whole
// tiles). A split that crosses a chunk boundary reads from both chunks (keys are looked up through
// the chunk start table). For a fixed split length the result therefore depends on neither the
// batch composition nor the chunking nor the other rows of a CTA: the same keys meet in the same
// lanes and order.
//
// Layouts (element type T = float, __half, __nv_bfloat16 for q, k, v):
//   q [B, H, Tq, D]; chunk c of k and v: [B, Hkv, len_c, D] at k_chunks[c], v_chunks[c]
//   chunk_start [n_chunks + 1] int64: chunk c holds concatenated keys [chunk_start[c], chunk_start[c+1])
//   q_pos [Tq] int64; k_pos [Tk] int64 over the concatenated keys, or null for 0..Tk-1
//   partials: part_o [S_rows, n_splits, D] float32, part_lse [S_rows, n_splits] float64 (a float32 lse
//     near 100 has an ulp of 8e-6, which the combine's weights would inherit), flags uint8,
//     with S_rows = B * Tq * H and state row (b * Tq + t) * H + h (the AttentionState layout)
//   o [B * Tq, H, D] float32, lse [B * Tq, H] float32 (natural log; -inf and o = 0 for no keys)
//
// Partial, per row and split (keys j of the split, masked keys skipped, s_j = scale * q.k_j,
// softcap: cap * tanh(s_j / cap)):
//   synchronized: running max m; per 32-key tile  m' = max(m, max_j s_j),
//                 l = l * e^(m - m') + sum_j e^(s_j - m'),  o = o * e^(m - m') + sum_j e^(s_j - m') v_j
//   unified:      fixed phi:  l += sum_j e^(s_j - phi),  o += sum_j e^(s_j - phi) v_j, no rescaling;
//                 a row whose visible logits leave (phi + lower, phi + upper) is flagged, not written,
//                 and counted; the sync kernel run with `redo` = the flags recomputes exactly those
//                 (row, split) pairs.
//   finally o /= l, lse = m + log l (phi + log l); l == 0 (no visible key): o = 0, lse = -inf.
// Combine, per state row: M = max_s lse_s; M == -inf: (0, -inf), else
//   w_s = e^(lse_s - M) (0 for empty splits, never NaN), o = sum w_s o_s / sum w_s, lse = M + log sum w_s;
//   lse and the weights in float64, o in float32. The lanes of a warp share the splits for M and the
//   weights (one exp per split), then accumulate o in split order 0, 1, 2, ... (lanes over dims).
//
// CTA: 128 threads, 4 warps. Warp w owns rows w, w + 4, w + 8, ... (RPW rows at most). Per 32-key
// tile (double-buffered through shared memory with 16-byte cp.async, tail keys zero-filled):
//   scores:  lane j computes q.k for key j of the tile and every row of its warp (q from shared
//            memory, broadcast; K rows padded by 16 bytes so 16-byte reads are conflict-free), then
//            s = scale * q.k (the scale over the softcap when capping)
//   softmax: one warp max per row and tile (sync), per-lane partial sums l (reduced once at the end)
//   P V:     p goes through shared memory; lane owns dims 4*lane + 128*x (+0..3, one 8- or 16-byte
//            V load), V read once per key and reused for every row of the warp.
// Head dims: multiples of 8 up to DMAX (128 or 256). Float32 accumulation throughout.
//
// Not yet run on a GPU (docs/CUDA.md): bin/gpu-check checks it against the float64 reference.

#include <math_constants.h>

#include "longctx_device.cuh"

#ifndef LONGCTX_DYNAMIC_SHARED
#define LONGCTX_DYNAMIC_SHARED(T, name) extern __shared__ T name[]
#endif

namespace {

constexpr int kThreads = 128;
constexpr int kWarps = 4;
constexpr int kTile = 32;    // keys per tile: one per lane
constexpr int kStages = 2;   // shared-memory buffers per K and V




#ifndef LONGCTX_HOST_EMULATION
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, asynchronously; src_bytes = 0 zero-fills the destination.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_1() { asm volatile("cp.async.wait_group 1;\n" ::); }
__device__ __forceinline__ void cp_async_wait_0() { asm volatile("cp.async.wait_group 0;\n" ::); }
#endif  // the host emulation of the tests (src/test/cuda) supplies synchronous copies instead

// 8 consecutive elements from shared memory (16-byte aligned for 2-byte types, 32 for float).
__device__ __forceinline__ void load8(const float* p, float (&f)[8]) {
  float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
  f[0] = a.x; f[1] = a.y; f[2] = a.z; f[3] = a.w; f[4] = b.x; f[5] = b.y; f[6] = b.z; f[7] = b.w;
}
__device__ __forceinline__ void load8(const __half* p, float (&f)[8]) {
  uint4 u = *reinterpret_cast<const uint4*>(p);
  const __half2* h = reinterpret_cast<const __half2*>(&u);
  #pragma unroll
  for (int i = 0; i < 4; i++) { float2 x = __half22float2(h[i]); f[2 * i] = x.x; f[2 * i + 1] = x.y; }
}
__device__ __forceinline__ void load8(const __nv_bfloat16* p, float (&f)[8]) {
  uint4 u = *reinterpret_cast<const uint4*>(p);
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&u);
  #pragma unroll
  for (int i = 0; i < 4; i++) { float2 x = __bfloat1622float2(h[i]); f[2 * i] = x.x; f[2 * i + 1] = x.y; }
}

// Four consecutive elements (8-byte aligned for 2-byte types, 16 for float).
__device__ __forceinline__ float4 load4(const float* p) { return *reinterpret_cast<const float4*>(p); }
__device__ __forceinline__ float4 load4(const __half* p) {
  uint2 u = *reinterpret_cast<const uint2*>(p);
  float2 a = __half22float2(*reinterpret_cast<const __half2*>(&u.x));
  float2 b = __half22float2(*reinterpret_cast<const __half2*>(&u.y));
  return make_float4(a.x, a.y, b.x, b.y);
}
__device__ __forceinline__ float4 load4(const __nv_bfloat16* p) {
  uint2 u = *reinterpret_cast<const uint2*>(p);
  float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.x));
  float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.y));
  return make_float4(a.x, a.y, b.x, b.y);
}


// Shared-memory carve-up; CudaDecode.smemBytes computes the same total (LaunchGeometryTest checks the members).
template <typename T>
struct Smem {
  T* ks;              // [kStages][kTile][D + pad]
  T* vs;              // [kStages][kTile][D + pad]
  float* qs;          // [rows][D], unscaled (the scale multiplies the finished q.k)
  float* ps;          // [rows][kTile]
  long long* qp;      // [rows]
  int* row;           // [rows]: row of the kv head's group (g * Tq + t)
  int stride;         // elements per K/V row in shared memory
  __device__ Smem(void* base, int dim, int rows) {
    stride = dim + 16 / (int)sizeof(T);
    char* p = static_cast<char*>(base);
    ks = reinterpret_cast<T*>(p); p += sizeof(T) * kStages * kTile * stride;
    vs = reinterpret_cast<T*>(p); p += sizeof(T) * kStages * kTile * stride;
    qs = reinterpret_cast<float*>(p); p += sizeof(float) * rows * dim;
    ps = reinterpret_cast<float*>(p); p += sizeof(float) * rows * kTile;
    qp = reinterpret_cast<long long*>(p); p += sizeof(long long) * rows;
    row = reinterpret_cast<int*>(p);
  }
};

// The chunk holding concatenated key j, walking forward from chunk c (keys only move forward).
__device__ __forceinline__ int chunk_of(const long long* __restrict__ chunk_start, int c, long long j) {
  while (j >= chunk_start[c + 1]) c++;
  return c;
}

// First chunk holding key j (binary search over the start table; empty chunks are skipped).
__device__ int find_chunk(const long long* __restrict__ chunk_start, int n_chunks, long long j) {
  int lo = 0, hi = n_chunks - 1;  // the last chunk c with chunk_start[c] <= j
  while (lo < hi) {
    int mid = (lo + hi + 1) >> 1;
    if (chunk_start[mid] <= j) lo = mid; else hi = mid - 1;
  }
  return chunk_of(chunk_start, lo, j);
}

struct DecodeArgs {
  const void* q;
  const void* const* k_chunks;
  const void* const* v_chunks;
  const long long* chunk_start;
  const long long* q_pos;
  const long long* k_pos;
  float* part_o;
  double* part_lse;
  unsigned char* flags;
  unsigned long long* recomputed;
  const unsigned char* redo;
  int n_chunks, heads, kv_heads, tq, dim, split_len, n_splits, rows_per_cta;
  long long tk;
  float qscale, softcap;
  int causal;
  long long window;
  float phi, lower, upper;
};

// Issues the cp.async copies of tile [j0, j0 + kTile) of K and V into stage `st`; keys at or past
// `end` are zero-filled (their scores are masked, and zero V keeps 0 * garbage out of the sums).
// A tile inside one chunk (the common case) takes one base address; a tile that crosses chunk
// boundaries looks each key's chunk up, walking forward from the tile's first chunk.
template <typename T>
__device__ __forceinline__ void load_tile(const DecodeArgs& a, const Smem<T>& sm, int st, long long j0, long long end,
                                          int tile_chunk, int b, int kvh) {
  const int per_row = a.dim * (int)sizeof(T) / 16;  // 16-byte pieces per key row
  const long long head_base = (long long)b * a.kv_heads + kvh;
  const long long row_bytes = (long long)a.dim * sizeof(T);
  const long long c0 = a.chunk_start[tile_chunk], c1 = a.chunk_start[tile_chunk + 1];
  const bool one_chunk = j0 + kTile <= c1 && j0 + kTile <= end;
  const char* kb = static_cast<const char*>(a.k_chunks[tile_chunk]) + (head_base * (c1 - c0) + (j0 - c0)) * row_bytes;
  const char* vb = static_cast<const char*>(a.v_chunks[tile_chunk]) + (head_base * (c1 - c0) + (j0 - c0)) * row_bytes;
  // Piece e = threadIdx.x + kThreads * it is (key jj, piece pc) of the tile; stepped without division.
  int jj = threadIdx.x / per_row, pc = threadIdx.x % per_row;
  const int step_j = kThreads / per_row, step_p = kThreads % per_row;
  for (; jj < kTile; jj += step_j) {
    T* kd = sm.ks + ((long long)st * kTile + jj) * sm.stride + pc * (16 / (int)sizeof(T));
    T* vd = sm.vs + ((long long)st * kTile + jj) * sm.stride + pc * (16 / (int)sizeof(T));
    const long long j = j0 + jj;
    if (one_chunk) {
      cp_async16(kd, kb + jj * row_bytes + pc * 16, 16);
      cp_async16(vd, vb + jj * row_bytes + pc * 16, 16);
    } else if (j < end) {
      const int c = chunk_of(a.chunk_start, tile_chunk, j);
      const long long start = a.chunk_start[c], len = a.chunk_start[c + 1] - start;
      const long long off = (head_base * len + (j - start)) * row_bytes + pc * 16;
      cp_async16(kd, static_cast<const char*>(a.k_chunks[c]) + off, 16);
      cp_async16(vd, static_cast<const char*>(a.v_chunks[c]) + off, 16);
    } else {
      cp_async16(kd, a.k_chunks[tile_chunk], 0);
      cp_async16(vd, a.v_chunks[tile_chunk], 0);
    }
    pc += step_p;
    if (pc >= per_row) { pc -= per_row; jj++; }
  }
}

template <typename T, int DMAX, int RPW, bool UNIFIED>
__device__ void decode_partial(const DecodeArgs& a) {
  constexpr int kQuads = DMAX / 128;  // dim quads per lane: dims 4 * lane + 128 * x + 0..3
  LONGCTX_DYNAMIC_SHARED(float4, smem_raw);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int split = blockIdx.x % a.n_splits, rb = blockIdx.x / a.n_splits;
  const int kvh = blockIdx.y, b = blockIdx.z;
  const int group = a.heads / a.kv_heads;
  const int group_rows = group * a.tq;
  const int r0 = rb * a.rows_per_cta;
  const int block_rows = min(a.rows_per_cta, group_rows - r0);
  Smem<T> sm(smem_raw, a.dim, a.rows_per_cta);
  __shared__ int n_rows_s;
  __shared__ long long qp_min_s, qp_max_s;

  // Rows of this CTA: all of its row block, or (recompute pass) only the flagged ones, in order.
  if (threadIdx.x == 0) {
    int n = 0;
    long long lo = 0x7fffffffffffffffLL, hi = -0x7fffffffffffffffLL - 1;
    for (int r = 0; r < block_rows; r++) {
      const int gr = r0 + r, g = gr / a.tq, t = gr % a.tq;
      const long long state = ((long long)b * a.tq + t) * a.heads + kvh * group + g;
      if (a.redo != nullptr && !a.redo[state * a.n_splits + split]) continue;
      sm.row[n] = gr;
      sm.qp[n] = a.q_pos[t];
      lo = min(lo, a.q_pos[t]);
      hi = max(hi, a.q_pos[t]);
      n++;
    }
    n_rows_s = n;
    qp_min_s = lo;
    qp_max_s = hi;
  }
  __syncthreads();
  const int n_rows = n_rows_s;
  if (n_rows == 0) return;  // recompute pass: nothing flagged here

  // Keys of the split; with positions 0..Tk-1 (k_pos null) narrowed to those some row can see.
  const long long s0 = (long long)split * a.split_len;
  const long long s1 = min(s0 + a.split_len, a.tk);
  long long lo = s0, hi = s1;
  if (a.k_pos == nullptr) {
    // (bounds that would overflow narrow nothing)
    if ((a.causal || a.window > 0) && qp_max_s < LLONG_MAX) hi = min(hi, qp_max_s + 1);
    if (a.window > 0 && qp_min_s >= LLONG_MIN + a.window) lo = max(lo, qp_min_s - a.window + 1);
  }
  // Tiles start at s0 + a multiple of kTile however far the window moved lo: narrowing drops whole
  // tiles only. A row's key-to-lane assignment and per-tile maxima, hence its bits, then do not
  // depend on which other rows share the CTA (other row blocks, the recompute pass's flagged rows);
  // the dropped tiles and the tail past hi are ones every row of the CTA would skip exactly.
  if (lo < hi) lo = s0 + (lo - s0) / kTile * kTile;

  // q rows into shared memory as float, exactly (the scale multiplies the finished dot product:
  // products of fp16/bf16 values are exact in float32, so q.k rounds as the naive algorithm's does).
  const T* q = static_cast<const T*>(a.q);
  for (int e = threadIdx.x; e < n_rows * a.dim; e += kThreads) {
    const int r = e / a.dim, d = e % a.dim;
    const int gr = sm.row[r], g = gr / a.tq, t = gr % a.tq;
    sm.qs[e] = to_float(q[(((long long)b * a.heads + kvh * group + g) * a.tq + t) * a.dim + d]);
  }

  // Rows of this warp: w, w + 4, ...
  const int my_rows = n_rows > warp ? (n_rows - warp + kWarps - 1) / kWarps : 0;
  float acc[RPW][4 * kQuads];
  float m[RPW], l[RPW];
  unsigned bad = 0;  // unified: bit i set when row i saw a logit outside the bounds
  #pragma unroll
  for (int i = 0; i < RPW; i++) {
    m[i] = UNIFIED ? a.phi : -CUDART_INF_F;
    l[i] = 0.f;
    #pragma unroll
    for (int x = 0; x < 4 * kQuads; x++) acc[i][x] = 0.f;
  }

  const long long n_tiles = lo < hi ? (hi - lo + kTile - 1) / kTile : 0;
  int tile_chunk = n_tiles > 0 ? find_chunk(a.chunk_start, a.n_chunks, lo) : 0;
  if (n_tiles > 0) load_tile<T>(a, sm, 0, lo, hi, tile_chunk, b, kvh);
  cp_async_commit();

  for (long long tile = 0; tile < n_tiles; tile++) {
    const long long j0 = lo + tile * kTile;
    const int st = (int)(tile & 1);
    if (tile + 1 < n_tiles) {
      tile_chunk = chunk_of(a.chunk_start, tile_chunk, j0 + kTile);
      load_tile<T>(a, sm, st ^ 1, j0 + kTile, hi, tile_chunk, b, kvh);
    }
    cp_async_commit();
    cp_async_wait_1();  // this tile has landed (the next may still be in flight)
    __syncthreads();

    // Scores: lane = key j0 + lane, for each row of the warp.
    const T* krow = sm.ks + ((long long)st * kTile + lane) * sm.stride;
    float s[RPW];
    #pragma unroll
    for (int i = 0; i < RPW; i++) s[i] = 0.f;
    #pragma unroll 2
    for (int d = 0; d < a.dim; d += 8) {
      float kf[8];
      load8(krow + d, kf);
      #pragma unroll
      for (int i = 0; i < RPW; i++) {
        if (i < my_rows) {
          const float* qr = sm.qs + (warp + kWarps * i) * a.dim + d;
          float qf[8];
          load8(qr, qf);
          #pragma unroll
          for (int x = 0; x < 8; x++) s[i] = fmaf(qf[x], kf[x], s[i]);
        }
      }
    }
    const long long j = j0 + lane;
    const long long kp = j < hi ? (a.k_pos != nullptr ? a.k_pos[j] : j) : 0;

    // Softmax step, one row at a time; p to shared memory for the P V product.
    #pragma unroll
    for (int i = 0; i < RPW; i++) {
      if (i < my_rows) {
        const int r = warp + kWarps * i;
        float x = s[i] * a.qscale;
        if (a.softcap > 0.f) x = a.softcap * tanhf(x);
        if (j >= hi || !visible(sm.qp[r], kp, a.causal, a.window)) x = -CUDART_INF_F;
        float p;
        if (UNIFIED) {
          const bool vis = x != -CUDART_INF_F;
          if (vis && !(x - a.phi > a.lower && x - a.phi < a.upper)) bad |= 1u << i;
          p = vis ? expf(x - a.phi) : 0.f;
          l[i] += p;
        } else {
          const float m_new = fmaxf(m[i], warp_max(x));
          p = x == -CUDART_INF_F ? 0.f : expf(x - m_new);
          const float alpha = m[i] == m_new ? 1.f : expf(m[i] - m_new);  // m = -inf first: 0
          l[i] = fmaf(l[i], alpha, p);
          if (alpha != 1.f) {  // uniform across the warp (m is)
            #pragma unroll
            for (int x2 = 0; x2 < 4 * kQuads; x2++) acc[i][x2] *= alpha;
          }
          m[i] = m_new;
        }
        sm.ps[r * kTile + lane] = p;
      }
    }
    __syncwarp();

    // o += P V: V rows read once per key, reused by every row of the warp.
    const T* vbase = sm.vs + (long long)st * kTile * sm.stride;
    #pragma unroll 2
    for (int jj = 0; jj < kTile; jj += 4) {
      float4 vf[4][kQuads];
      #pragma unroll
      for (int u = 0; u < 4; u++) {
        #pragma unroll
        for (int x = 0; x < kQuads; x++) {
          const int d = 4 * lane + 128 * x;
          vf[u][x] = d < a.dim ? load4(vbase + (jj + u) * sm.stride + d) : make_float4(0.f, 0.f, 0.f, 0.f);
        }
      }
      #pragma unroll
      for (int i = 0; i < RPW; i++) {
        if (i < my_rows) {
          const float4 p4 = *reinterpret_cast<const float4*>(sm.ps + (warp + kWarps * i) * kTile + jj);
          const float pu[4] = {p4.x, p4.y, p4.z, p4.w};
          #pragma unroll
          for (int u = 0; u < 4; u++) {
            #pragma unroll
            for (int x = 0; x < kQuads; x++) {
              acc[i][4 * x] = fmaf(pu[u], vf[u][x].x, acc[i][4 * x]);
              acc[i][4 * x + 1] = fmaf(pu[u], vf[u][x].y, acc[i][4 * x + 1]);
              acc[i][4 * x + 2] = fmaf(pu[u], vf[u][x].z, acc[i][4 * x + 2]);
              acc[i][4 * x + 3] = fmaf(pu[u], vf[u][x].w, acc[i][4 * x + 3]);
            }
          }
        }
      }
    }
    __syncthreads();  // the stage is overwritten by the load issued next iteration
  }
  cp_async_wait_0();

  // Partial states out (float32).
  #pragma unroll
  for (int i = 0; i < RPW; i++) {
    if (i < my_rows) {
      const int r = warp + kWarps * i;
      const int gr = sm.row[r], g = gr / a.tq, t = gr % a.tq;
      const long long state = ((long long)b * a.tq + t) * a.heads + kvh * group + g;
      const long long at = state * a.n_splits + split;
      const float lsum = warp_sum(l[i]);
      bool flagged = false;
      if (UNIFIED) {
        flagged = __any_sync(0xffffffffu, (bad >> i) & 1u);
        if (lane == 0) {
          a.flags[at] = flagged ? 1 : 0;
          if (flagged) atomicAdd(a.recomputed, 1ull);
        }
      }
      if (flagged) continue;  // the recompute pass writes this one
      const float inv = lsum > 0.f ? 1.f / lsum : 0.f;
      #pragma unroll
      for (int x = 0; x < kQuads; x++) {
        const int d = 4 * lane + 128 * x;
        if (d < a.dim) {
          *reinterpret_cast<float4*>(a.part_o + at * a.dim + d) =
              make_float4(acc[i][4 * x] * inv, acc[i][4 * x + 1] * inv, acc[i][4 * x + 2] * inv, acc[i][4 * x + 3] * inv);
        }
      }
      if (lane == 0) a.part_lse[at] = lsum > 0.f ? (double)m[i] + log((double)lsum) : -CUDART_INF;
    }
  }
}

}  // namespace

// Partial kernels: grid (n_splits * row_blocks, Hkv, B), block 128, dynamic shared memory as in
// Smem. `redo` (sync kernels only) restricts the rows to the flagged (row, split) pairs.
#define LONGCTX_DECODE(NAME, T, DMAX, RPW, UNIFIED)                                                    \
  extern "C" __global__ void __launch_bounds__(kThreads, 2) NAME(                                        \
      const T* q, const T* const* k_chunks, const T* const* v_chunks, const long long* chunk_start,   \
      int n_chunks, const long long* q_pos, const long long* k_pos, float* part_o, double* part_lse, \
      unsigned char* flags, unsigned long long* recomputed, const unsigned char* redo, int heads,     \
      int kv_heads, int tq, int dim, long long tk, int split_len, int n_splits, int rows_per_cta,     \
      float qscale, float softcap, int causal, long long window, float phi, float lower,             \
      float upper) {                                                                                  \
    DecodeArgs a;                                                                                     \
    a.q = q; a.k_chunks = reinterpret_cast<const void* const*>(k_chunks);                             \
    a.v_chunks = reinterpret_cast<const void* const*>(v_chunks); a.chunk_start = chunk_start;         \
    a.n_chunks = n_chunks; a.q_pos = q_pos; a.k_pos = k_pos; a.part_o = part_o;                       \
    a.part_lse = part_lse; a.flags = flags; a.recomputed = recomputed; a.redo = redo;                 \
    a.heads = heads; a.kv_heads = kv_heads; a.tq = tq; a.dim = dim; a.tk = tk;                        \
    a.split_len = split_len; a.n_splits = n_splits; a.rows_per_cta = rows_per_cta;                   \
    a.qscale = qscale; a.softcap = softcap; a.causal = causal; a.window = window;                     \
    a.phi = phi; a.lower = lower; a.upper = upper;                                                    \
    decode_partial<T, DMAX, RPW, UNIFIED>(a);                                                         \
  }

#define LONGCTX_DECODE_TYPE(T, SUFFIX)                                                                \
  LONGCTX_DECODE(longctx_decode_sync_##SUFFIX##_d128_r2, T, 128, 2, false)                            \
  LONGCTX_DECODE(longctx_decode_unified_##SUFFIX##_d128_r2, T, 128, 2, true)                          \
  LONGCTX_DECODE(longctx_decode_sync_##SUFFIX##_d128_r16, T, 128, 16, false)                          \
  LONGCTX_DECODE(longctx_decode_unified_##SUFFIX##_d128_r16, T, 128, 16, true)                        \
  LONGCTX_DECODE(longctx_decode_sync_##SUFFIX##_d256_r2, T, 256, 2, false)                            \
  LONGCTX_DECODE(longctx_decode_unified_##SUFFIX##_d256_r2, T, 256, 2, true)                          \
  LONGCTX_DECODE(longctx_decode_sync_##SUFFIX##_d256_r8, T, 256, 8, false)                            \
  LONGCTX_DECODE(longctx_decode_unified_##SUFFIX##_d256_r8, T, 256, 8, true)

LONGCTX_DECODE_TYPE(float, f32)
LONGCTX_DECODE_TYPE(__half, f16)
LONGCTX_DECODE_TYPE(__nv_bfloat16, bf16)

// acc[x] += w[i] * o_i[4 * lane + 128 * x + 0..3] for the splits i < n of one group, in order.
// A zero weight adds exactly 0 (every partial o is finite, 0 for an empty split) and a lane past
// the head dim reads the row's first dims and drops them: no branch in the loop, so the loads of
// the next splits can be issued before this one's FMAs.
template <int Q>
__device__ __forceinline__ void accumulate_splits(const float* __restrict__ po, const float* w, int n, int dim,
                                                  int lane, float4 (&acc)[2]) {
  int at[Q];
  #pragma unroll
  for (int x = 0; x < Q; x++) at[x] = 4 * lane + 128 * x < dim ? 4 * lane + 128 * x : 0;
  #pragma unroll 4
  for (int i = 0; i < n; i++) {
    const float wf = w[i];
    #pragma unroll
    for (int x = 0; x < Q; x++) {
      const float4 v = *reinterpret_cast<const float4*>(po + (long long)i * dim + at[x]);
      acc[x].x = fmaf(wf, v.x, acc[x].x);
      acc[x].y = fmaf(wf, v.y, acc[x].y);
      acc[x].z = fmaf(wf, v.z, acc[x].z);
      acc[x].w = fmaf(wf, v.w, acc[x].w);
    }
  }
}

// Combine: one warp per state row, grid ceil(S_rows / 4), block 128.
//
// The splits of a row are reduced in parallel by its warp: lane i takes splits i, i + 32, ... for
// the max of lse and for the weights, so each split costs one float64 exp, done once (it used to be
// every lane, one split after another). Each group of 32 weights goes through shared memory to the
// whole warp, which accumulates o over those splits in split order, lanes over dims (coalesced
// 16-byte loads of each split's o, independent of each other, so they can be in flight together).
// Every sum has a fixed order, whatever the timing: o in split order, the weight sum lane by lane
// and then by a butterfly (whose result is the same bits on every lane). Same bits on every run.
extern "C" __global__ void __launch_bounds__(kThreads)
longctx_decode_combine(const float* __restrict__ part_o, const double* __restrict__ part_lse, int n_splits, int dim,
                       long long n_states, float* __restrict__ o, float* __restrict__ lse) {
  constexpr int kQuads = 256 / 128;  // dims 4 * lane + 128 * x + 0..3, as the partial kernels write them
  __shared__ float w_s[kWarps][32];  // a warp's weights of splits base .. base + 31
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const long long state = (long long)blockIdx.x * kWarps + warp;
  if (state >= n_states) return;  // the whole warp: state is per warp
  const double* pl = part_lse + state * n_splits;
  double mx = -CUDART_INF;
  for (int s = lane; s < n_splits; s += 32) mx = fmax(mx, pl[s]);
  for (int off = 16; off > 0; off >>= 1) mx = fmax(mx, __shfl_xor_sync(0xffffffffu, mx, off));
  if (mx == -CUDART_INF) {  // no split saw a key: the identity, no 0/0
    for (int d = lane; d < dim; d += 32) o[state * dim + d] = 0.f;
    if (lane == 0) lse[state] = -CUDART_INF_F;
    return;
  }
  float4 acc[kQuads];
  #pragma unroll
  for (int x = 0; x < kQuads; x++) acc[x] = make_float4(0.f, 0.f, 0.f, 0.f);
  double wsum = 0.0;  // this lane's splits
  for (int base = 0; base < n_splits; base += 32) {
    const int s = base + lane;
    const double w = s < n_splits ? exp(pl[s] - mx) : 0.0;  // empty split: e^-inf = 0
    wsum += w;
    __syncwarp();  // the previous group's weights have been read
    w_s[warp][lane] = (float)w;
    __syncwarp();
    const int n = min(32, n_splits - base);
    const float* po = part_o + (state * n_splits + base) * dim;
    if (dim <= 128) accumulate_splits<1>(po, w_s[warp], n, dim, lane, acc);
    else accumulate_splits<2>(po, w_s[warp], n, dim, lane, acc);
  }
  for (int off = 16; off > 0; off >>= 1) wsum += __shfl_xor_sync(0xffffffffu, wsum, off);
  const float inv = (float)(1.0 / wsum);  // wsum >= 1: the largest split has weight 1
  #pragma unroll
  for (int x = 0; x < kQuads; x++) {
    const int d = 4 * lane + 128 * x;
    if (d < dim) {
      *reinterpret_cast<float4*>(o + state * dim + d) =
          make_float4(acc[x].x * inv, acc[x].y * inv, acc[x].z * inv, acc[x].w * inv);
    }
  }
  if (lane == 0) lse[state] = (float)(mx + log(wsum));
}
