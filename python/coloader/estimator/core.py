"""Peak GPU memory of a training job, estimated without a GPU.

    python3 -m coloader.estimator --model torchvision:resnet50 --batch-size 128 \\
        --optimizer sgd|adam|adamw --precision fp32|bf16-amp|fp16-amp [--channels-last] \\
        [--image-size 224] [--seq-len 512] [--json]

    from coloader.estimator import estimate, estimate_module
    e = estimate("torchvision:resnet50", batch_size=128, optimizer="sgd", precision="bf16-amp")
    e.total_mib, e.parts        # MiB; the parts sum to the total
    e.sm_activity, e.step_s     # the share of the GPU the step keeps busy alone (activity.py)

The figure is what the job's process holds on the GPU at its peak as nvidia-smi shows it, since
that is what packing jobs onto a GPU must fit: the CUDA context, and everything PyTorch's
caching allocator has reserved (live tensors, the blocks it keeps cached, the gaps between).

How: the model runs one training step on the meta device (shapes, no data, no GPU) under
coloader.estimator.memtrace's tracker, which records every tensor storage's allocation and
free, with autocast emulated for the -amp precisions. coloader.estimator.workspaces places in
that sequence what the GPU's libraries allocate through the caching allocator and the meta
device cannot see: cuBLAS's handle workspaces and each convolution's cuDNN workspaces, from a
table measured on the H200.
The optimizer's state and the temporaries of its step are added as torch's foreach
implementation (the GPU default) allocates them. The whole sequence is replayed for three steps
(the first creates the optimizer state; the later ones hold it while activations live, and set
the peak) through a model of the caching allocator, which gives reserved memory, fragmentation
included. The CUDA context and a margin (wider where convolutions were not measured) are terms
calibrated on measurements (benchmarks/memory_ground_truth.py, docs/ESTIMATOR.md).
"""

import argparse
import copy
import gc
import json
import sys
from dataclasses import asdict, dataclass, field

PRECISIONS = ("fp32", "bf16-amp", "fp16-amp")
OPTIMIZERS = ("sgd", "adam", "adamw")
# How many parameter-sized float32 tensors of state each optimizer keeps (SGD's momentum
# buffer; Adam's two moments), and how many parameter-sized temporaries its foreach step makes
# (SGD: the gradient plus weight decay; Adam/AdamW: the square root of the second moment).
_STATE = {"sgd": 1, "adam": 2, "adamw": 2}
_STEP_TEMPS = {"sgd": 1, "adam": 1, "adamw": 1}

# Terms the meta device cannot see, fitted by benchmarks/estimator_accuracy.py on the ground
# truth in docs/results/memory_ground_truth.csv (154 configurations; docs/ESTIMATOR.md). They
# hold for what was measured: an H200, driver 580, PyTorch 2.11 with CUDA 13.0; another GPU,
# driver or CUDA has another context size and other workspaces, and wants its own ground-truth
# run (and benchmarks/allocation_replay.py for the workspaces).
CALIBRATION = {
    "source": "H200, torch 2.11+cu130, driver 580.159 (docs/results/memory_ground_truth.csv)",
    "context_mib": 612.0,  # CUDA context as the process starts (NVML, median of 154 processes)
    "cublas_context_mib": 130.0,  # ... grown by cuBLAS's kernels once a matrix product ran
    "cudnn_context_mib": 20.0,  # ... and by cuDNN's once a convolution ran
    # Factor on the allocator model's reserved bytes, and what it grows by per share of the
    # step's convolutions whose workspaces were not measured: no measured configuration is
    # underestimated by more than `plan`'s default 5% margin covers (an underestimate is an OOM).
    "margin": 1.0225,
    "margin_unmeasured": 0.05,
}

MiB = 1 << 20
# Operators whose GPU kernels come from cuBLAS and cuDNN: loading either library's kernels
# grows the CUDA context (docs/ESTIMATOR.md).
_CUBLAS_OPS = {"mm", "addmm", "bmm", "baddbmm", "addbmm", "matmul", "mv", "addmv", "_scaled_dot_product_flash_attention",
               "_scaled_dot_product_efficient_attention"}
_CUDNN_OPS = {"convolution", "_convolution", "cudnn_convolution", "convolution_overrideable"}


class EstimateError(ValueError):
    """Bad arguments: an unknown model, precision, optimizer or size."""


