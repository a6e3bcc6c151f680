#!/usr/bin/env bash
# Reruns the placement simulation of docs/PLACEMENT.md: the 90-job trace on 4 GPUs for every
# policy with and without sharing (summary and time series, the plot), then the sensitivity
# runs (SM limit, memory margin, recovery rule, CPU cores, the slowdown model before
# calibration), the policy comparison on ten traces, the 150 traces of placement_families.py and
# the scale benchmark. CPU only, ~3 min.
# The tables go to docs/results/placement/, the CSVs the plot is drawn from (simulate --out) to
# benchmarks/data/placement/.
#   scripts/simulate_placement.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-build}/tools/coloader
out=docs/results/placement
raw=benchmarks/data/placement
trace=examples/trace90.json
"$bin" simulate --trace "$trace" --gpus 4 --out "$raw" > "$out/summary.txt"
/usr/bin/python3 scripts/plot_placement.py "$raw" docs/placement.png
{
  echo "# $bin simulate --trace $trace --gpus 4 --policy sharing-aware --sm-limit L"
  for l in auto 0.8 1.0 1.2 1.5; do
    echo "## sm-limit $l"
    "$bin" simulate --trace "$trace" --gpus 4 --policy sharing-aware --sm-limit "$l" | tail -n +3
  done
  echo "## all policies, --memory-margin 0 (reservations at the bare estimate; limits with their headroom)"
  "$bin" simulate --trace "$trace" --gpus 4 --memory-margin 0 | tail -n +3
  echo "## all policies, --memory-margin 0 --no-headroom (each job limited to its bare estimate)"
  "$bin" simulate --trace "$trace" --gpus 4 --memory-margin 0 --no-headroom | tail -n +3
  for r in grow alone; do
    echo "## all policies, --memory-margin 0 --no-headroom --recovery $r"
    "$bin" simulate --trace "$trace" --gpus 4 --memory-margin 0 --no-headroom --recovery "$r" | tail -n +3
  done
  for c in 32 128; do
    echo "## all policies, --cpu-cores $c"
    "$bin" simulate --trace "$trace" --gpus 4 --cpu-cores "$c" | tail -n +3
  done
  echo "## all policies, the slowdown model before calibration (--interference 0.03 --sm-saturation 0.9)"
  "$bin" simulate --trace "$trace" --gpus 4 --interference 0.03 --sm-saturation 0.9 | tail -n +3
} > "$out/sensitivity.txt"
/usr/bin/python3 scripts/compare_policies.py --coloader "$bin" > "$out/policies.md"
/usr/bin/python3 scripts/placement_families.py --coloader "$bin" --out "$out/families" > /dev/null
/usr/bin/python3 benchmarks/placement_scale.py --coloader "$bin" > "$out/scale_devbox.txt"
cat "$out/summary.txt"
