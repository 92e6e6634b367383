// Randomized test of the tensor-core forward's key-tile scan (find_tile in flash_forward_tc.cu), run by
// CudaTensorCoreEmulationTest: one emulated warp runs the kernel's own find_tile, and every lane's answer
// must equal a plain host scan that classifies each tile by any_visible / all_visible of its key
// position range (longctx_device.cuh: the rule the CPU kernels and the decode kernels use). find_tile
// decides by warp votes over the keys instead, so this checks that the votes are the range rule:
// random positions (sorted, shuffled, with repeats and gaps, near LLONG_MIN and LLONG_MAX), query
// ranges around and away from them, causal or not, windows from 1 to past every distance, tile counts
// and tails of every size, and every tile start. Usage: tile_scan_test SEED TRIALS. Exit 0: all agree;
// 1: a mismatch (the case is printed); 2: usage.

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "emulation.h"

namespace {

struct Verdict {
  int j0, vis;
};

// The rule spelled out on the host: first tile from j0 that any_visible admits; kAll when the tile is
// whole (every key below tk) and all_visible holds.
Verdict host_scan(int j0, const std::vector<long long>& kp, int tk, long long qlo, long long qhi, int causal,
                  long long window) {
  if (!causal && window <= 0) return {j0 < tk ? j0 : tk, j0 + tc::kKeys <= tk ? tc::kAll : tc::kPartial};
  for (; j0 < tk; j0 += tc::kKeys) {
    long long lo = LLONG_MAX, hi = LLONG_MIN;
    for (int j = j0; j < j0 + tc::kKeys && j < tk; j++) {
      lo = std::min(lo, kp[j]);
      hi = std::max(hi, kp[j]);
    }
    if (any_visible(qlo, qhi, lo, hi, causal, window)) {
      const bool whole = j0 + tc::kKeys <= tk;
      return {j0, whole && all_visible(qlo, qhi, lo, hi, causal, window) ? tc::kAll : tc::kPartial};
    }
  }
  return {tk, tc::kPartial};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: tile_scan_test SEED TRIALS\n");
    return 2;
  }
  const unsigned long long seed = std::strtoull(argv[1], nullptr, 10);
  const int trials = std::atoi(argv[2]);
  std::mt19937_64 rng(seed);
  auto uni = [&](long long a, long long b) { return std::uniform_int_distribution<long long>(a, b)(rng); };
  int failures = 0, checked = 0;
  for (int trial = 0; trial < trials && failures < 5; trial++) {
    const int tk = (int)uni(1, 700);
    // A base near zero or near either end of the 64-bit range (with room for the spread below), and
    // positions around it; pattern 4 puts keys at both ends at once (distances near 2^64).
    const long long base = uni(0, 2) == 0 ? uni(-1000, 1000)
                           : uni(0, 1)    ? LLONG_MIN + 5000 + uni(0, 2000)
                                          : LLONG_MAX - 10000;
    std::vector<long long> kp(tk);
    const int pattern = (int)uni(0, 4);
    for (int j = 0; j < tk; j++) {
      kp[j] = pattern == 0 ? base + j                 // a prefill's positions
              : pattern == 1 ? base + j / 3            // repeats
              : pattern == 2 ? base + j * uni(1, 4)    // gaps
              : pattern == 3 ? base + uni(0, 2 * tk)   // any order
              : uni(0, 1) ? LLONG_MIN + uni(0, 100) : LLONG_MAX - uni(0, 100);
    }
    // Query ranges anywhere around the keys, or starting or ending exactly at (or next to) one of
    // them, often a tile's first, where a rule's < against <= shows.
    auto near_key = [&] {
      return kp[uni(0, 1) ? uni(0, (tk - 1) / tc::kKeys) * tc::kKeys : uni(0, tk - 1)] + uni(-1, 1);
    };
    const long long qa = uni(0, 1) ? near_key() : kp[0] + uni(-tk / 2, 2 * tk);
    const long long qb = uni(0, 1) ? qa : uni(0, 1) ? near_key() : qa + uni(0, tk);
    const long long qlo = std::min(qa, qb), qhi = std::max(qa, qb);
    const int causal = (int)uni(0, 1);
    const int wpick = (int)uni(0, 3);
    const long long window = wpick == 0 ? 0 : wpick == 1 ? uni(1, 20) : wpick == 2 ? uni(1, 400) : LLONG_MAX;
    for (int j0 = 0; j0 < tk + tc::kKeys; j0 += tc::kKeys) {
      const Verdict want = host_scan(j0, kp, tk, qlo, qhi, causal, window);
      Verdict got[32];
      emu::launch(dim3(1, 1, 1), dim3(32, 1, 1), [&] {
        const tc::Tile t = tc::find_tile(j0, kp.data(), tk, qlo, qhi, causal, window);
        got[emu::lane()] = {t.j0, t.vis};
      });
      checked++;
      for (int l = 0; l < 32; l++) {
        if (got[l].j0 != want.j0 || (want.j0 < tk && got[l].vis != want.vis)) {
          if (failures++ < 5) {
            std::printf("MISMATCH trial %d lane %d: tk %d pattern %d base %lld q [%lld, %lld] causal %d window %lld"
                        " j0 %d: find_tile (%d, %d), range rule (%d, %d)\n",
                        trial, l, tk, pattern, base, qlo, qhi, causal, window, j0, got[l].j0, got[l].vis, want.j0,
                        want.vis);
          }
          break;
        }
      }
    }
  }
  std::printf("%d trials, %d scans, seed %llu: %d failures\n", trials, checked, seed, failures);
  return failures == 0 ? 0 : 1;
}
