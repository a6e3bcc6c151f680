#!/usr/bin/env python3
"""Replays a short trace through `coloader launch` under MPS on a real GPU and sets the result
beside what `coloader simulate` predicts for the same trace (issue 26's replay). Phases, one
device command each (a command has at most 10 minutes):

  --phase fifo      launch --policy fifo-exclusive: every job alone, one after another; its
                    runtimes are the jobs' times alone (duration_s) for the default phase.
                    --part K/N runs the K-th of N consecutive slices of the jobs, so a trace
                    longer than one command runs in N commands; the default phase joins the
                    parts in order (one job at a time either way, so the joined run is the whole)
  --phase activity  each distinct job configuration's sm_activity measured as docs/PLACEMENT.md
                    defines it: the job's step alone and as 4 copies under an MPS daemon, data
                    on the GPU (benchmarks/step_time_ground_truth.py); writes activity.csv
  --phase default   launch with the default policy, then simulate both policies on the trace
                    with those times alone, and the report. --activity CSV (the activity
                    phase's) replaces the jobs file's stated sm_activity with the measured one;
                    --label names the run's folder, so repeats sit side by side

Each launch samples nvidia-smi every 0.25 s (power, memory) for the energy. Writes under --out:
fifo[-partKofN]/ and <label>/ with summary.json (launch --json), power.csv and launch.log; the
default phase's <label>/ also trace.json (the jobs as launched, with duration_s), simulate.csv
and report.md. Called by scripts/gpu.sh replay (scripts/gpu/replay.sh).
"""
import argparse
import csv
import io
import json
import os
import subprocess
import sys
import threading
import time


class PowerSampler(threading.Thread):
    """nvidia-smi's power.draw and memory.used of every GPU, every period_s."""

    def __init__(self, period_s=0.25):
        super().__init__(daemon=True)
        self.period_s, self.stop, self.rows = period_s, threading.Event(), []

    def run(self):
        while not self.stop.is_set():
            r = subprocess.run(["nvidia-smi", "--query-gpu=index,power.draw,memory.used", "--format=csv,noheader,nounits"],
                               capture_output=True, text=True)
            t = time.time()
            for line in r.stdout.splitlines():
                cells = [c.strip() for c in line.split(",")]
                try:
                    self.rows.append((t, int(cells[0]), float(cells[1]), float(cells[2])))
                except (ValueError, IndexError):
                    pass
            self.stop.wait(self.period_s)


def energy_kj(rows, t0, t1):
    """Joules/1000 over [t0, t1] of every GPU: each sample's power held until the next one."""
    by_gpu = {}
    for t, g, w, _ in rows:
        by_gpu.setdefault(g, []).append((t, w))
    total = 0.0
    for samples in by_gpu.values():
        samples = [s for s in samples if t0 <= s[0] <= t1]
        for (ta, wa), (tb, _) in zip(samples, samples[1:]):
            total += wa * (tb - ta)
    return total / 1000


def launch(args, jobs_path, policy, out):
    os.makedirs(out, exist_ok=True)
    sampler = PowerSampler()
    sampler.start()
    time.sleep(1.0)  # a second of idle power before the run
    t0 = time.time()
    cmd = [args.binary, "launch", jobs_path, "--json", "--run-dir", os.path.join(out, "run"), "--gpus", "nvml"]
    if policy:
        cmd += ["--policy", policy]
    with open(os.path.join(out, "launch.log"), "w") as log:
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=log, text=True, timeout=args.timeout_s)
    t1 = time.time()
    sampler.stop.set()
    sampler.join()
    with open(os.path.join(out, "power.csv"), "w") as f:
        f.write("t,gpu,power_w,memory_mib\n")
        for row in sampler.rows:
            f.write("%.3f,%d,%.1f,%.0f\n" % row)
    summary = json.loads(r.stdout) if r.stdout.strip() else {}
    summary["exit_code"] = r.returncode
    summary["energy_kj"] = energy_kj(sampler.rows, t0, t1)
    summary["policy"] = policy or "default"
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    return summary


def measured(summary):
    """makespan, mean JCT (every job is queued at the launch's start), OOMs, delta per GPU."""
    ends = [run["end_s"] for j in summary["jobs"] for run in j["runs"]]
    jcts = [max(run["end_s"] for run in j["runs"]) for j in summary["jobs"] if j["outcome"] == "done"]
    return {"makespan_s": max(ends), "mean_jct_s": sum(jcts) / len(jcts) if jcts else 0, "ooms": summary["ooms"],
            "done": summary["done"], "delta": summary.get("speedup", {}), "energy_kj": summary["energy_kj"]}


