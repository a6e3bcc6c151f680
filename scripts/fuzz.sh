#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan + UBSan) into build-fuzz/ and runs each for a
# bounded time, both at once (one per core), starting from the seed corpora in
# tests/fuzz/corpus/<target>. Prints one summary line per target; exits non-zero when a
# target crashed, leaked, timed out or broke its property.
#   scripts/fuzz.sh                    every target, FUZZ_SECONDS (default 60) each
#   FUZZ_SECONDS=300 scripts/fuzz.sh decode
# What a run finds stays in build-fuzz/: new inputs in corpus/<target>/ (the next run starts
# from them too), crashes in artifacts/<target>/. To keep a crash as a regression test:
#   build-fuzz/tests/fuzz/<target>_fuzz -minimize_crash=1 -max_total_time=60 \
#       -exact_artifact_path=tests/fuzz/regressions/<target>/<name> build-fuzz/artifacts/<target>/crash-...
# and tests/unit/fuzz_regression_test.cc replays it in every build.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${FUZZ_SECONDS:-60}
targets=("$@")
((${#targets[@]})) || targets=(protocol decode tar json yaml)

scripts/setup-hardening.sh
start=$SECONDS
CC=clang CXX=clang++ cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCOLOADER_WITH_CUDA=OFF \
  -DCOLOADER_BUILD_FUZZERS=ON -DCOLOADER_BUILD_TESTS=OFF -DCOLOADER_BUILD_BENCHMARKS=OFF >/dev/null
cmake --build build-fuzz -j "$(nproc)" --target "${targets[@]/%/_fuzz}"
echo "fuzz: built in $((SECONDS - start)) s"

export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:${ASAN_OPTIONS:-}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:${UBSAN_OPTIONS:-}"
pids=()
for t in "${targets[@]}"; do
  mkdir -p "build-fuzz/corpus/$t" "build-fuzz/artifacts/$t"
  # The new inputs go to the first folder (build-fuzz), the seeds are read from the second.
  # -timeout: one input taking seconds is a bug (the decode harness bounds image sizes).
  seeds=("tests/fuzz/corpus/$t")
  [[ -d tests/fuzz/regressions/$t ]] && seeds+=("tests/fuzz/regressions/$t")  # saved crashes, once there are any
  build-fuzz/tests/fuzz/${t}_fuzz "build-fuzz/corpus/$t" "${seeds[@]}" \
    -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="build-fuzz/artifacts/$t/" >"build-fuzz/$t.log" 2>&1 &
  pids+=($!)
done

failed=0
for i in "${!targets[@]}"; do
  t=${targets[$i]}
  rc=0
  wait "${pids[$i]}" || rc=$?
  log=build-fuzz/$t.log
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  last=$(grep -E '^#[0-9]+' "$log" | tail -n 1 || true)
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
  corpus=$(sed -n 's/.* corp: \([0-9]*\/[0-9a-zA-Z]*\).*/\1/p' <<<"$last")
  if ((rc == 0)); then
    echo "fuzz: $t ok: ${execs:-?} executions in ${seconds} s, coverage ${cov:-?} edges, ${ft:-?} features, corpus ${corpus:-?}"
  else
    failed=1
    artifact=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -n 1)
    echo "fuzz: $t FAILED (exit $rc) after ${execs:-?} executions: ${artifact:-no artifact}; log: $log"
    grep -E '^(==[0-9]+==ERROR|SUMMARY|[a-z_]+_fuzz: )|#[0-9]+ .* in coloader::' "$log" | head -n 20 || true
  fi
done
exit "$failed"
