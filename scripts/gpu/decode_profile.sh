#!/usr/bin/env bash
# Issue 16, phase 2, on the single-GPU machine in one device command (under 9.5 minutes): the
# one-lane default against what is left to decide, side by side, with the targets marked.
#
#   0. tests (when carried): gpu_decode_test (the stage against the CPU path, and on a second
#      GPU where there is one) and gpu_test's issue-16 cases (the producer outside MPS serving
#      MPS clients through CUDA IPC; two GPUs decoding, skipped with one), into tests.log.
#   1. decode alone: `serve --decode gpu` drained by one `consume --device`, no training: one
#      lane without MPS, as an MPS client, and outside a running MPS daemon (its pipe
#      directory empty): images/s, CPU per image, stage timers, engine count in the banner.
#   2. training: benchmarks/collocated/collocated.py, ResNet-18 bf16 batch 128 under MPS at
#      N = 1, 2: the synthetic ceiling and coloader-gpudecode (one lane), then each variant (name | serve
#      environment | jobs' environment | serve flags):
#        lanes2  - two lanes (phase 1's default), to confirm one is enough
#        nomps   - the producer outside MPS (time-sliced beside the MPS server), jobs inside
#        pct80   - jobs at CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=80, the producer at 100
#        lowprio - jobs at CUDA_MPS_CLIENT_PRIORITY=1 (below the producer's normal)
#      and ResNet-50 at N = 1, 2: the ceiling, coloader-gpudecode, and @nomps (run after
#      lanes2, before pct80 and lowprio: a variant past the budget is skipped and says so).
#   3. targets: per row, the fraction of the ceiling, whole-machine cores, the producer's cores
#      and cores per 10k img/s, against issue 16's (1 job >= 0.95; machine with 1 job <= 1.5
#      cores; producer <= 0.5 core per 10k img/s), into summary.md.
#
# Here first: build coloader, coloader_c, gpu_test, gpu_decode_test and integration_test
# (with -DCOLOADER_NVJPEG_ROOT in a worktree), then SKIP_BUILD=1 scripts/gpu_bundle.sh. Writes
# under $OUT: summary.md, results.csv, profile.log, tests.log, decode_alone.tgz, runs.tgz.
#
#   scripts/gpu.sh decode-profile            PROFILE_BUDGET_S (default 520) bounds the whole run
# PROFILE_DEVICE=cpu tries the script's paths on a machine without a GPU (CPU decode, tiny
# batches, no MPS): nothing it measures means anything.
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/env.sh
root=$out
suite_clock profile profile.log "${PROFILE_BUDGET_S:-520}"
work=$(mktemp -d /tmp/gpudecode-profile.XXXXXX)

# The producer outside MPS: CUDA finds no daemon in this (empty) pipe directory and runs it as an
# ordinary context, time-sliced with the MPS server, while the jobs stay MPS clients.
no_mps=$(mktemp -d /tmp/coloader-no-mps.XXXXXX)
# name | serve environment | jobs' environment | serve flags (each may be empty)
variants=(
  "nomps|CUDA_MPS_PIPE_DIRECTORY=$no_mps||"
  "lanes2|||--gpu-lanes 2"
  "pct80||CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=80|"
  "lowprio||CUDA_MPS_CLIENT_PRIORITY=1|"
)

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee -a "$log"
nproc | sed 's/^/cores: /' | tee -a "$log"
python3 -c 'import torch, torchvision; print("torch", torch.__version__, "torchvision", torchvision.__version__)' 2>&1 |
  tee -a "$log"
"$COLOADER_BINARY" serve --help 2>&1 | grep -q -- "--decode" || say "WARNING: this coloader has no --decode"

data=${PROFILE_DATA:-/tmp/gpudecode-data}
images=${PROFILE_IMAGES:-5000}  # ~45 s to make on 16 cores; an epoch is under a second
if [[ ! -d $data ]]; then
  say "making $images images from .device/photos"
  python3 scripts/make_dataset.py --source .device/photos --out "$data" --images "$images" --classes 1000 \
    >>"$log" 2>&1 || say "make_dataset failed"
fi

serve_dev=(--device cuda:0 --decode gpu)
consume_dev=(--device)
decode_flags="--decode gpu"  # collocated.py's --gpu-decode-flags, a variant's serve flags added
common=(--data "$data" --n 1,2 --repeats 1 --window 4 --no-fairness --stage-times --thread-states)
if [[ ${PROFILE_DEVICE:-cuda} == cpu ]]; then
  serve_dev=(--decode cpu)
  consume_dev=()
  decode_flags="--decode cpu"
  common+=(--device cpu --no-mps --batch-size 8 --image-size 64 --window 1 --warmup 1 --synthetic-warmup 1)
