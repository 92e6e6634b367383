#!/usr/bin/env bash
# Instruction counts of the tensor-core forward's tile loop, the figures of docs/CUDA.md ("fewer
# instructions per tile"): per thread and 64-key tile of longctx_forward_tc_m32_bf16_d128, for a tile
# without a mask, a fully visible causal tile and a partial (diagonal) one.
#
#   kernels/src/gpu/sass-count.sh [FLASH_FORWARD_TC_CU] [ARCH]     (defaults: the tree's, sm_90a)
#
# Each tile class is counted on a copy of the kernel specialised by text substitution (softcap 0,
# causal on or off, no window, the tile's class fixed), compiled with nvcc -cubin; the hot loop is the
# shortest span from a backward branch to its target that holds all 256 HMMA. Needs nvcc and an
# nvdisasm that reads the raw code (NVDISASM=path; no cuobjdump ships with the nvcc here: Debian's
# nvidia-cuda-toolkit 11.8 package, from its non-free component, unpacked with dpkg-deb -x, has one).
# The headers come from the tree (kernels/src/main/cuda).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
src="${1:-$root/kernels/src/main/cuda/flash_forward_tc.cu}"
arch="${2:-sm_90a}"
nvdisasm="${NVDISASM:-$(command -v nvdisasm || true)}"
[ -n "$nvdisasm" ] || { echo "sass-count: no nvdisasm (set NVDISASM; see the comment at the top)" >&2; exit 2; }
sm="SM$(echo "$arch" | sed 's/^sm_\([0-9]*\).*/\1/')"
kernel=longctx_forward_tc_m32_bf16_d128
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
cp "$root"/kernels/src/main/cuda/*.cuh "$tmp/"
for spec in "no-mask 0 kAll" "causal-full 1 kAll" "causal-partial 1 kPartial"; do
  read -r name causal vis <<< "$spec"
  python3 - "$src" "$tmp/k.cu" "$causal" "$vis" <<'PY'
import sys
s = open(sys.argv[1]).read()
head = "  constexpr int NT = kThreads;\n"
loop = "const int j0 = tile.j0, vis = tile.vis;"
if head not in s or loop not in s:
    sys.exit("sass-count: the kernel no longer has the lines this script specialises; update the script")
s = s.replace(head, head + "  softcap = 0.f; causal = %s; window = 0;\n" % sys.argv[3], 1)
s = s.replace(loop, "const int j0 = tile.j0, vis = %s;" % sys.argv[4], 1)
open(sys.argv[2], "w").write(s)
PY
  nvcc -cubin -O3 -std=c++17 -diag-suppress 177 -arch="$arch" -o "$tmp/k.cubin" "$tmp/k.cu"
  objcopy -O binary -I elf64-little --only-section=".text.$kernel" "$tmp/k.cubin" "$tmp/k.bin"
  "$nvdisasm" -b "$sm" "$tmp/k.bin" > "$tmp/k.sass"
  python3 - "$tmp/k.sass" "$name" "$arch" <<'PY'
import collections, re, sys
ins = []
for line in open(sys.argv[1]):
    m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
    if m:
        ins.append((int(m.group(1), 16), m.group(2)))
at = {a: i for i, (a, _) in enumerate(ins)}
loops = []
for i, (a, t) in enumerate(ins):
    m = re.search(r"BRA.*0x([0-9a-f]+)", t)
    if m and int(m.group(1), 16) <= a and int(m.group(1), 16) in at:
        lo = at[int(m.group(1), 16)]
        if sum("HMMA" in x for _, x in ins[lo:i + 1]) == 256:
            loops.append((i - lo + 1, lo, i))
if not loops:
    sys.exit("sass-count: no loop with 256 HMMA found")
n, lo, hi = min(loops)
ops = collections.Counter(re.sub(r"^@!?U?P\w+\s+", "", t.strip()).split()[0].split(".")[0] for _, t in ins[lo:hi + 1])
keys = ["HMMA", "LDSM", "FMUL", "FFMA", "FADD", "FMNMX", "MUFU", "SHFL", "VOTE", "BAR", "LDGSTS", "BRA", "LDL", "STL"]
print(f"{sys.argv[3]} {sys.argv[2]:15} {n:5} instructions  " + " ".join(f"{k} {ops[k]}" for k in keys))
PY
done
