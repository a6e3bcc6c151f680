#!/usr/bin/env python3
"""Hand-off cost of language-model batches, coloader against TensorSocket, side by side in one run.

Each setup is one producer process fed by the same iterable of token batches, (input_ids int64
[B, L], attention_mask bool [B, L], labels int64 [B, L]), and one consumer process at the same
batch size that takes batches with a short pause per step (so that the producer is always
ahead and what is timed is the hand-off, not the making), and times:

  next      next() alone, per batch (µs)
  ready     next() until the batch is usable by GPU work: a host batch copied to the GPU, a
            device batch's stream synchronised (µs)
  with --probe, also: idle sync, a synchronize() of the job's stream with nothing queued, just
            before next(); gil, the interpreter lock given up and taken back right after next()
            (time.sleep(0)), which waits while another thread of the job holds it (the Loader's
            batch ahead), taken out of ready (µs)

Setups: coloader-host (coloader.Producer, host ring; the job copies to the GPU), coloader-host-prefetch
(the same with Loader(prefetch=True): the next batch taken on the Loader's thread), coloader-device
(Producer(device="cuda:0"); the job gets CUDA tensors, its own copy; prefetch on, the default
there), coloader-device-inline (the same with prefetch=False: the batch taken inside next()),
tensorsocket (TensorSocket 0.0.5's TensorProducer and TensorConsumer: CUDA tensors through CUDA
IPC); and, when named with --setups, coloader-device-zero-copy (Loader(zero_copy=True): views of
the producer's memory, no copy of the job's own, as TensorSocket's). Without a GPU only the host
setups run.

    python benchmarks/token_handoff.py --out OUT      # every setup this machine can run; prints the table
    (token_handoff.py feed|job SETUP ... are the two processes it starts)
Needs coloader importable, and for tensorsocket the wheels of benchmarks/fetch_wheels.sh.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

SETUPS = ["coloader-host", "coloader-host-prefetch", "coloader-device", "coloader-device-inline",
          "coloader-device-zero-copy", "tensorsocket"]
PREFETCH = {"coloader-host-prefetch": True, "coloader-device-inline": False}  # else the Loader's default


def batches(n, batch, seq, seed=0):
    """`n` distinct token batches, as a tuple (the one structure TensorSocket carries)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        ids = torch.randint(0, 50257, (batch, seq), generator=g)
        mask = torch.rand(batch, seq, generator=g) < 0.9
        out.append((ids, mask, torch.where(mask, ids, torch.full_like(ids, -100))))
    return out


def feed(a):
    data = batches(a.distinct, a.batch_size, a.seq)
    if a.setup == "tensorsocket":
        from tensorsocket import TensorProducer

        p = a.port
        producer = TensorProducer(data, port=p, ack_port=p + 1, heart_ports=(p + 2, p + 3))
        deadline = time.monotonic() + 120
        while len(producer.hb.consumers) < 1:
            if time.monotonic() > deadline:
                sys.exit("token_handoff: no TensorSocket consumer came within 120 s")
            time.sleep(0.05)
        for _ in range(a.epochs):
            for _ in producer:
                pass
        producer.join()
    else:
        import coloader

        device = "cuda:0" if a.setup.startswith("coloader-device") else None
        coloader.Producer(data, name=a.name, batch_size=a.batch_size, device=device).run(epochs=a.epochs)


def job(a):
    import torch

    cuda = torch.cuda.is_available()
    if a.setup == "tensorsocket":
        from tensorsocket import TensorConsumer

        p = a.port
        loader = TensorConsumer(port=p, ack_port=p + 1, heart_ports=(p + 2, p + 3), batch_size=a.batch_size)
    else:
        import coloader

        loader = coloader.Loader(a.name, batch_size=a.batch_size, wait_for_producer=120, timeout=60,
                                 device="cuda" if a.setup.startswith("coloader-device") else None,
                                 prefetch=PREFETCH.get(a.setup), zero_copy=a.setup.endswith("zero-copy"))
    profile = None
    if a.profile and a.setup == "coloader-device-inline":
        import cProfile  # where next() goes when the batch is taken inside it (nothing on another thread)

        profile = cProfile.Profile()
    next_us, ready_us, idle_us, gil_us, nbytes, taken = [], [], [], [], 0, 0
    while taken < a.warmup + a.batches:
        it = iter(loader)
        while taken < a.warmup + a.batches:
            if a.probe and cuda:
                # What synchronising a stream with nothing on it costs in this process now.
                ti = time.perf_counter()
                torch.cuda.current_stream().synchronize()
                idle = time.perf_counter() - ti
            t0 = time.perf_counter()
            try:
                if profile is not None and taken >= a.warmup:
                    profile.enable()
                    try:
                        b = next(it)
                    finally:
                        profile.disable()
                else:
                    b = next(it)
            except StopIteration:
                break
            t1 = time.perf_counter()
            gil = 0.0
            if a.probe:
                # The interpreter lock given up and taken back at once, as synchronize() does:
                # how long this thread waits for it while another thread (the batch ahead) runs.
                time.sleep(0)
                gil = time.perf_counter() - t1
            tensors = list(b)[:3]
            if cuda:
                tensors = [t.to("cuda", non_blocking=False) for t in tensors]
                torch.cuda.current_stream().synchronize()
            t2 = time.perf_counter()
            if taken >= a.warmup:
                next_us.append((t1 - t0) * 1e6)
                ready_us.append((t2 - t0 - gil) * 1e6)
                if a.probe:
                    gil_us.append(gil * 1e6)
                    if cuda:
                        idle_us.append(idle * 1e6)
                nbytes = sum(t.numel() * t.element_size() for t in tensors)
                on = str(tensors[0].device)
            taken += 1
            del b, tensors
            time.sleep(a.step_ms / 1000)
    if profile is not None:
        import io
        import pstats

        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(18)
        print("\n".join("profile: " + line for line in text.getvalue().splitlines() if line.strip()), flush=True)
    q = lambda xs, f: statistics.quantiles(xs, n=10)[f] if len(xs) > 10 else max(xs)  # noqa: E731
    print(json.dumps({"setup": a.setup, "batches": len(next_us), "bytes": nbytes, "device": on,
                      "next_p50_us": statistics.median(next_us), "next_p90_us": q(next_us, 8),
                      "ready_p50_us": statistics.median(ready_us), "ready_p90_us": q(ready_us, 8),
                      **({"idle_sync_p50_us": statistics.median(idle_us)} if idle_us else {}),
                      **({"gil_p50_us": statistics.median(gil_us), "gil_p90_us": q(gil_us, 8)} if gil_us else {})}),
          flush=True)
    if a.setup == "tensorsocket":
        # TensorConsumer's threads never stop: at interpreter exit the process aborts
        # ("terminate called without an active exception"). The figures are out; leave now.
        sys.stderr.flush()
        os._exit(0)