fi

# -- 0. tests --------------------------------------------------------------------------------
if [[ ${PROFILE_DEVICE:-cuda} != cpu ]]; then
  : >"$root/tests.log"
  if [[ -x .device/bin/gpu_decode_test ]]; then
    say "== 0. gpu_decode_test (the stage against the CPU path; on cuda:1 where there is one)"
    timeout 120 .device/bin/gpu_decode_test >>"$root/tests.log" 2>&1
    say "gpu_decode_test: exit $?"
  fi
  if [[ -x .device/bin/gpu_test ]]; then
    say "== 0. gpu_test: issue 16's process cases"
    timeout 120 .device/bin/gpu_test \
      --gtest_filter='*GpuDecodeGivesExact*:*OutsideMps*:*TwoGpus*' >>"$root/tests.log" 2>&1
    say "gpu_test: exit $?"
  fi
  grep -E '^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED  \]' "$root/tests.log" | tee -a "$log"
fi

# -- 1. decode alone ----------------------------------------------------------------------
# One producer, one device consumer, 3 epochs: what the lane delivers and costs with nothing
# else on the GPU. CPU per image = the producer's CPU (its last line) over the images.
alone=$work/decode_alone
mkdir -p "$alone"
decode_alone() {  # decode_alone NAME [ENV] (K=V,K=V)
  local name=$1 env=${2:-} dir=$alone/$1
  mkdir -p "$dir"
  local -a envs=(COLOADER_STAGE_TIMES=1)
  [[ -n $env ]] && IFS=',' read -r -a more <<<"$env" && envs+=("${more[@]}")
  env "${envs[@]}" "$COLOADER_BINARY" serve --data "$data" --name "alone-$name" --batch-size 128 --epochs 3 \
    "${serve_dev[@]}" --output float32 --workers 14 --quiet 2>"$dir/serve.log" &
  local serve_pid=$!
  for _ in $(seq 100); do grep -q serving "$dir/serve.log" 2>/dev/null && break; sleep 0.1; done
  timeout 60 "$COLOADER_BINARY" consume --name "alone-$name" "${consume_dev[@]}" --json >"$dir/consume.json" 2>"$dir/consume.log"
  # A producer whose consumer failed waits for another: stop it (SIGTERM: it still prints its timers).
  (sleep 15; kill "$serve_pid" 2>/dev/null) &
  local watchdog=$!
  wait "$serve_pid"
  kill "$watchdog" 2>/dev/null
  python3 - "$name" "$dir" <<'PY' | tee -a "$alone/table.md" "$log"
import json, re, sys
name, d = sys.argv[1], sys.argv[2]
serve = open(d + "/serve.log").read()
try:  # one line per epoch; the first includes the start
    epochs = [json.loads(l) for l in open(d + "/consume.json") if l.startswith("{")]
except (ValueError, OSError):
    epochs = []
cpu = re.search(r"CPU ([0-9.]+) s", serve)
imgs = sum(e.get("samples", 0) for e in epochs)
rate = "/".join(f"{e.get('images_per_s', 0):,.0f}" for e in epochs) or "-"
# decode_init is timed inside decode_hardware/hybrid: not counted twice.
lane = sum(float(l.split()[9]) for l in serve.splitlines()
           if l.startswith("[stage] lane.") and l.split()[1] not in ("lane.queue_wait", "lane.decode_init"))
per = lambda ms: f"{1000 * ms / imgs:.0f}" if imgs else "-"
counts = re.findall(r"decode gpu: (\d+) images by the hardware backend, (\d+) by the GPU hybrid backend, (\d+) on the CPU", serve)
total = "/".join(str(sum(int(c[k]) for c in counts)) for k in range(3)) if counts else "-"
engines = re.search(r"\((\d+ engines x \d+ cores)\)", serve)
print(f"| {name} | {rate} | {per(1000 * float(cpu.group(1))) if cpu else '-'} | {per(lane)} | {total} | "
      f"{engines.group(1) if engines else '-'} |")
PY
}
say "== 1. decode alone (no training)"
{
  echo "| variant | consumer img/s (each epoch) | producer CPU µs/img | lane CPU µs/img | hardware/hybrid/CPU images | engines |"
  echo "| --- | ---: | ---: | ---: | --- | --- |"
} >"$alone/table.md"
decode_alone default
# Under a running MPS daemon, without training: as its client (phase 1: ~9.3k img/s against
# ~25k without MPS) and outside it (the pipe directory empty), as the nomps variant runs.
if [[ ${PROFILE_DEVICE:-cuda} != cpu ]] && command -v nvidia-cuda-mps-control >/dev/null; then
  mps=$(mktemp -d /tmp/gpudecode-mps.XXXXXX)
  mkdir -p "$mps/pipe" "$mps/log"
  export CUDA_MPS_PIPE_DIRECTORY=$mps/pipe CUDA_MPS_LOG_DIRECTORY=$mps/log
  if nvidia-cuda-mps-control -d >>"$log" 2>&1; then
    decode_alone mps-client
    decode_alone nomps-beside-daemon "CUDA_MPS_PIPE_DIRECTORY=$no_mps"
    echo quit | nvidia-cuda-mps-control >>"$log" 2>&1
    sleep 1
  else
    say "could not start an MPS daemon: no decode-alone rows under MPS"
  fi
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
fi

