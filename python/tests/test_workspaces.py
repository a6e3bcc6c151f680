"""The GPU libraries' workspaces in the estimator's traced sequence
(coloader.estimator.workspaces): the cuBLAS handles' workspaces, the measured cuDNN table and
its fallback, and the table's builder reading an allocator history. On the CPU: no GPU is
needed or touched."""

import sys
from pathlib import Path

import pytest

PYTHON_DIR = str(Path(__file__).resolve().parents[1])
sys.path.insert(0, PYTHON_DIR)  # test the source tree, not an installed copy
torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")
np = pytest.importorskip("numpy")

from coloader.estimator import core as est  # noqa: E402
from coloader.estimator import workspaces as ws  # noqa: E402
from coloader.estimator import zoo  # noqa: E402

MiB = 1 << 20


def traced(module, spec, batch, precision="fp32", table=None):
    module = module.to("meta").train()
    return est.trace_with_workspaces(module, spec, batch, precision, table=table)


def library_allocs(events, kind):
    return [ev[2] for ev in events if ev[0] == "alloc" and isinstance(ev[1], tuple) and ev[1][0] == kind]


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(64, 256), torch.nn.Linear(256, 10)

    def forward(self, x):
        return self.b(torch.relu(self.a(x.flatten(1))))


def test_cublas_workspaces_one_per_thread_and_one_for_cublaslt():
    # Measured: 32 MiB at the first product of forward (the caller's cuBLAS handle), 1 MiB at
    # the first addmm (cuBLASLt), 32 MiB at the first product of backward (autograd's thread).
    spec = zoo.InputSpec("image", image_size=8, channels=1, num_classes=10)
    tr, _, events, _ = traced(Mlp(), spec, 4)
    assert library_allocs(events, "once") == [32 * MiB, 1 * MiB, 32 * MiB]
    first_bwd = next(i for i, ev in enumerate(events) if ev[0] == "alloc" and ev[3] == "transient")
    once = [i for i, ev in enumerate(events) if ev[0] == "alloc" and isinstance(ev[1], tuple) and ev[1][0] == "once"]
    assert once[0] < first_bwd < once[2]


def test_cublas_workspaces_are_made_once_and_never_freed():
    spec = zoo.InputSpec("image", image_size=8, channels=1, num_classes=10)
    tr, trainable, events, _ = traced(Mlp(), spec, 4)
    with_ws, _ = est._replay(events, tr.live, trainable, "sgd")
    without, _ = est._replay(tr.events, tr.live, trainable, "sgd")
    # Three steps, one set of handles: the live peak grows by the workspaces once.
    assert with_ws.peak_allocated - without.peak_allocated == 65 * MiB
    assert with_ws.allocated - without.allocated == 65 * MiB


def test_a_measured_layer_gets_its_measured_workspaces_in_place():
    table = ws.ConvWorkspaces()
    model, spec = zoo.build("torchvision:resnet18", device="meta")
    tr, _, events, cover = traced(model, spec, 32, table=table)
    assert cover.convolutions == 40 and cover.unmeasured == 0  # 20 convolutions, forward and backward
    stem = next(w for w in tr.windows if w[0] == "convolution")
    prog, measured = table.program(stem[1])
    assert measured and prog.workspace_bytes() > 0
    # The stem's output, then its workspaces allocated and freed, before the next operator's.
    out = tr.events[stem[2]]
    i = events.index(out)
    expect = [("alloc", t[2]) if t[0] == "w" else ("free",) for t in prog if t[0] != "o"]
    got = [("alloc", ev[2]) if ev[0] == "alloc" else ("free",) for ev in events[i + 1:i + 1 + len(expect)]]
    assert got == expect


def test_another_batch_size_scales_the_measured_layer():
    table = ws.ConvWorkspaces()
    model, spec = zoo.build("torchvision:resnet18", device="meta")
    tr, _, _, _ = traced(model, spec, 32, table=table)
    layer = next(w[1] for w in tr.windows if w[0] == "convolution")
    at32, _ = table.program(layer)
    at48, measured = table.program(layer._replace(batch=48))
    assert measured  # the layer is known, at other batch sizes
    assert at48.workspace_bytes() == pytest.approx(at32.workspace_bytes() * 48 / 32, rel=0.01)


def test_an_unmeasured_layer_takes_the_nearest_of_its_kind_and_is_counted():
    table = ws.ConvWorkspaces()
    model, spec = zoo.build("torchvision:resnet18", device="meta", image_size=96)  # no 96 px layer was measured
    tr, _, _, cover = traced(model, spec, 32, table=table)
    assert cover.convolutions == 40 and cover.unmeasured == 40
    layer = next(w[1] for w in tr.windows if w[0] == "convolution")
    prog, measured = table.program(layer)
    assert not measured and prog.workspace_bytes() > 0
    e = est.estimate("torchvision:resnet18", 32, image_size=96)
    assert e.raw["unmeasured_convolutions"] == 40
    # ... and the estimate's margin widens by the unmeasured share (all of it here).
    measured_e = est.estimate("torchvision:resnet18", 32)
    assert measured_e.raw["unmeasured_convolutions"] == 0
    cal = est.CALIBRATION
    assert e.parts["allocator_overhead"] >= (cal["margin"] + cal["margin_unmeasured"] - 1) * e.raw["reserved_peak_mib"]


