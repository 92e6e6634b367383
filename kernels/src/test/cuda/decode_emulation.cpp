// Host emulation of flash_decode.cu for tests on machines without a GPU (CudaDecodeEmulationTest).
//
// The kernel source is compiled unchanged by g++ as C++20, with this file supplying what the GPU
// would: every CTA runs as 128 std::threads (one per CUDA thread), __syncthreads is a barrier of
// the 128, warp shuffles / __any_sync / __syncwarp exchange through per-warp slots between barriers
// of the 32 lanes, __shared__ variables are statics (CTAs run one after another), dynamic shared
// memory is one buffer poisoned with NaN bytes before each CTA, and cp.async is emulated with its
// asynchrony: a copy is only queued in the issuing thread's open group and lands when that thread
// waits for the group (cp.async.wait_group), so a read before the wait sees the poison.
//
// What this checks: the kernel's index math, chunk walking, masks, split narrowing, softmax and
// unified-max flags, the recompute pass and the combine, on the host's float arithmetic (expf etc.
// of glibc, not the GPU's). What it cannot: anything about the GPU itself (the PTX, real
// asynchrony and memory ordering, bank conflicts, speed).
//
// Usage: decode_emulation IN OUT. IN (little endian): int32 type (0 f32, 1 f16, 2 bf16), unified,
// heads, kv_heads, tq, dim, batch, n_chunks, split_len, n_splits, rows_per_cta, row_blocks, dmax,
// rpw, causal, has_kpos; int64 tk, window; float32 qscale, softcap, phi, lower, upper; int64
// chunk_start[n_chunks + 1]; q; per chunk k then v (element bits); int64 q_pos[tq];
// int64 k_pos[tk] if has_kpos. OUT: float32 o[states * dim], lse[states]; int64 recomputed.

#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <vector_types.h>
#include <vector_functions.h>

using std::max;
using std::min;

namespace emu {
thread_local dim3 thread_idx, block_idx;
std::barrier<>* cta_barrier;
std::barrier<>* warp_barrier[4];
float fslot[4][32];
unsigned uslot[4][32];
alignas(16) unsigned char smem[256 * 1024];
std::mutex atomic_mutex;

struct Copy {
  void* dst;
  const void* src;
  int bytes;
};
thread_local std::vector<std::vector<Copy>> groups;  // committed, oldest first
thread_local std::vector<Copy> open_group;

inline int lane() { return thread_idx.x % 32; }
inline int warp() { return thread_idx.x / 32; }
}  // namespace emu

#undef __global__
#undef __device__
#undef __forceinline__
#undef __shared__
#undef __launch_bounds__
#define threadIdx emu::thread_idx
#define blockIdx emu::block_idx
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(...)
#define LONGCTX_HOST_EMULATION 1
#define LONGCTX_DYNAMIC_SHARED(T, name) T* name = reinterpret_cast<T*>(emu::smem)

inline float __int_as_float(int i) {  // used by CUDART_INF_F in math_constants.h
  float f;
  std::memcpy(&f, &i, sizeof f);
  return f;
}

inline void __syncthreads() { emu::cta_barrier->arrive_and_wait(); }
inline void __syncwarp() { emu::warp_barrier[emu::warp()]->arrive_and_wait(); }

inline float __shfl_xor_sync(unsigned, float x, int off) {
  int w = emu::warp(), l = emu::lane();
  emu::fslot[w][l] = x;
  emu::warp_barrier[w]->arrive_and_wait();
  float y = emu::fslot[w][l ^ off];
  emu::warp_barrier[w]->arrive_and_wait();
  return y;
}

inline int __any_sync(unsigned, int pred) {
  int w = emu::warp(), l = emu::lane();
  emu::uslot[w][l] = pred ? 1u : 0u;
  emu::warp_barrier[w]->arrive_and_wait();
  int any = 0;
  for (int i = 0; i < 32; i++) any |= emu::uslot[w][i];
  emu::warp_barrier[w]->arrive_and_wait();
  return any;
}

inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
  std::lock_guard<std::mutex> g(emu::atomic_mutex);
  unsigned long long old = *p;
  *p = old + v;
  return old;
}

inline void cp_async16(void* dst, const void* src, int src_bytes) { emu::open_group.push_back({dst, src, src_bytes}); }
inline void cp_async_commit() {
  emu::groups.push_back(std::move(emu::open_group));
  emu::open_group.clear();
}
inline void cp_async_wait_n(size_t keep) {
  while (emu::groups.size() > keep) {
    for (const emu::Copy& c : emu::groups.front()) {
      std::memset(c.dst, 0, 16);
      std::memcpy(c.dst, c.src, c.bytes);
    }
    emu::groups.erase(emu::groups.begin());
  }
}
inline void cp_async_wait_1() { cp_async_wait_n(1); }
inline void cp_async_wait_0() { cp_async_wait_n(0); }

#include "flash_decode.cu"

