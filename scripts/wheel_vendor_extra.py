#!/usr/bin/env python3
"""Vendors into a repaired wheel the libraries that manylinux allows it to take from the system
but that GPU nodes often lack, so the wheel runs on a headless server.

    wheel_vendor_extra.py WHEEL        (run by scripts/build_wheel.sh, with auditwheel installed)

Debian's libopencv_core links libGLX (OpenGL interop we never call; it is bound at load time,
BIND_NOW), and libGLX needs libX11. The manylinux policy lists libX11.so.6 as "present on every
desktop", so auditwheel leaves it out; headless CUDA images (nvidia/cuda runtime, most GPU
servers) do not have it. This copies the libraries named in EXTRA and their closure into
coloader.libs/ the way auditwheel does: a content-hashed file name (it cannot clash with another
copy in the same process), its SONAME set to that name, RUNPATH $ORIGIN, and every DT_NEEDED in
the wheel that names one rewritten. Libraries auditwheel already vendored are reused, not copied
twice. RECORD is rewritten by auditwheel's own wheel context.
"""
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

from auditwheel.wheeltools import InWheel

EXTRA = {"libX11.so.6"}
# What every glibc Linux has; never vendored (the manylinux policy's core).
BASE = {"libc.so.6", "libm.so.6", "libdl.so.2", "librt.so.1", "libpthread.so.0", "ld-linux-x86-64.so.2",
        "libgcc_s.so.1", "libstdc++.so.6", "libresolv.so.2", "libutil.so.1", "libz.so.1"}


def patchelf(*args):
    return subprocess.run(["patchelf", *map(str, args)], check=True, capture_output=True, text=True).stdout


def needed(path):
    return patchelf("--print-needed", path).split()


def elf_files(root):
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.is_symlink():
            with open(path, "rb") as f:
                if f.read(4) == b"\x7fELF":
                    yield path


def system_library(soname):
    """The path the dynamic loader's cache gives for soname (x86-64), or exit with why."""
    out = subprocess.run(["/sbin/ldconfig", "-p"], check=True, capture_output=True, text=True).stdout
    for line in out.splitlines():
        name, _, rest = line.strip().partition(" ")
        if name == soname and "x86-64" in rest and "=>" in rest:
            return Path(rest.split("=>")[1].strip())
    sys.exit("wheel_vendor_extra: %s is not installed on this build machine; install it (Debian: "
             "apt-cache search %s) so it can be vendored" % (soname, soname.split(".so")[0]))


def main(wheel):
    wheel = Path(wheel).resolve()
    out = wheel.with_name(wheel.name + ".tmp")
    with InWheel(wheel, out):
        root = Path(".").resolve()
        libs = root / "coloader.libs"
        files = list(elf_files(root))
        renamed = {}  # soname -> file name in coloader.libs
        added = []
        queue = sorted({n for f in files for n in needed(f) if n in EXTRA})
        while queue:
            soname = queue.pop()
            if soname in renamed or soname in BASE:
                continue
            stem = soname.split(".so")[0]
            present = sorted(p.name for p in libs.iterdir() if p.name.startswith(stem + "-"))
            if present:
                renamed[soname] = present[0]
                continue
            src = system_library(soname)
            data = src.resolve().read_bytes()
            name = "%s-%s%s" % (stem, hashlib.sha256(data).hexdigest()[:8], soname[len(stem):])
            dest = libs / name
            shutil.copyfile(src.resolve(), dest)
            os.chmod(dest, 0o755)
            added.append(dest)
            renamed[soname] = name
            print("wheel_vendor_extra: vendored %s as coloader.libs/%s" % (src, name))
            queue += [n for n in needed(dest) if n not in BASE]
        # One patchelf run per file: each run on an old library aligned to 2 MiB pages appends
        # a new segment, padding the file by megabytes.
        for f in elf_files(root):
            args = []
            if f in added:
                args += ["--set-soname", f.name, "--set-rpath", "$ORIGIN"]
            for n in needed(f):
                if n in renamed:
                    args += ["--replace-needed", n, renamed[n]]
            if args:
                patchelf(*args, f)
    out.replace(wheel)


if __name__ == "__main__":
    main(sys.argv[1])
