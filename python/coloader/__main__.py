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

`serve --transform recipe.py` runs the file here and hands the binary the translation of the
Compose it binds to `transform` (coloader.transforms). `serve --resume CKPT --resume-key KEY` reads a torch checkpoint here (the binary reads JSON
only) and hands the binary the Loader state found under KEY; see resume_from_checkpoint.
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
    try:
        args = resume_from_checkpoint(args)
        args = recipe_from_python(args)
    except ValueError as e:  # UnsupportedOp too
        sys.stderr.write("coloader serve: %s\n" % e)
        return 2
    os.execv(str(path), [str(path)] + args)
    return 0  # not reached


def _option(args, flag):
    """Where `flag` is in `args` as (its index, its value's index, the value): `--flag V` or
    `--flag=V` (both indices the same); (None, None, None) if absent."""
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            return i, i + 1, args[i + 1]
        if a.startswith(flag + "="):
            return i, i, a[len(flag) + 1:]
    return None, None, None


# What `serve --resume CKPT` builds of a checkpoint's pickle besides pickle's own types: an
# OrderedDict (a state_dict) and bytes as protocol 2 writes them (_codecs.encode: a numpy RNG
# state's). Every other global (a tensor's rebuild, a dtype, a numpy array, an argparse.Namespace,
# a set, anything else) becomes an _Opaque stand-in, never imported nor called, so nothing of the
# file's choosing runs and nothing it names can be made large (frozenset(range(2**40))).
_PLAIN_GLOBALS = {("collections", "OrderedDict"), ("_codecs", "encode")}
_MAX_PICKLE_BYTES = 64 << 20  # a checkpoint's pickle is its structure: the tensors lie beside it


class _Opaque:
    """Stands for what the Loader's state does not need: made from any arguments, given any
    state or items, and never run."""

    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        return _Opaque()

    def __setstate__(self, state):
        pass

    def __setitem__(self, key, value):
        pass

    def append(self, value):
        pass

    def extend(self, values):
        pass


def _read_checkpoint(path):
    """The object a torch checkpoint (torch.save's zip format) holds, everything but plain values
    and containers replaced by _Opaque stand-ins: read on any torch or none (torch 1.13's
    weights-only loader cannot read a float, and so failed on every optimizer state), and safe
    with a file of anyone's making. Errors name the file and say how to give the state instead."""
    import io
    import pickle
    import zipfile

    try:
        with zipfile.ZipFile(path) as z:
            pickles = [i for i in z.infolist() if i.filename == "data.pkl" or i.filename.endswith("/data.pkl")]
            if not pickles:
                raise ValueError("--resume %s: a zip file without a data.pkl, not a torch checkpoint" % path)
            info = min(pickles, key=lambda i: len(i.filename))
            if info.file_size > _MAX_PICKLE_BYTES:
                raise ValueError("--resume %s: its data.pkl is %d bytes, more than a checkpoint's structure takes "
                                 "(%d at most)" % (path, info.file_size, _MAX_PICKLE_BYTES))
            data = z.read(info)
    except ValueError:
        raise
    except FileNotFoundError:
        raise ValueError("--resume %s: no such file" % path) from None
    except Exception as e:  # not a zip, a directory, unreadable, encrypted, damaged, another compression
        raise ValueError("--resume %s: not a torch checkpoint that can be read (torch.save writes a zip file; "
                         "%s: %s); give the Loader's state as JSON: --resume FILE.json"
                         % (path, type(e).__name__, e)) from None

    class Unpickler(pickle.Unpickler):
        def find_class(self, module, name):
            return super().find_class(module, name) if (module, name) in _PLAIN_GLOBALS else _Opaque

        def persistent_load(self, pid):  # a tensor's storage, kept in the zip beside the pickle
            return _Opaque()

    try:
        return Unpickler(io.BytesIO(data)).load()
    except Exception as e:
        raise ValueError("--resume %s: cannot read its pickle (%s); give the Loader's state as JSON "
                         "(json.dump(loader.state_dict(), f)): --resume FILE.json" % (path, e)) from None


def resume_from_checkpoint(args):
    """`serve --resume CKPT --resume-key KEY` with a torch checkpoint (what a training script saves
    with torch.save({"model": ..., "loader": loader.state_dict()}, path)): the Loader's state under
    KEY (dotted for nesting: "state.loader") goes to the binary through a pipe, as the JSON it
    reads, so nothing is left behind. Other arguments pass unchanged."""
    if not args or args[0] != "serve":
        return args
    key_flag, key_value, key = _option(args, "--resume-key")
    state_flag, state_value, state_path = _option(args, "--resume")
    if key is None:
        return args
    if state_path is None:
        raise ValueError("--resume-key %s names a key in a --resume checkpoint: give --resume CKPT too" % key)
    import json

    ckpt = _read_checkpoint(state_path)
    state = ckpt
    for part in key.split("."):
        if not isinstance(state, dict) or part not in state:
            have = ", ".join(sorted(map(str, state))) if isinstance(state, dict) else type(state).__name__
            raise ValueError("--resume %s has no %r (looking up --resume-key %s; there: %s)"
                             % (state_path, part, key, have))
        state = state[part]
    if not isinstance(state, dict) or "samples_seen_in_epoch" not in state:
        raise ValueError("--resume %s: %r is not a coloader.Loader state_dict()" % (state_path, key))
    try:
        text = json.dumps(state)
    except (TypeError, ValueError, RecursionError) as e:  # a tensor or an object where plain values go
        raise ValueError("--resume %s: %r is not a coloader.Loader state_dict() (%s)" % (state_path, key, e)) from None
    read, write = os.pipe()
    with os.fdopen(write, "w") as f:  # a state is a few hundred bytes: the pipe holds it
        f.write(text)
    os.set_inheritable(read, True)
    out = list(args)
    out[state_value] = ("--resume=" if state_flag == state_value else "") + "/dev/fd/%d" % read
    return [a for i, a in enumerate(out) if i not in (key_flag, key_value)]


def _to_binary(value):
    """`value` (a small JSON text) as a path the binary reads: the read end of a pipe that it
    inherits, so that nothing is left behind."""
    read, write = os.pipe()
    with os.fdopen(write, "w") as f:  # a few KB at most: the pipe holds it
        f.write(value)
    os.set_inheritable(read, True)
    return "/dev/fd/%d" % read


def recipe_from_python(args):
    """`serve --transform recipe.py`: the file binds `transform` to a torchvision Compose; its
    native recipe (coloader.transforms.translate) goes to the binary as JSON. Other arguments
    pass unchanged."""
    if not args or args[0] != "serve":
        return args
    flag, value_at, path = _option(args, "--transform")
    if path is None or not path.endswith(".py"):
        return args
    if not os.path.isfile(path):
        raise ValueError("--transform %s: no such file" % path)
    from . import transforms

    recipe = transforms.to_json(transforms.load_python(path))
    out = list(args)
    out[value_at] = ("--transform=" if flag == value_at else "") + _to_binary(recipe)
    return out


if __name__ == "__main__":
    sys.exit(main())
