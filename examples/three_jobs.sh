#!/usr/bin/env bash
# One producer, three training jobs: what a user launches on a GPU shared by three jobs.
#   examples/three_jobs.sh DATA_DIR [more `coloader serve` flags, e.g. --device cuda:0]
#   TRAIN_ARGS="--steps 20 --amp" examples/three_jobs.sh DATA_DIR --device cuda:0
# The producer decodes and augments every batch once; each job (examples/train.py) consumes
# it with its own batch size. The jobs start together with the producer and wait for it; the
# first epoch begins when all three are attached (--min-consumers 3), so each sees it whole.
set -euo pipefail
cd "$(dirname "$0")/.."
data=${1:?usage: examples/three_jobs.sh DATA_DIR [coloader serve flags]}
shift
serve_flags=("$@")
bin=${COLOADER_BINARY:-build/tools/coloader}
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
python=${PYTHON:-python3}
job_device=cpu
[[ " ${serve_flags[*]:-} " == *" cuda"* ]] && job_device=cuda
read -r -a train_args <<< "${TRAIN_ARGS:-}"

"$bin" serve --data "$data" --name three-jobs --batch-size 128 --epochs 2 --min-consumers 3 \
  --window 6 --quiet "${serve_flags[@]}" &
producer=$!
trap 'kill $producer 2>/dev/null || true' EXIT

pids=()
for b in 128 64 96; do
  "$python" examples/train.py --loader coloader --name three-jobs --batch-size "$b" --epochs 2 \
    --device "$job_device" --log-every 1000 ${train_args[@]+"${train_args[@]}"} 2>&1 | sed "s/^/[job batch $b] /" &
  pids+=($!)
done
wait "${pids[@]}"
wait $producer
echo "three jobs done; one producer decoded every image once per epoch"
