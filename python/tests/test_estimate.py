"""The memory estimator (coloader.estimator) on the CPU: no GPU is needed or touched."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

PYTHON_DIR = str(Path(__file__).resolve().parents[1])
sys.path.insert(0, PYTHON_DIR)  # test the source tree, not an installed copy
torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")

from coloader.estimator import core as est  # noqa: E402
from coloader.estimator import lm, memtrace, zoo  # noqa: E402

MiB = 1 << 20


def small(name="torchvision:resnet18", batch=4, **kw):
    kw.setdefault("image_size", 64)
    return est.estimate(name, batch, **kw)


def test_runs_on_meta_without_touching_cuda():
    e = small()
    assert e.total_mib > e.parts["cuda_context"] > 0
    assert e.parts["activations"] > 0 and e.parts["parameters"] > 0
    assert not torch.cuda.is_initialized()


def test_parts_sum_to_total():
    for precision in est.PRECISIONS:
        e = small(precision=precision)
        assert abs(sum(e.parts.values()) - e.total_mib) < 0.1 * len(e.parts)
        assert set(e.parts) >= {"parameters", "gradients", "optimizer_state", "activations", "transient",
                                "workspace", "cuda_context"}


def test_monotone_in_batch_size():
    totals = [small(batch=b).total_mib for b in (1, 4, 16, 64)]
    assert totals == sorted(totals) and len(set(totals)) == 4, totals


def test_adam_holds_twice_the_state_of_sgd():
    params_mib = 11.69e6 * 4 / MiB  # resnet18's float32 parameters
    sgd, adam = small(optimizer="sgd"), small(optimizer="adam")
    assert sgd.parts["optimizer_state"] == pytest.approx(params_mib, rel=0.02)
    assert adam.parts["optimizer_state"] == pytest.approx(2 * params_mib, rel=0.02)
    assert adam.total_mib - sgd.total_mib >= 0.9 * params_mib


def test_bf16_amp_saves_activation_memory():
    # What forward leaves for backward (the batch included), and the whole at a batch size
    # where activations dominate.
    fp32, bf16 = small(batch=64), small(batch=64, precision="bf16-amp")
    assert bf16.raw["saved_activations_mib"] < 0.8 * fp32.raw["saved_activations_mib"]
    assert bf16.parts["activations"] < fp32.parts["activations"]
    assert bf16.total_mib < fp32.total_mib


def test_tracker_counts_saved_activations_exactly():
    # Four Linear layers 1024 wide on a batch of 256: forward keeps each layer's input (the
    # batch is held separately) and ReLU's output, 4 x 1 MiB; backward leaves 4 weight and
    # 4 bias gradients.
    model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(4)]).to("meta")
    x = torch.randn(256, 1024, device="meta")
    tr = memtrace.StorageTracker()
    for p in model.parameters():
        tr.hold(p, "parameters")
    tr.hold(x, "activations")
    base = tr.live_bytes
    with tr, memtrace.keep_saved_tensors():
        y = torch.relu(model(x)).sum()
        assert tr.live_bytes - base == 4 * MiB + 4  # + the 0-dim float sum
        y.backward()
        del y
    assert tr.live_bytes - base == 4 * (4 * MiB + 4096)


def test_allocator_model_segments():
    a = memtrace.AllocatorModel()
    a.malloc(1, 600 << 10)  # small request: a 2 MiB segment, split
    a.malloc(2, 600 << 10)  # fits the rest of that segment
    assert a.reserved == 2 * MiB
    a.malloc(3, 5 * MiB)  # 1..10 MiB: a 20 MiB segment
    assert a.reserved == 22 * MiB
    a.malloc(4, 30 * MiB + 1)  # large: rounded up to 2 MiB
    assert a.reserved == 22 * MiB + 32 * MiB
    a.free(4)
    a.malloc(5, 31 * MiB)  # the cached 32 MiB block is reused, nothing new reserved
    assert a.reserved == 54 * MiB and a.peak_allocated == a.allocated
    a.free(3)
    a.malloc(6, 19 * MiB)  # the freed 20 MiB segment holds it
    assert a.reserved == 54 * MiB
    assert memtrace.round_size(1) == 512 and memtrace.round_size(513) == 1024


def test_module_api_with_a_language_model():
    model = lm.GPT(layers=2, width=64, heads=2, vocab=1000, max_seq=128)
    spec = zoo.InputSpec("tokens", seq_len=64, vocab=1000)
    a = est.estimate_module(model, spec, 4, "adamw", "fp32")
    b = est.estimate_module(model, spec, 4, "adamw", "bf16-amp")
    assert a.raw["params_m"] == pytest.approx(sum(p.numel() for p in model.parameters()) / 1e6, abs=1e-3)
    assert b.parts["activations"] < a.parts["activations"]
    assert next(model.parameters()).device.type == "cpu"  # the caller's module is untouched


def test_clear_errors():
    with pytest.raises(est.EstimateError, match="nosuchnet"):
        small("torchvision:nosuchnet")
    with pytest.raises(est.EstimateError, match="lm:gpt2-small"):
        small("lm:gpt5")
    with pytest.raises(est.EstimateError, match="torchvision:<name>"):
        small("keras:resnet50")
    with pytest.raises(est.EstimateError, match="fp8.*fp32"):
        small(precision="fp8")
    with pytest.raises(est.EstimateError, match="lion"):
        small(optimizer="lion")
    with pytest.raises(est.EstimateError, match="batch size"):
        small(batch=0)


def run_cli(*args, module="coloader.estimator"):
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True,
                          env={"PYTHONPATH": PYTHON_DIR, "PATH": "/usr/bin:/bin"}, timeout=120)


def test_cli_json_is_one_object():
    r = run_cli("--model", "torchvision:mobilenet_v3_small", "--batch-size", "8", "--optimizer", "sgd",
                "--precision", "bf16-amp", "--image-size", "64", "--channels-last", "--json")
    assert r.returncode == 0, r.stderr
    obj = json.loads(r.stdout)
    assert obj["model"] == "torchvision:mobilenet_v3_small" and obj["channels_last"] is True
    assert obj["total_mib"] == pytest.approx(sum(obj["parts"].values()), abs=1)


def test_cli_unknown_precision_is_a_clear_error():
    r = run_cli("--model", "torchvision:resnet18", "--batch-size", "8", "--precision", "fp4")
    assert r.returncode == 2 and "unknown precision 'fp4'" in r.stderr and "Traceback" not in r.stderr


def test_the_old_module_path_still_runs_the_estimator():
    # `python -m coloader.estimate` is what the planner runs (placement/estimate_jobs.cc) and what
    # users typed before the estimator became coloader.estimator: the same answer, the same API.
    args = ("--model", "torchvision:resnet18", "--batch-size", "8", "--image-size", "64", "--json")
    old, new = run_cli(*args, module="coloader.estimate"), run_cli(*args)
    assert old.returncode == 0 and new.returncode == 0, old.stderr + new.stderr
    assert json.loads(old.stdout) == json.loads(new.stdout)
    import coloader.estimate as forwarded
    import coloader.estimator
    assert forwarded.estimate is est.estimate and forwarded.estimate_module is est.estimate_module
    assert coloader.estimator.estimate is est.estimate and coloader.estimator.EstimateError is est.EstimateError


def test_importing_coloader_leaves_the_estimator_and_torch_out():
    code = ("import coloader, json, sys\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('coloader') or m == 'torch')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120,
                         env={"PYTHONPATH": PYTHON_DIR, "PATH": "/usr/bin:/bin"}).stdout
    loaded = json.loads(out)
    assert "coloader.loader" in loaded and "torch" not in loaded, loaded
    assert not [m for m in loaded if m.startswith("coloader.estimat")], loaded


USER_MODEL = '''
import torch
from torch import nn


class Small(nn.Module):
    num_classes = 10

    def __init__(self, width=256):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, width, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(width, self.num_classes)

    def forward(self, x):
        return self.head(self.body(x))


class NeedsArguments(nn.Module):
    def __init__(self, depth):
        super().__init__()
'''


def test_a_users_own_module_is_estimated_from_its_file(tmp_path):
    (tmp_path / "mymodel.py").write_text(USER_MODEL)
    path = str(tmp_path / "mymodel.py")
    r = run_cli("--model", path + ":Small", "--batch-size", "8", "--image-size", "64", "--json")
    assert r.returncode == 0, r.stderr
    obj = json.loads(r.stdout)
    assert obj["raw"]["params_m"] == round((3 * 9 * 256 + 256 + 256 * 10 + 10) / 1e6, 3)  # its own module's
    assert obj["total_mib"] > obj["parts"]["cuda_context"]
    for model, says in ((path + ":Nope", "no nn.Module class 'Nope'; it defines: NeedsArguments, Small"),
                        (path + ":NeedsArguments", "constructible without arguments"),
                        (str(tmp_path / "missing.py") + ":Small", "does not exist")):
        r = run_cli("--model", model, "--batch-size", "8")
        assert r.returncode == 2 and says in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_models_with_auxiliary_classifiers_are_estimated():
    # GoogLeNet and Inception v3 return (logits, aux...) in training; the aux heads count.
    g = small("torchvision:googlenet", image_size=96)
    assert g.total_mib > g.parts["cuda_context"] and g.parts["activations"] > 0
    i = est.estimate("torchvision:inception_v3", 2)  # its own training size, 299 px
    assert i.parts["activations"] > 0


def test_a_model_that_cannot_take_the_image_size_says_so():
    r = run_cli("--model", "torchvision:inception_v3", "--batch-size", "2", "--image-size", "224")
    assert r.returncode == 2, r.stderr
    assert "cannot run a training step on 224 px images (--image-size)" in r.stderr
    assert "Traceback" not in r.stderr


def test_self_attention_is_traced_as_fused_attention():
    # nn.MultiheadAttention in training, as torchvision's ViT calls it: on the GPU torch 2.x
    # runs fused attention, which keeps no L x L score matrix (here 8 heads x 512 x 512 x 4
    # bytes = 8 MiB per sample), so the trace must not count one.
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = torch.nn.MultiheadAttention(64, 8, batch_first=True)

        def forward(self, x):
            return self.attn(x, x, x, need_weights=False)[0].mean(dim=1)

    spec = zoo.InputSpec("image", image_size=32, num_classes=64)

    class Seq(torch.nn.Module):  # a [B, 3, 32, 32] image as 512 tokens of 6 values
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Linear(6, 64)
            self.block = Block()

        def forward(self, x):
            return self.block(self.embed(x.reshape(x.shape[0], 512, 6)))

    e = est.estimate_module(Seq(), spec, 4, "sgd", "fp32")
    scores_mib = 4 * 8 * 512 * 512 * 4 / MiB
    assert e.raw["saved_activations_mib"] < scores_mib / 4, e.raw
    assert e.raw["uses_cublas"] and not e.raw["uses_cudnn"]


def test_accuracy_script_bin_accuracy_and_targets():
    # benchmarks/estimator_accuracy.py's figures on four made-up (measured, estimate) pairs in
    # MiB: bins are floor(MiB / (size x 1024)), so 1020 -> 1030 crosses the 1 GiB edge but stays
    # in its 2 GiB bin, and 9000 -> 8100 leaves its 1, 2 and 8 GiB bins.
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import estimator_accuracy as ea

    a = ea.accuracy([(1000, 1010), (1020, 1030), (3000, 2800), (9000, 8100)])
    assert a["configurations"] == 4
    assert a["1 GiB bin accuracy"] == 0.5
    assert a["2 GiB bin accuracy"] == 0.75 and a["8 GiB bin accuracy"] == 0.75
    assert a["under by >5%"] == 0.5
    assert abs(a["worst underestimate"] - 0.1) < 1e-9 and abs(a["worst overestimate"] - 0.01) < 1e-9
    assert abs(a["median |error|"] - (0.01 + 200 / 3000) / 2) < 1e-9
    marks = ea.target_marks(a)
    assert marks == {"median |error|": "missed", "1 GiB bin accuracy": "missed", "under by >5%": "missed"}
    assert ea.target_marks(dict(a, **{"median |error|": 0.03, "1 GiB bin accuracy": 0.95, "under by >5%": 0.02})) \
        == {"median |error|": "met", "1 GiB bin accuracy": "met", "under by >5%": "met"}
