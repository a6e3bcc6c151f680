"""ctypes bindings of the C ABI in client/c_api.h (libcoloader_c.so), and the error classes.

Why ctypes and not a compiled extension module: the package then contains no code built
against one CPython's headers. The same libcoloader_c.so works under any CPython 3.x
(Debian's 3.11 here, the GPU machine's 3.12 with PyTorch 2.11) and needs no Python headers,
nanobind or pybind11 at build time; the cost is one foreign call per batch, which is
negligible next to a batch's size.

The library is looked for, in order:
  1. $COLOADER_LIBRARY (a path to the .so),
  2. next to this package (the copy `pip install` puts there),
  3. $COLOADER_BUILD_DIR/client/libcoloader_c.so,
  4. the source tree's build directory, <repo>/build/client/libcoloader_c.so.
It is loaded on first use, so `import coloader` works without it.
"""

import ctypes
import os
import threading
from pathlib import Path

LIBRARY_NAME = "libcoloader_c.so"

# enum coloader_error
OK = 0
END = 1
E_INVALID = -1
E_NOT_FOUND = -2
E_IO = -3
E_PROTOCOL = -4
E_TIMEOUT = -5
E_DISCONNECTED = -6
E_INTERNAL = -7


class ColoaderError(RuntimeError):
    """Base class of every coloader error; `code` is the C API's coloader_error value."""

    def __init__(self, message, code=E_INTERNAL):
        super().__init__(message)
        self.code = code


class InvalidArgument(ColoaderError, ValueError):
    """A value given to coloader was wrong (an option, a producer name)."""


class ProducerNotFound(ColoaderError):
    """No producer of that name is running (start one with `coloader serve --name ...`)."""


class ProducerGone(ColoaderError):
    """The producer died, stopped unexpectedly, or detached this consumer."""


class Timeout(ColoaderError, TimeoutError):
    """No batch (or no handshake) within the timeout; the producer is alive but slow."""


class ProtocolError(ColoaderError):
    """The producer broke the wire protocol or speaks another version of it."""


class LibraryNotFound(ColoaderError, OSError):
    """libcoloader_c.so could not be found or loaded."""


_ERRORS = {
    E_INVALID: InvalidArgument,
    E_NOT_FOUND: ProducerNotFound,
    E_IO: ColoaderError,
    E_PROTOCOL: ProtocolError,
    E_TIMEOUT: Timeout,
    E_DISCONNECTED: ProducerGone,
    E_INTERNAL: ColoaderError,
}


class ConsumerOptions(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("endpoint", ctypes.c_char_p),
        ("batch_size", ctypes.c_uint32),
        ("drop_last", ctypes.c_int32),
        ("wait_for_epoch", ctypes.c_int32),
        ("connect_timeout_ms", ctypes.c_int32),
        ("timeout_ms", ctypes.c_int32),
        ("client_name", ctypes.c_char_p),
        ("device", ctypes.c_int32),  # appended in the C struct: nonzero asks for the device path
        ("wait_for_producer_ms", ctypes.c_int32),  # appended after it
        ("curve_key_file", ctypes.c_char_p),       # appended after that: tcp:// with CURVE
        ("curve_server_key", ctypes.c_char_p),
    ]


class BatchInfo(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("indices", ctypes.c_void_p),
        ("labels", ctypes.c_void_p),
        ("size", ctypes.c_uint32),
        ("dtype", ctypes.c_uint32),
        ("layout", ctypes.c_uint32),
        ("ndim", ctypes.c_uint32),
        ("shape", ctypes.c_int64 * 4),
        ("bytes", ctypes.c_uint64),
        ("epoch", ctypes.c_uint64),
        ("device", ctypes.c_int32),
        ("gathered", ctypes.c_int32),
        ("device_labels", ctypes.c_void_p),  # appended last in the C struct; NULL on the host path
    ]


class ProducerOptions(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("batch_size", ctypes.c_uint32),
        ("ndim", ctypes.c_uint32),
        ("sample_shape", ctypes.c_int64 * 3),
        ("dtype", ctypes.c_uint32),
        ("window", ctypes.c_uint32),
        ("min_consumers", ctypes.c_uint32),
        ("epoch_samples", ctypes.c_uint64),
        ("heartbeat_ms", ctypes.c_int32),
        ("heartbeat_timeout_ms", ctypes.c_int32),
        ("tcp_endpoint", ctypes.c_char_p),
        ("curve_key_file", ctypes.c_char_p),
        ("authorized_keys_file", ctypes.c_char_p),
        ("insecure", ctypes.c_int32),
    ]


