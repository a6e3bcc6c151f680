"""A training job's step time alone and its SM activity, estimated from the traced step.

The estimator traces one training step on the meta device (coloader.estimator.core.trace_step).
A WorkCounter watching that trace records, per operator that would run a GPU kernel, its
floating point operations, the bytes it reads and writes, and the largest tensor it touches.
The optimizer's step, which the trace does not run, is added as torch's foreach implementation
launches it. Then, for each kernel:

  full  = max(FLOPs / rate, bytes / bandwidth)     the GPU's time for the work at full speed
  alone = max(full, full x fill_elems / elements)  a small kernel does not fill the SMs
  step  = sum over kernels of max(alone, launch_s) a kernel shorter than the CPU's time to
                                                   issue it (Python, autograd, dispatch, launch)
                                                   leaves the GPU waiting

The rate depends on the kernel and its precision: tensor cores for bf16/fp16 products, TF32 for
float32 convolutions (cuDNN's default), plain FP32 for float32 matrix products (PyTorch does not
allow TF32 there by default). The predicted activity is sum(full) / step: the share of the step
in which the GPU's SMs do useful work. Under MPS the rest (launch gaps, the idle SMs beside a
small kernel) is what other jobs can use, which is what sm_activity means to the planner
(docs/PLACEMENT.md: a job's images/s alone over the aggregate of enough copies of it).

The constants are fitted on steady-state step times measured alone on an H200
(benchmarks/activity_calibration.py, docs/results/step_time_alone.csv; docs/ESTIMATOR.md).
"""

import math

import torch

# Fitted by benchmarks/activity_calibration.py on docs/results/step_time_alone.csv (see the
# docs for the fit's error). They are one GPU's and one software stack's: another GPU has other
# rates and bandwidth, another CPU another launch cost.
STEP_CALIBRATION = {
    "source": "H200, torch 2.11+cu130, cudnn.benchmark on, 154 steps alone (docs/results/step_time_alone.csv)",
    "rate_low": 9.89e14,  # FLOP/s of bf16/fp16 convolutions and products (at the fit's bound: the peak)
    "rate_conv32": 1.97e14,  # FLOP/s of float32 convolutions (TF32 in cuDNN)
    "rate_mm32": 5.02e13,  # FLOP/s of float32 matrix products (true FP32)
    "bandwidth": 1.73e12,  # bytes/s that memory-bound kernels reach
    "launch_s": 3.01e-05,  # CPU seconds to issue one kernel in an eager training step
    "fill_elems": 2.0e5,  # elements a kernel needs to fill the GPU (not identified by the fit)
}

# Kinds of kernel, each with its rate.
MEMORY, PRODUCT_LOW, CONV32, PRODUCT32 = range(4)
_RATE = {PRODUCT_LOW: "rate_low", CONV32: "rate_conv32", PRODUCT32: "rate_mm32"}

_CONV = {"convolution", "_convolution", "convolution_overrideable", "cudnn_convolution"}
_CONV_BACKWARD = {"convolution_backward", "convolution_backward_overrideable"}
_PRODUCTS = {"mm", "addmm", "bmm", "baddbmm", "addbmm", "mv", "addmv"}
# Operators that allocate without running a kernel.
_NO_KERNEL = {"empty", "empty_like", "new_empty", "empty_strided", "new_empty_strided", "lift_fresh",
              "_local_scalar_dense", "is_same_size"}

# The foreach step torch 2.x runs on a GPU (torch/optim/sgd.py and adamw.py, _multi_tensor_*):
# (calls of a _foreach_ kernel, bytes each parameter element moves over all of them, as float32
# elements). SGD with momentum and weight decay: add the decay, scale the momentum buffer, add
# the gradient, add to the parameter. Adam/AdamW: decay, lerp the first moment, scale and
# addcmul the second, its square root, divide, add eps, addcdiv into the parameter.
_OPTIMIZER = {"sgd": (4, 11), "adam": (8, 20), "adamw": (8, 20)}
# multi_tensor_apply launches one kernel per this many tensors (at 3-4 tensor lists) or this
# many elements (320 blocks of 65536), whichever comes to more kernels.
_FOREACH_TENSORS = 48
_FOREACH_ELEMS = 320 * 65536


def _tensors(x):
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (list, tuple)):
        for y in x:
            yield from _tensors(y)


def _is_view(func):
    """An operator whose every output is a view of an input (no kernel, no bytes)."""
    rets = getattr(getattr(func, "_schema", None), "returns", None)
    return bool(rets) and all(r.alias_info is not None and not r.alias_info.is_write for r in rets)


def _nbytes(t):
    return t.numel() * t.element_size()


def _nchw(t):
    """A 4-d activation not laid out channels_last (one with a single channel is both)."""
    return t.dim() == 4 and t.shape[1] > 1 and not t.is_contiguous(memory_format=torch.channels_last)


def _low(t):
    return t.dtype in (torch.float16, torch.bfloat16)


