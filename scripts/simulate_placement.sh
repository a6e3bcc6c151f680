#!/usr/bin/env bash
# Reruns the placement simulation of docs/PLACEMENT.md: the 90-job trace on 4 GPUs for every
# policy with and without sharing (summary and time series, the plot), then the sensitivity
# runs (SM limit, CPU cores, the slowdown model before calibration). CPU only, ~1 min.
#   scripts/simulate_placement.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-build}/tools/coloader
out=docs/results/placement
trace=examples/trace90.json
"$bin" simulate --trace "$trace" --gpus 4 --out "$out" > "$out/summary.txt"
/usr/bin/python3 scripts/plot_placement.py "$out" docs/placement.png
{
  echo "# $bin simulate --trace $trace --gpus 4 --policy sharing-aware --sm-limit L"
  for l in 0.6 0.8 1.0 1.2; do
    echo "## sm-limit $l"
    "$bin" simulate --trace "$trace" --gpus 4 --policy sharing-aware --sm-limit "$l" | tail -n +3
  done
  for c in 32 128; do
    echo "## all policies, --cpu-cores $c"
    "$bin" simulate --trace "$trace" --gpus 4 --cpu-cores "$c" | tail -n +3
  done
  echo "## all policies, the slowdown model before calibration (--interference 0.03 --sm-saturation 0.9)"
  "$bin" simulate --trace "$trace" --gpus 4 --interference 0.03 --sm-saturation 0.9 | tail -n +3
} > "$out/sensitivity.txt"
cat "$out/summary.txt"
