"""The built wheel, installed as a user installs it: a fresh venv, nothing else.

    scripts/setup.sh --deps-only --tests && scripts/build_wheel.sh && /usr/bin/python3 -m pytest -q tests/package/test_wheel.py

The wheel is dist/coloader-*.whl (or $COLOADER_TEST_WHEEL). It is installed with pip into a new
venv that sees Debian's numpy and torch (--system-site-packages) and nothing of this tree; every
process the test starts runs with an environment of PATH=/usr/bin:/bin and a private HOME only:
no LD_LIBRARY_PATH, no COLOADER_* variables, its working directory outside the repository. Then:
every ELF file it installed resolves all its libraries (ldd) and none loads GDAL, GDCM or
poppler; and the installed `coloader serve` feeds a `coloader.Loader` an exact epoch of real
JPEGs.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from helpers import REPO, STEP_TIMEOUT, Serve, check_ldd, elf_files, make_imagefolder, unique_name  # noqa: E402

SYSTEM_PYTHON = "/usr/bin/python3"  # Debian's, which has numpy and torch


def find_wheel():
    if os.environ.get("COLOADER_TEST_WHEEL"):
        return Path(os.environ["COLOADER_TEST_WHEEL"])
    wheels = sorted((REPO / "dist").glob("coloader-*.whl"))
    if len(wheels) != 1:
        pytest.fail("expected one wheel in %s, found %s: run scripts/build_wheel.sh (or set "
                    "COLOADER_TEST_WHEEL to the wheel's path)" % (REPO / "dist", [w.name for w in wheels] or "none"))
    return wheels[0]


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(venv, clean environment, site-packages, working directory) with the wheel installed."""
    wheel = find_wheel()
    assert "-py3-none-manylinux_" in wheel.name, "%s is not a repaired manylinux wheel" % wheel.name
    base = tmp_path_factory.mktemp("wheel")
    home, work = base / "home", base / "work"
    home.mkdir()
    work.mkdir()
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home)}
    venv = base / "venv"
    subprocess.run([SYSTEM_PYTHON, "-m", "venv", "--system-site-packages", str(venv)], env=env, check=True,
                   timeout=STEP_TIMEOUT)
    # --no-index --no-deps: numpy comes from the system; nothing may be fetched or built.
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                    "--disable-pip-version-check", str(wheel)], env=env, cwd=work, check=True, timeout=STEP_TIMEOUT)
    site = subprocess.run([str(venv / "bin" / "python"), "-c",
                           "import coloader, os; print(os.path.dirname(os.path.dirname(coloader.__file__)))"],
                          env=env, cwd=work, check=True, capture_output=True, text=True).stdout.strip()
    site = Path(site)
    assert site.is_relative_to(venv), "coloader was imported from %s, not from the venv" % site
    return venv, env, site, work


def test_package_contents(installed):
    venv, env, site, work = installed
    for rel in ("coloader/bin/coloader", "coloader/libcoloader_c.so", "coloader/libcoloader_producer_c.so",
                "coloader/estimator/conv_workspaces_h200.csv.gz"):
        assert (site / rel).is_file(), "the wheel did not install %s" % rel
    assert (venv / "bin" / "coloader").is_file(), "the wheel's console script `coloader` is missing"
    assert not list(site.glob("coloader/**/libcoloader_imgcodecs*")), "the OpenCV imgcodecs plugin must not ship"


def test_the_memory_estimator_runs_with_its_measured_workspaces(installed):
    # The estimator reads the measured cuDNN table shipped in the package: every layer of a
    # ResNet-18 at batch 32 was measured, so none is estimated from a neighbour.
    venv, env, site, work = installed
    out = subprocess.run([str(venv / "bin" / "python"), "-m", "coloader.estimator", "--model", "torchvision:resnet18",
                          "--batch-size", "32", "--json"], env=env, cwd=work, check=True, capture_output=True,
                         text=True, timeout=STEP_TIMEOUT).stdout
    e = json.loads(out)
    assert e["raw"]["convolutions"] == 40 and e["raw"]["unmeasured_convolutions"] == 0, e["raw"]
    assert e["parts"]["workspace"] > 64 and e["total_mib"] > e["parts"]["cuda_context"], e
    # The old module path, which the planner runs, forwards to it.
    old = subprocess.run([str(venv / "bin" / "python"), "-m", "coloader.estimate", "--help"], env=env, cwd=work,
                         capture_output=True, text=True, timeout=STEP_TIMEOUT)
    assert old.returncode == 0 and "--batch-size" in old.stdout, old


def test_every_elf_resolves_without_gdal(installed):
    venv, env, site, work = installed
    files = list(elf_files(site / "coloader")) + list(elf_files(site / "coloader.libs"))
    assert len(files) >= 3, files
    outputs = check_ldd(files, env)
    # The vendored copies are the ones loaded, not whatever this machine happens to have.
    binary = outputs[site / "coloader" / "bin" / "coloader"]
    assert "libzmq" in binary and "coloader.libs" in binary, binary


# What every glibc Linux has. Anything else the wheel's files need must be in coloader.libs: the
# manylinux policy would also allow libX11, libGL and glib from the system, but headless GPU
# nodes lack them (scripts/wheel_vendor_extra.py).
BASE = {"libc.so.6", "libm.so.6", "libdl.so.2", "librt.so.1", "libpthread.so.0", "ld-linux-x86-64.so.2",
        "libgcc_s.so.1", "libstdc++.so.6", "libresolv.so.2", "libutil.so.1", "libz.so.1"}


