"""benchmarks/collocated/collocated.py's probes: CPU per process tree and per kind of thread from /proc,
memory (PSS), nvidia-smi's GPU figures, the processes of one configuration (Group), and the
producer's own per-stage timers read from its log (COLOADER_STAGE_TIMES=1). No torch here."""
import glob
import os
import shutil
import signal
import subprocess
import threading
import time

CLK_TCK = os.sysconf("SC_CLK_TCK")


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
    name without its number (coloader names its own: cl-worker-N, cl-gpulane-GPU-N; CUDA's and
    nvJPEG's keep theirs). Empty when the process is gone."""
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        st = read_stat(f"{pid}/task/{tid}")
        if st:
            name = st[3].rstrip("0123456789-") or st[3]
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

    def start(self, role, cmd, read_stdout=False, env=None):
        log = open(os.path.join(self.run_dir, role + ".log"), "w")
        p = subprocess.Popen(taskset(self.cores) + cmd, env=dict(self.env, **(env or {})), stdout=subprocess.PIPE if read_stdout else log,
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


def say(msg):
    print(f"[collocated {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def count_images(data):
    return sum(1 for _ in glob.iglob(os.path.join(data, "*", "*")))


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


# -- what the producer's threads are doing, and its own stage timers --------------------------

# x86-64 system call numbers a waiting thread sits in (from /proc/PID/task/TID/syscall).
_SYSCALLS = {0: "read", 7: "poll", 16: "ioctl", 23: "select", 24: "sched_yield", 35: "nanosleep", 202: "futex",
             232: "epoll_wait", 270: "pselect6", 271: "ppoll", 281: "epoll_pwait", 230: "clock_nanosleep"}


class ThreadStateSampler:
    """Samples, every `interval` seconds while running, each thread of `pid`: running (R) or
    in which system call it waits. A poor man's profile where perf cannot be carried: a GPU
    lane that spins shows R (or sched_yield), one that sleeps on the GPU shows ioctl or futex."""

    def __init__(self, pid, interval=0.01):
        self.pid, self.interval = pid, interval
        self.counts = {}  # kind of thread -> {state: samples}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _sample(self):
        try:
            tids = os.listdir(f"/proc/{self.pid}/task")
        except OSError:
            return
        for tid in tids:
            base = f"/proc/{self.pid}/task/{tid}"
            try:
                with open(base + "/stat") as f:
                    s = f.read()
                comm = s[s.index("(") + 1:s.rindex(")")]
                state = s[s.rindex(")") + 2]
                if state != "R":
                    with open(base + "/syscall") as f:
                        first = f.read().split()[0]
                    state = "running" if first == "running" else _SYSCALLS.get(int(first), "sys" + first) \
                        if first.lstrip("-").isdigit() else first
                else:
                    state = "R"
            except (OSError, ValueError, IndexError):
                continue
            kind = comm.rstrip("0123456789-") or comm
            by_state = self.counts.setdefault(kind, {})
            by_state[state] = by_state.get(state, 0) + 1

    def _run(self):
        while not self._stop.wait(self.interval):
            self._sample()

    def stop(self):
        """'kind: R 83% futex 10% ...; ...' for the threads coloader names (cl-*) and the
        session loop, busiest (most R) first."""
        self._stop.set()
        self._thread.join(2)
        parts = []
        for kind, states in self.counts.items():
            total = sum(states.values())
            if not total:
                continue
            top = sorted(states.items(), key=lambda kv: -kv[1])[:4]
            parts.append((states.get("R", 0) / total, kind + ": " + " ".join(f"{s} {100 * c / total:.0f}%"
                                                                              for s, c in top)))
        return "; ".join(p for _, p in sorted(parts, reverse=True))


def stage_times(log_text):
    """{stage: (calls, images, wall_ms, cpu_ms)} from the "[stage]" lines a producer run with
    COLOADER_STAGE_TIMES=1 prints when it stops (pipeline/stage_times.cc)."""
    out = {}
    for line in log_text.splitlines():
        f = line.split()
        if len(f) >= 10 and f[0] == "[stage]":
            try:
                out[f[1]] = (int(f[3]), int(f[5]), float(f[7]), float(f[9]))
            except ValueError:
                continue
    return out


def stage_line(stages):
    """'stage cpu/wall µs per image; ...': each stage's CPU and wall time per image it handled,
    and, after '=', the CPU of the whole lane per image the lanes finished."""
    parts = []
    for name, (calls, images, wall_ms, cpu_ms) in stages.items():
        per = images or calls
        parts.append(f"{name} {1000 * cpu_ms / per:.1f}/{1000 * wall_ms / per:.1f}")
    lane_images = stages.get("lane.sync", (0, 0, 0, 0))[1]
    # decode_init is timed inside the decode stages: not counted twice.
    lane_cpu = sum(v[3] for k, v in stages.items() if k.startswith("lane.") and k not in ("lane.queue_wait",
                                                                                          "lane.decode_init"))
    if lane_images:
        parts.append(f"= lane CPU {1000 * lane_cpu / lane_images:.1f} us/img")
    return "; ".join(parts)
