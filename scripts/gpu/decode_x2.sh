#!/usr/bin/env bash
# Issue 16 on the two-GPU machine (kind nvidia-h200-x2) in one device command (under 9 minutes):
# does decode capacity grow with GPUs? `serve --device cuda:0,cuda:1 --decode gpu` decodes batch
# k on GPU k mod 2 (each GPU's JPEG engines, one lane each) and fills the other GPU's ring peer
# to peer.
#
#   0. tests (when carried): gpu_decode_test (the stage on cuda:1 gives cuda:0's bytes) and
#      gpu_test's two-GPU cases (exact epochs on both GPUs, the one-GPU decode's content), into
#      tests.log.
#   1. decode alone: one producer on both GPUs drained by one device consumer per GPU, against
#      the same producer on cuda:0 only: images/s, CPU per image, images per GPU.
#   2. training under MPS: ResNet-18 bf16 batch 128, N = 2 and 4 jobs spread over the GPUs
#      (job i on GPU i mod 2): the synthetic ceiling and coloader-gpudecode, each GPU's jobs
#      against the ceiling's, the producer's cores; then the producer outside MPS (@nomps).
#
# Here first: as for scripts/gpu.sh decode-profile (build, then SKIP_BUILD=1
# scripts/gpu_bundle.sh). Writes under $OUT: summary.md, results.csv, x2.log, tests.log,
# decode_alone.tgz, runs.tgz.
#
#   scripts/gpu.sh decode-x2          X2_BUDGET_S (default 480) bounds the whole run
# PROFILE_DEVICE=cpu tries the paths without a GPU (CPU decode, one host ring, no MPS).
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/env.sh
root=$out
suite_clock x2 x2.log "${X2_BUDGET_S:-480}"
work=$(mktemp -d /tmp/gpudecode-x2.XXXXXX)
no_mps=$(mktemp -d /tmp/coloader-no-mps.XXXXXX)
cpu=${PROFILE_DEVICE:-cuda}

nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader 2>&1 | tee -a "$log"
nvidia-smi topo -m 2>&1 | head -5 | tee -a "$log"
nproc | sed 's/^/cores: /' | tee -a "$log"

data=${PROFILE_DATA:-/tmp/gpudecode-data}
images=${PROFILE_IMAGES:-5000}
if [[ ! -d $data ]]; then
  say "making $images images from .device/photos"
  python3 scripts/make_dataset.py --source .device/photos --out "$data" --images "$images" --classes 1000 \
    >>"$log" 2>&1 || say "make_dataset failed"
fi

# -- 0. tests --------------------------------------------------------------------------------
if [[ $cpu != cpu ]]; then
  : >"$root/tests.log"
  [[ -x .device/bin/gpu_decode_test ]] && { timeout 120 .device/bin/gpu_decode_test >>"$root/tests.log" 2>&1; say "gpu_decode_test: exit $?"; }
  [[ -x .device/bin/gpu_test ]] && {
    timeout 150 .device/bin/gpu_test --gtest_filter='*TwoGpus*:*EachGpuIsServed*:*OutsideMps*' >>"$root/tests.log" 2>&1
    say "gpu_test: exit $?"
  }
  grep -E '^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED  \]' "$root/tests.log" | tee -a "$log"
fi

