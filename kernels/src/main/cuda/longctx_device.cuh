// Device helpers shared by every longctx kernel, and the device twin of the visibility rule
// (io.longctx.kernels.AttentionOptions: visible, anyVisible, allVisible). Included by each .cu.
#pragma once

#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <climits>
#include <stdint.h>

// A kernel's dynamic shared memory as an array of T (the host emulation maps it to its own buffer).
#ifndef LONGCTX_DYNAMIC_SHARED
#define LONGCTX_DYNAMIC_SHARED(T, name) extern __shared__ T name[]
#endif

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

// cap * tanh(x), except that an infinite x gives NaN (x - x), which the caller reports, rather than
// a finite -cap or +cap: x is a q.k whose float32 sum overflowed, possibly in its partial sums
// only, so the exact capped score may be anything (the CPU kernels refuse it too). Finite x: the
// added +0 changes nothing but the sign of a zero.
__device__ __forceinline__ float soft_capped(float cap, float x) { return cap * tanhf(x) + (x - x); }

__device__ __forceinline__ float warp_sum(float x) {
  for (int off = 16; off > 0; off >>= 1) x += __shfl_xor_sync(0xffffffffu, x, off);
  return x;
}

__device__ __forceinline__ float warp_max(float x) {
  for (int off = 16; off > 0; off >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, off));
  return x;
}

// Min and max of a 64-bit value over the warp; the xor butterfly leaves both in every lane.
__device__ __forceinline__ void warp_min_max(long long& lo, long long& hi) {
  for (int off = 16; off > 0; off >>= 1) {
    lo = min(lo, __shfl_xor_sync(0xffffffffu, lo, off));
    hi = max(hi, __shfl_xor_sync(0xffffffffu, hi, off));
  }
}

// Positions are any 64-bit value: a window compares the exact distance q - k (k <= q) as an
// unsigned number, never q - window, which overflows near LLONG_MIN.
// The comparisons here and in visible are combined with & and |, not && and ||: per score element,
// a short circuit became a branch (and a divergence point) in the compiled mask.
__device__ __forceinline__ bool within_window(long long q, long long k, long long window) {
  return (window <= 0) | ((unsigned long long)q - (unsigned long long)k < (unsigned long long)window);
}

// Whether a query at qp sees a key at kp (causal: kp <= qp; window w > 0: qp - w < kp <= qp).
__device__ __forceinline__ bool visible(long long qp, long long kp, int causal, long long window) {
  if (!causal && window <= 0) return true;
  return (kp <= qp) & within_window(qp, kp, window);
}

// Whether some query in [qlo, qhi] may see some key in [klo, khi] (false: skip the pair). The tensor-core
// forward takes this verdict by warp votes over a tile's keys instead (find_tile); tile_scan_test.cpp
// holds those votes to this function.
__device__ __forceinline__ bool any_visible(long long qlo, long long qhi, long long klo, long long khi, int causal,
                                            long long window) {
  if (!causal && window <= 0) return true;
  if (klo > qhi) return false;
  return khi >= qlo || within_window(qlo, khi, window);
}

// Whether every query in [qlo, qhi] sees every key in [klo, khi] (true: no mask work).
__device__ __forceinline__ bool all_visible(long long qlo, long long qhi, long long klo, long long khi, int causal,
                                            long long window) {
  if (!causal && window <= 0) return true;
  return khi <= qlo && within_window(qhi, klo, window);
}
