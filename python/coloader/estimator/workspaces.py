"""What CUDA libraries allocate on the GPU that a meta-device trace cannot see: cuBLAS's and
cuDNN's workspaces, placed in the traced allocation sequence where a training step on the GPU
makes them, so that the allocator model (memtrace.AllocatorModel) sees them fragment the reserve
as the real caching allocator does.

Measured on the H200 (torch 2.11, CUDA 13.0) from the caching allocator's own history of 154
training steps, each allocation tied to the operator that made it (benchmarks/allocation_replay.py,
docs/ESTIMATOR.md):

- cuBLAS: torch gives each cuBLAS handle (one per thread) a 32 MiB workspace from the caching
  allocator at its first matrix product, and cuBLASLt a 1 MiB one at the first addmm. Forward
  runs on the caller's thread and backward on autograd's device thread: two handles, held for
  the life of the process (every configuration that runs a product shows exactly these three).
- cuDNN: every convolution (forward; backward's data and filter passes) may ask for workspaces,
  sized by cuDNN's heuristics for the layer's shape, allocated around its outputs and freed
  before the operator returns. No formula of the shapes predicts them well (a rule per kind of
  layer misses the peak by 2.5% in the median and underestimates 18% of the configurations by
  more than 5%), so they are a table of what was measured, per layer and batch size
  (conv_workspaces_h200.csv.gz, made by benchmarks/conv_workspaces.py). A layer measured at
  another batch size has its workspaces scaled by the batch; a layer never measured takes the
  nearest measured layer of its kind (pass, kernel, stride, grouping), scaled by input bytes,
  and is counted as unmeasured: the estimate widens its margin by the share of such layers.
"""

import csv
import gzip
import io
import math
from collections import Counter, defaultdict, namedtuple
from pathlib import Path

MiB = 1 << 20
CUBLAS_WORKSPACE = 32 * MiB  # per cuBLAS handle: forward's thread and autograd's
CUBLASLT_WORKSPACE = 1 * MiB  # at the first addmm
# Operators whose kernels come from cuBLAS (their first call in forward and in backward each
# allocates a handle's workspace).
CUBLAS_OPS = frozenset({"mm", "addmm", "addmm_", "bmm", "baddbmm", "baddbmm_", "addbmm", "addbmm_", "matmul", "mv",
                        "addmv", "addmv_", "dot", "vdot", "addr", "addr_"})
CONV_OPS = frozenset({"convolution", "convolution_backward"})
TABLE = Path(__file__).with_name("conv_workspaces_h200.csv.gz")
SOURCE = "H200, torch 2.11+cu130, cuDNN of that build (docs/results/allocations/)"
FIELDS = ["pass", "batch", "input", "weight", "dtype", "layout", "stride", "padding", "dilation", "groups",
          "transposed", "mask", "program", "sources"]

# One convolution as cuDNN sees it: `batch` apart, what picks its algorithms and workspaces.
Layer = namedtuple("Layer", "pass_ batch input weight dtype layout stride padding dilation groups transposed mask")


def layer_key(layer):
    return layer._replace(batch=0)


def _ints(v):
    return tuple(int(x) for x in v)


def conv_layer(name, args):
    """The Layer of a convolution or convolution_backward call (aten's argument order), from the
    tensors a trace sees (meta or real); None for anything else."""
    if name == "convolution":
        x, w, stride, padding, dilation, transposed, groups, mask = (args[0], args[1], args[3], args[4], args[5],
                                                                     args[6], args[8], None)
        pass_ = "fwd"
    elif name == "convolution_backward":
        x, w, stride, padding, dilation, transposed, groups, mask = (args[1], args[2], args[4], args[5], args[6],
                                                                     args[7], args[9], args[10])
        pass_ = "bwd"
    else:
        return None
    import torch

    layout = "nchw"
    if x.dim() == 4 and not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last):
        layout = "nhwc"
    return Layer(pass_, int(x.shape[0]), _ints(x.shape[1:]), _ints(w.shape), str(x.dtype).replace("torch.", ""),
                 layout, _ints(stride), _ints(padding), _ints(dilation), int(groups), bool(transposed),
                 tuple(bool(m) for m in mask) if mask is not None else None)


