// A stand-in libcuda.so.1 whose "device" is the host: memory is malloc'ed, copies are memcpy, and
// cuLaunchKernel runs every longctx kernel (flash_decode.cu, the plain forward kernels of
// flash_forward.cu, the tensor-core forward of flash_forward_tc.cu) in the host emulation
// (emulation.h; LONGCTX_EMU_COPY picks when cp.async copies land). With it on LD_LIBRARY_PATH,
// JCuda and CudaAttention run their whole path (probe, module and function loading, allocation,
// chunk tables, kernel parameters, launches, copies back) without a GPU (CudaDecodeFakeDeviceTest,
// GpuCheckFakeDeviceTest, CudaForwardTcFakeDeviceTest). A kernel name it does not know returns
// CUDA_ERROR_NOT_SUPPORTED (801). With $LONGCTX_FAKE_FORWARD_RC set, every forward launch returns
// that code instead; a sticky code (700, 714-719: a kernel fault) then makes cuCtxSynchronize
// return it, as a lost context does. With $LONGCTX_FAKE_LAUNCH_LOG set, each launch appends the
// kernel's name to that file. Only the driver calls longctx makes exist here.

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "emulation.h"

namespace {
struct Function {
  std::string name;
};
int fake_handle;  // non-null address for contexts, modules, streams, events
int lost_context_rc = 0;  // set by a simulated sticky forward error
}  // namespace

