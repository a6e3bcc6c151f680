#!/usr/bin/env python3
"""Ground truth for the estimator's SM-activity model: training step times alone, and the
aggregate of several copies under MPS.

docs/results/memory_ground_truth.csv has a `step_s` column, but it is no step time alone: it is
the mean of a process's first three steps (the first loads kernels and picks cuDNN algorithms)
while a dozen other processes time-share the GPU (ResNet-18 b128 bf16-amp: 248 ms there, about
11 ms in steady state). This measures what the activity model is about:

  alone   each configuration of memory_ground_truth.py's list (and ResNet-18/50 b128 bf16-amp
          channels_last, the collocation benchmark's jobs) in one process, one after another on
          an otherwise idle GPU: cudnn.benchmark on, warm-up steps, then steps timed to at least
          --min-s seconds (a synchronize at each end). Writes --out (step_time_alone.csv).
  mps     for a few configurations (--mps), the same step in 1 and then --copies processes under
          an MPS daemon this script starts with its own pipe directory: each copy warms up, waits
          for a common start time, and counts the steps it completes in a common window.
          activity = images/s alone over the copies' aggregate images/s, as docs/PLACEMENT.md
          defines sm_activity. Writes --mps-out (sm_activity_mps.csv).

    python3 benchmarks/step_time_ground_truth.py --out $OUT/step_time_alone.csv \\
        --mps-out $OUT/sm_activity_mps.csv
"""

import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "python"))
sys.path.insert(0, str(HERE))

FIELDS = ["model", "batch_size", "precision", "optimizer", "channels_last", "image_size", "seq_len", "status",
          "step_s", "steps", "torch", "gpu", "error"]
MPS_FIELDS = ["model", "batch_size", "precision", "optimizer", "channels_last", "copies", "alone_step_s",
              "alone_img_s", "aggregate_img_s", "activity", "per_copy_step_s", "torch", "gpu"]
# The collocation benchmark's jobs (docs/BENCHMARKS.md "Results: GPU decode": activity 0.83 and
# 0.86-0.87 measured there) and a spread of shapes the replay's guesses got wrong.
MPS_DEFAULT = [
    "torchvision:resnet18,128,bf16-amp,sgd,1",
    "torchvision:resnet50,128,bf16-amp,sgd,1",
    "torchvision:resnet18,32,bf16-amp,adamw,0",
    "torchvision:mobilenet_v3_large,64,bf16-amp,adamw,0",
    "torchvision:vit_b_16,32,bf16-amp,adamw,0",
    "torchvision:efficientnet_b0,64,bf16-amp,adamw,0",
    "lm:gpt2-small,8,bf16-amp,adamw,0",
]


def alone_configs():
    import memory_ground_truth as mgt

    out = [dict(model=m, batch_size=128, precision="bf16-amp", optimizer="sgd", channels_last=cl)
           for m in ("torchvision:resnet18", "torchvision:resnet50") for cl in (True, False)]
    return out + [dict(c, channels_last=False) for c in mgt.configs(mgt.MODELS)]


def parse_cfg(text):
    model, b, p, o, cl = text.split(",")
    return dict(model=model, batch_size=int(b), precision=p, optimizer=o, channels_last=cl == "1")


def make_step(cfg):
    """Builds the model on the GPU and returns a function that runs one training step."""
    import torch

    import memory_ground_truth as mgt
    from coloader.estimator import zoo

    torch.backends.cudnn.benchmark = True
    model, spec = zoo.build(cfg["model"], device="cuda", image_size=cfg.get("image_size"),
                            seq_len=cfg.get("seq_len") or 512)
    if cfg["channels_last"]:
        model = model.to(memory_format=torch.channels_last)
    model.train()
    opt = zoo.make_optimizer(cfg["optimizer"], model.parameters())
    inputs, targets = spec.batch(cfg["batch_size"], "cuda", cfg["channels_last"])
    return mgt.make_train_step(model, spec, opt, inputs, targets, cfg["precision"], "cuda")


def time_steps(step, warmup, min_s):
    """Mean seconds per step in steady state, and the steps timed."""
    import torch

    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    n, t0 = 0, time.perf_counter()
    while True:
        for _ in range(5):
            step()
        n += 5
        torch.cuda.synchronize()
        if time.perf_counter() - t0 >= min_s:
            return (time.perf_counter() - t0) / n, n


