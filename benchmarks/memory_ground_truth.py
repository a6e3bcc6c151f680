#!/usr/bin/env python3
"""Ground truth for the memory estimator: the real peak GPU memory of training steps.

Each configuration (model, batch size, precision, optimizer) is measured in a fresh process, so
the CUDA context it reports is honest: the process builds the model on the GPU, runs three
training steps (zero_grad(set_to_none=True), forward, loss, backward, optimizer step; the
second and later steps hold the optimizer state while activations live, so they set the peak)
and reports:
  max_allocated_mib   torch.cuda.max_memory_allocated (live tensors, 512-byte blocks)
  max_reserved_mib    torch.cuda.max_memory_reserved (the caching allocator's segments)
  nvml_process_mib    NVML's used memory of this process (what nvidia-smi shows), read after
                      the steps: the allocator never gives segments back unless asked, so this
                      is the process's figure at its peak
  context_mib         nvml_process_mib - reserved: CUDA context, loaded kernels, library handles
  bare_context_mib    NVML's figure right after CUDA initialised, before any kernel ran
Several workers run at once (each alone on the GPU would take 20 minutes for 150 configs);
they share the GPU's memory, so the pool admits a configuration only while a rough bound of
everything admitted fits. A configuration that runs out of memory anyway is retried alone.

    python3 benchmarks/memory_ground_truth.py --out docs/results/memory_ground_truth.csv [--jobs 12]
    python3 benchmarks/memory_ground_truth.py --quick --device cpu   # the plumbing, no GPU
"""

import argparse
import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "python"))

# (model, batch sizes, parameters in millions for the admission bound). Batch sizes keep every
# configuration under ~14 GiB so a dozen fit on one H200 together.
MODELS = [
    ("torchvision:resnet18", (32, 64, 128)),
    ("torchvision:resnet50", (16, 32, 64)),
    ("torchvision:resnet101", (16, 32, 64)),
    ("torchvision:resnext50_32x4d", (16, 32, 64)),
    ("torchvision:wide_resnet50_2", (16, 32, 64)),
    ("torchvision:vgg11", (16, 32, 64)),
    ("torchvision:vgg16", (16, 32, 64)),
    ("torchvision:alexnet", (64, 128, 256)),
    ("torchvision:squeezenet1_1", (32, 64, 128)),
    ("torchvision:mobilenet_v2", (32, 64, 128)),
    ("torchvision:mobilenet_v3_large", (32, 64, 128)),
    ("torchvision:shufflenet_v2_x1_0", (32, 64, 128)),
    ("torchvision:efficientnet_b0", (16, 32, 64)),
    ("torchvision:efficientnet_b3", (16, 32, 64)),
    ("torchvision:densenet121", (16, 32, 64)),
    ("torchvision:regnet_y_1_6gf", (16, 32, 64)),
    ("torchvision:vit_b_16", (16, 32, 64)),
    ("torchvision:swin_t", (16, 32, 64)),
    ("torchvision:convnext_tiny", (16, 32, 64)),
    ("torchvision:convnext_small", (16, 32, 64)),
    ("lm:gpt2-small", (4, 8, 16)),
    ("lm:gpt2-medium", (2, 4, 8)),
]
QUICK = [("torchvision:resnet18", (2, 4)), ("lm:gpt2-small", (1,))]

FIELDS = ["model", "batch_size", "precision", "optimizer", "channels_last", "image_size", "seq_len",
          "status", "params_m", "max_allocated_mib", "max_reserved_mib", "nvml_process_mib",
          "context_mib", "bare_context_mib", "device_used_delta_mib", "step_s", "est_here_allocated_mib",
          "est_here_reserved_mib", "torch", "gpu", "error"]


