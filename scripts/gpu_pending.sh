#!/usr/bin/env bash
# On the GPU machine, in one device command (~9 min): the GPU runs the open issues still wait
# for, most important first, each packed into its own tarball under $OUT as soon as it ends
# (the device tool brings back at most 8 files, and a command past its limit keeps only what
# is already there).
#   1. tests.tgz      scripts/gpu_run.sh tests: the GPU suites at the current code
#   2. launch.tgz     scripts/gpu_launch_check.sh: the launch check after the planner's
#                     consumer term (issue 6)
#   3. gpuwait.tgz    --decode gpu with --gpu-wait block against spin, ResNet-18 N=2 and 4
#                     (issue 8: the producer's cores)
# Here first: scripts/gpu_bundle.sh and benchmarks/fetch_wheels.sh; carry .device and .whl.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_env.sh
root=$out
status=0

pack() {  # pack NAME DIR: DIR's files into $root/NAME.tgz, then drop DIR
  tar czf "$root/$1.tgz" -C "$2" . && rm -rf "$2"
}

echo "== 1/3 GPU tests ($(date -u +%H:%M:%S))"
OUT=$root/tests scripts/gpu_run.sh tests || status=1
pack tests "$root/tests"

echo "== 2/3 launch check ($(date -u +%H:%M:%S))"
OUT=$root/launch scripts/gpu_launch_check.sh || status=1
pack launch "$root/launch"

echo "== 3/3 --gpu-wait block vs spin ($(date -u +%H:%M:%S))"
OUT=$root/gpuwait benchmarks/run_collocated.sh --quick --models resnet18 --n 2,4 --no-fairness \
  --setups synthetic,coloader-gpudecode,coloader-gpudecode-spin --deadline 200 || status=1
pack gpuwait "$root/gpuwait"
echo "== done ($(date -u +%H:%M:%S)), status $status"
exit $status