def _bytes(layer):
    """(input, output, weight) bytes of a layer, of any number of spatial dimensions; a
    transposed convolution's output as its forward makes it (output_padding, at most stride - 1
    per side, left out)."""
    e = 4 if layer.dtype == "float32" else 8 if layer.dtype == "float64" else 2
    n = layer.batch
    inb = n * math.prod(layer.input) * e
    wb = math.prod(layer.weight) * e
    out_channels = layer.weight[1] * layer.groups if layer.transposed else layer.weight[0]
    spatial = 1
    for i, size in enumerate(layer.input[1:]):
        k, s = layer.weight[2 + i], layer.stride[i % len(layer.stride)]
        p, d = layer.padding[i % len(layer.padding)], layer.dilation[i % len(layer.dilation)]
        if layer.transposed:
            spatial *= max(1, (size - 1) * s - 2 * p + d * (k - 1) + 1)
        else:
            spatial *= max(1, (size + 2 * p - d * (k - 1) - 1) // s + 1)
    return inb, n * out_channels * spatial * e, wb


def _family(layer):
    """Which measured layers may stand in for an unmeasured one at all: the same pass, element
    size and grouping (a transposed, 1-D or 3-D convolution, which the table lacks, takes these)."""
    c = layer.input[0] if layer.input else 0
    grouping = "dense" if layer.groups == 1 else "depthwise" if layer.groups == c else "grouped"
    dtype = "bfloat16" if layer.dtype == "float16" else layer.dtype
    return (layer.pass_, dtype, grouping)


def _kind(layer):
    """... and which are alike: the family's, with the same kernel, stride, outputs asked for,
    and transposition."""
    return _family(layer) + (layer.weight[2:], layer.stride, layer.mask, layer.transposed)


class Program(tuple):
    """What one convolution allocates, in order: ("o",) an output (its size comes from the trace),
    ("w", id, nbytes) a workspace, ("f", id) a workspace freed."""

    @staticmethod
    def parse(text):
        out = []
        for tok in text.split():
            if tok == "o":
                out.append(("o",))
            elif tok[0] == "w":
                i, n = tok[1:].split(":")
                out.append(("w", int(i), int(n)))
            elif tok[0] == "f":
                out.append(("f", int(tok[1:])))
            else:
                raise ValueError(f"bad program token {tok!r}")
        return Program(out)

    def text(self):
        return " ".join("o" if t[0] == "o" else f"w{t[1]}:{t[2]}" if t[0] == "w" else f"f{t[1]}" for t in self)

    def scaled(self, factor):
        return Program(("w", t[1], int(t[2] * factor)) if t[0] == "w" else t for t in self)

    def workspace_bytes(self):
        return sum(t[2] for t in self if t[0] == "w")


def _dims(text):
    return tuple(int(x) for x in text.split("x")) if text else ()


def read_table(path=TABLE):
    """[(Layer, Program, sources)] from a table file; sources: {(model, batch)} it was measured in."""
    rows = []
    with gzip.open(path, "rt", newline="") as f:
        for r in csv.DictReader(f):
            layer = Layer(r["pass"], int(r["batch"]), _dims(r["input"]), _dims(r["weight"]), r["dtype"], r["layout"],
                          _dims(r["stride"]), _dims(r["padding"]), _dims(r["dilation"]), int(r["groups"]),
                          r["transposed"] == "1", tuple(c == "1" for c in r["mask"]) if r["mask"] != "-" else None)
            sources = {(s.rsplit("/", 1)[0], int(s.rsplit("/", 1)[1])) for s in r["sources"].split(";")}
            rows.append((layer, Program.parse(r["program"]), sources))
    return rows


def write_table(rows, path):
    """rows: [(Layer, Program, sources)] -> the table file (sorted, so that it diffs well)."""
    fmt = lambda t: "x".join(str(x) for x in t)  # noqa: E731
    out = []
    for layer, prog, sources in rows:
        out.append({"pass": layer.pass_, "batch": layer.batch, "input": fmt(layer.input), "weight": fmt(layer.weight),
                    "dtype": layer.dtype, "layout": layer.layout, "stride": fmt(layer.stride),
                    "padding": fmt(layer.padding), "dilation": fmt(layer.dilation), "groups": layer.groups,
                    "transposed": int(layer.transposed),
                    "mask": "".join("1" if m else "0" for m in layer.mask) if layer.mask is not None else "-",
                    "program": prog.text(), "sources": ";".join(f"{m}/{b}" for m, b in sorted(sources))})
    out.sort(key=lambda r: tuple(str(r[k]) for k in FIELDS))
    # No name and mtime 0 in the gzip header: the same table makes the same bytes, wherever written.
    with open(path, "wb") as raw, gzip.GzipFile(filename="", fileobj=raw, mode="wb", mtime=0) as gz, \
            io.TextIOWrapper(gz, encoding="utf-8", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS, lineterminator="\n")
        w.writeheader()
        w.writerows(out)


class ConvWorkspaces:
    """The measured table as a lookup: program(layer) -> (Program, measured?). `exclude(model,
    batch)` says which of the table's sources to leave out (a held-out check)."""

    def __init__(self, rows=None, exclude=None):
        rows = read_table() if rows is None else rows
        self.by_key = defaultdict(dict)  # layer key -> {batch: Program}
        # _kind(layer) and _family(layer) -> [((log input, output, weight bytes), input bytes, Program)]
        self.alike = defaultdict(list)
        for layer, prog, sources in rows:
            if exclude is not None and all(exclude(m, b) for m, b in sources):
                continue
            self.by_key[layer_key(layer)][layer.batch] = prog
            inb, outb, wb = _bytes(layer)
            entry = ((math.log(inb), math.log(outb), math.log(max(wb, 1))), inb, prog)
            self.alike[_kind(layer)].append(entry)
            self.alike[_family(layer)].append(entry)

    def program(self, layer):
        byb = self.by_key.get(layer_key(layer))
        if byb:
            if layer.batch in byb:
                return byb[layer.batch], True
            b0 = min(byb, key=lambda b: (abs(b - layer.batch), -b))  # the nearest batch, larger on a tie
            return byb[b0].scaled(layer.batch / b0), True
        cands = self.alike.get(_kind(layer)) or self.alike.get(_family(layer))
        if not cands:
            return Program(), False
        inb, outb, wb = _bytes(layer)
        here = (math.log(inb), math.log(outb), math.log(max(wb, 1)))
        # The closest in log bytes, ties broken by the program so that the choice does not hang
        # on rounding; scaled to this layer's input. (The median of the 3 or 5 closest did worse
        # on models left out of the table: docs/ESTIMATOR.md.)
        _, near_inb, prog = min(cands, key=lambda c: (round(sum(abs(a - b) for a, b in zip(c[0], here)), 9),
                                                      c[2].text()))
        return prog.scaled(inb / near_inb), False


_DEFAULT = None


def default_table():
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = ConvWorkspaces()
    return _DEFAULT


class Coverage:
    def __init__(self):
        self.convolutions = 0
        self.unmeasured = 0

    @property
    def unmeasured_share(self):
        return self.unmeasured / self.convolutions if self.convolutions else 0.0


def insert(events, windows, table):
    """The traced events (memtrace.StorageTracker's) with the libraries' allocations inserted.
    `windows`: the tracker's (operator, layer, first event, end event, phase) for CONV_OPS and
    CUBLAS_OPS, in order. Workspaces are ("alloc", ("ws", i), n, "workspace") and ("free",
    ("ws", i)); cuBLAS's are ("alloc", ("once", i), n, "workspace"), made once per process and
    never freed. Returns (events, Coverage)."""
    out, cover, uid = [], Coverage(), 0
    handles, lt = set(), False  # phases whose cuBLAS handle has its workspace; cuBLASLt's made
    pos = 0
    for name, layer, e0, e1, phase in windows:
        out.extend(events[pos:e0])
        pos = e1
        span = events[e0:e1]
        outputs = iter([ev for ev in span if ev[0] == "alloc"])
        if name in CONV_OPS and layer is not None:
            prog, measured = table.program(layer)
            cover.convolutions += 1
            cover.unmeasured += not measured
            keys = {}
            for t in prog:
                if t[0] == "o":
                    out.extend(ev for ev in [next(outputs, None)] if ev is not None)
                elif t[0] == "w":
                    uid += 1
                    keys[t[1]] = ("ws", uid)
                    out.append(("alloc", keys[t[1]], t[2], "workspace"))
                elif t[1] in keys:
                    out.append(("free", keys.pop(t[1])))
            out.extend(outputs)
            out.extend(("free", k) for k in keys.values())
        else:
            out.extend(outputs)
        out.extend(ev for ev in span if ev[0] != "alloc")  # frees that happened meanwhile
        if name in CUBLAS_OPS:
            made = []
            if phase not in handles:
                handles.add(phase)
                made.append(CUBLAS_WORKSPACE)
            if name in ("addmm", "addmm_") and not lt:
                lt = True
                made.append(CUBLASLT_WORKSPACE)
            for n in made:
                uid += 1
                out.append(("alloc", ("once", uid), n, "workspace"))
    out.extend(events[pos:])
    return out, cover


def measured_programs(names, rows, args, actions, addrs, sizes, base, lo, hi):
    """From one allocator history (benchmarks/allocation_replay.py's .npz): (Layer, Program) of
    every convolution whose allocations lie between allocation counters lo and hi (one step).
    `rows`: (operator index, counters as it began x3, as it ended x3)."""
    import numpy as np

    a_idx, f_idx = np.flatnonzero(actions == 0), np.flatnonzero(actions == 1)
    out = []
    for j, (i, a0, f0, _, a1, f1, _) in enumerate(rows):
        name = names[i].split(".")[1] if names[i].startswith("aten.") else names[i]
        if name not in CONV_OPS or a0 < lo or a1 > hi:
            continue
        layer = conv_layer(name, [_Described(a) if isinstance(a, str) else a for a in args[str(j)]])
        evs = sorted([(int(a_idx[k - base[0]]), "a") for k in range(a0, a1)]
                     + [(int(f_idx[k - base[1]]), "f") for k in range(f0, f1)])
        addr_id, prog, made = {}, [], []
        for e, kind in evs:
            addr = int(addrs[e])
            if kind == "a":
                addr_id[addr] = len(made)
                made.append([int(sizes[e]), False])
                prog.append(("a", addr_id[addr]))
            elif addr in addr_id:
                made[addr_id[addr]][1] = True
                prog.append(("f", addr_id.pop(addr)))
        tokens = []
        for t in prog:
            n, freed = made[t[1]]
            if t[0] == "a":
                tokens.append(("w", t[1] + 1, n) if freed else ("o",))
            elif freed:
                tokens.append(("f", t[1] + 1))
        out.append((layer, Program(tokens)))
    return out


class _Described:
    """A tensor as allocation_replay.py describes it ("T(32, 64, 56, 56):float32", "cl" appended
    for channels-last): enough of a tensor for conv_layer."""

    def __init__(self, text):
        shape, dtype = text[2:].split("):")
        self.shape = tuple(int(x) for x in shape.split(",") if x.strip())
        self.cl = dtype.endswith("cl")
        self.dtype = "torch." + (dtype[:-2] if self.cl else dtype)

    def dim(self):
        return len(self.shape)

    def is_contiguous(self, memory_format=None):
        return self.cl == (memory_format is not None)


def most_common(programs):
    """The program measured most often for one layer and batch (the larger on a tie): cuDNN's
    choice can differ between processes for a few layers (18 of 2,178 forward layers)."""
    counts = Counter(p.text() for p in programs)
    best = max(counts, key=lambda t: (counts[t], Program.parse(t).workspace_bytes()))
    return Program.parse(best)