@dataclass
class Estimate:
    total_mib: float
    parts: dict
    model: str
    batch_size: int
    optimizer: str
    precision: str
    channels_last: bool
    input: dict
    raw: dict = field(default_factory=dict)  # uncalibrated figures from the trace
    calibration: str = ""
    torch: str = ""
    # The step's time alone on the calibration GPU and the share of it the SMs are busy
    # (coloader.estimator.activity): what the planner takes for a job's sm_activity when none is stated.
    sm_activity: float = 0.0
    step_s: float = 0.0
    activity_calibration: str = ""

    def to_json(self):
        return json.dumps(asdict(self), sort_keys=False)


# The least SM activity the estimator prints: rounding to 3 decimals would give a tiny model 0.0,
# which the planner takes as no estimate at all (it wants a share in (0, 1]).
MIN_SM_ACTIVITY = 0.001


def _share(sm_activity):
    return min(1.0, max(MIN_SM_ACTIVITY, round(sm_activity, 3)))


def _check(batch_size, optimizer, precision):
    if precision not in PRECISIONS:
        raise EstimateError(f"unknown precision {precision!r}; use one of {', '.join(PRECISIONS)}")
    if optimizer not in OPTIMIZERS:
        raise EstimateError(f"unknown optimizer {optimizer!r}; use one of {', '.join(OPTIMIZERS)}")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise EstimateError(f"batch size {batch_size!r} must be a positive integer")


def trace_step(model, spec, batch_size, precision="fp32", channels_last=False, observers=()):
    """Runs forward and backward of one step of `model` (on the meta device) and returns
    (tracker, trainable): the tracker's events cover the step; `trainable` are the parameters
    that get gradients. `observers` see every operator (memtrace.StorageTracker.observers)."""
    import torch

    from . import memtrace, workspaces

    tr = memtrace.StorageTracker()
    tr.observers.extend(observers)
    tr.watch.update({op: workspaces.conv_layer for op in workspaces.CONV_OPS})
    tr.watch.update({op: (lambda name, args: None) for op in workspaces.CUBLAS_OPS})
    for p in model.parameters():
        tr.hold(p, "parameters")
    for b in model.buffers():
        tr.hold(b, "parameters")
    inputs, targets = spec.batch(batch_size, "meta", channels_last)
    tr.hold(inputs, "activations")
    tr.hold(targets, "activations")
    amp = {"bf16-amp": torch.bfloat16, "fp16-amp": torch.float16}.get(precision)
    with tr, memtrace.keep_saved_tensors():
        tr.phase = "activations"
        mode = memtrace.StepEmulation(amp)
        with mode:
            loss = spec.loss(model(inputs), targets)
        mode.cache.clear()  # autocast drops its weight casts when the region ends
        del mode
        if precision == "fp16-amp":
            loss = loss * 65536.0  # GradScaler.scale
        tr.phase = "transient"
        tr.forward_end_bytes = sum(n for _, n, tag in tr.live.values() if tag == "activations")
        loss.backward()
        del loss
        gc.collect()
    trainable = [p for p in model.parameters() if p.requires_grad]
    for p in trainable:
        if p.grad is not None:
            tr.retag(p.grad, "gradients")
    return tr, trainable