def configs(models):
    """Every model at each batch size in fp32 and bf16-amp with AdamW, and at its middle batch
    size with SGD in fp32; interleaved so a run cut short still covers every model and both
    optimizers (the first run put SGD last, and its time budget ended before SGD's turn)."""
    out = []
    for model, sizes in models:
        mid = sizes[len(sizes) // 2]
        per = [(b, p, "adamw") for b in sizes for p in ("fp32", "bf16-amp")]
        per.insert(1, (mid, "fp32", "sgd"))
        out.append([dict(model=model, batch_size=b, precision=p, optimizer=o) for b, p, o in per])
    order = []
    for i in range(max(len(c) for c in out)):
        order += [c[i] for c in out if i < len(c)]
    return order


def _nvml():
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml, pynvml.nvmlDeviceGetHandleByIndex(0)
    except Exception:
        return None, None


def _nvml_process_mib(nv, handle):
    """This process's used GPU memory as NVML (nvidia-smi) reports it, or None where the
    runtime hides processes (some containers do)."""
    if nv is None:
        return None
    try:
        for p in nv.nvmlDeviceGetComputeRunningProcesses(handle):
            if p.pid == os.getpid() and p.usedGpuMemory is not None:
                return p.usedGpuMemory / 2**20
    except Exception:
        pass
    return None


def _nvml_device_used_mib(nv, handle):
    return nv.nvmlDeviceGetMemoryInfo(handle).used / 2**20 if nv is not None else None


def make_train_step(model, spec, opt, inputs, targets, precision, device):
    """One training step on the batch (inputs, targets), as a function of no arguments:
    zero_grad(set_to_none=True), forward and loss (under autocast for bf16-amp and fp16-amp),
    backward (through a GradScaler for fp16-amp) and the optimizer step. The loss is freed when
    the step returns. step_time_ground_truth.py times this same step."""
    import torch

    amp = {"fp32": None, "bf16-amp": torch.bfloat16, "fp16-amp": torch.float16}[precision]
    scaler = torch.cuda.amp.GradScaler() if amp == torch.float16 else None

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type=device, dtype=amp or torch.bfloat16, enabled=amp is not None):
            loss = spec.loss(model(inputs), targets)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()

    return step


def worker(cfg, device):
    """Measures one configuration in this process; returns a result row."""
    import torch

    from coloader.estimator import zoo

    row = dict(cfg, status="ok", torch=torch.__version__, error="")
    nv, handle = _nvml()
    used_before = _nvml_device_used_mib(nv, handle)
    cuda = device == "cuda"
    if cuda:
        torch.cuda.init()
        torch.zeros(1, device="cuda")
        torch.cuda.synchronize()
        row["bare_context_mib"] = _nvml_process_mib(nv, handle)
        row["gpu"] = torch.cuda.get_device_name(0)
    model, spec = zoo.build(cfg["model"], device=device, image_size=cfg.get("image_size", 224),
                            seq_len=cfg.get("seq_len", 512))
    row["params_m"] = sum(p.numel() for p in model.parameters()) / 1e6
    if cfg.get("channels_last"):
        model = model.to(memory_format=torch.channels_last)
    model.train()
    opt = zoo.make_optimizer(cfg["optimizer"], model.parameters())
    inputs, targets = spec.batch(cfg["batch_size"], device, cfg.get("channels_last", False))
    step = make_train_step(model, spec, opt, inputs, targets, cfg["precision"], device)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(3):
        step()
    if cuda:
        torch.cuda.synchronize()
    row["step_s"] = (time.perf_counter() - t0) / 3
    if cuda:
        row["max_allocated_mib"] = torch.cuda.max_memory_allocated() / 2**20
        row["max_reserved_mib"] = torch.cuda.max_memory_reserved() / 2**20
        proc = _nvml_process_mib(nv, handle)
        row["nvml_process_mib"] = proc
        if proc is not None:
            row["context_mib"] = proc - torch.cuda.memory_reserved() / 2**20
        used_after = _nvml_device_used_mib(nv, handle)
        if used_before is not None:
            # Only meaningful when this worker ran alone on the GPU (the first one does).
            row["device_used_delta_mib"] = used_after - used_before
    if cfg.get("with_estimate"):
        # The estimator under this machine's torch, traced on the meta device after the
        # measurement is done (it allocates nothing on the GPU).
        try:
            from coloader.estimator import estimate

            del model, opt, inputs, targets, step
            e = estimate(cfg["model"], cfg["batch_size"], cfg["optimizer"], cfg["precision"],
                         cfg.get("channels_last", False), cfg.get("image_size", 224), cfg.get("seq_len", 512))
            row["est_here_allocated_mib"] = e.raw["allocated_peak_mib"]
            row["est_here_reserved_mib"] = e.raw["reserved_peak_mib"]
        except Exception as err:
            row["error"] = f"estimate: {type(err).__name__}: {err}"[:300]
    return row


