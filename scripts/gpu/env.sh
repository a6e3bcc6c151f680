# Sourced, from the repository root, by the scripts that run on the GPU machine (the suites of
# scripts/gpu.sh, benchmarks/collocated/run_collocated.sh): $here, $out (created; $OUT there) and
# the environment that finds coloader and the test binaries.
#   COLOADER_WHEEL_SITE=DIR   coloader comes from the wheel installed into DIR (scripts/gpu/wheel.sh
#                             sets it): the `coloader` binary, the C ABI libraries and the package.
#   otherwise                 from .device/ as scripts/gpu_bundle.sh packed it.
# .device/lib stays on LD_LIBRARY_PATH for the test binaries (gpu_test, integration_test, ...):
# the wheel's binaries load their own vendored copies (renamed by auditwheel, found through
# their RPATH), so the two never mix.
here=$(pwd)
out=${OUT:-$here/out}
mkdir -p "$out"
export LD_LIBRARY_PATH="$here/.device/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if [[ -n ${COLOADER_WHEEL_SITE:-} ]]; then
  export COLOADER_BINARY="$COLOADER_WHEEL_SITE/coloader/bin/coloader"
  export COLOADER_LIBRARY="$COLOADER_WHEEL_SITE/coloader/libcoloader_c.so"
  export COLOADER_PRODUCER_LIBRARY="$COLOADER_WHEEL_SITE/coloader/libcoloader_producer_c.so"
else
  export COLOADER_BINARY="$here/.device/bin/coloader"
  export COLOADER_LIBRARY="$here/.device/lib/libcoloader_c.so"
  export COLOADER_PRODUCER_LIBRARY="$here/.device/lib/libcoloader_producer_c.so"
fi
export PYTHONUNBUFFERED=1
export COLOADER_TEST_DATA="$here/.device/data" COLOADER_TEST_PHOTOS="$here/.device/photos"

# A suite's clock and log: `suite_clock NAME LOG BUDGET_S` starts the clock, empties $out/LOG,
# and gives say (a timestamped line to the terminal and the log) and left (seconds of the budget).
suite_clock() {
  suite_name=$1
  log=$out/$2
  budget=$3
  t0=$(date +%s)
  : >"$log"
}
say() { echo "[$suite_name $(date -u +%H:%M:%S) +$(($(date +%s) - t0))s] $*" | tee -a "$log"; }
left() { echo $((budget - ($(date +%s) - t0))); }
