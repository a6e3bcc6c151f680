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
from .loader import (DeviceFallbackWarning, FinishedWarning, IgnoredArgumentWarning, Loader, PartialEpochWarning,
                     ResumeWarning)
from .producer import Producer

try:
    from ._version import __version__  # written into the wheel by its build (pyproject.toml)
except ImportError:  # a source checkout

    def _checkout_version():
        import re
        from pathlib import Path

        try:
            text = (Path(__file__).resolve().parents[2] / "CMakeLists.txt").read_text()
        except OSError:
            return "unknown"
        found = re.search(r"project\(coloader VERSION ([0-9][0-9.]*)", text)
        return found.group(1) if found else "unknown"

    __version__ = _checkout_version()

__all__ = [
    "Loader",
    "Producer",
    "DeviceFallbackWarning",
    "FinishedWarning",
    "PartialEpochWarning",
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