def _bound_mib(cfg):
    """A deliberately loose upper bound on a configuration's GPU memory, for admission only."""
    per_sample = {"lm:gpt2-small": 1200, "lm:gpt2-medium": 3000}.get(cfg["model"], 190)
    if "vgg" in cfg["model"] or "densenet" in cfg["model"] or "wide" in cfg["model"]:
        per_sample = 260
    return 3000 + per_sample * cfg["batch_size"]


def run_pool(cfgs, jobs, device, budget_mib, deadline, log, script=__file__, extra_args=()):
    """Runs `script --worker CFG --device DEVICE [extra_args]` for each configuration, several
    at once while their bounds fit `budget_mib`; returns the rows the workers printed (their
    last stdout line, JSON). allocation_replay.py drives its own workers through this too."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    pending = list(cfgs)
    running = {}  # Popen -> (cfg, bound)
    rows = []
    retry_alone = []
    first = None  # the first worker runs alone: its device-level delta checks NVML's process figure
    while pending or running:
        used = sum(b for _, b in running.values())
        while pending and len(running) < jobs and time.time() < deadline and first not in running:
            cfg = pending[0]
            b = _bound_mib(cfg)
            if running and used + b > budget_mib:
                break
            pending.pop(0)
            p = subprocess.Popen([sys.executable, script, "--worker", json.dumps(cfg), "--device", device, *extra_args],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
            running[p] = (cfg, b)
            used += b
            if first is None:
                first = p
                break
        if not running and pending:  # past the deadline: record what was not measured
            rows += [dict(c, status="skipped", error="run's time budget spent") for c in pending]
            break
        time.sleep(0.05)
        for p in [p for p in running if p.poll() is not None]:
            cfg, _ = running.pop(p)
            out, err = p.communicate()
            log.write(f"== {json.dumps(cfg)} rc={p.returncode}\n{err[-3000:]}\n")
            if p.returncode == 0:
                rows.append(json.loads(out.strip().splitlines()[-1]))
            elif "out of memory" in err.lower() and not cfg.get("alone"):
                retry_alone.append(dict(cfg, alone=True))
            else:
                rows.append(dict(cfg, status="error", error=(err.strip().splitlines() or ["?"])[-1][:300]))
            print(f"[{len(rows)}/{len(cfgs)}] {cfg['model']} b{cfg['batch_size']} {cfg['precision']} "
                  f"{cfg['optimizer']} rc={p.returncode}", flush=True)
        if not pending and not running and retry_alone:
            pending, retry_alone, jobs = retry_alone, [], 1
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="docs/results/memory_ground_truth.csv")
    ap.add_argument("--log", default=None, help="worker stderr log (default: OUT with .log)")
    ap.add_argument("--jobs", type=int, default=12, help="measurement processes at once")
    ap.add_argument("--budget-mib", type=float, default=120 * 1024, help="admission bound on GPU memory")
    ap.add_argument("--time-budget", type=float, default=400, help="seconds after which no new config starts")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true", help="two small models (a plumbing check)")
    ap.add_argument("--with-estimate", action="store_true",
                    help="also run coloader.estimator in each worker (after measuring) under this torch")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker), args.device)))
        return
    cfgs = configs(QUICK if args.quick else MODELS)
    for c in cfgs:
        c["with_estimate"] = args.with_estimate
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    with open(args.log or out.with_suffix(".log"), "w") as log:
        rows = run_pool(cfgs, args.jobs, args.device, args.budget_mib, t0 + args.time_budget, log)
    rows.sort(key=lambda r: (r["model"], r["precision"], r["optimizer"], r["batch_size"]))
    with open(out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow(r)
    ok = sum(r["status"] == "ok" for r in rows)
    print(f"{ok}/{len(cfgs)} configurations measured in {time.time() - t0:.0f} s -> {out}")


if __name__ == "__main__":
    main()
