#!/usr/bin/env bash
# Spark GPU discovery script for executors (spark.executor.resource.gpu.discoveryScript): prints the
# GPUs this executor's CUDA sees, as Spark expects, e.g. {"name": "gpu", "addresses": ["0", "1"]}.
# The addresses are CUDA device ordinals (longctx opens the one Spark assigns to each task): 0..n-1
# over the GPUs nvidia-smi lists, or over CUDA_VISIBLE_DEVICES where that is set (CUDA then numbers
# only those). A failing nvidia-smi is an error (exit 1, its message on stderr), never its text
# taken for addresses.
set -euo pipefail
count=0
if [ -n "${CUDA_VISIBLE_DEVICES+set}" ]; then
  IFS=',' read -r -a visible <<< "$CUDA_VISIBLE_DEVICES"
  for v in "${visible[@]}"; do
    [ -n "${v//[[:space:]]/}" ] && count=$((count + 1))
  done
elif command -v nvidia-smi >/dev/null 2>&1; then
  if ! listed="$(nvidia-smi --query-gpu=index --format=csv,noheader 2>&1)"; then
    echo "gpu-discovery.sh: nvidia-smi failed: $listed" >&2
    exit 1
  fi
  while read -r index; do
    index="${index//[[:space:]]/}"
    [ -n "$index" ] || continue
    case "$index" in
      *[!0-9]*) echo "gpu-discovery.sh: nvidia-smi listed '$index', not a GPU index" >&2; exit 1 ;;
    esac
    count=$((count + 1))
  done <<< "$listed"
fi
addresses=""
for ((i = 0; i < count; i++)); do
  addresses="${addresses:+$addresses, }\"$i\""
done
echo "{\"name\": \"gpu\", \"addresses\": [$addresses]}"