class WorkCounter:
    """Observer for memtrace.StorageTracker: `kernels` is a list of (kind, flops, bytes,
    elements), one per GPU kernel the step would run, in order."""

    def __init__(self):
        self.kernels = []

    def __call__(self, func, args, kwargs, out):
        if isinstance(func, str):  # StorageTracker.note: fused attention
            self._attention(func, args, out)
            return
        name = func.overloadpacket.__name__
        if name in _NO_KERNEL or _is_view(func):
            return
        ins = list(_tensors(args)) + list(_tensors(list(kwargs.values())))
        outs = list(_tensors(out))
        if not any(t.device.type == "meta" for t in ins + outs):
            return  # host-side scalar work
        seen, nbytes = set(), 0
        for t in ins + outs:
            if id(t) not in seen:
                seen.add(id(t))
                nbytes += _nbytes(t)
        elems = max((t.numel() for t in ins + outs), default=0)
        kind, flops = MEMORY, 0.0
        if name in _CONV:
            x, w = args[0], args[1]
            transposed = args[6] if len(args) > 6 else kwargs.get("transposed", False)
            per = w.shape[1] * math.prod(w.shape[2:])
            flops = 2.0 * (x.numel() if transposed else outs[0].numel()) * per
            kind = PRODUCT_LOW if _low(x) else CONV32
        elif name in _CONV_BACKWARD:
            grad, x, w = args[0], args[1], args[2]
            mask = kwargs.get("output_mask", args[-1] if isinstance(args[-1], (list, tuple)) else (True, True, True))
            per = w.shape[1] * math.prod(w.shape[2:])
            transposed = len(args) > 7 and args[7] is True
            flops = 2.0 * (x.numel() if transposed else grad.numel()) * per * (bool(mask[0]) + bool(mask[1]))
            kind = PRODUCT_LOW if _low(x) else CONV32
        elif name in _PRODUCTS:
            a, b = (args[1], args[2]) if name in ("addmm", "baddbmm", "addbmm", "addmv") else (args[0], args[1])
            k = a.shape[-1]
            flops = 2.0 * outs[0].numel() * k
            if name == "addbmm":
                flops *= a.shape[0]
            kind = PRODUCT_LOW if _low(a) else PRODUCT32
        self.kernels.append((kind, flops, nbytes, elems))
        if kind == PRODUCT_LOW and name in _CONV | _CONV_BACKWARD and _nchw(args[0 if name in _CONV else 1]):
            # cuDNN's bf16/fp16 convolutions work in NHWC: an NCHW tensor is transposed on the
            # way in and the result on the way out, a read and a write of each (what makes
            # ResNet-18 b128 bf16-amp take 24 ms in NCHW against 11 ms channels_last).
            moved = sum(_nbytes(t) for t in ins + outs if t.dim() == 4)
            self.kernels.append((MEMORY, 0.0, 2.0 * moved, elems))

    def _attention(self, name, ins, outs):
        q, k = ins[0], ins[1]
        flops = 4.0 * q.numel() * k.shape[-2]  # Q K^T and P V
        if name.endswith("backward"):
            flops *= 2.5  # flash attention's backward: five products against forward's two
        nbytes = sum(_nbytes(t) for t in ins) + sum(_nbytes(t) for t in outs)
        self.kernels.append((PRODUCT_LOW if _low(q) else PRODUCT32, flops, nbytes,
                             max(t.numel() for t in list(ins) + list(outs))))

    def add_optimizer(self, optimizer, params):
        """The optimizer step's kernels, for `params` (the trainable parameters)."""
        calls, per_elem = _OPTIMIZER[optimizer]
        n = sum(p.numel() for p in params)
        if not n:
            return
        launches = max(math.ceil(len(params) / _FOREACH_TENSORS), math.ceil(n / _FOREACH_ELEMS))
        nbytes = 4.0 * per_elem * n / (calls * launches)
        for _ in range(calls * launches):
            self.kernels.append((MEMORY, 0.0, nbytes, n / launches))


def kernel_times(kernels, cal=None):
    """(full, charged) seconds per kernel, as float64 tensors: `full` the GPU's time for the
    kernel's work at full speed, `charged` what the kernel adds to the step alone. `kernels` is
    a WorkCounter's list or an (n, 4) tensor of it (benchmarks/activity_calibration.py fits
    many configurations at once so)."""
    cal = dict(STEP_CALIBRATION, **(cal or {}))
    k = torch.as_tensor(kernels, dtype=torch.float64).reshape(-1, 4)
    kind, flops, nbytes, elems = k.unbind(1)
    rate = torch.full_like(flops, math.inf)
    for which, key in _RATE.items():
        rate[kind == which] = cal[key]
    full = torch.maximum(nbytes / cal["bandwidth"], flops / rate)
    alone = full * torch.clamp(cal["fill_elems"] / elems.clamp(min=1.0), min=1.0)
    return full, alone.clamp(min=cal["launch_s"])


def predict(kernels, cal=None):
    """(step seconds alone, activity) for a WorkCounter's kernels under calibration `cal`
    (STEP_CALIBRATION by default)."""
    full, charged = kernel_times(kernels, cal)
    step = float(charged.sum())
    return step, (float(full.sum()) / step if step else 0.0)
