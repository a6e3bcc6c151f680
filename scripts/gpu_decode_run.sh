#!/usr/bin/env bash
# Runs on the GPU machine from a bundle made by `COLOADER_BUNDLE=DIR scripts/gpu_bundle.sh` (plus
# DIR/nvjpeg/libnvjpeg.so.13 from .deps and DIR/scripts/{make_dataset,producer_throughput}.py):
# the --decode gpu tests, the whole GPU test suite, then the producer throughput benchmark
# (CPU decode on every core vs GPU decode). Logs go to $OUT (default ./out).
#   DIR/scripts/gpu_decode_run.sh
set -uo pipefail
B=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$B/out}
mkdir -p "$out"
export LD_LIBRARY_PATH="$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" PYTHONUNBUFFERED=1
export COLOADER_TEST_DATA="$B/data" COLOADER_TEST_PHOTOS="$B/photos"
export COLOADER_BINARY="$B/bin/coloader" COLOADER_LIBRARY="$B/lib/libcoloader_c.so"
status=0
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  nproc
  echo "libnvjpeg on this machine:"
  find / \( -path /proc -o -path /sys -o -path "$B" \) -prune -o -name 'libnvjpeg.so*' -print 2>/dev/null
} | tee "$out/env.txt"
# The binary looks in the usual places itself (the loader path, /usr/local/cuda*); only where
# the machine keeps it elsewhere (a Python wheel) point at that, or at the bundle's copy.
if ! ldconfig -p | grep -q 'libnvjpeg.so.13 ' && ! ls /usr/local/cuda*/lib64/libnvjpeg.so.13 \
     /usr/local/cuda*/targets/*/lib/libnvjpeg.so.13 >/dev/null 2>&1; then
  sys_lib=$(find / \( -path /proc -o -path /sys -o -path "$B" \) -prune -o -name 'libnvjpeg.so.13' -print 2>/dev/null | head -1)
  export COLOADER_NVJPEG_LIBRARY=${sys_lib:-$B/nvjpeg/libnvjpeg.so.13}
fi
echo "COLOADER_NVJPEG_LIBRARY=${COLOADER_NVJPEG_LIBRARY:-unset: found by the binary}" | tee -a "$out/env.txt"

echo "== gpu_decode_test"
"$B/bin/gpu_decode_test" 2>&1 | tee "$out/gpu_decode_test.log" | grep -vE '^\[ RUN'
[[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
echo "== gpu_test"
"$B/bin/gpu_test" 2>&1 | tee "$out/gpu_test.log" | grep -E '^\[ +(OK|FAILED|SKIPPED|PASSED) |tests? ran|Failure|decode'
[[ ${PIPESTATUS[0]} -eq 0 ]] || status=1

data=/tmp/coloader-imagenet-like
[[ -d $data ]] || python3 "$B/scripts/make_dataset.py" --source "$B/photos" --out "$data" --images "${BENCH_IMAGES:-6000}" --classes 100 2>/dev/null
echo "== producer throughput: CPU decode (all cores) vs GPU decode, $(nproc) cores"
python3 "$B/scripts/producer_throughput.py" --data "$data" --binary "$B/bin/coloader" --device cuda:0 --gpu-decode \
  --epochs "${BENCH_EPOCHS:-8}" 2>&1 | tee "$out/producer_throughput_gpu_decode.txt"
exit $status
