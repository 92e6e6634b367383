#!/usr/bin/env bash
# Spark GPU discovery script for executors (spark.executor.resource.gpu.discoveryScript): prints the
# GPUs of this machine as Spark expects, e.g. {"name": "gpu", "addresses": ["0", "1"]}. The indices
# are CUDA device ordinals; longctx opens the one Spark assigns to each task.
set -euo pipefail
addresses=""
if command -v nvidia-smi >/dev/null 2>&1; then
  while read -r index; do
    index="${index//[[:space:]]/}"
    [ -n "$index" ] || continue
    addresses="${addresses:+$addresses, }\"$index\""
  done < <(nvidia-smi --query-gpu=index --format=csv,noheader)
fi
echo "{\"name\": \"gpu\", \"addresses\": [$addresses]}"