class OddConvolutions(torch.nn.Module):
    """Layers the table has none of: 1-D, 3-D and transposed convolutions."""

    def __init__(self):
        super().__init__()
        self.c1 = torch.nn.Conv1d(3, 16, 5, padding=2)
        self.c3 = torch.nn.Conv3d(1, 8, 3, padding=1)
        self.up = torch.nn.ConvTranspose2d(3, 8, 3, stride=2, padding=1, output_padding=1)

    def forward(self, x):
        a = self.c1(x.flatten(2)).mean()
        b = self.c3(x[:, :1].unsqueeze(1)).mean()
        return (self.up(x).mean() + a + b).expand(x.shape[0], 10)


def test_layers_of_no_measured_kind_borrow_from_their_family_and_are_counted():
    spec = zoo.InputSpec("image", image_size=32, channels=3, num_classes=10)
    tr, _, events, cover = traced(OddConvolutions(), spec, 8)
    assert cover.convolutions == 6 and cover.unmeasured == 6  # three layers, forward and backward
    table = ws.ConvWorkspaces()
    progs = [table.program(w[1]) for w in tr.windows if w[0] in ws.CONV_OPS]
    assert all(not measured and len(prog) for prog, measured in progs)  # a neighbour's, outputs at least
    assert sum(prog.workspace_bytes() for prog, _ in progs) > 0
    up = next(w[1] for w in tr.windows if w[0] == "convolution" and w[1].transposed)
    assert ws._bytes(up)[1] == 8 * 8 * 63 * 63 * 4  # (32 - 1) x 2 - 2 + 2 + 1 = 63; output_padding left out


def test_a_table_without_a_model_does_not_know_its_layers():
    rows = ws.read_table()
    assert any(("torchvision:squeezenet1_1", 64) in sources for _, _, sources in rows)
    without = ws.ConvWorkspaces(rows, exclude=lambda m, b: m == "torchvision:squeezenet1_1")
    model, spec = zoo.build("torchvision:squeezenet1_1", device="meta")
    _, _, _, cover = traced(model, spec, 64, table=without)
    _, _, _, cover_all = traced(zoo.build("torchvision:squeezenet1_1", device="meta")[0], spec, 64)
    assert cover_all.unmeasured == 0 and cover.unmeasured > 0


def test_program_text_round_trips():
    p = ws.Program.parse("o w1:16056336 f1 o w2:4194304 w3:20 f3 f2")
    assert p.text() == "o w1:16056336 f1 o w2:4194304 w3:20 f3 f2"
    assert p.workspace_bytes() == 16056336 + 4194304 + 20
    assert p.scaled(0.5).workspace_bytes() == 8028168 + 2097152 + 10
    with pytest.raises(ValueError):
        ws.Program.parse("o q9")


def test_the_builder_reads_a_history():
    # A forward convolution that allocated its output and a workspace it freed, then a
    # backward one (grad input, workspace, grad weight, workspace), as allocation_replay.py
    # records them: the history's events and the allocator's counters around each operator.
    names = ["aten.convolution.default", "aten.convolution_backward.default", "aten.relu.default"]
    x, w, go = "T(2, 3, 8, 8):float32", "T(4, 3, 3, 3):float32", "T(2, 4, 8, 8):float32"
    args = {"0": [x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1],
            "2": [go, x, w, [4], [1, 1], [1, 1], [1, 1], False, [0, 0], 1, [True, True, False]]}
    A, FR, FC = 0, 1, 2
    hist = [(A, 10, 512), (A, 11, 4096), (FR, 11, 4096), (FC, 11, 4096),  # convolution
            (A, 12, 512),  # relu
            (A, 13, 384), (A, 14, 8192), (FR, 14, 8192), (FC, 14, 8192), (A, 15, 432), (A, 16, 100),
            (FR, 16, 100), (FC, 16, 100)]  # convolution_backward
    actions = np.array([h[0] for h in hist], dtype=np.uint8)
    addrs = np.array([h[1] for h in hist], dtype=np.uint64)
    sizes = np.array([h[2] for h in hist], dtype=np.int64)
    base = (100, 50, 0)  # the counters when the history began
    # (operator name's index, allocations, frees, segments as it began; the same as it ended)
    rows = [(0, 100, 50, 0, 102, 51, 0), (2, 102, 51, 0, 103, 51, 0), (1, 103, 51, 0, 107, 53, 0)]
    found = ws.measured_programs(names, rows, {"0": args["0"], "2": args["2"]}, actions, addrs, sizes, base, 100, 107)
    assert [(layer.pass_, prog.text()) for layer, prog in found] == [
        ("fwd", "o w2:4096 f2"), ("bwd", "o w2:8192 f2 o w4:100 f4")]
    fwd = found[0][0]
    assert (fwd.batch, fwd.input, fwd.weight, fwd.dtype, fwd.layout) == (2, (3, 8, 8), (4, 3, 3, 3), "float32", "nchw")
    assert found[1][0].mask == (True, True, False)


def test_the_table_file_round_trips(tmp_path):
    rows = ws.read_table()[:50]
    path = tmp_path / "t.csv.gz"
    ws.write_table(rows, path)
    back = ws.read_table(path)
    assert sorted((layer, prog.text(), sorted(src)) for layer, prog, src in back) == \
        sorted((layer, prog.text(), sorted(src)) for layer, prog, src in rows)
