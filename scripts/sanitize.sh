#!/usr/bin/env bash
# Builds coloader with a sanitizer and runs the unit and integration tests under it.
#   scripts/sanitize.sh address   ASan + UBSan (gcc), into build-asan/
#   scripts/sanitize.sh thread    TSan (gcc), into build-tsan/
# The integration tests spawn the (equally instrumented) `coloader` binary; a report in it
# makes it exit with a non-zero code, which the tests check. Extra ctest arguments may follow
# the sanitizer name (e.g. `scripts/sanitize.sh thread -R Integration`).
set -euo pipefail
cd "$(dirname "$0")/.."

kind=${1:-address}
shift || true
case "$kind" in
  address) dir=build-asan ;;
  thread) dir=build-tsan ;;
  *) echo "usage: scripts/sanitize.sh address|thread [ctest args...]" >&2; exit 2 ;;
esac

# Reports halt the process with this exit code (distinct from a test's ordinary failure, and
# from 128 + signal) and go to stderr, which ctest and the integration tests' Child capture.
# ASan's abort_on_error would exit by SIGABRT instead; a fixed code is easier to read in a
# test's "exit code" assertion, and a core dump of an ASan process is gigabytes.
export ASAN_OPTIONS="detect_leaks=1:halt_on_error=1:exitcode=66:abort_on_error=0:strict_string_checks=1:check_initialization_order=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:exitcode=66"
export LSAN_OPTIONS="exitcode=66:suppressions=$PWD/tests/lsan.supp"
export TSAN_OPTIONS="halt_on_error=1:exitcode=66:second_deadlock_stack=1:history_size=4:suppressions=$PWD/tests/tsan.supp"

jobs=$(nproc)
start=$SECONDS
# -O1 -g1: what the sanitizers' authors advise (reports keep file:line), and the instrumented
# build is what CI waits for: a producer source file compiles in 5.2 s instead of 11.1 s at
# RelWithDebInfo's -O2 -g (ASan + UBSan, g++ 12, the dev box).
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCOLOADER_WITH_CUDA=OFF \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
  -DCOLOADER_SANITIZE="$kind" -DCOLOADER_BUILD_BENCHMARKS=OFF >/dev/null
cmake --build "$dir" -j "$jobs"
echo "sanitize($kind): built in $((SECONDS - start)) s"

start=$SECONDS
cd "$dir"
# Instrumented code runs several times slower: a longer per-test timeout than scripts/test.sh.
log=ctest.log
status=0
ctest --output-on-failure -j "$jobs" --timeout 600 -L 'unit|integration' "$@" 2>&1 | tee "$log" || status=$?
echo "sanitize($kind): tests ran in $((SECONDS - start)) s, ctest exit $status (log: $dir/$log)"
if [[ $kind == address && $status -eq 0 && -x /usr/bin/python3 ]]; then
  # The instrumented producer and consumers under 40 s of random faults: every exit path a
  # fault takes (detached, producer gone, killed mid-batch) runs under ASan, and LeakSanitizer
  # checks each process that exits by itself. RSS is not judged: ASan's quarantine grows it.
  # The heartbeat timeout is 3 s, not the uninstrumented run's 1 s: here the point is memory
  # errors on every exit path, and instrumented processes on a loaded 2-core box once sent a
  # heartbeat 1.3 s apart, which the 1 s timeout counted as a detached consumer (seed 78036).
  start=$SECONDS
  /usr/bin/python3 ../tests/stress/fault_stress.py --coloader tools/coloader --duration 40 --min-faults 150 \
    --producer-every 50 --rss-tolerance 100 --timeout-ms 3000 2>&1 | grep -vE '^ ' || status=$?
  echo "sanitize($kind): fault stress ran in $((SECONDS - start)) s, exit $status"
fi
exit "$status"
