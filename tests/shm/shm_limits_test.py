#!/usr/bin/env python3
"""A small /dev/shm is a clear error, never a SIGBUS (issue 17).

Runs real `coloader serve` / `coloader consume` processes (and, where torch is installed, a
Python-fed coloader.Producer) in a private mount namespace whose /dev/shm is a small tmpfs, as
in a default Docker container (64 MB there; --shm-mb here):

  too big     the issue's case (`--batch-size 256 --workers 2`, float32 224x224: ~882 MiB) exits
              1 before serving, with one message naming /dev/shm, what it has free, what the
              ring needs (slots x slot bytes) and the ways out; nothing is left behind
  fits        a small ring: consumers of batch sizes 5, 8 and 13 see exact epochs
  full        while that producer serves, /dev/shm is filled to the last byte: its consumers
              still finish exact epochs (its pages were reserved at start), and a second
              producer started then fails with the same clear message and exit 1
  python      coloader.Producer with a ring that does not fit raises, with the same message

    tests/shm/shm_limits_test.py --coloader build/tools/coloader [--device cuda:0] [--shm-mb 48]

With --device (the GPU machine) the producer keeps its ring in GPU memory and /dev/shm holds
only the uint8 staging: the same checks, plus a host-path consumer of that producer on a full
/dev/shm refused with a clear message. Exit 0: pass; 77: skipped (no private mount namespace:
not root, or unshare/mount refused), with the reason on stdout; 1: a check failed.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "stress"))
import harness  # noqa: E402

SKIP = 77
IMAGES = 97  # a prime: no consumer batch size divides it
INNER = "COLOADER_SHM_TEST_INNER"

failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        failures.append(what)


def reexec_in_namespace(a):
    """Runs this script again in a private mount namespace with a small tmpfs on /dev/shm."""
    if os.geteuid() != 0:
        print(f"SKIP: needs root for a private mount namespace (unshare -m); running as uid {os.geteuid()}")
        return SKIP
    if not shutil.which("unshare"):
        print("SKIP: unshare(1) is not installed (util-linux)")
        return SKIP
    probe = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                            f"mount -t tmpfs -o size={a.shm_mb}m tmpfs /dev/shm"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        print(f"SKIP: cannot mount a private tmpfs over /dev/shm: {probe.stderr.strip()} "
              "(a container needs CAP_SYS_ADMIN, e.g. docker run --privileged)")
        return SKIP
    script = (f"mount -t tmpfs -o size={a.shm_mb}m,mode=1777 tmpfs /dev/shm && "
              f"exec {sys.executable} {os.path.abspath(__file__)} " + " ".join(sys.argv[1:]))
    env = dict(os.environ, **{INNER: "1"})
    return subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script], env=env).returncode


def shm_free():
    st = os.statvfs("/dev/shm")
    return st.f_bavail * st.f_frsize


def fill_shm(path):
    """Writes one file until the tmpfs is full; returns the bytes written."""
    written = 0
    block = b"\xa5" * (1 << 20)
    with open(path, "wb", buffering=0) as f:
        while True:
            try:
                written += f.write(block)
            except OSError:
                break
        small = b"\x5a" * 4096
        while True:  # the last partial megabyte, page by page
            try:
                written += f.write(small)
            except OSError:
                break
    return written


def clear_message_checks(tag, rc, err, device):
    check(rc == 1, f"{tag}: exit code 1 (got {harness.SIG_NAMES.get(rc, rc)})")
    check(rc != -7, f"{tag}: no SIGBUS")
    lines = [l for l in err.splitlines() if l.startswith("coloader serve:")]
    check(len(lines) == 1, f"{tag}: one error message (got {len(lines)})")
    for needle in ("/dev/shm has", "free", "needs", "slots", "per slot", "--shm-size", "medium: Memory",
                   "sizeLimit", "--window", "--batch-size", "--image-size"):
        check(needle in err, f"{tag}: the message says {needle!r}")
    if not device:
        check("--device cuda:N" in err and "uint8 staging" in err, f"{tag}: the message offers --device with its figure")


def run_consumers(s, name, sizes, epochs, device):
    procs = []
    for b in sizes:
        args = ["consume", "--name", name, "--json", "--batch-size", str(b), "--epochs", str(epochs), "--wait-ms", "20000"]
        if device:
            args.append("--device")
        procs.append((b, s.spawn(args, f"consume-b{b}")))
    return procs


def judge_consumers(tag, procs, epochs):
    for b, p in procs:
        rc = p.wait(120)
        check(rc == 0, f"{tag}: consumer batch {b} exit 0 (got {harness.SIG_NAMES.get(rc, rc)}: {p.stderr()[-300:]!r})")
        lines = [json.loads(l) for l in p.stdout().splitlines() if l.strip()]
        check(len(lines) == epochs, f"{tag}: consumer batch {b} reported {len(lines)} epochs, wanted {epochs}")
        for e in lines:
            exact = (not e["partial"] and e["samples"] == IMAGES and e["unique_samples"] == IMAGES
                     and e["index_sum"] == IMAGES * (IMAGES - 1) // 2)
            check(exact, f"{tag}: consumer batch {b} epoch {e['epoch']} exact ({e['samples']} samples, "
                         f"{e['unique_samples']} unique, index sum {e['index_sum']})")


def nothing_left(tag, s, name):
    shm, run = s.leftovers(name)
    check(not shm and not run, f"{tag}: nothing left in /dev/shm or the run directory ({shm}, {run})")


def python_producer(a, s, tmp):
    """coloader.Producer with a ring /dev/shm cannot hold raises ColoaderError with the message."""
    code = r"""
