#!/usr/bin/env bash
# Packs what the GPU machine needs to run coloader's GPU tests and benchmarks into .device/
# (git-ignored; carried by the device tool). The GPU machine has the CUDA driver, Python and
# PyTorch but none of ZeroMQ, OpenCV or TurboJPEG, and no package registry: the binaries are
# built here (same x86-64, same nvcc) and travel with the shared libraries they load.
#
#   scripts/gpu_bundle.sh          build with CUDA, then pack .device/
#   scripts/gpu_bundle.sh --tests-only   only the test binaries, fixtures and photos: coloader
#                                  itself comes from the wheel (scripts/build_wheel.sh, then
#                                  scripts/gpu.sh wheel there), so the bundle is what the wheel
#                                  does not ship
# COLOADER_BUNDLE=DIR packs into DIR instead; COLOADER_BUNDLE_TARGETS="coloader coloader_c"
# builds and packs only those (the benchmarks need no test binaries); SKIP_BUILD=1 packs what
# build/ holds.
# On the GPU machine: scripts/gpu.sh SUITE (reads .device/, writes results under $OUT).
set -euo pipefail
cd "$(dirname "$0")/.."

dest=${COLOADER_BUNDLE:-.device}
targets=${COLOADER_BUNDLE_TARGETS:-}
tests_only=
if [[ ${1:-} == --tests-only ]]; then
  tests_only=1
  targets="gpu_test gpu_decode_test pixel_ops_test integration_test"
fi
scripts/setup.sh --deps-only --tests  # GoogleTest, and the photos and PIL below
if [[ -z ${SKIP_BUILD:-} ]]; then
  cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCOLOADER_WITH_CUDA=ON >/dev/null
  cmake --build build -j "$(nproc)" ${targets:+--target $targets} >/dev/null
fi

rm -rf "$dest"
mkdir -p "$dest/bin" "$dest/lib" "$dest/photos" "$dest/data"
[[ -z $tests_only ]] && cp build/tools/coloader "$dest/bin/"
if [[ -z $targets || -n $tests_only ]]; then
  cp build/tests/gpu_test build/tests/integration_test build/tests/formats_test "$dest/bin/"
  [[ -f build/tests/gpu_decode_test ]] && cp build/tests/gpu_decode_test "$dest/bin/"
  [[ -f build/tests/pixel_ops_test ]] && cp build/tests/pixel_ops_test "$dest/bin/"
  cp -r tests/data/* "$dest/data/"  # fixtures for the GPU decode tests (COLOADER_TEST_DATA)
fi
if [[ -z $tests_only ]]; then
  [[ -f build/client/libcoloader_c.so ]] && cp build/client/libcoloader_c.so "$dest/lib/"
  [[ -f build/producer/libcoloader_producer_c.so ]] && cp build/producer/libcoloader_producer_c.so "$dest/lib/"
fi

# The shared-library closure, less what every Linux has (glibc, the C++ runtime: the GPU
# machine's are newer) and the CUDA driver (it has its own; cudart is linked statically).
skip='^(libc|libm|libdl|librt|libpthread|libresolv|ld-linux-x86-64|libstdc\+\+|libgcc_s|libcuda)\.so'
for f in "$dest"/bin/* "$dest"/lib/*.so; do if [[ -f $f ]]; then ldd "$f"; fi; done | awk '/=> \//{print $3}' | sort -u |
  while read -r lib; do
    base=$(basename "$lib")
    [[ $base =~ $skip ]] && continue
    cp -L "$lib" "$dest/lib/$base"
  done

strip --strip-debug "$dest"/bin/* "$dest"/lib/*.so*

# A few real photographs, downscaled, from which scripts/make_dataset.py builds an
# ImageNet-like dataset on the GPU machine (carrying the dataset itself would not fit).
COLOADER_BUNDLE_DEST="$dest" /usr/bin/python3 - <<'PY'
import glob, os
from PIL import Image
srcs = sorted(glob.glob('/usr/share/backgrounds/mate/nature/*.jpg'))
picked = srcs[:12]
if not picked:
    raise SystemExit('gpu_bundle: no photos in /usr/share/backgrounds/mate/nature (apt-get install mate-backgrounds)')
for i, path in enumerate(picked):
    im = Image.open(path).convert('RGB')
    im.thumbnail((1600, 1600))
    im.save(os.path.join(os.environ['COLOADER_BUNDLE_DEST'], 'photos', f'photo{i:02d}.jpg'), quality=92)
print(f'gpu_bundle: {len(picked)} photos')
PY
du -sh "$dest" "$dest/lib" | sed 's/^/gpu_bundle: /'
