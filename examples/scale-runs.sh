#!/usr/bin/env bash
# Scale runs behind docs/BENCHMARKS.md's "Spark at scale" section (not run in CI; tens of minutes).
#
#   examples/scale-runs.sh decode     # 1,000,000-token decode: one document, 32 query heads over 8 kv
#                                     # heads x 128 dim, 64 queries, causal, 2 GiB heap
#   examples/scale-runs.sh prefill    # 131,072-token causal prefill, 8 heads = 8 kv heads x 128 dim
#   examples/scale-runs.sh scaling    # spark-bench prefill on local[1] vs local[2] (with CLUSTER=1
#                                     # also local-cluster with 1 vs 2 executor JVMs of one core)
#   examples/scale-runs.sh cluster-decode  # the 1M decode again with a separate 2 GiB executor JVM
#   examples/scale-runs.sh ppl-window # split ppl: one 1,000,000-token document, mistral model made by
#                                     # gen-model (8 layers, hidden 512, 8 heads / 2 kv heads, window
#                                     # 4096, vocab 4096), chunks of 4096, 2 GiB heap, local[2], the
#                                     # default tasks per layer (PARTITIONS=N to choose)
#   examples/scale-runs.sh ppl-causal # split ppl: one 131,072-token document, full causal attention
#                                     # (llama, 2 layers, otherwise the same model)
#   examples/scale-runs.sh ppl-overhead  # a 32,768-token document both ways on the window model, same
#                                     # run: one task vs split on local[1], local[2] (with CLUSTER=1
#                                     # also local-cluster[2,1,heap]); and split with --balance
#                                     # contiguous, for the task time spread
#   examples/scale-runs.sh ppl-balance   # split ppl of a 32,768-token causal document (2 layers),
#                                     # 16 blocks over 2 tasks: --balance cost vs contiguous
#   examples/scale-runs.sh clean      # delete what it generated in DATA (the default DATA whole;
#                                     # elsewhere the names its marker lists, then DATA if empty)
#
# Environment: DATA (default examples/target/scale-data: ignored by git, gone with mvn clean; 7.7 GB of Parquet for decode, 1.6 GB for
# prefill, plus Spark's shuffle, spill and cache files under DATA/tmp: ~33 GB at the decode's peak), HEAP (default 2g: -Xmx of every JVM, driver
# and executor), OUT (default examples/target/bench-data/scale-runs.jsonl,
# not tracked by git; docs/bench-data/scale-runs.jsonl holds the recorded runs), TOKENS / PREFILL_TOKENS /
# PPL_TOKENS / PPL_LAYERS to run smaller sizes.
#
# Each run appends one JSON line to OUT: wall time, the job's own summary (tokens, chunks, pairs,
# tokens/s), peak resident memory (VmHWM) of every JVM of the run, sampled from /proc once a second
# (the Spark UI is off; the event log goes to DATA/events and is summarised too: the largest task's
# peak execution memory, shuffle and spill bytes), the load average, and the memory the naive
# computation would need (T x T scores per head, fp32).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
data="${DATA:-$root/examples/target/scale-data}" # inside the clone, never a fixed path elsewhere
case "$data" in /*) ;; *) data="$PWD/$data" ;; esac # absolute: it goes into file:// URIs and -D options
case "$data" in *[[:space:]]*) # LONGCTX_JAVA_OPTS below carries it, and the launcher splits that on spaces
  echo "scale-runs.sh: DATA $data holds a space; give DATA=/a/path/without/spaces" >&2; exit 2 ;;
esac
heap="${HEAP:-2g}"
out="${OUT:-$root/examples/target/bench-data/scale-runs.jsonl}"
longctx="$root/bin/longctx"
events="${EVENTS:-$data/events}"
# DATA is deleted by `clean` and written into by every run: only a folder this script made (its marker
# inside) or the default one, never a user's folder named by mistake.
case "${1:-}" in
  decode|ppl-balance|ppl-window|ppl-causal|ppl-overhead|cluster-decode|prefill|gen-prefill|scaling|all|clean) ;;
  *) sed -n '2,35p' "$0"; exit 2 ;;
esac
marker="$data/.made-by-scale-runs"
ours() { [ "$data" = "$root/examples/target/scale-data" ] || [ -e "$marker" ]; }
if [ -e "$data" ] && [ ! -d "$data" ]; then
  echo "scale-runs: DATA $data is not a folder" >&2
  exit 2
fi
if [ -n "$(ls -A "$data" 2>/dev/null)" ] && ! ours; then
  echo "scale-runs: DATA $data holds files this script did not make (no $(basename "$marker") in it): name a new" \
    "folder, or, if it is an earlier run's data, adopt it with: touch $marker" >&2
  exit 2
fi
# clean deletes the default DATA (inside the clone's target/) whole; in another DATA only what the marker
# lists, the names this script made there (a user's files put there later stay), then DATA if that empties it.
if [ "${1:-}" = clean ]; then
  [ -d "$data" ] || exit 0
  if ! ours; then echo "scale-runs: not deleting $data: this script did not make it" >&2; exit 2; fi
  if [ "$data" = "$root/examples/target/scale-data" ]; then rm -rf "$data"; echo "deleted $data" >&2; exit 0; fi
  while IFS= read -r n; do
    case "$n" in ""|.|..|*/*) continue ;; esac
    rm -rf -- "${data:?}/$n"
  done <"$marker"
  # A marker without names (written before the script recorded them, or adopted by hand with touch): the
  # names this script makes, by their patterns (a run's .log only beside its .peak.json).
  if [ ! -s "$marker" ]; then
    for n in "$data"/tmp "$data"/events "$data"/bench "$data"/ppl "$data"/spark-home "$data"/decode-[0-9]* \
        "$data"/prefill-[0-9]*; do
      [ -e "$n" ] && rm -rf -- "$n"
    done
    for n in "$data"/*.peak.json; do
      [ -e "$n" ] && rm -f -- "$n" "${n%.peak.json}.log"
    done
  fi
  if [ -z "$(ls -A "$data" | grep -vxF .made-by-scale-runs)" ]; then rm -f -- "$marker"; rmdir "$data"; echo "deleted $data" >&2
  else echo "scale-runs: deleted what it made in $data; kept what it did not make (and its marker):" \
    $(ls -A "$data" | grep -vxF .made-by-scale-runs) >&2; fi
  exit 0
fi
mkdir -p "$data/tmp" "$events" "$(dirname "$out")"
touch "$marker"
# made NAME...: records names this script made at DATA's top level, for clean.
made() {
  local n
  for n in "$@"; do grep -qxF -- "$n" "$marker" || echo "$n" >>"$marker"; done
}
made tmp
[ "$events" = "$data/events" ] && made events

# Every Spark JVM: heap capped, scratch under DATA, event log on. In local mode the driver IS the
# executor: spark.driver.memory cannot change a running JVM's heap, so -Xmx does it (the property is
# set too, for the record); on local-cluster spark.executor.memory caps the executor JVMs.
export LONGCTX_JAVA_OPTS="-Xmx$heap -Djava.io.tmpdir=$data/tmp ${LONGCTX_JAVA_OPTS:-}"
spark_conf=(--conf "spark.driver.memory=$heap" --conf "spark.local.dir=$data/tmp"
  --conf spark.eventLog.enabled=true --conf spark.eventLog.compress=false --conf "spark.eventLog.dir=file://$events"
  --conf spark.ui.showConsoleProgress=false)
# History: before eb1f3fd ScoreJob cached its chunk Dataset, and Spark's columnar cache built
# whole-partition batches of 32 MiB chunk rows: the 1M decode then ran out of a 2 GiB heap unless run
# with --partitions 256. Since then it passes with the defaults (docs/BENCHMARKS.md, Spark at scale).

# measure NAME NAIVE_BYTES CMD...: runs CMD, samples the VmHWM of it and every descendant JVM, then
# appends the JSON line to OUT (the job's stderr summary is parsed from its log).
measure() {
  local name="$1" naive="$2"
  shift 2
  local log="$data/$name.log" ev_before
  made "$name.log" "$name.peak.json"
  ev_before="$(ls "$events" | sort)"
  echo "== $name: $* (load $(cut -d' ' -f1-3 /proc/loadavg))" >&2
  local load0 t0 rc=0
  load0="$(cut -d' ' -f1 /proc/loadavg)"
  t0="$(date +%s.%N)"
  "$@" >"$log" 2>&1 &
  local pid=$!
  python3 "$root/examples/procpeak.py" "$pid" >"$data/$name.peak.json" &
  local sampler=$!
  # Background jobs of a script ignore INT: a Ctrl-C (or a TERM to this script) is passed on to the job,
  # which then ends as a signalled command does (its output written whole or not at all).
  trap 'kill -TERM "$pid" "$sampler" 2>/dev/null; wait "$pid" "$sampler" 2>/dev/null; exit 130' INT
  trap 'kill -TERM "$pid" "$sampler" 2>/dev/null; wait "$pid" "$sampler" 2>/dev/null; exit 143' TERM
  wait "$pid" || rc=$?
  wait "$sampler" || true
  trap - INT TERM
  local wall
  wall="$(python3 -c "import time; print(round(time.time() - $t0, 1))")"
  local ev_new
  ev_new="$(comm -13 <(echo "$ev_before") <(ls "$events" | sort) | sed "s|^|$events/|" | tr '\n' ' ')"
  python3 "$root/examples/procpeak.py" --report "$name" "$rc" "$wall" "$load0" "$(cut -d' ' -f1 /proc/loadavg)" \
    "$naive" "$log" "$data/$name.peak.json" $ev_new | tee -a "$out"
  tail -n 15 "$log" >&2
  return "$rc"
}

naive_bytes() { # T_q x T_k x heads x 4 B: the score matrix of the naive computation
  python3 -c "print($1 * $2 * $3 * 4)"
}

decode() {
  local tokens="${TOKENS:-1000000}"
  local d="$data/decode-$tokens" # one folder per size: a smaller corpus made earlier is never taken for this one
  made "decode-$tokens"
  if [ ! -d "$d/keys.parquet" ] || [ ! -d "$d/queries.parquet" ]; then
    measure "gen-decode-$tokens" 0 "$longctx" gen --docs 1 --tokens "$tokens" --heads 32 --kv-heads 8 --dim 128 \
      --queries-per-doc 64 --output "$d" --overwrite "${spark_conf[@]}" --master "local[2]"
  fi
  measure "decode-$tokens" "$(naive_bytes 64 "$tokens" 32)" "$longctx" score --keys "$d/keys.parquet" \
    --queries "$d/queries.parquet" --output "$d/out" --overwrite --dim 128 --causal --chunk-len 4096 \
    --partitions "${PARTITIONS:-16}" "${spark_conf[@]}" --master "local[2]"
}

# local-cluster[N,C,MB]: N executor JVMs of C cores and MB MiB each, started by the driver from a
# SPARK_HOME with an empty jars/ (the class path reaches the executors by extraClassPath; Spark adds
# its own module flags to executor command lines). The executor heap is spark.executor.memory.
cluster_conf=()
setup_cluster() {
  local home="$data/spark-home"
  made spark-home
  mkdir -p "$home/jars" "$home/launcher/target/scala-2.13"
  export SPARK_HOME="$home" SPARK_SCALA_VERSION=2.13
  cluster_conf=(--conf "spark.executor.extraClassPath=$root/spark-job/target/classes:$(cat "$root/spark-job/target/classpath.txt")"
    --conf "spark.executor.extraJavaOptions=-XX:+IgnoreUnrecognizedVMOptions --add-modules=jdk.incubator.vector -Dai.djl.offline=true -Djava.io.tmpdir=$data/tmp"
    --conf "spark.executor.memory=$heap")
}

heap_mb() {
  python3 -c "s='$heap'; print(int(s[:-1]) * (1024 if s[-1] in 'gG' else 1))"
}

cluster_decode() {
  local tokens="${TOKENS:-1000000}"
  local d="$data/decode-$tokens" # one folder per size: a smaller corpus made earlier is never taken for this one
  made "decode-$tokens"
  setup_cluster
  measure "cluster-decode-$tokens" "$(naive_bytes 64 "$tokens" 32)" "$longctx" score --keys "$d/keys.parquet" \
    --queries "$d/queries.parquet" --output "$d/out-cluster" --overwrite --dim 128 --causal --chunk-len 4096 \
    "${spark_conf[@]}" "${cluster_conf[@]}" --master "local-cluster[1,2,$(heap_mb)]"
}

gen_prefill() {
  local tokens="${PREFILL_TOKENS:-131072}"
  local d="$data/prefill-$tokens" # one folder per size
  made "prefill-$tokens"
  if [ ! -d "$d/keys.parquet" ]; then
    measure "gen-prefill-$tokens" 0 "$longctx" gen --docs 1 --tokens "$tokens" --heads 8 --kv-heads 8 --dim 128 \
      --queries-per-doc 0 --prefill --output "$d" --overwrite "${spark_conf[@]}" --master "local[2]"
  fi
}

prefill() {
  local tokens="${PREFILL_TOKENS:-131072}"
  local d="$data/prefill-$tokens" # one folder per size
  made "prefill-$tokens"
  gen_prefill
  measure "prefill-$tokens" "$(naive_bytes "$tokens" "$tokens" 8)" "$longctx" score --mode prefill \
    --keys "$d/keys.parquet" --output "$d/out" --overwrite --heads 8 --chunk-len 8192 --partitions "${PARTITIONS:-64}" \
    "${spark_conf[@]}" --master "local[2]"
}

scaling() {
  local tokens="${SCALING_TOKENS:-32768}"
  made bench
  for m in "local[1]" "local[2]"; do
    measure "spark-bench-$tokens-$m" "$(naive_bytes "$tokens" "$tokens" 8)" "$longctx" spark-bench --tokens "$tokens" \
      --heads 8 --kv-heads 2 --dim 64 --chunk-len 8192 --dir "$data/bench" "${spark_conf[@]}" --master "$m"
  done
  if [ -n "${CLUSTER:-}" ]; then # separate executor JVMs, one core each
    setup_cluster
    for n in 1 2; do
      measure "spark-bench-$tokens-cluster-$n" "$(naive_bytes "$tokens" "$tokens" 8)" "$longctx" spark-bench \
        --tokens "$tokens" --heads 8 --kv-heads 2 --dim 64 --chunk-len 8192 --dir "$data/bench" "${spark_conf[@]}" \
        "${cluster_conf[@]}" --master "local-cluster[$n,1,$(heap_mb)]"
    done
  fi
}

# gen_ppl_model DIR TYPE LAYERS [WINDOW]: the benchmark model (seeded, bf16 weights).
gen_ppl_model() {
  local dir="$1" type="$2" layers="$3" window="${4:-}"
  [ -f "$dir/config.json" ] && return 0
  "$root/bin/longctx" gen-model --output "$dir" --model-type "$type" --layers "$layers" --hidden 512 --heads 8 \
    --kv-heads 2 --vocab 4096 --seed 7 ${window:+--sliding-window "$window"}
}

# gen_tokens FILE TOKENS: one JSON line, doc_id "doc" and seeded random token ids below 4096.
gen_tokens() {
  [ -f "$1" ] && return 0
  python3 -c "
import random, sys
random.seed(7)
n = int(sys.argv[2])
with open(sys.argv[1] + '.tmp', 'w') as f:
    f.write('{\"doc_id\": \"doc\", \"tokens\": [' + ','.join(str(random.randrange(4096)) for _ in range(n)) + ']}\n')
" "$1" "$2"
  mv "$1.tmp" "$1"
}

# ppl_run NAME MODEL DOCS MASTER [ppl options...]: one measured ppl run, chunks of CHUNK tokens
# (default 4096).
ppl_run() {
  local name="$1" model="$2" docs="$3" master="$4"
  shift 4
  measure "$name" 0 "$longctx" ppl --model "$model" --input "$docs" --output "$data/ppl/out-$name" --overwrite \
    --chunk-len "${CHUNK:-4096}" "$@" "${spark_conf[@]}" --master "$master"
}

# ppl_long NAME TYPE TOKENS LAYERS [WINDOW]: one long document split over the default tasks per layer.
ppl_long() {
  local name="$1" type="$2" tokens="$3" layers="$4" window="${5:-}" d="$data/ppl"
  made ppl
  mkdir -p "$d"
  gen_ppl_model "$d/$type-$layers" "$type" "$layers" "$window"
  gen_tokens "$d/doc-$tokens.jsonl" "$tokens"
  ppl_run "$name-$tokens-$layers" "$d/$type-$layers" "$d/doc-$tokens.jsonl" "local[2]" --split-above 0 \
    ${PARTITIONS:+--split-partitions "$PARTITIONS"}
}

ppl_overhead() {
  local tokens="${PPL_TOKENS:-32768}" layers="${PPL_LAYERS:-8}" d="$data/ppl"
  made ppl
  mkdir -p "$d"
  gen_ppl_model "$d/mistral-$layers" mistral "$layers" 4096
  gen_tokens "$d/doc-$tokens.jsonl" "$tokens"
  local m
  for m in "local[1]" "local[2]"; do
    ppl_run "ppl-one-task-$tokens-$m" "$d/mistral-$layers" "$d/doc-$tokens.jsonl" "$m" --split-above 1000000000
    ppl_run "ppl-split-$tokens-$m" "$d/mistral-$layers" "$d/doc-$tokens.jsonl" "$m" --split-above 0 \
      --split-partitions 8
  done
  ppl_run "ppl-split-contiguous-$tokens-local[2]" "$d/mistral-$layers" "$d/doc-$tokens.jsonl" "local[2]" \
    --split-above 0 --split-partitions 8 --balance contiguous
  if [ -n "${CLUSTER:-}" ]; then
    setup_cluster
    ppl_run "ppl-split-$tokens-cluster-2" "$d/mistral-$layers" "$d/doc-$tokens.jsonl" \
      "local-cluster[2,1,$(heap_mb)]" --split-above 0 --split-partitions 8 "${cluster_conf[@]}"
  fi
}

# Causal work per block grows with its index: 16 blocks over 2 tasks (one wave on local[2]) placed by
# cost vs contiguously.
# Tasks of one thread each (the kernels' pool and libtorch), as on executors of one core: with
# threads to spare, a lone heavy task would borrow the idle core and hide the imbalance.
ppl_balance() {
  local tokens="${PPL_TOKENS:-32768}" d="$data/ppl"
  made ppl
  mkdir -p "$d"
  gen_ppl_model "$d/llama-2" llama 2
  gen_tokens "$d/doc-$tokens.jsonl" "$tokens"
  local b
  for b in cost contiguous; do
    OMP_NUM_THREADS=1 LONGCTX_JAVA_OPTS="$LONGCTX_JAVA_OPTS -XX:ActiveProcessorCount=1" CHUNK=2048 ppl_run "ppl-balance-$b-$tokens-local[2]" "$d/llama-2" "$d/doc-$tokens.jsonl" "local[2]" \
      --split-above 0 --split-partitions 2 --balance "$b"
  done
}

case "${1:-}" in
  decode) decode ;;
  ppl-balance) ppl_balance ;;
  ppl-window) ppl_long ppl-window mistral "${PPL_TOKENS:-1000000}" "${PPL_LAYERS:-8}" 4096 ;;
  ppl-causal) ppl_long ppl-causal llama "${PPL_TOKENS:-131072}" "${PPL_LAYERS:-2}" ;;
  ppl-overhead) ppl_overhead ;;
  cluster-decode) cluster_decode ;;
  prefill) prefill ;;
  gen-prefill) gen_prefill ;;
  scaling) scaling ;;
  all) decode; prefill; scaling ;;
esac
