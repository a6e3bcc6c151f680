#!/usr/bin/env bash
# On the GPU machine: the real caching allocator's history of each configuration of
# benchmarks/memory_ground_truth.py, replayed through the estimator's allocator model
# (benchmarks/allocation_replay.py). Needs only the checkout and the machine's torch. Writes
# $OUT/allocation_replay.csv and .log and the histories as allocation_traces_K.tar (five at
# most: the device returns eight files); the loose .npz files stay in /tmp.
#   ALLOC_TIME_BUDGET   seconds after which no configuration starts (default 300)
#   ALLOC_JOBS          processes at once (default 12)
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-$(pwd)/out}
mkdir -p "$out"
# Admit by this GPU's memory (an H100 has 80 GB, an H200 141): 85% of it.
total_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
budget=$((${total_mib:-81559} * 85 / 100))
traces=$(mktemp -d /tmp/allocation_traces.XXXX)
exec python3 benchmarks/allocation_replay.py --out "$out/allocation_replay.csv" --trace-dir "$traces" --max-tars 5 \
  --jobs "${ALLOC_JOBS:-12}" --budget-mib "$budget" --time-budget "${ALLOC_TIME_BUDGET:-300}"
