# Sourced, from the repository root, by the scripts that run on the GPU machine (scripts/gpu_run.sh,
# benchmarks/run_collocated.sh): $here, $out (created; $OUT there) and the environment that finds
# the binaries and libraries scripts/gpu_bundle.sh packed into .device/.
here=$(pwd)
out=${OUT:-$here/out}
mkdir -p "$out"
export LD_LIBRARY_PATH="$here/.device/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export COLOADER_BINARY="$here/.device/bin/coloader"
export COLOADER_LIBRARY="$here/.device/lib/libcoloader_c.so"
export PYTHONUNBUFFERED=1
export COLOADER_TEST_DATA="$here/.device/data" COLOADER_TEST_PHOTOS="$here/.device/photos"
