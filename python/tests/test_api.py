"""The package's public surface: how Loader and Producer take their arguments, the one version of
a release, and the type information. Needs no producer and no torch."""

import importlib.util
import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest

PYTHON_DIR = Path(__file__).resolve().parents[1]
REPO = PYTHON_DIR.parent
sys.path.insert(0, str(PYTHON_DIR))  # test the source tree, not an installed copy
import coloader  # noqa: E402


@pytest.mark.parametrize("cls, positional", [(coloader.Loader, ["name", "batch_size"]),
                                             (coloader.Producer, ["iterable", "name", "batch_size"])])
def test_everything_after_the_name_and_batch_size_is_keyword_only(cls, positional):
    params = [p for p in inspect.signature(cls.__init__).parameters.values() if p.name != "self"]
    assert [p.name for p in params if p.kind == p.POSITIONAL_OR_KEYWORD] == positional
    rest = [p for p in params if p.kind not in (p.POSITIONAL_OR_KEYWORD, p.VAR_KEYWORD)]
    assert rest and all(p.kind == p.KEYWORD_ONLY for p in rest), rest


def test_a_dataloader_style_third_positional_argument_is_refused_not_taken_for_another():
    # DataLoader's third positional is shuffle; Loader's was drop_last. Now it is an error.
    with pytest.raises(TypeError, match="positional"):
        coloader.Loader("imagenet", 128, True)


def test_one_version_from_the_cmake_project():
    cmake = re.search(r"project\(coloader VERSION ([0-9][0-9.]*)", (REPO / "CMakeLists.txt").read_text()).group(1)
    assert coloader.__version__ == cmake
    assert coloader.library_version() == cmake
    # `python -m coloader --version` runs the binary, which says the same.
    out = subprocess.run([sys.executable, "-m", "coloader", "--version"], capture_output=True, text=True,
                         timeout=60, cwd=REPO / "python")
    assert out.returncode == 0, out
    assert out.stdout.strip() == "coloader " + cmake


def test_the_package_says_it_is_typed():
    assert (Path(importlib.util.find_spec("coloader").origin).parent / "py.typed").is_file()


def _public_callables():
    """The functions and methods a user calls: those of coloader's __all__ (and the classes'
    public methods and properties), and coloader.transforms' public functions."""
    import coloader.transforms as transforms
    out = []
    for owner, names in ((coloader, coloader.__all__), (transforms, [n for n in vars(transforms) if not n.startswith("_")])):
        for name in names:
            obj = getattr(owner, name)
            if inspect.isfunction(obj) and obj.__module__.startswith("coloader"):
                out.append(("%s.%s" % (owner.__name__, name), obj))
            elif inspect.isclass(obj) and obj.__module__.startswith("coloader") and not issubclass(obj, BaseException):
                for attr, member in vars(obj).items():
                    if attr.startswith("_") and attr != "__init__":
                        continue
                    fn = member.fget if isinstance(member, property) else member
                    if inspect.isfunction(fn):
                        out.append(("coloader.%s.%s" % (name, attr), fn))
    return out


def test_every_public_function_and_method_states_its_types():
    # Issue 43: 5 return annotations in 16 modules; a user's type checker saw Any everywhere.
    callables = _public_callables()
    assert len(callables) > 30, [n for n, _ in callables]
    missing = []
    for name, fn in callables:
        sig = inspect.signature(fn)
        if sig.return_annotation is inspect.Signature.empty:
            missing.append(name + " -> ?")
        for p in sig.parameters.values():
            if p.annotation is inspect.Parameter.empty and p.name != "self" and \
                    p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                missing.append("%s(%s)" % (name, p.name))
    assert not missing, missing