def gpu_memory_mib():
    r = subprocess.run(["nvidia-smi", "--query-gpu=index,memory.total", "--format=csv,noheader,nounits"],
                       capture_output=True, text=True, check=True)
    return [float(line.split(",")[1]) for line in r.stdout.splitlines() if line.strip()]


def parse_part(text):
    """'K/N' -> (K, N), 1 <= K <= N."""
    try:
        k, n = (int(x) for x in text.split("/"))
    except ValueError:
        sys.exit(f"--part {text!r}: expected K/N, e.g. 1/2")
    if not 1 <= k <= n:
        sys.exit(f"--part {text!r}: K must be in 1..N")
    return k, n


def run_fifo(args, spec):
    k, n = parse_part(args.part)
    jobs = spec["jobs"]
    lo, hi = (k - 1) * len(jobs) // n, k * len(jobs) // n
    out = os.path.join(args.out, "fifo" if n == 1 else f"fifo-part{k}of{n}")
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "jobs.json")
    with open(path, "w") as f:
        json.dump(dict(spec, jobs=jobs[lo:hi]), f, indent=1)
    s = launch(args, path, "fifo-exclusive", out)
    print(json.dumps(measured(s), indent=1))
    return 0 if s["exit_code"] == 0 else 1


def join_fifo(paths):
    """The fifo parts as one run: each part starts where the one before it ended (its wall time),
    as the jobs would have in one launch that runs them one at a time."""
    parts = [json.load(open(p)) for p in paths]
    joined, offset = dict(parts[0], jobs=[]), 0.0
    for part in parts:
        for job in part["jobs"]:
            runs = [dict(r, start_s=r["start_s"] + offset, end_s=r["end_s"] + offset) for r in job["runs"]]
            joined["jobs"].append(dict(job, runs=runs))
        offset += part["wall_s"]
    for key in ("done", "failed", "ooms", "producer_cpu_s", "per_job_loader_cpu_s", "energy_kj"):
        joined[key] = sum(p[key] for p in parts)
    joined["wall_s"] = offset
    joined["exit_code"] = max(p["exit_code"] for p in parts)
    return joined


def job_config(job):
    """The step a job trains, as benchmarks/step_time_ground_truth.py names it."""
    channels_last = "--channels-last" in job.get("command", [])
    return f"{job['model']},{job['batch_size']},{job.get('precision', 'fp32')},{job.get('optimizer', 'adamw')}," \
           f"{int(channels_last)}"


def run_activity(args, spec):
    configs = sorted({job_config(j) for j in spec["jobs"]})
    os.makedirs(args.out, exist_ok=True)
    bench = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "benchmarks",
                         "step_time_ground_truth.py")
    r = subprocess.run([sys.executable, bench, "--mps-out", os.path.join(args.out, "activity.csv"),
                        "--settle-s", str(args.settle_s), "--window-s", str(args.window_s), "--mps", *configs])
    return r.returncode


def measured_activity(path):
    """config text -> the measured activity, from the activity phase's CSV."""
    out = {}
    for r in csv.DictReader(open(path)):
        cl = int(r["channels_last"] == "True")
        out[f"{r['model']},{r['batch_size']},{r['precision']},{r['optimizer']},{cl}"] = round(float(r["activity"]), 3)
    return out


def images_under(folder):
    """How many samples an ImageFolder holds: its files, as the producer lists them."""
    return sum(len(files) for _, _, files in os.walk(folder))


def samples_read(job, spec):
    """The samples a job reads in all (its --epochs times its dataset), so that simulate holds
    a reader of a shared producer to the slowest reader's samples/s; 0 when unknown."""
    cmd = job.get("command", [])
    if "--epochs" not in cmd:
        return 0
    pipeline = job["pipeline"] if isinstance(job["pipeline"], dict) else spec["pipelines"][job["pipeline"]]
    return int(cmd[cmd.index("--epochs") + 1]) * images_under(pipeline["data"])