def run(a):
    import torch

    setups = a.setups.split(",") if a.setups else [s for s in SETUPS if s != "coloader-device-zero-copy"]
    if not torch.cuda.is_available():
        setups = [s for s in setups if s.startswith("coloader-host")]
    os.makedirs(a.out, exist_ok=True)
    me = [sys.executable, os.path.abspath(__file__), "--batch-size", str(a.batch_size), "--seq", str(a.seq),
          "--distinct", str(a.distinct), "--batches", str(a.batches), "--warmup", str(a.warmup),
          "--step-ms", str(a.step_ms), "--epochs", "100000"] + (["--probe"] if a.probe else []) + \
        (["--profile"] if a.profile else [])
    rows = []
    for setup in setups:
        name, log = "handoff-%d-%s" % (os.getpid(), setup), open(os.path.join(a.out, setup + ".log"), "w")
        args = me + ["--name", name, "--port", str(a.port), "--setup", setup]
        producer = subprocess.Popen(args + ["feed"], stdout=log, stderr=log)
        try:
            out = subprocess.run(args + ["job"], capture_output=True, text=True, timeout=300)
        finally:
            producer.terminate()
            producer.wait(30)
        log.write(out.stderr)
        if out.returncode != 0:
            print("token_handoff: %s failed (%s): %s" % (setup, out.returncode, out.stderr[-800:]), flush=True)
            continue
        lines = out.stdout.strip().splitlines()
        for line in lines[:-1]:
            print(line, flush=True)  # --profile's table
        rows.append(json.loads(lines[-1]))
        print("token_handoff: %s" % json.dumps(rows[-1]), flush=True)
        a.port += 10  # TensorSocket's ports linger a moment after its process ends
    with open(os.path.join(a.out, "token_handoff.json"), "w") as f:
        json.dump({"batch_size": a.batch_size, "seq": a.seq, "step_ms": a.step_ms, "rows": rows}, f, indent=1)
    print("\n| setup | bytes per batch | batches on | next() p50 / p90 µs | ready on the GPU p50 / p90 µs |%s"
          % (" idle sync p50 µs | gil p50 / p90 µs |" if a.probe else ""))
    print("| --- | ---: | --- | ---: | ---: |%s" % (" ---: | ---: |" if a.probe else ""))
    for r in rows:
        probe = ""
        if a.probe:
            probe = " %s | %.0f / %.0f |" % ("%.0f" % r["idle_sync_p50_us"] if "idle_sync_p50_us" in r else "-",
                                           r["gil_p50_us"], r["gil_p90_us"])
        print("| %s | %s | %s | %.0f / %.0f | %.0f / %.0f |%s" % (r["setup"], format(r["bytes"], ","), r["device"],
              r["next_p50_us"], r["next_p90_us"], r["ready_p50_us"], r["ready_p90_us"], probe))
    return 0 if len(rows) == len(setups) else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("role", nargs="?", choices=["feed", "job"], help="without it: run every setup")
    ap.add_argument("--setup", choices=SETUPS)
    ap.add_argument("--setups", help="which setups to run, comma-separated (default: all but coloader-device-zero-copy)")
    ap.add_argument("--out", default="token_handoff")
    ap.add_argument("--name", default="handoff")
    ap.add_argument("--port", type=int, default=5710, help="tensorsocket: its four ports start here")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--distinct", type=int, default=32, help="distinct batches per epoch")
    ap.add_argument("--epochs", type=int, default=100000)
    ap.add_argument("--batches", type=int, default=300, help="batches timed")
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--step-ms", type=float, default=2.0, help="the job's pause per batch")
    ap.add_argument("--profile", action="store_true",
                    help="coloader-device-inline: cProfile over its timed next() calls, the table printed")
    ap.add_argument("--probe", action="store_true",
                    help="also time, per batch, a synchronize() of the idle stream before next() (idle sync) and "
                    "a give-and-take of the interpreter lock right after it (gil; taken out of ready)")
    a = ap.parse_args()
    if a.role == "feed":
        feed(a)
    elif a.role == "job":
        job(a)
    else:
        sys.exit(run(a))


if __name__ == "__main__":
    main()
