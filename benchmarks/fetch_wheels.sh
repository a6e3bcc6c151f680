#!/usr/bin/env bash
# Downloads the wheels benchmarks/collocated/collocated.py needs on the GPU machine, which has
# Python 3.12 and PyTorch but no package registry: TensorSocket 0.0.5 (the comparison in the
# collocated benchmark) and what it imports that the machine lacks (pyzmq, tornado). Run here,
# where pip reaches PyPI; the directory (default .whl/, git-ignored) is then carried to the GPU
# machine, where benchmarks/collocated/run_collocated.sh installs it with pip --no-index.
#
#   benchmarks/fetch_wheels.sh [DIR]
set -euo pipefail
dir=${1:-$(dirname "$0")/../.whl}
mkdir -p "$dir"
# One version of each, pinned: two versions of one package stop `pip install --no-index`.
wheels=(tensorsocket==0.0.5 pyzmq==26.2.0 tornado==6.4.2)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform manylinux_2_5_x86_64 \
  -d "$dir" "${wheels[@]}"
ls -l "$dir"
