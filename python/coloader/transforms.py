"""Recipes: a job's torchvision transforms, translated op by op to coloader's native twins.

    import torchvision.transforms as T
    import coloader.transforms

    train = T.Compose([T.RandomResizedCrop(176), T.RandomHorizontalFlip(), T.TrivialAugmentWide(),
                       T.ToTensor(), T.Normalize(mean, std), T.RandomErasing(0.1)])
    print(coloader.transforms.to_json(train))     # what `coloader serve --transform` runs
    coloader.transforms.save(train, "recipe.json")

`coloader serve --transform recipe.py` (through `python -m coloader` or the wheel's `coloader`
command) runs a Python file that binds `transform` to a Compose and serves its translation;
`--transform recipe.json|yaml` takes the ops written out. Both forms mean the same: a list of
ops with torchvision's names and keyword arguments (docs/RECIPES.md has the table of ops, what
each honours and how close it is to torchvision).

An op with no native twin (a Lambda, a class of the job's own) or an argument the twin cannot
honour is an error that names it; such a recipe still runs through coloader.Producer over the
job's own DataLoader. Mixup and CutMix mix labels across a batch: the job applies them to its
CUDA batch (examples/recipes/train_reference.py).

apply(recipe, image) runs the native twin on one decoded image, with the draws of one sample:
for inspecting a recipe and for testing it against torchvision on the same pixels.
"""

import ctypes
import json
import math
import numbers
import os
import runpy
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Union

from . import _lib

if TYPE_CHECKING:
    import numpy

__all__ = ["translate", "to_json", "save", "load_python", "apply", "augment_op", "image_size", "UnsupportedOp"]

_ANYWAY = ("; to train with this recipe anyway, serve your own DataLoader through coloader.Producer "
           "(README: 'Any DataLoader')")

# torchvision's names for the ops coloader runs natively, v1 and v2 alike.
_IMPLIED = {"ToTensor", "PILToTensor", "ConvertImageDtype", "ToImage", "ToImageTensor", "ToDtype", "ConvertDtype"}


class UnsupportedOp(ValueError):
    """A transform coloader cannot run natively: names the op (and argument) and what to do."""


def _interp(value):
    """InterpolationMode (or its name or PIL's int) -> "bilinear" | "bicubic" | "nearest" | other."""
    if value is None:
        return None
    if hasattr(value, "value"):  # InterpolationMode
        return str(value.value)
    if isinstance(value, int):  # PIL's codes
        return {0: "nearest", 2: "bilinear", 3: "bicubic"}.get(value, "pil-%d" % value)
    return str(value)


def _size(value):
    if isinstance(value, numbers.Integral):
        return int(value)
    return [int(v) for v in value]


def _floats(value):
    if value is None:
        return None
    if isinstance(value, numbers.Number):
        return float(value)
    return [float(v) for v in value]


def _fill(op, value):
    if value is None:
        return None
    if isinstance(value, dict):
        # transforms.v2 keeps a fill per input type, a defaultdict of one value unless the user
        # gave a dict; images take the one value.
        values = list(value.values())
        factory = getattr(value, "default_factory", None)
        if factory is not None:
            values.append(factory())
        distinct = {repr(v): v for v in values}
        if len(distinct) != 1:
            raise UnsupportedOp("%s: a fill per input type (%r) is not supported natively%s" % (op, value, _ANYWAY))
        value = next(iter(distinct.values()))
        if value is None:
            return None
    return _floats(value)


def _antialias(op, value):
    if value is False:
        raise UnsupportedOp("%s: antialias=False is not supported natively (coloader always antialiases "
                            "shrinks)%s" % (op, _ANYWAY))


