// Host emulation of flash_decode.cu and the plain forward kernel (flash_forward.cu), shared by the
// test harness (decode_emulation.cpp) and the fake libcuda that runs JCuda launches on the host
// (fake_libcuda_emulated.cpp). See decode_emulation.cpp for what it does and does not check. The
// tensor-core forward (inline PTX: ldmatrix, mma.sync, cp.async) is not emulated yet.
#pragma once

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
const dim3 block_dim(128, 1, 1);  // every kernel here runs 128 threads per block
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
#define blockDim emu::block_dim
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

inline double __longlong_as_double(long long i) {  // used by CUDART_INF
  double d;
  std::memcpy(&d, &i, sizeof d);
  return d;
}

// The device's fast exp is approximate; the host's is exact: the emulation checks structure
// (indices, masks, barriers, merges), not the last bits of exp.
inline float __expf(float x) { return std::exp(x); }

inline void __syncthreads() { emu::cta_barrier->arrive_and_wait(); }
inline void __syncwarp() { emu::warp_barrier[emu::warp()]->arrive_and_wait(); }

inline double __shfl_xor_sync(unsigned, double x, int off) {
  static double dslot[4][32];
  int w = emu::warp(), l = emu::lane();
  dslot[w][l] = x;
  emu::warp_barrier[w]->arrive_and_wait();
  double y = dslot[w][l ^ off];
  emu::warp_barrier[w]->arrive_and_wait();
  return y;
}

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
// Its own namespace: the forward file's anonymous-namespace constants share names with decode's.
namespace fwd {
#include "flash_forward.cu"
}  // namespace fwd

namespace emu {

// Runs one kernel over a grid: CTAs one after another, 128 threads each.
inline void launch(dim3 grid, const std::function<void()>& body) {
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
                         const long long*, float*, double*, unsigned char*, unsigned long long*, const unsigned char*,
                         int, int, int, int, long long, int, int, int, float, float, int, long long, float, float,
                         float);

#define ENTRY(NAME) {#NAME, reinterpret_cast<Partial>(&NAME)}
#define ENTRIES(S)                                                                                  \
  ENTRY(longctx_decode_sync_##S##_d128_r2), ENTRY(longctx_decode_unified_##S##_d128_r2),           \
  ENTRY(longctx_decode_sync_##S##_d128_r16), ENTRY(longctx_decode_unified_##S##_d128_r16),         \
  ENTRY(longctx_decode_sync_##S##_d256_r2), ENTRY(longctx_decode_unified_##S##_d256_r2),           \
  ENTRY(longctx_decode_sync_##S##_d256_r8), ENTRY(longctx_decode_unified_##S##_d256_r8)

inline const std::map<std::string, Partial> kPartials = {ENTRIES(f32), ENTRIES(f16), ENTRIES(bf16)};

// The plain forward kernel (flash_forward.cu): grid (ceil(Tq / 4), H, B).
using Forward = void (*)(const void*, const void*, const void*, const long long*, const long long*, float*, float*,
                         int, int, int, int, int, float, float, int, long long);
#define FORWARD(NAME) {#NAME, reinterpret_cast<Forward>(&fwd::NAME)}
inline const std::map<std::string, Forward> kForwards = {FORWARD(longctx_forward_f32), FORWARD(longctx_forward_f16),
                                                         FORWARD(longctx_forward_bf16)};

}  // namespace emu

