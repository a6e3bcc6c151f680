#!/usr/bin/env python3
"""Fault injection at scale: one real `coloader serve` and 4-8 real `coloader consume`
processes of different batch sizes, while this driver SIGKILLs, SIGSTOPs/SIGCONTs and
restarts consumers at random and now and then stops, kills or restarts the producer. Bounded
in time (--duration); stops by itself and then checks, and prints:

  exact      every whole (non-partial) epoch a consumer finished had every sample exactly
             once; partial epochs (late joins, a stop cut short) had no sample twice
  stalls     no consumer that was never stopped itself waited longer for a batch than the
             heartbeat timeout plus a margin, whatever its peers or the producer went through
  exits      every process ended as its faults explain (killed, detached, told the producer
             stopped or died): never a crash, a hang or a protocol error
  leftovers  after the last producer exits, no shared-memory segment in /dev/shm and no socket
             or lock file in the run directory; with --device, no GPU memory held
  flat       per producer incarnation, open fds and RSS measured with no consumer attached,
             early and late in its life: no growth in fds, RSS within a small margin
  shm full   now and then /dev/shm is filled to the last byte and a second producer is started:
             it must exit 1 with the /dev/shm message while the first keeps serving (its ring
             was reserved at start: no SIGBUS anywhere). Needs a private mount namespace with a
             small tmpfs on /dev/shm (root: the driver re-runs itself under `unshare -m`);
             without one this fault is skipped and the report says why.

Why a Python driver: it is process orchestration (signals, /proc, exit codes, JSON lines);
the producer and consumers under test are the real binaries, nothing runs in this process.

    tests/stress/fault_stress.py --coloader build/tools/coloader                 # CI: 60 s, >= 200 faults
    tests/stress/fault_stress.py --coloader build/tools/coloader --duration 900  # longer
    tests/stress/fault_stress.py --coloader ... --device cuda:0                   # GPU machine
Exit status 0 when every check holds.
"""
import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

INNER = "COLOADER_STRESS_SHM_NAMESPACE"
FILLER = "/dev/shm/coloader-stress-filler"

# Producer batches are 8 in a ring of 6 slots: smaller, equal, straddling, and (64) larger than
# the whole ring.
BATCH_SIZES = [1, 5, 8, 13, 64, 40, 3, 20]


class Consumer:
    """One consumer slot: its batch size stays, its process is replaced after each fault."""

    def __init__(self, index, batch_size):
        self.index = index
        self.batch_size = batch_size
        self.proc = None
        self.stopped_since = None   # SIGSTOPped now (monotonic time)
        self.cont_at = None         # when to SIGCONT it
        self.ever_stopped = False   # this incarnation was stopped at least once
        self.longest_stop = 0.0
        self.killed = False         # we SIGKILLed this incarnation
        self.restart_at = None
        self.gen = None             # producer generation it attached to


