#!/usr/bin/env bash
# The suites of scripts/gpu.sh that run from the bundle: over a copy of the repository that
# carries .device/ (made by scripts/gpu_bundle.sh). Writes logs and results under $OUT.
#   tests         the GPU decode and GPU test suites, the formats test (cpu and gpu decode), the
#                 host-path integration tests, pytest
#   formats       the formats test alone
#   bench         the GPU benchmarks
#   nextprof      where a job's next() goes on the device path (benchmarks/loader_next_profile.py:
#                 copied, zero-copy, and the host path for comparison)
#   reliability   fault stress and soak on the device path (docs/RELIABILITY.md); STRESS_SECONDS
#                 (default 150) and SOAK_SECONDS (default 300) set their lengths:
#                 SOAK_SECONDS=3600 is the one-hour soak
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/env.sh
what=${1:?usage: scripts/gpu.sh tests|formats|bench|reliability|nextprof}
status=0

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"

if [[ $what == formats ]]; then
  echo "== formats_test (PNG/WebP/TIFF/BMP/PNM ImageFolder, --decode cpu and gpu)"
  .device/bin/formats_test 2>&1 | tee "$out/formats_test.log"
  [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
fi

if [[ $what == tests ]]; then
  echo "== gpu_decode_test (nvJPEG + the GPU resize kernel against the CPU path)"
  .device/bin/gpu_decode_test 2>&1 | tee "$out/gpu_decode_test.log" | grep -E '^\[ +(OK|FAILED|SKIPPED|PASSED) |tests? ran|Failure|mean|max'
  [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
  echo "== gpu_test"
  .device/bin/gpu_test --gtest_output=json:"$out/gpu_test.json" 2>&1 | tee "$out/gpu_test.log" | grep -E '^\[ +(OK|FAILED|SKIPPED|PASSED) |memory|tests? ran|Failure|Expected|Which|actual' || true
  [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
  echo "== formats_test (PNG/WebP/TIFF/BMP/PNM ImageFolder, --decode cpu and gpu)"
  .device/bin/formats_test 2>&1 | tee "$out/formats_test.log" |
    grep -E '^\[ +(OK|FAILED|SKIPPED|PASSED) |tests? ran|Failure|skipped bad' || true
  [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
  echo "== integration_test (host path, on this machine)"
  .device/bin/integration_test 2>&1 | tee "$out/integration_test.log" | grep -E '^\[ +(FAILED|PASSED) |tests? ran|Failure' || true
  [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
  echo "== python tests (torch $(python3 -c 'import torch; print(torch.__version__)'), GPU tests included)"
  python3 -m pytest -q -p no:cacheprovider python/tests -rfEs 2>&1 | tee "$out/pytest.log" | tail -30
  [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
fi

if [[ $what == nextprof ]]; then
  data=/tmp/coloader-nextprof
  [[ -d $data ]] || python3 scripts/make_dataset.py --source .device/photos --out "$data" --images 1024 --classes 16 2>/dev/null
  for variant in "--device cuda" "--device cuda --zero-copy" ""; do
    echo "== loader_next_profile.py $variant"
    # shellcheck disable=SC2086
    timeout 150 python3 benchmarks/loader_next_profile.py --data "$data" --binary "$COLOADER_BINARY" --batches 400 \
      --step-s 0.02 $variant 2>&1 | tee -a "$out/loader_next_profile.txt"
    [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
  done
fi

if [[ $what == bench ]]; then
  data=/tmp/coloader-imagenet-like
  [[ -d $data ]] || python3 scripts/make_dataset.py --source .device/photos --out "$data" --images "${BENCH_IMAGES:-6000}" --classes 100 2>/dev/null
  echo "== producer throughput, host path vs GPU path, $(nproc) workers"
  python3 benchmarks/producer_throughput.py --data "$data" --binary "$COLOADER_BINARY" --device cuda:0 | tee "$out/producer_throughput.txt"
  echo "== producer throughput: CPU decode (all cores) vs GPU decode (nvJPEG)"
  python3 benchmarks/producer_throughput.py --data "$data" --binary "$COLOADER_BINARY" --device cuda:0 --gpu-decode \
    --epochs "${BENCH_EPOCHS:-8}" | tee "$out/producer_throughput_gpu_decode.txt"
  echo "== hand-off latency, host path (same machine, for comparison)"
  python3 benchmarks/handoff.py --data "$data" --binary "$COLOADER_BINARY" | tee "$out/handoff_host.txt"
  echo "== hand-off latency, GPU path"
  python3 benchmarks/handoff.py --data "$data" --binary "$COLOADER_BINARY" --device | tee "$out/handoff_gpu.txt"
  echo "== hand-off latency, torch.multiprocessing queue of CUDA tensors"
  python3 benchmarks/torch_queue_handoff.py | tee "$out/handoff_torch_queue.txt"
fi
if [[ $what == reliability && ${STRESS_SECONDS:-150} -gt 0 ]]; then
  echo "== fault stress, device path (cuda:0)"
  python3 tests/stress/fault_stress.py --coloader "$COLOADER_BINARY" --device cuda:0 \
    --duration "${STRESS_SECONDS:-150}" --min-faults $(( ${STRESS_SECONDS:-150} * 4 )) \
    --report "$out/fault_stress_gpu.json" 2>&1 | tee "$out/fault_stress_gpu.log" | grep -vE '^ ' | tail -20
  [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
fi
if [[ $what == reliability ]]; then
  echo "== soak, device path (cuda:0), two producers"
  python3 tests/stress/soak.py --coloader "$COLOADER_BINARY" --device cuda:0 --duration "${SOAK_SECONDS:-300}" \
    --out "$out/soak_gpu" 2>&1 | tee "$out/soak_gpu.log" | tail -5
  [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
fi
exit $status