def test_needs_nothing_beyond_glibc_and_the_cxx_runtime(installed):
    venv, env, site, work = installed
    vendored = {p.name for p in (site / "coloader.libs").iterdir()}
    outside = []
    for path in list(elf_files(site / "coloader")) + list(elf_files(site / "coloader.libs")):
        out = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            if "(NEEDED)" in line:
                name = line.split("[", 1)[1].rstrip("]")
                if name not in BASE and name not in vendored:
                    outside.append("%s needs %s" % (path.relative_to(site), name))
    assert not outside, "\n".join(outside)


def test_one_version_everywhere_and_type_information(installed):
    """coloader.__version__, the installed package's metadata, `coloader --version` and the C
    library's version are the top CMakeLists.txt's project() version; the package is typed."""
    venv, env, site, work = installed
    cmake = re.search(r"project\(coloader VERSION ([0-9][0-9.]*)", (REPO / "CMakeLists.txt").read_text()).group(1)
    out = subprocess.run([str(venv / "bin" / "python"), "-c",
                          "import coloader, importlib.metadata as m; "
                          "print(coloader.__version__, m.version('coloader'), coloader.library_version())"],
                         env=env, cwd=work, check=True, capture_output=True, text=True, timeout=STEP_TIMEOUT)
    assert out.stdout.split() == [cmake] * 3, out
    binary = subprocess.run([str(venv / "bin" / "coloader"), "--version"], env=env, cwd=work, check=True,
                            capture_output=True, text=True, timeout=STEP_TIMEOUT)
    assert binary.stdout.strip() == "coloader " + cmake, binary
    assert (site / "coloader" / "py.typed").is_file(), "the wheel lacks py.typed"


def test_console_script_runs_the_installed_binary(installed):
    venv, env, site, work = installed
    out = subprocess.run([str(venv / "bin" / "coloader"), "serve", "--help"], env=env, cwd=work,
                         capture_output=True, text=True, timeout=STEP_TIMEOUT)
    assert "--data" in out.stdout + out.stderr, out


def test_finds_nvjpeg_from_the_pypi_wheel(installed, tmp_path):
    """nvidia-nvjpeg's layout (nvidia/cu13/lib, a namespace package) in another sys.path entry."""
    venv, env, site, work = installed
    lib = tmp_path / "nvidia" / "cu13" / "lib" / "libnvjpeg.so.13"
    lib.parent.mkdir(parents=True)
    lib.write_bytes(b"")  # the launcher only locates it; the binary opens it
    code = "from coloader.__main__ import find_nvjpeg_wheel; print(find_nvjpeg_wheel())"
    found = subprocess.run([str(venv / "bin" / "python"), "-c", code], env=dict(env, PYTHONPATH=str(tmp_path)),
                           cwd=work, check=True, capture_output=True, text=True).stdout.strip()
    assert found == str(lib)
    none = subprocess.run([str(venv / "bin" / "python"), "-c", code], env=env, cwd=work, check=True,
                          capture_output=True, text=True).stdout.strip()
    assert none == "None" or none.endswith("nvidia/cu13/lib/libnvjpeg.so.13"), none


CONSUMER = r"""
import json, sys
import coloader
loader = coloader.Loader(sys.argv[1], batch_size=int(sys.argv[2]), timeout=60, wait_for_producer=60)
seen, batches = [], 0
for images, labels in loader:
    assert images.shape[0] == labels.shape[0] == loader.indices.shape[0]
    seen += loader.indices.tolist()
    batches += 1
# The client library this process mapped: the installed package's, not a build tree's.
maps = sorted({l.split()[-1] for l in open("/proc/self/maps") if l.rstrip().endswith("libcoloader_c.so")})
print(json.dumps({"indices": seen, "batches": batches, "len": len(loader), "partial": loader.partial,
                  "libraries": maps}))
"""


def test_serve_and_loader_exact_epoch(installed, tmp_path):
    venv, env, site, work = installed
    images = 37  # not a multiple of either batch size: the tail must arrive
    make_imagefolder(tmp_path / "data", images=images, classes=3)
    name = unique_name("wheel")
    serve = Serve([str(venv / "bin" / "coloader"), "serve", "--data", str(tmp_path / "data"), "--name", name,
                   "--batch-size", "8", "--image-size", "64", "--workers", "2", "--epochs", "1"], env, work)
    try:
        consumer = subprocess.run([str(venv / "bin" / "python"), "-c", CONSUMER, name, "5"], env=env, cwd=work,
                                  capture_output=True, text=True, timeout=STEP_TIMEOUT)
    finally:
        rc = serve.wait()
    assert consumer.returncode == 0, consumer.stderr + "".join(serve.lines)
    assert rc == 0, "".join(serve.lines)
    result = json.loads(consumer.stdout.strip().splitlines()[-1])
    assert sorted(result["indices"]) == list(range(images)), result
    assert result["batches"] == result["len"] == (images + 4) // 5
    assert not result["partial"]
    assert result["libraries"] == [str(site / "coloader" / "libcoloader_c.so")], result["libraries"]
