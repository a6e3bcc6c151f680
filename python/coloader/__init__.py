"""coloader: one shared data-loading producer, many collocated PyTorch training jobs.

    import coloader
    loader = coloader.Loader("imagenet", batch_size=96)   # `coloader serve --name imagenet ...`
    for images, labels in loader:                          # one epoch; the batches are the job's own
        ...

This package is pure Python: it talks to the C ABI of the consumer library (libcoloader_c.so)
through ctypes rather than a compiled extension module, so one build of the package works under
any CPython 3.x (Debian's 3.11 on the development machines, 3.12 with PyTorch 2.11 on the GPU
machines) without Python headers at build time. See coloader._lib for where the library is
found, and coloader.loader for iteration, lifetime, isolation and how a stream ends. `python -m coloader`
runs the `coloader` command line (serve, consume, status). The GPU memory estimator is the
subpackage coloader.estimator, which this package does not import.
"""

from ._lib import (
    ColoaderError,
    ConsumerDetached,
    GroupBroken,
    InvalidArgument,
    LibraryNotFound,
    ProducerGone,
    ProducerNotFound,
    ProducerStopped,
    ProtocolError,
    Timeout,
    find_library,
    version as library_version,
)
from .loader import DeviceFallbackWarning, FinishedWarning, IgnoredArgumentWarning, Loader, ResumeWarning
from .producer import Producer

__version__ = "0.1.0"

__all__ = [
    "Loader",
    "Producer",
    "DeviceFallbackWarning",
    "FinishedWarning",
    "IgnoredArgumentWarning",
    "ResumeWarning",
    "ColoaderError",
    "ConsumerDetached",
    "GroupBroken",
    "InvalidArgument",
    "LibraryNotFound",
    "ProducerGone",
    "ProducerNotFound",
    "ProducerStopped",
    "ProtocolError",
    "Timeout",
    "find_library",
    "library_version",
]
