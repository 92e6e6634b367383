// longctx CUDA split-K decoding (Flash-Decoding) and the FlashDecoding++ unified-max softmax.
//
// A few query rows per sequence (decode: 1..16 tokens) over a long KV sequence, handed as a list of
// chunks. Three kernel families:
//
//   longctx_decode_{sync,unified}_<type>_d<DMAX>_r<RPW>   partial states, one CTA per
//       (batch, kv head, split, row block): every query row of the kv head's GQA group (query heads
//       h = kvh * group + g, times the Tq query tokens; rows r = g * Tq + t) is handled by the same
//       CTA, so each K/V tile is read from global memory once for the whole group.
//   longctx_decode_tc_{sync,unified}_<type>_d128           the same partials on tensor cores
//       (mma.sync) for fp16/bf16 at any row count (up to 32 per CTA), D a multiple of 16 up to 128
//       (below); the CUDA-core kernels above serve float32 and the other head dims.
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
// CUDA-core CTA: 128 threads, 4 warps. Warp w owns rows w, w + 4, w + 8, ... (RPW rows at most). Per 32-key
// tile (double-buffered through shared memory with 16-byte cp.async, tail keys zero-filled):
//   scores:  lane j computes q.k for key j of the tile and every row of its warp (q from shared
//            memory, broadcast; K rows padded by 16 bytes so 16-byte reads are conflict-free), then
//            s = scale * q.k (the scale over the softcap when capping)
//   softmax: one warp max per row and tile (sync), per-lane partial sums l (reduced once at the end)
//   P V:     p goes through shared memory; lane owns dims 4*lane + 128*x (+0..3, one 8- or 16-byte
//            V load), V read once per key and reused for every row of the warp.
// Head dims: multiples of 8 up to DMAX (128 or 256). Float32 accumulation throughout.
//
// Run on an H200 (2026-11-26, docs/BENCHMARKS.md): bin/gpu-check checks every variant against the
// float64 reference and times it against a copy and PyTorch SDPA.

#include <math_constants.h>

#include "longctx_mma.cuh"

