// Tensor-core fragment helpers shared by flash_forward_tc.cu and flash_decode.cu: the inline PTX
// wrappers for cp.async, ldmatrix and mma.sync m16n8k16, and the float <-> b16-pair packing of
// fragments. The host emulation of the tests (src/test/cuda/emulation.h) defines
// LONGCTX_HOST_EMULATION and supplies its own versions of the PTX wrappers (per-warp ldmatrix and
// mma from the PTX ISA's fragment layouts, cp.async with a chosen landing time); everything outside
// that block is the code the GPU runs.
#pragma once

#include "longctx_device.cuh"

// log2 e: the tensor-core kernels take e^x as exp2_ftz(x log2 e).
constexpr float kLog2e = 1.4426950408889634f;

#ifndef LONGCTX_HOST_EMULATION
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, asynchronously; src_bytes < 16 zero-fills the rest (0: all of it).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr(dst)), "l"(src));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

// Wait until at most 1 (or 0) of this thread's committed groups are still in flight.
__device__ __forceinline__ void cp_async_wait_1() { asm volatile("cp.async.wait_group 1;\n" ::); }
__device__ __forceinline__ void cp_async_wait_0() { asm volatile("cp.async.wait_group 0;\n" ::); }

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(p)));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(p)));
}

// 2^x with results below float's normal range flushed to 0: one MUFU.EX2, where exp2f (without
// fast math) adds a range test and two multiplies around it to keep subnormal results. A softmax
// weight under 2^-126 is nothing beside the row's largest weight of 1.
__device__ __forceinline__ float exp2_ftz(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(x));
  return r;
}

// c (16x8 f32) += a (16x16) * b (16x8), element type T.
template <typename T>
__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);

template <>
__device__ __forceinline__ void mma<__half>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <>
__device__ __forceinline__ void mma<__nv_bfloat16>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
#endif  // LONGCTX_HOST_EMULATION

// Two floats rounded to nearest and packed as one register of T pairs (the low half holds x).
template <typename T>
__device__ __forceinline__ uint32_t pack(float x, float y);

template <>
__device__ __forceinline__ uint32_t pack<__half>(float x, float y) {
  __half2 h = __floats2half2_rn(x, y);
  return *reinterpret_cast<uint32_t*>(&h);
}

template <>
__device__ __forceinline__ uint32_t pack<__nv_bfloat16>(float x, float y) {
  __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
  return *reinterpret_cast<uint32_t*>(&h);
}

// The two values of a packed register, exactly.
template <typename T>
__device__ __forceinline__ float2 unpack(uint32_t r);

template <>
__device__ __forceinline__ float2 unpack<__half>(uint32_t r) {
  return __half22float2(*reinterpret_cast<__half2*>(&r));
}

template <>
__device__ __forceinline__ float2 unpack<__nv_bfloat16>(uint32_t r) {
  return __bfloat1622float2(*reinterpret_cast<__nv_bfloat162*>(&r));
}
