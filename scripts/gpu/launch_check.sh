#!/usr/bin/env bash
# On the GPU machine: `coloader launch examples/jobs_gpu.json` (three ResNet-18 jobs sharing one
# producer under MPS) while nvidia-smi is sampled, then a check that measured memory stayed
# within the plan's bounds. Uses the binaries that scripts/gpu_bundle.sh packed into .device/
# (or $BUNDLE); writes everything under $OUT/launch_check (default ./out/launch_check).
#   scripts/gpu.sh launch [JOBS.json]
set -uo pipefail
cd "$(dirname "$0")/../.."
here=$(pwd)
bundle=${BUNDLE:-$here/.device}
export LD_LIBRARY_PATH="$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export COLOADER_BINARY=${COLOADER_BINARY:-$bundle/bin/coloader}
export COLOADER_LIBRARY=${COLOADER_LIBRARY:-$bundle/lib/libcoloader_c.so}
export COLOADER_PRODUCER_LIBRARY=${COLOADER_PRODUCER_LIBRARY:-$bundle/lib/libcoloader_producer_c.so}
export PYTHONPATH="$here/python${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
out=${OUT:-$here/out}/launch_check
mkdir -p "$out"
data=/tmp/coloader-imagenet-like
if [[ ! -d $data ]]; then
  python3 scripts/make_dataset.py --source "$bundle/photos" --out "$data" --images "${IMAGES:-6000}" --classes 100 \
    > "$out/make_dataset.log" 2>&1 || { echo "dataset generation failed: $out/make_dataset.log"; exit 1; }
fi
exec python3 scripts/gpu/launch_check.py --jobs "${1:-examples/jobs_gpu.json}" --binary "$COLOADER_BINARY" --out "$out"