namespace {

constexpr int kThreads = 128;
constexpr int kWarps = 4;
constexpr int kTile = 32;    // keys per tile: one per lane
constexpr int kStages = 2;   // shared-memory buffers per K and V (3 measured no faster on the H200, 2026-11-26)


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
// The CUDA-core kernels keep q as float and p per row (qs, ps); the tensor-core kernels keep q in
// the input type for ldmatrix, padded like K and V, zero rows up to a whole m16 block (qt), in V's
// last stage (at most kTile rows), which they read into registers before the loop's first prefetch
// lands there: it costs no shared memory of its own.
template <typename T>
struct Smem {
  T* ks;              // [kStages][kTile][D + pad]
  T* vs;              // [kStages][kTile][D + pad]
  float* qs;          // [rows][D], unscaled (the scale multiplies the finished q.k); CUDA cores
  float* ps;          // [rows][kTile]; CUDA cores
  T* qt;              // [rows rounded up to 16][D + pad]; tensor cores, aliases V's stage 1
  long long* qp;      // [rows]
  int* row;           // [rows]: row of the kv head's group (g * Tq + t)
  int stride;         // elements per K/V/qt row in shared memory
  __device__ Smem(void* base, int dim, int rows, bool tc) {
    stride = dim + 16 / (int)sizeof(T);
    const int fl = tc ? 0 : rows;
    char* p = static_cast<char*>(base);
    ks = reinterpret_cast<T*>(p); p += sizeof(T) * kStages * kTile * stride;
    vs = reinterpret_cast<T*>(p); p += sizeof(T) * kStages * kTile * stride;
    qs = reinterpret_cast<float*>(p); p += sizeof(float) * fl * dim;
    ps = reinterpret_cast<float*>(p); p += sizeof(float) * fl * kTile;
    qt = vs + (kStages - 1) * kTile * stride;
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

// Grid x is (split, row block), split-major: the row blocks of one split are neighbours, so they
// tend to run together and share the split's K/V tiles in L2.
__device__ __forceinline__ int split_of(const DecodeArgs& a) { return (int)(blockIdx.x / (gridDim.x / a.n_splits)); }

// The chunk a tile starts in, read from global memory once per chunk (not per tile): its keys
// [start, end) and this (batch, kv head)'s K and V rows in it.
struct TileChunk {
  int c;
  long long start, end;
  const char* k;
  const char* v;
};

__device__ __forceinline__ TileChunk tile_chunk_at(const DecodeArgs& a, int c, int b, int kvh, int elem_bytes) {
  TileChunk t;
  t.c = c;
  t.start = a.chunk_start[c];
  t.end = a.chunk_start[c + 1];
  const long long off = ((long long)b * a.kv_heads + kvh) * (t.end - t.start) * a.dim * elem_bytes;
  t.k = static_cast<const char*>(a.k_chunks[c]) + off;
  t.v = static_cast<const char*>(a.v_chunks[c]) + off;
  return t;
}

// Issues the cp.async copies of tile [j0, j0 + kTile) of K and V into stage `st`; keys at or past
// `end` are zero-filled (their scores are masked, and zero V keeps 0 * garbage out of the sums).
// A tile inside one chunk (the common case) is one strided run of 16-byte copies from the chunk's
// rows; a tile that crosses chunk boundaries looks each key's chunk up, walking forward from tc.
template <typename T>
__device__ __forceinline__ void load_tile(const DecodeArgs& a, const Smem<T>& sm, int st, long long j0, long long end,
                                          const TileChunk& tc, int b, int kvh) {
  const int per_row = a.dim * (int)sizeof(T) / 16;  // 16-byte pieces per key row
  const long long row_bytes = (long long)a.dim * sizeof(T);
  // Piece e = threadIdx.x + blockDim.x * it is (key jj, piece pc) of the tile; stepped without
  // division. (kThreads for the CUDA-core kernels; the tensor-core ones run two warps per m16 block.)
  int jj = threadIdx.x / per_row, pc = threadIdx.x % per_row;
  const int step_j = (int)blockDim.x / per_row, step_p = (int)blockDim.x % per_row;
  T* kd = sm.ks + ((long long)st * kTile + jj) * sm.stride + pc * (16 / (int)sizeof(T));
  T* vd = sm.vs + ((long long)st * kTile + jj) * sm.stride + pc * (16 / (int)sizeof(T));
  const bool one_chunk = j0 + kTile <= tc.end && j0 + kTile <= end;
  if (one_chunk && step_p == 0) {
    // One chunk, whole rows per step: no per-copy bookkeeping.
    const char* ks = tc.k + (j0 - tc.start + jj) * row_bytes + pc * 16;
    const char* vs = tc.v + (j0 - tc.start + jj) * row_bytes + pc * 16;
    const int d_smem = step_j * sm.stride;
    const long long d_glob = step_j * row_bytes;
    for (; jj < kTile; jj += step_j) {
      cp_async16(kd, ks, 16);
      cp_async16(vd, vs, 16);
      kd += d_smem; vd += d_smem; ks += d_glob; vs += d_glob;
    }
    return;
  }
  const long long head_base = (long long)b * a.kv_heads + kvh;
  const char* kb = tc.k + (j0 - tc.start) * row_bytes;
  const char* vb = tc.v + (j0 - tc.start) * row_bytes;
  for (; jj < kTile; jj += step_j) {
    kd = sm.ks + ((long long)st * kTile + jj) * sm.stride + pc * (16 / (int)sizeof(T));
    vd = sm.vs + ((long long)st * kTile + jj) * sm.stride + pc * (16 / (int)sizeof(T));
    const long long j = j0 + jj;
    if (one_chunk) {
      cp_async16(kd, kb + jj * row_bytes + pc * 16, 16);
      cp_async16(vd, vb + jj * row_bytes + pc * 16, 16);
    } else if (j < end) {
      const int c = chunk_of(a.chunk_start, tc.c, j);
      const long long start = a.chunk_start[c], len = a.chunk_start[c + 1] - start;
      const long long off = (head_base * len + (j - start)) * row_bytes + pc * 16;
      cp_async16(kd, static_cast<const char*>(a.k_chunks[c]) + off, 16);
      cp_async16(vd, static_cast<const char*>(a.v_chunks[c]) + off, 16);
    } else {
      cp_async16(kd, a.k_chunks[tc.c], 0);
      cp_async16(vd, a.v_chunks[tc.c], 0);
    }
    pc += step_p;
    if (pc >= per_row) { pc -= per_row; jj++; }
  }
}

// The rows of this CTA (all of its row block, or in the recompute pass only the flagged ones, in
// order) into sm.row / sm.qp, the least and greatest of their positions, and the keys [lo, hi) of
// its split. Returns the row count (0: nothing to do); every thread gets the same answers.
template <typename T>
__device__ __forceinline__ int cta_rows(const DecodeArgs& a, const Smem<T>& sm, int b, int kvh, int split,
                                        long long& lo, long long& hi, long long& qp_min, long long& qp_max) {
  const int group = a.heads / a.kv_heads;
  const int r0 = (int)(blockIdx.x % (gridDim.x / a.n_splits)) * a.rows_per_cta;
  const int block_rows = min(a.rows_per_cta, group * a.tq - r0);
  __shared__ int n_rows_s;
  __shared__ long long qp_min_s, qp_max_s;

  // Rows of this CTA: all of its row block, or (recompute pass) only the flagged ones, in order.
  if (threadIdx.x == 0) {
    int n = 0;
    long long qlo = LLONG_MAX, qhi = LLONG_MIN;
    for (int r = 0; r < block_rows; r++) {
      const int gr = r0 + r, g = gr / a.tq, t = gr % a.tq;
      const long long state = ((long long)b * a.tq + t) * a.heads + kvh * group + g;
      if (a.redo != nullptr && !a.redo[state * a.n_splits + split]) continue;
      sm.row[n] = gr;
      sm.qp[n] = a.q_pos[t];
      qlo = min(qlo, a.q_pos[t]);
      qhi = max(qhi, a.q_pos[t]);
      n++;
    }
    n_rows_s = n;
    qp_min_s = qlo;
    qp_max_s = qhi;
  }
  __syncthreads();
  const int n_rows = n_rows_s;
  if (n_rows == 0) return 0;  // recompute pass: nothing flagged here
  qp_min = qp_min_s;
  qp_max = qp_max_s;

  // Keys of the split; with positions 0..Tk-1 (k_pos null) narrowed to those some row can see.
  const long long s0 = (long long)split * a.split_len;
  const long long s1 = min(s0 + a.split_len, a.tk);
  lo = s0;
  hi = s1;
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

  return n_rows;
}

// The tile loop both kernel families share: tiles of kTile keys from lo (on the split's grid) up to
// hi, kStages buffers deep: while `body(stage, j0)` computes one tile, the next kStages - 1 tiles'
// K and V are in flight. One barrier per tile: after it this tile has landed for every thread, and
// every thread is done with the previous tile, whose buffer the load issued next reuses. On return
// a warp may still be in its last body: the caller syncs before reusing the stages.
template <typename T, typename Body>
__device__ __forceinline__ void for_each_tile(const DecodeArgs& a, const Smem<T>& sm, long long lo, long long hi,
                                              int b, int kvh, Body&& body) {
  const long long n_tiles = lo < hi ? (hi - lo + kTile - 1) / kTile : 0;
  TileChunk chunk = tile_chunk_at(a, n_tiles > 0 ? find_chunk(a.chunk_start, a.n_chunks, lo) : 0, b, kvh, sizeof(T));
  long long issued = 0;  // tiles issued so far, in key order; one commit group per tile (or empty)
  auto issue_next = [&]() {
    if (issued < n_tiles) {
      const long long j = lo + issued * kTile;
      if (j >= chunk.end) chunk = tile_chunk_at(a, chunk_of(a.chunk_start, chunk.c, j), b, kvh, sizeof(T));
      load_tile<T>(a, sm, (int)(issued % kStages), j, hi, chunk, b, kvh);
      issued++;
    }
    cp_async_commit();
  };
  for (int s = 0; s < kStages - 1; s++) issue_next();

  for (long long tile = 0; tile < n_tiles; tile++) {
    // Groups committed: kStages - 1 + tile; this tile's is the oldest one open.
    static_assert(kStages == 2, "wait for all but kStages - 2 groups");
    cp_async_wait_0();
    __syncthreads();
    issue_next();  // into the buffer of tile - 1, which every thread has finished
    body((int)(tile % kStages), lo + tile * kTile);
  }
  cp_async_wait_0();
}

template <typename T, int DMAX, int RPW, bool UNIFIED>
__device__ void decode_partial(const DecodeArgs& a) {
  constexpr int kQuads = DMAX / 128;  // dim quads per lane: dims 4 * lane + 128 * x + 0..3
  LONGCTX_DYNAMIC_SHARED(float4, smem_raw);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int split = split_of(a), kvh = blockIdx.y, b = blockIdx.z;
  const int group = a.heads / a.kv_heads;
  Smem<T> sm(smem_raw, a.dim, a.rows_per_cta, false);
  long long lo, hi, qp_min, qp_max;
  const int n_rows = cta_rows(a, sm, b, kvh, split, lo, hi, qp_min, qp_max);
  if (n_rows == 0) return;  // recompute pass: nothing flagged here

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

  for_each_tile(a, sm, lo, hi, b, kvh, [&](int st, long long j0) {
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
        if (a.softcap > 0.f) x = soft_capped(a.softcap, x);
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
  });

  // Partial states out (float32).
  #pragma unroll
  for (int i = 0; i < RPW; i++) {
    if (i < my_rows) {
      const int r = warp + kWarps * i;
      const int gr = sm.row[r], g = gr / a.tq, t = gr % a.tq;
      const long long state = ((long long)b * a.tq + t) * a.heads + kvh * group + g;
      const long long at = state * a.n_splits + split;
      const float lsum = warp_sum(l[i]);
      const float inv = lsum > 0.f ? 1.f / lsum : 0.f;
      bool flagged = false;
      if (UNIFIED) {
        // Also a sum or output that overflowed (weights near e^88 under an upper bound near 88): the
        // recompute's running max keeps them finite, as on the CPU. Past dim, acc is 0.
        bool overflow = !(fabsf(lsum) <= 3.40282347e38f);  // inf or NaN (no isfinite in the host emulation)
        #pragma unroll
        for (int x = 0; x < 4 * kQuads; x++) overflow |= !(fabsf(acc[i][x] * inv) <= 3.40282347e38f);
        flagged = __any_sync(0xffffffffu, ((bad >> i) & 1u) || overflow);
        if (lane == 0) {
          a.flags[at] = flagged ? 1 : 0;
          if (flagged) atomicAdd(a.recomputed, 1ull);
        }
      }
      if (flagged) continue;  // the recompute pass writes this one
      #pragma unroll
      for (int x = 0; x < kQuads; x++) {
        const int d = 4 * lane + 128 * x;
        if (d < a.dim) {
          *reinterpret_cast<float4*>(a.part_o + at * a.dim + d) =
              make_float4(acc[i][4 * x] * inv, acc[i][4 * x + 1] * inv, acc[i][4 * x + 2] * inv, acc[i][4 * x + 3] * inv);
        }
      }
      // A NaN sum (a NaN score) stays NaN, never the empty state's -inf.
      if (lane == 0) a.part_lse[at] = lsum > 0.f ? (double)m[i] + log((double)lsum) : lsum == 0.f ? -CUDART_INF : CUDART_NAN;
    }
  }
}


// ---- Tensor-core partials: fp16/bf16, D a multiple of 16 up to 128, up to 32 rows per CTA ------
//
// Same grid, rows, split grid, tiles, loads, partial layout, flags and recompute pass as above;
// only the arithmetic per tile moves to mma.sync m16n8k16. Each m16 block of CTA rows (rows past
// the CTA's count are zero q rows, never written) has two warps (CudaDecode.Plan.threads: 64 or 128
// threads): warps w and w + blocks own rows 16w .. 16w + 15, the first over keys 0..15 of every
// tile, the second over keys 16..31, each with its own running state (m, l, O) for those keys; at
// the end the second's is merged into the first's through shared memory. The first GPU run (H200)
// found these kernels latency-bound with one warp per block (a single m16 block, 5 warps per SM);
// the key split doubles the warps, and a row's bits still depend only on the split grid, never on
// how many rows its CTA has. Thread (g = lane / 4, t4 = lane % 4) holds rows g and g + 8 of its block.
//   S (16 x 16) = Q K^T   Q fragments from qt once (ldmatrix.x4), K as the col-major B operand
//                         (ldmatrix.x4: two n8 key blocks per k16 step); products of fp16/bf16
//                         values are exact, sums float32; the scale multiplies the finished S.
//   softmax               on the accumulators: a row's 16 keys sit in the 4 threads of a quad
//                         (2 keys x 2 n8 blocks each): row max and flags by 2 quad shuffles.
//   O (16 x D) += P V     P reused from S's accumulators as A fragments; V via ldmatrix.x4.trans.
// P must be 2-byte for mma. To keep DESIGN's float32 rule (rather than FlashAttention's rounded-P
// contract), P is carried as a sum of 2-byte terms, each through its own mma: p = hi + lo for fp16
// (11 + 11 significant bits), hi + mid + lo for bf16 (8 + 8 + 8), i.e. p to float32's 24 bits. P is
// first scaled by 2^(kPShift - e) with p <= 2^e (sync: e = 0, since p = e^(s - m) <= 1; unified:
// e tracks the largest p of the row so far, as p = e^(s - phi) spans e^+-40), so the largest term is
// at most 2^14 (fp16's range ends at 65504) and the low terms stay normal down to p ~ 2^(e - 12)
// (below that their absolute error, 2^-25 x 2^(e - 14), is far below float32's on the row sum).
// Rescaling acc when e grows multiplies by a power of two: exact. o = acc x 2^(e - kPShift) / l.
constexpr int kPShift = 14;
constexpr int kTcDim = 128;  // largest head dim of the tensor-core kernels (O: 64 registers)
constexpr int kTcKeySplit = 2;  // warps per m16 block, each over its share of a tile's keys

template <typename T>
struct PTerms {
  static constexpr int n = 3;  // bf16: 8 significant bits per term
};
template <>
struct PTerms<__half> {
  static constexpr int n = 2;  // fp16: 11
};

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

template <typename T, bool UNIFIED>
__device__ void decode_partial_tc(const DecodeArgs& a) {
  constexpr int kKeys = kTile / kTcKeySplit;  // keys of a tile a warp takes
  LONGCTX_DYNAMIC_SHARED(float4, smem_raw);
  const int lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
  const int blocks16 = (a.rows_per_cta + 15) / 16;
  const int warp = (threadIdx.x / 32) % blocks16;           // this warp's m16 block
  const int kbase = (threadIdx.x / 32) / blocks16 * kKeys;  // the first key of a tile it takes
  const int split = split_of(a), kvh = blockIdx.y, b = blockIdx.z;
  const int group = a.heads / a.kv_heads;
  Smem<T> sm(smem_raw, a.dim, a.rows_per_cta, true);
  long long lo, hi, qp_min, qp_max;
  const int n_rows = cta_rows(a, sm, b, kvh, split, lo, hi, qp_min, qp_max);
  if (n_rows == 0) return;  // recompute pass: nothing flagged here

  // q rows as their element bits (exact), zero rows up to the last m16 block's end.
  const unsigned short* q = static_cast<const unsigned short*>(a.q);
  unsigned short* qt = reinterpret_cast<unsigned short*>(sm.qt);
  const int rows16 = (n_rows + 15) / 16 * 16;
  for (int e = threadIdx.x; e < rows16 * a.dim; e += blockDim.x) {
    const int r = e / a.dim, d = e % a.dim;
    unsigned short x = 0;
    if (r < n_rows) {
      const int gr = sm.row[r], gq = gr / a.tq, t = gr % a.tq;
      x = q[(((long long)b * a.heads + kvh * group + gq) * a.tq + t) * a.dim + d];
    }
    qt[r * sm.stride + d] = x;
  }
  __syncthreads();  // qt and the row list are visible

  const bool active = 16 * warp < n_rows;  // warp-uniform
  const int kc_n = a.dim / 16;             // k16 steps of q.k, n16 steps of P V
  uint32_t qf[kTcDim / 16][4];
  #pragma unroll
  for (int kc = 0; kc < kTcDim / 16; kc++) {
    if (active && kc < kc_n) {
      ldmatrix_x4(qf[kc], &sm.qt[(16 * warp + (lane / 8) % 2 * 8 + lane % 8) * sm.stride + kc * 16 + lane / 16 * 8]);
    }
  }
  __syncthreads();  // qt read (qt is V's stage 1, which the loop's second load reuses after its own barrier)
  const int row_a = 16 * warp + g;  // this thread's rows: row_a and row_a + 8
  const long long my_qp[2] = {row_a < n_rows ? sm.qp[row_a] : 0, row_a + 8 < n_rows ? sm.qp[row_a + 8] : 0};

  float acc[kTcDim / 8][4];  // element i: row g + 8 (i / 2), dim 8 nd + 2 t4 + i % 2
  #pragma unroll
  for (int nd = 0; nd < kTcDim / 8; nd++) acc[nd][0] = acc[nd][1] = acc[nd][2] = acc[nd][3] = 0.f;
  float m[2], l[2] = {0.f, 0.f};
  int e[2] = {UNIFIED ? -100 : 0, UNIFIED ? -100 : 0};  // p <= 2^e; unified: p below 2^-100 is noise
  unsigned bad = 0;  // unified: bit r set when row r saw a logit outside the bounds
  m[0] = m[1] = UNIFIED ? a.phi : -CUDART_INF_F;

  for_each_tile(a, sm, lo, hi, b, kvh, [&](int st, long long j0) {
    if (!active) return;
    const T* ks = sm.ks + (long long)st * kTile * sm.stride;
    const T* vs = sm.vs + (long long)st * kTile * sm.stride;

    // S = Q K^T: s[nb] holds keys kbase + 8 nb .. + 7; element i is row g + 8 (i / 2), key
    // kbase + 8 nb + 2 t4 + i % 2.
    // Even and odd k16 steps in separate accumulators, added at the end: four chains of dependent
    // mma of four each instead of two of eight (a warp has no other independent mma to issue here).
    float s[kKeys / 8][4], s_odd[kKeys / 8][4];
    #pragma unroll
    for (int nb = 0; nb < kKeys / 8; nb++) {
      s[nb][0] = s[nb][1] = s[nb][2] = s[nb][3] = 0.f;
      s_odd[nb][0] = s_odd[nb][1] = s_odd[nb][2] = s_odd[nb][3] = 0.f;
    }
    #pragma unroll
    for (int kc = 0; kc < kTcDim / 16; kc++) {
      if (kc < kc_n) {
        #pragma unroll
        for (int nb = 0; nb < kKeys / 16; nb++) {
          uint32_t kf[4];
          ldmatrix_x4(kf, &ks[(kbase + nb * 16 + lane / 16 * 8 + lane % 8) * sm.stride + kc * 16 + (lane / 8) % 2 * 8]);
          float (&acc_s)[kKeys / 8][4] = kc % 2 == 0 ? s : s_odd;
          mma<T>(acc_s[2 * nb], qf[kc], kf[0], kf[1]);
          mma<T>(acc_s[2 * nb + 1], qf[kc], kf[2], kf[3]);
        }
      }
    }
    #pragma unroll
    for (int nb = 0; nb < kKeys / 8; nb++) {
      #pragma unroll
      for (int i = 0; i < 4; i++) s[nb][i] += s_odd[nb][i];
    }

    // Logits; masked keys and keys past hi become -inf. A tile every row of the CTA sees whole (the
    // common case: decode at the end of its sequence) skips the per-key test; the rows past the
    // CTA's count then see keys too, harmlessly (zero q, never written).
    const bool whole = a.k_pos == nullptr && j0 + kTile <= hi &&
                       all_visible(qp_min, qp_max, j0, j0 + kTile - 1, a.causal, a.window);
    #pragma unroll
    for (int nb = 0; nb < kKeys / 8; nb++) {
      #pragma unroll
      for (int c = 0; c < 2; c++) {
        const long long j = j0 + kbase + 8 * nb + 2 * t4 + c;
        const long long kp = whole ? 0 : j < hi ? (a.k_pos != nullptr ? a.k_pos[j] : j) : 0;
        #pragma unroll
        for (int r = 0; r < 2; r++) {
          float x = s[nb][2 * r + c] * a.qscale;
          if (a.softcap > 0.f) x = soft_capped(a.softcap, x);
          if (!whole && (j >= hi || !visible(my_qp[r], kp, a.causal, a.window))) x = -CUDART_INF_F;
          s[nb][2 * r + c] = x;
        }
      }
    }

    // Softmax step per row; then s holds P scaled by 2^(kPShift - e).
    #pragma unroll
    for (int r = 0; r < 2; r++) {
      float sum = 0.f;
      if (UNIFIED) {
        float pmax = 0.f;
        #pragma unroll
        for (int nb = 0; nb < kKeys / 8; nb++) {
          #pragma unroll
          for (int c = 0; c < 2; c++) {
            const float x = s[nb][2 * r + c];
            const bool vis = x != -CUDART_INF_F;
            if (vis && !(x - a.phi > a.lower && x - a.phi < a.upper)) bad |= 1u << r;
            // e^(x - phi) as one FADD, FMUL and MUFU (expf is about ten instructions); a visible p is
            // above e^lower, far from float's subnormals, and a masked x = -inf gives 0.
            const float p = exp2_ftz((x - a.phi) * kLog2e);
            s[nb][2 * r + c] = p;
            sum += p;
            pmax = fmaxf(pmax, p);
          }
        }
        l[r] += sum;
        pmax = quad_max(pmax);
        // p past 2^100 (bounds wider than e^+-69) would overflow fp16 after the scale: recompute the
        // row with the sync kernel, as for a logit out of bounds (the CUDA-core kernel's limit is
        // float32's exp, e^88).
        if (pmax >= 0x1p100f) bad |= 1u << r;
        int ex = 0;
        frexpf(pmax, &ex);  // pmax < 2^ex (an overflowed inf, a flagged row, gives junk: clamped)
        // A tile the row cannot see (pmax 0) leaves e alone: jumping to 2^0 would push the scaled
        // p of a row far below phi into fp16's subnormals.
        const int e_new = pmax > 0.f ? max(e[r], min(ex, 100)) : e[r];
        if (e_new != e[r]) {  // rows are quad-uniform, as e is
          const float f = ldexpf(1.f, e[r] - e_new);
          #pragma unroll
          for (int nd = 0; nd < kTcDim / 8; nd++) {
            acc[nd][2 * r] *= f;
            acc[nd][2 * r + 1] *= f;
          }
          e[r] = e_new;
        }
      } else {
        float mx = -CUDART_INF_F;
        #pragma unroll
        for (int nb = 0; nb < kKeys / 8; nb++) mx = fmaxf(mx, fmaxf(s[nb][2 * r], s[nb][2 * r + 1]));
        const float m_new = fmaxf(m[r], quad_max(mx));
        // e^(x - m) as 2^((x - m) log2 e): one FADD, FMUL and MUFU and no branch, where expf is
        // about ten instructions behind a test for -inf. A masked x = -inf gives 0; with no key
        // seen yet (m = -inf) 0 is subtracted instead, never -inf - -inf.
        const float m_use = m_new == -CUDART_INF_F ? 0.f : m_new;
        #pragma unroll
        for (int nb = 0; nb < kKeys / 8; nb++) {
          #pragma unroll
          for (int c = 0; c < 2; c++) {
            const float p = exp2_ftz((s[nb][2 * r + c] - m_use) * kLog2e);
            s[nb][2 * r + c] = p;
            sum += p;
          }
        }
        const float alpha = m[r] == m_new ? 1.f : exp2_ftz((m[r] - m_use) * kLog2e);  // m = -inf first: 0
        l[r] = fmaf(l[r], alpha, sum);
        if (alpha != 1.f) {  // quad-uniform
          #pragma unroll
          for (int nd = 0; nd < kTcDim / 8; nd++) {
            acc[nd][2 * r] *= alpha;
            acc[nd][2 * r + 1] *= alpha;
          }
        }
        m[r] = m_new;
      }
      const float scale = ldexpf(1.f, kPShift - e[r]);
      #pragma unroll
      for (int nb = 0; nb < kKeys / 8; nb++) {
        s[nb][2 * r] *= scale;
        s[nb][2 * r + 1] *= scale;
      }
    }

    // O += P V, 16 keys per step, P as PTerms<T>::n 2-byte terms (each the rounded remainder of the
    // ones before), each one mma on the same V fragments. The terms of a step go into a fresh
    // accumulator, smallest first, which is then added to O by an ordinary (IEEE, round-to-nearest)
    // float add: the tensor cores' own sums align to the largest term and truncate, and fed the
    // running O directly they cost 6-9x naive float32's error over a 4,096-key split (first GPU run,
    // 2026-11-26); on a 16-key partial their loss stays far below O's float rounding.
    #pragma unroll
    for (int kk = 0; kk < kKeys / 16; kk++) {
      float rest[8] = {s[2 * kk][0], s[2 * kk][1], s[2 * kk][2], s[2 * kk][3],
                       s[2 * kk + 1][0], s[2 * kk + 1][1], s[2 * kk + 1][2], s[2 * kk + 1][3]};
      uint32_t pa[PTerms<T>::n][4];
      #pragma unroll
      for (int term = 0; term < PTerms<T>::n; term++) {
        #pragma unroll
        for (int i = 0; i < 4; i++) {
          pa[term][i] = pack<T>(rest[2 * i], rest[2 * i + 1]);
          const float2 got = unpack<T>(pa[term][i]);
          rest[2 * i] -= got.x;  // exact: got is rest rounded to nearest
          rest[2 * i + 1] -= got.y;
        }
      }
      #pragma unroll
      for (int nd = 0; nd < kTcDim / 16; nd++) {
        if (nd < kc_n) {
          uint32_t vf[4];
          ldmatrix_x4_trans(vf, &vs[(kbase + kk * 16 + (lane / 8) % 2 * 8 + lane % 8) * sm.stride + nd * 16 + lane / 16 * 8]);
          float part[2][4] = {};
          #pragma unroll
          for (int term = PTerms<T>::n - 1; term >= 0; term--) {
            mma<T>(part[0], pa[term], vf[0], vf[1]);
            mma<T>(part[1], pa[term], vf[2], vf[3]);
          }
          #pragma unroll
          for (int i = 0; i < 4; i++) {
            acc[2 * nd][i] += part[0][i];
            acc[2 * nd + 1][i] += part[1][i];
          }
        }
      }
    }
  });

  {
    // The second warp's state (same lanes, same rows and dims) into the first's, through the K/V
    // stages (free after the barrier: no copy is in flight, every warp is past its last tile): b m16
    // blocks write b (64 D + 896) bytes of the 256 (D + 8) there, which holds for b <= 2 (32 rows,
    // CudaDecode.TC_MAX_ROWS).
    __syncthreads();
    int* xi = reinterpret_cast<int*>(sm.ks) + warp * (7 + a.dim / 2) * 32;  // [7][32]: m (2), l (2), e (2), bad
    float* xs = reinterpret_cast<float*>(xi + 7 * 32);                     // [D / 2][32]: acc
    if (kbase != 0 && active) {
      #pragma unroll
      for (int nd = 0; nd < kTcDim / 8; nd++) {
        #pragma unroll
        for (int i = 0; i < 4; i++) {
          if (nd < 2 * kc_n) xs[(4 * nd + i) * 32 + lane] = acc[nd][i];
        }
      }
      #pragma unroll
      for (int r = 0; r < 2; r++) {
        xi[r * 32 + lane] = __float_as_int(m[r]);
        xi[(2 + r) * 32 + lane] = __float_as_int(l[r]);
        xi[(4 + r) * 32 + lane] = e[r];
      }
      xi[6 * 32 + lane] = (int)bad;
    }
    __syncthreads();
    if (kbase != 0 || !active) return;
    bad |= (unsigned)xi[6 * 32 + lane];
    #pragma unroll
    for (int r = 0; r < 2; r++) {
      // sync: weights e^(m_w - M) (e = 0); unified: m = phi, weights 2^(e_w - E). Quad-uniform.
      const float m1 = __int_as_float(xi[r * 32 + lane]), l1 = __int_as_float(xi[(2 + r) * 32 + lane]);
      const int e1 = xi[(4 + r) * 32 + lane];
      float w0 = 1.f, w1 = 1.f;
      if (UNIFIED) {
        const int e_new = max(e[r], e1);
        w0 = ldexpf(1.f, e[r] - e_new);
        w1 = ldexpf(1.f, e1 - e_new);
        e[r] = e_new;
        l[r] += l1;
      } else {
        const float m_new = fmaxf(m[r], m1);
        if (m_new == -CUDART_INF_F) continue;  // neither warp saw a key: acc and l are 0
        w0 = m[r] == m_new ? 1.f : expf(m[r] - m_new);
        w1 = m1 == m_new ? 1.f : expf(m1 - m_new);
        m[r] = m_new;
        l[r] = fmaf(l1, w1, l[r] * w0);
      }
      #pragma unroll
      for (int nd = 0; nd < kTcDim / 8; nd++) {
        #pragma unroll
        for (int c = 0; c < 2; c++) {
          if (nd < 2 * kc_n) acc[nd][2 * r + c] = fmaf(xs[(4 * nd + 2 * r + c) * 32 + lane], w1, acc[nd][2 * r + c] * w0);
        }
      }
    }
  }
  if (!active) return;
  // Partial states out: a row's l and flag are summed / or-ed over its quad.
  #pragma unroll
  for (int r = 0; r < 2; r++) {
    float lsum = l[r];
    lsum += __shfl_xor_sync(0xffffffffu, lsum, 1);
    lsum += __shfl_xor_sync(0xffffffffu, lsum, 2);
    bool flagged = false;
    if (UNIFIED) flagged = quad_max((bad >> r) & 1u ? 1.f : 0.f) > 0.f;
    const int cr = row_a + 8 * r;
    if (cr >= n_rows) continue;
    const int gr = sm.row[cr], gq = gr / a.tq, t = gr % a.tq;
    const long long state = ((long long)b * a.tq + t) * a.heads + kvh * group + gq;
    const long long at = state * a.n_splits + split;
    if (UNIFIED && t4 == 0) {
      a.flags[at] = flagged ? 1 : 0;
      if (flagged) atomicAdd(a.recomputed, 1ull);
    }
    if (flagged) continue;  // the recompute pass writes this one
    const float inv = lsum > 0.f ? ldexpf(1.f / lsum, e[r] - kPShift) : 0.f;  // exact power-of-two factor
    #pragma unroll
    for (int nd = 0; nd < kTcDim / 8; nd++) {
      if (nd < 2 * kc_n) {
        *reinterpret_cast<float2*>(a.part_o + at * a.dim + 8 * nd + 2 * t4) =
            make_float2(acc[nd][2 * r] * inv, acc[nd][2 * r + 1] * inv);
      }
    }
    if (t4 == 0) a.part_lse[at] = lsum > 0.f ? (double)m[r] + log((double)lsum) : lsum == 0.f ? -CUDART_INF : CUDART_NAN;
  }
}

}  // namespace

// Partial kernels: grid (n_splits * row_blocks, Hkv, B), block 128 (tensor cores: CudaDecode.Plan.threads),
// dynamic shared memory as in Smem. `redo` (sync kernels only) restricts the rows to the flagged
// (row, split) pairs. ATTRS: launch bounds or a register cap.
#define LONGCTX_DECODE(NAME, T, ...) LONGCTX_DECODE_WITH(NAME, T, __launch_bounds__(kThreads, 2), __VA_ARGS__)
#define LONGCTX_DECODE_WITH(NAME, T, ATTRS, ...)                                                      \
  extern "C" __global__ void ATTRS NAME(                                                              \
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
    __VA_ARGS__(a);                                                                                   \
  }

#define LONGCTX_DECODE_TYPE(T, SUFFIX)                                                                \
  LONGCTX_DECODE(longctx_decode_sync_##SUFFIX##_d128_r2, T, decode_partial<T, 128, 2, false>)          \
  LONGCTX_DECODE(longctx_decode_unified_##SUFFIX##_d128_r2, T, decode_partial<T, 128, 2, true>)        \
  LONGCTX_DECODE(longctx_decode_sync_##SUFFIX##_d128_r16, T, decode_partial<T, 128, 16, false>)        \
  LONGCTX_DECODE(longctx_decode_unified_##SUFFIX##_d128_r16, T, decode_partial<T, 128, 16, true>)      \
  LONGCTX_DECODE(longctx_decode_sync_##SUFFIX##_d256_r2, T, decode_partial<T, 256, 2, false>)          \
  LONGCTX_DECODE(longctx_decode_unified_##SUFFIX##_d256_r2, T, decode_partial<T, 256, 2, true>)        \
  LONGCTX_DECODE(longctx_decode_sync_##SUFFIX##_d256_r8, T, decode_partial<T, 256, 8, false>)          \
  LONGCTX_DECODE(longctx_decode_unified_##SUFFIX##_d256_r8, T, decode_partial<T, 256, 8, true>)

LONGCTX_DECODE_TYPE(float, f32)
LONGCTX_DECODE_TYPE(__half, f16)
LONGCTX_DECODE_TYPE(__nv_bfloat16, bf16)

// Tensor-core partials (fp16/bf16, D a multiple of 16 up to 128), same parameters; 64 or 128 threads.
// At most 168 registers lets 6 CTAs of 64 threads share an SM's 64k registers, as many as its shared
// memory holds (ptxas, nvcc 13.0, sm_90a: all 168 used, 12 bytes spilled; run 7 of the second GPU
// session measured this build).
#define LONGCTX_DECODE_TC(T, SUFFIX)                                                                  \
  LONGCTX_DECODE_WITH(longctx_decode_tc_sync_##SUFFIX##_d128, T, __maxnreg__(168), decode_partial_tc<T, false>) \
  LONGCTX_DECODE_WITH(longctx_decode_tc_unified_##SUFFIX##_d128, T, __maxnreg__(168), decode_partial_tc<T, true>)

LONGCTX_DECODE_TC(__half, f16)
LONGCTX_DECODE_TC(__nv_bfloat16, bf16)

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
  bool nan = false;
  for (int s = lane; s < n_splits; s += 32) {
    nan |= pl[s] != pl[s];
    mx = fmax(mx, pl[s]);
  }
  for (int off = 16; off > 0; off >>= 1) mx = fmax(mx, __shfl_xor_sync(0xffffffffu, mx, off));
  // A split with a NaN score (NaN in device inputs, or an overflowed q.k under a softcap): the row is
  // NaN, for the caller to report. fmax skips NaN, so alone it would make the row empty or drop the split.
  if (__any_sync(0xffffffffu, nan)) {
    for (int d = lane; d < dim; d += 32) o[state * dim + d] = CUDART_NAN_F;
    if (lane == 0) lse[state] = CUDART_NAN_F;
    return;
  }
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
