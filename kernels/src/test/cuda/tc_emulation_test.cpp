// Unit test of the emulated tensor-core warp operations of emulation.h (ldmatrix x4 [.trans], mma.sync
// m16n8k16 with fp16 and bf16 inputs), run by CudaTensorCoreEmulationTest. Each of the 8 warps of one
// emulated CTA (256 threads, as the tensor-core forward launches) takes its own random 16x16 matrices from a shared buffer and checks:
//   1. ldmatrix with the tensor-core kernels' three addressings (Q; K; V with .trans) gives, lane by
//      lane, the registers of the PTX ISA's mma.m16n8k16 A and B fragment tables (so the ldmatrix
//      table and the mma table are checked against each other, not each against itself);
//   2. mma on fragments built by hand from those tables equals C + A B computed in double;
//   3. the chain the kernel runs, S = Q K^T and O = Q V through ldmatrix + mma, equals the double
//      matmul.
// Results must be within the emulated tensor cores' truncation of the exact sums: |got - exact| <=
// 40 * 2^-24 * (|c| + sum |a b|) (two blocks of 8 products, each dropping less than 2^-23 of the
// largest term from each of its 9 terms and from its sum). Usage: tc_emulation_test SEED TRIALS. Exit 0: all pass; 1: a
// check failed (the lines say which, lane and values); 2: usage.

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <random>

#include "emulation.h"

