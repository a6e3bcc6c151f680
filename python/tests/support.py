"""What the Python package's tests share: a real `coloader serve` process per test (Producer,
the `serve` fixture), a private run directory (`env`), a small ImageFolder of real JPEGs
(`dataset`), and helpers to read epochs and run things in threads.

The tests build nothing: they expect build/tools/coloader and build/client/libcoloader_c.so (or
$COLOADER_BUILD_DIR/..., or $COLOADER_BINARY and $COLOADER_LIBRARY). Every test gets its own
COLOADER_RUN_DIR and a producer name unique to this run (the shared-memory ring is named after
the producer, machine-wide). Readiness is always explicit: the producer's "serving" line, a
child's "ready" line, or the producer's status; the only waits are bounded polls of status.
"""

import contextlib
import itertools
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

PYTHON_DIR = Path(__file__).resolve().parents[1]
REPO = PYTHON_DIR.parent
sys.path.insert(0, str(PYTHON_DIR))  # test the source tree, not an installed copy

import coloader  # noqa: E402

torch = pytest.importorskip("torch")

BUILD = Path(os.environ.get("COLOADER_BUILD_DIR", REPO / "build"))
BINARY = Path(os.environ.get("COLOADER_BINARY", BUILD / "tools" / "coloader"))
LIBRARY = Path(os.environ.get("COLOADER_LIBRARY", BUILD / "client" / "libcoloader_c.so"))

NUM_IMAGES = 103
NUM_CLASSES = 3
PRODUCER_BATCH = 16
STEP_TIMEOUT = 10  # seconds: every Loader gets one, so a bug fails a test instead of hanging it

_names = itertools.count()


def missing_build():
    missing = [str(p) for p in (BINARY, LIBRARY) if not p.is_file()]
    return ("build the tree first (cmake -S . -B build && cmake --build build); missing: " +
            ", ".join(missing)) if missing else None


# Every test module that starts producers marks itself with this (pytestmark = needs_build).
needs_build = pytest.mark.skipif(missing_build() is not None, reason=missing_build() or "")


class Producer:
    """A `coloader serve` subprocess, started and waited for by its "serving" line. With
    via_python, started as the package's `coloader` command does it (python -m coloader), which
    reads torch checkpoints for --resume."""

    def __init__(self, data, *args, batch_size=PRODUCER_BATCH, epochs=2, window=4, via_python=False,
                 start_timeout=STEP_TIMEOUT, max_open_files=None):
        self.name = "pytest-%d-%d" % (os.getpid(), next(_names))
        epoch_args = ["--forever"] if epochs is None else ["--epochs", str(epochs)]
        command = [sys.executable, "-m", "coloader"] if via_python else [str(BINARY)]
        cmd = [*command, "serve", "--data", str(data), "--name", self.name,
               "--batch-size", str(batch_size), "--window", str(window), *epoch_args,
               "--quiet", "--image-size", "32", "--workers", "2",
               "--heartbeat-ms", "100", "--heartbeat-timeout-ms", "1500", *args]
        env = dict(os.environ, PYTHONPATH=str(PYTHON_DIR), COLOADER_BINARY=str(BINARY))
        def limit():  # the child's own descriptor limit (`ulimit -n`), soft and hard
            import resource
            resource.setrlimit(resource.RLIMIT_NOFILE, (max_open_files, max_open_files))

        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env,
                                     preexec_fn=limit if max_open_files else None)
        self.lines = []
        self._serving = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        if not self._serving.wait(start_timeout) or self.proc.poll() is not None:
            self.stop()
            raise AssertionError("producer did not start serving:\n" + "".join(self.lines))

    def _read(self):
        for line in self.proc.stderr:  # drained to the end, so the producer never blocks on it
            self.lines.append(line)
            if "serving" in line:
                self._serving.set()
        self._serving.set()

    def status(self):
        out = subprocess.run([str(BINARY), "status", "--name", self.name, "--json"],
                             capture_output=True, text=True, timeout=STEP_TIMEOUT)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    def consumer(self, pid=None):
        consumers = [c for c in self.status()["consumers"] if pid is None or c["pid"] == pid]
        assert len(consumers) == 1, consumers
        return consumers[0]

    def wait_for(self, predicate, what, timeout=STEP_TIMEOUT):
        """Polls the producer's status until predicate(status) holds; returns that status."""
        deadline = time.monotonic() + timeout
        while True:
            st = self.status()
            if predicate(st):
                return st
            if time.monotonic() > deadline:
                raise AssertionError("timed out waiting for %s; last status: %s" % (what, st))
            time.sleep(0.02)

    def wait(self, timeout=STEP_TIMEOUT):
        rc = self.proc.wait(timeout)
        self._reader.join(timeout)
        return rc

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self._reader.join(STEP_TIMEOUT)
        self.proc.stderr.close()
        # Killed, it leaves its ring and mailboxes in /dev/shm as a crash would (a restart
        # would reclaim them): the name is unique to this test, so remove them here.
        for f in os.listdir("/dev/shm"):
            if f.endswith("-" + self.name) or f.endswith("-" + self.name + ".mbox"):
                os.unlink(os.path.join("/dev/shm", f))


