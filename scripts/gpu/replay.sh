#!/usr/bin/env bash
# On the GPU machine: the placement replay (scripts/gpu/replay.py): examples/replay_gpu.json
# through `coloader launch` under MPS. One phase per device command:
#   REPLAY_PHASE=fifo [REPLAY_PART=K/N]     fifo-exclusive (the K-th of N slices of the jobs)
#   REPLAY_PHASE=activity                   each job configuration's sm_activity under MPS
#   REPLAY_PHASE=default FIFO_SUMMARY="a.json [b.json]" [REPLAY_ACTIVITY=activity.csv]
#                        [REPLAY_LABEL=default-2]
#                                           the default policy beside simulate's prediction
# Uses the binaries that scripts/gpu_bundle.sh packed into .device/ (scripts/gpu/env.sh) and the
# package from python/; writes under $OUT/replay.
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/env.sh
# The package from this checkout (with .device's binaries; the wheel's suites set their own).
if [[ -z ${COLOADER_WHEEL_SITE:-} ]]; then export PYTHONPATH="$here/python${PYTHONPATH:+:$PYTHONPATH}"; fi
out=$out/replay
mkdir -p "$out"
phase=${REPLAY_PHASE:-fifo}
# The two datasets the jobs file's pipelines read (the activity phase's steps need none).
if [[ $phase != activity ]]; then
  for spec in "/tmp/coloader-imagenet-like 6000 100" "/tmp/coloader-second 4000 50"; do
    read -r data images classes <<<"$spec"
    if [[ ! -d $data ]]; then
      python3 scripts/make_dataset.py --source "$here/.device/photos" --out "$data" --images "$images" --classes "$classes" \
        > "$out/make_dataset-$(basename "$data").log" 2>&1 || { echo "dataset generation failed: $out"; exit 1; }
    fi
  done
fi
# shellcheck disable=SC2086  # FIFO_SUMMARY is a list of paths
exec python3 scripts/gpu/replay.py --phase "$phase" --binary "$COLOADER_BINARY" --out "$out" \
  --part "${REPLAY_PART:-1/1}" --label "${REPLAY_LABEL:-default}" ${REPLAY_ACTIVITY:+--activity "$REPLAY_ACTIVITY"} \
  ${FIFO_SUMMARY:+--fifo-summary $FIFO_SUMMARY} --timeout-s "${REPLAY_TIMEOUT_S:-560}"
