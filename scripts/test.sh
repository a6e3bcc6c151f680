#!/usr/bin/env bash
# Sets up, builds and runs every test: ctest (unit tests, and integration tests that drive real
# producer and consumer processes; GPU tests skip without a GPU), then the Python package's
# tests with Debian's python3 (which has torch).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
(cd build && ctest --output-on-failure -j 2 --timeout 300)
/usr/bin/python3 -m pytest -q python/tests
