#!/usr/bin/env bash
# The suites of scripts/gpu.sh that run from the installed wheel: over a copy of the repository
# that carries the wheel (dist/, made here by scripts/build_wheel.sh) and the test binaries
# (.device/, made here by scripts/gpu_bundle.sh --tests-only). Installs the wheel as a user would
# and runs the GPU suites against it. Writes logs under $OUT.
#
#   wheel (tests)  install, check, the clean-environment runs, then the suites
#   smoke          install, check and the clean-environment runs only (steps 1-3)
#   collocated     the same install, then one collocated benchmark configuration
#                  (benchmarks/collocated/run_collocated.sh --tiny) with the wheel's binary
#   contract       the same install, then the job contract on the device path: gpu_test, the
#                  Python GPU and contract suites, and what a job's own batches cost
#                  (benchmarks/isolation_cost.py); CONTRACT=...,recipes adds what a recipe
#                  costs the producer (benchmarks/recipes.py)
#
# 1. `pip install --no-deps --no-index --target` the wheel into a fresh folder (the GPU machine has
#    no package registry; its Python is not ours to modify); without pip, the wheel (a zip) is
#    unpacked the way pip would.
# 2. ldd of every ELF file installed: all resolved, no GDAL/GDCM/poppler (wheel.log).
# 3. With a clean environment (env -i: PATH, HOME, and PYTHONPATH naming the install folder, which
#    is what a pip install into site-packages amounts to; no LD_LIBRARY_PATH, no COLOADER_*):
#    `coloader serve` (the console script) on the GPU ring with --decode gpu and with --decode
#    cpu, each feeding a coloader.Loader on cuda:0 for an exact epoch; the serve banner says which
#    nvJPEG it loaded (smoke.log).
# 4. The GPU suites with the wheel's binary and libraries (scripts/gpu/env.sh with
#    COLOADER_WHEEL_SITE): gpu_decode_test, gpu_test, integration_test, then pytest python/tests.
set -uo pipefail
cd "$(dirname "$0")/../.."
what=${1:-tests}
site=/tmp/coloader-wheel-site
export COLOADER_WHEEL_SITE=$site
source scripts/gpu/env.sh
status=0