import sys, torch, coloader
p = coloader.Producer([(torch.zeros(256, 3, 224, 224), torch.zeros(256, dtype=torch.int64))], name="pyshm", window=4)
try:
    p.run(1)
except coloader.ColoaderError as e:
    print("RAISED", type(e).__name__)
    print(e)
    sys.exit(0)
print("NO ERROR")
sys.exit(3)
"""
    repo = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    env = dict(s.env, PYTHONPATH=os.path.join(repo, "python"), COLOADER_BUILD_DIR=os.path.dirname(os.path.dirname(a.coloader)))
    probe = subprocess.run([sys.executable, "-c", "import torch"], capture_output=True)
    if probe.returncode != 0:
        print("skip python: torch is not installed for", sys.executable)
        return
    # scripts/sanitize.sh's builds: an uninstrumented Python cannot load ASan/TSan libraries
    # (the runtime must come first). The ordinary build's run of this test covers this part.
    lib = os.path.join(os.path.dirname(os.path.dirname(a.coloader)), "producer", "libcoloader_producer_c.so")
    linked = subprocess.run(["ldd", lib], capture_output=True, text=True).stdout
    if "libasan" in linked or "libtsan" in linked:
        print("skip python: the producer library is built with a sanitizer, which Python cannot load")
        return
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    check(r.returncode == 0 and "RAISED" in r.stdout, f"python: coloader.Producer raised (rc {r.returncode}: "
                                                      f"{(r.stdout + r.stderr)[-400:]!r})")
    check("/dev/shm has" in r.stdout and "window=" in r.stdout and "--shm-size" in r.stdout,
          "python: the exception carries the /dev/shm message with Producer's own argument names")
    nothing_left("python", s, "pyshm")


def inner(a):
    s = harness.Session(os.path.abspath(a.coloader), keep=a.keep)
    device = ["--device", a.device] if a.device else []
    try:
        data = os.path.join(s.tmp, "data")
        harness.make_dataset(data, IMAGES, seed=17)
        print(f"/dev/shm: {shm_free() >> 20} MiB free", flush=True)

        # The case: the default float32 224x224 ring of batch 256.
        p = s.spawn(["serve", "--data", data, "--name", "big", "--batch-size", "256", "--workers", "2",
                     "--epochs", "1"] + device, "serve-big")
        rc = p.wait(60)
        print(p.stderr(), flush=True)
        clear_message_checks("too big", rc, p.stderr(), bool(a.device))
        nothing_left("too big", s, "big")

        # A ring that fits, with consumers of batches smaller than, equal to and straddling 8.
        small = ["--batch-size", "8", "--image-size", "64", "--workers", "2", "--window", "4",
                 "--heartbeat-ms", "100", "--heartbeat-timeout-ms", "3000"] + device
        fits = s.serve("fits", data, small + ["--epochs", "2", "--min-consumers", "3"])
        procs = run_consumers(s, "fits", (5, 8, 13), 2, bool(a.device))
        judge_consumers("fits", procs, 2)
        check(fits.wait(30) == 0, f"fits: producer exit 0 ({fits.stderr()[-300:]!r})")
        nothing_left("fits", s, "fits")

        # /dev/shm filled to the last byte while a producer serves: it and its consumers carry
        # on; a second producer fails clearly.
        first = s.serve("first", data, small + ["--epochs", "3", "--min-consumers", "2"])
        filler = "/dev/shm/coloader-test-filler"
        written = fill_shm(filler)
        check(shm_free() < (1 << 20), f"full: /dev/shm filled ({written >> 20} MiB written, {shm_free()} bytes free)")
        second = s.spawn(["serve", "--data", data, "--name", "second", "--epochs", "1"] + small, "serve-second")
        rc = second.wait(60)
        print(second.stderr(), flush=True)
        clear_message_checks("full: second producer", rc, second.stderr(), bool(a.device))
        nothing_left("full: second producer", s, "second")
        if a.device:
            # A host-path consumer of a GPU producer needs the host tensor areas, reserved when
            # the first attaches: on a full /dev/shm it is refused, clearly, and nobody dies.
            host = s.spawn(["consume", "--name", "first", "--json", "--wait-ms", "20000"], "consume-host")
            rc = host.wait(60)
            check(rc == 1 and "/dev/shm" in host.stderr() and "device path" in host.stderr(),
                  f"full: host-path consumer of the GPU ring refused clearly (rc {rc}: {host.stderr()[-300:]!r})")
        procs = run_consumers(s, "first", (5, 13), 3, bool(a.device))
        judge_consumers("full: first producer", procs, 3)
        check(first.wait(30) == 0, f"full: first producer exit 0, no SIGBUS (rc {first.rc}: {first.stderr()[-300:]!r})")
        os.unlink(filler)
        nothing_left("full", s, "first")

        python_producer(a, s, s.tmp)
    finally:
        for pid in s.pids:
            try:
                os.kill(pid, 9)
            except OSError:
                pass
        if a.keep:
            print("logs in", s.logs)
        s.close()
    print("shm limits:", "PASS" if not failures else f"FAIL ({len(failures)})", flush=True)
    return 0 if not failures else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--coloader", required=True)
    ap.add_argument("--shm-mb", type=int, default=48, help="the private /dev/shm's size (32 to 64 as in a container)")
    ap.add_argument("--device", default="", help="cuda:N: the GPU variant")
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    a.coloader = os.path.abspath(a.coloader)
    if os.environ.get(INNER) != "1":
        return reexec_in_namespace(a)
    return inner(a)


if __name__ == "__main__":
    sys.exit(main())