def _op(t):
    """One torchvision transform as a native op (a dict), None for an implied conversion."""
    name = type(t).__name__
    if name in _IMPLIED:
        if name in ("ToDtype", "ConvertImageDtype", "ConvertDtype"):
            dtype = getattr(t, "dtype", None)
            if isinstance(dtype, dict):
                dtype = next(iter(dtype.values()), None)
            if dtype is not None and "float" not in str(dtype):
                raise UnsupportedOp("%s(dtype=%s): natively the tensor is float (or the uint8 pixels with "
                                    "--output uint8); set the output with serve --output%s" % (name, dtype, _ANYWAY))
        out = {"op": name}
        if name == "ToDtype":
            out["scale"] = bool(getattr(t, "scale", False))
        return out
    if name == "RandomResizedCrop":
        _antialias(name, getattr(t, "antialias", None))
        return {"op": name, "size": _size(t.size), "scale": _floats(t.scale), "ratio": _floats(t.ratio),
                "interpolation": _interp(t.interpolation)}
    if name == "Resize":
        _antialias(name, getattr(t, "antialias", None))
        if getattr(t, "max_size", None) is not None:
            raise UnsupportedOp("Resize: max_size=%r is not supported natively%s" % (t.max_size, _ANYWAY))
        return {"op": name, "size": _size(t.size), "interpolation": _interp(t.interpolation)}
    if name == "CenterCrop":
        return {"op": name, "size": _size(t.size)}
    if name == "RandomCrop":
        out = {"op": name, "size": _size(t.size), "pad_if_needed": bool(t.pad_if_needed),
               "padding_mode": str(getattr(t.padding_mode, "value", t.padding_mode))}
        if t.padding is not None:
            padding = _size(t.padding)
            if type(t).__module__.startswith("torchvision.transforms.v2") and isinstance(padding, list) \
                    and len(padding) == 4:
                # v2 keeps its padding parsed as [left, right, top, bottom]; the recipe's is v1's
                # [left, top, right, bottom].
                padding = [padding[0], padding[2], padding[1], padding[3]]
            out["padding"] = padding
        fill = _fill(name, t.fill)
        if fill is not None:
            out["fill"] = fill
        return out
    if name in ("RandomHorizontalFlip", "RandomVerticalFlip", "RandomGrayscale"):
        return {"op": name, "p": float(t.p)}
    if name == "ColorJitter":
        out = {"op": name}
        for key in ("brightness", "contrast", "saturation", "hue"):
            value = getattr(t, key)
            if value is not None:
                out[key] = _floats(value)
        return out
    if name == "GaussianBlur":
        return {"op": name, "kernel_size": _size(t.kernel_size), "sigma": _floats(t.sigma)}
    if name == "TrivialAugmentWide":
        return {"op": name, "num_magnitude_bins": int(t.num_magnitude_bins),
                "interpolation": _interp(t.interpolation), "fill": _fill(name, t.fill)}
    if name == "RandAugment":
        return {"op": name, "num_ops": int(t.num_ops), "magnitude": int(t.magnitude),
                "num_magnitude_bins": int(t.num_magnitude_bins), "interpolation": _interp(t.interpolation),
                "fill": _fill(name, t.fill)}
    if name == "AutoAugment":
        policy = getattr(t.policy, "value", t.policy)
        return {"op": name, "policy": str(policy), "interpolation": _interp(t.interpolation),
                "fill": _fill(name, t.fill)}
    if name == "Normalize":
        return {"op": name, "mean": _floats(t.mean), "std": _floats(t.std)}
    if name == "RandomErasing":
        value = t.value
        if isinstance(value, str):
            value = "random" if value == "random" else value
        elif value is None:
            value = "random"  # v2 keeps "random" as None
        else:
            value = _floats(value)
        return {"op": name, "p": float(t.p), "scale": _floats(t.scale), "ratio": _floats(t.ratio), "value": value}
    if name in ("Compose", "Sequential"):
        raise UnsupportedOp("a nested %s: flatten it into the outer Compose" % name)
    what = "a Lambda" if name == "Lambda" else "'%s'" % name
    raise UnsupportedOp("%s has no native twin in coloader (it has RandomResizedCrop, Resize, CenterCrop, RandomCrop, "
                        "RandomHorizontalFlip, RandomVerticalFlip, ColorJitter, RandomGrayscale, GaussianBlur, "
                        "TrivialAugmentWide, RandAugment, AutoAugment, ToTensor, Normalize, RandomErasing)%s"
                        % (what, _ANYWAY))


def _steps(transform):
    """The transforms of a Compose (v1 or v2), an nn.Sequential, a list, or one transform."""
    if isinstance(transform, (list, tuple)):
        return list(transform)
    if hasattr(transform, "transforms"):
        return list(transform.transforms)
    if type(transform).__name__ == "Sequential":
        return list(transform)
    return [transform]


def translate(transform: Any) -> List[Dict[str, Any]]:
    """The native recipe of a torchvision Compose (or a list of transforms): a list of ops, each a
    dict with its torchvision name under "op" and its keyword arguments. Raises UnsupportedOp
    naming the op and argument it cannot honour."""
    ops = []
    for step in _steps(transform):
        op = _op(step)
        ops.append({k: v for k, v in op.items() if v is not None})
    return ops


