#!/usr/bin/env python3
"""Where the memory estimator's error lives: the allocator model, or the allocation sequence.

The estimator (python/coloader/estimator/) replays a meta-device trace of a training step
through a model of PyTorch's caching allocator (memtrace.AllocatorModel). Against
memory_ground_truth.csv its CUDA context is exact to a few MiB and almost all of its error is
in reserved memory (docs/ESTIMATOR.md). This run records, for each configuration of
memory_ground_truth.py's list, in a fresh process on the GPU, the real allocator's own history
of three training steps (torch.cuda.memory._record_memory_history) and which operator made each
allocation, and tells the two possible causes apart:

  real_allocated_mib   torch.cuda.max_memory_allocated over the three steps
  real_reserved_mib    torch.cuda.max_memory_reserved (as the ground truth)
  model_allocated_mib  the real allocation sequence replayed through AllocatorModel: its peak
                       of live blocks (a check: equals real_allocated_mib)
  model_reserved_mib   ... and its peak of reserved bytes. Equal to real_reserved_mib where the
                       allocator model is right; the estimator's remaining error is then in its
                       sequence (what the meta trace does not see: cuDNN and cuBLAS workspaces,
                       the order of frees)
  allocs, segments     allocations and cudaMalloc'd segments of the three steps (real)
  model_segments       segments the model made for the same sequence
  workspace_peak_mib   the largest block allocated and freed inside one convolution operator
                       (a cuDNN workspace)
  attributed           whether every allocation could be tied to the operator that made it

With --trace-dir each configuration's history is kept as NAME.npz (events: action, address,
size; operators: name and the allocator's counters as each began and ended; arguments of the
convolutions and products), packed into at most --max-tars tar files of < 15 MiB, so that the
sequences can be studied where there is no GPU.

    python3 benchmarks/allocation_replay.py --out $OUT/allocation_replay.csv --trace-dir $OUT/traces
    python3 benchmarks/allocation_replay.py --quick --models torchvision:resnet18 --device cpu --out /tmp/a.csv  # plumbing
"""
import argparse
import csv
import json
import os
import sys
import tarfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "python"))
sys.path.insert(0, str(HERE))

import memory_ground_truth as mgt  # noqa: E402

FIELDS = ["model", "batch_size", "precision", "optimizer", "status", "real_allocated_mib", "real_reserved_mib",
          "model_allocated_mib", "model_reserved_mib", "allocs", "segments", "model_segments", "workspace_peak_mib",
          "ops", "attributed", "seconds", "torch", "gpu", "error"]
MiB = 2**20
ACTIONS = ("alloc", "free_requested", "free_completed", "segment_alloc", "segment_free")
# Operators whose arguments are kept: cuDNN's convolutions and cuBLAS's products, the two
# libraries whose workspaces the meta trace cannot see; and the operators whose CUDA kernels
# were seen making temporaries of their own (reductions' scratch buffers, roll, dropout's mask,
# softmax's and layer norm's backward: docs/ESTIMATOR.md, "Where the estimate misses").
KEEP_ARGS = ("conv", "mm", "matmul", "linear", "attention", "sum", "roll", "dropout", "softmax", "layer_norm",
             "index_put")


def replay(actions, addrs, sizes):
    """The recorded history (allocation and completed free of each block, by address) through
    the estimator's allocator model: (peak allocated, peak reserved, segments)."""
    from coloader.estimator.memtrace import AllocatorModel

    model = AllocatorModel()
    alloc, free = ACTIONS.index("alloc"), ACTIONS.index("free_completed")
    for a, addr, size in zip(actions, addrs, sizes):
        if a == alloc:
            model.malloc(addr, size)
        elif a == free and addr in model.blocks:
            model.free(addr)
    return model.peak_allocated, model.peak_reserved, model.segments


class Counters:
    """The caching allocator's running totals: allocations, frees and segments so far. An
    operator that began at (a0, f0, s0) and ended at (a1, f1, s1) made the history's
    allocations a0-base .. a1-base (and so on), which ties each recorded event to an operator."""

    def __init__(self, device):
        import torch

        self.cuda = device == "cuda"
        self._read = None
        if self.cuda:
            nested = getattr(torch._C, "_cuda_memoryStats", None)
            try:  # the nested form is one C call; the flat one (public) is the fallback
                s = nested(0)
                s["allocation"]["all"]["allocated"], s["allocation"]["all"]["freed"], s["segment"]["all"]["allocated"]
                self._read = lambda: self._nested(nested(0))
            except Exception:
                self._read = lambda: self._flat(torch.cuda.memory_stats())

    @staticmethod
    def _nested(s):
        return (s["allocation"]["all"]["allocated"], s["allocation"]["all"]["freed"], s["segment"]["all"]["allocated"])

    @staticmethod
    def _flat(s):
        return (s["allocation.all.allocated"], s["allocation.all.freed"], s["segment.all.allocated"])

    def __call__(self):
        return self._read() if self.cuda else (0, 0, 0)


