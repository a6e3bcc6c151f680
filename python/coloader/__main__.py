"""`python -m coloader serve|consume|status ...`: runs the C++ `coloader` command line.

The process is replaced by the binary (os.execv), so signals, exit status and output are
exactly the binary's. It is looked for, in order: $COLOADER_BINARY, next to this package
(bin/coloader, where `pip install` puts it), $COLOADER_BUILD_DIR/server/coloader, and the
source tree's build/server/coloader.
"""

import os
import sys
from pathlib import Path


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
            tried.append(Path(os.environ["COLOADER_BUILD_DIR"]) / "server" / "coloader")
        tried.append(package.parent.parent / "build" / "server" / "coloader")
    for path in tried:
        if path.is_file() and os.access(path, os.X_OK):
            return path, tried
    return None, tried


def main(argv=None):
    args = list(sys.argv[1:] if argv is None else argv)
    path, tried = find_binary()
    if path is None:
        sys.stderr.write(
            "coloader: cannot find the `coloader` executable; looked at: %s.\n"
            "Install the package with `pip install ./python` (it builds the binary), build the tree "
            "(cmake -S . -B build && cmake --build build), or set COLOADER_BINARY to its path.\n"
            % ", ".join(str(p) for p in tried))
        return 127
    os.execv(str(path), [str(path)] + args)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
