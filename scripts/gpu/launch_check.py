#!/usr/bin/env python3
"""Runs `coloader launch JOBS` on a GPU machine while sampling nvidia-smi, then checks that what
was measured stays within the plan's bounds:

  - each job process: peak nvidia-smi memory <= the MiB the plan reserved for that attempt
    (its CUDA_MPS_PINNED_DEVICE_MEM_LIMIT);
  - the producer: peak <= its planned device footprint (ring + context allowance);
  - the GPU: peak memory.used above what was in use before <= the plan's total for that GPU,
    plus what processes outside the plan (the MPS server) were seen to hold.

Writes plan.json/plan.txt, launch.log, summary.json, samples.csv, check.json and check.txt under
--out; exits 1 when a bound is exceeded or a job failed. Called by scripts/gpu.sh launch.
"""
import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

# When the estimator is not installed, "auto" jobs get these stated figures instead (MiB at
# peak, nvidia-smi's view; a rough allowance for ResNet-18). The check runs the module the
# planner runs, `python -m coloader.estimator`.
FALLBACK_MIB = {
    ("torchvision:resnet18", 128, "fp32"): 6000,
    ("torchvision:resnet18", 64, "fp32"): 4000,
    ("torchvision:resnet18", 96, "bf16-amp"): 4200,
}


def smi(query, what):
    r = subprocess.run(["nvidia-smi", f"--query-{what}={query}", "--format=csv,noheader,nounits"],
                       capture_output=True, text=True)
    rows = []
    for line in r.stdout.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) == len(query.split(",")):
            rows.append(cells)
    return rows


def gpu_used():
    return {int(i): float(m) for i, m in smi("index,memory.used", "gpu")}


