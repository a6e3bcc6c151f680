#!/usr/bin/env python3
"""Hand-off latency: from the moment the producer publishes a slot to the moment a waiting
consumer holds the batch (Consumer::Next returns), p50 and p99, with 1 and 4 consumers.

Only batches that became ready while the consumer was already waiting are counted (the
reference consumer reports them as handoff_samples); a batch that sat in the queue because
the consumer was busy measures the consumer, not the hand-off. Both timestamps are
CLOCK_MONOTONIC, comparable across processes.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(binary, data, consumers, epochs, batch, env, device, workers):
    name = f"handoff{consumers}"
    serve = subprocess.Popen([binary, "serve", "--data", data, "--name", name, "--batch-size", str(batch),
                              "--epochs", str(epochs), "--image-size", "64", "--min-consumers", str(consumers),
                              "--workers", str(workers), "--quiet"] + (["--device", "cuda:0"] if device else []),
                             env=env, stderr=subprocess.PIPE, text=True)
    line = serve.stderr.readline()
    while line and "serving" not in line:
        line = serve.stderr.readline()
    cons = [subprocess.Popen([binary, "consume", "--name", name, "--json"] + (["--device"] if device else []), env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(consumers)]
    p50s, p99s, n, queued = [], [], 0, []
    for c in cons:
        out, err = c.communicate()
        if c.returncode != 0:
            sys.exit(f"consumer failed: {err}")
        for l in out.splitlines():
            e = json.loads(l)
            if e["partial"]:
                continue
            p50s.append(e["handoff_p50_us"])
            queued.append(e.get("queued_next_p50_us", 0))
            p99s.append(e["handoff_p99_us"])
            n += e["handoff_samples"]
    serve.wait()
    p50s.sort()
    p99s.sort()
    queued.sort()
    return {"consumers": consumers, "p50_us": p50s[len(p50s) // 2], "p99_us": max(p99s), "batches_measured": n,
            "queued_next_p50_us": queued[len(queued) // 2]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--binary", default=os.path.join(ROOT, "build", "tools", "coloader"))
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--device", action="store_true", help="the GPU path (producer on cuda:0, consumers map it)")
    # Leave cores free for the consumers: the measurement is of the hand-off, not of the
    # scheduler finding a core among busy decoders.
    ap.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 6))
    args = ap.parse_args()
    env = dict(os.environ, COLOADER_RUN_DIR=tempfile.mkdtemp(prefix="coloader-handoff-"))
    results = [run(args.binary, args.data, n, args.epochs, args.batch_size, env, args.device, args.workers) for n in (1, 4)]
    for r in results:
        if args.json:
            print(json.dumps(r))
        else:
            print(f"{'GPU' if args.device else 'host'} path, {r['consumers']} consumer(s): hand-off p50 {r['p50_us']:.1f} us, p99 {r['p99_us']:.1f} us "
                  f"({r['batches_measured']} batches measured; median of per-epoch p50s, worst p99); "
                  f"Next() on an already-queued batch p50 {r['queued_next_p50_us']:.1f} us")


if __name__ == "__main__":
    main()
