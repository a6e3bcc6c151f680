"""Recipes (issue 36): a job's torchvision transforms, translated and run natively.

- Fidelity, op by op, against torchvision itself on the same decoded pixels: every automatic-
  augmentation op at fixed magnitudes (coloader.transforms.augment_op against torchvision's
  _apply_op), every deterministic recipe (resize in each interpolation, Resize + CenterCrop,
  flips, grayscale, jitter at a fixed factor, blur, normalisation) through coloader.transforms.apply.
  The bound is the issue's: mean |diff| <= 1 level of 255 against torchvision's tensor kernels
  and against PIL's.
- Random ops by their distributions: the native op and torchvision's, each run on one image
  over many draws, give the same distribution of a per-image statistic (two-sample
  Kolmogorov-Smirnov at alpha = 0.001).
- Translation and errors: translate() of the reference recipes, ops and arguments with no twin
  named, the recipe file checks of `serve --transform`.
- End to end: `python -m coloader serve --transform recipe.py` with a real producer and a
  Loader; the batches are the native recipe of the same files, bit for bit.
"""

import json
import subprocess
import sys
import warnings

import numpy as np
import pytest

from support import BINARY, PYTHON_DIR, Producer, needs_build, torch  # noqa: F401 (torch: skips without it)

import coloader
import coloader.transforms as ct

T = pytest.importorskip("torchvision.transforms")
from torchvision.transforms import InterpolationMode, autoaugment  # noqa: E402
from PIL import Image  # noqa: E402

pytestmark = needs_build

MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]


