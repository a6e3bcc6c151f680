#!/usr/bin/env python3
"""N collocated training jobs on one GPU under MPS, fed by per-job DataLoaders, a TensorSocket
producer, or one coloader producer: throughput, CPU, memory, GPU use, hand-off and fairness.

    benchmarks/collocated.py --data DIR --out OUT --quick      one device command (< 9 min)
    benchmarks/collocated.py --data DIR --out OUT --full       the whole matrix (< 30 min)
    benchmarks/collocated.py --data DIR --out OUT --tiny       a smoke test (N 1 and 2)
    benchmarks/collocated.py --report OUT [OUT2 ...]           tables and plots from results.csv

Setups (same files, same cores: every process of a setup runs under taskset on --cores):
  dataloader          each job has its own torch DataLoader (PIL + torchvision, pin_memory);
                      workers per job tuned per N (stated in the output)
  tensorsocket        one TensorSocket 0.0.5 producer wrapping one such DataLoader; jobs are
                      TensorConsumers (CUDA tensors through CUDA IPC)
  coloader            one `coloader serve --device cuda:0` (C++ decode, GPU ring); jobs use
                      coloader.Loader(device="cuda"), zero-copy
  coloader-pyfed      coloader.Producer wrapping the same DataLoader as tensorsocket (host
                      ring); jobs use coloader.Loader() and copy to the GPU: the transport alone
  synthetic           a batch made on the GPU and reused: the ceiling
  synthetic+decode    synthetic jobs while a coloader producer decodes onto the GPU alongside,
                      drained by `coloader consume --device`: the GPU cost of decoding
  coloader-gpudecode, synthetic+gpudecode
                      the same with `--decode gpu` (nvJPEG), run only when `coloader serve
                      --help` lists --decode
  coloader-gpudecode-spin
                      coloader-gpudecode with `--gpu-wait spin` (CUDA's default spinning wait
                      instead of the producer's blocking one): what the wait costs in CPU
Each job (benchmarks/collocated_job.py) trains a torchvision ResNet with bf16 autocast and
channels_last, batch 128, RandomResizedCrop 224 + flip + normalise.

Method: the jobs warm up (synthetic steps, then real ones) and print WARM; when all have, a
window of --window seconds is measured. Images = the samples of every step that finished on
the GPU inside the window. CPU = utime+stime of every process the setup started and of all
their descendants, live ones and reaped ones (cutime+cstime), read from /proc at both ends of
the window: core-seconds per 1,000 images; the producer's own CPU also per kind of thread
(/proc/PID/task: cl-worker, cl-gpulane, the session loop, CUDA's), to say where it goes. Host
memory = peak of the summed PSS. GPU memory from nvidia-smi (--query-compute-apps per
process, memory.used for the total above the idle level), GPU utilisation = mean of nvidia-smi samples every 200 ms. next() = time a job spends
in next(loader), p50/p99 over the window (hand-off plus any wait for data). Fairness: a separate
pass runs 4 jobs of different speeds on a small dataset for 2 epochs each and counts the
distinct samples every job received per epoch.
"""
import argparse
import csv
import glob
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
LOADERS = ["dataloader", "tensorsocket", "coloader", "coloader-pyfed"]
GPU_DECODE = ["coloader-gpudecode", "synthetic+gpudecode", "coloader-gpudecode-spin"]
ALL_SETUPS = LOADERS + ["synthetic", "synthetic+decode"] + GPU_DECODE
CLK_TCK = os.sysconf("SC_CLK_TCK")
COLUMNS = ["model", "setup", "n", "repeat", "status", "window_s", "images", "agg_img_s", "job_img_s_min",
           "job_img_s_median", "job_img_s_max", "cpu_core_s", "cpu_per_1k", "cpu_jobs_per_1k", "cpu_loading_per_1k",
           "cores_busy", "producer_threads", "mps_cpu_s", "host_mem_peak_gib", "gpu_mem_total_gib", "gpu_mem_job_mib",
           "gpu_mem_producer_mib", "gpu_mem_job_torch_mib", "gpu_util_pct", "next_p50_us", "next_p99_us",
           "workers", "cores", "warmup", "producer_img_s", "epochs_exact", "startup_s", "teardown_s", "wall_s"]

PROFILES = {
    # models, job counts (resnet50's), setups, repeats (of the loader setups and synthetic; the
    # others run once), measured window (s), real warm-up steps, fairness pass and its setups,
    # DataLoader workers tried either side of the rule (in the first repeat; the best is used
    # after), deadline (s of this script; configurations that would end later are skipped)
    "tiny": dict(models=["resnet18"], ns=[1, 2], setups=["dataloader", "coloader"], repeats=1, window=3.0,
                 warmup=4, fairness=False, deadline=240, resnet50_ns=[], fair_setups=["coloader"], dl_spread=0),
    "quick": dict(models=["resnet18", "resnet50"], ns=[1, 2, 4, 8], setups=ALL_SETUPS, repeats=1, window=4.0,
                  warmup=6, fairness=True, deadline=480, resnet50_ns=[4],
                  fair_setups=["tensorsocket", "coloader", "coloader-pyfed"], dl_spread=0),
    "full": dict(models=["resnet18", "resnet50"], ns=[1, 2, 4, 8], setups=ALL_SETUPS, repeats=3, window=5.0,
                 warmup=8, fairness=True, deadline=28 * 60, resnet50_ns=[4, 8],
                 fair_setups=["tensorsocket", "coloader", "coloader-pyfed", "dataloader"], dl_spread=1),
}


# -- /proc accounting -------------------------------------------------------------------------

