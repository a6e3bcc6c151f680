#!/usr/bin/env python3
"""Replays a short trace through `coloader launch` under MPS on a real GPU and sets the result
beside what `coloader simulate` predicts for the same trace (issue 26's replay). Two phases, one
device command each (a command has at most 10 minutes):

  --phase fifo     launch --policy fifo-exclusive: every job alone, one after another; its
                   runtimes are the jobs' times alone (duration_s) for the next phase
  --phase default  launch with the default policy, then simulate both policies on the trace
                   with those times alone, and the report

Each run samples nvidia-smi every 0.25 s (power, memory) for the energy. Writes under --out:
<phase>/summary.json (launch --json), <phase>/power.csv, <phase>/launch.log, and for the default
phase trace.json (the jobs with duration_s), simulate.csv and report.md. Called by
scripts/gpu.sh replay (scripts/gpu/replay.sh).
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


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--phase", choices=["fifo", "default"], required=True)
    ap.add_argument("--jobs", default="examples/replay_gpu.json")
    ap.add_argument("--fifo-summary", help="default phase: the fifo phase's summary.json")
    ap.add_argument("--binary", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--timeout-s", type=float, default=500)
    args = ap.parse_args()
    if args.phase == "fifo":
        s = launch(args, args.jobs, "fifo-exclusive", os.path.join(args.out, "fifo"))
        print(json.dumps(measured(s), indent=1))
        return 0 if s["exit_code"] == 0 else 1

    fifo = json.load(open(args.fifo_summary))
    alone = {j["name"]: j["runtime_s"] for j in fifo["jobs"] if j["outcome"] == "done" and j["attempts"] == 1}
    spec = json.load(open(args.jobs))
    for job in spec["jobs"]:
        if job["name"] not in alone:
            sys.exit(f"job {job['name']} did not run once to the end in the fifo phase; no time alone for it")
        job["duration_s"] = round(alone[job["name"]], 2)
    spec["gpus"] = [{"memory_mib": m, "sms": 132} for m in gpu_memory_mib()]
    os.makedirs(args.out, exist_ok=True)
    trace = os.path.join(args.out, "trace.json")
    with open(trace, "w") as f:
        json.dump(spec, f, indent=1)
    s = launch(args, trace, None, os.path.join(args.out, "default"))
    # Seconds, not the minutes of a cluster trace: a fine step; an OOM strikes in the first steps.
    sim = subprocess.run([args.binary, "simulate", "--trace", trace, "--csv", "--sharing", "on", "--step-s", "0.25",
                          "--oom-after-s", "10", "--sample-s", "5"], capture_output=True, text=True, check=True).stdout
    with open(os.path.join(args.out, "simulate.csv"), "w") as f:
        f.write(sim)
    predicted = {r["policy"]: r for r in csv.DictReader(io.StringIO(sim))}
    rows = [("fifo-exclusive", measured(fifo), predicted["fifo-exclusive"]),
            ("sharing-aware (default)", measured(s), predicted["sharing-aware"])]
    lines = ["| policy | makespan s | simulated | error | mean JCT s | simulated | error | OOMs | delta | energy kJ |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name, m, p in rows:
        pm, pj = float(p["makespan_s"]), float(p["mean_jct_s"])
        delta = ", ".join(f"{v:.2f}" for v in m["delta"].values()) or "-"
        lines.append(f"| {name} | {m['makespan_s']:.0f} | {pm:.0f} | {(pm - m['makespan_s']) / m['makespan_s']:+.1%} "
                     f"| {m['mean_jct_s']:.0f} | {pj:.0f} | {(pj - m['mean_jct_s']) / m['mean_jct_s']:+.1%} "
                     f"| {m['ooms']} | {delta} (sim {float(p['mean_speedup']):.2f}) | {m['energy_kj']:.1f} |")
    report = "\n".join(lines) + "\n"
    with open(os.path.join(args.out, "report.md"), "w") as f:
        f.write(report)
    print(report)
    return 0 if s["exit_code"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
