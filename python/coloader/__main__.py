"""`python -m coloader serve|consume|status ...` and the `coloader` console script.

Runs the C++ `coloader` command line. The process is replaced by the binary (os.execv), so
signals, exit status and output are exactly the binary's. It is looked for, in order:
$COLOADER_BINARY, next to this package (bin/coloader, where the wheel puts it),
$COLOADER_BUILD_DIR/tools/coloader, and the source tree's build/tools/coloader.

`--decode gpu` opens nvJPEG (libnvjpeg.so.13) at run time. PyTorch environments often have it
from PyPI's `nvidia-nvjpeg` wheel (nvidia/cu13/lib/libnvjpeg.so.13), in whichever site-packages
pip put it. The binary finds it by itself when that is the site-packages holding this package;
for any other location on sys.path this launcher hands the path over in _COLOADER_NVJPEG_WHEEL,
an internal variable (the binary adds it to its candidates after the CUDA installs; users set
COLOADER_NVJPEG_LIBRARY instead, which wins over everything).
"""

import importlib.util
import os
import sys
from pathlib import Path

NVJPEG_IN_WHEEL = Path("cu13") / "lib" / "libnvjpeg.so.13"


def find_binary():
    """The path of the `coloader` executable, or None, and the places tried."""
    env = os.environ.get("COLOADER_BINARY")
    package = Path(__file__).resolve().parent
    tried = []
    if env:
        tried.append(Path(env))
    else:
        tried.append(package / "bin" / "coloader")
        if os.environ.get("COLOADER_BUILD_DIR"):
            tried.append(Path(os.environ["COLOADER_BUILD_DIR"]) / "tools" / "coloader")
        tried.append(package.parent.parent / "build" / "tools" / "coloader")
    for path in tried:
        if path.is_file() and os.access(path, os.X_OK):
            return path, tried
    return None, tried


def find_nvjpeg_wheel():
    """libnvjpeg.so.13 from an installed nvidia-nvjpeg wheel, or None.

    `nvidia` is a namespace package (no __init__.py): its search locations are every
    site-packages directory that holds an nvidia-* wheel. Nothing is imported.
    """
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        return None
    for location in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(location) / NVJPEG_IN_WHEEL
        if candidate.is_file():
            return candidate
    return None


def main(argv=None):
    args = list(sys.argv[1:] if argv is None else argv)
    path, tried = find_binary()
    if path is None:
        sys.stderr.write(
            "coloader: cannot find the `coloader` executable; looked at: %s.\n"
            "Install the wheel (scripts/build_wheel.sh, then pip install dist/coloader-*.whl), build the "
            "tree (cmake -S . -B build && cmake --build build), or set COLOADER_BINARY to its path.\n"
            % ", ".join(str(p) for p in tried))
        return 127
    nvjpeg = find_nvjpeg_wheel()
    if nvjpeg is not None:
        os.environ["_COLOADER_NVJPEG_WHEEL"] = str(nvjpeg)
    os.execv(str(path), [str(path)] + args)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
