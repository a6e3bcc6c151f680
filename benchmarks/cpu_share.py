#!/usr/bin/env python3
"""CPU seconds of N consumers sharing one producer vs N independent loaders.

Shared:      one `coloader serve` and N `coloader consume` processes.
Independent: N pairs of (`coloader serve`, `coloader consume`), all running at once, as N
             training jobs each with its own loader would.

Every process's CPU time (user + system, all threads) is read from wait4() when it exits, so
nothing is sampled or estimated. Prints one table; --json prints one object.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_group(commands, env):
    """Starts every command (each a list; the first of a group may be a producer that must be
    ready first), waits for all, returns (cpu_seconds_total, wall_seconds, outputs)."""
    procs = []
    t0 = time.monotonic()
    for cmd, wait_line in commands:
        p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if wait_line:  # a producer: wait for its readiness line before starting its consumers
            line = p.stderr.readline()
            while line and wait_line not in line:
                line = p.stderr.readline()
            if not line:
                sys.exit(f"producer failed to start: {' '.join(cmd)}")
        procs.append(p)
    cpu, outputs = 0.0, []
    for p in procs:
        _, status, ru = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        out = p.stdout.read()
        err = p.stderr.read()
        if p.returncode != 0:
            sys.exit(f"{' '.join(p.args)} exited {p.returncode}:\n{err}")
        cpu += ru.ru_utime + ru.ru_stime
        outputs.append(out)
    return cpu, time.monotonic() - t0, outputs


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="ImageFolder directory")
    ap.add_argument("--consumers", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--workers", type=int, default=os.cpu_count())
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--output", default="float32")
    ap.add_argument("--binary", default=os.path.join(ROOT, "build", "tools", "coloader"))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    run_dir = tempfile.mkdtemp(prefix="coloader-bench-")
    env = dict(os.environ, COLOADER_RUN_DIR=run_dir)
    serve = [args.binary, "serve", "--data", args.data, "--batch-size", str(args.batch_size),
             "--epochs", str(args.epochs), "--image-size", str(args.image_size),
             "--output", args.output, "--workers", str(args.workers), "--quiet"]
    consume = [args.binary, "consume", "--json"]
    n = args.consumers

    shared = [(serve + ["--name", "shared", "--min-consumers", str(n)], "serving")]
    shared += [(consume + ["--name", "shared"], None) for _ in range(n)]
    shared_cpu, shared_wall, shared_out = run_group(shared, env)

    independent = []
    for i in range(n):
        independent.append((serve + ["--name", f"solo{i}"], "serving"))
        independent.append((consume + ["--name", f"solo{i}"], None))
    solo_cpu, solo_wall, solo_out = run_group(independent, env)

    def samples(outputs):
        return sum(json.loads(line)["samples"] for out in outputs for line in out.splitlines() if line.startswith("{"))

    result = {
        "consumers": n,
        "images_per_consumer": samples(shared_out[1:]) // n,
        "shared_cpu_s": round(shared_cpu, 2),
        "independent_cpu_s": round(solo_cpu, 2),
        "ratio": round(shared_cpu / solo_cpu, 3),
        "shared_wall_s": round(shared_wall, 2),
        "independent_wall_s": round(solo_wall, 2),
    }
    if samples(solo_out[1::2]) != samples(shared_out[1:]):
        sys.exit("the two setups delivered different numbers of samples; not comparable")
    if args.json:
        print(json.dumps(result))
    else:
        print(f"{n} consumers x {result['images_per_consumer']} images each, {args.workers} workers per producer")
        print(f"  shared producer      CPU {shared_cpu:8.2f} s   wall {shared_wall:6.2f} s")
        print(f"  {n} independent      CPU {solo_cpu:8.2f} s   wall {solo_wall:6.2f} s")
        print(f"  ratio shared/independent CPU: {result['ratio']:.3f}  (sharing saved {100 * (1 - result['ratio']):.0f}%)")


if __name__ == "__main__":
    main()
