// Host emulation of every longctx kernel: flash_decode.cu, the plain forward kernel
// (flash_forward.cu) and the tensor-core forward (flash_forward_tc.cu, whose inline PTX wrappers
// are replaced here by per-warp ldmatrix / mma.sync from the PTX ISA's fragment layouts), shared by
// the test harnesses (decode_emulation.cpp, tc_emulation_test.cpp) and the fake libcuda that runs
// JCuda launches on the host (fake_libcuda_emulated.cpp). See decode_emulation.cpp for what it does
// and does not check.
//
// cp.async landing time, env LONGCTX_EMU_COPY (read once per process):
//   wait   (default) a copy lands when its thread waits for its group, and its destination holds
//          NaN bytes from issue until then: a read before the wait and the barrier after it (a
//          missing wait or barrier after the copies), or a copy issued into a buffer another warp
//          still reads (a missing barrier before the copies), sees NaN;
//   issue  a copy lands at once: a copy into a buffer that another warp still reads, with no barrier
//          in between, overwrites it under that warp (a missing barrier before the copies shows);
//   random each copy is poisoned at issue as in wait and lands at a random emulated operation of
//          its thread between issue and wait; threads yield at random operations, and after each
//          __syncthreads one warp chosen at random waits for the others to reach the next (seed
//          LONGCTX_EMU_SEED, else the clock; printed to stderr when chosen).
// Threads are fibers on one OS thread (see "Fibers" below): which thread runs when is decided by
// the emulation alone, so every mode is deterministic and a random-mode seed replays a run exactly.
// wait is the default because it is the strictest: the poison at issue covers what issue would
// show, with NaN in place of plausible data, and the late landing covers reads before the wait.
// CI runs wait and issue (and the tc test random) and asserts that they give the same bits: a
// race-free kernel's output does not depend on when its copies land (docs/CUDA.md).
#pragma once

#include <algorithm>
#include <atomic>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <vector_types.h>
#include <vector_functions.h>

using std::max;
using std::min;