def _describe(x):
    import torch

    if isinstance(x, torch.Tensor):
        fmt = "cl" if x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous() else ""
        return f"T{tuple(x.shape)}{str(x.dtype).replace('torch.', ':')}{fmt}"
    if isinstance(x, (list, tuple)):
        return [_describe(v) for v in x]
    return x if isinstance(x, (int, float, bool, str, type(None))) else str(x)


def op_log(counters):
    """A TorchDispatchMode that notes every operator with the allocator's counters as it began
    and ended, and the arguments of convolutions and products. It keeps no tensor."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class OpLog(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names, self.index, self.rows, self.args = [], {}, [], {}

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = str(func)
            before = counters()
            out = func(*args, **(kwargs or {}))
            after = counters()
            i = self.index.get(name)
            if i is None:
                i = self.index[name] = len(self.names)
                self.names.append(name)
            if any(k in name for k in KEEP_ARGS):
                self.args[len(self.rows)] = _describe(list(args))
            self.rows.append((i, *before, *after))
            return out

    return OpLog()


def worker(cfg, device, trace_dir):
    import numpy as np
    import torch

    from coloader.estimator import zoo

    t0 = time.time()
    cuda = device == "cuda"
    if cuda:
        torch.cuda.init()
        torch.zeros(1, device="cuda")
        torch.cuda.synchronize()
        torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python",
                                                 max_entries=8_000_000)
    counters = Counters(device)
    base = counters()
    model, spec = zoo.build(cfg["model"], device=device, image_size=224, seq_len=512)
    model.train()
    opt = zoo.make_optimizer(cfg["optimizer"], model.parameters())
    inputs, targets = spec.batch(cfg["batch_size"], device, False)
    step = mgt.make_train_step(model, spec, opt, inputs, targets, cfg["precision"], device)
    marks = [counters()]  # after building; then after each step
    log = op_log(counters)
    with log:
        for _ in range(3):
            step()
            marks.append(counters())
    row = dict(cfg, status="ok", torch=torch.__version__, ops=len(log.rows), error="")
    actions = addrs = sizes = np.zeros(0, dtype=np.int64)
    if cuda:
        torch.cuda.synchronize()
        row.update(real_allocated_mib=torch.cuda.max_memory_allocated() / MiB,
                   real_reserved_mib=torch.cuda.max_memory_reserved() / MiB, gpu=torch.cuda.get_device_name(0))
        snap = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        events = [ev for ev in snap["device_traces"][0] if ev["action"] in ACTIONS]
        actions = np.array([ACTIONS.index(ev["action"]) for ev in events], dtype=np.uint8)
        addrs = np.array([ev["addr"] for ev in events], dtype=np.uint64)
        sizes = np.array([ev["size"] for ev in events], dtype=np.int64)
    n_alloc = int((actions == 0).sum())
    row.update(allocs=n_alloc, segments=int((actions == 3).sum()), attributed=n_alloc == marks[-1][0] - base[0])
    if trace_dir:  # the raw history first: the summaries below are checks of it
        ops = np.array(log.rows, dtype=np.int64).reshape(-1, 7)
        meta = dict(cfg, base=base, marks=marks, names=log.names, args={str(k): v for k, v in log.args.items()},
                    summary=dict(row))
        np.savez_compressed(Path(trace_dir) / f"{_slug(cfg)}.npz", actions=actions, addrs=addrs, sizes=sizes,
                            ops=ops, meta=np.array(json.dumps(meta)))
    try:
        m_alloc, m_res, m_segs = replay(actions.tolist(), addrs.tolist(), sizes.tolist())
        row.update(model_allocated_mib=m_alloc / MiB, model_reserved_mib=m_res / MiB, model_segments=m_segs)
        if row["attributed"]:
            row["workspace_peak_mib"] = conv_workspace_peak(log.names, log.rows, actions, addrs, sizes, base) / MiB
    except Exception as err:  # a summary's fault must not lose the history
        row["error"] = f"summary: {type(err).__name__}: {err}"[:300]
    row["seconds"] = round(time.time() - t0, 1)
    return row


def conv_workspace_peak(names, rows, actions, addrs, sizes, base):
    """The largest block a convolution operator allocated and freed before it returned (a
    cuDNN workspace). The allocator's counters as an operator began and ended bound its
    allocations and frees among the history's, in order from `base`."""
    alloc_addr, alloc_size = addrs[actions == 0], sizes[actions == 0]
    freed_addr = addrs[actions == 1]
    peak = 0
    for i, a0, f0, _, a1, f1, _ in rows:
        if "convolution" not in names[i] or a1 - a0 < 2:
            continue
        freed = set(freed_addr[f0 - base[1]:f1 - base[1]].tolist())
        for addr, size in zip(alloc_addr[a0 - base[0]:a1 - base[0]].tolist(), alloc_size[a0 - base[0]:a1 - base[0]].tolist()):
            if addr in freed:
                peak = max(peak, size)
    return peak


