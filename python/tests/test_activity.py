"""The SM-activity estimate (coloader.estimator.activity through coloader.estimator.core) on the CPU."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

PYTHON_DIR = str(Path(__file__).resolve().parents[1])
sys.path.insert(0, PYTHON_DIR)  # test the source tree, not an installed copy
torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")

from coloader.estimator import activity  # noqa: E402
from coloader.estimator import core as est  # noqa: E402


def act(name="torchvision:resnet18", batch=32, **kw):
    kw.setdefault("image_size", 64)
    kw.setdefault("precision", "bf16-amp")
    return est.estimate(name, batch, **kw)


def test_activity_is_a_share_and_the_step_takes_time():
    for precision in est.PRECISIONS:
        e = act(precision=precision)
        assert 0 < e.sm_activity <= 1, e.sm_activity
        assert e.step_s > 0
        assert e.activity_calibration == activity.STEP_CALIBRATION["source"]


def test_a_larger_batch_keeps_a_convnet_at_least_as_busy():
    shares = [act(batch=b).sm_activity for b in (4, 16, 64, 128)]
    assert shares == sorted(shares) and shares[-1] > shares[0], shares


def test_resnet50_is_busier_than_resnet18():
    r18 = act("torchvision:resnet18", 64, image_size=224, channels_last=True)
    r50 = act("torchvision:resnet50", 64, image_size=224, channels_last=True)
    assert r50.sm_activity >= r18.sm_activity
    assert r50.step_s > r18.step_s
    assert r50.raw["step_gflop"] > 2 * r18.raw["step_gflop"]


def test_counts_the_flops_of_a_known_layer():
    # One 3x3 convolution, 8 -> 16 channels on 32x32, batch 2, no bias: forward makes
    # 2 x 16x32x32 x 8x9 x 2 FLOPs; backward as many again for the weight's gradient (the batch
    # needs none).
    class Conv(torch.nn.Module):
        channels, num_classes = 8, 16

        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(8, 16, 3, padding=1, bias=False)

        def forward(self, x):
            return self.conv(x).mean((2, 3))

    from coloader.estimator import zoo

    work = activity.WorkCounter()
    est.estimate_module(Conv(), zoo.InputSpec("image", image_size=32, channels=8, num_classes=16), 2, "sgd",
                        work=work)
    fwd = 2.0 * 2 * 16 * 32 * 32 * 8 * 9
    products = [k for k in work.kernels if k[0] != activity.MEMORY]
    assert sum(k[1] for k in products) == pytest.approx(2 * fwd)


def test_launch_bound_steps_are_less_busy():
    kernels = [(activity.MEMORY, 0.0, 1e3, 1e3)] * 100  # tiny kernels: the CPU sets the pace
    step, share = activity.predict(kernels)
    assert step == pytest.approx(100 * activity.STEP_CALIBRATION["launch_s"])
    assert share < 0.01
    big = [(activity.PRODUCT_LOW, 1e13, 1e9, 1e8)] * 10  # ten long products
    step, share = activity.predict(big)
    assert share == pytest.approx(1.0)


def test_json_and_text_carry_the_activity():
    cmd = [sys.executable, "-m", "coloader.estimator", "--model", "torchvision:resnet18", "--batch-size", "8",
           "--image-size", "64"]
    out = subprocess.run(cmd + ["--json"], cwd=PYTHON_DIR, capture_output=True, text=True, check=True).stdout
    e = json.loads(out)
    assert 0 < e["sm_activity"] <= 1 and e["step_s"] > 0
    text = subprocess.run(cmd, cwd=PYTHON_DIR, capture_output=True, text=True, check=True).stdout
    assert "sm_activity" in text


def test_a_tiny_models_activity_is_never_printed_as_zero(monkeypatch):
    # Rounded to 3 decimals, a launch-bound step's share (here 0.0004) would be 0.0, which the
    # planner takes as no estimate at all (it wants a share in (0, 1]).
    monkeypatch.setattr(activity, "predict", lambda kernels, cal=None: (1e-3, 4e-4))
    e = act()
    assert e.sm_activity == est.MIN_SM_ACTIVITY > 0
    assert json.loads(e.to_json())["sm_activity"] > 0
    monkeypatch.setattr(activity, "predict", lambda kernels, cal=None: (0.0, 0.0))  # no kernels at all
    assert act().sm_activity == est.MIN_SM_ACTIVITY
