#!/usr/bin/env python3
"""What catch-up costs the jobs that share a producer (issue 39): two `coloader consume` jobs
read --epochs whole epochs, once alone and once while late jobs join mid-epoch one after another
(each is caught up on the samples it missed: decoded again for it alone), side by side in one run,
on the host path and, with --device, on the device path.

Per row: the shared jobs' images/s (mean of their epochs), the ratio to the same setup without
late jobs, the producer's CPU seconds (rusage), the samples it decoded again for late jobs (its
last progress line), and whether every late job's epoch was whole (unique samples = N, not
partial). The shared jobs pay for catch-up only in decoding: with jobs that read as fast as the
producer decodes (--step-ms 0) their slowdown is bounded by the share of decoding spent on the
late jobs; with a training step that leaves the producer headroom (--step-ms S) it should vanish.

    benchmarks/catch_up.py --data DIR                          # host path, this machine
    benchmarks/catch_up.py --data DIR --device cuda:0 --step-ms 0,20 --out catch_up.json
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def status(binary, name, env):
    out = subprocess.run([binary, "status", "--name", name, "--json", "--timeout-ms", "2000"], env=env,
                         capture_output=True, text=True, timeout=30)
    return json.loads(out.stdout) if out.returncode == 0 else None


def run(a, env, device, step_ms, joiners, tag):
    name = "catchup-%d-%s" % (os.getpid(), tag)
    serve = [a.binary, "serve", "--data", a.data, "--name", name, "--batch-size", str(a.batch_size),
             "--epochs", str(a.epochs), "--window", "4", "--min-consumers", "2", "--workers", str(a.workers),
             ]
    consume = [a.binary, "consume", "--name", name, "--json", "--wait-ms", "60000"]
    if device:
        serve += ["--device", device]
        consume += ["--device"]
    producer = subprocess.Popen(serve, env=env, stderr=subprocess.PIPE, text=True)
    log = []
    reader = threading.Thread(target=lambda: log.extend(producer.stderr), daemon=True)
    reader.start()
    steps = ["--step-ms", str(step_ms)] if step_ms else []
    shared = [subprocess.Popen(consume + ["--batch-size", str(b)] + steps, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True) for b in (a.batch_size, a.batch_size // 2 + 1)]
    late = []
    # Late jobs join at evenly spaced points of the run, each mid-epoch (37% into an epoch).
    n = None
    for k in range(joiners):
        while producer.poll() is None:
            st = status(a.binary, name, env)
            if st and st.get("epoch_samples"):
                n = st["epoch_samples"]
                at = (k * a.epochs / max(joiners, 1) + 0.37) * n
                if st["epoch"] * n + st["position"] >= at:
                    break
            time.sleep(0.02)  # a drive schedule, not a test's wait
        if producer.poll() is not None:
            break
        # At the shared jobs' pace (a slower job would hold them back while it reads the shared
        # part of its epoch, catch-up or not): what is measured is what catching up costs.
        late.append(subprocess.Popen(consume + ["--epochs", "1", "--batch-size", str(a.batch_size)] + steps, env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = [p.communicate(timeout=a.timeout) for p in shared]
    late_results = [p.communicate(timeout=a.timeout) for p in late]
    _, rc, usage = os.wait4(producer.pid, 0)
    producer.returncode = rc
    reader.join(timeout=5)
    rates, whole = [], 0
    for (out, err), p in zip(results, shared):
        if p.returncode != 0:
            raise SystemExit("a shared job failed: " + err[-400:])
        epochs = [json.loads(line) for line in out.splitlines()]
        rates += [e["images_per_s"] for e in epochs]
        n = n or (epochs[0]["samples"] if epochs else None)
    outcomes = []  # each late job's: whole, after the end (it came once every epoch was out), or not
    for (out, err), p in zip(late_results, late):
        epochs = [json.loads(line) for line in out.splitlines()]
        if p.returncode == 0 and epochs and not epochs[0]["partial"] and \
                epochs[0]["unique_samples"] == epochs[0]["samples"] == (n or epochs[0]["samples"]):
            whole += 1
            outcomes.append("whole")
        elif p.returncode == 0 and (not epochs or epochs[0]["samples"] == 0):
            outcomes.append("after the end")
        else:
            outcomes.append("NOT WHOLE: rc %s, %s, %s" % (p.returncode, epochs[:1], err[-300:]))
    said = "".join(log)
    caught = re.findall(r"caught up (\d+) samples", said)
    return {"path": "device" if device else "host", "step_ms": step_ms, "late_jobs": len(late),
            "late_whole": whole, "late_outcomes": outcomes, "shared_images_per_s": sum(rates) / len(rates) if rates else 0.0,
            "producer_cpu_s": usage.ru_utime + usage.ru_stime, "caught_up_samples": int(caught[-1]) if caught else 0,
            "epoch_samples": n}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True)
    ap.add_argument("--device", default=None, help="e.g. cuda:0: also the device path")
    ap.add_argument("--binary", default=os.path.join(ROOT, "build", "tools", "coloader"))
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--workers", type=int, default=os.cpu_count())
    ap.add_argument("--late", type=int, default=3, help="late jobs in the catch-up runs")
    ap.add_argument("--step-ms", default="0", help="the shared and late jobs' step time per batch, a list")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--out", default=None, help="the rows as JSON")
    a = ap.parse_args()
    env = dict(os.environ)
    env.setdefault("COLOADER_RUN_DIR", tempfile.mkdtemp(prefix="coloader-catchup-"))
    rows = []
    for device in [None] + ([a.device] if a.device else []):
        for step_ms in [int(s) for s in a.step_ms.split(",")]:
            alone = run(a, env, device, step_ms, 0, "alone")
            late = run(a, env, device, step_ms, a.late, "late")
            late["ratio"] = late["shared_images_per_s"] / alone["shared_images_per_s"] if alone["shared_images_per_s"] else 0
            alone["ratio"] = 1.0
            rows += [alone, late]
            for r in (alone, late):
                print(json.dumps(r), flush=True)
    print("\n| path | step ms | late jobs (whole) | shared jobs img/s | ratio | producer CPU s | samples decoded again |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print("| %s | %d | %d (%d) | %.0f | %.3f | %.1f | %d of %d x %d |" % (
            r["path"], r["step_ms"], r["late_jobs"], r["late_whole"], r["shared_images_per_s"], r["ratio"],
            r["producer_cpu_s"], r["caught_up_samples"], r["epoch_samples"] or 0, a.epochs))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(rows, f, indent=1)
    bad = [r for r in rows if any(o.startswith("NOT WHOLE") for o in r["late_outcomes"])]
    for r in bad:
        print("late jobs not whole (%s, step %d): %s" % (r["path"], r["step_ms"], r["late_outcomes"]), file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