namespace emu {
// Block size follows each launch (decode and the plain forward: 128 threads; the tensor-core
// forward: 256); the per-warp slots below are sized for CUDA's largest block, 1,024 threads.
constexpr int kMaxWarps = 32;
// The running thread's index (set at each switch) and its CTA's.
dim3 thread_idx, block_idx, grid_dim, block_dim;
float fslot[kMaxWarps][32];
unsigned uslot[kMaxWarps][32];
alignas(16) unsigned char smem[256 * 1024];
std::mutex atomic_mutex;

struct Copy {
  void* dst;
  const void* src;
  int bytes;
};

enum class CopyMode { kWait, kIssue, kRandom };
struct CopyConfig {
  CopyMode mode;
  unsigned long long seed;
};

inline const CopyConfig& copy_config() {
  static const CopyConfig config = [] {
    CopyConfig c{CopyMode::kWait, 0};
    const char* m = std::getenv("LONGCTX_EMU_COPY");
    std::string mode = m ? m : "wait";
    if (mode == "issue") {
      c.mode = CopyMode::kIssue;
    } else if (mode == "random") {
      c.mode = CopyMode::kRandom;
    } else if (mode != "wait") {
      std::fprintf(stderr, "emulation: LONGCTX_EMU_COPY=%s: expected wait, issue or random\n", mode.c_str());
      std::abort();
    }
    const char* seed = std::getenv("LONGCTX_EMU_SEED");
    c.seed = seed && *seed ? std::strtoull(seed, nullptr, 10) : (unsigned long long)std::random_device{}() << 32 ^
                                                                     (unsigned long long)time(nullptr);
    if (c.mode == CopyMode::kRandom) {
      std::fprintf(stderr, "emulation: cp.async copies land at random points, LONGCTX_EMU_SEED=%llu\n", c.seed);
    }
    return c;
  }();
  return config;
}

// Fibers. Each emulated CUDA thread is a fiber (ucontext) with its own stack, all of a CTA on one
// OS thread; a thread runs until it waits (a barrier, a lagging warp in random mode) or yields
// (random mode), and then the next runnable thread in index order runs (descending in issue mode). A barrier therefore costs
// a user-space switch, not a wake-up through the OS, and a run is the same every time. All threads
// waiting with none runnable is a deadlock (a barrier some thread never reaches): the run aborts
// saying where each thread waits, where OS threads would hang.
struct Barrier {
  const char* name;
  int count;                           // threads taking part
  int arrived = 0;                     // of the current generation
  unsigned long long generation = 0;   // completed rounds
  void arrive_and_wait();
};
Barrier cta_barrier{"__syncthreads", 0};
Barrier warp_barrier[kMaxWarps];

struct Thread {
  ucontext_t context;
  void* stack = nullptr;
  dim3 idx;
  std::vector<std::vector<Copy>> groups;  // committed cp.async groups, oldest first
  std::vector<Copy> open_group;
  std::mt19937_64 rng;                   // random mode: landings and yields
  int warp_parity = 0;                   // which exchange slot set the next warp operation uses
  unsigned long long barriers_passed = 0;
  enum class Wait { kNone, kBarrier, kLag } wait = Wait::kNone;
  const Barrier* barrier = nullptr;      // kBarrier: until its generation passes `generation`
  unsigned long long generation = 0;
  unsigned long long lag_slot = 0;       // kLag: until the other warps are at barrier slot lag_slot
  bool done = false;
};
constexpr size_t kStackBytes = 512 * 1024;  // per thread (kernel frames take about 1.3 KB); a guard page below each
inline size_t guard_bytes() { return (size_t)sysconf(_SC_PAGESIZE); }
std::vector<Thread> threads;                 // the CTA's, reused from CTA to CTA
int running = -1;                            // index into threads; -1: the scheduler's own context
ucontext_t scheduler_context;
std::function<void()> const* kernel_body;
std::atomic<int> barrier_arrivals[4];        // random mode's lag: threads at (or past the end before) call k, slot k % 4

inline Thread& me() { return threads[running]; }

inline bool ready(const Thread& t) {
  if (t.done) return false;
  switch (t.wait) {
    case Thread::Wait::kNone: return true;
    case Thread::Wait::kBarrier: return t.barrier->generation != t.generation;
    case Thread::Wait::kLag: return barrier_arrivals[t.lag_slot] >= (int)block_dim.x - 32;
  }
  return false;
}

[[noreturn]] inline void deadlock() {
  std::fprintf(stderr, "emulation: deadlock in block %u,%u,%u: no thread can run\n", block_idx.x, block_idx.y,
               block_idx.z);
  int exited = 0;
  std::map<const Barrier*, std::vector<unsigned>> waiting;  // barrier -> threads waiting there
  for (const Thread& t : threads) {
    if (t.done) {
      exited++;
    } else if (t.wait == Thread::Wait::kBarrier) {
      waiting[t.barrier].push_back(t.idx.x);
    }
  }
  for (const auto& [b, ts] : waiting) {
    std::fprintf(stderr, "  %zu threads (%u..%u) wait at %s, %d of %d arrived\n", ts.size(), ts.front(), ts.back(),
                 b->name, b->arrived, b->count);
  }
  if (exited > 0) std::fprintf(stderr, "  %d threads have ended (a barrier after a return they skip?)\n", exited);
  std::abort();
}

// Leaves the running thread (which stays runnable unless it set a wait) for the next ready one in
// index order after it (before it in issue mode: the wait and issue runs CI compares then see
// opposite orders, so a race between a lower and a higher thread shows in one of them); returns
// when the scheduler picks this thread again. With none ready but a lagging warp, the lag ends (the
// others cannot move without it); with none at all: every thread done (back to the launch) or a
// deadlock.
inline void switch_thread() {
  const int n = (int)threads.size();
  const int from = running;
  const int step = copy_config().mode == CopyMode::kIssue ? -1 : 1;
  int next = -1;
  for (int i = 1; i <= n && next < 0; i++) {
    const int c = ((from < 0 ? (step > 0 ? -1 : n) : from) + step * i + 2 * n) % n;
    if (ready(threads[c])) next = c;
  }
  if (next < 0) {
    for (int c = 0; c < n && next < 0; c++) {
      if (!threads[c].done && threads[c].wait == Thread::Wait::kLag) {
        threads[c].wait = Thread::Wait::kNone;
        next = c;
      }
    }
  }
  if (next < 0) {
    for (const Thread& t : threads) {
      if (!t.done) deadlock();
    }
    running = -1;
    if (from >= 0) swapcontext(&threads[from].context, &scheduler_context);
    return;
  }
  if (next == from) return;
  running = next;
  thread_idx = threads[next].idx;
  if (from >= 0) {
    swapcontext(&threads[from].context, &threads[next].context);
  } else {
    swapcontext(&scheduler_context, &threads[next].context);
  }
  // Back in `from` (or in the scheduler, when every thread is done).
  if (from >= 0) {
    running = from;
    thread_idx = threads[from].idx;
  }
}

inline void Barrier::arrive_and_wait() {
  Thread& t = me();
  if (++arrived == count) {
    arrived = 0;
    generation++;
    return;  // the last to arrive goes on; the others are ready from now
  }
  t.wait = Thread::Wait::kBarrier;
  t.barrier = this;
  t.generation = generation;
  switch_thread();
  t.wait = Thread::Wait::kNone;
}

// Lets the other threads run (random mode); this one stays ready.
inline void yield() { switch_thread(); }


inline void land(const Copy& c) {
  std::memset(c.dst, 0, 16);  // cp.async zero-fills past src_bytes
  std::memcpy(c.dst, c.src, c.bytes);
}

// random mode: called at each emulated operation of a thread; each of its copies in flight lands
// here with probability 1/4, and the thread yields its core with probability 1/8 (other warps run
// ahead: a plain shared-memory race with no barrier between shows more often).
inline void maybe_land() {
  if (copy_config().mode != CopyMode::kRandom) return;
  if ((me().rng() & 7) == 0) yield();
  auto step = [](std::vector<Copy>& g) {
    size_t kept = 0;
    for (size_t i = 0; i < g.size(); i++) {
      if ((me().rng() & 3) == 0) {
        land(g[i]);
      } else {
        g[kept++] = g[i];
      }
    }
    g.resize(kept);
  };
  step(me().open_group);
  for (std::vector<Copy>& g : me().groups) step(g);
}

// random mode: after each __syncthreads one warp, chosen from the seed and the barrier's number
// (the same choice in every thread of the block), waits until the other warps have reached their next
// __syncthreads (or ended) before it goes on: the most skew the barriers allow. With a barrier
// missing, the others then run into the next phase while it is still in this one, and the race
// shows nearly every time instead of only when the schedule happens to interleave them.
inline void arrive_count() { barrier_arrivals[me().barriers_passed % 4]++; }
inline void maybe_lag() {
  const unsigned long long k = me().barriers_passed++;  // the barrier just passed
  if (thread_idx.x == 0) barrier_arrivals[(k + 2) % 4] = 0;  // nobody can be at k + 2 before thread 0 is at k + 1
  if (copy_config().mode != CopyMode::kRandom) return;
  unsigned long long h = copy_config().seed ^ (k * 0x9E3779B97F4A7C15ull) ^
                         (block_idx.x + 131ull * block_idx.y + 17161ull * block_idx.z) * 0xBF58476D1CE4E5B9ull;
  h ^= h >> 31;
  h *= 0x94D049BB133111EBull;
  h ^= h >> 29;
  const int warps = block_dim.x / 32, others = (int)block_dim.x - 32;
  if ((int)(h % warps) != (int)thread_idx.x / 32) return;
  if (barrier_arrivals[(k + 1) % 4] >= others) return;
  me().wait = Thread::Wait::kLag;
  me().lag_slot = (k + 1) % 4;
  switch_thread();
  me().wait = Thread::Wait::kNone;
}

// A fiber's whole life: the kernel, then a last arrival so that a lagging warp does not wait for it.
inline void thread_main() {
  (*kernel_body)();
  arrive_count();
  me().done = true;
  switch_thread();  // never comes back: a done thread is never picked
}

[[noreturn]] inline void fault(const char* what, const void* p) {
  std::fprintf(stderr, "emulation: %s at %p (thread %u of block %u,%u,%u)\n", what, p, thread_idx.x, block_idx.x,
               block_idx.y, block_idx.z);
  std::abort();
}

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
#define gridDim emu::grid_dim
#define blockDim emu::block_dim
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(...)
#define __maxnreg__(...)
#define LONGCTX_HOST_EMULATION 1
#define LONGCTX_DYNAMIC_SHARED(T, name) T* name = reinterpret_cast<T*>(emu::smem)

inline float __int_as_float(int i) {  // used by CUDART_INF_F in math_constants.h
  float f;
  std::memcpy(&f, &i, sizeof f);
  return f;
}

inline int __float_as_int(float f) {
  int i;
  std::memcpy(&i, &f, sizeof i);
  return i;
}

inline double __longlong_as_double(long long i) {  // used by CUDART_INF
  double d;
  std::memcpy(&d, &i, sizeof d);
  return d;
}

// The device's fast exp is approximate; the host's is exact: the emulation checks structure
// (indices, masks, barriers, merges), not the last bits of exp.
inline float __expf(float x) { return std::exp(x); }
// ex2.approx.ftz.f32: subnormal inputs and results are zero (the exact exp2 otherwise, as above).
inline float exp2_ftz(float x) {
  if (std::fabs(x) < FLT_MIN) x = 0.f;
  float r = std::exp2(x);
  return r < FLT_MIN ? 0.f : r;
}

inline void __syncthreads() {
  emu::maybe_land();
  emu::arrive_count();
  emu::cta_barrier.arrive_and_wait();
  emu::maybe_lag();
}
inline void __syncwarp() { emu::warp_barrier[emu::warp()].arrive_and_wait(); }

inline double __shfl_xor_sync(unsigned, double x, int off) {
  static double dslot[emu::kMaxWarps][32];
  int w = emu::warp(), l = emu::lane();
  dslot[w][l] = x;
  emu::warp_barrier[w].arrive_and_wait();
  double y = dslot[w][l ^ off];
  emu::warp_barrier[w].arrive_and_wait();
  return y;
}

inline long long __shfl_xor_sync(unsigned, long long x, int off) {
  static long long lslot[emu::kMaxWarps][32];
  emu::maybe_land();
  int w = emu::warp(), l = emu::lane();
  lslot[w][l] = x;
  emu::warp_barrier[w].arrive_and_wait();
  long long y = lslot[w][l ^ off];
  emu::warp_barrier[w].arrive_and_wait();
  return y;
}

inline float __shfl_xor_sync(unsigned, float x, int off) {
  emu::maybe_land();
  int w = emu::warp(), l = emu::lane();
  emu::fslot[w][l] = x;
  emu::warp_barrier[w].arrive_and_wait();
  float y = emu::fslot[w][l ^ off];
  emu::warp_barrier[w].arrive_and_wait();
  return y;
}

namespace emu {
// The warp's predicates as a 32-bit mask (bit l: lane l), through the per-warp slots; the votes below.
inline unsigned ballot(int pred) {
  int w = emu::warp(), l = emu::lane();
  emu::uslot[w][l] = pred ? 1u : 0u;
  emu::warp_barrier[w].arrive_and_wait();
  unsigned bits = 0;
  for (int i = 0; i < 32; i++) bits |= emu::uslot[w][i] << i;
  emu::warp_barrier[w].arrive_and_wait();
  return bits;
}
}  // namespace emu
inline int __any_sync(unsigned, int pred) { return emu::ballot(pred) != 0u; }
inline int __all_sync(unsigned, int pred) { return emu::ballot(pred) == 0xffffffffu; }

inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
  std::lock_guard<std::mutex> g(emu::atomic_mutex);
  unsigned long long old = *p;
  *p = old + v;
  return old;
}