# -- 2. training under MPS ------------------------------------------------------------------
outs=()
collocated() {  # collocated NAME MODEL SETUPS [SERVE_ENV [JOB_ENV [SERVE_FLAGS]]]
  local name=$1 model=$2 setups=$3 senv=${4:-} jenv=${5:-} flags=${6:-} l
  l=$(left)
  if ((l < 50)); then
    say "skipped $name: ${l}s left of the budget"
    return
  fi
  say "== $name ($model: $setups${senv:+; serve $senv}${jenv:+; jobs $jenv}${flags:+; $flags})"
  local -a extra=(--gpu-decode-flags "$decode_flags${flags:+ $flags}")
  [[ -n $senv ]] && extra+=(--serve-env "$senv")
  [[ -n $jenv ]] && extra+=(--job-env "$jenv")
  [[ -n $senv$jenv$flags ]] && extra+=(--variant "$name")
  python3 benchmarks/collocated/collocated.py --quick "${common[@]}" --models "$model" --setups "$setups" \
    --deadline $((l - 10)) --out "$work/runs/$name" "${extra[@]}" >>"$log" 2>&1 ||
    say "$name: collocated.py failed (see profile.log)"
  outs+=("$work/runs/$name")
}
variant() {  # variant MODEL PREFIX INDEX
  local name senv jenv flags
  IFS='|' read -r name senv jenv flags <<<"${variants[$3]}"
  collocated "$2$name" "$1" coloader-gpudecode "$senv" "$jenv" "$flags"
}
# Most telling first: what is left when the budget runs out is the least likely to matter.
collocated base resnet18 synthetic,coloader-gpudecode
variant resnet18 "" 0  # nomps
variant resnet18 "" 1  # lanes2
collocated r50 resnet50 synthetic,coloader-gpudecode
variant resnet50 r50- 0
variant resnet18 "" 2  # pct80
variant resnet18 "" 3  # lowprio

# -- summary ---------------------------------------------------------------------------------
say "== summary"
python3 - "$work/results.csv" "${outs[@]}" <<'PY'
import csv, os, sys
rows, fields = [], None
for d in sys.argv[2:]:
    p = os.path.join(d, "results.csv")
    if os.path.exists(p):
        with open(p) as f:
            r = csv.DictReader(f)
            fields = fields or r.fieldnames
            rows += list(r)
if fields:
    with open(sys.argv[1], "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
PY
[[ -f $work/results.csv ]] && cp "$work/results.csv" "$root/results.csv"
{
  echo "# Issue 16 phase 2: GPU decode profile ($(date -u '+%Y-%m-%d %H:%M UTC'))"
  echo
  echo "## 1. Decode alone: one producer, one consumer --device, no training"
  echo
  cat "$alone/table.md"
  echo
  echo "Stage timers (CPU/wall µs per image of each stage):"
  echo
  for d in "$alone"/*/; do
    echo "### $(basename "$d")"
    echo '```'
    grep -E "^\[stage\]|decode: (gpu|auto)|decode gpu:|decode split|CPU [0-9.]+ s" "$d/serve.log"
    echo '```'
  done
  echo
  echo "## 2. Against issue 16's targets"
  echo
  [[ -f $work/results.csv ]] && python3 scripts/gpu/decode_targets.py "$work/results.csv"
  echo
  echo "## 3. Every row (benchmarks/collocated/collocated.py --report)"
  echo
  ((${#outs[@]})) && python3 benchmarks/collocated/collocated.py --report "${outs[@]}" 2>&1
} >"$root/summary.md"
tar czf "$root/decode_alone.tgz" -C "$alone" . 2>/dev/null
tar czf "$root/runs.tgz" -C "$work" runs 2>/dev/null
rm -rf "$work" "$no_mps"
say "done in $(($(date +%s) - t0)) s: $root/summary.md"
