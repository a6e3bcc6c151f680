#!/usr/bin/env bash
# Installs what coloader needs on Debian 12 (apt) and builds it into build/.
#   scripts/setup.sh            build and test dependencies + the build
#   scripts/setup.sh --bench    also what the benchmarks compare against and plot with
#   scripts/setup.sh --deps-only  the build's dependencies only (apt, nvJPEG's header), no build
#   scripts/setup.sh --deps-only --tests  the tests' too, no build (scripts/gpu_bundle.sh)
# The CUDA code is compiled wherever nvcc is installed (COLOADER_WITH_CUDA=AUTO); it runs only
# on a machine with a GPU, and the GPU tests skip elsewhere.
set -euo pipefail
cd "$(dirname "$0")/.."

# What building and running coloader needs (--deps-only: all that scripts/build_wheel.sh, and a
# user who builds the wheel, installs).
packages=(build-essential cmake pkg-config
          cppzmq-dev libzmq3-dev libturbojpeg0-dev libjpeg62-turbo-dev
          libopencv-core-dev libopencv-imgproc-dev
          python3 python3-numpy python3-torch
          python3-torchvision)  # torchvision: the memory estimator's models (coloader.estimator)
packages+=(libcli11-dev)  # tools/: every subcommand's flags, usage and --help (CLI11, header-only)
packages+=(libyaml-cpp-dev)  # placement/: jobs files in YAML and JSON, with line:column marks
packages+=(libyaml-dev)  # YAML files read by libyaml's event parser (yaml-cpp reads JSON)
packages+=(libspng-dev)  # PNG decoding (pipeline/decode/decode_png.cc)
packages+=(libwebp-dev)  # WebP decoding (pipeline/decode/decode_webp.cc)
packages+=(libcurl4-openssl-dev)  # http(s):// shards (pipeline/source/shard_fetch.cc: the header; libcurl is dlopened)
packages+=(libtiff-dev)  # TIFF decoding (pipeline/decode/decode_tiff.cc)
packages+=(unzip python3-pip python3-venv)  # nvJPEG's header from PyPI (below); build_wheel.sh's venv and checks
packages+=(zlib1g-dev)  # .tar.gz shards (pipeline/source/shard_fetch.cc)
# What the tests and the demo need besides (not with --deps-only alone: a Slurm's daemons and a
# wallpaper package have no place on a machine that only builds the wheel).
if [[ " $* " != *" --deps-only "* || " $* " == *" --tests "* ]]; then
  packages+=(libgtest-dev python3-pytest)
  packages+=(mate-backgrounds python3-pil)  # scripts/make_dataset.py: real photos, as JPEGs
  packages+=(slurm-wlm munge iproute2)  # tests/slurm: a real Slurm (slurmctld, slurmd, munge) for the scale-out test
  packages+=(python3-yaml)  # python/tests/test_kubernetes_example.py parses the Kubernetes sketch
fi
if [[ "${1:-}" == "--bench" ]]; then
  packages+=(python3-matplotlib)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=()
  [[ $(id -u) -ne 0 ]] && sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# nvJPEG's header for `serve --decode gpu` (the library itself is loaded at run time from the
# GPU machine's CUDA): CUDA toolkits from the network installer lack it, PyPI's CUDA 13 wheel
# ships it. Skipped without nvcc; a build without it still works (--decode gpu says why not).
if command -v nvcc >/dev/null || [[ -x /usr/local/cuda/bin/nvcc ]]; then
  if [[ ! -f .deps/nvjpeg/include/nvjpeg.h ]]; then
    tmp=$(mktemp -d)
    if python3 -m pip download -q --no-deps --only-binary=:all: --platform manylinux2014_x86_64 \
         -d "$tmp" 'nvidia-nvjpeg>=13,<14' 2>/dev/null; then
      mkdir -p .deps/nvjpeg
      unzip -q -o "$tmp"/nvidia_nvjpeg-*.whl 'nvidia/cu13/*' -d "$tmp/x"
      cp -r "$tmp"/x/nvidia/cu13/. .deps/nvjpeg/
      echo "setup: nvJPEG header in .deps/nvjpeg"
    else
      echo "setup: could not fetch the nvidia-nvjpeg wheel; building without --decode gpu"
    fi
    rm -rf "$tmp"
  fi
fi

# scripts/build_wheel.sh needs the dependencies, not this build.
[[ " $* " == *" --deps-only "* ]] && exit 0

jobs=$(nproc)
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCOLOADER_WITH_CUDA=AUTO >/dev/null
cmake --build build -j "$jobs"
echo "setup: built build/tools/coloader"