inline void cp_async16(void* dst, const void* src, int src_bytes) {
  // cp.async of 16 bytes needs 16-byte aligned addresses on both sides.
  if (reinterpret_cast<uintptr_t>(dst) % 16 != 0) emu::fault("cp.async to a shared address not 16-byte aligned", dst);
  if (src_bytes > 0 && reinterpret_cast<uintptr_t>(src) % 16 != 0) {
    emu::fault("cp.async from a global address not 16-byte aligned", src);
  }
  if (emu::copy_config().mode == emu::CopyMode::kIssue) {
    emu::land({dst, src, src_bytes});
    return;
  }
  // Until it lands, the destination's bytes are undefined: NaN poison now, so a read before the
  // wait and the barrier after it (read-after-write), or a copy issued into a buffer that another
  // warp still reads (write-after-read), shows as NaN.
  std::memset(dst, 0xff, 16);
  emu::me().open_group.push_back({dst, src, src_bytes});
  emu::maybe_land();
}
inline void cp_async_commit() {
  emu::me().groups.push_back(std::move(emu::me().open_group));
  emu::me().open_group.clear();
  emu::maybe_land();
}
inline void cp_async_wait_n(size_t keep) {
  std::vector<std::vector<emu::Copy>>& groups = emu::me().groups;
  while (groups.size() > keep) {
    for (const emu::Copy& c : groups.front()) emu::land(c);
    groups.erase(groups.begin());
  }
}
inline void cp_async_wait_1() { cp_async_wait_n(1); }
inline void cp_async_wait_0() { cp_async_wait_n(0); }

