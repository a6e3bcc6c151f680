"""C++ users' path: `cmake --install` the build, then examples/cpp as its own CMake project.

    /usr/bin/python3 -m pytest -q tests/package/test_cmake_package.py

Needs the build tree (build/, or $COLOADER_BUILD_DIR) with coloader, coloader_client and coloader_c
built (scripts/setup.sh does it). Installs it into a temporary prefix, configures and builds
examples/cpp with only CMAKE_PREFIX_PATH pointing there (find_package(coloader)), and runs the
example against a real `coloader serve` for an exact epoch.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from helpers import REPO, STEP_TIMEOUT, Serve, check_ldd, make_imagefolder, unique_name  # noqa: E402

BUILD = Path(os.environ.get("COLOADER_BUILD_DIR", REPO / "build"))
CMAKE_TIMEOUT = 600  # configuring and building the example on a loaded 2-core machine


def run(command):
    """Runs a cmake step; a failure shows its output (a configure or compile error) in the report."""
    out = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=CMAKE_TIMEOUT)
    assert out.returncode == 0, "`%s` failed:\n%s" % (" ".join(map(str, command)), out.stdout[-6000:])


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    """(prefix, the built example's path), from a fresh install of the build tree."""
    if not (BUILD / "CMakeCache.txt").is_file():
        pytest.fail("no build tree at %s: run scripts/setup.sh (or set COLOADER_BUILD_DIR)" % BUILD)
    base = tmp_path_factory.mktemp("cmake_package")
    prefix, work = base / "prefix", base / "example"
    run(["cmake", "--install", str(BUILD), "--prefix", str(prefix)])
    # The example's build sees the installed package and nothing of this tree but its own sources.
    run(["cmake", "-S", str(REPO / "examples" / "cpp"), "-B", str(work), "-DCMAKE_BUILD_TYPE=RelWithDebInfo",
         "-DCMAKE_PREFIX_PATH=%s" % prefix])
    run(["cmake", "--build", str(work), "-j", "2"])
    return prefix, work / "consume"


def test_installed_layout(example):
    prefix, binary = example
    libdir = next(d for d in (prefix / "lib", prefix / "lib64") if d.is_dir())
    for rel in ("include/coloader/client/consumer.h", "include/coloader/client/c_api.h",
                "include/coloader/common/status.h", "include/coloader/common/protocol.h",
                "include/coloader/common/c_abi.h"):
        assert (prefix / rel).is_file(), rel
    for rel in ("libcoloader_client.a", "libcoloader_common.a", "libcoloader_c.so",
                "cmake/coloader/coloaderConfig.cmake", "cmake/coloader/coloaderTargets.cmake"):
        assert (libdir / rel).is_file(), rel
    assert not list(prefix.rglob("*_internal.h")), "private headers must not be installed"
    # The example really was configured from the installed package, not from the source tree.
    cache = (binary.parent / "CMakeCache.txt").read_text()
    assert "coloader_DIR:PATH=%s" % (libdir / "cmake" / "coloader") in cache
    check_ldd([binary, libdir / "libcoloader_c.so"], dict(os.environ))


def test_example_reads_an_exact_epoch(example, tmp_path):
    prefix, binary = example
    images = 37
    make_imagefolder(tmp_path / "data", images=images, classes=3)
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    env = dict(os.environ, COLOADER_RUN_DIR=str(run_dir))
    name = unique_name("cmake-example")
    serve = Serve([str(BUILD / "tools" / "coloader"), "serve", "--data", str(tmp_path / "data"), "--name", name,
                   "--batch-size", "8", "--image-size", "64", "--workers", "2", "--epochs", "2"], env, tmp_path)
    try:
        out = subprocess.run([str(binary), "--name", name, "--batch-size", "5"], env=env, capture_output=True,
                             text=True, timeout=STEP_TIMEOUT)
    finally:
        rc = serve.wait()
    assert out.returncode == 0, out.stderr + "".join(serve.lines)
    assert rc == 0, "".join(serve.lines)
    epochs = re.findall(r"^epoch (\d+): (\d+) batches, (\d+) samples, (\d+) unique$", out.stdout, re.M)
    assert [e[1:] for e in epochs] == [("8", "37", "37")] * 2, out.stdout


def test_example_reports_a_missing_producer(example, tmp_path):
    prefix, binary = example
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    out = subprocess.run([str(binary), "--name", unique_name("nobody")], capture_output=True, text=True,
                         env=dict(os.environ, COLOADER_RUN_DIR=str(run_dir)), timeout=STEP_TIMEOUT)
    assert out.returncode == 1 and "consume:" in out.stderr, out