def read_stat(pid):
    """(ppid, own CPU ticks, reaped children's CPU ticks, comm) of a process (or "PID/task/TID": a
    thread), or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            s = f.read()
    except OSError:
        return None
    comm = s[s.index("(") + 1:s.rindex(")")]
    f = s[s.rindex(")") + 2:].split()
    # fields after comm: state(3) ppid(4) ... utime(14) stime(15) cutime(16) cstime(17), 1-based
    return int(f[1]), int(f[11]) + int(f[12]), int(f[13]) + int(f[14]), comm


def all_stats():
    out = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            st = read_stat(int(d))
            if st:
                out[int(d)] = st
    return out


def tree(roots, stats):
    """The pids of roots and all their descendants."""
    children = {}
    for pid, st in stats.items():
        children.setdefault(st[0], []).append(pid)
    seen, todo = set(), [r for r in roots if r in stats]
    while todo:
        pid = todo.pop()
        if pid not in seen:
            seen.add(pid)
            todo += children.get(pid, [])
    return seen


def cpu_sample(roots, jobs):
    """(CPU seconds of the trees under roots, reaped children included; of the job processes
    alone; of MPS's daemon and server)."""
    stats = all_stats()
    pids = tree(roots, stats)
    total = sum(stats[p][1] + stats[p][2] for p in pids)
    own = sum(stats[p][1] for p in jobs if p in stats)
    mps = sum(st[1] for st in stats.values() if st[3].startswith("nvidia-cuda-mps"))
    return total / CLK_TCK, own / CLK_TCK, mps / CLK_TCK


def thread_cpu(pid):
    """CPU ticks of each kind of thread of a live process, {name: ticks}, threads grouped by their
    name without its number (coloader names its own: cl-worker-N, cl-gpulane-N; CUDA's and
    nvJPEG's keep theirs). Empty when the process is gone."""
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        st = read_stat(f"{pid}/task/{tid}")
        if st:
            name = st[3].rstrip("0123456789").rstrip("-") or st[3]
            out[name] = out.get(name, 0) + st[1]
    return out


def thread_cores(before, after, span):
    """'name cores; ...' from two thread_cpu samples span seconds apart, busiest first."""
    cores = {k: (after.get(k, 0) - before.get(k, 0)) / CLK_TCK / span for k in after}
    return "; ".join(f"{k} {v:.2f}" for k, v in sorted(cores.items(), key=lambda kv: -kv[1]) if v >= 0.005)


def pss_bytes(pids):
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1]) * 1024
                        break
        except OSError:
            pass
    return total


# -- nvidia-smi -------------------------------------------------------------------------------

