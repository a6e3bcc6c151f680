#!/usr/bin/env bash
# The GPU runs the open issues still owe, in one device command on the machine with two GPUs
# (kind nvidia-h200-x2), most important first, each packed into $OUT as it ends (the device
# tool brings back at most 8 files, and a command stopped at its limit keeps what is there):
#   1. tests.tgz    scripts/gpu_run.sh tests: gpu_decode_test, gpu_test (the two-GPU cases
#                   included), formats_test (--decode gpu), integration_test, pytest
#   2. wheel.tgz    scripts/gpu_wheel.sh smoke: the manylinux wheel installed as a user would,
#                   ldd of everything in it, `coloader serve --decode gpu|cpu` feeding a Loader
#                   on cuda:0 in a clean environment (issue 15); skipped without dist/*.whl
#   3. shm.tgz      tests/shm/gpu_shm_test.sh: a --device producer in a 48 MB /dev/shm (issue 17)
#   4. ddp.tgz      scripts/gpu_ddp.sh: two 2-rank DDP groups and a plain job on one
#                   --device cuda:0,cuda:1 --decode gpu producer (issue 13)
#   5. x2.tgz       scripts/gpu_decode_x2.sh: decode on one GPU against two, jobs per GPU (issue
#                   16), with what is left of FINAL_BUDGET_S (default 570)
# Here first: the build with CUDA and nvJPEG, then SKIP_BUILD=1 scripts/gpu_bundle.sh and
# scripts/build_wheel.sh; carry .device and dist.
set -uo pipefail
cd "$(dirname "$0")/.."
root=${OUT:-$(pwd)/out}
mkdir -p "$root"
budget=${FINAL_BUDGET_S:-570}
t0=$(date +%s)
left() { echo $((budget - ($(date +%s) - t0))); }
say() { echo "== [$(date -u +%H:%M:%S) +$(($(date +%s) - t0))s] $*"; }
status=0
pack() {  # pack NAME DIR: DIR's files into $root/NAME.tgz, then drop DIR
  tar czf "$root/$1.tgz" -C "$2" . && rm -rf "$2"
}

say "1/5 GPU suites"
OUT=$root/tests timeout $(($(left) - 320)) scripts/gpu_run.sh tests || status=1
pack tests "$root/tests"

say "2/5 the wheel, installed into a clean environment"
if compgen -G "dist/coloader-*.whl" >/dev/null; then
  OUT=$root/wheel timeout 150 bash scripts/gpu_wheel.sh smoke || status=1
  pack wheel "$root/wheel"
else
  echo "no dist/coloader-*.whl carried: skipped"
fi

say "3/5 small /dev/shm, device path"
mkdir -p "$root/shm"
OUT=$root/shm timeout 90 bash tests/shm/gpu_shm_test.sh > "$root/shm/run.log" 2>&1 || status=1
tail -5 "$root/shm/run.log"
pack shm "$root/shm"

say "4/5 DDP groups on two GPUs"
OUT=$root/ddp DDP_IMAGES=${DDP_IMAGES:-6401} DDP_EPOCHS=${DDP_EPOCHS:-2} timeout $(($(left) - 100)) \
  bash scripts/gpu_ddp.sh || status=1
[[ -f $root/ddp/gpu_ddp.json ]] && cat "$root/ddp/gpu_ddp.json"
pack ddp "$root/ddp"

say "5/5 decode on two GPUs ($(left) s left)"
if (($(left) > 60)); then
  OUT=$root/x2 X2_BUDGET_S=$(($(left) - 10)) bash scripts/gpu_decode_x2.sh || status=1
  [[ -f $root/x2/summary.md ]] && head -40 "$root/x2/summary.md"
  pack x2 "$root/x2"
fi
say "done, status $status"
exit $status