def _package_dir():
    return Path(__file__).resolve().parent


def _candidates():
    env = os.environ.get("COLOADER_LIBRARY")
    if env:
        # An explicit choice is the only one tried: a wrong path should fail, not be ignored.
        return [Path(env)]
    found = [_package_dir() / LIBRARY_NAME]
    build_dir = os.environ.get("COLOADER_BUILD_DIR")
    if build_dir:
        found.append(Path(build_dir) / "client" / LIBRARY_NAME)
    found.append(_package_dir().parent.parent / "build" / "client" / LIBRARY_NAME)
    return found


def find_library():
    """The path of libcoloader_c.so that load() would use; LibraryNotFound if none."""
    tried = _candidates()
    for path in tried:
        if path.is_file():
            return path
    raise LibraryNotFound(
        "cannot find " + LIBRARY_NAME + "; looked at: " + ", ".join(str(p) for p in tried)
        + ". Install the package (pip install ./python), build the tree (cmake -S . -B build && "
        "cmake --build build), or set COLOADER_LIBRARY to the library's path.",
        E_NOT_FOUND)


_lib = None
_lock = threading.Lock()


def _declare(lib):
    c_consumer_p = ctypes.c_void_p
    c_batch_p = ctypes.c_void_p
    protos = {
        "coloader_last_error": (ctypes.c_char_p, []),
        "coloader_version": (ctypes.c_char_p, []),
        "coloader_consumer_open": (ctypes.c_int, [ctypes.POINTER(ConsumerOptions),
                                                  ctypes.POINTER(c_consumer_p)]),
        "coloader_consumer_next_epoch": (ctypes.c_int, [c_consumer_p]),
        "coloader_consumer_next_batch": (ctypes.c_int, [c_consumer_p, ctypes.POINTER(c_batch_p)]),
        "coloader_consumer_next_batch_on_stream": (ctypes.c_int, [c_consumer_p, ctypes.c_void_p,
                                                                  ctypes.POINTER(c_batch_p)]),
        "coloader_consumer_epoch": (ctypes.c_uint64, [c_consumer_p]),
        "coloader_consumer_partial": (ctypes.c_int32, [c_consumer_p]),
        "coloader_consumer_len": (ctypes.c_uint64, [c_consumer_p]),
        "coloader_consumer_dataset_size": (ctypes.c_uint64, [c_consumer_p]),
        "coloader_consumer_epoch_samples": (ctypes.c_uint64, [c_consumer_p]),
        "coloader_consumer_batch_size": (ctypes.c_uint32, [c_consumer_p]),
        "coloader_consumer_on_device": (ctypes.c_int32, [c_consumer_p]),
        "coloader_consumer_fallback_reason": (ctypes.c_char_p, [c_consumer_p]),
        "coloader_consumer_close": (None, [c_consumer_p]),
        "coloader_batch_info_get": (ctypes.c_int, [c_batch_p, ctypes.POINTER(BatchInfo)]),
        "coloader_batch_release": (None, [c_batch_p]),
        "coloader_producer_open": (ctypes.c_int, [ctypes.POINTER(ProducerOptions), ctypes.POINTER(ctypes.c_void_p)]),
        "coloader_producer_publish": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint32,
                                                     ctypes.c_void_p, ctypes.c_void_p]),
        "coloader_producer_end_epoch": (ctypes.c_int, [ctypes.c_void_p]),
        "coloader_producer_tcp_endpoint": (ctypes.c_char_p, [ctypes.c_void_p]),
        "coloader_producer_close": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_int32]),
    }
    for name, (restype, argtypes) in protos.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes


def lib():
    """The loaded library (ctypes.CDLL: every call releases the GIL while it runs)."""
    global _lib
    if _lib is None:
        with _lock:
            if _lib is None:
                path = find_library()
                try:
                    loaded = ctypes.CDLL(str(path))
                    _declare(loaded)
                except (OSError, AttributeError) as e:
                    raise LibraryNotFound("cannot load " + str(path) + ": " + str(e), E_INTERNAL) from e
                _lib = loaded
    return _lib


def check(rc):
    """Returns rc when it is OK or END; raises the matching ColoaderError otherwise."""
    if rc >= 0:
        return rc
    message = lib().coloader_last_error()
    message = message.decode("utf-8", "replace") if message else "unknown error (code %d)" % rc
    raise _ERRORS.get(rc, ColoaderError)(message, rc)


def version():
    """The C library's version string."""
    return lib().coloader_version().decode()