def run_alone(args):
    import torch

    cfgs = alone_configs()
    if args.limit:
        cfgs = cfgs[:args.limit]
    with open(args.out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        for cfg in cfgs:
            row = dict(cfg, status="ok", torch=torch.__version__, gpu=torch.cuda.get_device_name(0), error="")
            step = None
            try:
                step = make_step(cfg)
                row["step_s"], row["steps"] = time_steps(step, args.warmup, args.min_s)
            except Exception as e:  # one configuration's failure is a row, not the end of the run
                row.update(status="error", error=f"{type(e).__name__}: {e}"[:300])
            del step
            torch.cuda.empty_cache()
            w.writerow(row)
            f.flush()
            print(f"{cfg['model']} b{cfg['batch_size']} {cfg['precision']} {cfg['optimizer']}"
                  f"{' cl' if cfg['channels_last'] else ''}: {row.get('step_s', row['error'])}", flush=True)


def copy_worker(args):
    """One copy under MPS: warm up, wait for the common start, count steps in the window."""
    import torch

    cfg = parse_cfg(args.copy)
    step = make_step(cfg)
    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    while time.time() < args.start_at:
        time.sleep(0.01)
    n, t0 = 0, time.time()
    while time.time() - t0 < args.window_s:
        step()
        n += 1
        if n % 4 == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    print(json.dumps({"steps": n, "seconds": time.time() - t0}), flush=True)


def run_copies(cfg_text, copies, args, env):
    start_at = time.time() + args.settle_s
    procs = [subprocess.Popen([sys.executable, __file__, "--copy", cfg_text, "--start-at", str(start_at),
                               "--window-s", str(args.window_s), "--warmup", str(args.warmup)],
                              stdout=subprocess.PIPE, env=env, text=True) for _ in range(copies)]
    res = [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in procs]
    return [r["seconds"] / r["steps"] for r in res]


def run_mps(args):
    import torch

    mps = tempfile.mkdtemp(prefix="coloader-mps-")
    env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=f"{mps}/pipe", CUDA_MPS_LOG_DIRECTORY=f"{mps}/log")
    os.makedirs(env["CUDA_MPS_PIPE_DIRECTORY"])
    os.makedirs(env["CUDA_MPS_LOG_DIRECTORY"])
    subprocess.run(["nvidia-cuda-mps-control", "-d"], env=env, check=True)
    try:
        with open(args.mps_out, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=MPS_FIELDS)
            w.writeheader()
            for text in args.mps:
                cfg = parse_cfg(text)
                alone = run_copies(text, 1, args, env)[0]
                many = run_copies(text, args.copies, args, env)
                agg = sum(cfg["batch_size"] / s for s in many)
                w.writerow(dict(cfg, copies=args.copies, alone_step_s=alone, alone_img_s=cfg["batch_size"] / alone,
                                aggregate_img_s=agg, activity=cfg["batch_size"] / alone / agg,
                                per_copy_step_s=" ".join(f"{s:.5f}" for s in many), torch=torch.__version__,
                                gpu=torch.cuda.get_device_name(0)))
                f.flush()
                print(f"mps {text}: alone {cfg['batch_size'] / alone:.0f} img/s, {args.copies} copies {agg:.0f} img/s,"
                      f" activity {cfg['batch_size'] / alone / agg:.3f}", flush=True)
    finally:
        subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", env=env, text=True)
        shutil.rmtree(mps, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None, help="CSV of step times alone (the alone part runs when given)")
    ap.add_argument("--mps-out", default=None, help="CSV of activities under MPS (the mps part runs when given)")
    ap.add_argument("--mps", nargs="*", default=MPS_DEFAULT, help="model,batch,precision,optimizer,channels_last(0/1)")
    ap.add_argument("--copies", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--min-s", type=float, default=0.4, help="alone: time steps for at least this long")
    ap.add_argument("--window-s", type=float, default=6.0, help="mps: the common measuring window")
    ap.add_argument("--settle-s", type=float, default=20.0, help="mps: time for the copies to build and warm up")
    ap.add_argument("--limit", type=int, default=0, help="alone: only the first N configurations")
    ap.add_argument("--copy", help=argparse.SUPPRESS)
    ap.add_argument("--start-at", type=float, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.copy:
        return copy_worker(args)
    if args.mps_out:
        run_mps(args)
    if args.out:
        run_alone(args)


if __name__ == "__main__":
    main()