// The tensor-core PTX wrappers of longctx_mma.cuh (compiled there only without
// LONGCTX_HOST_EMULATION), used by flash_forward_tc.cu and flash_decode.cu's tensor-core kernel. ldmatrix and mma.sync are warp-collective: each lane puts its operands
// into its warp's exchange slot, one barrier of the 32 lanes, then each lane computes its own
// results from the PTX ISA's fragment layouts. Slots alternate between two sets, so the next
// operation's writes cannot meet this one's reads without a second barrier (every lane passes the
// next barrier only after its reads here).
inline void cp_async16(void* dst, const void* src) { cp_async16(dst, src, 16); }

namespace emu {
struct WarpOperands {
  const unsigned char* row[32];  // ldmatrix: each lane's row address
  uint32_t a[32][4], b[32][2];    // mma: each lane's A and B registers
};
WarpOperands warp_operands[kMaxWarps][2];
inline WarpOperands& exchange_begin() { return warp_operands[warp()][me().warp_parity]; }
inline void exchange_wait() {
  maybe_land();
  warp_barrier[warp()].arrive_and_wait();
  me().warp_parity ^= 1;
}

inline uint16_t b16_at(const unsigned char* p) {
  uint16_t x;
  std::memcpy(&x, p, 2);
  return x;
}

// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16: lanes 8i..8i+7 give the addresses of rows 0..7
// of 8x8 matrix i (16 bytes each). Lane l receives in register i the 32-bit pair of matrix i at
// row l/4, columns 2(l%4) and 2(l%4)+1 (the lower column in the low half); with .trans the pair of
// the transposed matrix: rows 2(l%4) and 2(l%4)+1 of column l/4.
inline void ldmatrix(uint32_t (&r)[4], const void* p, bool trans) {
  if (reinterpret_cast<uintptr_t>(p) % 16 != 0) fault("ldmatrix row address not 16-byte aligned", p);
  WarpOperands& x = exchange_begin();
  const int l = lane();
  x.row[l] = static_cast<const unsigned char*>(p);
  exchange_wait();
  for (int i = 0; i < 4; i++) {
    const unsigned char* const* rows = x.row + 8 * i;
    if (!trans) {
      std::memcpy(&r[i], rows[l / 4] + 4 * (l % 4), 4);
    } else {
      r[i] = b16_at(rows[2 * (l % 4)] + 2 * (l / 4)) | (uint32_t)b16_at(rows[2 * (l % 4) + 1] + 2 * (l / 4)) << 16;
    }
  }
}

template <typename T>
inline float b16_to_float(uint16_t bits);
template <>
inline float b16_to_float<__half>(uint16_t bits) {
  __half_raw r;
  r.x = bits;
  return __half2float(__half(r));
}
template <>
inline float b16_to_float<__nv_bfloat16>(uint16_t bits) {
  uint32_t u = (uint32_t)bits << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Element i (0 or 1) of a register holding a b16 pair.
inline uint16_t half_of(uint32_t reg, int i) { return (uint16_t)(reg >> (16 * i)); }

// mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}: D (16x8, f32) = A (16x16) B (16x8) + C, with
// groupID g = lane/4 and t = lane%4 (PTX ISA, "Matrix fragments for mma.m16n8k16"):
//   A: register j of lane 4g+t holds row g + 8 (j % 2), columns 2t + 8 (j / 2) + {0, 1};
//   B: register j holds rows (k) 2t + 8 j + {0, 1} of column g;
//   C, D: element i holds row g + 8 (i / 2), column 2t + i % 2.
// Products of fp16/bf16 values are exact in float. The sum is not IEEE: it follows the behaviour
// measured on A100/H100-class tensor cores (Fasi et al. 2021; Khattak and Mikaitis 2025): c and a
// block of 8 products are aligned to the largest exponent among them, bits below 2^(emax - 23) are
// dropped (truncation toward zero, not rounding), the aligned terms are summed exactly and the sum is
// truncated to float, which is c for the next block of 8. A model, not bit-exact: on the first GPU
// run (H200, 2026-11-26) the decode kernel's P V mma into its running O lost 6-9x naive float32's
// error, and this model did not reproduce that size (the emulation tests passed the old code), so
// the GPU check, not the emulation, judges the tensor cores' arithmetic.

// One block of the tensor cores' sum (above): c + p[0..7], aligned and truncated. Non-finite
// inputs fall back to a plain sum (they propagate either way).
inline float block_fma(float c, const double* p) {
  double largest = std::fabs((double)c), plain = c;
  for (int k = 0; k < 8; k++) {
    largest = std::max(largest, std::fabs(p[k]));
    plain += p[k];
  }
  if (largest == 0 || !std::isfinite(largest)) return (float)plain;
  int e;
  std::frexp(largest, &e);                          // largest in [2^(e-1), 2^e)
  const double quantum = std::ldexp(1.0, e - 24);   // 24 bits below the largest term's leading bit
  double sum = std::trunc(c / quantum) * quantum;   // exact: multiples of quantum below 2^(e+4)
  for (int k = 0; k < 8; k++) sum += std::trunc(p[k] / quantum) * quantum;
  float f = (float)sum;                             // round to nearest, then step back toward zero
  if (std::fabs((double)f) > std::fabs(sum)) f = std::nextafter(f, 0.f);
  return f;
}

template <typename T>
inline void mma_m16n8k16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  WarpOperands& x = exchange_begin();
  const int l = lane();
  for (int j = 0; j < 4; j++) x.a[l][j] = a[j];
  x.b[l][0] = b0;
  x.b[l][1] = b1;
  exchange_wait();
  const int g = l / 4, t = l % 4;
  for (int i = 0; i < 4; i++) {
    const int row = g + 8 * (i / 2), col = 2 * t + i % 2;
    double p[16];
    for (int k = 0; k < 16; k++) {
      const uint32_t areg = x.a[4 * (row % 8) + (k % 8) / 2][row / 8 + 2 * (k / 8)];
      const uint32_t breg = x.b[4 * col + (k % 8) / 2][k / 8];
      p[k] = (double)b16_to_float<T>(half_of(areg, k % 2)) * b16_to_float<T>(half_of(breg, k % 2));
    }
    c[i] = block_fma(block_fma(c[i], p), p + 8);
  }
}
}  // namespace emu

