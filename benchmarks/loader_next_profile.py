#!/usr/bin/env python3
"""Where a training job's `next(loader)` goes when its batch is already there (issue 24: one
ResNet-18 job's step is ~0.25 ms longer under coloader than on synthetic data though it hardly
waits). One `coloader serve` runs ahead of one coloader.Loader; the loop sleeps between batches
as a training step would, so every next() finds its batch published. Prints next()'s p50/p90 in
µs, then cProfile's functions by own time over the profiled calls.

    benchmarks/loader_next_profile.py --data DIR [--device cuda] [--batches 300] [--binary B]

With --device cuda the Loader reads the GPU ring (device="cuda", each batch copied for the
job); without, the host path.
"""
import argparse
import cProfile
import io
import os
import pstats
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--binary", default=os.environ.get("COLOADER_BINARY", os.path.join(ROOT, "build", "tools", "coloader")))
    ap.add_argument("--device", default="", help="cuda: the device path")
    ap.add_argument("--batches", type=int, default=300)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--step-s", type=float, default=0.03, help="sleep between batches (the training step)")
    args = ap.parse_args()
    import coloader

    name = f"nextprof{os.getpid()}"
    cmd = [args.binary, "serve", "--data", args.data, "--name", name, "--batch-size", str(args.batch_size),
           "--image-size", str(args.image_size), "--output", "float32", "--forever", "--window", "8", "--quiet"]
    if args.device:
        cmd += ["--device", "cuda:0"]
    serve = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    try:
        line = serve.stderr.readline()
        while line and "serving" not in line:
            line = serve.stderr.readline()
        if not line:
            sys.exit("loader_next_profile: serve did not start")
        loader = coloader.Loader(name, device=args.device or None)
        it = iter(loader)
        times, prof = [], cProfile.Profile()
        for i in range(args.batches + 20):
            time.sleep(args.step_s)
            profiled = i >= 20 and i % 2 == 1  # every other call, so the timings stay unprofiled
            t0 = time.perf_counter()
            if profiled:
                prof.enable()
            batch = next(it, None)
            if profiled:
                prof.disable()
            if batch is None:  # the epoch's end: the next epoch, and this call is not counted
                it = iter(loader)
                continue
            dt = time.perf_counter() - t0
            if i >= 20 and not profiled:
                times.append(dt)
            del batch
        times.sort()
        print(f"next() with its batch already published ({args.device or 'host'} path, batch {args.batch_size}, "
              f"{args.image_size} px float32): p50 {statistics.median(times) * 1e6:.0f} µs, "
              f"p90 {times[int(0.9 * (len(times) - 1))] * 1e6:.0f} µs over {len(times)} calls")
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(25)
        print(out.getvalue())
        loader.close()
    finally:
        serve.terminate()
        serve.wait(10)


if __name__ == "__main__":
    main()
