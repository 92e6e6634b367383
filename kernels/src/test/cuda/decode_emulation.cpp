// Host emulation of flash_decode.cu (CUDA-core and tensor-core partials) for tests on machines without a GPU (CudaDecodeEmulationTest).
//
// The kernel source is compiled unchanged by g++ as C++20, with this file supplying what the GPU
// would: every CTA runs as 128 fibers on one OS thread (one per CUDA thread; emu::launch takes the
// block size), __syncthreads is a barrier of the 128, warp shuffles / __any_sync / __syncwarp exchange through per-warp slots between barriers
// of the 32 lanes, __shared__ variables are statics (CTAs run one after another), dynamic shared
// memory is one buffer poisoned with NaN bytes before each CTA, and cp.async lands when
// LONGCTX_EMU_COPY says (emulation.h): by default its destination is NaN from issue and the copy
// lands when the issuing thread waits for its group (cp.async.wait_group), so a read before the
// wait, or a copy into a stage another warp still reads, sees NaN; `issue` lands it at once.
//
// What this checks: the kernel's index math, chunk walking, masks, split narrowing, softmax and
// unified-max flags, the recompute pass and the combine, on the host's float arithmetic (expf etc.
// of glibc, not the GPU's). What it cannot: anything about the GPU itself (the PTX, real
// asynchrony and memory ordering, bank conflicts, speed).
//
// Usage: decode_emulation IN OUT. IN (little endian): int32 type (0 f32, 1 f16, 2 bf16), unified,
// heads, kv_heads, tq, dim, batch, n_chunks, split_len, n_splits, rows_per_cta, row_blocks, dmax,
// rpw, causal, has_kpos, tc (1: the tensor-core kernels); int64 tk, window; float32 qscale, softcap, phi, lower, upper; int64
// chunk_start[n_chunks + 1]; q; per chunk k then v (element bits); int64 q_pos[tq];
// int64 k_pos[tk] if has_kpos. OUT: float32 o[states * dim], lse[states]; int64 recomputed.

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "emulation.h"

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
  std::vector<std::unique_ptr<unsigned char, decltype(&std::free)>> blocks;
  // A copy in its own 256-byte aligned block, as cuMemAlloc would give (cp.async needs 16 bytes).
  const unsigned char* take(size_t n) {
    unsigned char* p = static_cast<unsigned char*>(std::aligned_alloc(256, (n + 255) / 256 * 256 + 256));
    blocks.emplace_back(p, &std::free);
    std::memcpy(p, bytes.data() + at, n);
    at += n;
    return p;
  }
};

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
            has_kpos = in.get<int>(), tc = in.get<int>(), smem_bytes = in.get<int>();
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
    if (tc) return std::string("longctx_decode_tc_") + (u ? "unified_" : "sync_") + suffix + "_d" + std::to_string(dmax);
    return std::string("longctx_decode_") + (u ? "unified_" : "sync_") + suffix + "_d" + std::to_string(dmax) + "_r" +
           std::to_string(rpw);
  };
  const long long states = (long long)batch * tq * heads;
  std::vector<float> part_o(states * n_splits * dim, NAN);
  std::vector<double> part_lse(states * n_splits, NAN);
  std::vector<unsigned char> flags(states * n_splits, 0xAB);
  unsigned long long recomputed = 0;
  std::vector<float> o(states * dim, NAN), lse(states, NAN);
  const dim3 grid(n_splits * row_blocks, kv_heads, batch);
  auto partial = [&](bool u, const unsigned char* redo) {
    emu::Partial f = emu::kPartials.at(name(u));
    const unsigned threads = tc ? emu::tc_decode_threads(rows_per_cta) : (unsigned)emu::kDecodeThreads;
    emu::launch(grid, dim3(threads), [&] {
      f(q, k_chunks.data(), v_chunks.data(), chunk_start.data(), n_chunks, q_pos.data(),
        has_kpos ? k_pos.data() : nullptr, part_o.data(), part_lse.data(), u ? flags.data() : nullptr,
        u ? &recomputed : nullptr, redo, heads, kv_heads, tq, dim, tk, split_len, n_splits, rows_per_cta, qscale,
        softcap, causal, window, phi, lower, upper);
    }, (size_t)smem_bytes);
  };
  if (unified) {
    partial(true, nullptr);
    partial(false, flags.data());
  } else {
    partial(false, nullptr);
  }
  emu::launch(dim3((unsigned)((states + 3) / 4), 1, 1), dim3(emu::kDecodeThreads), [&] {
    longctx_decode_combine(part_o.data(), part_lse.data(), n_splits, dim, states, o.data(), lse.data());
  }, 0);
  FILE* f = std::fopen(argv[2], "wb");
  if (!f) { std::perror(argv[2]); return 2; }
  std::fwrite(o.data(), sizeof(float), o.size(), f);
  std::fwrite(lse.data(), sizeof(float), lse.size(), f);
  long long count = (long long)recomputed;
  std::fwrite(&count, sizeof count, 1, f);
  std::fclose(f);
  return 0;
}