namespace {

constexpr int kStride = 24;  // elements per row: 16 + 8 padding, as the kernel pads (16-byte rows)
constexpr int kMat = 16 * kStride;

struct WarpData {
  alignas(16) uint16_t q[kMat], k[kMat], v[kMat];  // bits of T
  float c[16][8];                                   // accumulator input for check 2
  uint16_t a2[16][16], b2[16][8];                   // A and B of check 2 (bits of T)
};
constexpr int kTestWarps = 8;  // as the tensor-core forward launches
alignas(16) WarpData data[kTestWarps];

std::atomic<int> failures{0};
std::mutex print_mutex;

template <typename T>
uint16_t bits_of(float x);
template <>
uint16_t bits_of<__half>(float x) {
  return __half_raw(__float2half_rn(x)).x;
}
template <>
uint16_t bits_of<__nv_bfloat16>(float x) {
  return __nv_bfloat16_raw(__float2bfloat16_rn(x)).x;
}

template <typename T>
float val(uint16_t bits) {
  return emu::b16_to_float<T>(bits);
}

uint32_t pair(uint16_t lo, uint16_t hi) { return lo | (uint32_t)hi << 16; }

void fail(const char* type, const char* what, int warp, int lane, double got, double want) {
  if (failures++ >= 40) return;  // the first 40 say enough
  std::lock_guard<std::mutex> g(print_mutex);
  std::printf("FAIL %s %s: warp %d lane %d got %.9g want %.9g\n", type, what, warp, lane, got, want);
}

void expect_reg(const char* type, const char* what, int warp, int lane, uint32_t got, uint32_t want) {
  if (got != want) fail(type, what, warp, lane, got, want);
}

// got against the exact double sum; `mag` is |c| + sum |a b|.
void expect_sum(const char* type, const char* what, int warp, int lane, float got, double exact, double mag) {
  if (!(std::fabs(got - exact) <= 40 * std::ldexp(1.0, -24) * mag)) fail(type, what, warp, lane, got, exact);
}

template <typename T>
void warp_checks(const char* type) {
  const int w = emu::warp(), l = emu::lane(), g = l / 4, t = l % 4;
  WarpData& d = data[w];
  auto Q = [&](int r, int c) { return d.q[r * kStride + c]; };
  auto K = [&](int r, int c) { return d.k[r * kStride + c]; };
  auto V = [&](int r, int c) { return d.v[r * kStride + c]; };

  // 1. ldmatrix with the kernel's addressing yields mma fragments.
  uint32_t qf[4], kf[4], vf[4];
  ldmatrix_x4(qf, &d.q[((l / 8) % 2 * 8 + l % 8) * kStride + l / 16 * 8]);
  ldmatrix_x4(kf, &d.k[(l / 16 * 8 + l % 8) * kStride + (l / 8) % 2 * 8]);
  ldmatrix_x4_trans(vf, &d.v[((l / 8) % 2 * 8 + l % 8) * kStride + l / 16 * 8]);
  for (int j = 0; j < 4; j++) {
    // A (Q, row-major 16x16): register j holds row g + 8 (j % 2), columns 2t + 8 (j / 2) + {0, 1}.
    const int r = g + 8 * (j % 2), c = 2 * t + 8 * (j / 2);
    expect_reg(type, "ldmatrix Q as A fragment", w, l, qf[j], pair(Q(r, c), Q(r, c + 1)));
    // B = K^T, keys 8 (j / 2) .. +7 as n: register j % 2 holds k (dims) 2t + 8 (j % 2) + {0, 1} at n = g.
    const int key = 8 * (j / 2) + g, dim = 2 * t + 8 * (j % 2);
    expect_reg(type, "ldmatrix K as B fragment", w, l, kf[j], pair(K(key, dim), K(key, dim + 1)));
    // B = V (k = key, n = dim), dims 8 (j / 2) .. +7: keys 2t + 8 (j % 2) + {0, 1} at dim g.
    const int vkey = 2 * t + 8 * (j % 2), vdim = 8 * (j / 2) + g;
    expect_reg(type, "ldmatrix.trans V as B fragment", w, l, vf[j], pair(V(vkey, vdim), V(vkey + 1, vdim)));
  }

  // 2. mma on hand-built fragments against C + A B in double.
  uint32_t a[4];
  for (int j = 0; j < 4; j++) {
    const int r = g + 8 * (j % 2), c = 2 * t + 8 * (j / 2);
    a[j] = pair(d.a2[r][c], d.a2[r][c + 1]);
  }
  const uint32_t b0 = pair(d.b2[2 * t][g], d.b2[2 * t + 1][g]), b1 = pair(d.b2[2 * t + 8][g], d.b2[2 * t + 9][g]);
  float acc[4];
  for (int i = 0; i < 4; i++) acc[i] = d.c[g + 8 * (i / 2)][2 * t + i % 2];
  mma<T>(acc, a, b0, b1);
  for (int i = 0; i < 4; i++) {
    const int r = g + 8 * (i / 2), c = 2 * t + i % 2;
    double exact = d.c[r][c], mag = std::fabs(d.c[r][c]);
    for (int k = 0; k < 16; k++) {
      const double p = (double)val<T>(d.a2[r][k]) * val<T>(d.b2[k][c]);
      exact += p;
      mag += std::fabs(p);
    }
    expect_sum(type, "mma C + A B", w, l, acc[i], exact, mag);
  }

  // 3. The kernel's chain: S = Q K^T (keys 0-7 from kf[0..1], 8-15 from kf[2..3]) and O = Q V.
  float s[2][4] = {}, o[2][4] = {};
  mma<T>(s[0], qf, kf[0], kf[1]);
  mma<T>(s[1], qf, kf[2], kf[3]);
  mma<T>(o[0], qf, vf[0], vf[1]);
  mma<T>(o[1], qf, vf[2], vf[3]);
  for (int nb = 0; nb < 2; nb++) {
    for (int i = 0; i < 4; i++) {
      const int r = g + 8 * (i / 2), c = 8 * nb + 2 * t + i % 2;
      double es = 0, ms = 0, eo = 0, mo = 0;
      for (int k = 0; k < 16; k++) {
        const double ps = (double)val<T>(Q(r, k)) * val<T>(K(c, k)), po = (double)val<T>(Q(r, k)) * val<T>(V(k, c));
        es += ps;
        ms += std::fabs(ps);
        eo += po;
        mo += std::fabs(po);
      }
      expect_sum(type, "S = Q K^T via ldmatrix + mma", w, l, s[nb][i], es, ms);
      expect_sum(type, "O = Q V via ldmatrix.trans + mma", w, l, o[nb][i], eo, mo);
    }
  }
}

template <typename T>
void trial(std::mt19937_64& rng, const char* type) {
  std::uniform_real_distribution<float> u(-2.f, 2.f);
  for (WarpData& d : data) {
    for (int i = 0; i < kMat; i++) {
      // Padding columns hold NaN bits: a read outside the 16 columns shows.
      const bool pad = i % kStride >= 16;
      d.q[i] = pad ? 0x7fff : bits_of<T>(u(rng));
      d.k[i] = pad ? 0x7fff : bits_of<T>(u(rng));
      d.v[i] = pad ? 0x7fff : bits_of<T>(u(rng));
    }
    for (auto& row : d.c) for (float& x : row) x = u(rng);
    for (auto& row : d.a2) for (uint16_t& x : row) x = bits_of<T>(u(rng));
    for (auto& row : d.b2) for (uint16_t& x : row) x = bits_of<T>(u(rng));
  }
  emu::launch(dim3(1, 1, 1), dim3(32 * kTestWarps), [&] { warp_checks<T>(type); });
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: tc_emulation_test SEED TRIALS\n");
    return 2;
  }
  const unsigned long long seed = std::strtoull(argv[1], nullptr, 10);
  const int trials = std::atoi(argv[2]);
  std::mt19937_64 rng(seed);
  for (int i = 0; i < trials; i++) {
    trial<__half>(rng, "f16");
    trial<__nv_bfloat16>(rng, "bf16");
  }
  std::printf("%d trials x 2 types x %d warps, seed %llu: %d failures\n", trials, kTestWarps, seed, failures.load());
  return failures == 0 ? 0 : 1;
}
