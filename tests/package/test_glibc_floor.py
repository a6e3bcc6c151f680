"""scripts/manylinux/glibc_floor.sh (issue 43, the ground for a manylinux_2_28 wheel): a C++ shared
object built with this machine's g++ and headers and linked with its flags needs no glibc past
2.28 and no GLIBCXX, and runs here and in an older C library's root (Debian 11, glibc 2.31, made
with debootstrap: the oldest these machines reach).

    /usr/bin/python3 -m pytest -q tests/package/test_glibc_floor.py     (the older root needs root)
"""
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
FLOOR = (2, 28)


def versions(path, prefix):
    """The symbol versions `path` needs of one library family (GLIBC, GLIBCXX, GCC)."""
    out = subprocess.run(["objdump", "-T", str(path)], check=True, capture_output=True, text=True).stdout
    return {tuple(int(x) for x in v.split(".")) for v in re.findall(r"\b%s_([0-9.]+[0-9])\b" % prefix, out)}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = subprocess.run([str(REPO / "scripts/manylinux/glibc_floor.sh")], check=True, capture_output=True,
                         text=True, timeout=900).stdout
    assigned = dict(shlex.split(line)[0].split("=", 1) for line in out.strip().splitlines())
    flags, exe_flags = shlex.split(assigned["GLIBC_FLOOR_LDFLAGS"]), shlex.split(assigned["GLIBC_FLOOR_EXE_LDFLAGS"])
    work = tmp_path_factory.mktemp("floor")
    subprocess.run(["g++", "-O2", "-std=c++17", "-fPIC", "-c", str(HERE / "glibc_probe.cc"), "-o", str(work / "probe.o")],
                   check=True)
    subprocess.run(["g++", "-shared", str(work / "probe.o"), *flags, "-o", str(work / "libglibc_probe.so")], check=True)
    subprocess.run(["gcc", "-O2", "-c", str(HERE / "glibc_probe_main.c"), "-o", str(work / "main.o")], check=True)
    subprocess.run(["g++", str(work / "main.o"), *exe_flags, "-o", str(work / "glibc_probe")], check=True)
    return work, flags


def test_needs_no_glibc_past_2_28_and_no_libstdcxx(built):
    work, _ = built
    for f in (work / "libglibc_probe.so", work / "glibc_probe"):
        glibc = versions(f, "GLIBC")
        assert glibc and max(glibc) <= FLOOR, "%s needs GLIBC_%s" % (f.name, ".".join(map(str, max(glibc))))
        assert not versions(f, "GLIBCXX"), "%s needs the shared libstdc++" % f.name
    needed = subprocess.run(["readelf", "-d", str(work / "libglibc_probe.so")], check=True, capture_output=True,
                            text=True).stdout
    assert "libstdc++" not in needed, needed
    for f in (work / "libglibc_probe.so", work / "glibc_probe"):
        # libc before ld.so: glibc < 2.32's ld.so exports its minimal malloc, and the first wins.
        order = re.findall(r"Shared library: \[([^\]]+)\]", subprocess.run(
            ["readelf", "-d", str(f)], check=True, capture_output=True, text=True).stdout)
        assert order.index("libc.so.6") < order.index("ld-linux-x86-64.so.2"), (f.name, order)


def test_runs_here(built):
    work, _ = built
    out = subprocess.run([str(work / "glibc_probe"), "/etc/hostname"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "probe: ok" in out.stdout, out


def test_without_the_shim_the_link_fails_here_not_there(built, tmp_path):
    """The shim is what makes glibc 2.36's headers link against 2.28: without it the link names
    what 2.28 lacks (-z defs), rather than making an object that would fail to load there."""
    work, flags = built
    bare = [f for f in flags if not f.endswith("shim.o")]
    run = subprocess.run(["g++", "-shared", str(work / "probe.o"), *bare, "-o", str(tmp_path / "x.so")],
                         capture_output=True, text=True)
    assert run.returncode != 0 and "undefined reference" in run.stderr, run.stderr[-2000:]


def test_runs_on_an_older_glibc(built):
    if os.geteuid() != 0 or not shutil.which("debootstrap"):
        pytest.skip("needs root and debootstrap (CI has both): a Debian 11 root")
    work, _ = built
    root = REPO / "build-manylinux" / "bullseye"
    if not (root / "usr/bin/env").exists():
        shutil.rmtree(root, ignore_errors=True)
        subprocess.run(["debootstrap", "--variant=minbase", "bullseye", str(root), "http://deb.debian.org/debian"],
                       check=True, capture_output=True, timeout=900)
    libc = os.path.realpath(root / "lib/x86_64-linux-gnu/libc.so.6")
    assert "2.31" in libc, "the root's C library is %s, not glibc 2.31" % libc
    inside = root / "probe"
    shutil.rmtree(inside, ignore_errors=True)
    inside.mkdir()
    for f in ("glibc_probe", "libglibc_probe.so"):
        shutil.copy2(work / f, inside / f)
    out = subprocess.run(["chroot", str(root), "/probe/glibc_probe", "/etc/debian_version"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0 and "probe: ok" in out.stdout, out