class Sampler(threading.Thread):
    def __init__(self, period_s):
        super().__init__(daemon=True)
        self.period_s, self.stop, self.rows = period_s, threading.Event(), []

    def run(self):
        while not self.stop.is_set():
            t = time.time()
            for pid, mem in smi("pid,used_memory", "compute-apps"):
                if mem.isdigit():
                    self.rows.append((t, "pid", int(pid), float(mem)))
            for gpu, used in gpu_used().items():
                self.rows.append((t, "gpu", gpu, used))
            self.stop.wait(self.period_s)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", default="examples/jobs_gpu.json")
    ap.add_argument("--binary", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--period-s", type=float, default=0.25)
    ap.add_argument("--timeout-s", type=float, default=420)
    args = ap.parse_args()
    out = args.out
    os.makedirs(out, exist_ok=True)
    notes = []

    jobs_path = args.jobs
    est = subprocess.run([sys.executable, "-m", "coloader.estimator", "--help"], capture_output=True, text=True)
    if est.returncode != 0:
        spec = json.load(open(jobs_path))
        for job in spec["jobs"]:
            if job.get("memory_mib") == "auto":
                key = (job["model"], job["batch_size"], job.get("precision", "fp32"))
                job["memory_mib"] = FALLBACK_MIB[key]
        jobs_path = f"{out}/jobs_fallback.json"
        json.dump(spec, open(jobs_path, "w"), indent=1)
        notes.append("estimator not installed: memory from FALLBACK_MIB in scripts/gpu/launch_check.py")
    else:
        notes.append("memory from the estimator (python -m coloader.estimator)")

    plan = subprocess.run([args.binary, "plan", jobs_path, "--json", "--python", sys.executable],
                          capture_output=True, text=True)
    open(f"{out}/plan.json", "w").write(plan.stdout + plan.stderr)
    if plan.returncode != 0:
        print("plan failed:\n" + plan.stdout + plan.stderr, flush=True)
        return 1
    plan = json.loads(plan.stdout)
    # The estimates are in the plan now: the table and the launch reuse them rather than run the
    # estimator again (each run imports torch).
    spec = json.load(open(jobs_path))
    # reserved_mib also holds the consumer term (client_mib), which the planner adds again.
    estimates = {j["name"]: j["reserved_mib"] - j.get("client_mib", 0) for j in plan["jobs"]}
    for job in spec["jobs"]:
        if job.get("memory_mib") == "auto" and job["name"] in estimates:
            job["memory_mib"] = estimates[job["name"]]
    jobs_path = f"{out}/jobs_resolved.json"
    json.dump(spec, open(jobs_path, "w"), indent=1)
    table = subprocess.run([args.binary, "plan", jobs_path], capture_output=True, text=True)
    open(f"{out}/plan.txt", "w").write(table.stdout + table.stderr)
    print(table.stdout + table.stderr, flush=True)

    baseline = gpu_used()
    sampler = Sampler(args.period_s)
    sampler.start()
    t0 = time.time()
    launch = subprocess.Popen([args.binary, "launch", jobs_path, "--json", "--run-dir", f"{out}/run"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        summary_text, log = launch.communicate(timeout=args.timeout_s)
    except subprocess.TimeoutExpired:
        # A clean stop (jobs, producer, MPS daemon), as Ctrl-C would do.
        launch.send_signal(signal.SIGTERM)
        summary_text, log = launch.communicate(timeout=120)
        notes.append(f"launch stopped after {args.timeout_s:.0f} s")
    rc = launch.returncode
    wall = time.time() - t0
    time.sleep(2 * args.period_s)
    sampler.stop.set()
    sampler.join()
    open(f"{out}/launch.log", "w").write(log)
    open(f"{out}/summary.json", "w").write(summary_text)
    with open(f"{out}/samples.csv", "w") as f:
        f.write("t,kind,id,mib\n")
        for t, kind, ident, mib in sampler.rows:
            f.write(f"{t - t0:.2f},{kind},{ident},{mib:.0f}\n")
    print(log, flush=True)

    # Who was which pid, and the MiB each attempt was planned with.
    bound = {}  # pid -> (what, MiB)
    for name, pid, mib in re.findall(r"job (\S+) started \(pid (\d+)\) on GPU \d+, \w+, (\d+) MiB", log):
        bound[int(pid)] = (f"job {name}", float(mib))
    producer_mib = {p["name"]: p["device_mib_per_gpu"] for p in plan["producers"]}
    for p in plan["producers"]:
        notes.append(f"producer {p['name']}: planned {p['device_mib_per_gpu']:.0f} MiB per GPU (ring + 600 MiB "
                     "context allowance); a consumer's own nvidia-smi figure may include its mapping of the ring")
    for name, pid in re.findall(r"producer (\S+) started \(pid (\d+)", log):
        bound[int(pid)] = (f"producer {name}", producer_mib.get(name, 0.0))
    peak = {}
    for _, kind, ident, mib in sampler.rows:
        if kind == "pid":
            peak[ident] = max(peak.get(ident, 0.0), mib)
    gpu_peak = {}
    for _, kind, ident, mib in sampler.rows:
        if kind == "gpu":
            gpu_peak[ident] = max(gpu_peak.get(ident, 0.0), mib - baseline.get(ident, 0.0))

    checks, ok = [], rc == 0
    for pid, (what, mib) in sorted(bound.items()):
        measured = peak.get(pid)
        if measured is None:
            checks.append({"what": what, "pid": pid, "bound_mib": mib, "measured_mib": None,
                           "ok": None, "note": "not seen by nvidia-smi (other pid namespace, or too short)"})
            continue
        checks.append({"what": what, "pid": pid, "bound_mib": mib, "measured_mib": measured, "ok": measured <= mib})
        ok = ok and measured <= mib
    others = {pid: m for pid, m in peak.items() if pid not in bound}
    for g in plan["gpus"]:
        measured = gpu_peak.get(g["index"])
        if measured is None:
            continue
        # Processes the plan does not place (the MPS server) are allowed what they were seen to use.
        extra = sum(others.values())
        good = measured <= g["planned_mib"] + extra
        checks.append({"what": f"GPU {g['index']} total above baseline", "bound_mib": g["planned_mib"] + extra,
                       "measured_mib": measured, "ok": good,
                       "note": f"bound = plan {g['planned_mib']:.0f} MiB + processes not in the plan {others}"})
        ok = ok and good
    try:
        summary = json.loads(summary_text)
    except ValueError:
        summary = {"error": "no summary", "stdout": summary_text[-2000:]}
    result = {"ok": None, "launch_rc": rc, "wall_s": wall, "notes": notes, "checks": checks, "summary": summary,
              "baseline_mib": baseline, "samples": len(sampler.rows)}
    lines = [f"launch exit {rc}, {wall:.1f} s; " + "; ".join(notes)]
    for c in checks:
        m = "-" if c["measured_mib"] is None else f"{c['measured_mib']:.0f}"
        lines.append(f"{c['what']:<40} measured {m:>7} MiB  bound {c['bound_mib']:>8.0f} MiB  "
                     f"{'ok' if c['ok'] else ('n/a' if c['ok'] is None else 'EXCEEDED')}")
    seen = [c for c in checks if c["ok"] is not None]
    if not seen:
        ok = False
        notes.append("nothing was measured")
    per_process = any(c["ok"] is not None and "pid" in c for c in checks)
    lines.append("RESULT: " + ("within the plan's bounds" if ok else "FAILED") +
                 ("" if per_process or not ok else " (GPU total only: nvidia-smi showed no job's own figure)"))
    result["ok"] = ok
    json.dump(result, open(f"{out}/check.json", "w"), indent=1)
    open(f"{out}/check.txt", "w").write("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
