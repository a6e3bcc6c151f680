"""benchmarks/collocated/collocated.py's runner: the setups, the profiles, the plan of configurations, and
Bench, which starts each configuration's processes, waits for them to warm up, measures the
window and turns it into a results.csv row (the method is in collocated.py's docstring)."""
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from collocated_probes import (GpuSampler, Group, ThreadStateSampler, all_stats, compute_apps, count_images,
                               cpu_sample, gpu_mem_used_mib, say, stage_line, stage_times, thread_cores, thread_cpu,
                               tree)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))  # benchmarks/collocated/ -> the repository
LOADERS = ["dataloader", "tensorsocket", "coloader", "coloader-pyfed"]
GPU_DECODE = ["coloader-gpudecode", "synthetic+gpudecode", "coloader-gpudecode-spin", "coloader-auto",
              "synthetic+autodecode"]
ALL_SETUPS = LOADERS + ["synthetic", "synthetic+decode", "synthetic+burn", "synthetic+delay"] + GPU_DECODE
COLUMNS = ["model", "setup", "n", "repeat", "status", "window_s", "images", "agg_img_s", "job_img_s_min",
           "job_img_s_median", "job_img_s_max", "cpu_core_s", "cpu_per_1k", "cpu_jobs_per_1k", "cpu_loading_per_1k",
           "cores_busy", "producer_threads", "thread_states", "stage_times", "variant", "mps_cpu_s", "host_mem_peak_gib", "gpu_mem_total_gib", "gpu_mem_job_mib",
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
    # Issue 16: GPU decode against the ceiling, the CPU decoder and per-job DataLoaders, 3
    # repeats (median and spread); 72 configurations, about 25 minutes: run it as --shard
    # 1/5 .. 5/5, one device command each (run_collocated.sh --gpudecode --shard K/5).
    "gpudecode": dict(models=["resnet18", "resnet50"], ns=[1, 2, 4],
                      setups=["synthetic", "coloader-gpudecode", "coloader", "dataloader"], repeats=3, window=4.0,
                      warmup=6, fairness=False, deadline=30 * 60, resnet50_ns=[1, 2, 4], fair_setups=[],
                      dl_spread=0),
    # Issue 24: --decode auto (the engines and the CPU workers splitting each batch) beside
    # gpu (the engines alone) and cpu, against the ceiling; run in shards like gpudecode's.
    "split": dict(models=["resnet18", "resnet50"], ns=[1, 2, 4],
                  setups=["synthetic", "coloader-auto", "coloader-gpudecode", "coloader", "dataloader"], repeats=3,
                  window=4.0, warmup=6, fairness=False, deadline=30 * 60, resnet50_ns=[1, 2, 4], fair_setups=[],
                  dl_spread=0),
}