def smi(query, kind="gpu"):
    try:
        out = subprocess.run(["nvidia-smi", f"--query-{kind}={query}", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [[c.strip() for c in line.split(",")] for line in out.splitlines() if line.strip()]


def gpu_mem_used_mib():
    rows = smi("memory.used")
    return float(rows[0][0]) if rows else float("nan")


def compute_apps():
    """{pid: used MiB} of the processes on the GPU, as nvidia-smi reports them."""
    out = {}
    for row in smi("pid,used_memory", "compute-apps"):
        try:
            out[int(row[0])] = float(row[1])
        except (ValueError, IndexError):
            pass
    return out


class GpuSampler:
    """nvidia-smi's utilisation and memory.used every 200 ms, while running."""

    def __init__(self, affinity):
        self.proc = None
        try:
            self.proc = subprocess.Popen(taskset(affinity) + [
                "nvidia-smi", "--query-gpu=utilization.gpu,memory.used", "--format=csv,noheader,nounits",
                "-lms", "200"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        except OSError:
            pass

    def stop(self):
        if self.proc is None:
            return [], []
        self.proc.terminate()
        out, _ = self.proc.communicate(timeout=10)
        util, mem = [], []
        for line in out.splitlines():
            try:
                u, m = (float(x) for x in line.split(","))
            except ValueError:
                continue
            util.append(u)
            mem.append(m)
        return util, mem


# -- processes --------------------------------------------------------------------------------

_TASKSET = shutil.which("taskset")


def taskset(cores):
    return [_TASKSET, "-c", ",".join(map(str, cores))] if _TASKSET and cores else []


class Group:
    """The processes of one configuration, each in its own session (killed by process group)."""

    def __init__(self, run_dir, env, cores):
        self.run_dir, self.env, self.cores = run_dir, env, cores
        self.procs = {}  # role -> Popen
        self.lines = {}  # role -> stdout lines (for jobs)
        self.peak_pss = 0
        self._stop = threading.Event()
        self._mem_thread = threading.Thread(target=self._watch_memory, daemon=True)
        self._mem_thread.start()

    def start(self, role, cmd, read_stdout=False):
        log = open(os.path.join(self.run_dir, role + ".log"), "w")
        p = subprocess.Popen(taskset(self.cores) + cmd, env=self.env, stdout=subprocess.PIPE if read_stdout else log,
                             stderr=log, stdin=subprocess.DEVNULL, start_new_session=True, text=True,
                             preexec_fn=None if _TASKSET else (lambda: os.sched_setaffinity(0, self.cores)))
        self.procs[role] = p
        if read_stdout:
            lines = self.lines[role] = []

            def reader():
                for line in p.stdout:
                    lines.append(line.strip())
                    log.write(line)
                    log.flush()
            threading.Thread(target=reader, daemon=True).start()
        return p

    def log_text(self, role, tail=3000):
        try:
            with open(os.path.join(self.run_dir, role + ".log"), errors="replace") as f:
                return f.read()[-tail:]
        except OSError:
            return ""

    def wait_log(self, role, text, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in self.log_text(role, 100000):
                return True
            if self.procs[role].poll() is not None:
                return False
            time.sleep(0.05)
        return False

    def roots(self):
        return [p.pid for p in list(self.procs.values())]  # list(): start() may add one meanwhile

    def _watch_memory(self):
        while not self._stop.wait(0.5):
            try:
                self.peak_pss = max(self.peak_pss, pss_bytes(tree(self.roots(), all_stats())))
            except (OSError, ValueError, IndexError):  # a process ending mid-read: the next sample
                continue

    def kill_all(self, grace=5.0):
        self._stop.set()
        for p in self.procs.values():
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + grace
        for p in self.procs.values():
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for p in self.procs.values():
            try:  # the whole group: DataLoader workers left behind by an exited job too
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                pass


# -- one configuration ------------------------------------------------------------------------

def percentile(values, q):
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


class Bench:
    def __init__(self, args):
        self.args = args
        self.py = sys.executable
        self.binary = args.binary
        self.cores = args.cores
        self.port = 21000
        self.run_root = os.path.join(args.out, "runs")
        os.makedirs(self.run_root, exist_ok=True)
        pythonpath = [HERE, os.path.join(ROOT, "python")] + [p for p in os.environ.get("PYTHONPATH", "").split(":") if p]
        self.env = dict(os.environ, PYTHONPATH=":".join(pythonpath), PYTHONUNBUFFERED="1",
                        COLOADER_RUN_DIR=tempfile.mkdtemp(prefix="collocated-run-"))
        self.mps = None
        self.images = {}  # dataset directory -> image count
        self.idle_mib = gpu_mem_used_mib() if args.device == "cuda" else float("nan")

    def settle_gpu(self, timeout=15.0):
        """Waits until the last configuration's GPU memory is freed (memory.used back within
        256 MiB of the idle level, or steady); returns memory.used then."""
        deadline, last = time.monotonic() + timeout, None
        while True:
            used = gpu_mem_used_mib()
            if used != used or used <= self.idle_mib + 256 or (last is not None and abs(used - last) < 1) \
                    or time.monotonic() > deadline:
                return used
            last = used
            time.sleep(0.5)

    # MPS: our own control daemon with its own pipe and log directories.
    def start_mps(self):
        d = tempfile.mkdtemp(prefix="collocated-mps-")
        mps = {"CUDA_MPS_PIPE_DIRECTORY": os.path.join(d, "pipe"), "CUDA_MPS_LOG_DIRECTORY": os.path.join(d, "log")}
        for v in mps.values():
            os.makedirs(v)
        env = dict(os.environ, **mps)
        r = subprocess.run(["nvidia-cuda-mps-control", "-d"], env=env, capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            sys.exit(f"collocated: could not start the MPS control daemon: {r.stderr.strip()}")
        self.env.update(mps)
        self.mps = env
        say(f"MPS control daemon started (pipes in {mps['CUDA_MPS_PIPE_DIRECTORY']})")

    def stop_mps(self):
        if self.mps:
            subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", env=self.mps, capture_output=True,
                           text=True, timeout=30)
            self.mps = None
            say("MPS control daemon stopped")

    def workers(self, setup, n):
        """DataLoader workers per job (dataloader) or producer workers (shared setups)."""
        c = len(self.cores)
        if setup == "dataloader":
            table = self.args.dl_workers or {}
            return table.get(n, max(1, -(-(c - n) // n)))  # ceil((cores - N) / N): every core busy
        return max(1, c - n - 1)  # a core per job and one for the producer's main thread

    def worker_candidates(self, n):
        """The per-job worker counts tried for the dataloader setup (the profile's dl_spread
        either side of the rule); the report keeps the best."""
        w, spread = self.workers("dataloader", n), PROFILES[self.args.profile]["dl_spread"]
        if self.args.dl_workers and n in self.args.dl_workers:
            spread = 0
        return sorted({max(1, w + d) for d in range(-spread, spread + 1)})

    def job_cmd(self, i, loader, model, run_dir, data, extra=()):
        a = self.args
        if data not in self.images:
            self.images[data] = count_images(data)
        tail = self.images[data] % a.batch_size
        return [self.py, os.path.join(HERE, "collocated_job.py"), "--loader", loader, "--index", str(i),
                "--model", model, "--batch-size", str(a.batch_size), "--image-size", str(a.image_size),
                "--device", a.device, "--warmup-steps", str(a.warmup), "--warmup-max-s", str(a.warmup_max_s),
                "--stop-file", os.path.join(run_dir, "stop"), "--result", os.path.join(run_dir, f"job{i}.json"),
                "--max-s", str(a.job_max_s), "--synthetic-warmup", str(a.synthetic_warmup),
                "--tail-batch", str(tail)] + list(extra)

    def serve_cmd(self, name, data, n, workers, extra_flags, device=True):
        a = self.args
        cmd = [self.binary, "serve", "--data", data, "--name", name, "--batch-size", str(a.batch_size),
               "--image-size", str(a.image_size), "--workers", str(workers), "--forever", "--quiet",
               "--min-consumers", str(n)] + extra_flags
        if device and a.device == "cuda":
            cmd += ["--device", "cuda:0"]
        return cmd

    def start_setup(self, g, setup, n, model, run_dir, data, job_extra=None, workers=None):
        """Starts the producers and the N jobs of a setup; returns (job roles, worker count, error)."""
        a = self.args
        self.port += 10
        name = f"cl{self.port}"
        w = workers or self.workers(setup, n)
        loader = {"dataloader": "torch", "tensorsocket": "tensorsocket", "coloader": "coloader",
                  "coloader-gpudecode": "coloader", "coloader-gpudecode-spin": "coloader",
                  "coloader-pyfed": "coloader-host"}.get(setup, "synthetic")
        feed_common = ["--data", data, "--workers", str(w), "--consumers", str(n), "--batch-size", str(a.batch_size),
                       "--image-size", str(a.image_size)]
        if setup == "tensorsocket":
            g.start("producer", [self.py, os.path.join(HERE, "collocated_feed.py"), "tensorsocket", "--port",
                                 str(self.port)] + feed_common + ([] if a.device == "cuda" else ["--no-pin-memory"]))
        elif setup == "coloader-pyfed":
            g.start("producer", [self.py, os.path.join(HERE, "collocated_feed.py"), "coloader", "--name", name]
                    + feed_common)
        elif setup in ("coloader", "synthetic+decode") or "gpudecode" in setup:
            flags = a.coloader_flags.split() + (a.gpu_decode_flags.split() if "gpudecode" in setup else [])
            flags += ["--gpu-wait", "spin"] if setup.endswith("-spin") else []
            g.start("producer", self.serve_cmd(name, data, 1 if setup.startswith("synthetic") else n, w, flags))
            if not g.wait_log("producer", "serving", 60):
                return [], w, "producer did not start: " + g.log_text("producer")
            if setup.startswith("synthetic"):
                g.start("drain", [self.binary, "consume", "--name", name, "--json"]
                        + (["--device"] if a.device == "cuda" else []), read_stdout=True)
        roles = []
        for i in range(n):
            extra = ["--port", str(self.port), "--name", name] + (["--data", data, "--workers", str(w)]
                                                                   if loader == "torch" else [])
            extra += (job_extra or {}).get(i, [])
            g.start(f"job{i}", self.job_cmd(i, loader, model, run_dir, data, extra), read_stdout=True)
            roles.append(f"job{i}")
        return roles, w, None

    def wait_lines(self, g, roles, predicate, timeout):
        """Waits until predicate(lines) holds for every role; returns an error string or None."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(predicate(g.lines[r]) for r in roles):
                return None
            for role, p in g.procs.items():
                if p.poll() is not None and not (role in roles and predicate(g.lines.get(role, []))):
                    return f"{role} exited with {p.returncode}: " + g.log_text(role)
            time.sleep(0.05)
        slow = [r for r in roles if not predicate(g.lines[r])]
        return f"timed out after {timeout:.0f} s waiting for {', '.join(slow)}: " + g.log_text(slow[0])

    def finish_jobs(self, g, roles, run_dir, timeout=60.0):
        open(os.path.join(run_dir, "stop"), "w").close()
        results, error = [], None
        deadline = time.monotonic() + timeout
        for role in roles:
            p = g.procs[role]
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                error = error or f"{role} did not stop within {timeout:.0f} s"
            path = os.path.join(run_dir, role + ".json")
            try:
                with open(path) as f:
                    results.append(json.load(f))
            except (OSError, ValueError):
                error = error or f"{role} left no result ({p.returncode}): " + g.log_text(role)
        return results, error

    def run_config(self, model, setup, n, repeat, workers=None):
        a = self.args
        tag = f"{model}-{setup.replace('+', '_')}-n{n}{'-w' + str(workers) if workers else ''}-r{repeat}"
        run_dir = os.path.join(self.run_root, tag)
        os.makedirs(run_dir, exist_ok=True)
        row = dict(model=model, setup=setup, n=n, repeat=repeat, window_s=a.window, cores=len(self.cores),
                   warmup=f"{a.synthetic_warmup}+{a.warmup}")
        base_mem = self.settle_gpu() if a.device == "cuda" else float("nan")
        started, stopping = time.monotonic(), None
        g = Group(run_dir, self.env, self.cores)
        try:
            roles, w, error = self.start_setup(g, setup, n, model, run_dir, a.data, workers=workers)
            row["workers"] = f"{w}/job" if setup == "dataloader" else ("" if setup == "synthetic" else str(w))
            if not error:
                error = self.wait_lines(g, roles, lambda ls: any(l.startswith("WARM") for l in ls), a.warm_timeout)
            if not error:
                row["startup_s"] = round(time.monotonic() - started, 1)
                window = self.measure(g, [g.procs[r].pid for r in roles])
                stopping = time.monotonic()
                results, error = self.finish_jobs(g, roles, run_dir)
            if error:
                row["status"] = "error: " + error.replace("\n", " | ")[-600:]
                return row
            row.update(self.figures(g, setup, window, results, base_mem))
            with open(os.path.join(run_dir, "epochs.json"), "w") as f:
                json.dump([r["epochs"] for r in results], f)
            return row
        finally:
            g.kill_all()
            now = time.monotonic()
            row["wall_s"] = round(now - started, 1)
            if stopping is not None:
                row["teardown_s"] = round(now - stopping, 1)

    def measure(self, g, jobs):
        """The measured window: CPU of the process trees at both ends, nvidia-smi during it."""
        a = self.args
        cuda = a.device == "cuda"
        sampler = GpuSampler([a.spare_core]) if cuda else None
        producer = g.procs.get("producer")
        t0 = time.monotonic()
        cpu0 = cpu_sample(g.roots(), jobs)
        threads0 = thread_cpu(producer.pid) if producer else {}
        time.sleep(a.window / 2)
        apps = compute_apps() if cuda else {}
        time.sleep(max(0.0, t0 + a.window - time.monotonic()))
        cpu1 = cpu_sample(g.roots(), jobs)
        threads1 = thread_cpu(producer.pid) if producer else {}
        t1 = time.monotonic()
        util, mem = sampler.stop() if sampler else ([], [])
        return dict(t0=t0, t1=t1, cpu=[y - x for x, y in zip(cpu0, cpu1)], jobs=jobs, apps=apps, util=util, mem=mem,
                    producer_threads=thread_cores(threads0, threads1, t1 - t0) if threads1 else "")

    def figures(self, g, setup, w, results, base_mem):
        """The CSV row's measurements from the window and the jobs' results."""
        t0, t1 = w["t0"], w["t1"]
        cpu, own, mps = w["cpu"]
        per_job, nexts = [], []
        for r in results:
            per_job.append(sum(s for d, s in zip(r["done"], r["sizes"]) if t0 < d <= t1))
            nexts += [d for s, d in zip(r["next_start"], r["next_s"]) if t0 < s <= t1]
        images, span = sum(per_job), t1 - t0
        rates = sorted(x / span for x in per_job)
        per_1k = (lambda x: round(1000 * x / images, 3)) if images else (lambda x: "")
        loads = setup != "synthetic"
        row = dict(status="ok", window_s=round(span, 2), images=images, agg_img_s=round(images / span, 1),
                   job_img_s_min=round(rates[0], 1), job_img_s_median=round(statistics.median(rates), 1),
                   job_img_s_max=round(rates[-1], 1), cpu_core_s=round(cpu, 2), cpu_per_1k=per_1k(cpu),
                   cpu_jobs_per_1k=per_1k(own), cpu_loading_per_1k=per_1k(cpu - own),
                   cores_busy=round(cpu / span, 2), producer_threads=w["producer_threads"], mps_cpu_s=round(mps, 2),
                   host_mem_peak_gib=round(g.peak_pss / 2**30, 2),
                   next_p50_us=round(1e6 * percentile(nexts, 0.5), 1) if loads else "",
                   next_p99_us=round(1e6 * percentile(nexts, 0.99), 1) if loads else "",
                   gpu_mem_job_torch_mib=round(statistics.median(r["max_memory_reserved"] for r in results) / 2**20))
        if w["util"]:
            row["gpu_util_pct"] = round(statistics.mean(w["util"]), 1)
            row["gpu_mem_total_gib"] = round((max(w["mem"]) - base_mem) / 1024, 2)
        apps = w["apps"]
        job_mem = [apps[p] for p in w["jobs"] if p in apps]
        if job_mem:
            row["gpu_mem_job_mib"] = round(statistics.median(job_mem))
        producers = tree([p.pid for role, p in g.procs.items() if not role.startswith("job")], all_stats())
        prod_mem = sum(apps[p] for p in producers if p in apps)
        if prod_mem:
            row["gpu_mem_producer_mib"] = round(prod_mem)
        drained = [json.loads(l)["images_per_s"] for l in g.lines.get("drain", []) if l.startswith("{")]
        if drained:
            row["producer_img_s"] = round(statistics.median(drained))
        # Fairness on the real dataset, where whole epochs ended within the run.
        complete = [e for r in results for e in r["epochs"] if e["complete"] and not e["partial"]]
        exact = sum(1 for e in complete if e["samples"] == e["distinct"] == self.images[self.args.data])
        row["epochs_exact"] = f"{exact}/{len(complete)}" if complete else ""
        return row

    # -- fairness ---------------------------------------------------------------------------

    def fairness(self, setups, data, expected, n=4, epochs=2):
        """For each setup, n jobs of different speeds (sleeps of 0, 20, 40, 60 ms a step) for
        `epochs` whole epochs of a small dataset: each job's samples and distinct samples per
        epoch. The setups run at the same time: speed does not matter here, only what arrives."""
        a = self.args
        groups, out = {}, []
        try:
            for setup in setups:
                run_dir = os.path.join(self.run_root, f"fairness-{setup}")
                os.makedirs(run_dir, exist_ok=True)
                g = Group(run_dir, self.env, self.cores)
                sleeps = {i: ["--step-sleep-ms", str(20 * i), "--synthetic-warmup", "1"] for i in range(n)}
                roles, _, error = self.start_setup(g, setup, n, "resnet18", run_dir, data, sleeps)
                groups[setup] = (g, roles, run_dir, error)
            deadline = time.monotonic() + a.fairness_timeout
            for setup, (g, roles, run_dir, error) in groups.items():
                if not error:
                    error = self.wait_lines(g, roles, lambda ls: sum(l.startswith("EPOCH") for l in ls) >= epochs,
                                            max(1.0, deadline - time.monotonic()))
                results, err2 = self.finish_jobs(g, roles, run_dir, 5 if error else 60)
                jobs = [[(e["samples"], e["distinct"]) for e in r["epochs"] if e["complete"]]
                        for r in sorted(results, key=lambda r: r["index"])]
                out.append({"setup": setup, "expected": expected, "jobs": jobs, "error": error or err2})
        finally:
            for g, *_ in groups.values():
                g.kill_all()
        return out


def say(msg):
    print(f"[collocated {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def count_images(data):
    return sum(1 for _ in glob.iglob(os.path.join(data, "*", "*")))


def plan(args, setups, bench):
    """The configurations in the order they are run, most needed first so that a deadline cuts
    the least: the first model at N=4 and 8 (the targets), the other models, the first model at
    the other N, then the extra setups; repeats interleaved."""
    p = PROFILES[args.profile]
    ns = args.n or p["ns"]
    rank = {4: 0, 8: 1, 1: 2, 2: 3}
    pairs = []
    for model in args.models:
        model_ns = ns
        if model == "resnet50" and not args.n and p["resnet50_ns"]:
            model_ns = [n for n in ns if n in p["resnet50_ns"]]
        pairs += [(model, n) for n in model_ns]
    first = args.models[0]
    pairs.sort(key=lambda mn: (0 if mn[0] == first and mn[1] in (4, 8) else 1 if mn[0] != first else 2,
                               args.models.index(mn[0]), rank.get(mn[1], 4), mn[1]))
    main = [s for s in setups if s in LOADERS + ["synthetic", "coloader-gpudecode"]]
    extra = [s for s in setups if s not in main]
    configs = []
    for r in range(args.repeats):
        for group in (main, extra if r == 0 else []):
            for model, n in pairs:
                for s in group:
                    tune = s == "dataloader" and r == 0 and model == first
                    ws = bench.worker_candidates(n) if tune else [None]
                    configs += [(model, s, n, r, w if len(ws) > 1 else None) for w in ws]
    return configs


# -- report -----------------------------------------------------------------------------------

def read_rows(paths):
    rows = []
    for path in paths:
        with open(path) as f:
            rows += list(csv.DictReader(f))
    return rows


def num(x):
    try:
        return float(x)
    except (TypeError, ValueError):
        return float("nan")


def summarise(rows):
    """{(model, setup, n): {column: (median, min, max, count)}} over the repeats that ran."""
    groups = {}
    for r in rows:
        if r.get("status") == "ok":
            groups.setdefault((r["model"], r["setup"], int(r["n"])), []).append(r)
    out = {}
    for key, rs in groups.items():
        tried = ""
        by_workers = {}
        for r in rs:
            by_workers.setdefault(r.get("workers", ""), []).append(r)
        if key[1] == "dataloader" and len(by_workers) > 1:
            # Workers tuned: the count with the highest median throughput stands for the setup.
            agg = {w: statistics.median(num(r["agg_img_s"]) for r in v) for w, v in by_workers.items()}
            best = max(agg, key=agg.get)
            tried = ", ".join(f"{w}: {agg[w]:,.0f}" for w in sorted(agg, key=lambda w: int(w.split("/")[0])))
            rs = by_workers[best]
        stats = {"tried": tried}
        for c in COLUMNS:
            vals = [num(r.get(c)) for r in rs]
            vals = [v for v in vals if v == v]
            if vals:
                stats[c] = (statistics.median(vals), min(vals), max(vals), len(vals))
        stats["workers"] = rs[0].get("workers", "")
        stats["producer_threads"] = " | ".join(r["producer_threads"] for r in rs if r.get("producer_threads"))
        exact = [r.get("epochs_exact") for r in rs if r.get("epochs_exact")]
        stats["epochs_exact"] = "; ".join(exact)
        out[key] = stats
    return out


def fmt(stat, digits=0, spread=True):
    if not stat:
        return "–"
    med, lo, hi, k = stat
    s = f"{med:,.{digits}f}"
    if spread and k > 1:
        s += f" ({lo:,.{digits}f}–{hi:,.{digits}f})"
    return s


def targets(summary, model):
    """Lines of the issue's targets, measured against each other (medians)."""
    def get(setup, n, col):
        st = summary.get((model, setup, n), {}).get(col)
        return st[0] if st else float("nan")

    lines = []
    c, dl, ts = (get(s, 4, "cpu_per_1k") for s in ("coloader", "dataloader", "tensorsocket"))
    ci, dli, tsi = (get(s, 4, "agg_img_s") for s in ("coloader", "dataloader", "tensorsocket"))

    def verdict(ok):
        return "n/a" if ok is None else ("met" if ok else "MISSED")

    def ratio(x, y):
        return x / y if x == x and y == y and y else float("nan")

    r1, r2, r3, r4 = ratio(c, dl), ratio(c, ts), ratio(ci, dli), ratio(ci, tsi)
    lines.append(f"| N=4 CPU/1k img, coloader / dataloader | ≤ 0.25 | {r1:.3f} ({c:.2f} / {dl:.2f} core-s) | "
                 f"{verdict(None if r1 != r1 else r1 <= 0.25)} |")
    lines.append(f"| N=4 CPU/1k img, coloader / tensorsocket | ≤ 0.5 | {r2:.3f} ({c:.2f} / {ts:.2f} core-s) | "
                 f"{verdict(None if r2 != r2 else r2 <= 0.5)} |")
    lines.append(f"| N=4 aggregate img/s, coloader / dataloader | ≥ 1 | {r3:.2f} ({ci:,.0f} / {dli:,.0f}) | "
                 f"{verdict(None if r3 != r3 else r3 >= 1)} |")
    lines.append(f"| N=4 aggregate img/s, coloader / tensorsocket | ≥ 1 | {r4:.2f} ({ci:,.0f} / {tsi:,.0f}) | "
                 f"{verdict(None if r4 != r4 else r4 >= 1)} |")
    at8 = sorted(((get(s, 8, "agg_img_s"), s) for s in LOADERS + ["coloader-gpudecode"]
                  if get(s, 8, "agg_img_s") == get(s, 8, "agg_img_s")), reverse=True)
    if at8:
        ranking = ", ".join(f"{s} {v:,.0f}" for v, s in at8)
        lines.append(f"| N=8 highest aggregate img/s | coloader | {ranking} | "
                     f"{verdict(at8[0][1].startswith('coloader') and at8[0][1] != 'coloader-pyfed')} |")
    return lines


def write_report(rows, out, meta, fair):
    summary = summarise(rows)
    models = sorted({k[0] for k in summary}, key=lambda m: (m != "resnet18", m))
    md = [f"# Collocated training: {meta.get('title', '')}".rstrip(": "), ""]
    for k in ("machine", "date", "command", "profile", "scaling", "dataset", "method"):
        if meta.get(k):
            md.append(f"* **{k}**: {meta[k]}")
    md.append("")
    for model in models:
        md += [f"## {model}", "",
               "| setup | N | aggregate img/s | per-job img/s (min–max) | CPU core-s / 1k img (jobs + loading) "
               "| cores busy | host mem GiB | GPU mem total GiB | GPU MiB/job (nvidia-smi; torch) | producer GPU MiB "
               "| GPU util % | next() p50 / p99 µs | workers | whole epochs exact |",
               "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for (m, setup, n), st in sorted(summary.items(), key=lambda kv: (ALL_SETUPS.index(kv[0][1])
                                                                          if kv[0][1] in ALL_SETUPS else 99, kv[0][2])):
            if m != model:
                continue
            extra = f", producer {fmt(st.get('producer_img_s'))} img/s" if st.get("producer_img_s") else ""
            md.append(
                f"| {setup} | {n} | {fmt(st.get('agg_img_s'))}{extra} | {fmt(st.get('job_img_s_min'), spread=False)}–"
                f"{fmt(st.get('job_img_s_max'), spread=False)} | {fmt(st.get('cpu_per_1k'), 2)} "
                f"({fmt(st.get('cpu_jobs_per_1k'), 2, False)} + {fmt(st.get('cpu_loading_per_1k'), 2, False)}) | "
                f"{fmt(st.get('cores_busy'), 1)} | {fmt(st.get('host_mem_peak_gib'), 1)} | "
                f"{fmt(st.get('gpu_mem_total_gib'), 1)} | {fmt(st.get('gpu_mem_job_mib'), spread=False)}; "
                f"{fmt(st.get('gpu_mem_job_torch_mib'), spread=False)} | {fmt(st.get('gpu_mem_producer_mib'), spread=False)} | "
                f"{fmt(st.get('gpu_util_pct'))} | {fmt(st.get('next_p50_us'), spread=False)} / "
                f"{fmt(st.get('next_p99_us'), spread=False)} | {st.get('workers', '')} | {st.get('epochs_exact', '')} |")
        tuned = [f"N={k[2]}: {st['tried']}" for k, st in sorted(summary.items(), key=lambda kv: kv[0][2])
                 if k[0] == model and st.get("tried")]
        if tuned:
            md += ["", "DataLoader workers per job tried (median aggregate img/s; the best is in the table): "
                   + "; ".join(tuned)]
        threads = [f"* {k[1]} N={k[2]}: {st['producer_threads']}" for k, st in
                   sorted(summary.items(), key=lambda kv: (kv[0][1], kv[0][2]))
                   if k[0] == model and st.get("producer_threads")]
        if threads:
            md += ["", "Where the producer's CPU went (cores per kind of thread over the window; one entry per "
                   "repeat; cl-worker: reading, decoding, augmenting; cl-gpulane: nvJPEG and the GPU kernels; "
                   "coloader: the session loop):", ""] + threads
        md += ["", f"Targets ({model}, medians of the same run):", "",
               "| target | wanted | measured | |", "| --- | --- | --- | --- |"] + targets(summary, model) + [""]
    errors = [r for r in rows if r.get("status") != "ok"]
    if errors:
        md += ["Configurations that failed or were skipped:", ""]
        md += [f"* {r['model']} {r['setup']} N={r['n']} repeat {r['repeat']}: {r['status'][:300]}" for r in errors]
        md.append("")
    if fair:
        md += ["## Fairness: samples per epoch", "",
               "4 jobs of different speeds (ResNet-18 plus a sleep of 0, 20, 40, 60 ms per step), 2 epochs of a "
               "small dataset; per job, per complete epoch: samples received / distinct samples "
               "(the dataset has the number in the second column).", "",
               "| setup | dataset | job 0 | job 1 | job 2 | job 3 | every epoch exact |", "| --- | ---: | --- | --- | --- | --- | --- |"]
        for f in fair:
            cells = [" ".join(f"{s}/{d}" for s, d in j) or "–" for j in f["jobs"]] + ["–"] * (4 - len(f["jobs"]))
            exact = all(j and all(s == d == f["expected"] for s, d in j) for j in f["jobs"]) and len(f["jobs"]) == 4
            md.append(f"| {f['setup']} | {f['expected']} | " + " | ".join(cells[:4]) +
                      f" | {'yes' if exact else 'NO'}{' (' + f['error'][:200] + ')' if f.get('error') else ''} |")
        md.append("")
    with open(os.path.join(out, "results.md"), "w") as fh:
        fh.write("\n".join(md) + "\n")
    if models:
        plot(summary, models, out)
    return "\n".join(md)


def plot(summary, models, out):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        say("matplotlib is missing: no plots")
        return
    charts = [("agg_img_s", "aggregate training images/s", "throughput.png"),
              ("cpu_per_1k", "CPU core-seconds per 1,000 images", "cpu.png"),
              ("gpu_mem_total_gib", "GPU memory in use, GiB (nvidia-smi, above idle)", "gpu_mem.png")]
    for col, label, name in charts:
        fig, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 4.2), squeeze=False)
        for ax, model in zip(axes[0], models):
            for setup in ALL_SETUPS:
                pts = sorted((n, st[col]) for (m, s, n), st in summary.items() if m == model and s == setup and col in st)
                if col == "cpu_per_1k" and setup.startswith("synthetic"):
                    continue
                if not pts:
                    continue
                xs = [n for n, _ in pts]
                ys = [v[0] for _, v in pts]
                err = [[v[0] - v[1] for _, v in pts], [v[2] - v[0] for _, v in pts]]
                style = "--" if setup.startswith("synthetic") else "-"
                ax.errorbar(xs, ys, yerr=err, marker="o", linestyle=style, capsize=3, label=setup)
            ax.set_xscale("log", base=2)
            ax.set_xticks([1, 2, 4, 8])
            ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
            ax.set_xlabel("collocated jobs N (one GPU, MPS)")
            ax.set_ylabel(label)
            ax.set_title(model)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(os.path.join(out, name), dpi=110)
        plt.close(fig)


# -- main -------------------------------------------------------------------------------------

def parse_workers(text):
    table = {}
    for item in filter(None, (text or "").split(",")):
        n, w = item.split(":")
        table[int(n)] = int(w)
    return table


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    prof = ap.add_mutually_exclusive_group()
    for name in PROFILES:
        prof.add_argument(f"--{name}", dest="profile", action="store_const", const=name)
    prof.add_argument("--report", nargs="+", metavar="OUT", help="only write results.md and plots from OUT/results.csv")
    ap.add_argument("--data", help="ImageFolder dataset (scripts/make_dataset.py)")
    ap.add_argument("--fair-data", help="small dataset for the fairness pass")
    ap.add_argument("--fair-setups", help="comma-separated setups of the fairness pass (profile's by default)")
    ap.add_argument("--out", default="collocated-out")
    ap.add_argument("--binary", default=os.environ.get("COLOADER_BINARY", os.path.join(ROOT, "build", "server", "coloader")))
    ap.add_argument("--setups", help="comma-separated subset of: " + ", ".join(ALL_SETUPS))
    ap.add_argument("--models", help="comma-separated torchvision models (profile's by default)")
    ap.add_argument("--n", help="comma-separated job counts (profile's by default)")
    ap.add_argument("--repeats", type=int)
    ap.add_argument("--window", type=float, help="measured seconds per configuration")
    ap.add_argument("--warmup", type=int, help="real-data warm-up steps per job")
    ap.add_argument("--synthetic-warmup", type=int, default=5)
    ap.add_argument("--warmup-max-s", type=float, default=4.0, help="warm after this long even if fewer steps (>= 2)")
    ap.add_argument("--deadline", type=float, help="seconds; configurations that would end past it are skipped")
    ap.add_argument("--shard", type=lambda t: tuple(int(x) for x in t.split("/")),
                    help="K/M: run every M-th configuration from the K-th (the device tool allows 10 minutes a "
                         "command); merge the outputs with --report OUT1 OUT2 ...")
    ap.add_argument("--cores", help="cores every setup runs on (default: all but the last)")
    ap.add_argument("--dl-workers", type=parse_workers, help="per-job DataLoader workers by N, e.g. 1:14,2:7,4:3,8:1")
    ap.add_argument("--coloader-flags", default="--output float32", help="extra `coloader serve` flags")
    ap.add_argument("--gpu-decode-flags", default="--decode gpu", help="added for the *gpudecode setups")
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--device", default="cuda", help="cpu: try the harness without a GPU (no MPS)")
    ap.add_argument("--no-mps", dest="mps", action="store_false")
    ap.add_argument("--warm-timeout", type=float, default=60.0)
    ap.add_argument("--fairness-timeout", type=float, default=90.0)
    ap.add_argument("--job-max-s", type=float, default=600.0)
    fairness = ap.add_mutually_exclusive_group()
    fairness.add_argument("--fairness", dest="fairness", action="store_true", default=None, help="run the fairness pass")
    fairness.add_argument("--no-fairness", dest="fairness", action="store_false")
    args = ap.parse_args()

    if args.report:
        rows = read_rows([os.path.join(o, "results.csv") for o in args.report])
        fair, meta = [], {}
        for o in reversed(args.report):  # the first output's meta.json wins
            fair = (read_saved(o, "fairness.json") or []) + fair
            meta = read_saved(o, "meta.json") or meta
        print(write_report(rows, args.report[0], meta, fair))
        return

    args.profile = args.profile or "quick"
    p = PROFILES[args.profile]
    if not args.data or not os.path.isdir(args.data):
        sys.exit(f"collocated: --data {args.data!r} is not a directory; make one with scripts/make_dataset.py")
    if not os.access(args.binary, os.X_OK):
        sys.exit(f"collocated: no coloader binary at {args.binary}; build it or pass --binary (or set COLOADER_BINARY)")
    args.models = args.models.split(",") if args.models else p["models"]
    args.n = [int(x) for x in args.n.split(",")] if args.n else None
    args.repeats = args.repeats or p["repeats"]
    args.window = args.window or p["window"]
    args.warmup = args.warmup or p["warmup"]
    # A shard is one device command, which may last 10 minutes, dataset generation included.
    args.deadline = args.deadline or (min(p["deadline"], 500) if args.shard else p["deadline"])
    args.fairness = p["fairness"] if args.fairness is None else args.fairness
    ncpu = len(os.sched_getaffinity(0))
    all_cores = sorted(os.sched_getaffinity(0))
    args.cores = [int(c) for c in args.cores.split(",")] if args.cores else all_cores[:-1] if ncpu > 2 else all_cores
    args.spare_core = next((c for c in all_cores if c not in args.cores), all_cores[-1])
    help_text = subprocess.run([args.binary, "serve", "--help"], capture_output=True, text=True).stdout
    has_gpu_decode = "--decode" in help_text
    if "--gpu-wait" not in help_text and "coloader-gpudecode-spin" in (args.setups or ""):
        sys.exit("collocated: coloader-gpudecode-spin needs a coloader whose serve has --gpu-wait; rebuild it")
    setups = args.setups.split(",") if args.setups else list(p["setups"])
    for s in setups:
        if s not in ALL_SETUPS:
            sys.exit(f"collocated: unknown setup {s!r}; choose from {', '.join(ALL_SETUPS)}")
    skipped_setups = []
    if not has_gpu_decode:
        skipped_setups = [s for s in setups if s in GPU_DECODE]
        setups = [s for s in setups if s not in GPU_DECODE]
    os.makedirs(args.out, exist_ok=True)
    start = time.monotonic()
    bench = Bench(args)
    configs = plan(args, setups, bench)
    if args.shard:
        k, m = args.shard
        configs = configs[k - 1::m]
    images = count_images(args.data)
    scaling = (f"profile {args.profile}: models {','.join(args.models)}, N {args.n or p['ns']}"
               f"{' (resnet50 at N ' + str(p['resnet50_ns']) + ')' if 'resnet50' in args.models and not args.n else ''}, "
               f"{len(setups)} setups, {args.repeats} repeat(s), warm-up {args.synthetic_warmup} synthetic + "
               f"{args.warmup} real steps (or {args.warmup_max_s:.0f} s), window {args.window:.0f} s, deadline "
               f"{args.deadline:.0f} s")
    if skipped_setups:
        scaling += f"; not run: {', '.join(skipped_setups)} (`coloader serve --help` lists no --decode)"
    say(scaling)
    say(f"{len(configs)} configurations; cores {args.cores[0]}-{args.cores[-1]} ({len(args.cores)}) for every setup, "
        f"core {args.spare_core} for this script and nvidia-smi; dataset {args.data}: {images} images")
    dl = ", ".join(f"N={n}: {bench.workers('dataloader', n)}" for n in (args.n or p["ns"]))
    sh = ", ".join(f"N={n}: {bench.workers('coloader', n)}" for n in (args.n or p["ns"]))
    say(f"DataLoader workers per job {dl}; shared producer workers {sh}")
    meta = {"title": f"{args.profile} profile", "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "command": " ".join([os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:]), "profile": args.profile,
            "scaling": scaling, "dataset": f"{args.data}: {images} images",
            "machine": machine_line(ncpu),
            "method": (f"every setup on cores {args.cores[0]}-{args.cores[-1]} ({len(args.cores)} cores, taskset); "
                       f"DataLoader workers per job {dl}; producer workers {sh}; coloader serve flags "
                       f"'{args.coloader_flags}'")}
    with open(os.path.join(args.out, "meta.json"), "w") as f:
        json.dump(meta, f)
    csv_path = os.path.join(args.out, "results.csv")
    rows = []
    fair = []
    if args.mps and args.device == "cuda":
        bench.start_mps()
    try:
        with open(csv_path, "w", newline="") as fcsv:
            writer = csv.DictWriter(fcsv, fieldnames=COLUMNS, extrasaction="ignore")
            writer.writeheader()
            durations, tuned = [], {}
            # The fairness pass runs once the targets' configurations have.
            fair_at = next((i for i, c in enumerate(configs) if c[0] != args.models[0] or c[2] not in (4, 8)),
                           len(configs))
            if args.shard and args.shard[0] != 1:
                fair_at = -1  # the first shard runs the fairness pass
            for i, (model, setup, n, rep, workers) in enumerate(configs):
                if i == fair_at and args.fairness:
                    fair = run_fairness(bench, args, setups)
                    with open(os.path.join(args.out, "fairness.json"), "w") as f:
                        json.dump(fair, f)
                guess = statistics.median(durations) if durations else 20.0
                if time.monotonic() - start + guess * (1.3 if model == "resnet50" else 1.0) > args.deadline:
                    row = dict(model=model, setup=setup, n=n, repeat=rep, status="skipped: past the deadline",
                               workers=f"{workers}/job" if workers else "")
                else:
                    row = bench.run_config(model, setup, n, rep, workers)
                    durations.append(row.get("wall_s", 20.0))
                    if workers and row["status"] == "ok":  # tuning: later repeats use the best so far
                        tuned.setdefault((model, n), {})[workers] = row["agg_img_s"]
                        best = tuned[(model, n)]
                        args.dl_workers = {**(args.dl_workers or {}), n: max(best, key=best.get)}
                    say(f"{model} {setup:<20} N={n}{' w' + str(workers) if workers else ''} r{rep}: " + (
                        f"{row['agg_img_s']:>8,.0f} img/s, CPU {row['cpu_per_1k']} core-s/1k img, "
                        f"GPU {row.get('gpu_util_pct', '-')}%, {row['wall_s']} s" if row["status"] == "ok"
                        else row["status"][:400]))
                rows.append(row)
                writer.writerow(row)
                fcsv.flush()
            if args.fairness and not fair and fair_at >= 0:
                fair = run_fairness(bench, args, setups)
                with open(os.path.join(args.out, "fairness.json"), "w") as f:
                    json.dump(fair, f)
            if tuned:
                kept = ",".join(f"{n}:{args.dl_workers[n]}" for n in sorted(args.dl_workers))
                say(f"DataLoader workers kept (for later shards): --dl-workers {kept}")
    finally:
        bench.stop_mps()
    meta["wall_s"] = round(time.monotonic() - start)
    with open(os.path.join(args.out, "meta.json"), "w") as f:
        json.dump(meta, f)
    report = write_report(read_rows([csv_path]), args.out, meta, fair)
    print(report)
    say(f"done in {time.monotonic() - start:.0f} s; {args.out}/results.csv, results.md, throughput.png, cpu.png, gpu_mem.png")


def run_fairness(bench, args, setups):
    data = args.fair_data
    if not data or not os.path.isdir(data):
        say("fairness pass skipped: no --fair-data directory")
        return []
    expected = count_images(data)
    t = time.monotonic()
    wanted = args.fair_setups.split(",") if args.fair_setups else PROFILES[args.profile]["fair_setups"]
    out = bench.fairness([s for s in wanted if s in setups], data, expected)
    for r in out:
        say(f"fairness {r['setup']}: {r['jobs']} (expected {expected} per epoch)"
            f"{' ' + r['error'][:300] if r['error'] else ''}")
    say(f"fairness pass: {time.monotonic() - t:.0f} s")
    return out


def read_saved(out, name):
    """OUT/name as JSON, or ./name from OUT/runs.tar.gz (where run_collocated.sh packs it)."""
    path = os.path.join(out, name)
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    tarball = os.path.join(out, "runs.tar.gz")
    if os.path.exists(tarball):
        with tarfile.open(tarball) as tar:
            try:
                return json.load(tar.extractfile("./" + name))
            except KeyError:
                return None
    return None


def machine_line(ncpu):
    gpu = smi("name,driver_version,memory.total")
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), "")
    except OSError:
        pass
    g = f"{gpu[0][0]} (driver {gpu[0][1]}, {gpu[0][2]} MiB)" if gpu else "no GPU"
    return f"{g}; {ncpu} cores ({model})"


if __name__ == "__main__":
    main()