wheels=(dist/coloader-*.whl)
if [[ ${#wheels[@]} -ne 1 || ! -f ${wheels[0]} ]]; then
  echo "gpu_wheel: expected one dist/coloader-*.whl, found: ${wheels[*]} (run scripts/build_wheel.sh and carry dist/)" >&2
  exit 1
fi
wheel=${wheels[0]}
if [[ ($what == tests || $what == contract) && ! -x .device/bin/gpu_test ]]; then
  echo "gpu_wheel: no .device/bin/gpu_test: run scripts/gpu_bundle.sh --tests-only where the wheel was built, and carry .device/" >&2
  exit 1
fi
# At most 8 files come back from $OUT: wheel.log (GPU, install, ldd), smoke.log, one log per suite.
log=$out/wheel.log
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$log"
echo "== install $(basename "$wheel") ($(du -h "$wheel" | cut -f1)) into $site" | tee -a "$log"
rm -rf "$site"
if ! python3 -m pip install --no-deps --no-index --no-compile --no-cache-dir --target "$site" "$wheel" \
     >>"$log" 2>&1; then
  echo "gpu_wheel: pip could not install it (see wheel.log); unpacking the wheel instead" | tee -a "$log"
  python3 - "$wheel" "$site" <<'PY' 2>&1 | tee -a "$log"
# What pip does for a pure-Python-tagged wheel with no scripts to rewrite: unpack, keep modes.
import os, sys, zipfile
wheel, site = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    for info in z.infolist():
        path = z.extract(info, site)
        mode = info.external_attr >> 16
        if mode:
            os.chmod(path, mode & 0o777)
os.makedirs(os.path.join(site, "bin"), exist_ok=True)
script = os.path.join(site, "bin", "coloader")
with open(script, "w") as f:
    f.write("#!%s\nimport sys\nfrom coloader.__main__ import main\nsys.exit(main())\n" % sys.executable)
os.chmod(script, 0o755)
print("gpu_wheel: unpacked into", site)
PY
fi
[[ -x $site/coloader/bin/coloader && -x $site/bin/coloader ]] || { echo "gpu_wheel: the install lacks coloader/bin/coloader or bin/coloader" >&2; exit 1; }

echo "== ldd of every ELF file the wheel installed"
python3 - "$site" >"$out/ldd.tmp" <<'PY'
import subprocess, sys
from pathlib import Path
site = Path(sys.argv[1])
bad = []
for path in sorted(site.rglob("*")):
    if not path.is_file() or path.is_symlink() or path.read_bytes()[:4] != b"\x7fELF":
        continue
    out = subprocess.run(["ldd", str(path)], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"}).stdout
    print("##", path.relative_to(site)); print(out)
    bad += ["%s: %s" % (path.relative_to(site), l.strip()) for l in out.splitlines()
            if "not found" in l or any(x in l for x in ("libgdal", "libgdcm", "libpoppler"))]
print("\n".join(["PROBLEMS:"] + bad) if bad else "OK: every library resolved, no GDAL/GDCM/poppler")
sys.exit(1 if bad else 0)
PY
[[ $? -eq 0 ]] || status=1
cat "$out/ldd.tmp" >>"$log" && rm "$out/ldd.tmp"
tail -1 "$log"

data=/tmp/coloader-wheel-data
if [[ $what == tests || $what == smoke || $what == contract ]]; then
  [[ -d $data ]] || python3 scripts/make_dataset.py --source .device/photos --out "$data" --images 600 --classes 10 >/dev/null 2>&1
fi
if [[ $what == tests || $what == smoke ]]; then
  images=$(find "$data" -type f | wc -l)
  py=$(command -v python3)
  clean=(env -i "PATH=$(dirname "$py"):/usr/bin:/bin" "HOME=$HOME" "PYTHONPATH=$site" "TMPDIR=/tmp")
  for decode in gpu cpu; do
    name=wheel-smoke-$decode-$$
    slog="$out/smoke_$decode.tmp"
    echo "== clean environment: coloader serve --device cuda:0 --decode $decode + coloader.Loader(device='cuda'), $images images"
    "${clean[@]}" "$site/bin/coloader" serve --data "$data" --name "$name" --device cuda:0 --decode "$decode" \
      --batch-size 64 --epochs 1 --workers "$(nproc)" --quiet >"$slog.serve" 2>&1 &
    producer=$!
    "${clean[@]}" timeout 300 python3 - "$name" "$images" <<'PY' >>"$slog" 2>&1
import sys, torch, coloader
name, images = sys.argv[1], int(sys.argv[2])
assert "coloader-wheel-site" in coloader.__file__, coloader.__file__
loader = coloader.Loader(name, batch_size=100, device="cuda", wait_for_producer=120, timeout=120)
seen = []
for x, y in loader:
    assert x.is_cuda and x.shape[0] == y.shape[0]
    seen += loader.indices.tolist()
torch.cuda.synchronize()
ok = sorted(seen) == list(range(images))
print("smoke: %d samples, %d unique, exact epoch: %s" % (len(seen), len(set(seen)), ok))
sys.exit(0 if ok else 1)
PY
    rc=$?
    wait "$producer" || rc=1
    # (One file per writer: the producer's offset would overwrite the Loader's lines.)
    cat "$slog.serve" >>"$slog" && rm "$slog.serve"
    grep -E "decode: (gpu|auto)|exact epoch|error|Error" "$slog" | head -5
    [[ $rc -eq 0 ]] || { status=1; echo "gpu_wheel: the clean-environment run with --decode $decode failed (see smoke.log)"; tail -20 "$slog"; }
    { echo "== --decode $decode"; cat "$slog"; } >>"$out/smoke.log" && rm "$slog"
  done
fi
if [[ $what == tests ]]; then
  echo "== pixel_ops_test (the pixel ops' GPU twin against the CPU twin)"
  .device/bin/pixel_ops_test 2>&1 | tee "$out/pixel_ops_test.log" | grep -E '^\[ +(FAILED|PASSED) |tests? ran|Failure|\[pixel ops\]' || true
  [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
  echo "== gpu_decode_test (nvJPEG + the GPU resize kernel against the CPU path)"
  .device/bin/gpu_decode_test 2>&1 | tee "$out/gpu_decode_test.log" | grep -E '^\[ +(FAILED|PASSED) |tests? ran|Failure' || true
  [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
  echo "== gpu_test (with the wheel's coloader: $COLOADER_BINARY)"
  .device/bin/gpu_test 2>&1 | tee "$out/gpu_test.log" | grep -E '^\[ +(FAILED|PASSED) |tests? ran|Failure' || true
  [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
  echo "== integration_test (host path, the wheel's coloader)"
  .device/bin/integration_test 2>&1 | tee "$out/integration_test.log" | grep -E '^\[ +(FAILED|PASSED) |tests? ran|Failure' || true
  [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
  echo "== python tests against the wheel's libraries and binary (torch $(python3 -c 'import torch; print(torch.__version__)'))"
  python3 -m pytest -q -p no:cacheprovider python/tests -rfEs 2>&1 | tee "$out/pytest.log" | tail -15
  [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
elif [[ $what == smoke ]]; then
  :  # steps 1-3 only
elif [[ $what == contract ]]; then
  # CONTRACT names the steps (default all): bench (first: its figures come back even if a suite
  # overruns the command's limit), handoff (benchmarks/token_handoff.py beside TensorSocket, with
  # .whl/ from benchmarks/fetch_wheels.sh), catchup (benchmarks/catch_up.py), pixel_ops (pixel_ops_test), gpu_decode (gpu_decode_test), gpu_test, pytest (PYTEST_FILES:
  # which files).
  steps=${CONTRACT:-bench,gpu_test,pytest}
  if [[ ,$steps, == *,bench,* ]]; then
    echo "== what a job's own batches cost, host and device path (benchmarks/isolation_cost.py)"
    nvidia-smi --query-gpu=name --format=csv,noheader >"$out/isolation_cost.log"
    python3 benchmarks/isolation_cost.py --data "$data" --batches "${BENCH_BATCHES:-20}" --repeats "${BENCH_REPEATS:-3}" \
      --out "$out/isolation_cost.json" 2>&1 | tee -a "$out/isolation_cost.log" | tail -8
    [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
  fi
  if [[ ,$steps, == *,handoff,* ]]; then
    # Token batches beside TensorSocket, with and without the Loader's batch ahead, three runs
    # one after another (their raw files stay in /tmp: the log carries each run's rows).
    echo "== hand-off of token batches (benchmarks/token_handoff.py, 3 runs)"
    nvidia-smi --query-gpu=name --format=csv,noheader >"$out/token_handoff.log"
    if compgen -G ".whl/*.whl" >/dev/null; then
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/handoff-site \
        .whl/*.whl 2>&1 | grep -v "running pip as the 'root'" | tee -a "$out/token_handoff.log"
    else
      echo "gpu_wheel: no wheels in .whl/ (benchmarks/fetch_wheels.sh): the tensorsocket setup will fail" | tee -a "$out/token_handoff.log"
    fi
    # HANDOFF_MPS=1: every process an MPS client (its own daemon, stopped after), as jobs beside
    # a producer run in production; HANDOFF_PROBE=1: token_handoff.py --probe --profile;
    # HANDOFF_SETUPS: its --setups.
    mps_dir=
    if [[ ${HANDOFF_MPS:-0} == 1 ]]; then
      mps_dir=$(mktemp -d /tmp/gpu-handoff-mps-XXXXXX)
      export CUDA_MPS_PIPE_DIRECTORY=$mps_dir/pipe CUDA_MPS_LOG_DIRECTORY=$mps_dir/log
      mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
      nvidia-cuda-mps-control -d && echo "-- under MPS" >>"$out/token_handoff.log" || {
        echo "gpu_wheel: cannot start the MPS control daemon" | tee -a "$out/token_handoff.log"; status=1; }
    fi
    for run in $(seq "${HANDOFF_RUNS:-3}"); do
      echo "-- run $run" >>"$out/token_handoff.log"
      PYTHONPATH=$site:/tmp/handoff-site python3 benchmarks/token_handoff.py --out "/tmp/token_handoff$run" \
        --batches "${HANDOFF_BATCHES:-500}" $([[ ${HANDOFF_PROBE:-0} == 1 ]] && echo --probe --profile) \
        ${HANDOFF_SETUPS:+--setups "$HANDOFF_SETUPS"} 2>&1 |
        tee -a "$out/token_handoff.log" | grep -v '^profile:' | tail -7
      [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
    done
    if [[ -n $mps_dir ]]; then
      echo quit | nvidia-cuda-mps-control >/dev/null 2>&1
      unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
    fi
  fi
  if [[ ,$steps, == *,catchup,* ]]; then
    # Issue 39: what catch-up costs the jobs that share a producer, host and device path, jobs
    # reading as fast as the producer decodes and jobs with a training step.
    echo "== what catching late jobs up costs the shared ones (benchmarks/catch_up.py)"
    nvidia-smi --query-gpu=name --format=csv,noheader >"$out/catch_up.log"
    cdata=/tmp/coloader-catchup-data
    [[ -d $cdata ]] || python3 scripts/make_dataset.py --source .device/photos --out "$cdata" \
      --images "${CATCHUP_IMAGES:-4000}" --classes 10 >/dev/null 2>&1
    python3 benchmarks/catch_up.py --data "$cdata" --device cuda:0 --binary "$COLOADER_BINARY" \
      --epochs "${CATCHUP_EPOCHS:-4}" --step-ms "${CATCHUP_STEP_MS:-0,20}" --out "$out/catch_up.json" 2>&1 |
      tee -a "$out/catch_up.log" | grep -v '^{' | tail -8
    [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
  fi
  if [[ ,$steps, == *,pixel_ops,* ]]; then
    echo "== pixel_ops_test (the pixel ops' GPU twin against the CPU twin)"
    .device/bin/pixel_ops_test 2>&1 | tee "$out/pixel_ops_test.log" | grep -E '^\[ +(FAILED|PASSED) |tests? ran|Failure|\[pixel ops\]' || true
    [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
  fi
  if [[ ,$steps, == *,gpu_decode,* ]]; then
    echo "== gpu_decode_test (nvJPEG + the GPU resize kernel against the CPU path)"
    .device/bin/gpu_decode_test 2>&1 | tee "$out/gpu_decode_test.log" | grep -E '^\[ +(FAILED|PASSED) |tests? ran|Failure' || true
    [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
  fi
  if [[ ,$steps, == *,gpu_test,* ]]; then
    echo "== gpu_test (with the wheel's coloader: $COLOADER_BINARY)"
    .device/bin/gpu_test 2>&1 | tee "$out/gpu_test.log" | grep -E '^\[ +(FAILED|PASSED|  OK) |tests? ran|Failure' || true
    [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
  fi
  if [[ ,$steps, == *,recipes,* ]]; then
    echo "== what a recipe costs the producer: plain against torchvision's reference, native and Python-fed (benchmarks/recipes.py)"
    nvidia-smi --query-gpu=name --format=csv,noheader >"$out/recipes.log"
    rdata=/tmp/coloader-recipes-data
    [[ -d $rdata ]] || python3 scripts/make_dataset.py --source .device/photos --out "$rdata" \
      --images "${RECIPES_IMAGES:-4000}" --classes 10 >/dev/null 2>&1
    python3 benchmarks/recipes.py --data "$rdata" --device cuda:0 --binary "$COLOADER_BINARY" \
      --epochs "${RECIPES_EPOCHS:-3}" 2>&1 | tee -a "$out/recipes.log" | grep -v '^{' | tail -12
    [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
  fi
  if [[ ,$steps, == *,pytest,* ]]; then
    echo "== the device path's Python tests and the contract suite (torch $(python3 -c 'import torch; print(torch.__version__)'))"
    # shellcheck disable=SC2086  # a list of files
    python3 -m pytest -q -p no:cacheprovider ${PYTEST_FILES:-python/tests/test_loader_gpu.py python/tests/test_contract.py} \
      -rfEs 2>&1 | tee "$out/pytest.log" | tail -15
    [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
  fi
elif [[ $what == recipes-train ]]; then
  # Issue 36: training under torchvision's reference recipe (examples/recipes/reference.yaml:
  # RandomResizedCrop(176) + flip + TrivialAugmentWide + Normalize + RandomErasing(0.1)) and under
  # the plain one (--augment train at 176) with --decode auto, each run beside the synthetic
  # ceiling at the same size (measured twice: a ceiling that moved voids the comparison), in one
  # command; per-job DataLoaders run the same recipe's Compose (COLLOCATED_RECIPE). RECIPES_TRAIN_MODELS,
  # RECIPES_TRAIN_N, RECIPES_TRAIN_REPEATS, RECIPES_TRAIN_SETUPS choose the matrix.
  common=(--split --models "${RECIPES_TRAIN_MODELS:-resnet18,resnet50}" --n "${RECIPES_TRAIN_N:-1,4}"
          --repeats "${RECIPES_TRAIN_REPEATS:-1}" --image-size 176 --no-fairness
          --setups "${RECIPES_TRAIN_SETUPS:-synthetic,coloader-auto}")
  export COLLOCATED_IMAGES=${COLLOCATED_IMAGES:-5000}
  OUT=$out/reference benchmarks/collocated/run_collocated.sh "${common[@]}" --job-env COLLOCATED_RECIPE=reference \
    --coloader-flags "--output float32 --transform $here/examples/recipes/reference.yaml" --deadline 270 || status=1
  OUT=$out/plain benchmarks/collocated/run_collocated.sh "${common[@]}" --coloader-flags "--output float32" --deadline 270 || status=1
  # What the device tool brings back is a few files: the tables and the logs.
  rm -f "$out"/{reference,plain}/{*.png,runs.tar.gz}
elif [[ $what == collocated ]]; then
  # A smaller dataset than the benchmark default keeps the command within the device limit.
  COLLOCATED_IMAGES=${COLLOCATED_IMAGES:-5000} benchmarks/collocated/run_collocated.sh --tiny || status=1
else
  echo "usage: scripts/gpu.sh wheel|smoke|collocated|recipes-train|contract" >&2
  exit 2
fi
echo "gpu_wheel: status $status"
exit $status
