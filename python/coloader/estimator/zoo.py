"""The models the memory estimator knows by name, their inputs, and their loss.

A model name is `torchvision:<name>` (any torchvision classification model), `timm:<name>`
(where timm is importable) or `lm:<config>` (our GPT-2-like models in coloader.estimator.lm).
Both the estimator (coloader.estimator, on the meta device) and its ground truth
(benchmarks/memory_ground_truth.py, on a GPU) build models and batches here, so the two always
trace and measure the same thing.
"""

import contextlib
from dataclasses import dataclass

import torch
from torch.nn import functional as F


class UnknownModel(ValueError):
    pass


@dataclass(frozen=True)
class InputSpec:
    """What one sample is: an image [channels, size, size] (float) with a class label, or a
    sequence of `seq_len` token ids below `vocab` with the next token as its label."""

    kind: str  # "image" or "tokens"
    image_size: int = 224
    channels: int = 3
    num_classes: int = 1000
    seq_len: int = 512
    vocab: int = 50257

    def batch(self, batch_size, device, channels_last=False):
        """(inputs, targets) for one training step, allocated on `device`."""
        if self.kind == "image":
            x = torch.randn(batch_size, self.channels, self.image_size, self.image_size, device=device)
            if channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            y = torch.randint(0, self.num_classes, (batch_size,), device=device)
            return x, y
        ids = torch.randint(0, self.vocab, (batch_size, self.seq_len + 1), device=device)
        return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()

    def loss(self, outputs, targets):
        if self.kind == "image":
            if isinstance(outputs, tuple):
                # GoogLeNet and Inception v3 train with auxiliary classifiers: (logits, aux...),
                # the aux losses weighted in as torchvision's reference recipe does.
                aux = [o for o in outputs[1:] if o is not None]
                return F.cross_entropy(outputs[0], targets) + sum(0.3 * F.cross_entropy(a, targets) for a in aux)
            return F.cross_entropy(outputs, targets)
        return F.cross_entropy(outputs.reshape(-1, outputs.shape[-1]), targets.reshape(-1))


def _device_context(device):
    """Build parameters directly on a CUDA device where torch can (2.x's torch.device context);
    else on the CPU, moved after. Never on the meta device: some models' constructors read
    values (regnet's width rounding calls .item()), which meta tensors do not have."""
    if hasattr(torch.device, "__enter__") and str(device).startswith("cuda"):
        return torch.device(device)
    return contextlib.nullcontext()


@contextlib.contextmanager
def _skip_init():
    """Random initialisation costs seconds on the CPU (ConvNeXt's truncated normals) and means
    nothing on the meta device: torch.nn.init's functions return their tensor untouched here."""
    import torch.nn.init as init

    names = [n for n in dir(init) if n.endswith("_") and not n.startswith("_") and callable(getattr(init, n))]
    saved = {n: getattr(init, n) for n in names}
    try:
        for n in names:
            setattr(init, n, lambda tensor, *a, **k: tensor)
        yield
    finally:
        for n, f in saved.items():
            setattr(init, n, f)


# Image models whose torchvision recipe trains at another size than 224 (Inception v3's
# auxiliary classifier needs 299 px or so: at 224 its 5x5 convolution has nothing to cover).
_IMAGE_SIZES = {"inception_v3": 299}


