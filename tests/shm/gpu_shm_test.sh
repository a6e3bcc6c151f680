#!/usr/bin/env bash
# The device-path variant of tests/shm/shm_limits_test.py, for the GPU machine (issue 17): a
# --device producer in a private mount namespace with a 48 MB /dev/shm. The issue's batch-256
# float32 ring lives on the GPU there, so only its uint8 staging must fit /dev/shm (~221 MiB
# for 6 slots: still too big, and said so); a small ring serves exact epochs on the device
# path; with /dev/shm filled to the last byte the producer and its device consumers carry on, a
# host-path consumer of that GPU ring is refused clearly, a second producer fails clearly.
# Run from the repository root after scripts/gpu_bundle.sh; the log lands in $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/env.sh
python3 tests/shm/shm_limits_test.py --coloader "$COLOADER_BINARY" --device cuda:0 --shm-mb 48 2>&1 |
  tee "$out/shm_limits_gpu.log"
exit "${PIPESTATUS[0]}"