def run_default(args, spec):
    fifo = join_fifo(args.fifo_summary)
    alone = {j["name"]: j["runtime_s"] for j in fifo["jobs"] if j["outcome"] == "done" and j["attempts"] == 1}
    activity = measured_activity(args.activity) if args.activity else None
    for job in spec["jobs"]:
        if job["name"] not in alone:
            sys.exit(f"job {job['name']} did not run once to the end in the fifo phase; no time alone for it")
        job["duration_s"] = round(alone[job["name"]], 2)
        job["samples"] = samples_read(job, spec)
        if activity is not None:
            if job_config(job) not in activity:
                sys.exit(f"job {job['name']}: {args.activity} has no activity for {job_config(job)}")
            job["sm_activity"] = activity[job_config(job)]
    spec["gpus"] = [{"memory_mib": m, "sms": 132} for m in gpu_memory_mib()]
    out = os.path.join(args.out, args.label)
    os.makedirs(out, exist_ok=True)
    trace = os.path.join(out, "trace.json")
    with open(trace, "w") as f:
        json.dump(spec, f, indent=1)
    with open(os.path.join(out, "fifo_joined.json"), "w") as f:
        json.dump(fifo, f, indent=1)
    s = launch(args, trace, None, out)
    # Seconds, not the minutes of a cluster trace: a fine step; an OOM strikes in the first steps.
    run = subprocess.run([args.binary, "simulate", "--trace", trace, "--csv", "--sharing", "on", "--step-s", "0.25",
                          "--oom-after-s", "10", "--sample-s", "5"], capture_output=True, text=True)
    if run.returncode != 0:  # 1 with "cannot run on these GPUs": a job larger than every GPU, named
        raise SystemExit(f"coloader simulate failed ({run.returncode}): {run.stderr}")
    sim = run.stdout
    with open(os.path.join(out, "simulate.csv"), "w") as f:
        f.write(sim)
    predicted = {r["policy"]: r for r in csv.DictReader(io.StringIO(sim))}
    rows = [("fifo-exclusive", measured(fifo), predicted["fifo-exclusive"]),
            ("sharing-aware (default)", measured(s), predicted["sharing-aware"])]
    lines = [f"sm_activity: {'measured (' + args.activity + ')' if activity else 'as the jobs file states'}", "",
             "| policy | makespan s | simulated | error | mean JCT s | simulated | error | OOMs | delta | energy kJ |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name, m, p in rows:
        pm, pj = float(p["makespan_s"]), float(p["mean_jct_s"])
        delta = ", ".join(f"{v:.2f}" for v in m["delta"].values()) or "-"
        lines.append(f"| {name} | {m['makespan_s']:.0f} | {pm:.0f} | {(pm - m['makespan_s']) / m['makespan_s']:+.1%} "
                     f"| {m['mean_jct_s']:.0f} | {pj:.0f} | {(pj - m['mean_jct_s']) / m['mean_jct_s']:+.1%} "
                     f"| {m['ooms']} | {delta} (sim {float(p['mean_speedup']):.2f}) | {m['energy_kj']:.1f} |")
    report = "\n".join(lines) + "\n"
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write(report)
    print(report)
    return 0 if s["exit_code"] == 0 else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--phase", choices=["fifo", "activity", "default"], required=True)
    ap.add_argument("--jobs", default="examples/replay_gpu.json")
    ap.add_argument("--part", default="1/1", help="fifo: the K-th of N consecutive slices of the jobs (K/N)")
    ap.add_argument("--fifo-summary", nargs="+", help="default phase: the fifo phase's summary.json, or its parts' in order")
    ap.add_argument("--activity", help="default phase: the activity phase's activity.csv (measured sm_activity)")
    ap.add_argument("--label", default="default", help="default phase: the folder under --out for this run")
    ap.add_argument("--settle-s", type=float, default=15, help="activity: time for the copies to build and warm up")
    ap.add_argument("--window-s", type=float, default=5, help="activity: the common measuring window")
    ap.add_argument("--binary", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--timeout-s", type=float, default=500)
    args = ap.parse_args()
    spec = json.load(open(args.jobs))
    if args.phase == "fifo":
        return run_fifo(args, spec)
    if args.phase == "activity":
        return run_activity(args, spec)
    if not args.fifo_summary:
        sys.exit("--phase default needs --fifo-summary (the fifo phase's summary.json, or its parts')")
    return run_default(args, spec)


if __name__ == "__main__":
    sys.exit(main())