def _replay(events, live_at_end, trainable, optimizer, steps=3):
    """Replays `steps` training steps of a traced sequence (`events`, the tracker's with the
    libraries' allocations inserted; `live_at_end`, the tracker's live storages after the
    step) through the allocator model; returns (allocator, parts at the peak of allocated
    bytes, in bytes)."""
    from . import memtrace

    alloc = memtrace.AllocatorModel()
    live = {}  # handle -> (rounded bytes, tag)
    by_tag = {}
    peak = [0, {}]

    def malloc(h, nbytes, tag):
        if nbytes == 0:
            return
        alloc.malloc(h, nbytes)
        n = memtrace.round_size(nbytes)
        live[h] = (n, tag)
        by_tag[tag] = by_tag.get(tag, 0) + n
        if alloc.allocated > peak[0]:
            peak[0], peak[1] = alloc.allocated, dict(by_tag)

    def free(h):
        if h in live:
            alloc.free(h)
            n, tag = live.pop(h)
            by_tag[tag] -= n

    # What exists before the first step (parameters, buffers, the batch) is alive throughout.
    setup = []
    step_events = []
    started = False
    persistent = {k for k, (c, _, _) in live_at_end.items() if c >= 1 << 40}
    for ev in events:
        if not started and ev[0] == "alloc" and ev[1] in persistent:
            setup.append(ev)
        else:
            started = True
            step_events.append(ev)
    grad_keys = {k for k, (_, _, tag) in live_at_end.items() if tag == "gradients"}
    for _, k, n, tag in setup:
        malloc(("p", k), n, tag)
    psizes = [p.numel() * p.element_size() for p in trainable]
    for s in range(steps):
        for ev in step_events:
            if ev[0] == "alloc":
                if isinstance(ev[1], tuple) and ev[1][0] == "once":  # a library's, for the process
                    if s == 0:
                        malloc(ev[1], ev[2], ev[3])
                else:
                    malloc((s, ev[1]), ev[2], ev[3])
            else:
                free((s, ev[1]))
        if s == 0:  # the optimizer's state appears at its first step
            for i, n in enumerate(psizes):
                for j in range(_STATE[optimizer]):
                    malloc(("state", i, j), n, "optimizer_state")
        for i, n in enumerate(psizes):
            for j in range(_STEP_TEMPS[optimizer]):
                malloc(("temp", s, i, j), n, "transient")
        for i, n in enumerate(psizes):
            for j in range(_STEP_TEMPS[optimizer]):
                free(("temp", s, i, j))
        for k in grad_keys:  # zero_grad(set_to_none=True)
            free((s, k))
        leftover = [h for h in live if isinstance(h[0], int) and h[0] == s]
        for h in leftover:  # anything else the step left (none expected) goes with it
            free(h)
    return alloc, peak[1]


def calibrated_parts(reserved_mib, unmeasured_share, flags, cal):
    """The terms the trace cannot see, in MiB: (cuda_context, margin on the reserved bytes).
    `flags` says whether the step uses cuBLAS and cuDNN; `unmeasured_share`, the share of its
    convolutions whose workspaces the table did not have (coloader.estimator.workspaces)."""
    context = cal["context_mib"] + cal["cublas_context_mib"] * flags["uses_cublas"] \
        + cal["cudnn_context_mib"] * flags["uses_cudnn"]
    margin = cal["margin"] + cal["margin_unmeasured"] * unmeasured_share
    return context, (margin - 1.0) * reserved_mib


def calibrated_total(reserved_mib, unmeasured_share, flags, cal):
    """The estimate's total from the allocator model's reserved peak and the calibrated terms."""
    return reserved_mib + sum(calibrated_parts(reserved_mib, unmeasured_share, flags, dict(CALIBRATION, **cal)))


def trace_with_workspaces(model, spec, batch_size, precision="fp32", channels_last=False, observers=(), table=None):
    """trace_step, then the libraries' workspaces placed in its sequence: (tracker, trainable,
    events, coverage). `table`: a workspaces.ConvWorkspaces (default: the measured table)."""
    from . import workspaces

    tr, trainable = trace_step(model, spec, batch_size, precision, channels_last, observers)
    events, cover = workspaces.insert(tr.events, tr.windows, table or workspaces.default_table())
    return tr, trainable, events, cover


def estimate_module(model, spec, batch_size, optimizer="adamw", precision="fp32", channels_last=False,
                    name=None, calibration=None, work=None):
    """Estimate for an nn.Module and a zoo.InputSpec (what one sample is). The module is not
    changed: a copy of it is moved to the meta device. `work`, an activity.WorkCounter, is
    left holding the step's kernels (benchmarks/activity_calibration.py refits on them)."""
    import torch

    from . import activity

    _check(batch_size, optimizer, precision)
    cal = dict(CALIBRATION, **(calibration or {}))
    if any(t.device.type != "meta" for t in list(model.parameters()) + list(model.buffers())):
        model = copy.deepcopy(model).to("meta")
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    model.train()
    work = activity.WorkCounter() if work is None else work
    tr, trainable, events, cover = trace_with_workspaces(model, spec, batch_size, precision, channels_last,
                                                         observers=[work])
    work.add_optimizer(optimizer, trainable)
    step_s, sm_activity = activity.predict(work.kernels)
    alloc, at_peak = _replay(events, tr.live, trainable, optimizer)
    largest_act = max((ev[2] for ev in tr.events if ev[0] == "alloc" and ev[3] == "activations"), default=0)
    flags = {"uses_cublas": bool(tr.ops & _CUBLAS_OPS), "uses_cudnn": bool(tr.ops & _CUDNN_OPS)}
    parts = {k: at_peak.get(k, 0) / MiB for k in
             ("parameters", "gradients", "optimizer_state", "activations", "transient", "workspace")}
    raw_reserved = alloc.peak_reserved / MiB
    context, margin = calibrated_parts(raw_reserved, cover.unmeasured_share, flags, cal)
    parts["allocator_overhead"] = (alloc.peak_reserved - alloc.peak_allocated) / MiB + margin
    parts["cuda_context"] = context
    parts = {k: round(v, 1) for k, v in parts.items()}
    return Estimate(
        total_mib=round(sum(parts.values()), 1), parts=parts, model=name or type(model).__name__,
        batch_size=batch_size, optimizer=optimizer, precision=precision, channels_last=channels_last,
        input=asdict(spec),
        raw={"traced_peak_live_mib": round(tr.peak_bytes / MiB, 1),
             "allocated_peak_mib": round(alloc.peak_allocated / MiB, 1),
             "reserved_peak_mib": round(raw_reserved, 1),
             "largest_activation_mib": round(largest_act / MiB, 1),
             "saved_activations_mib": round(tr.forward_end_bytes / MiB, 1),
             "params_m": round(sum(p.numel() for p in model.parameters()) / 1e6, 3),
             "step_gflop": round(sum(k[1] for k in work.kernels) / 1e9, 1),
             "step_gpu_gib": round(sum(k[2] for k in work.kernels) / (1 << 30), 2),
             "step_kernels": len(work.kernels),
             "convolutions": cover.convolutions,
             "unmeasured_convolutions": cover.unmeasured,
             **flags},
        calibration=cal["source"], torch=torch.__version__,
        sm_activity=_share(sm_activity), step_s=round(step_s, 5),
        activity_calibration=activity.STEP_CALIBRATION["source"])


