#!/usr/bin/env bash
# Issue 24 on one GPU in one device command: --decode auto (the JPEG engines and the CPU workers
# splitting each batch as demand requires) beside gpu (the engines alone) and cpu, on data with
# ImageNet's mix of formats, against the synthetic ceiling of the same run.
#
#   0. tests (SPLIT_TESTS=0 skips): gpu_decode_test, and gpu_test's decode and --cpu-share cases.
#   1. decode alone as an MPS client (no training; SPLIT_ALONE=0 skips): serve --decode auto / gpu
#      / cpu drained by one `consume --device`, 3 epochs: images/s per epoch, the split it settled on.
#   2. training under MPS: benchmarks/collocated/collocated.py --split for each model of SPLIT_MODELS
#      (default resnet18) at SPLIT_N (default 1,2,4), setups SPLIT_SETUPS (default synthetic,
#      coloader-auto, coloader-gpudecode, coloader), SPLIT_REPEATS repeats (default 1);
#      SPLIT_LANES2=1 adds --gpu-lanes 2 to gpu and auto at N=1 as variants; SPLIT_CONTENTION=1
#      runs synthetic jobs beside busy loops, then loops and producers at niceness 19 (N=1);
#      SPLIT_SHARES=0.25,0.35 runs auto with those fixed --cpu-share values (N=1); SPLIT_NHWC=1 runs
#      auto and cpu with --layout nhwc (N=1: the job's channels_last input without a transpose);
#      SPLIT_DRAIN_MS paces the synthetic+*decode setups' drain (collocated.py --drain-step-ms);
#      SPLIT_JOB_PYTHON=DIR runs auto and cpu again (N=1, variant "jobpy") with the jobs importing
#      the coloader package under DIR (e.g. an earlier commit's python/: its hand-off against this one).
#   3. summary.md: the targets (scripts/gpu/split_targets.py), every row (collocated.py
#      --report), the split each auto producer settled on (its closing line).
#
# Here first: build, then scripts/gpu_bundle.sh; carry .device. Writes under $OUT: summary.md,
# results.csv, split.log, tests.log, runs.tgz.
#   scripts/gpu.sh split          SPLIT_BUDGET_S (default 540) bounds the whole run
# SPLIT_DEVICE=cpu tries the script's paths on a machine without a GPU (nothing it measures
# means anything there).
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/env.sh
root=$out
suite_clock split split.log "${SPLIT_BUDGET_S:-540}"
work=$(mktemp -d /tmp/decode-split.XXXXXX)
on_gpu() { [[ ${SPLIT_DEVICE:-cuda} != cpu ]]; }

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee -a "$log"
nproc | sed 's/^/cores: /' | tee -a "$log"

# -- 0. tests --------------------------------------------------------------------------------
if on_gpu && [[ ${SPLIT_TESTS:-1} != 0 ]]; then
  : >"$root/tests.log"
  for t in gpu_decode_test "gpu_test --gtest_filter=*GpuDecode*:*CpuShare*"; do
    bin=${t%% *}
    [[ -x .device/bin/$bin ]] || { say "no .device/bin/$bin"; continue; }
    say "== 0. $t"
    # shellcheck disable=SC2086
    timeout 240 .device/bin/$t >>"$root/tests.log" 2>&1
    say "$bin: exit $?"
  done
  grep -E '^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED  \]' "$root/tests.log" | tee -a "$log"
fi

# -- data ------------------------------------------------------------------------------------
data=${SPLIT_DATA:-/tmp/decode-split-data}
images=${SPLIT_IMAGES:-5000}
if [[ ! -d $data ]]; then
  say "making $images images with ImageNet's mix of formats from .device/photos"
  python3 scripts/make_dataset.py --source .device/photos --out "$data" --images "$images" \
    --classes $((images < 1000 ? images : 1000)) \
    --imagenet-mix 2>/dev/null | tee -a "$log"
fi