def to_json(transform: Any, indent: Optional[int] = None) -> str:
    """translate(transform) as the JSON text `coloader serve --transform recipe.json` reads."""
    ops = transform if isinstance(transform, list) and all(isinstance(o, dict) for o in transform) \
        else translate(transform)
    return json.dumps(ops, indent=indent)


def save(transform: Any, path: Union[str, os.PathLike]) -> None:
    """Writes the recipe of `transform` to `path` (JSON)."""
    with open(path, "w") as f:
        f.write(to_json(transform, indent=1) + "\n")


def load_python(path: Union[str, os.PathLike]) -> List[Dict[str, Any]]:
    """Runs a recipe file (Python) and returns the native recipe of the `transform` it binds."""
    namespace = runpy.run_path(str(path))
    if "transform" not in namespace:
        raise UnsupportedOp("%s binds no `transform`: a Python recipe sets transform = "
                            "torchvision.transforms.Compose([...])" % path)
    try:
        return translate(namespace["transform"])
    except UnsupportedOp as e:
        raise UnsupportedOp("%s: %s" % (path, e)) from None


def _recipe_text(recipe):
    """A recipe given as JSON text (str or bytes), a list of ops, or a Compose -> JSON bytes."""
    if isinstance(recipe, bytes):
        return recipe
    if isinstance(recipe, str):
        return recipe.encode()
    return to_json(recipe).encode()


def image_size(recipe: Any) -> int:
    """The side of the square images the recipe makes."""
    lib = _lib.producer_lib()
    size = ctypes.c_int32()
    _lib.check_producer(lib.coloader_recipe_image_size(_recipe_text(recipe), ctypes.byref(size)))
    return size.value


def apply(recipe: Any, image: "numpy.ndarray", seed: int = 0, epoch: int = 0, index: int = 0,
          output: str = "uint8") -> "numpy.ndarray":
    """The native twin of `recipe` (a Compose, a list of ops or their JSON) on one decoded image
    (a uint8 numpy array H x W x 3, RGB), with the random draws of sample (seed, epoch, index) of
    a producer started with --seed seed. Returns size x size x 3: uint8 pixels before the
    tensor ops (output="uint8"), or the normalised, erased float32 tensor (output="float32"), HWC."""
    import numpy as np

    image = np.ascontiguousarray(image, dtype=np.uint8)
    if image.ndim != 3 or image.shape[2] != 3:
        raise ValueError("apply() takes an H x W x 3 uint8 RGB image, got shape %s" % (image.shape,))
    text = _recipe_text(recipe)
    side = image_size(text)
    dtypes = {"uint8": (np.uint8, 0), "float32": (np.float32, 1)}
    if output not in dtypes:
        raise ValueError("output must be 'uint8' or 'float32', got %r" % (output,))
    dtype, code = dtypes[output]
    out = np.empty((side, side, 3), dtype=dtype)
    lib = _lib.producer_lib()
    _lib.check_producer(lib.coloader_recipe_apply(text, image.ctypes.data, image.shape[0], image.shape[1],
                                                  seed, epoch, index, code, out.ctypes.data))
    return out


def augment_op(name: str, magnitude: float, image: "numpy.ndarray",
               fill: Union[None, float, Sequence[float]] = None) -> "numpy.ndarray":
    """One op of the automatic augmentations ("ShearX", "Rotate", "Color", "Posterize", ...) at a
    fixed magnitude on a copy of `image` (uint8 H x W x 3), as torchvision's _apply_op with
    nearest interpolation; for testing the native kernels against torchvision's."""
    import numpy as np

    if not math.isfinite(float(magnitude)):
        raise ValueError("magnitude must be finite, got %r" % (magnitude,))
    out = np.ascontiguousarray(image, dtype=np.uint8).copy()
    fill_arr = None if fill is None else (ctypes.c_float * 3)(*([float(fill)] * 3 if isinstance(fill, numbers.Number)
                                                                 else [float(f) for f in fill]))
    lib = _lib.producer_lib()
    _lib.check_producer(lib.coloader_augment_op(name.encode(), float(magnitude), out.ctypes.data, out.shape[0],
                                                out.shape[1], fill_arr))
    return out