inline void ldmatrix_x4(uint32_t (&r)[4], const void* p) { emu::ldmatrix(r, p, false); }
inline void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) { emu::ldmatrix(r, p, true); }
template <typename T>
inline void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  emu::mma_m16n8k16<T>(c, a, b0, b1);
}

#include "flash_decode.cu"
// Its own namespace: the forward file's anonymous-namespace constants share names with decode's.
namespace fwd {
#include "flash_forward.cu"
}  // namespace fwd

namespace tc {
#include "flash_forward_tc.cu"
}  // namespace tc

namespace emu {

// Runs one kernel over a grid: CTAs one after another, block.x threads each (a whole number of
// warps; by and bz are 1 for every kernel here). dyn_smem: the launch's dynamic shared memory; a
// CTA that writes past it aborts the run (a GPU would fault or corrupt a neighbour's memory).
inline void launch(dim3 grid, dim3 block, const std::function<void()>& body, size_t dyn_smem = sizeof(emu::smem)) {
  if (dyn_smem > sizeof(emu::smem)) {
    std::fprintf(stderr, "emulation: %zu bytes of dynamic shared memory, at most %zu\n", dyn_smem, sizeof(emu::smem));
    std::abort();
  }
  const int n = (int)block.x;
  if (n <= 0 || n % 32 != 0 || n / 32 > kMaxWarps || block.y != 1 || block.z != 1) {
    std::fprintf(stderr, "emulation: block (%u,%u,%u) is not 1-%d whole warps in x\n", block.x, block.y, block.z,
                 kMaxWarps);
    std::abort();
  }
  // The CTAs run on an OS thread of their own, so that fibers never run on a caller's stack (the
  // fake libcuda's caller is a JVM thread); one launch at a time (the fibers and smem are global).
  static std::mutex one_launch;
  std::lock_guard<std::mutex> lock(one_launch);
  std::thread([&] {
    for (size_t i = n; i < threads.size(); i++) munmap(threads[i].stack, kStackBytes + guard_bytes());
    threads.resize(n);
    for (Thread& t : threads) {
      if (t.stack == nullptr) {
        void* m = mmap(nullptr, kStackBytes + guard_bytes(), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (m == MAP_FAILED || mprotect(m, guard_bytes(), PROT_NONE) != 0) {
          std::fprintf(stderr, "emulation: no memory for a thread's stack\n");
          std::abort();
        }
        t.stack = m;
      }
    }
    kernel_body = &body;
    grid_dim = grid;
    block_dim = block;
    for (unsigned z = 0; z < grid.z; z++) {
      for (unsigned y = 0; y < grid.y; y++) {
        for (unsigned x = 0; x < grid.x; x++) {
          std::memset(smem, 0xff, sizeof(smem));  // NaN poison
          for (std::atomic<int>& a : barrier_arrivals) a = 0;
          block_idx = dim3(x, y, z);
          cta_barrier.count = n;
          cta_barrier.arrived = 0;
          for (int w = 0; w < n / 32; w++) warp_barrier[w] = Barrier{"a warp barrier (shuffle, vote, ldmatrix, mma or __syncwarp)", 32};
          for (int i = 0; i < n; i++) {
            Thread& t = threads[i];
            t.idx = dim3(i, 0, 0);
            t.groups.clear();
            t.open_group.clear();
            t.warp_parity = 0;
            t.barriers_passed = 0;
            t.wait = Thread::Wait::kNone;
            t.done = false;
            t.rng.seed(copy_config().seed ^ (0x9E3779B97F4A7C15ull * (1 + i + n * (x + 65536ull * (y + 65536ull * z)))));
            getcontext(&t.context);
            t.context.uc_stack.ss_sp = static_cast<char*>(t.stack) + guard_bytes();
            t.context.uc_stack.ss_size = kStackBytes;
            t.context.uc_link = nullptr;
            makecontext(&t.context, thread_main, 0);
          }
          running = -1;
          switch_thread();  // returns when every thread of the CTA is done
          for (size_t i = dyn_smem; i < sizeof(smem); i++) {
            if (smem[i] != 0xff) {
              std::fprintf(stderr, "emulation: CTA (%u,%u,%u) wrote shared memory byte %zu, past its %zu dynamic bytes\n", x,
                           y, z, i, dyn_smem);
              std::abort();
            }
          }
        }
      }
    }
  }).join();
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

#define TC_ENTRIES(S) ENTRY(longctx_decode_tc_sync_##S##_d128), ENTRY(longctx_decode_tc_unified_##S##_d128)

inline const std::map<std::string, Partial> kPartials = {ENTRIES(f32), ENTRIES(f16), ENTRIES(bf16), TC_ENTRIES(f16),
                                                         TC_ENTRIES(bf16)};

// Decode's partial and combine kernels run kThreads (flash_decode.cu) threads per block.
constexpr int kDecodeThreads = kThreads;

// The tensor-core partials (CudaDecode.Plan.threads): two warps per m16 block of rows, which split
// each tile's keys.
inline unsigned tc_decode_threads(int rows_per_cta) { return 64u * (unsigned)((rows_per_cta + 15) / 16); }

// The plain forward kernel (flash_forward.cu): grid (ceil(Tq / 4), H, B), one warp per row.
using Forward = void (*)(const void*, const void*, const void*, const long long*, const long long*, float*, float*,
                         int, int, int, int, int, float, float, int, long long);
struct ForwardKernel {
  Forward fn;
  int threads;  // the block size the kernel's code assumes; a launch with another one is an error
};
#define FORWARD(NAME) {#NAME, {reinterpret_cast<Forward>(&fwd::NAME), fwd::kWarps * 32}}
// The tensor-core forward (flash_forward_tc.cu), same parameters: grid (ceil(Tq / kRows), H, B),
// kThreads threads.
#define FORWARD_TC(NAME) {#NAME, {reinterpret_cast<Forward>(&tc::NAME), tc::kThreads}}
inline const std::map<std::string, ForwardKernel> kForwards = {
    FORWARD(longctx_forward_f32), FORWARD(longctx_forward_f16), FORWARD(longctx_forward_bf16),
    FORWARD_TC(longctx_forward_tc_m32_f16_d64), FORWARD_TC(longctx_forward_tc_m32_f16_d128),
    FORWARD_TC(longctx_forward_tc_m32_bf16_d64), FORWARD_TC(longctx_forward_tc_m32_bf16_d128)};

}  // namespace emu