# -- 1. decode alone as an MPS client ----------------------------------------------------------
serve_dev=(--device cuda:0)
consume_dev=(--device)
on_gpu || { serve_dev=(); consume_dev=(); }
mps=
if on_gpu && command -v nvidia-cuda-mps-control >/dev/null; then
  mps=$(mktemp -d /tmp/decode-split-mps.XXXXXX)
  mkdir -p "$mps/pipe" "$mps/log"
  export CUDA_MPS_PIPE_DIRECTORY=$mps/pipe CUDA_MPS_LOG_DIRECTORY=$mps/log
  nvidia-cuda-mps-control -d >>"$log" 2>&1 || { say "no MPS daemon: decode alone runs outside MPS"; mps=; }
fi
say "== 1. decode alone${mps:+ (an MPS client)}"
{
  echo "| --decode | consumer img/s, each epoch | producer CPU s | what decoded | split |"
  echo "| --- | ---: | ---: | --- | --- |"
} >"$work/alone.md"
alone_modes=(auto gpu cpu)
[[ ${SPLIT_ALONE:-1} == 0 ]] && alone_modes=()
for mode in "${alone_modes[@]}"; do
  on_gpu || [[ $mode == cpu ]] || continue
  d=$work/alone/$mode
  mkdir -p "$d"
  "$COLOADER_BINARY" serve --data "$data" --name "split-$mode" --batch-size 128 --epochs 3 "${serve_dev[@]}" \
    --decode "$mode" --output float32 --workers "$(($(nproc) > 3 ? $(nproc) - 2 : 1))" --quiet 2>"$d/serve.log" &
  pid=$!
  timeout 90 "$COLOADER_BINARY" consume --name "split-$mode" "${consume_dev[@]}" --json >"$d/consume.json" 2>"$d/consume.log"
  (sleep 15; kill "$pid" 2>/dev/null) &
  watchdog=$!
  wait "$pid"
  kill "$watchdog" 2>/dev/null
  python3 - "$mode" "$d" <<'PY' | tee -a "$work/alone.md" "$log"
import json, re, sys
mode, d = sys.argv[1:]
serve = open(d + "/serve.log").read()
epochs = [json.loads(l) for l in open(d + "/consume.json") if l.startswith("{")]
rate = "/".join(f"{e.get('images_per_s', 0):,.0f}" for e in epochs) or "-"
cpu = re.search(r"CPU ([0-9.]+) s", serve)
counts = re.search(r"decode gpu: (\d+) images by the hardware backend, (\d+) by the GPU hybrid backend, (\d+) on the CPU", serve)
what = f"{counts[1]} engines, {counts[2]} hybrid, {counts[3]} CPU" if counts else "CPU"
split = re.search(r"decode split on cuda:\d+: (.*)", serve)
print(f"| {mode} | {rate} | {cpu[1] if cpu else '-'} | {what} | {split[1] if split else '-'} |")
PY
done
if [[ -n $mps ]]; then
  echo quit | nvidia-cuda-mps-control >>"$log" 2>&1
  sleep 1
fi
unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY

# -- 2. training under MPS ---------------------------------------------------------------------
common=(--split --data "$data" --n "${SPLIT_N:-1,2,4}" --repeats "${SPLIT_REPEATS:-1}" --window 4 --no-fairness
        --stage-times --thread-states --drain-step-ms "${SPLIT_DRAIN_MS:-0}")
on_gpu || common+=(--device cpu --no-mps --batch-size 8 --image-size 64 --window 1 --warmup 1 --synthetic-warmup 1)
outs=()
run() {  # run NAME MODEL SETUPS [EXTRA...]
  local name=$1 model=$2 setups=$3 l
  shift 3
  l=$(left)
  if ((l < 60)); then
    say "skipped $name: ${l}s left of the budget"
    return
  fi
  say "== 2. $name ($model: $setups $*)"
  python3 benchmarks/collocated/collocated.py "${common[@]}" --models "$model" --setups "$setups" --deadline $((l - 15)) \
    --out "$work/runs/$name" "$@" >>"$log" 2>&1 || say "$name: collocated.py failed (see split.log)"
  outs+=("$work/runs/$name")
}
IFS=',' read -r -a models <<<"${SPLIT_MODELS:-resnet18}"
for model in "${models[@]}"; do
  run "$model" "$model" "${SPLIT_SETUPS:-synthetic,coloader-auto,coloader-gpudecode,coloader}"