def estimate(model, batch_size, optimizer="adamw", precision="fp32", channels_last=False, image_size=None,
             seq_len=512, calibration=None, work=None):
    """Estimate for a model name of coloader.estimator.zoo (torchvision:<name>, timm:<name>, lm:<config>)."""
    from . import zoo

    _check(batch_size, optimizer, precision)
    try:
        module, spec = zoo.build(model, device="meta", image_size=image_size, seq_len=seq_len)
    except zoo.UnknownModel as e:
        raise EstimateError(str(e)) from None
    try:
        return estimate_module(module, spec, batch_size, optimizer, precision, channels_last, name=model,
                               calibration=calibration, work=work)
    except RuntimeError as e:  # the model itself refuses the input (a shape it cannot take)
        raise EstimateError(f"{model} cannot run a training step on {spec.image_size} px images "
                            f"(--image-size): {str(e).splitlines()[0]}") from None


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python3 -m coloader.estimator",
                                 description="Peak GPU memory (MiB, as nvidia-smi shows it) of one training job.")
    ap.add_argument("--model", required=True,
                    help="torchvision:<name>, timm:<name>, lm:gpt2-small|gpt2-medium, or FILE.py:CLASS (your own "
                         "nn.Module, made with no arguments)")
    ap.add_argument("--batch-size", type=int, required=True)
    ap.add_argument("--optimizer", default="adamw", help="sgd, adam or adamw (default adamw)")
    ap.add_argument("--precision", default="fp32", help="fp32, bf16-amp or fp16-amp (default fp32)")
    ap.add_argument("--channels-last", action="store_true")
    ap.add_argument("--image-size", type=int, default=None,
                    help="image models: side in pixels (default: the model's training size, 224 for most, 299 "
                         "for inception_v3)")
    ap.add_argument("--seq-len", type=int, default=512, help="language models: tokens per sample (default 512)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    try:
        import torch  # noqa: F401
    except ImportError:
        print("error: coloader.estimator needs PyTorch; run it with a Python that has torch "
              "(on the development machines /usr/bin/python3)", file=sys.stderr)
        return 2
    try:
        e = estimate(args.model, args.batch_size, args.optimizer, args.precision, args.channels_last,
                     args.image_size, args.seq_len)
    except (EstimateError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.json:
        print(e.to_json())
        return 0
    print(f"{e.model}  batch {e.batch_size}  {e.precision}  {e.optimizer}"
          f"{'  channels-last' if e.channels_last else ''}: {e.total_mib:.0f} MiB peak (nvidia-smi)")
    for k, v in e.parts.items():
        print(f"  {k:<20} {v:10.1f} MiB")
    print(f"sm_activity {e.sm_activity:.2f} (step alone ~{e.step_s * 1e3:.1f} ms on the calibration GPU; "
          f"{e.raw['step_gflop']:.0f} GFLOP, {e.raw['step_kernels']} kernels)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
