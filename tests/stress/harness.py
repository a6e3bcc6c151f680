"""Shared by the fault stress test and the soak: real `coloader` processes in a private run
directory, a small dataset of real-photo JPEGs, and what /proc and `coloader status` say about
a producer. Standard library only, except Pillow for the dataset (a plain-noise fallback keeps
it working without Pillow's photos).
"""
import json
import os
import random
import shutil
import signal
import subprocess
import tempfile
import time


def make_dataset(root, images, classes=4, size=(96, 72), seed=0):
    """An ImageFolder tree of `images` small JPEGs: crops of real photographs (real content
    decodes like real data), or seeded noise where none are installed."""
    from PIL import Image

    rng = random.Random(seed)
    photos = []
    # Debian's photos, or those scripts/gpu_bundle.sh carries to the GPU machine.
    here = os.path.dirname(os.path.abspath(__file__))
    for src in ("/usr/share/backgrounds/mate/nature", os.path.join(here, "..", "..", ".device", "photos")):
        if os.path.isdir(src) and not photos:
            photos = sorted(os.path.join(src, f) for f in os.listdir(src) if f.lower().endswith(".jpg"))
    opened = [Image.open(p).convert("RGB") for p in photos[:4]]
    for i in range(images):
        d = os.path.join(root, f"class{i % classes}")
        os.makedirs(d, exist_ok=True)
        if opened:
            im = opened[i % len(opened)]
            x = rng.randrange(0, im.width - size[0] * 4)
            y = rng.randrange(0, im.height - size[1] * 4)
            crop = im.crop((x, y, x + size[0] * 4, y + size[1] * 4)).resize(size)
        else:
            crop = Image.frombytes("RGB", size, bytes(rng.randrange(256) for _ in range(size[0] * size[1] * 3)))
        crop.save(os.path.join(d, f"img{i:05d}.jpg"), quality=85)
    return images


class Proc:
    """A child with stdout/stderr in files (so a full pipe never blocks it)."""

    def __init__(self, argv, env, logdir, tag):
        self.argv = argv
        self.tag = tag
        self.out_path = os.path.join(logdir, tag + ".out")
        self.err_path = os.path.join(logdir, tag + ".err")
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            self.p = subprocess.Popen(argv, stdout=out, stderr=err, env=env)
        self.pid = self.p.pid
        self.started = time.monotonic()
        self.rc = None

    def poll(self):
        if self.rc is None:
            self.rc = self.p.poll()
        return self.rc

    def signal(self, sig):
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def wait(self, timeout):
        try:
            self.rc = self.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.rc = self.p.wait()
            return None
        return self.rc

    def stdout(self):
        with open(self.out_path, errors="replace") as f:
            return f.read()

    def stderr(self):
        with open(self.err_path, errors="replace") as f:
            return f.read()

    def wait_for_stderr(self, needle, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if needle in self.stderr():
                return True
            if self.poll() is not None:
                return needle in self.stderr()
            time.sleep(0.01)
        return False


class Session:
    """A private run directory and the `coloader` binary: starts producers and consumers."""

    def __init__(self, binary, keep=False):
        self.binary = binary
        self.tmp = tempfile.mkdtemp(prefix="coloader-stress-")
        self.run_dir = os.path.join(self.tmp, "run")
        self.logs = os.path.join(self.tmp, "logs")
        os.makedirs(self.logs)
        self.env = dict(os.environ, COLOADER_RUN_DIR=self.run_dir)
        self.keep = keep
        self.count = 0
        self.pids = []

    def close(self):
        if not self.keep:
            shutil.rmtree(self.tmp, ignore_errors=True)

    def spawn(self, args, tag):
        self.count += 1
        p = Proc([self.binary] + args, self.env, self.logs, f"{self.count:05d}-{tag}")
        self.pids.append(p.pid)
        return p

    def serve(self, name, data, extra):
        p = self.spawn(["serve", "--data", data, "--name", name, "--quiet"] + extra, "serve-" + name)
        if not p.wait_for_stderr("serving", 30):
            raise RuntimeError(f"producer {name} did not come up: {p.stderr()[-2000:]}")
        return p

    def status(self, name, timeout=5):
        """`coloader status --json` as a dict, or None if the producer did not answer."""
        try:
            r = subprocess.run([self.binary, "status", "--name", name, "--json", "--timeout-ms", "2000"],
                               env=self.env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        if r.returncode != 0 or not r.stdout.strip():
            return None
        return json.loads(r.stdout.splitlines()[0])

    def leftovers(self, name):
        """What a producer named `name` may leave behind: its shared-memory objects (ring and
        mailboxes) and files in the run directory."""
        uid = os.getuid()
        shm = [f for f in os.listdir("/dev/shm")
               if f.startswith(f"coloader-{uid}-") and (f.endswith("-" + name) or f.endswith("-" + name + ".mbox"))]
        run = [f for f in (os.listdir(self.run_dir) if os.path.isdir(self.run_dir) else [])
               if f.startswith(name + ".")]
        return shm, run


def fd_count(pid):
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def rss_kib(pid):
    """(VmRSS, RssAnon) in KiB: the whole resident set, and the part that is not the ring."""
    vals = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in ("VmRSS", "RssAnon"):
                    vals[k] = int(v.split()[0])
    except OSError:
        return None, None
    return vals.get("VmRSS"), vals.get("RssAnon")


def settled_fd_count(pid, timeout=3.0):
    """The fd count once it stops changing (ZeroMQ closes a gone peer's socket on its own thread)."""
    deadline = time.monotonic() + timeout
    last, same = fd_count(pid), 0
    while time.monotonic() < deadline and same < 4:
        time.sleep(0.05)
        now = fd_count(pid)
        same = same + 1 if now == last else 0
        last = now
    return last


def gpu_memory_used_mib():
    """Per-GPU used memory and the pids of compute processes, from nvidia-smi (None without one)."""
    try:
        used = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=20)
        apps = subprocess.run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None, None
    if used.returncode != 0:
        return None, None
    return ([int(x) for x in used.stdout.split()],
            {int(x) for x in apps.stdout.split() if x.strip().isdigit()})


SIG_NAMES = {-s: signal.Signals(s).name for s in (signal.SIGKILL, signal.SIGTERM, signal.SIGSEGV,
                                                  signal.SIGABRT, signal.SIGBUS, signal.SIGFPE)}
