#!/usr/bin/env bash
# Forward-kernel sweep behind docs/BENCHMARKS.md's T-scaling tables and docs/plots/ (not run in CI).
#
#   examples/bench-sweep.sh [OUTDIR]        (default examples/target/bench-data, not tracked by git)
#
# For T = 1024 .. 16384 (H = Hkv = 8, D = 128, fp32), causal and not:
#   OUTDIR/forward-sweep.jsonl   bin/longctx bench --op forward --t T [--causal]: java, op, libtorch-sdpa,
#                                djl-plain, median ms and GFLOP/s, alternating in one JVM
#   OUTDIR/memory-sweep.jsonl    the same shapes with --memory: each impl alone in a fresh JVM, its peak
#                                resident memory beyond its inputs
# Every line gets "load1" (the 1-minute load average when its run started), "date" and "cpu".
# Set TS="1024 2048" to run fewer lengths, SKIP_MEMORY=1 or SKIP_TIME=1 to run one half, SKIP_PLAIN=1
# to leave djl-plain out of both (it takes most of the sweep's time and is never the anchor); the plain
# (materialized) path needs 2 x H x T^2 x 4 B (16 GiB at T = 16384): skipped unless MemAvailable allows.
# Takes ~25 minutes on 2 cores. Then: bin/longctx plots (reads the default OUTDIR). Lines are appended,
# never overwritten. To keep figures, copy the file into docs/bench-data/ under a name that says the
# CPU (forward-sweep-CPU-DATE.jsonl: plots draws each file apart, so CPUs never share a plot).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
case "${1:-}" in
  -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
  -*) echo "bench-sweep.sh: OUTDIR cannot start with '-': $1 (the only argument is OUTDIR; see --help)" >&2; exit 2 ;;
esac
[ $# -le 1 ] || { echo "bench-sweep.sh: one argument at most (OUTDIR), got $#" >&2; exit 2; }
out="${1:-$root/examples/target/bench-data}"
mkdir -p -- "$out"
ts="${TS:-1024 2048 4096 8192 16384}"
longctx="${LONGCTX:-$root/bin/longctx}" # LONGCTX: another launcher (the script test's stub)

# The CPU behind every figure: machines of one kind differ (some AVX-512, some AVX2 only), and so
# does the Java kernel's standing against libtorch.
cpu="$(awk -F': *' '/^model name/ && !n {n=$2} /^cpu family/ && !f {f=$2} /^model[ \t]*:/ && !m {m=$2}
  /^flags/ && / avx512f / {v="AVX-512"} END {printf "%s (family %s model %s), %s", n, f, m, v ? v : "no AVX-512"}' \
  /proc/cpuinfo | tr -d '"|\\')"
# AVX2 code on an AVX-512 CPU (our stand-in for the AVX2 machines): said on every line, or its figures
# would read as the CPU's own.
limits=""
case "${LONGCTX_JAVA_OPTS:-}" in *UseAVX=*) limits="-XX:UseAVX=${LONGCTX_JAVA_OPTS##*UseAVX=}"; limits="${limits%% *}";; esac
for v in ATEN_CPU_CAPABILITY MKL_ENABLE_INSTRUCTIONS; do
  if [ -n "${!v:-}" ]; then limits="${limits:+$limits, }$v=${!v}"; fi
done
if [ -n "$limits" ]; then cpu="$cpu CPU running limited code: $(tr -d '"|\\' <<<"$limits")"; fi

tag() { # appends load1, date and cpu to every JSON line on stdin
  local load date
  load="$(cut -d' ' -f1 /proc/loadavg)"
  date="$(date -u +%Y-%m-%dT%H:%MZ)"
  sed -u -e "s|}\$|, \"load1\": $load, \"date\": \"$date\", \"cpu\": \"$cpu\"}|" | grep --line-buffered '^{'
}

iters_for() { # median of N after W warm-up rounds: fewer rounds where one call takes tens of seconds
  # (short calls get more rounds: at T = 1024 one call's time moves 5-10% between rounds, and the op's
  # vs_faster is judged against 0.95)
  if [ "$1" -le 2048 ]; then echo "--iters 15 --warmup 5"
  elif [ "$1" -le 4096 ]; then echo "--iters 5 --warmup 3"
  elif [ "$1" -le 8192 ]; then echo "--iters 3 --warmup 1"
  else echo "--iters 1 --warmup 1"; fi
}

plain_fits() { # the materialized path needs 2 x 8 GiB at T = 16384 (H = 8): only with room to spare
  local need_gb=$(( 2 * 8 * $1 * $1 * 4 / 1073741824 + 3 )) avail_gb
  avail_gb=$(( $(awk '/MemAvailable/ {print $2}' /proc/meminfo) / 1048576 ))
  [ "$avail_gb" -ge "$need_gb" ]
}

if [ -z "${SKIP_TIME:-}" ]; then
  for t in $ts; do
    # without --causal the bench runs non-causal, then causal, in one JVM
    echo "== time T=$t (load $(cut -d' ' -f1-3 /proc/loadavg))" >&2
    plain="--plain" # djl-plain is off by default in bench; the sweep wants it where it fits
    if [ -n "${SKIP_PLAIN:-}" ]; then plain=""
    else plain_fits "$t" || { plain=""; echo "   (djl-plain skipped: not enough free memory)" >&2; }; fi
    # shellcheck disable=SC2046
    "$longctx" bench --op forward --t "$t" --heads 8 --kv-heads 8 --dim 128 $plain $(iters_for "$t") | tag \
      | tee -a -- "$out/forward-sweep.jsonl"
  done
fi

if [ -z "${SKIP_MEMORY:-}" ]; then
  for t in $ts; do
    # without --causal, --memory measures non-causal and causal, each impl in its own JVM
    echo "== memory T=$t (load $(cut -d' ' -f1-3 /proc/loadavg))" >&2
    impls="java,op,libtorch-sdpa,djl-plain"
    if [ -n "${SKIP_PLAIN:-}" ]; then impls="java,op,libtorch-sdpa"
    else plain_fits "$t" || { impls="java,op,libtorch-sdpa"; echo "   (djl-plain skipped: not enough free memory)" >&2; }; fi
    "$longctx" bench --op forward --t "$t" --heads 8 --kv-heads 8 --dim 128 --memory --impls "$impls" | tag \
      | tee -a -- "$out/memory-sweep.jsonl"
  done
fi
echo "appended to $out/ (bin/longctx plots --data $out draws it)" >&2
