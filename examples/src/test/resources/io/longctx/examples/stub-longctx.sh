#!/usr/bin/env bash
# A stand-in for bin/longctx in ScriptsTest: writes what the real commands write, at once, so the
# example scripts' own shell (pipes, pipefail, quoting) runs in CI without Spark or a build.
set -euo pipefail
cmd="$1"; shift
if [ -n "${STUB_ARGS:-}" ]; then echo "$cmd $*" >> "$STUB_ARGS"; fi # what a script asked for, for the test to read
out=""
while [ $# -gt 0 ]; do
  case "$1" in --output) out="$2"; shift ;; esac
  shift
done
case "$cmd" in
  gen)
    mkdir -p "$out"
    echo '{}' > "$out/keys.jsonl"
    ;;
  score)
    # 16 part files of 300 rows (~300 KB, several pipe buffers): a reader that stops early leaves
    # the writer blocked mid-stream, which is when `cat | head` under pipefail exits 141
    mkdir -p "$out"
    row='"doc_id": "doc-1", "o": [0.125, -0.5, 0.25, 1.0], "lse": [3.5, "-Infinity"], "n_keys": 4096}'
    for p in $(seq -w 0 15); do
      for i in $(seq 1 300); do echo "{\"query_id\": \"q-$p-$i\", $row"; done > "$out/part-000$p.json"
    done
    ;;
  bench)
    echo "# a header line that is not JSON"
    for impl in java op libtorch-sdpa; do
      echo "{\"impl\": \"$impl\", \"op\": \"forward\", \"t\": 1024, \"ms\": 1.5, \"vs_anchor\": 1.0}"
    done
    ;;
  *) echo "stub-longctx: unexpected command $cmd" >&2; exit 2 ;;
esac
