#!/usr/bin/env bash
# On the GPU machine: the placement replay (scripts/gpu/replay.py): examples/replay_gpu.json
# through `coloader launch` under MPS, fifo-exclusive (REPLAY_PHASE=fifo) or the default policy
# with simulate's prediction beside it (REPLAY_PHASE=default, FIFO_SUMMARY=the fifo phase's
# summary.json). Uses the binaries that scripts/gpu_bundle.sh packed into .device/
# (scripts/gpu/env.sh) and the package from python/; writes under $OUT/replay.
#   REPLAY_PHASE=fifo scripts/gpu.sh replay
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/env.sh
# The package from this checkout (with .device's binaries; the wheel's suites set their own).
if [[ -z ${COLOADER_WHEEL_SITE:-} ]]; then export PYTHONPATH="$here/python${PYTHONPATH:+:$PYTHONPATH}"; fi
out=$out/replay
mkdir -p "$out"
# The two datasets the jobs file's pipelines read.
for spec in "/tmp/coloader-imagenet-like 6000 100" "/tmp/coloader-second 4000 50"; do
  read -r data images classes <<<"$spec"
  if [[ ! -d $data ]]; then
    python3 scripts/make_dataset.py --source "$here/.device/photos" --out "$data" --images "$images" --classes "$classes" \
      > "$out/make_dataset-$(basename "$data").log" 2>&1 || { echo "dataset generation failed: $out"; exit 1; }
  fi
done
phase=${REPLAY_PHASE:-fifo}
exec python3 scripts/gpu/replay.py --phase "$phase" --binary "$COLOADER_BINARY" --out "$out" \
  ${FIFO_SUMMARY:+--fifo-summary "$FIFO_SUMMARY"} --timeout-s "${REPLAY_TIMEOUT_S:-500}"