done
if [[ ${SPLIT_LANES2:-0} == 1 ]]; then
  run lanes2 "${models[0]}" coloader-gpudecode --n 1 --variant lanes2 --gpu-decode-flags "--decode gpu --gpu-lanes 2"
  run auto-lanes2 "${models[0]}" coloader-auto --n 1 --variant lanes2 --coloader-flags "--output float32 --gpu-lanes 2"
fi
if [[ -n ${SPLIT_JOB_PYTHON:-} ]]; then
  run jobpy "${models[0]}" coloader-auto,coloader --n 1 --variant jobpy \
    --job-env "PYTHONPATH=$here/benchmarks/collocated:$(cd "$SPLIT_JOB_PYTHON" && pwd)"
fi
if [[ ${SPLIT_NHWC:-0} == 1 ]]; then
  run nhwc "${models[0]}" coloader-auto,coloader --n 1 --variant nhwc --coloader-flags "--output float32 --layout nhwc"
fi
# One job below its ceiling although next() hardly waits: is it the CPU load beside it? Busy
# loops alone (synthetic+burn), then the loops and the producers at the lowest priority.
if [[ ${SPLIT_CONTENTION:-0} == 1 ]]; then
  run contention "${models[0]}" synthetic,synthetic+burn --n 1 --variant contention
  run contention-nice "${models[0]}" synthetic+burn,coloader-auto,coloader --n 1 --variant nice19 \
    --burn-nice 19 --serve-nice 19
fi
# Fixed shares beside auto's: where the one-job optimum lies.
IFS=',' read -r -a shares <<<"${SPLIT_SHARES:-}"
for f in "${shares[@]}"; do
  run "share$f" "${models[0]}" coloader-auto --n 1 --variant "share$f" --coloader-flags "--output float32 --cpu-share $f"
done

# -- 3. summary --------------------------------------------------------------------------------
csvs=()
for d in "${outs[@]}"; do [[ -f $d/results.csv ]] && csvs+=("$d/results.csv"); done
if ((${#csvs[@]})); then
  python3 - "$root/results.csv" "${csvs[@]}" <<'PY'
import csv, sys
rows, fields = [], None
for p in sys.argv[2:]:
    r = csv.DictReader(open(p))
    fields = fields or r.fieldnames
    rows += list(r)
w = csv.DictWriter(open(sys.argv[1], "w", newline=""), fieldnames=fields)
w.writeheader()
w.writerows(rows)
PY
fi
{
  echo "# Issue 24: --decode auto against gpu and cpu ($(date -u '+%Y-%m-%d %H:%M UTC'))"
  echo
  echo "## 1. Decode alone${mps:+, an MPS client}: one producer, one consumer, no training"
  echo
  cat "$work/alone.md"
  echo
  echo "## 2. Against issue 24's targets"
  echo
  ((${#csvs[@]})) && python3 scripts/gpu/split_targets.py "${csvs[@]}"
  echo
  echo "## 3. The split each --decode auto producer ended on"
  echo
  for d in "${outs[@]}"; do
    [[ -f $d/runs.tar.gz || -d $d ]] || continue
    grep -rh "decode split on cuda" "$d" 2>/dev/null | sed 's/^/    /'
  done
  echo
  echo "## 4. Every row (benchmarks/collocated/collocated.py --report)"
  echo
  ((${#outs[@]})) && python3 benchmarks/collocated/collocated.py --report "${outs[@]}" 2>&1
} >"$root/summary.md"
tar czf "$root/runs.tgz" -C "$work" runs alone 2>/dev/null
rm -rf "$work" ${mps:+"$mps"}
say "done in $(($(date +%s) - t0)) s: $root/summary.md"
