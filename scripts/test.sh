#!/usr/bin/env bash
# Sets up, builds and runs every test (unit and integration, real processes) with ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cd build
ctest --output-on-failure -j 2 --timeout 300