@pytest.fixture(scope="module")
def photos():
    """Real photographs (Debian's mate-backgrounds) at ImageNet-like sizes, else a textured image."""
    from pathlib import Path

    found = sorted(Path("/usr/share/backgrounds/mate").glob("*/*.jpg"))[:3]
    images = [np.asarray(Image.open(p).convert("RGB").resize((500, 375), Image.BILINEAR)) for p in found]
    if not images:
        rng = np.random.default_rng(0)
        y, x = np.mgrid[0:375, 0:500]
        base = np.stack([x * 255 // 500, y * 255 // 375, (x + y) * 127 // 875], -1)
        images = [np.clip(base + rng.integers(-40, 40, base.shape), 0, 255).astype(np.uint8)]
    return images


def tv_tensor(transform, image):
    """torchvision's tensor kernels on a uint8 CHW tensor, back to HWC."""
    for t in getattr(transform, "transforms", [transform]):
        if hasattr(t, "antialias"):
            t.antialias = True  # PIL's behaviour, and v2's default
    x = torch.from_numpy(image.copy()).permute(2, 0, 1).contiguous()
    return transform(x).permute(1, 2, 0).numpy()


def tv_pil(transform, image):
    return np.asarray(transform(Image.fromarray(image)))


def mean_abs(a, b):
    return float(np.abs(a.astype(np.int32) - b.astype(np.int32)).mean())


AUGMENT_OPS = [
    ("Identity", [0.0]), ("ShearX", [0.3, -0.2, 0.99]), ("ShearY", [0.3, -0.5]),
    ("TranslateX", [10.0, -32.0]), ("TranslateY", [12.0, -20.0]), ("Rotate", [30.0, -135.0, 7.5]),
    ("Brightness", [0.5, -0.9]), ("Color", [0.9, -0.5]), ("Contrast", [0.5, -0.9]),
    ("Sharpness", [0.9, -0.9]), ("Posterize", [4, 2]), ("Solarize", [128.0, 0.0]),
    ("AutoContrast", [0.0]), ("Equalize", [0.0]), ("Invert", [0.0]),
]


@pytest.mark.parametrize("name,magnitudes", AUGMENT_OPS, ids=[n for n, _ in AUGMENT_OPS])
def test_each_augment_op_matches_torchvision_at_fixed_magnitudes(photos, name, magnitudes):
    for magnitude in magnitudes:
        for fill in (None, [128.0, 64.0, 32.0]):
            for image in photos:
                ours = ct.augment_op(name, magnitude, image, fill=fill)
                x = torch.from_numpy(image.copy()).permute(2, 0, 1).contiguous()
                theirs = autoaugment._apply_op(x, name, magnitude, InterpolationMode.NEAREST, fill)
                theirs = theirs.permute(1, 2, 0).numpy()
                assert mean_abs(ours, theirs) <= 1.0, (name, magnitude, fill)


DETERMINISTIC = [
    ("Resize((96, 96))", [{"op": "Resize", "size": [96, 96]}], lambda: T.Resize((96, 96))),
    ("Resize((400, 400)) enlarging", [{"op": "Resize", "size": [400, 400]}], lambda: T.Resize((400, 400))),
    ("Resize(256) + CenterCrop(224)", [{"op": "Resize", "size": 256}, {"op": "CenterCrop", "size": 224}],
     lambda: T.Compose([T.Resize(256), T.CenterCrop(224)])),
    ("bicubic Resize(96) + CenterCrop(96)",
     [{"op": "Resize", "size": 96, "interpolation": "bicubic"}, {"op": "CenterCrop", "size": 96}],
     lambda: T.Compose([T.Resize(96, InterpolationMode.BICUBIC), T.CenterCrop(96)])),
    ("bicubic Resize(300) + CenterCrop(300)",
     [{"op": "Resize", "size": 300, "interpolation": "bicubic"}, {"op": "CenterCrop", "size": 300}],
     lambda: T.Compose([T.Resize(300, InterpolationMode.BICUBIC), T.CenterCrop(300)])),
    ("flips", [{"op": "Resize", "size": [96, 96]}, {"op": "RandomHorizontalFlip", "p": 1},
               {"op": "RandomVerticalFlip", "p": 1}],
     lambda: T.Compose([T.Resize((96, 96)), T.RandomHorizontalFlip(1), T.RandomVerticalFlip(1)])),
    ("grayscale", [{"op": "Resize", "size": [96, 96]}, {"op": "RandomGrayscale", "p": 1}],
     lambda: T.Compose([T.Resize((96, 96)), T.RandomGrayscale(1)])),
    ("hue +0.2", [{"op": "Resize", "size": [96, 96]}, {"op": "ColorJitter", "hue": [0.2, 0.2]}],
     lambda: T.Compose([T.Resize((96, 96)), T.ColorJitter(hue=(0.2, 0.2))])),
    ("hue -0.4", [{"op": "Resize", "size": [96, 96]}, {"op": "ColorJitter", "hue": [-0.4, -0.4]}],
     lambda: T.Compose([T.Resize((96, 96)), T.ColorJitter(hue=(-0.4, -0.4))])),
    ("saturation 1.7", [{"op": "Resize", "size": [96, 96]}, {"op": "ColorJitter", "saturation": [1.7, 1.7]}],
     lambda: T.Compose([T.Resize((96, 96)), T.ColorJitter(saturation=(1.7, 1.7))])),
    ("contrast 0.6", [{"op": "Resize", "size": [96, 96]}, {"op": "ColorJitter", "contrast": [0.6, 0.6]}],
     lambda: T.Compose([T.Resize((96, 96)), T.ColorJitter(contrast=(0.6, 0.6))])),
    ("brightness 1.3", [{"op": "Resize", "size": [96, 96]}, {"op": "ColorJitter", "brightness": [1.3, 1.3]}],
     lambda: T.Compose([T.Resize((96, 96)), T.ColorJitter(brightness=(1.3, 1.3))])),
    ("GaussianBlur(5, 1.5)", [{"op": "Resize", "size": [96, 96]}, {"op": "GaussianBlur", "kernel_size": 5,
                                                                   "sigma": 1.5}],
     lambda: T.Compose([T.Resize((96, 96)), T.GaussianBlur(5, 1.5)])),
]


@pytest.mark.parametrize("name,recipe,make", DETERMINISTIC, ids=[d[0] for d in DETERMINISTIC])
def test_deterministic_recipes_match_torchvision(photos, name, recipe, make):
    for image in photos:
        ours = ct.apply(recipe, image)
        assert mean_abs(ours, tv_tensor(make(), image)) <= 1.0, "%s against torchvision's tensor kernels" % name
        assert mean_abs(ours, tv_pil(make(), image)) <= 1.0, "%s against torchvision on PIL images" % name


def test_nearest_resize_matches_pil(photos):
    recipe = [{"op": "Resize", "size": 96, "interpolation": "nearest"}, {"op": "CenterCrop", "size": 96}]
    make = T.Compose([T.Resize(96, InterpolationMode.NEAREST), T.CenterCrop(96)])
    for image in photos:
        assert mean_abs(ct.apply(recipe, image), tv_pil(make, image)) <= 1.0


def test_normalize_matches_torchvision_in_float(photos):
    recipe = [{"op": "Resize", "size": [64, 64]}, {"op": "ToTensor"}, {"op": "Normalize", "mean": MEAN, "std": STD}]
    make = T.Compose([T.Resize((64, 64)), T.ToTensor(), T.Normalize(MEAN, STD)])
    for image in photos:
        ours = ct.apply(recipe, image, output="float32")
        theirs = make(Image.fromarray(image)).permute(1, 2, 0).numpy()
        # One level of a uint8 pixel is 1 / (255 * std) in normalised units.
        assert float(np.abs(ours - theirs).mean()) <= 1 / (255 * min(STD))
    # Without Normalize the float tensor is ToTensor's x / 255.
    plain = ct.apply([{"op": "Resize", "size": [64, 64]}, {"op": "ToTensor"}], photos[0], output="float32")
    pixels = ct.apply([{"op": "Resize", "size": [64, 64]}], photos[0])
    np.testing.assert_allclose(plain, pixels / 255.0, atol=1e-6)


def ks_statistic(a, b):
    """The two-sample Kolmogorov-Smirnov statistic: the largest gap between the empirical CDFs."""
    a, b = np.sort(a), np.sort(b)
    grid = np.concatenate([a, b])
    return float(np.max(np.abs(np.searchsorted(a, grid, side="right") / len(a)
                               - np.searchsorted(b, grid, side="right") / len(b))))


def same_distribution(ours, theirs, label):
    """Two-sample KS at alpha = 0.001 (c = 1.95)."""
    n, m = len(ours), len(theirs)
    d = ks_statistic(np.asarray(ours), np.asarray(theirs))
    critical = 1.95 * np.sqrt((n + m) / (n * m))
    assert d <= critical, "%s: KS statistic %.4f > %.4f: the native op's draws differ from torchvision's" % (
        label, d, critical)


RANDOM = [
    ("TrivialAugmentWide", {"op": "TrivialAugmentWide"}, lambda: T.TrivialAugmentWide()),
    ("RandAugment", {"op": "RandAugment", "num_ops": 2, "magnitude": 9}, lambda: T.RandAugment(2, 9)),
    ("AutoAugment", {"op": "AutoAugment", "policy": "imagenet"}, lambda: T.AutoAugment()),
    ("ColorJitter", {"op": "ColorJitter", "brightness": 0.4, "contrast": 0.4, "saturation": 0.4, "hue": 0.1},
     lambda: T.ColorJitter(0.4, 0.4, 0.4, 0.1)),
    ("RandomGrayscale", {"op": "RandomGrayscale", "p": 0.3}, lambda: T.RandomGrayscale(0.3)),
    ("GaussianBlur", {"op": "GaussianBlur", "kernel_size": 9, "sigma": [0.1, 3.0]}, lambda: T.GaussianBlur(9, (0.1, 3.0))),
]


def statistics(image):
    """Per-image statistics that every op of these moves: mean, spread, and the colour balance;
    rounded, so that equal images give equal figures whatever their memory layout (ties matter:
    identity draws are frequent)."""
    f = np.ascontiguousarray(image, dtype=np.float64)
    return round(f.mean(), 6), round(f.std(), 6), round((f[..., 0] - f[..., 2]).mean(), 6)


@pytest.mark.parametrize("name,op,make", RANDOM, ids=[r[0] for r in RANDOM])
def test_random_ops_draw_as_torchvision_does(photos, name, op, make):
    image = np.asarray(Image.fromarray(photos[0]).resize((48, 48), Image.BILINEAR))
    recipe = json.dumps([{"op": "Resize", "size": [48, 48]}, op])
    draws = 1500
    ours = [statistics(ct.apply(recipe, image, seed=5, index=i)) for i in range(draws)]
    torch.manual_seed(0)
    t = make()
    x = torch.from_numpy(image.copy()).permute(2, 0, 1).contiguous()
    theirs = [statistics(t(x).permute(1, 2, 0).numpy()) for _ in range(draws)]
    for k, what in enumerate(("mean", "spread", "red - blue")):
        same_distribution([s[k] for s in ours], [s[k] for s in theirs], "%s, %s" % (name, what))


def test_random_resized_crop_and_erasing_draw_as_torchvision_does(photos):
    # Boxes read back from a coordinate image: red encodes x, green y (to 1/255 of the side).
    h, w = 255, 255
    y, x = np.mgrid[0:h, 0:w]
    coords = np.stack([x, y, np.zeros_like(x)], -1).astype(np.uint8)
    recipe = json.dumps([{"op": "RandomResizedCrop", "size": 32, "scale": [0.2, 0.9], "ratio": [0.6, 1.6],
                          "interpolation": "nearest"}])
    t = T.RandomResizedCrop(32, scale=(0.2, 0.9), ratio=(0.6, 1.6), interpolation=InterpolationMode.NEAREST)
    torch.manual_seed(0)
    xt = torch.from_numpy(coords).permute(2, 0, 1).contiguous()

    def box(out):
        return (int(out[..., 0].max()) - int(out[..., 0].min()), int(out[..., 1].max()) - int(out[..., 1].min()))

    ours = [box(ct.apply(recipe, coords, index=i)) for i in range(1500)]
    theirs = [box(t(xt).permute(1, 2, 0).numpy()) for _ in range(1500)]
    same_distribution([a * b for a, b in ours], [a * b for a, b in theirs], "RandomResizedCrop area")
    same_distribution([a / max(b, 1) for a, b in ours], [a / max(b, 1) for a, b in theirs], "RandomResizedCrop aspect")
    # RandomErasing on the normalised tensor: the share of the image erased.
    image = photos[0]
    recipe = json.dumps([{"op": "Resize", "size": [32, 32]}, {"op": "ToTensor"},
                         {"op": "RandomErasing", "p": 0.7, "value": 0}])
    base = ct.apply([{"op": "Resize", "size": [32, 32]}, {"op": "ToTensor"}], image, output="float32")
    ours = [float(np.mean(np.all(ct.apply(recipe, image, index=i, output="float32") != base, axis=-1)))
            for i in range(1500)]
    e = T.RandomErasing(0.7, value=0)
    tb = torch.from_numpy(base).permute(2, 0, 1).contiguous()
    theirs = [float((e(tb.clone()) != tb).all(0).float().mean()) for _ in range(1500)]
    same_distribution(ours, theirs, "RandomErasing's erased share")


def window_of(ours, candidates):
    """The (i, j) of the candidate windows (a dict) that `ours` equals, or None."""
    found = [ij for ij, window in candidates.items() if np.array_equal(ours, window)]
    return found[0] if found else None


@pytest.mark.parametrize("mode", ["constant", "edge", "reflect", "symmetric"])
def test_random_crop_is_a_window_of_torchvisions_padded_image(photos, mode):
    """RandomCrop(32, padding, padding_mode, fill) after Resize([32, 32]) (CIFAR's recipe): each
    sample equals, bit for bit, torchvision's pad-then-crop at one window, and the windows are
    drawn as torchvision's get_params draws them (top and left uniform, as torch.randint: a
    chi-square test of each at alpha = 0.001)."""
    import torchvision.transforms.functional as F

    image = np.asarray(Image.fromarray(photos[0]).resize((32, 32), Image.BILINEAR))
    left, top, right, bottom = 3, 2, 3, 4
    recipe = json.dumps([{"op": "Resize", "size": [32, 32]},
                         {"op": "RandomCrop", "size": 32, "padding": [left, top, right, bottom],
                          "padding_mode": mode, "fill": 77}])
    x = torch.from_numpy(image.copy()).permute(2, 0, 1).contiguous()
    padded = F.pad(x, [left, top, right, bottom], fill=77, padding_mode=mode).permute(1, 2, 0).numpy()
    candidates = {(i, j): padded[i:i + 32, j:j + 32] for i in range(top + bottom + 1) for j in range(left + right + 1)}
    draws = [window_of(ct.apply(recipe, image, seed=2, index=k), candidates) for k in range(600)]
    assert None not in draws, "a RandomCrop output is no window of torchvision's padded image"
    critical = {6: 22.46, 7: 24.32}  # chi-square at alpha = 0.001 by degrees of freedom
    for axis, values in ((0, top + bottom + 1), (1, left + right + 1)):
        counts = np.bincount([d[axis] for d in draws], minlength=values)
        chi2 = float(((counts - len(draws) / values) ** 2).sum() / (len(draws) / values))
        assert chi2 < critical[values - 1], "RandomCrop (%s): the %s offsets %s are not uniform (chi-square %.1f)" % (
            mode, ("top", "left")[axis], counts.tolist(), chi2)
    assert len(set(draws)) > 0.9 * len(candidates), "some windows are never drawn"


def test_resize_then_random_crop_is_a_window_of_torchvisions_resize(photos):
    """Resize(40) + RandomCrop(32) (the older ImageNet recipe, scaled down): each sample is a 32 x
    32 window of torchvision's resized image, within the resize's tolerance, at a top and left
    drawn uniformly."""
    image = photos[0]
    resized = tv_tensor(T.Resize(40), image)
    h, w = resized.shape[:2]
    recipe = json.dumps([{"op": "Resize", "size": 40}, {"op": "RandomCrop", "size": 32},
                         {"op": "RandomHorizontalFlip", "p": 0}])
    tops, lefts = [], []
    for k in range(150):
        ours = ct.apply(recipe, image, seed=4, index=k, output="uint8")
        diffs = {(i, j): mean_abs(ours, resized[i:i + 32, j:j + 32]) for i in range(h - 31) for j in range(w - 31)}
        (i, j), best = min(diffs.items(), key=lambda kv: kv[1])
        assert best <= 1.0, "sample %d: no window of torchvision's Resize(40) within a level (best %.2f)" % (k, best)
        tops.append(i)
        lefts.append(j)
    assert max(lefts) - min(lefts) >= (w - 32) // 2 and len(set(lefts)) > 5, "the windows do not move across the image"
    assert max(tops) == min(tops) == 0 or len(set(tops)) > 1


def test_random_crop_twins_and_flip_order():
    """The recipe checks of RandomCrop: where it may stand and what it takes."""
    ok = [{"op": "Resize", "size": [32, 32]}, {"op": "RandomCrop", "size": 32, "padding": 4},
          {"op": "RandomHorizontalFlip"}]
    assert ct.image_size(json.dumps(ok)) == 32
    translated = ct.translate(T.Compose([T.Resize((32, 32)), T.RandomCrop(32, padding=4, padding_mode="reflect"),
                                         T.RandomHorizontalFlip()]))
    assert translated[1] == {"op": "RandomCrop", "size": [32, 32], "pad_if_needed": False,
                             "padding_mode": "reflect", "padding": 4, "fill": 0.0}
    assert ct.image_size(json.dumps(translated)) == 32
    # transforms.v2 keeps its padding parsed in another order ([left, right, top, bottom]).
    for module in ("torchvision.transforms", "torchvision.transforms.v2"):
        try:
            tv = __import__(module, fromlist=["RandomCrop"])
        except ImportError:
            continue
        crop = ct.translate(tv.Compose([tv.Resize((32, 32)), tv.RandomCrop(32, padding=[4, 1, 2, 3])]))[1]
        assert crop["padding"] == [4, 1, 2, 3], module
    for recipe, says in [
        ([{"op": "RandomCrop", "size": 32, "padding": 4}], "follows the op that sets the image's size"),
        ([{"op": "Resize", "size": 256}, {"op": "RandomCrop", "size": 224, "padding": 4}], "takes no padding"),
        ([{"op": "Resize", "size": [32, 32]}, {"op": "RandomCrop", "size": 28}], "keeps the size"),
        ([{"op": "Resize", "size": [32, 32]}, {"op": "RandomCrop", "size": 32, "padding": [4, 0, 2, 0]},
          {"op": "RandomHorizontalFlip"}], "must come before the pixel ops"),
    ]:
        with pytest.raises(Exception, match=says):
            ct.image_size(json.dumps(recipe))


def test_identity_jitter_ranges_leave_the_image_alone(photos):
    """ColorJitter(brightness=(1, 1), hue=(0, 0)): torchvision drops a factor whose range is its
    identity, so the native op does too (a hue round trip through HSV moves values by a level)."""
    plain = ct.apply([{"op": "Resize", "size": [48, 48]}], photos[0])
    jitter = ct.apply([{"op": "Resize", "size": [48, 48]},
                       {"op": "ColorJitter", "brightness": [1, 1], "hue": [0, 0]}], photos[0], index=3)
    assert np.array_equal(plain, jitter)


def test_same_sample_same_draws_and_epochs_differ(photos):
    recipe = [{"op": "RandomResizedCrop", "size": 64}, {"op": "TrivialAugmentWide"}]
    a = ct.apply(recipe, photos[0], seed=3, epoch=1, index=7)
    assert np.array_equal(a, ct.apply(recipe, photos[0], seed=3, epoch=1, index=7))
    assert not np.array_equal(a, ct.apply(recipe, photos[0], seed=3, epoch=2, index=7))


def test_translate_the_reference_recipes():
    reference = T.Compose([T.RandomResizedCrop(176), T.RandomHorizontalFlip(), T.TrivialAugmentWide(),
                           T.PILToTensor(), T.ConvertImageDtype(torch.float), T.Normalize(MEAN, STD),
                           T.RandomErasing(0.1)])
    ops = ct.translate(reference)
    assert [o["op"] for o in ops] == ["RandomResizedCrop", "RandomHorizontalFlip", "TrivialAugmentWide",
                                      "PILToTensor", "ConvertImageDtype", "Normalize", "RandomErasing"]
    assert ops[0]["size"] == [176, 176] and ops[0]["interpolation"] == "bilinear"
    assert ops[6]["p"] == 0.1 and ops[6]["value"] == 0.0
    assert ct.image_size(reference) == 176
    timm_like = T.Compose([T.RandomResizedCrop(224, interpolation=InterpolationMode.BICUBIC),
                           T.RandomHorizontalFlip(), T.RandAugment(2, 9), T.ToTensor(), T.Normalize(MEAN, STD),
                           T.RandomErasing(0.25, value="random")])
    ops = ct.translate(timm_like)
    assert ops[0]["interpolation"] == "bicubic" and ops[2] == {"op": "RandAugment", "num_ops": 2, "magnitude": 9,
                                                                "num_magnitude_bins": 31,
                                                                "interpolation": "nearest"}
    assert ops[-1]["value"] == "random"
    evaluation = T.Compose([T.Resize(232), T.CenterCrop(224), T.ToTensor(), T.Normalize(MEAN, STD)])
    assert ct.image_size(evaluation) == 224


def test_ops_without_a_twin_are_named_with_what_to_do():
    with pytest.raises(ct.UnsupportedOp, match="Lambda has no native twin.*coloader.Producer"):
        ct.translate(T.Compose([T.Resize((8, 8)), T.Lambda(lambda x: x)]))
    with pytest.raises(ct.UnsupportedOp, match="'RandomPerspective' has no native twin"):
        ct.translate([T.RandomPerspective()])
    with pytest.raises(ct.UnsupportedOp, match="max_size"):
        ct.translate([T.Resize(256, max_size=300)])
    # Arguments the native twin cannot honour: refused by the library, naming the op and argument.
    image = np.zeros((16, 16, 3), np.uint8)
    with pytest.raises(coloader.InvalidArgument, match="Resize.*not square"):
        ct.apply([{"op": "Resize", "size": [8, 12]}], image)
    with pytest.raises(coloader.InvalidArgument, match="TrivialAugmentWide.*interpolation nearest"):
        ct.apply([{"op": "Resize", "size": [8, 8]}, {"op": "TrivialAugmentWide", "interpolation": "bilinear"}], image)
    with pytest.raises(coloader.InvalidArgument, match="ColorJitter: has no argument 'gamma'"):
        ct.apply([{"op": "Resize", "size": [8, 8]}, {"op": "ColorJitter", "gamma": 2}], image)
    with pytest.raises(coloader.InvalidArgument, match="Normalize.*RandomErasing|comes last"):
        ct.apply([{"op": "Resize", "size": [8, 8]}, {"op": "RandomErasing"}, {"op": "Normalize", "mean": MEAN,
                                                                             "std": STD}], image)
    with pytest.raises(coloader.InvalidArgument, match="CenterCrop"):
        ct.apply([{"op": "Resize", "size": 8}], image)


def test_serve_refuses_bad_recipes_naming_the_file_and_op(tmp_path, dataset):
    bad = tmp_path / "bad.yaml"
    bad.write_text("- {op: RandomResizedCrop, size: 32}\n- {op: Posterize, bits: 2}\n")
    run = subprocess.run([str(BINARY), "serve", "--data", str(dataset), "--name", "bad-recipe", "--transform",
                          str(bad)], capture_output=True, text=True, timeout=30)
    assert run.returncode != 0
    assert "bad.yaml:2:" in run.stderr and "'Posterize' has no native twin" in run.stderr
    script = tmp_path / "recipe.py"
    script.write_text("transform = None\n")
    run = subprocess.run([str(BINARY), "serve", "--data", str(dataset), "--name", "py-recipe", "--transform",
                          str(script)], capture_output=True, text=True, timeout=30)
    assert run.returncode != 0 and "python -m coloader serve --transform" in run.stderr
    run = subprocess.run([str(BINARY), "serve", "--data", str(dataset), "--name", "size-clash", "--image-size", "64",
                          "--transform", str(tmp_path / "ok.json")], capture_output=True, text=True, timeout=30)
    assert run.returncode != 0


def test_a_python_recipe_is_served_natively_end_to_end(tmp_path, dataset, env):
    """python -m coloader serve --transform recipe.py: the batches a Loader gets are the native recipe
    of the same files (decoded without DCT scaling), bit for bit, in order."""
    script = tmp_path / "recipe.py"
    script.write_text(
        "import torchvision.transforms as T\n"
        "transform = T.Compose([T.Resize(40), T.CenterCrop(32), T.RandomHorizontalFlip(),\n"
        "                       T.ColorJitter(0.3, 0.3), T.PILToTensor()])\n")
    namespace = {}
    exec(script.read_text(), namespace)
    recipe = ct.to_json(namespace["transform"])
    p = Producer(dataset, "--transform", str(script), "--output", "uint8", "--no-shuffle", "--no-dct-scaling",
                 "--seed", "9", epochs=1, via_python=True, start_timeout=120)  # it imports torchvision first
    assert any("recipe: Resize(size=40" in line for line in p.lines)
    # ImageFolder's order (torchvision's): classes sorted, files sorted in each.
    files = sorted(dataset.glob("*/*.jpg"), key=lambda f: (f.parent.name, f.name))
    seen = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loader = coloader.Loader(p.name, batch_size=16, timeout=10, layout="nhwc")
        for images, _ in loader:
            assert tuple(images.shape[1:]) == (32, 32, 3)
            for k, index in enumerate(loader.indices.tolist()):
                decoded = np.asarray(Image.open(files[index]).convert("RGB"))
                expected = ct.apply(recipe, decoded, seed=9, epoch=0, index=index)
                assert np.array_equal(images[k].numpy(), expected), files[index]
            seen += images.shape[0]
    assert seen == len(files)


gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (torch.cuda.is_available() is False)")


@pytest.fixture
def photo_folder(tmp_path):
    """An ImageFolder of real photographs (the GPU bundle's, else Debian's mate-backgrounds) at
    160x120: what decoders meet, where the synthetic noise of `dataset` exaggerates how nvJPEG's
    chroma upsampling differs from libjpeg's."""
    from pathlib import Path

    sources = sorted((Path(__file__).resolve().parents[2] / ".device" / "photos").glob("*.jpg")) or \
        sorted(Path("/usr/share/backgrounds/mate").glob("*/*.jpg"))[:12]
    if not sources:
        pytest.skip("no photographs here (.device/photos or Debian's mate-backgrounds)")
    root = tmp_path / "photos"
    for i, src in enumerate(sources * 2):
        folder = root / ("class%d" % (i % 2))
        folder.mkdir(parents=True, exist_ok=True)
        image = Image.open(src).convert("RGB").resize((160, 120), Image.BILINEAR)
        image.crop((i % 7, i % 5, 160, 120)).save(folder / ("img%03d.jpg" % i), quality=90)
    return root


def device_batches_against_cpu_twin(dataset, recipe_ops, tmp_path, *serve_args):
    """Serves `recipe_ops` with a device ring; each sample a device Loader gets, against the CPU
    twin (coloader.transforms.apply) on the same file decoded by PIL. Returns the mean |diff| over
    all samples and the largest of one sample, in the normalised units, and how many samples the
    CPU twin erased; asserts that the device erased exactly the same pixels."""
    recipe = tmp_path / "recipe.json"
    recipe.write_text(json.dumps(recipe_ops))
    p = Producer(dataset, "--transform", str(recipe), "--device", "cuda:0", "--output", "float32", "--no-shuffle",
                 "--no-dct-scaling", "--seed", "9", *serve_args, epochs=1)
    files = sorted(dataset.glob("*/*.jpg"), key=lambda f: (f.parent.name, f.name))
    worst, total, seen, erased = 0.0, 0.0, 0, 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loader = coloader.Loader(p.name, batch_size=16, timeout=10, device="cuda")
        for images, _ in loader:
            assert images.is_cuda
            for k, index in enumerate(loader.indices.tolist()):
                decoded = np.asarray(Image.open(files[index]).convert("RGB"))
                expected = torch.from_numpy(ct.apply(json.dumps(recipe_ops), decoded, seed=9, index=index,
                                                     output="float32")).permute(2, 0, 1)
                got = images[k].float().cpu()
                diff = float((got - expected).abs().mean())
                worst, total = max(worst, diff), total + diff
                mask = (expected == 0).all(0)
                assert torch.equal(mask, (got == 0).all(0)), "sample %d: erased elsewhere than the CPU twin" % index
                erased += int(mask.sum() > 0)
            seen += images.shape[0]
    assert seen == len(files) and p.wait() == 0
    return total / seen, worst, erased


@gpu
@pytest.mark.gpu
def test_the_reference_recipe_on_the_device_is_its_cpu_twin(tmp_path, dataset, env):
    """RandomResizedCrop + flip (CPU workers), TrivialAugmentWide (the device ring's pixel kernels),
    Normalize and RandomErasing (its kernels after normalising): the device batches equal the CPU
    twin's. Then every other pixel op with an exact twin (RandomCrop's padded window too), in one
    recipe."""
    ops = [{"op": "RandomResizedCrop", "size": 32}, {"op": "RandomHorizontalFlip"}, {"op": "TrivialAugmentWide"},
           {"op": "ToTensor"}, {"op": "Normalize", "mean": MEAN, "std": STD},
           {"op": "RandomErasing", "p": 0.5, "value": 0}]
    _, worst, erased = device_batches_against_cpu_twin(dataset, ops, tmp_path, "--decode", "cpu")
    assert worst <= 1e-5 and erased > 10
    ops[-1] = {"op": "RandomErasing", "p": 0.5, "value": "random"}
    _, worst, _ = device_batches_against_cpu_twin(dataset, ops, tmp_path, "--decode", "cpu")
    assert worst <= 1e-4
    ops[2:3] = [{"op": "RandomCrop", "size": 32, "padding": 4, "padding_mode": "reflect"},
                {"op": "ColorJitter", "brightness": 0.4, "contrast": 0.4, "saturation": 0.4, "hue": 0.1},
                {"op": "RandomGrayscale", "p": 0.2}, {"op": "RandAugment", "num_ops": 3},
                {"op": "AutoAugment", "fill": [128, 128, 128]}]
    _, worst, _ = device_batches_against_cpu_twin(dataset, ops, tmp_path, "--decode", "cpu")
    assert worst <= 1e-4


@gpu
@pytest.mark.gpu
def test_gpu_decoding_resizes_and_flips_as_the_cpu_twin(tmp_path, photo_folder, env):
    """--decode gpu: nvJPEG decodes, the GPU kernel resizes (bicubic here) and flips both ways, the ring
    erases; against the CPU twin on PIL's decode: the same pixels erased, within a level of 255 on
    average, no sample by more than 4 (nvJPEG's chroma upsampling is not libjpeg's; the resize
    kernels alone agree within 1 level: gpu_decode_test)."""
    ops = [{"op": "RandomResizedCrop", "size": 32, "interpolation": "bicubic"},
           {"op": "RandomHorizontalFlip"}, {"op": "RandomVerticalFlip"},
           {"op": "Normalize", "mean": MEAN, "std": STD}, {"op": "RandomErasing", "p": 0.5}]
    mean, worst, erased = device_batches_against_cpu_twin(photo_folder, ops, tmp_path, "--decode", "gpu")
    level = 1 / (255 * min(STD))
    print("--decode gpu against the CPU twin: mean |diff| %.2f levels, worst sample %.2f" % (mean / level, worst / level))
    assert mean <= level and worst <= 4 * level and erased > 5
    # The smooth pixel ops on the GPU after nvJPEG: a decode's level of difference stays a level.
    ops[3:3] = [{"op": "ColorJitter", "brightness": 0.3, "saturation": 0.3, "hue": 0.05},
                {"op": "GaussianBlur", "kernel_size": 5, "sigma": [0.5, 1.5]}]
    mean, worst, _ = device_batches_against_cpu_twin(photo_folder, ops, tmp_path, "--decode", "gpu")
    print("--decode gpu, jitter and blur on the GPU: mean |diff| %.2f levels, worst sample %.2f" %
          (mean / level, worst / level))
    assert mean <= level and worst <= 4 * level


def test_the_example_recipes_are_native():
    """examples/recipes/: each recipe reads, with the size it states."""
    yaml = pytest.importorskip("yaml")
    examples = PYTHON_DIR.parent / "examples" / "recipes"
    assert ct.image_size(ct.load_python(examples / "reference.py")) == 176
    sizes = {p.name: ct.image_size(json.dumps(yaml.safe_load(p.read_text()))) for p in examples.glob("*.yaml")}
    assert sizes == {"timm_like.yaml": 224, "eval.yaml": 224, "reference.yaml": 176}