def loader_for(producer, **kwargs):
    kwargs.setdefault("timeout", STEP_TIMEOUT)
    return coloader.Loader(producer.name, **kwargs)


def run_epoch(loader, iterator=None):
    """One epoch (a new one, or the rest of `iterator`'s): (list of batch sizes, list of dataset
    indices, {index: label})."""
    sizes, indices, labels = [], [], {}
    for images, lbl in (loader if iterator is None else iterator):
        assert images.shape[0] == lbl.shape[0] == loader.indices.shape[0]
        sizes.append(images.shape[0])
        for i, l in zip(loader.indices.tolist(), lbl.tolist()):
            indices.append(i)
            labels[i] = l
    return sizes, indices, labels


def in_thread(fn, *args):
    """Runs fn in a thread; returns a callable that joins it and returns (or raises) its result."""
    result = {}

    def body():
        try:
            result["value"] = fn(*args)
        except BaseException as e:  # re-raised in the joining thread
            result["error"] = e

    t = threading.Thread(target=body, daemon=True)
    t.start()

    def join(timeout=3 * STEP_TIMEOUT):
        t.join(timeout)
        assert not t.is_alive(), "thread still running after %s s" % timeout
        if "error" in result:
            raise result["error"]
        return result["value"]

    return join


def read_until_held_back(producer, **kwargs):
    """Under a producer started with --min-consumers 2: a reader ('stopper') takes one batch and
    stops, and a Loader made with `kwargs` (a timeout among them) reads until its next() raises
    the Timeout of a producer held back by it. Returns a namespace: stopper, stopper_it, held
    (the stopper's batch), loader, it, got (batches the loader took), timeout (the exception)."""
    import types

    import pytest

    stopper = loader_for(producer, batch_size=PRODUCER_BATCH, client_name="stopper")
    loader = loader_for(producer, batch_size=PRODUCER_BATCH, **kwargs)
    stopper_start = start_reading(stopper)
    it = iter(loader)
    stopper_it = stopper_start()
    held = next(stopper_it)  # and then it stops reading
    got = 0
    with pytest.raises(coloader.Timeout) as e:
        while True:
            next(it)
            got += 1
    return types.SimpleNamespace(stopper=stopper, stopper_it=stopper_it, held=held, loader=loader, it=it, got=got,
                                 timeout=e.value)


def expected_sizes(batch, drop_last=False, n=NUM_IMAGES):
    full, rest = divmod(n, batch)
    return [batch] * full + ([] if drop_last or rest == 0 else [rest])


@contextlib.contextmanager
def reaped(child):
    """A child process (subprocess.Popen) that is killed and waited for when the block ends,
    whatever happened in it."""
    try:
        yield child
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def start_reading(loader):
    """Starts `loader`'s first epoch in a thread (iter() attaches it, and waits for the epoch to
    begin, which under --min-consumers needs the others too); the callable returned joins it and
    gives the epoch's iterator."""
    return in_thread(iter, loader)