# -- 1. decode alone -------------------------------------------------------------------------
alone=$work/decode_alone
mkdir -p "$alone"
{
  echo "| producer | consumers | img/s per consumer (each epoch) | producer CPU µs/img | images per GPU (hardware) |"
  echo "| --- | --- | --- | ---: | --- |"
} >"$alone/table.md"
decode_alone() {  # decode_alone NAME DEVICES CONSUMER_GPUS (e.g. "cuda:0,cuda:1" "0 1")
  local name=$1 devices=$2 gpus=$3 dir=$alone/$1 n
  mkdir -p "$dir"
  n=$(wc -w <<<"$gpus")
  local -a dev=(--device "$devices" --decode gpu) cdev=(--device)
  [[ $cpu == cpu ]] && dev=(--decode cpu) && cdev=()
  COLOADER_STAGE_TIMES=1 "$COLOADER_BINARY" serve --data "$data" --name "x2-$name" --batch-size 128 --epochs 3 \
    "${dev[@]}" --output float32 --workers 14 --quiet --min-consumers "$n" 2>"$dir/serve.log" &
  local serve_pid=$!
  for _ in $(seq 100); do grep -q serving "$dir/serve.log" 2>/dev/null && break; sleep 0.1; done
  local -a pids=()
  for g in $gpus; do
    CUDA_VISIBLE_DEVICES=$g timeout 90 "$COLOADER_BINARY" consume --name "x2-$name" "${cdev[@]}" --json \
      >"$dir/consume$g.json" 2>"$dir/consume$g.log" &
    pids+=($!)
  done
  wait "${pids[@]}"
  (sleep 15; kill "$serve_pid" 2>/dev/null) &
  local watchdog=$!
  wait "$serve_pid"
  kill "$watchdog" 2>/dev/null
  python3 - "$name" "$dir" "$devices" <<'PY' | tee -a "$alone/table.md" "$log"
import glob, json, re, sys
name, d, devices = sys.argv[1:]
serve = open(d + "/serve.log").read()
rates, imgs = [], 0
for f in sorted(glob.glob(d + "/consume*.json")):
    epochs = [json.loads(l) for l in open(f) if l.startswith("{")]
    rates.append("/".join(f"{e.get('images_per_s', 0):,.0f}" for e in epochs) or "-")
    imgs = max(imgs, sum(e.get("samples", 0) for e in epochs))  # every consumer reads every image
cpu = re.search(r"CPU ([0-9.]+) s", serve)
per = f"{1e6 * float(cpu.group(1)) / imgs:.0f}" if cpu and imgs else "-"
gpus = "; ".join(f"{m.group(4)}: {m.group(1)}" for m in re.finditer(
    r"decode gpu: (\d+) images by the hardware backend, (\d+) by the GPU hybrid backend, (\d+) on the CPU \((cuda:\d+)\)", serve))
print(f"| {name} ({devices}) | {len(rates)} | {' ; '.join(rates)} | {per} | {gpus or '-'} |")
PY
}
say "== 1. decode alone"
decode_alone one-gpu cuda:0 "0"
decode_alone two-gpus cuda:0,cuda:1 "0 1"

# -- 2. training under MPS, jobs spread over both GPUs ----------------------------------------
common=(--data "$data" --models resnet18 --n 2,4 --gpus 2 --repeats 1 --window 4 --no-fairness --stage-times
        --thread-states --gpu-decode-flags "--decode gpu")
[[ $cpu == cpu ]] && common=(--data "$data" --models resnet18 --n 2 --repeats 1 --window 1 --no-fairness
                             --device cpu --no-mps --batch-size 8 --image-size 64 --warmup 1 --synthetic-warmup 1
                             --gpu-decode-flags "--decode cpu")
outs=()
collocated() {  # collocated NAME SETUPS [SERVE_ENV]
  local name=$1 setups=$2 senv=${3:-} l
  l=$(left)
  if ((l < 60)); then
    say "skipped $name: ${l}s left of the budget"
    return
  fi
  say "== $name ($setups${senv:+; serve $senv})"
  local -a extra=()
  [[ -n $senv ]] && extra=(--serve-env "$senv" --variant "$name")
  python3 benchmarks/collocated/collocated.py --quick "${common[@]}" --setups "$setups" --deadline $((l - 10)) \
    --out "$work/runs/$name" "${extra[@]}" >>"$log" 2>&1 || say "$name: collocated.py failed (see x2.log)"
  outs+=("$work/runs/$name")
}
collocated base synthetic,coloader-gpudecode
collocated nomps coloader-gpudecode "CUDA_MPS_PIPE_DIRECTORY=$no_mps"

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
  echo "# Issue 16 on two GPUs ($(date -u '+%Y-%m-%d %H:%M UTC'))"
  echo
  echo "## 1. Decode alone"
  echo
  cat "$alone/table.md"
  echo
  for d in "$alone"/*/; do
    echo "### $(basename "$d")"
    echo '```'
    grep -E "^\[stage\] lane|decode: (gpu|auto)|decode gpu:|decode split|CPU [0-9.]+ s" "$d/serve.log"
    echo '```'
  done
  echo
  echo "## 2. Against issue 16's targets (N jobs over 2 GPUs: N=2 is one job per GPU)"
  echo
  [[ -f $work/results.csv ]] && python3 scripts/gpu/decode_targets.py "$work/results.csv" --gpus 2
  echo
  echo "## 3. Every row"
  echo
  ((${#outs[@]})) && python3 benchmarks/collocated/collocated.py --report "${outs[@]}" 2>&1
} >"$root/summary.md"
tar czf "$root/decode_alone.tgz" -C "$alone" . 2>/dev/null
tar czf "$root/runs.tgz" -C "$work" runs 2>/dev/null
rm -rf "$work" "$no_mps"
say "done in $(($(date +%s) - t0)) s: $root/summary.md"