class Driver:
    def __init__(self, args):
        self.a = args
        self.rng = random.Random(args.seed)
        self.s = harness.Session(os.path.abspath(args.coloader), keep=args.keep)
        self.name = f"stress{os.getpid()}"
        self.data = os.path.join(self.s.tmp, "data")
        self.timeout_ms = args.timeout_ms
        self.producer = None
        self.gen = 0                      # producer incarnation
        self.gen_fate = {}                # gen -> "running" | "killed" | "stopped" (SIGTERM)
        self.producer_stopped_until = None
        self.consumers = [Consumer(i, BATCH_SIZES[i % len(BATCH_SIZES)]) for i in range(args.consumers)]
        self.counts = {k: 0 for k in ("consumer_sigkill", "consumer_sigstop", "producer_sigkill",
                                      "producer_sigterm", "producer_sigstop", "consumer_restart",
                                      "detached_on_resume", "shm_full")}
        self.failures = []
        self.epochs_whole = 0
        self.epochs_partial = 0
        self.epochs_cut = 0
        self.max_wait_checked_ms = 0.0
        self.max_wait_any_ms = 0.0
        self.flat = []                    # per producer incarnation: early/late fds and RSS
        self.early = None
        self.gen_events = 0
        self.shm_full = os.environ.get(INNER) == "1"  # /dev/shm is our own small tmpfs
        self.second = None                # the second producer started on a full /dev/shm
        self.second_count = 0

    # -- processes -----------------------------------------------------------------------------

    def start_producer(self):
        extra = ["--forever", "--batch-size", "8", "--image-size", "32", "--workers", "2",
                 "--window", "4", "--output", "uint8", "--heartbeat-ms", "100",
                 "--heartbeat-timeout-ms", str(self.timeout_ms)]
        if self.a.device:
            extra += ["--device", self.a.device]
        self.gen += 1
        self.gen_fate[self.gen] = "running"
        self.producer = self.s.serve(self.name, self.data, extra)
        self.early = None
        self.gen_events = 0

    def start_consumer(self, c):
        # The handshake's deadline runs while the consumer is frozen: it must outlast the longest
        # stop a consumer gets (2 x the heartbeat timeout, below) with room for the handshake, or a
        # consumer stopped mid-handshake fails for the stop, not for a fault of the producer's
        # (seen under ASan with a 3 s timeout, seed 86549).
        args = ["consume", "--name", self.name, "--json", "--batch-size", str(c.batch_size),
                "--wait-ms", "20000", "--connect-timeout-ms", str(5000 + 2 * self.timeout_ms)]
        if c.index % 3 == 2:
            args += ["--step-ms", "3"]  # a slower reader among fast ones
        if self.a.device:
            args += ["--device"]
        c.proc = self.s.spawn(args, f"consume{c.index}-b{c.batch_size}")
        c.stopped_since = c.cont_at = c.restart_at = None
        c.ever_stopped = c.killed = False
        c.longest_stop = 0.0
        c.gen = self.gen

    # -- what each finished consumer saw --------------------------------------------------------

    def fail(self, what):
        self.failures.append(what)
        print("FAIL:", what, flush=True)

    def judge_consumer(self, c):
        """Checks the epochs an ended consumer reported and how it ended."""
        p = c.proc
        if getattr(p, "judged", False):
            return
        p.judged = True
        rc = p.poll()
        err = p.stderr()
        fate = self.gen_fate.get(c.gen)
        lines = []
        for raw in p.stdout().splitlines():
            try:
                lines.append(json.loads(raw))
            except ValueError:
                self.fail(f"{p.tag}: unparsable output line {raw!r}")
        # How it ended must be explained by a fault.
        if c.killed and rc == -signal.SIGKILL:
            pass
        elif rc == 0 and fate == "stopped":
            pass  # the producer was asked to stop and told it
        elif rc == 1 and "detached" in err and c.longest_stop * 1000 >= self.timeout_ms * 0.9:
            self.counts["detached_on_resume"] += 1
        elif rc == 1 and fate in ("killed", "stopped") and ("exited without saying goodbye" in err or
                                                            "went silent" in err or "stopped" in err):
            pass
        elif rc == 1 and fate == "killed" and "no producer named" in err:
            pass  # started while the producer was down and gave up waiting
        else:
            self.fail(f"{p.tag} (pid {p.pid}) ended unexplained: rc {harness.SIG_NAMES.get(rc, rc)}, "
                      f"producer gen {c.gen} {fate}, stopped {c.longest_stop:.2f}s: {err[-600:]!r}")
        n = self.a.images
        for i, e in enumerate(lines):
            last_of_cut = i == len(lines) - 1 and rc == 0 and fate == "stopped"
            if e["samples"] != e["unique_samples"]:
                self.fail(f"{p.tag}: epoch {e['epoch']} repeated samples: {e}")
            elif e["partial"] or last_of_cut:
                if last_of_cut and not e["partial"]:
                    self.epochs_cut += 1
                else:
                    self.epochs_partial += 1
                if e["samples"] > n:
                    self.fail(f"{p.tag}: epoch {e['epoch']} has {e['samples']} > {n} samples")
            else:
                self.epochs_whole += 1
                if e["samples"] != n or e["index_sum"] != n * (n - 1) // 2:
                    self.fail(f"{p.tag}: whole epoch {e['epoch']} not exact: {e['samples']} samples, "
                              f"index sum {e['index_sum']} (want {n}, {n * (n - 1) // 2})")
            if i > 0 and e["epoch"] != lines[i - 1]["epoch"] + 1:
                self.fail(f"{p.tag}: epoch {lines[i - 1]['epoch']} followed by {e['epoch']}")
            wait = float(e.get("max_wait_ms", 0))
            self.max_wait_any_ms = max(self.max_wait_any_ms, wait)
            if not c.ever_stopped:
                self.max_wait_checked_ms = max(self.max_wait_checked_ms, wait)
                if wait > self.timeout_ms + self.a.stall_margin_ms:
                    self.fail(f"{p.tag}: waited {wait:.0f} ms for a batch (timeout {self.timeout_ms} ms "
                              f"+ margin {self.a.stall_margin_ms} ms) in epoch {e['epoch']}")

    # -- the faults -----------------------------------------------------------------------------

    def faults(self):
        return sum(self.counts[k] for k in ("consumer_sigkill", "consumer_sigstop", "producer_sigkill",
                                            "producer_sigterm", "producer_sigstop", "shm_full"))

    def live(self):
        return [c for c in self.consumers if c.proc and c.proc.poll() is None]

    def consumer_fault(self, now):
        running = [c for c in self.live() if c.stopped_since is None]
        if not running:
            return
        c = self.rng.choice(running)
        if self.rng.random() < 0.5:
            c.proc.signal(signal.SIGKILL)
            c.killed = True
            self.counts["consumer_sigkill"] += 1
        else:
            # Short stops (well inside the timeout) must cost the others nothing but a pause;
            # long ones (past it) must detach it, and tell it so when it resumes.
            t = self.timeout_ms / 1000
            hold = self.rng.uniform(0.05, 0.5 * t) if self.rng.random() < 0.6 else self.rng.uniform(1.3 * t, 2.0 * t)
            c.proc.signal(signal.SIGSTOP)
            c.stopped_since, c.cont_at = now, now + hold
            c.ever_stopped = True
            self.counts["consumer_sigstop"] += 1

    def fill_shm(self):
        """/dev/shm full to the last byte, then a second producer: it must fail clearly."""
        block, small = b"\xa5" * (1 << 20), b"\x5a" * 4096
        with open(FILLER, "wb", buffering=0) as f:
            for chunk in (block, small):
                while True:
                    try:
                        f.write(chunk)
                    except OSError:
                        break
        self.second_count += 1
        self.second = self.s.spawn(["serve", "--data", self.data, "--name", f"{self.name}-second",
                                    "--batch-size", "8", "--image-size", "32", "--output", "uint8", "--epochs", "1"],
                                   f"serve-second{self.second_count}")
        self.counts["shm_full"] += 1

    def end_shm_full(self, wait):
        """Judges the second producer once it ended, and gives /dev/shm its room back."""
        if self.second is None:
            return
        if self.second.poll() is None:
            if not wait:
                return
            self.second.wait(30)
        err = self.second.stderr()
        if self.second.rc != 1 or "/dev/shm has" not in err or "--shm-size" not in err:
            self.fail(f"second producer on a full /dev/shm: rc {harness.SIG_NAMES.get(self.second.rc, self.second.rc)}, "
                      f"wanted 1 and the /dev/shm message: {err[-600:]!r}")
        shm, run = self.s.leftovers(f"{self.name}-second")
        if shm or run:
            self.fail(f"the failed second producer left {shm} {run}")
        os.unlink(FILLER)
        self.second = None

    def producer_pause(self, now):
        if self.producer_stopped_until is None:
            self.producer.signal(signal.SIGSTOP)
            self.producer_stopped_until = now + self.rng.uniform(0.05, 0.4 * self.timeout_ms / 1000)
            self.counts["producer_sigstop"] += 1

    def quiesce(self, restart):
        """Kills every consumer and waits until the producer has dropped them all; returns
        its (fds, VmRSS, RssAnon) with nobody attached."""
        self.resume_producer()
        for c in self.consumers:
            if c.proc and c.proc.poll() is None:
                c.proc.signal(signal.SIGKILL)
                c.killed = True
                self.counts["consumer_sigkill"] += 1
        for c in self.consumers:
            if c.proc:
                c.proc.wait(10)
                self.judge_consumer(c)
                c.proc = None
        deadline = time.monotonic() + 10
        st = None
        while time.monotonic() < deadline:
            st = self.s.status(self.name)
            if st is not None and not st["consumers"]:
                break
            time.sleep(0.05)
        else:
            self.fail(f"the producer still listed consumers 10 s after they were all killed: {json.dumps(st)}")
        fds = harness.settled_fd_count(self.producer.pid)
        rss, anon = harness.rss_kib(self.producer.pid)
        if restart:
            for c in self.consumers:
                self.start_consumer(c)
        return fds, rss, anon

    def resume_producer(self):
        if self.producer_stopped_until is not None:
            self.producer.signal(signal.SIGCONT)
            self.producer_stopped_until = None

    def end_producer(self, how):
        self.end_shm_full(wait=True)  # a new incarnation needs its room in /dev/shm
        self.resume_producer()
        late = self.quiesce(restart=True) if self.early else None
        # Consumers attached when the producer goes: they must be told, or notice its death.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            st = self.s.status(self.name)
            if st is not None and len(st["consumers"]) == len(self.consumers):
                break
            time.sleep(0.05)
        if self.early and late:
            self.flat.append({"gen": self.gen, "events": self.gen_events, "fds_early": self.early[0],
                              "fds_late": late[0], "rss_early_kib": self.early[1], "rss_late_kib": late[1],
                              "anon_early_kib": self.early[2], "anon_late_kib": late[2]})
        if how == "kill":
            self.producer.signal(signal.SIGKILL)
            self.gen_fate[self.gen] = "killed"
            self.counts["producer_sigkill"] += 1
            self.producer.wait(10)
        else:
            self.producer.signal(signal.SIGTERM)
            self.gen_fate[self.gen] = "stopped"
            if how == "term":
                self.counts["producer_sigterm"] += 1
            rc = self.producer.wait(15)
            if rc != 0:
                self.fail(f"producer gen {self.gen} exited {rc} on SIGTERM: {self.producer.stderr()[-800:]!r}")

    # -- the run --------------------------------------------------------------------------------

    def tick(self, now):
        """Resumes what is due, reaps what ended, restarts what is gone."""
        self.end_shm_full(wait=False)
        if self.producer_stopped_until is not None and now >= self.producer_stopped_until:
            self.producer.signal(signal.SIGCONT)
            self.producer_stopped_until = None
        for c in self.consumers:
            if c.proc is None:
                continue
            if c.cont_at is not None and now >= c.cont_at:
                c.longest_stop = max(c.longest_stop, now - c.stopped_since)
                c.proc.signal(signal.SIGCONT)
                c.stopped_since = c.cont_at = None
            if c.proc.poll() is not None and c.restart_at is None:
                self.judge_consumer(c)
                c.restart_at = now + self.rng.uniform(0.0, 0.3)
            if c.restart_at is not None and now >= c.restart_at:
                self.start_consumer(c)
                self.counts["consumer_restart"] += 1
        if self.producer.poll() is not None:
            self.fail(f"producer gen {self.gen} died on its own: rc {self.producer.rc}: "
                      f"{self.producer.stderr()[-800:]!r}")
            self.gen_fate[self.gen] = "killed"
            self.start_producer()

    def run(self):
        harness.make_dataset(self.data, self.a.images, seed=self.a.seed)
        gpu_before = harness.gpu_memory_used_mib()[0] if self.a.device else None
        self.start_producer()
        for c in self.consumers:
            self.start_consumer(c)
        t0 = time.monotonic()
        end = t0 + self.a.duration
        # Pace: the wanted number of faults spread over the run, whatever its length.
        interval = max(0.02, (self.a.duration * 0.85) / self.a.min_faults)
        next_event = t0 + 1.0
        while time.monotonic() < end:
            now = time.monotonic()
            self.tick(now)
            if now >= next_event:
                next_event = now + self.rng.uniform(0.5, 1.5) * interval
                self.gen_events += 1
                r = self.rng.random()
                if self.early is None and self.gen_events >= self.a.producer_every // 4:
                    self.early = self.quiesce(restart=True)  # the baseline, once this incarnation is warm
                elif self.gen_events >= self.a.producer_every and end - now > 8:
                    self.end_producer("kill" if self.gen % 2 else "term")  # both, in turn
                    self.start_producer()
                    for c in self.consumers:
                        if c.proc is None or c.proc.poll() is not None:
                            if c.proc:
                                self.judge_consumer(c)
                            self.start_consumer(c)
                elif r < 0.06 and self.producer_stopped_until is None:
                    self.producer_pause(now)
                elif r < 0.09 and self.shm_full and self.second is None and \
                        self.gen_events < self.a.producer_every - 5:
                    self.fill_shm()
                else:
                    self.consumer_fault(now)
            time.sleep(0.01)
        elapsed = time.monotonic() - t0
        # The end: resume everyone, measure the last incarnation, stop the producer cleanly.
        for c in self.consumers:
            if c.cont_at is not None:
                c.longest_stop = max(c.longest_stop, time.monotonic() - c.stopped_since)
                c.proc.signal(signal.SIGCONT)
                c.cont_at = None
        self.end_producer("final")
        for c in self.consumers:
            if c.proc:
                if c.cont_at is not None:
                    c.proc.signal(signal.SIGCONT)
                if c.proc.wait(15) is None:
                    self.fail(f"{c.proc.tag} did not end within 15 s of the producer's stop")
                self.judge_consumer(c)
        self.check_after(gpu_before)
        self.report(elapsed)
        self.s.close()
        return 0 if not self.failures else 1

    def check_after(self, gpu_before):
        shm, run = self.s.leftovers(self.name)
        self.leftover_shm, self.leftover_run = shm, run
        if shm:
            self.fail(f"shared memory left behind: {shm}")
        if run:
            self.fail(f"files left in the run directory: {run}")
        for f in self.flat:
            if f["fds_late"] > f["fds_early"]:
                self.fail(f"producer gen {f['gen']}: open fds grew {f['fds_early']} -> {f['fds_late']}")
            allowed = f["rss_early_kib"] * (1 + self.a.rss_tolerance) + 4096
            if f["rss_late_kib"] > allowed:
                self.fail(f"producer gen {f['gen']}: RSS grew {f['rss_early_kib']} -> {f['rss_late_kib']} KiB")
        if not self.flat:
            self.fail("no producer incarnation lived long enough to measure fds and RSS twice")
        self.gpu = None
        if self.a.device:
            deadline = time.monotonic() + 10
            gpu_before = gpu_before or []
            while True:
                used, apps = harness.gpu_memory_used_mib()
                ours = apps & self.all_pids() if apps is not None else set()
                if used is None or not gpu_before or time.monotonic() > deadline or \
                        (not ours and all(u <= b + 64 for u, b in zip(used, gpu_before))):
                    break
                time.sleep(0.5)
            self.gpu = {"before_mib": gpu_before, "after_mib": used, "our_processes_left": sorted(ours)}
            if used is None or not gpu_before:
                self.fail("--device given but nvidia-smi did not answer")
            elif ours:
                self.fail(f"processes of this run still hold GPU contexts: {sorted(ours)}")
            elif any(u > b + 64 for u, b in zip(used, gpu_before)):
                self.fail(f"GPU memory not given back: {gpu_before} MiB before, {used} MiB after")

    def all_pids(self):
        return set(self.s.pids)

    def report(self, elapsed):
        out = {
            "duration_s": round(elapsed, 1),
            "consumers": len(self.consumers),
            "batch_sizes": [c.batch_size for c in self.consumers],
            "faults": self.faults(),
            "events": self.counts,
            "producer_incarnations": self.gen,
            "whole_epochs_exact": self.epochs_whole,
            "partial_epochs_distinct": self.epochs_partial,
            "epochs_cut_by_stop": self.epochs_cut,
            "timeout_ms": self.timeout_ms,
            "max_wait_ms_never_stopped": round(self.max_wait_checked_ms, 1),
            "max_wait_ms_any": round(self.max_wait_any_ms, 1),
            "flat": self.flat,
            "leftover_shm": self.leftover_shm,
            "leftover_run_dir": self.leftover_run,
            "gpu": self.gpu,
            "shm_full": self.counts["shm_full"] if self.shm_full else
            "skipped: no private mount namespace (" + self.a.no_namespace_reason + ")",
            "failures": len(self.failures),
        }
        print("fault stress:", json.dumps(out, indent=1))
        if self.a.report:
            with open(self.a.report, "w") as f:
                json.dump(out, f, indent=1)
        if self.faults() < self.a.min_faults:
            self.fail(f"only {self.faults()} fault events (wanted at least {self.a.min_faults})")
        if self.epochs_whole == 0:
            self.fail("no consumer finished a whole epoch: nothing was checked")
        verdict = "PASS" if not self.failures else f"FAIL ({len(self.failures)} problems)"
        print(f"fault stress: {verdict}: {self.faults()} faults in {elapsed:.0f} s, {self.epochs_whole} whole "
              f"epochs exact, longest wait of a never-stopped consumer {self.max_wait_checked_ms:.0f} ms "
              f"(timeout {self.timeout_ms} ms)", flush=True)