def _slug(cfg):
    return f"{cfg['model'].replace(':', '_')}_b{cfg['batch_size']}_{cfg['precision']}_{cfg['optimizer']}"


def pack(trace_dir, dest, max_tars, limit=15 * MiB):
    """The .npz files of trace_dir into dest/allocation_traces_K.tar, each under `limit`, at
    most max_tars of them (the device returns few, bounded files); what does not fit is named."""
    files = sorted(Path(trace_dir).glob("*.npz"))
    tars, left_out, cur, cur_size = [], [], None, 0
    for f in files:
        size = f.stat().st_size + 1024
        if cur is None or cur_size + size > limit:
            if cur is not None:
                cur.close()
            if len(tars) == max_tars:
                left_out += [g.name for g in files[files.index(f):]]
                cur = None
                break
            tars.append(Path(dest) / f"allocation_traces_{len(tars) + 1}.tar")
            cur, cur_size = tarfile.open(tars[-1], "w"), 0
        cur.add(f, arcname=f.name)
        cur_size += size
    if cur is not None:
        cur.close()
    return tars, left_out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="allocation_replay.csv")
    ap.add_argument("--trace-dir", default="", help="keep each configuration's history here (.npz)")
    ap.add_argument("--max-tars", type=int, default=5, help="pack the histories into at most N tar files beside --out")
    ap.add_argument("--jobs", type=int, default=12, help="measurement processes at once")
    ap.add_argument("--budget-mib", type=float, default=120 * 1024, help="admission bound on GPU memory")
    ap.add_argument("--time-budget", type=float, default=300, help="seconds after which no new configuration starts")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true", help="two small models (a plumbing check)")
    ap.add_argument("--models", default="", help="only these models (comma-separated names of the list)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker), args.device, args.trace_dir)))
        return 0
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.trace_dir:
        Path(args.trace_dir).mkdir(parents=True, exist_ok=True)
    models = mgt.QUICK if args.quick else mgt.MODELS
    if args.models:
        models = [m for m in models if m[0] in args.models.split(",")]
    cfgs = mgt.configs(models)
    t0 = time.time()
    with open(out.with_suffix(".log"), "w") as log:
        rows = mgt.run_pool(cfgs, args.jobs, args.device, args.budget_mib, t0 + args.time_budget, log,
                            script=__file__, extra_args=("--trace-dir", args.trace_dir))
    rows.sort(key=lambda r: (r["model"], r["precision"], r["optimizer"], r["batch_size"]))
    with open(out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    ok = [r for r in rows if r["status"] == "ok"]
    print(f"{len(ok)}/{len(cfgs)} configurations recorded in {time.time() - t0:.0f} s -> {out}")
    for r in ok:
        if r.get("real_reserved_mib"):
            print(f"  {_slug(r)}: reserved real {r['real_reserved_mib']:.0f} MiB, the model on the real sequence "
                  f"{r['model_reserved_mib']:.0f}; allocated {r['real_allocated_mib']:.0f} / {r['model_allocated_mib']:.0f}")
    if args.trace_dir:
        tars, left_out = pack(args.trace_dir, out.parent, args.max_tars)
        print(f"histories: {', '.join(t.name for t in tars)}" + (f"; left out: {' '.join(left_out)}" if left_out else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