namespace {

struct In {
  std::vector<unsigned char> bytes;
  size_t at = 0;
  template <typename V>
  V get() {
    V v;
    std::memcpy(&v, bytes.data() + at, sizeof(V));
    at += sizeof(V);
    return v;
  }
  const unsigned char* take(size_t n) {
    const unsigned char* p = bytes.data() + at;
    at += n;
    return p;
  }
};

// Runs one kernel over a grid: CTAs one after another, 128 threads each.
void launch(dim3 grid, const std::function<void()>& body) {
  for (unsigned z = 0; z < grid.z; z++) {
    for (unsigned y = 0; y < grid.y; y++) {
      for (unsigned x = 0; x < grid.x; x++) {
        std::memset(emu::smem, 0xff, sizeof(emu::smem));  // NaN poison
        std::barrier<> cta(128);
        std::barrier<> w0(32), w1(32), w2(32), w3(32);
        emu::cta_barrier = &cta;
        emu::warp_barrier[0] = &w0;
        emu::warp_barrier[1] = &w1;
        emu::warp_barrier[2] = &w2;
        emu::warp_barrier[3] = &w3;
        std::vector<std::thread> threads;
        for (int t = 0; t < 128; t++) {
          threads.emplace_back([&, t] {
            emu::thread_idx = dim3(t, 0, 0);
            emu::block_idx = dim3(x, y, z);
            emu::groups.clear();
            emu::open_group.clear();
            body();
          });
        }
        for (std::thread& t : threads) t.join();
      }
    }
  }
}

using Partial = void (*)(const void*, const void* const*, const void* const*, const long long*, int, const long long*,
                         const long long*, float*, float*, unsigned char*, unsigned long long*, const unsigned char*,
                         int, int, int, int, long long, int, int, int, float, float, int, long long, float, float,
                         float);

#define ENTRY(NAME) {#NAME, reinterpret_cast<Partial>(&NAME)}
#define ENTRIES(S)                                                                                  \
  ENTRY(longctx_decode_sync_##S##_d128_r2), ENTRY(longctx_decode_unified_##S##_d128_r2),           \
  ENTRY(longctx_decode_sync_##S##_d128_r16), ENTRY(longctx_decode_unified_##S##_d128_r16),         \
  ENTRY(longctx_decode_sync_##S##_d256_r2), ENTRY(longctx_decode_unified_##S##_d256_r2),           \
  ENTRY(longctx_decode_sync_##S##_d256_r8), ENTRY(longctx_decode_unified_##S##_d256_r8)

const std::map<std::string, Partial> kPartials = {ENTRIES(f32), ENTRIES(f16), ENTRIES(bf16)};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: decode_emulation IN OUT\n");
    return 2;
  }
  In in;
  {
    FILE* f = std::fopen(argv[1], "rb");
    if (!f) { std::perror(argv[1]); return 2; }
    unsigned char buf[1 << 16];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) in.bytes.insert(in.bytes.end(), buf, buf + n);
    std::fclose(f);
  }
  const int type = in.get<int>(), unified = in.get<int>(), heads = in.get<int>(), kv_heads = in.get<int>(),
            tq = in.get<int>(), dim = in.get<int>(), batch = in.get<int>(), n_chunks = in.get<int>(),
            split_len = in.get<int>(), n_splits = in.get<int>(), rows_per_cta = in.get<int>(),
            row_blocks = in.get<int>(), dmax = in.get<int>(), rpw = in.get<int>(), causal = in.get<int>(),
            has_kpos = in.get<int>();
  const long long tk = in.get<long long>(), window = in.get<long long>();
  const float qscale = in.get<float>(), softcap = in.get<float>(), phi = in.get<float>(), lower = in.get<float>(),
              upper = in.get<float>();
  std::vector<long long> chunk_start(n_chunks + 1);
  for (long long& c : chunk_start) c = in.get<long long>();
  const size_t elem = type == 0 ? 4 : 2;
  const unsigned char* q = in.take(elem * batch * heads * tq * dim);
  std::vector<const void*> k_chunks, v_chunks;
  for (int c = 0; c < n_chunks; c++) {
    size_t n = elem * batch * kv_heads * (chunk_start[c + 1] - chunk_start[c]) * dim;
    k_chunks.push_back(in.take(n));
    v_chunks.push_back(in.take(n));
  }
  std::vector<long long> q_pos(tq), k_pos(has_kpos ? tk : 0);
  for (long long& p : q_pos) p = in.get<long long>();
  for (long long& p : k_pos) p = in.get<long long>();

  const char* suffix = type == 0 ? "f32" : type == 1 ? "f16" : "bf16";
  auto name = [&](bool u) {
    return std::string("longctx_decode_") + (u ? "unified_" : "sync_") + suffix + "_d" + std::to_string(dmax) + "_r" +
           std::to_string(rpw);
  };
  const long long states = (long long)batch * tq * heads;
  std::vector<float> part_o(states * n_splits * dim, NAN), part_lse(states * n_splits, NAN);
  std::vector<unsigned char> flags(states * n_splits, 0xAB);
  unsigned long long recomputed = 0;
  std::vector<float> o(states * dim, NAN), lse(states, NAN);
  const dim3 grid(n_splits * row_blocks, kv_heads, batch);
  auto partial = [&](bool u, const unsigned char* redo) {
    Partial f = kPartials.at(name(u));
    launch(grid, [&] {
      f(q, k_chunks.data(), v_chunks.data(), chunk_start.data(), n_chunks, q_pos.data(),
        has_kpos ? k_pos.data() : nullptr, part_o.data(), part_lse.data(), u ? flags.data() : nullptr,
        u ? &recomputed : nullptr, redo, heads, kv_heads, tq, dim, tk, split_len, n_splits, rows_per_cta, qscale,
        softcap, causal, window, phi, lower, upper);
    });
  };
  if (unified) {
    partial(true, nullptr);
    partial(false, flags.data());
  } else {
    partial(false, nullptr);
  }
  launch(dim3((unsigned)((states + 3) / 4), 1, 1), [&] {
    longctx_decode_combine(part_o.data(), part_lse.data(), n_splits, dim, states, o.data(), lse.data());
  });
  FILE* f = std::fopen(argv[2], "wb");
  if (!f) { std::perror(argv[2]); return 2; }
  std::fwrite(o.data(), sizeof(float), o.size(), f);
  std::fwrite(lse.data(), sizeof(float), lse.size(), f);
  long long count = (long long)recomputed;
  std::fwrite(&count, sizeof count, 1, f);
  std::fclose(f);
  return 0;
}
