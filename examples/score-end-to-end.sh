#!/usr/bin/env bash
# End-to-end example of the Spark scoring job (bin/longctx score), on the embedded local[*] Spark.
#
#   examples/score-end-to-end.sh [WORKDIR]
#
# 1. generates a corpus: 2 documents (20,000 and 5,000 tokens), 8 query heads over 2 kv heads
#    (GQA), head dim 64, 6 queries per document, as JSON Lines;
# 2. scores the queries causally with a 1,024-token sliding window (decode mode);
# 3. scores every token of every document as a causal query over its own document (prefill mode,
#    Parquet, on a smaller corpus);
# 4. shows a few output rows. Any extra arguments go to both score runs (e.g. --master URL; one the
#    script already gives, such as --chunk-len, is refused as given twice).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
made_work=""
case "${1:-}" in # WORKDIR first, if given: a leading option is not a folder name (--master made ./--master)
  -*) echo "score-end-to-end.sh: give WORKDIR before the score options (or no WORKDIR): $1" >&2; exit 2 ;;
esac
if [ -n "${1:-}" ]; then work="$1"; else work="$(mktemp -d -t longctx-example-XXXXXX)"; made_work=1; fi
shift || true
if [ -n "$made_work" ]; then # a failed step leaves its folder: say where
  trap 'rc=$?; [ $rc -ne 0 ] && echo "score-end-to-end.sh: failed (exit $rc); its files are in $work" >&2' EXIT
fi
# LONGCTX names another launcher (the script test uses a stub that writes outputs at once)
longctx="${LONGCTX:-$root/bin/longctx}"

echo "== 1. corpus (JSON Lines) in $work/corpus"
"$longctx" gen --docs 2 --tokens 20000 --min-tokens 5000 --heads 8 --kv-heads 2 --dim 64 \
  --queries-per-doc 6 --format json --output "$work/corpus" --overwrite

echo "== 2. decode: causal, window 1024, chunks of 4096 tokens (every 4th query has no pos: it attends the whole document)"
"$longctx" score --keys "$work/corpus/keys.jsonl" --queries "$work/corpus/queries.jsonl" \
  --output "$work/scores.jsonl" --overwrite --dim 64 --causal --window 1024 --chunk-len 4096 "$@"

echo "== 3. prefill: every token a causal query (Parquet)"
"$longctx" gen --docs 2 --tokens 4096 --min-tokens 1000 --heads 8 --kv-heads 2 --dim 64 \
  --queries-per-doc 0 --prefill --output "$work/prefill-corpus" --overwrite
"$longctx" score --mode prefill --keys "$work/prefill-corpus/keys.parquet" \
  --output "$work/prefill-scores.parquet" --overwrite --heads 8 --chunk-len 1024 "$@"

echo "== 4. a few decode results (query_id, doc_id, n_keys, lse of head 0)"
# Python reads the part files itself and stops after 6 rows: no `cat | head` pipe, whose writer
# dies of SIGPIPE (exit 141 under pipefail) whenever head quits before cat has written everything.
python3 - "$work"/scores.jsonl/part-*.json <<'PY'
import itertools, json, sys
def lines():
    for path in sys.argv[1:]:
        with open(path) as f:
            yield from (l for l in f if l.strip())
for line in itertools.islice(lines(), 6):
    r = json.loads(line)
    print("{:<18} {:<10} n_keys={:<6} lse[0]={}  o[:3]={}".format(
        r["query_id"], r["doc_id"], r["n_keys"], r["lse"][0], [round(x, 4) for x in r["o"][:3]]))
PY
echo
echo "outputs: $work/scores.jsonl (JSON Lines), $work/prefill-scores.parquet (Parquet)"
echo "inputs and outputs take $(du -sh "$work" | cut -f1) in $work${made_work:+ (a temp folder made for this run: rm -r $work when done)}"
