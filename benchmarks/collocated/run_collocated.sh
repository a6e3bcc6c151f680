#!/usr/bin/env bash
# Runs on the GPU machine: the collocated-training benchmark (collocated.py, beside this file) in
# one command, from a copy of the repository carrying .device/ (scripts/gpu_bundle.sh) and .whl/
# (benchmarks/fetch_wheels.sh: TensorSocket, pyzmq, tornado).
#
#   benchmarks/collocated/run_collocated.sh --quick   (or --full, --tiny; further collocated.py flags follow)
#
# Issue 16's matrix (synthetic / coloader-gpudecode / coloader / dataloader, N = 1, 2, 4,
# ResNet-18 and -50, 3 repeats) is five device commands, each under 10 minutes (15 configurations
# of ~20 s, and the dataset: keep it small):
#   COLLOCATED_IMAGES=5000 benchmarks/collocated/run_collocated.sh --gpudecode --stage-times --thread-states \
#     --shard K/5 --deadline 430                                                        (K = 1..5)
# then, here, `benchmarks/collocated/collocated.py --report OUT1 ... OUT5` merges them (median and
# spread of the repeats, the producer's CPU per kind of thread, its stage timers).
#
# Makes the ImageNet-like dataset from the carried photographs (20,000 images, 1000 classes;
# COLLOCATED_IMAGES to change) and a small one for the fairness pass, then runs the matrix.
# Writes under $OUT (default ./out): results.csv, results.md, throughput.png, cpu.png,
# gpu_mem.png, run.log, and runs.tar.gz (every process's log, each job's JSON, meta.json,
# fairness.json): seven files, within what the device tool brings back.
set -uo pipefail
cd "$(dirname "$0")/../.."  # the repository root
source scripts/gpu/env.sh
log="$out/run.log"
: >"$log"

if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/collocated-site \
    .whl/*.whl 2>&1 | grep -v "running pip as the 'root'" | tee -a "$log"
  export PYTHONPATH=/tmp/collocated-site${PYTHONPATH:+:$PYTHONPATH}
else
  echo "run_collocated: no wheels in .whl/ (benchmarks/fetch_wheels.sh): the tensorsocket setup will fail" | tee -a "$log"
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$log"
python3 -c 'import torch, torchvision; print("torch", torch.__version__, "torchvision", torchvision.__version__)' | tee -a "$log"

data=${COLLOCATED_DATA:-/tmp/collocated-imagenet}
fair=/tmp/collocated-fair
images=${COLLOCATED_IMAGES:-20000}
[[ -d $data ]] || python3 scripts/make_dataset.py --source .device/photos --out "$data" \
  --images "$images" --classes $((images < 1000 ? images : 1000)) 2>/dev/null | tee -a "$log"
[[ -d $fair ]] || python3 scripts/make_dataset.py --source .device/photos --out "$fair" --images 2600 \
  --classes 100 --seed 1 2>/dev/null | tee -a "$log"

python3 benchmarks/collocated/collocated.py --data "$data" --fair-data "$fair" --out "$out/collocated" "$@" 2>&1 | tee -a "$log"
status=${PIPESTATUS[0]}
for f in results.csv results.md throughput.png cpu.png gpu_mem.png; do
  [[ -f $out/collocated/$f ]] && mv "$out/collocated/$f" "$out/"
done
tar czf "$out/runs.tar.gz" -C "$out/collocated" . && rm -rf "$out/collocated"
exit "$status"
