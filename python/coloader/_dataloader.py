"""What coloader.Loader keeps of torch's DataLoader interface besides iteration: the keyword
arguments whose work the producer does (accepted, with a one-time note), and the `dataset` and
`sampler` attributes that training loops read (len(), set_epoch())."""

import warnings
from typing import Dict, List


class IgnoredArgumentWarning(UserWarning):
    """A DataLoader argument was given to coloader.Loader, where the producer does that work."""


# DataLoader's keyword arguments that the producer takes the place of: (the value that means
# "nothing to do", what to say instead).
_DATALOADER_ARGUMENTS = {
    "num_workers": (0, "the producer decodes and augments for every job (coloader serve --workers)"),
    "pin_memory": (False, "batches arrive in shared memory, or on the GPU with device='cuda'"),
    "pin_memory_device": ("", "batches arrive in shared memory, or on the GPU with device='cuda'"),
    "shuffle": (None, "the producer decides the order: a permutation per epoch from its --seed "
                      "(coloader serve --no-shuffle for dataset order)"),
    "persistent_workers": (False, "the producer keeps running between epochs"),
    "prefetch_factor": (None, "the producer runs up to its --window batches ahead of the slowest job"),
    "worker_init_fn": (None, "the producer has no per-job workers"),
    "multiprocessing_context": (None, "the producer has no per-job workers"),
    "generator": (None, "the producer's --seed decides the order and the augmentation"),
    "in_order": (True, "batches always come in the producer's order"),
}
_noted = set()


def _note_dataloader_arguments(kwargs):
    unknown = sorted(set(kwargs) - set(_DATALOADER_ARGUMENTS))
    if unknown:
        changes = {"collate_fn", "sampler", "batch_sampler"} & set(unknown)
        raise TypeError("coloader.Loader() got unexpected keyword argument(s) %s%s" % (
            ", ".join(unknown),
            (": %s would change what the batches hold, which the producer decides for every job; "
             "give the producer its data (coloader serve, or coloader.Producer for your own DataLoader)"
             % ", ".join(sorted(changes))) if changes else ""))
    for key, value in kwargs.items():
        neutral, instead = _DATALOADER_ARGUMENTS[key]
        if value == neutral or value is None or key in _noted:
            continue
        _noted.add(key)
        warnings.warn("coloader.Loader: %s=%r is accepted and has no effect: %s" % (key, value, instead),
                      IgnoredArgumentWarning, stacklevel=3)


class _Dataset:
    """What `loader.dataset` is: its len() is the dataset's size, and for a producer of an image
    folder `classes` and `class_to_idx` are its folders' names, as torchvision's ImageFolder has."""

    def __init__(self, loader):
        self._loader = loader

    def __len__(self) -> int:
        return self._loader.dataset_size

    @property
    def classes(self) -> List[str]:
        """The class names in label order (label i is classes[i]). AttributeError when the producer
        has none: its labels come from a file list, shards or the caller's own batches."""
        names = self._loader._class_names()
        if not names:
            raise AttributeError("producer %r has no class names: its labels come from a file list, WebDataset "
                                 "shards or a coloader.Producer's batches, not from an image folder's "
                                 "subfolders" % self._loader.name)
        return list(names)

    @property
    def class_to_idx(self) -> Dict[str, int]:
        """{class name: label}, as ImageFolder's."""
        return {name: i for i, name in enumerate(self.classes)}

    def __repr__(self):
        return "<dataset of coloader producer %r: %d samples>" % (self._loader.name, len(self))


class _Sampler:
    """What `loader.sampler` is: len() is the samples this consumer gets per epoch (its rank's
    share, as a DistributedSampler's), and set_epoch() is accepted: the producer's epochs already
    differ (its permutation is a function of its seed and the epoch), so there is nothing to set."""

    def __init__(self, loader):
        self._loader = loader
        self.epoch = 0

    def set_epoch(self, epoch):
        self.epoch = int(epoch)

    def __len__(self):
        loader = self._loader
        n = loader.epoch_samples
        if loader.world_size > 1:
            return len(loader) * loader.batch_size if loader.drop_last else -(-n // loader.world_size)
        return n // loader.batch_size * loader.batch_size if loader.drop_last else n