def nice(n):
    """The command prefix that runs a process at niceness n (nothing at 0)."""
    return ["nice", "-n", str(n)] if n else []


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
            # One ring per GPU (--gpus); with --decode gpu each GPU's engines decode its share.
            cmd += ["--device", ",".join(f"cuda:{g}" for g in range(a.gpus))]
        return nice(a.serve_nice) + cmd

    def start_setup(self, g, setup, n, model, run_dir, data, job_extra=None, workers=None):
        """Starts the producers and the N jobs of a setup; returns (job roles, worker count, error)."""
        a = self.args
        self.port += 10
        name = f"cl{self.port}"
        w = workers or self.workers(setup, n)
        loader = {"dataloader": "torch", "tensorsocket": "tensorsocket", "coloader": "coloader",
                  "coloader-gpudecode": "coloader", "coloader-gpudecode-spin": "coloader", "coloader-auto": "coloader",
                  "coloader-pyfed": "coloader-host"}.get(setup, "synthetic")
        feed_common = ["--data", data, "--workers", str(w), "--consumers", str(n), "--batch-size", str(a.batch_size),
                       "--image-size", str(a.image_size)]
        if setup == "tensorsocket":
            g.start("producer", [self.py, os.path.join(HERE, "collocated_feed.py"), "tensorsocket", "--port",
                                 str(self.port)] + feed_common + ([] if a.device == "cuda" else ["--no-pin-memory"]))
        elif setup == "coloader-pyfed":
            g.start("producer", [self.py, os.path.join(HERE, "collocated_feed.py"), "coloader", "--name", name]
                    + feed_common)
        elif setup == "synthetic+burn":
            # As many busy loops as a producer has workers, beside synthetic jobs: what CPU load
            # alone (no decoding, no GPU work) costs the jobs; --burn-nice lowers their priority.
            for i in range(w):
                g.start(f"burn{i}", nice(a.burn_nice) + [self.py, "-c", "while True: pass"])
        elif setup in ("coloader", "synthetic+decode", "coloader-auto", "synthetic+autodecode") or "gpudecode" in setup:
            # With --device, serve decodes on the GPU by default (--decode auto): the CPU setups say cpu.
            cpu_decode = ["--decode", "cpu"] if a.has_gpu_decode else []
            decode = (a.gpu_decode_flags.split() if "gpudecode" in setup
                      else ["--decode", "auto"] if setup in ("coloader-auto", "synthetic+autodecode") else cpu_decode)
            flags = a.coloader_flags.split() + decode
            flags += ["--gpu-wait", "spin"] if setup.endswith("-spin") else []
            # A variant's serve environment (issue 16: e.g. the producer outside MPS).
            env = dict(a.serve_env, **({"COLOADER_STAGE_TIMES": "1"} if a.stage_times else {}))
            g.start("producer", self.serve_cmd(name, data, 1 if setup.startswith("synthetic") else n, w, flags),
                    env=env)
            if not g.wait_log("producer", "serving", 60):
                return [], w, "producer did not start: " + g.log_text("producer")
            if setup.startswith("synthetic"):
                g.start("drain", [self.binary, "consume", "--name", name, "--json", "--step-ms", str(a.drain_step_ms)]
                        + (["--device"] if a.device == "cuda" else []), read_stdout=True)
        roles = []
        for i in range(n):
            extra = ["--port", str(self.port), "--name", name] + (["--data", data, "--workers", str(w)]
                                                                   if loader == "torch" else [])
            extra += (job_extra or {}).get(i, [])
            if setup == "synthetic+delay":
                extra += ["--cpu-delay-ms", str(a.delay_ms)]
            env = dict(a.job_env) if loader != "synthetic" else {}
            if a.gpus > 1:
                env["CUDA_VISIBLE_DEVICES"] = str(i % a.gpus)  # job i on GPU i mod G, ceiling included
            g.start(f"job{i}", self.job_cmd(i, loader, model, run_dir, data, extra), read_stdout=True, env=env)
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
        # A variant (--variant) names its setups apart; the synthetic ceiling is the same for all.
        label = setup if not a.variant or setup == "synthetic" else f"{setup}@{a.variant}"
        row = dict(model=model, setup=label, n=n, repeat=repeat, window_s=a.window, cores=len(self.cores),
                   warmup=f"{a.synthetic_warmup}+{a.warmup}", variant=a.variant or "")
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
            if "producer" in g.procs:  # serve prints its stage timers as it stops
                stages = stage_times(g.log_text("producer", 100000))
                if stages:
                    row["stage_times"] = stage_line(stages)
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
        states = ThreadStateSampler(producer.pid) if producer and a.thread_states else None
        time.sleep(a.window / 2)
        apps = compute_apps() if cuda else {}
        time.sleep(max(0.0, t0 + a.window - time.monotonic()))
        cpu1 = cpu_sample(g.roots(), jobs)
        threads1 = thread_cpu(producer.pid) if producer else {}
        t1 = time.monotonic()
        thread_states = states.stop() if states else ""
        util, mem = sampler.stop() if sampler else ([], [])
        return dict(t0=t0, t1=t1, cpu=[y - x for x, y in zip(cpu0, cpu1)], jobs=jobs, apps=apps, util=util, mem=mem,
                    producer_threads=thread_cores(threads0, threads1, t1 - t0) if threads1 else "",
                    thread_states=thread_states)

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
                   thread_states=w["thread_states"],
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
    main = [s for s in setups if s in LOADERS + ["synthetic", "coloader-gpudecode", "coloader-auto"]]
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
