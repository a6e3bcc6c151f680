#!/usr/bin/env bash
# On the GPU machine: `coloader launch examples/jobs_gpu.json` (three ResNet-18 jobs sharing one
# producer under MPS) while nvidia-smi is sampled, then a check that measured memory stayed
# within the plan's bounds. Uses the binaries that scripts/gpu_bundle.sh packed into .device/
# (scripts/gpu/env.sh); writes everything under $OUT/launch_check (default ./out/launch_check).
#   scripts/gpu.sh launch [JOBS.json]
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/env.sh
# The package from this checkout (with .device's binaries; the wheel's suites set their own).
if [[ -z ${COLOADER_WHEEL_SITE:-} ]]; then export PYTHONPATH="$here/python${PYTHONPATH:+:$PYTHONPATH}"; fi
out=$out/launch_check
mkdir -p "$out"
data=/tmp/coloader-imagenet-like
if [[ ! -d $data ]]; then
  python3 scripts/make_dataset.py --source "$here/.device/photos" --out "$data" --images "${IMAGES:-6000}" --classes 100 \
    > "$out/make_dataset.log" 2>&1 || { echo "dataset generation failed: $out/make_dataset.log"; exit 1; }
fi
exec python3 scripts/gpu/launch_check.py --jobs "${1:-examples/jobs_gpu.json}" --binary "$COLOADER_BINARY" --out "$out"
