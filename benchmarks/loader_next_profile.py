#!/usr/bin/env python3
"""Where a training job's `next(loader)` goes when its batch is already there (issue 24: one
ResNet-18 job's step is ~0.25 ms longer under coloader than on synthetic data though it hardly
waits). One `coloader serve` runs ahead of one coloader.Loader; the loop sleeps between batches
as a training step would, so every next() finds its batch published. Prints next()'s p50/p90 in
µs, then cProfile's functions by own time over the profiled calls.

    benchmarks/loader_next_profile.py --data DIR [--device cuda] [--zero-copy] [--batches 300] [--binary B]

With --device cuda the Loader reads the GPU ring (device="cuda", each batch copied for the
job; --zero-copy views the producer's memory instead); without, the host path. Then the parts
of a device hand-off, each timed alone over 2,000 calls (--device cuda only): what torch's
stream and device calls, wrapping a pointer as a tensor, and allocating a batch cost.
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
    ap.add_argument("--zero-copy", action="store_true", help="Loader(zero_copy=True): no per-batch copy")
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
        loader = coloader.Loader(name, device=args.device or None, zero_copy=args.zero_copy)
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
        path = (args.device or "host") + (", zero-copy" if args.zero_copy else "")
        print(f"next() with its batch already published ({path} path, batch {args.batch_size}, "
              f"{args.image_size} px float32): p50 {statistics.median(times) * 1e6:.0f} µs, "
              f"p90 {times[int(0.9 * (len(times) - 1))] * 1e6:.0f} µs over {len(times)} calls")
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(25)
        print(out.getvalue())
        if args.device:
            batch = next(iter(loader))
            print_parts(batch[0])
            del batch
        loader.close()
    finally:
        serve.terminate()
        serve.wait(10)


def print_parts(images):
    """Each building block of a device hand-off timed alone (µs per call, median of 5 runs of
    2,000), on a batch's tensor as the Loader gave it."""
    import torch
    from coloader import _batches

    class Lease:  # stands in for the batch's lease: the wrapper only keeps a reference
        pass

    dev = images.device.index
    stream = torch.cuda.current_stream(dev)
    contiguous = images.permute(0, 2, 3, 1) if not images.is_contiguous() else images
    shape, ptr = tuple(contiguous.shape), contiguous.data_ptr()
    typestr = {torch.float32: "<f4", torch.uint8: "|u1", torch.bfloat16: "<i2", torch.float16: "<f2"}[images.dtype]
    parts = [
        ("torch.cuda.current_device()", lambda: torch.cuda.current_device()),
        ("torch.cuda.current_stream(dev)", lambda: torch.cuda.current_stream(dev)),
        ("torch.cuda.set_device(dev)", lambda: torch.cuda.set_device(dev)),
        ("torch._C._cuda_getCurrentRawStream(dev)", lambda: torch._C._cuda_getCurrentRawStream(dev)),
        ("as_tensor(__cuda_array_interface__) (images)",
         lambda: _batches.cuda_tensor(torch, Lease(), ptr, typestr, shape, dev, stream.cuda_stream)),
        ("as_tensor(__cuda_array_interface__) (labels)",
         lambda: _batches.cuda_tensor(torch, Lease(), ptr, "<i8", (shape[0],), dev, stream.cuda_stream)),
        ("torch.empty(batch) on the device", lambda: torch.empty(shape, dtype=images.dtype, device=images.device)),
        ("torch.empty(labels) on the device", lambda: torch.empty((shape[0],), dtype=torch.int64, device=images.device)),
        ("tensor.permute (the NCHW view)", lambda: contiguous.permute(0, 3, 1, 2)),
    ]
    print("parts of a device hand-off, µs per call (median of 5 x 2,000):")
    for label, fn in parts:
        runs = []
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(2000):
                fn()
            runs.append((time.perf_counter() - t0) / 2000)
        print(f"  {label:48s} {statistics.median(runs) * 1e6:8.1f}")
    torch.cuda.synchronize(dev)


if __name__ == "__main__":
    main()