def build(name, device="cpu", image_size=None, seq_len=512):
    """(model on `device`, InputSpec) for a model name; UnknownModel names what is known. For
    the meta device the model is built on the CPU without its random initialisation.
    image_size None: the model's own training size (224 for most)."""
    if str(device) == "meta":
        with _skip_init():
            model, spec = build(name, "cpu", image_size, seq_len)
        return model.to("meta"), spec
    source, _, arch = name.partition(":")
    if image_size is None:
        image_size = _IMAGE_SIZES.get(arch, 224)
    if source == "lm":
        from . import lm

        if arch not in lm.CONFIGS:
            raise UnknownModel(f"unknown model {name!r}: language models are lm:{', lm:'.join(sorted(lm.CONFIGS))}")
        if not 1 <= seq_len <= lm.MAX_SEQ:
            raise ValueError(f"--seq-len {seq_len} is outside 1..{lm.MAX_SEQ}, the models' context")
        with _device_context(device):
            model = lm.build(arch)
        return model.to(device), InputSpec("tokens", seq_len=seq_len, vocab=lm.VOCAB)
    if image_size < 32:
        raise ValueError(f"--image-size {image_size} is too small; use 32 or more (224 is ImageNet's)")
    if source == "torchvision":
        import torchvision

        known = _torchvision_names(torchvision)
        if arch not in known:
            raise UnknownModel(f"unknown model {name!r}: torchvision {torchvision.__version__} has no "
                               f"classification model {arch!r} (e.g. resnet50, vgg16, vit_b_16)")
        with _device_context(device):
            model = getattr(torchvision.models, arch)()
        return model.to(device), InputSpec("image", image_size=image_size, num_classes=1000)
    if source == "timm":
        try:
            import timm
        except ImportError:
            raise UnknownModel(f"model {name!r} needs timm, which is not importable here; "
                               "install it (pip install timm) or use a torchvision: model") from None
        if arch not in timm.list_models():
            raise UnknownModel(f"unknown model {name!r}: timm {timm.__version__} has no model {arch!r}")
        with _device_context(device):
            model = timm.create_model(arch, pretrained=False)
        cfg = getattr(model, "pretrained_cfg", None) or getattr(model, "default_cfg", {})
        return model.to(device), InputSpec("image", image_size=image_size,
                                           num_classes=getattr(model, "num_classes", 1000),
                                           channels=cfg.get("input_size", (3,))[0])
    if source.endswith(".py"):
        return _user_model(source, arch, device, image_size)
    raise UnknownModel(f"unknown model {name!r}: write torchvision:<name>, timm:<name>, lm:<config> or "
                       f"FILE.py:CLASS")


def _user_model(path, cls_name, device, image_size):
    """A user's own nn.Module, FILE.py:CLASS, made with no arguments. Its input is an image of
    `image_size` px with its class `channels` (default 3) and `num_classes` (default 1000), or
    token ids when it sets `input_kind = "tokens"` (with `seq_len` and `vocab`)."""
    import importlib.util
    import os

    if not os.path.isfile(path):
        raise UnknownModel(f"model file {path!r} does not exist (write FILE.py:CLASS, the file's path relative "
                           f"to where the command runs)")
    spec = importlib.util.spec_from_file_location("coloader_user_model", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # the user's file: whatever it raises, say where
        raise UnknownModel(f"importing {path} failed: {type(e).__name__}: {e}") from None
    cls = getattr(module, cls_name, None)
    if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
        found = sorted(n for n, v in vars(module).items()
                       if isinstance(v, type) and issubclass(v, torch.nn.Module) and v.__module__ == module.__name__)
        raise UnknownModel(f"{path} has no nn.Module class {cls_name!r}; it defines: {', '.join(found) or 'none'}")
    try:
        with _device_context(device):
            model = cls()
    except TypeError as e:
        raise UnknownModel(f"{path}:{cls_name} must be constructible without arguments for the estimator "
                           f"({e}); give its arguments defaults, or wrap it in a class that does") from None
    if getattr(cls, "input_kind", "image") == "tokens":
        return model.to(device), InputSpec("tokens", seq_len=getattr(cls, "seq_len", 512),
                                           vocab=getattr(cls, "vocab", 50257))
    return model.to(device), InputSpec("image", image_size=image_size, channels=getattr(cls, "channels", 3),
                                       num_classes=getattr(cls, "num_classes", 1000))


def _torchvision_names(torchvision):
    if hasattr(torchvision.models, "list_models"):
        return set(torchvision.models.list_models(module=torchvision.models))
    # torchvision < 0.14: the lower-case callables of the classification module.
    return {n for n in dir(torchvision.models) if n[:1].islower() and callable(getattr(torchvision.models, n))
            and n not in ("get_weight", "get_model", "list_models", "get_model_weights")}


def make_optimizer(name, params):
    """The optimizers the estimator and the ground truth use, with the settings they state:
    SGD momentum 0.9 weight decay 1e-4 (ImageNet's usual), Adam and AdamW with torch's
    defaults (AdamW's weight decay 0.01)."""
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=1e-4)
    if name == "adam":
        return torch.optim.Adam(params, lr=1e-3)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-3)
    raise ValueError(f"unknown optimizer {name!r}; use sgd, adam or adamw")
