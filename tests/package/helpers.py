"""Shared by the package tests: real datasets, a real `coloader serve` process, ELF checks."""

import os
import subprocess
import sys
import threading
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
STEP_TIMEOUT = 60  # seconds for a producer to start serving, or a consumer to finish its epoch

# Libraries that must never reach anything the wheel ships: they come with Debian's
# libopencv-imgcodecs (GDAL and its ~100 dependencies) and have no business in an image loader.
FORBIDDEN = ("libgdal", "libgdcm", "libpoppler")


def make_imagefolder(out, images=40, classes=3):
    """A small ImageFolder of real-photo JPEGs (scripts/make_dataset.py, Debian's photographs)."""
    subprocess.run([sys.executable, str(REPO / "scripts" / "make_dataset.py"), "--out", str(out),
                    "--images", str(images), "--classes", str(classes)],
                   check=True, stdout=subprocess.DEVNULL, timeout=300)
    files = [p for p in Path(out).rglob("*") if p.is_file()]
    assert len(files) == images, "make_dataset.py made %d files, not %d" % (len(files), images)
    return files


def unique_name(prefix):
    # The shared-memory ring is named after the producer, machine-wide.
    return "%s-%d-%s" % (prefix, os.getpid(), uuid.uuid4().hex[:8])


class Serve:
    """`coloader serve` as a subprocess, ready once it printed its "serving" line."""

    def __init__(self, command, env, cwd):
        self.lines = []
        self.proc = subprocess.Popen(command, env=env, cwd=cwd, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True)
        self._serving = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        if not self._serving.wait(STEP_TIMEOUT) or self.proc.poll() is not None:
            self.stop()
            raise AssertionError("`%s` did not start serving:\n%s" % (" ".join(map(str, command)),
                                                                   "".join(self.lines)))

    def _read(self):
        for line in self.proc.stderr:
            self.lines.append(line)
            if "serving" in line:
                self._serving.set()
        self._serving.set()  # it exited: let the waiter look

    def wait(self):
        """The exit status once it served every epoch; its output is in self.lines."""
        try:
            rc = self.proc.wait(STEP_TIMEOUT)
        finally:
            self.stop()
        self._reader.join(5)
        return rc

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def elf_files(root):
    root = Path(root)
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.is_symlink():
            with open(path, "rb") as f:
                if f.read(4) == b"\x7fELF":
                    yield path


def check_ldd(paths, env):
    """ldd of each file: every library resolved, none of FORBIDDEN. Returns {path: ldd output}."""
    outputs = {}
    problems = []
    for path in paths:
        out = subprocess.run(["ldd", str(path)], env=env, capture_output=True, text=True, timeout=60).stdout
        outputs[path] = out
        for line in out.splitlines():
            if "not found" in line:
                problems.append("%s: %s" % (path, line.strip()))
            if any(lib in line for lib in FORBIDDEN):
                problems.append("%s loads %s" % (path, line.strip()))
    assert not problems, "\n".join(problems)
    return outputs
