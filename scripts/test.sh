#!/usr/bin/env bash
# Sets up, builds and runs every test: ctest (unit tests, and integration tests that drive real
# producer and consumer processes; GPU tests skip without a GPU), then the Python package's
# tests with Debian's python3 (which has torch). Every suite runs even when one before it failed;
# the summary names each suite's outcome, and the exit status is 1 if any failed.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
scripts/setup.sh || { echo "test: setup failed: nothing was tested" >&2; exit 1; }

results=()
failed=0
suite() {  # suite NAME COMMAND...
  local name=$1 start=$SECONDS rc
  shift
  "$@"
  rc=$?
  if ((rc == 0)); then
    results+=("  passed  $name ($((SECONDS - start)) s)")
  else
    results+=("  FAILED  $name (exit $rc, $((SECONDS - start)) s)")
    failed=1
  fi
}
suite ctest bash -c 'cd build && ctest --output-on-failure -j 2 --timeout 300'
suite pytest /usr/bin/python3 -m pytest -q python/tests

echo "test: every suite ran:"
printf '%s\n' "${results[@]}"
exit "$failed"
