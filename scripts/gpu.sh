#!/usr/bin/env bash
# The one entry point on the GPU machine: runs the named suites in order, over a copy of the
# repository that carries what they need (made here: scripts/build_wheel.sh -> dist/,
# scripts/gpu_bundle.sh [--tests-only] -> .device/). Each suite writes under $OUT/SUITE/ (OUT
# defaults to ./out); when several are named, each is packed into $OUT/SUITE.tgz as soon as it
# ends, so that a command stopped at the device's limit still brings back what finished.
#
#   scripts/gpu.sh SUITE [SUITE ...]     e.g. scripts/gpu.sh contract
#   scripts/gpu.sh --list                the suites, one line each
#
# GPU_BUDGET_S (default 570) bounds the whole command: each suite runs under `timeout` with what
# is left, and one that would start with under 30 s left is skipped and says so. The suites'
# own settings pass through the environment (CONTRACT=..., PYTEST_FILES=..., DDP_IMAGES=...:
# see each script's header). Exit status 0 only if every suite that ran passed.
#
# The suites' scripts live in scripts/gpu/ (and tests/shm/, benchmarks/); they are not called
# directly.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

# name | what carries it | script and arguments | what it runs
suites=(
  "tests|.device|scripts/gpu/run.sh tests|the GPU suites from the bundle: gpu_decode_test, gpu_test, formats_test (cpu and gpu decode), integration_test, pytest"
  "formats|.device|scripts/gpu/run.sh formats|formats_test alone (PNG/WebP/TIFF/BMP/PNM ImageFolder, --decode cpu and gpu)"
  "bench|.device|scripts/gpu/run.sh bench|producer throughput (host, GPU path, GPU decode) and hand-off latency against a torch queue"
  "nextprof|.device|scripts/gpu/run.sh nextprof|where a job's next() goes on the device path: copied, zero-copy, host (benchmarks/loader_next_profile.py)"
  "reliability|.device|scripts/gpu/run.sh reliability|fault stress and soak on the device path (STRESS_SECONDS, SOAK_SECONDS)"
  "wheel|dist .device|scripts/gpu/wheel.sh tests|the wheel installed as a user would: ldd, clean-environment serve + Loader, then the GPU suites against it"
  "smoke|dist|scripts/gpu/wheel.sh smoke|the wheel's install, ldd and clean-environment runs only"
  "contract|dist .device|scripts/gpu/wheel.sh contract|the job contract on the device path through the wheel (CONTRACT=gpu_decode,gpu_test,pytest,isolation; PYTEST_FILES)"
  "recipes-train|dist|scripts/gpu/wheel.sh recipes-train|training under the reference recipe and the plain one with the ceiling, ResNet-18/50 at N = 1, 4 (issue 36)"
  "collocated|dist|scripts/gpu/wheel.sh collocated|one collocated-training configuration (benchmarks/collocated/run_collocated.sh --tiny) with the wheel's binary"
  "shm|.device|tests/shm/gpu_shm_test.sh|a --device producer in a 48 MB /dev/shm"
  "ddp|.device|scripts/gpu/ddp.sh|two 2-rank DDP groups and a plain job on one --device cuda:0,cuda:1 producer (two GPUs)"
  "decode-profile|.device|scripts/gpu/decode_profile.sh|GPU decode alone and under training, lanes and MPS variants, against the targets"
  "decode-x2|.device|scripts/gpu/decode_x2.sh|GPU decode on one GPU against two, jobs per GPU (two GPUs)"
  "split|.device|scripts/gpu/decode_split.sh|--decode auto (engines and CPU splitting each batch) beside gpu and cpu, ImageNet's format mix (SPLIT_MODELS, SPLIT_N, SPLIT_REPEATS)"
  "launch|.device|scripts/gpu/launch_check.sh|coloader launch of examples/jobs_gpu.json under MPS, memory against the plan's bounds"
  "allocations||scripts/gpu/allocations.sh|the real caching allocator's history of every ground-truth configuration, replayed through the estimator's allocator model (benchmarks/allocation_replay.py)"
  "replay|.device|scripts/gpu/replay.sh|examples/replay_gpu.json through launch under MPS (REPLAY_PHASE=fifo [REPLAY_PART=K/N], activity, then default with FIFO_SUMMARY [REPLAY_ACTIVITY, REPLAY_LABEL]) beside simulate's prediction"
)

field() { local IFS='|'; read -r -a f <<<"$1"; echo "${f[$2]}"; }
find_suite() {
  local s
  for s in "${suites[@]}"; do [[ $(field "$s" 0) == "$1" ]] && { echo "$s"; return 0; }; done
  return 1
}

if [[ $# -eq 0 || $1 == --list || $1 == -h || $1 == --help ]]; then
  [[ $# -eq 0 ]] && echo "usage: scripts/gpu.sh SUITE [SUITE ...]" >&2
  for s in "${suites[@]}"; do printf '  %-15s %s\n' "$(field "$s" 0)" "$(field "$s" 3)"; done
  [[ $# -eq 0 ]] && exit 2
  exit 0
fi
for name in "$@"; do
  if ! find_suite "$name" >/dev/null; then
    echo "gpu.sh: no suite '$name' (scripts/gpu.sh --list names them)" >&2
    exit 2
  fi
done

root=${OUT:-$(pwd)/out}
mkdir -p "$root"
budget=${GPU_BUDGET_S:-570}
t0=$(date +%s)
left() { echo $((budget - ($(date +%s) - t0))); }
say() { echo "== [$(date -u +%H:%M:%S) +$(($(date +%s) - t0))s] $*"; }
status=0
say "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1 || echo 'no nvidia-smi')"
for name in "$@"; do
  suite=$(find_suite "$name")
  read -r -a cmd <<<"$(field "$suite" 2)"
  missing=""
  for need in $(field "$suite" 1); do [[ -e $need ]] || missing+=" $need"; done
  if [[ -n $missing ]]; then
    say "$name: skipped, not carried:$missing (see scripts/gpu.sh's header)"
    status=1
    continue
  fi
  if (($(left) < 30)); then
    say "$name: skipped, $(left) s of GPU_BUDGET_S left"
    status=1
    continue
  fi
  dir=$root
  (($# > 1)) && dir=$root/$name
  mkdir -p "$dir"
  say "$name: ${cmd[*]} ($(left) s left)"
  OUT=$dir timeout --kill-after=10 "$(left)" bash "${cmd[@]}"
  rc=$?
  say "$name: exit $rc"
  ((rc == 0)) || status=1
  if (($# > 1)); then
    tar czf "$root/$name.tgz" -C "$dir" . && rm -rf "$dir"
  fi
done
say "done, status $status"
exit $status
