#!/usr/bin/env python3
"""What a job's own batches cost: a coloader.Loader reading the default way (the batch is the job's
own: a private copy-on-write view on the host, a private device copy on the GPU) against
zero_copy=True (views of the producer's memory), side by side in one run, per batch.

For each path (host; the device path too where PyTorch sees a GPU) and each mode, one Loader reads
batches from a `coloader serve` producer whose ring is full before every measured batch (the
producer is far ahead, so what is timed is the hand-over and the job's first touch, not decoding):
  next      wall time of next() (host path: mapping the slot's view; device path: enqueueing the copy)
  touch     wall time of a read of every byte (images.sum() and a synchronisation): the first read
            of a fresh view takes the page faults
  write     images.mul_(2): the first write to each page of a view copies it (host; own mode only),
            beside images * 2, the out-of-place op a job would write otherwise (host, both modes)
  gpu copy  the GPU time of next()'s work on the device path (waiting for the slot, the copy),
            timed with the host kept out (the stream busy with a sleep while next() enqueues);
            for reference, the same bytes copied by torch between its own buffers, and copied out
            of the producer's memory (CUDA IPC) by the runtime's memcpy and by a kernel
Per run, the median and 90th percentile over its batches; per path and mode, the median of the
runs' medians and their range (--repeats runs, the modes alternating so that drift hits both).

    benchmarks/isolation_cost.py --data DIR [--batch-size 128] [--image-size 224] [--batches 24]
        [--out results.json]

The producer is `coloader serve` from the build tree or $COLOADER_BINARY; the Loader is the
package's, from this tree or an installed copy.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))


def binary():
    return os.environ.get("COLOADER_BINARY", os.path.join(ROOT, "build", "tools", "coloader"))


def start_producer(args, name, device, env):
    cmd = [binary(), "serve", "--data", args.data, "--name", name, "--batch-size", str(args.batch_size),
           "--image-size", str(args.image_size), "--output", "float32", "--window", str(args.window),
           "--spare-slots", "2", "--forever", "--quiet", "--seed", "1"]
    if device:
        cmd += ["--device", "cuda:0"]
    p = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True)
    for line in p.stderr:
        if "serving" in line:
            return p
    sys.exit("producer did not start: " + p.stderr.read())


def unread(name, env):
    out = subprocess.run([binary(), "status", "--name", name, "--json"], env=env, capture_output=True, text=True)
    consumers = json.loads(out.stdout)["consumers"] if out.returncode == 0 else []
    return consumers[0]["unread"] if consumers else 0


def percentile(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def wait_for_fill(name, env, window):
    """Until the producer is as far ahead as it goes (window - 1 batches unread, or no more for
    half a second), at most 20 s."""
    deadline, last, since = time.monotonic() + 20, -1, time.monotonic()
    while time.monotonic() < deadline:
        n = unread(name, env)
        if n >= window - 1:
            return
        if n != last:
            last, since = n, time.monotonic()
        elif n > 0 and time.monotonic() - since > 0.5:
            return
        time.sleep(0.05)


def gpu_time(torch, fn):
    """GPU time of the work `fn` enqueues on the current stream, with the host kept out: the
    stream is busy with a sleep while `fn` enqueues, so its work runs back to back."""
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(20_000_000)  # ~10 ms of GPU cycles: longer than any host call below
    begin.record()
    out = fn()
    end.record()
    end.synchronize()
    return begin.elapsed_time(end) / 1000.0, out


def measure(args, name, env, device, zero_copy, torch, coloader):
    loader = coloader.Loader(name, batch_size=args.batch_size, device="cuda" if device else None,
                             zero_copy=zero_copy, timeout=120)

    def forever():  # batches across epochs
        while True:
            yield from loader

    it = forever()
    rows = {"next": [], "touch": [], "write": [], "out_of_place": [], "gpu_copy": []}
    extra = {}
    measured = 0
    while measured < args.batches:
        # Let the producer fill the window: the next batches are then ready at once.
        wait_for_fill(name, env, args.window)
        for _ in range(args.window - 1):
            t0 = time.perf_counter()
            if device:
                gpu, (images, labels) = gpu_time(torch, lambda: next(it))
                rows["gpu_copy"].append(gpu)
            else:
                images, labels = next(it)
            t1 = time.perf_counter()
            float(images.sum())  # reads every byte (synchronises on the device path)
            t2 = time.perf_counter()
            if not device:
                rows["next"].append(t1 - t0)
            rows["touch"].append(t2 - t1)
            if not device:
                t3 = time.perf_counter()
                doubled = images * 2
                rows["out_of_place"].append(time.perf_counter() - t3)
                del doubled
                if not zero_copy:
                    t4 = time.perf_counter()
                    images.mul_(2)
                    rows["write"].append(time.perf_counter() - t4)
            measured += 1
            if device and zero_copy and "ipc_memcpy_ms" not in extra:
                # Copying out of the producer's memory (CUDA IPC) two ways: the runtime's
                # memcpy (what torch's copy_ does) and a kernel (an elementwise op).
                dst = torch.empty_like(images)
                extra["ipc_memcpy_ms"] = round(1000 * statistics.median(
                    gpu_time(torch, lambda: dst.copy_(images))[0] for _ in range(7)), 3)
                extra["ipc_kernel_copy_ms"] = round(1000 * statistics.median(
                    gpu_time(torch, lambda: torch.mul(images, 1, out=dst))[0] for _ in range(7)), 3)
                del dst
            del images, labels
    # Host times of next() on the device path, measured alone (no GPU sleep queued before it),
    # with the batches ready (a full ring).
    if device:
        wait_for_fill(name, env, args.window)
        for _ in range(args.window - 1):
            t0 = time.perf_counter()
            images, labels = next(it)
            rows["next"].append(time.perf_counter() - t0)
            torch.cuda.synchronize()
            del images, labels
    nbytes = args.batch_size * 3 * args.image_size ** 2 * 4
    if device:
        src = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda")
        dst = torch.empty_like(src)
        extra["torch_d2d_copy_ms"] = round(1000 * statistics.median(
            gpu_time(torch, lambda: dst.copy_(src))[0] for _ in range(7)), 3)
        del src, dst
    loader.close()
    out = {"path": "device" if device else "host", "mode": "zero_copy" if zero_copy else "own",
           "batch_mb": round(nbytes / 1e6, 1), "batches": measured}
    for key, values in rows.items():
        if values:
            out[key + "_ms_p50"] = round(1000 * statistics.median(values), 3)
            out[key + "_ms_p90"] = round(1000 * percentile(values, 0.9), 3)
    out.update(extra)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="an ImageFolder (scripts/make_dataset.py makes one)")
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--window", type=int, default=6)
    ap.add_argument("--batches", type=int, default=25, help="measured batches per path, mode and repeat")
    ap.add_argument("--repeats", type=int, default=3, help="runs of every path and mode, alternating")
    ap.add_argument("--out", help="write the rows as JSON here")
    args = ap.parse_args()
    import torch
    import coloader

    env = dict(os.environ)
    run_dir = tempfile.mkdtemp(prefix="isolation-cost-")
    env["COLOADER_RUN_DIR"] = os.environ["COLOADER_RUN_DIR"] = run_dir
    paths = [False] + ([True] if torch.cuda.is_available() else [])
    runs = []  # one row per (repeat, path, mode); modes alternate so drift hits both alike
    for rep in range(args.repeats):
        for device in paths:
            for zero_copy in (True, False):
                name = "isocost-%d-%s-%s" % (rep, "dev" if device else "host", "zc" if zero_copy else "own")
                producer = start_producer(args, name, device, env)
                try:
                    row = measure(args, name, env, device, zero_copy, torch, coloader)
                finally:
                    producer.terminate()
                    producer.wait()
                row["repeat"] = rep
                runs.append(row)
                print(json.dumps(row), flush=True)
    # Per path and mode: the median over repeats of each repeat's median, and their range.
    results = []
    for device in paths:
        for mode in ("zero_copy", "own"):
            mine = [r for r in runs if r["path"] == ("device" if device else "host") and r["mode"] == mode]
            row = {k: mine[0][k] for k in ("path", "mode", "batch_mb")}
            row["batches"] = sum(r["batches"] for r in mine)
            for key in mine[0]:
                if key.endswith("_p50") or key in ("torch_d2d_copy_ms", "ipc_memcpy_ms", "ipc_kernel_copy_ms"):
                    values = [r[key] for r in mine]
                    row[key] = round(statistics.median(values), 3)
                    row[key + "_range"] = [min(values), max(values)]
            results.append(row)
    print()
    print("%-7s %-9s %8s %12s %12s %12s %12s %12s %12s" % ("path", "mode", "MB", "next p50", "touch p50",
                                                             "x * 2 p50", "x.mul_ p50", "gpu copy", "torch d2d"))
    for r in results:
        print("%-7s %-9s %8.1f %12s %12s %12s %12s %12s %12s" % (
            r["path"], r["mode"], r["batch_mb"], "%.3f ms" % r["next_ms_p50"], "%.3f ms" % r["touch_ms_p50"],
            "%.3f ms" % r["out_of_place_ms_p50"] if "out_of_place_ms_p50" in r else "-",
            "%.3f ms" % r["write_ms_p50"] if "write_ms_p50" in r else "-",
            "%.3f ms" % r["gpu_copy_ms_p50"] if "gpu_copy_ms_p50" in r else "-",
            "%.3f ms" % r["torch_d2d_copy_ms"] if "torch_d2d_copy_ms" in r else "-"))
    for path in ("host", "device"):
        pair = {r["mode"]: r for r in results if r["path"] == path}
        if len(pair) == 2:
            zc, own = pair["zero_copy"], pair["own"]
            if path == "host":
                added = (own["next_ms_p50"] + own["touch_ms_p50"]) - (zc["next_ms_p50"] + zc["touch_ms_p50"])
                print("host path: the job's own batch costs %+.3f ms per batch over zero_copy (next + first read: "
                      "%.3f vs %.3f ms); a write in place %.3f ms, where an out-of-place op takes %.3f ms"
                      % (added, own["next_ms_p50"] + own["touch_ms_p50"], zc["next_ms_p50"] + zc["touch_ms_p50"],
                         own["write_ms_p50"], own["out_of_place_ms_p50"]))
            else:
                print("device path: the job's own batch costs %+.3f ms of GPU time per batch over zero_copy "
                      "(%.3f vs %.3f ms); %+.3f ms of host time in next(). For reference: %.3f ms to copy %.0f MB "
                      "between torch buffers; out of the producer's memory %.3f ms by memcpy, %.3f ms by a kernel"
                      % (own["gpu_copy_ms_p50"] - zc["gpu_copy_ms_p50"], own["gpu_copy_ms_p50"], zc["gpu_copy_ms_p50"],
                         own["next_ms_p50"] - zc["next_ms_p50"], zc.get("torch_d2d_copy_ms", 0), zc["batch_mb"],
                         zc.get("ipc_memcpy_ms", 0), zc.get("ipc_kernel_copy_ms", 0)))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "results": results, "runs": runs}, f, indent=1)


if __name__ == "__main__":
    main()