def in_namespace(a):
    """Runs this driver again in a private mount namespace with a small tmpfs on /dev/shm, where
    filling /dev/shm hurts nobody else. None when it ran (its exit code in a.namespace_rc), else
    why it could not."""
    if a.shm_mb <= 0:
        return "--shm-mb 0"
    if os.geteuid() != 0:
        return f"not root (uid {os.geteuid()})"
    if not shutil.which("unshare"):
        return "unshare(1) is not installed"
    probe = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                            f"mount -t tmpfs -o size={a.shm_mb}m tmpfs /dev/shm"], capture_output=True, text=True)
    if probe.returncode != 0:
        return "mount refused: " + probe.stderr.strip()
    script = (f"mount -t tmpfs -o size={a.shm_mb}m,mode=1777 tmpfs /dev/shm && exec {sys.executable} "
              f"{os.path.abspath(__file__)} " + " ".join(sys.argv[1:]))
    print(f"fault stress: in a private mount namespace, /dev/shm a {a.shm_mb} MB tmpfs", flush=True)
    a.namespace_rc = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script],
                                    env=dict(os.environ, **{INNER: "1"})).returncode
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--coloader", required=True, help="the coloader binary")
    ap.add_argument("--duration", type=float, default=60, help="seconds of faults (default 60)")
    ap.add_argument("--min-faults", type=int, default=220, help="fault events to pace the run for (and require)")
    ap.add_argument("--consumers", type=int, default=6, help="4 to 8")
    ap.add_argument("--images", type=int, default=97, help="dataset size (a prime: no batch size divides it)")
    ap.add_argument("--timeout-ms", type=int, default=1000, help="the producer's --heartbeat-timeout-ms")
    # 1500 ms before catch-up; a restarted consumer's catch-up shares the producer's two workers
    # with the shared stream and lengthens the longest wait by 0.3-0.6 s (seed 52848, one core
    # free: 2047 ms with catch-up, 1401 ms with --no-catch-up; docs/RELIABILITY.md).
    ap.add_argument("--stall-margin-ms", type=int, default=2500,
                    help="allowed on top of the timeout for scheduling on a loaded machine and catch-up")
    ap.add_argument("--producer-every", type=int, default=70, help="events per producer incarnation")
    ap.add_argument("--rss-tolerance", type=float, default=0.10, help="allowed RSS growth (fraction, plus 4 MiB)")
    ap.add_argument("--device", default="", help="cuda:N: the ring on the GPU, consumers on the device path")
    ap.add_argument("--seed", type=int, default=int(time.time()) % 100000)
    ap.add_argument("--report", help="also write the figures to this JSON file")
    ap.add_argument("--keep", action="store_true", help="keep the logs (printed path)")
    ap.add_argument("--shm-mb", type=int, default=64,
                    help="size of the private /dev/shm for the 'shm full' fault (0: no namespace, no such fault)")
    a = ap.parse_args()
    if not 4 <= a.consumers <= 8:
        ap.error("--consumers must be 4 to 8")
    a.no_namespace_reason = ""
    if os.environ.get(INNER) != "1":
        a.no_namespace_reason = in_namespace(a)  # returns only when it could not
        if a.no_namespace_reason is None:
            return a.namespace_rc
    print(f"fault stress: seed {a.seed} (rerun with --seed {a.seed})", flush=True)
    d = Driver(a)
    if a.keep:
        print("fault stress: logs in", d.s.logs, flush=True)
    return d.run()


if __name__ == "__main__":
    sys.exit(main())