extern "C" {
typedef unsigned long long CUdeviceptr_t;

int cuInit(unsigned int) { return 0; }
int cuDriverGetVersion(int* v) { *v = 13000; return 0; }
int cuDeviceGetCount(int* count) { *count = 1; return 0; }
int cuDeviceGet(int* dev, int ordinal) { *dev = ordinal; return ordinal == 0 ? 0 : 101; }
int cuDeviceGetName(char* name, int len, int) {
  std::strncpy(name, "host emulation (fake libcuda)", len);
  return 0;
}
int cuDeviceGetAttribute(int* v, int, int) { *v = 1; return 0; }
int cuDevicePrimaryCtxRetain(void** ctx, int) { *ctx = &fake_handle; return 0; }
int cuCtxSetCurrent(void*) { return 0; }
int cuCtxSynchronize() { return lost_context_rc; }
int cuModuleLoadData(void** module, const void*) { *module = &fake_handle; return 0; }
int cuModuleGetFunction(void** f, void*, const char* name) {
  *f = new Function{name};
  return 0;
}
int cuFuncSetAttribute(void*, int, int) { return 0; }
int cuOccupancyMaxActiveBlocksPerMultiprocessor(int* n, void*, int, size_t) { *n = 1; return 0; }
int cuStreamCreate(void** s, unsigned int) { *s = &fake_handle; return 0; }
int cuStreamDestroy_v2(void*) { return 0; }
int cuStreamSynchronize(void*) { return 0; }
// Past each allocation's end lie kGuardBytes of all-ones bits, NaN in every float type: a kernel that
// reads past the end of an input (a tile's rows past the sequence, say) turns results into NaN, where a
// GPU might have read a neighbour's finite values, or faulted.
constexpr size_t kGuardBytes = 64 << 10;
int cuMemAlloc_v2(CUdeviceptr_t* p, size_t bytes) {
  void* m = std::malloc(bytes + kGuardBytes);
  if (!m) return 2;  // CUDA_ERROR_OUT_OF_MEMORY
  std::memset(m, 0x5a, bytes);  // garbage, as device memory would be
  std::memset(static_cast<char*>(m) + bytes, 0xff, kGuardBytes);
  *p = reinterpret_cast<CUdeviceptr_t>(m);
  return 0;
}
int cuMemFree_v2(CUdeviceptr_t p) { std::free(reinterpret_cast<void*>(p)); return 0; }
int cuMemcpyHtoD_v2(CUdeviceptr_t d, const void* h, size_t n) {
  std::memcpy(reinterpret_cast<void*>(d), h, n);
  return 0;
}
int cuMemcpyHtoDAsync_v2(CUdeviceptr_t d, const void* h, size_t n, void*) { return cuMemcpyHtoD_v2(d, h, n); }
int cuMemcpyDtoH_v2(void* h, CUdeviceptr_t d, size_t n) {
  std::memcpy(h, reinterpret_cast<void*>(d), n);
  return 0;
}
int cuMemcpyDtoHAsync_v2(void* h, CUdeviceptr_t d, size_t n, void*) { return cuMemcpyDtoH_v2(h, d, n); }
int cuMemsetD32Async(CUdeviceptr_t d, unsigned int v, size_t n, void*) {
  unsigned int* p = reinterpret_cast<unsigned int*>(d);
  for (size_t i = 0; i < n; i++) p[i] = v;
  return 0;
}
int cuMemcpyDtoDAsync_v2(CUdeviceptr_t d, CUdeviceptr_t src, size_t n, void*) {
  std::memcpy(reinterpret_cast<void*>(d), reinterpret_cast<const void*>(src), n);
  return 0;
}
// Events exist so that timing code runs; every interval is 1 ms (meaningless, like all speed here).
int cuEventCreate(void** e, unsigned int) { *e = &fake_handle; return 0; }
int cuEventRecord(void*, void*) { return 0; }
int cuEventSynchronize(void*) { return 0; }
int cuEventElapsedTime(float* ms, void*, void*) { *ms = 1.0f; return 0; }
int cuEventDestroy_v2(void*) { return 0; }
int cuGetErrorName(int error, const char** name) {
  *name = error == 801 ? "CUDA_ERROR_NOT_SUPPORTED" : "CUDA_ERROR_UNKNOWN";
  return 0;
}
int cuGetErrorString(int, const char** text) { *text = "fake libcuda (host emulation)"; return 0; }

int cuLaunchKernel(void* fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                   unsigned smem, void*, void** p, void**) {
  const std::string& name = static_cast<Function*>(fn)->name;
  if (const char* log = std::getenv("LONGCTX_FAKE_LAUNCH_LOG")) { // the kernels a test's calls launched, in order
    if (FILE* f = std::fopen(log, "a")) {
      std::fprintf(f, "%s\n", name.c_str());
      std::fclose(f);
    }
  }
  if (smem > sizeof(emu::smem)) return 1;
  // A block size other than the one the kernel's code assumes is CUDA_ERROR_INVALID_VALUE here (on a
  // GPU it would run, wrongly, or fail past __launch_bounds__).
  auto threads_ok = [&](int threads) { return (int)bx == threads && by == 1 && bz == 1; };
  const dim3 block(bx, by, bz);
  auto ptr = [&](int i) { return *static_cast<void**>(p[i]); };
  auto i32 = [&](int i) { return *static_cast<int*>(p[i]); };
  auto i64 = [&](int i) { return *static_cast<long long*>(p[i]); };
  auto f32 = [&](int i) { return *static_cast<float*>(p[i]); };
  if (name == "longctx_decode_combine") {
    if (!threads_ok(emu::kDecodeThreads)) return 1;
    emu::launch(dim3(gx, gy, gz), block, [&] {
      longctx_decode_combine(static_cast<const float*>(ptr(0)), static_cast<const double*>(ptr(1)), i32(2), i32(3),
                             i64(4), static_cast<float*>(ptr(5)), static_cast<float*>(ptr(6)));
    }, smem);
    return 0;
  }
  auto it = emu::kPartials.find(name);
  if (it == emu::kPartials.end()) {
    const char* rc = std::getenv("LONGCTX_FAKE_FORWARD_RC");
    auto fwd = emu::kForwards.find(name);
    if (rc == nullptr && fwd != emu::kForwards.end()) {
      if (!threads_ok(fwd->second.threads)) return 1;
      emu::launch(dim3(gx, gy, gz), block, [&] {
        fwd->second.fn(ptr(0), ptr(1), ptr(2), static_cast<const long long*>(ptr(3)), static_cast<const long long*>(ptr(4)),
                    static_cast<float*>(ptr(5)), static_cast<float*>(ptr(6)), i32(7), i32(8), i32(9), i32(10), i32(11),
                    f32(12), f32(13), i32(14), i64(15));
      }, smem);
      return 0;
    }
    int code = rc ? std::atoi(rc) : 801;
    if (code == 700 || (code >= 714 && code <= 719)) lost_context_rc = code;
    return code;
  }
  // Rows per CTA: argument 19.
  const bool tc = name.rfind("longctx_decode_tc_", 0) == 0;
  if (!threads_ok(tc ? (int)emu::tc_decode_threads(i32(19)) : emu::kDecodeThreads)) return 1;
  emu::Partial f = it->second;
  emu::launch(dim3(gx, gy, gz), block, [&] {
    f(ptr(0), static_cast<const void* const*>(ptr(1)), static_cast<const void* const*>(ptr(2)),
      static_cast<const long long*>(ptr(3)), i32(4), static_cast<const long long*>(ptr(5)),
      static_cast<const long long*>(ptr(6)), static_cast<float*>(ptr(7)), static_cast<double*>(ptr(8)),
      static_cast<unsigned char*>(ptr(9)), static_cast<unsigned long long*>(ptr(10)),
      static_cast<const unsigned char*>(ptr(11)), i32(12), i32(13), i32(14), i32(15), i64(16), i32(17), i32(18),
      i32(19), f32(20), f32(21), i32(22), i64(23), f32(24), f32(25), f32(26));
  }, smem);
  return 0;
}
}  // extern "C"
