"""ctypes bindings of the two C ABIs, and the error classes: client/c_api.h (the consumer,
libcoloader_c.so) and producer/c_api.h (the producer fed by the caller,
libcoloader_producer_c.so, loaded only by coloader.Producer: a training job that only reads
batches never loads the decoders or OpenCV).

Why ctypes and not a compiled extension module: the package then contains no code built
against one CPython's headers. The same libcoloader_c.so works under any CPython 3.x
(Debian's 3.11 here, the GPU machine's 3.12 with PyTorch 2.11) and needs no Python headers,
nanobind or pybind11 at build time; the cost is one foreign call per batch, which is
negligible next to a batch's size.

Each library is looked for, in order:
  1. $COLOADER_LIBRARY or $COLOADER_PRODUCER_LIBRARY (a path to the .so),
  2. next to this package (the copy `pip install` puts there),
  3. $COLOADER_BUILD_DIR/client/ or /producer/,
  4. the source tree's build directory, <repo>/build/client/ or /producer/.
It is loaded on first use, so `import coloader` works without it. On loading, the sizes of the
structs laid out below are checked against the library's own (coloader_struct_size), so a
package and a library of different versions fail at once instead of corrupting memory.
"""

import atexit
import ctypes
import logging
import os
import sys
import threading
import time
from pathlib import Path

LIBRARY_NAME = "libcoloader_c.so"
PRODUCER_LIBRARY_NAME = "libcoloader_producer_c.so"

# enum coloader_error
OK = 0
END = 1
AGAIN = 2  # a bounded wait ended before anything came: call again
E_INVALID = -1
E_NOT_FOUND = -2
E_IO = -3
E_PROTOCOL = -4
E_TIMEOUT = -5
E_DISCONNECTED = -6
E_INTERNAL = -7
E_GROUP_BROKEN = -8
E_DETACHED = -9


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
    """The stream ended before the producer served its epochs: it stopped or died
    (ProducerStopped), detached this consumer (ConsumerDetached), or the group broke
    (GroupBroken). A producer that served every epoch is not this: its stream just ends."""


class ProducerStopped(ProducerGone):
    """The producer was stopped (SIGTERM, SIGINT), killed (SIGKILL, the OOM killer) or crashed, or
    cannot be reached, before it served every epoch. The message names it, its pid, how it ended
    and the epoch and sample where this consumer's stream stopped; the cut epoch is partial."""


class ConsumerDetached(ProducerGone):
    """The producer detached this consumer: it held the others back (stopped reading, or kept
    batches that could not be copied away), went silent, or broke the protocol. The message says
    which and what to do."""


class Timeout(ColoaderError, TimeoutError):
    """No batch (or no handshake) within the timeout. The message says what the producer waits
    for: a consumer that holds it back (named), more consumers, or its own decoding."""


class ProtocolError(ColoaderError):
    """The producer broke the wire protocol or speaks another version of it."""


class GroupBroken(ProducerGone):
    """A member of this consumer's group (a rank of the same DDP job) left; the group's run is over."""


class LibraryNotFound(ColoaderError, OSError):
    """libcoloader_c.so could not be found or loaded."""


_ERRORS = {
    E_INVALID: InvalidArgument,
    E_NOT_FOUND: ProducerNotFound,
    E_IO: ColoaderError,
    E_PROTOCOL: ProtocolError,
    E_TIMEOUT: Timeout,
    E_DISCONNECTED: ProducerStopped,
    E_INTERNAL: ColoaderError,
    E_GROUP_BROKEN: GroupBroken,
    E_DETACHED: ConsumerDetached,
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
        # appended after those: consumer groups, topology, a saved state's expectations, resume
        ("group", ctypes.c_char_p),
        ("rank", ctypes.c_uint32),
        ("world_size", ctypes.c_uint32),
        ("node_rank", ctypes.c_int32),
        ("num_nodes", ctypes.c_int32),
        ("has_expect_seed", ctypes.c_int32),
        ("expect_seed", ctypes.c_uint64),
        ("expect_data_key", ctypes.c_char_p),
        ("resume", ctypes.c_int32),
        ("resume_epoch", ctypes.c_uint64),
        ("resume_begin", ctypes.c_uint64),
        ("resume_samples", ctypes.c_uint64),
        ("zero_copy", ctypes.c_int32),  # appended after those: views of the producer's memory itself
        ("group_wait_ms", ctypes.c_int32),
        ("resume_origin", ctypes.c_uint64),  # appended after it: a caught-up group's saved state
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


MAX_FIELD_DIMS = 8
MAX_FIELDS = 256  # kMaxFields: tensors in a caller-fed producer's batch
FIELD_ON_HOST = 1  # COLOADER_FIELD_ON_HOST


class Field(ctypes.Structure):
    """coloader_field: one tensor of a caller-fed producer's schema."""
    _fields_ = [
        ("path", ctypes.c_char_p),
        ("dtype", ctypes.c_uint32),
        ("ndim", ctypes.c_uint32),
        ("shape", ctypes.c_int64 * MAX_FIELD_DIMS),
        ("flags", ctypes.c_uint32),  # FIELD_ON_HOST
    ]


class ProducerOptions(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("batch_size", ctypes.c_uint32),
        ("fields", ctypes.POINTER(Field)),
        ("num_fields", ctypes.c_uint32),
        ("structure", ctypes.c_char_p),
        ("on_device", ctypes.c_int32),
        ("device", ctypes.c_int32),
        ("window", ctypes.c_uint32),
        ("min_consumers", ctypes.c_uint32),
        ("epoch_samples", ctypes.c_uint64),
        ("heartbeat_ms", ctypes.c_int32),
        ("heartbeat_timeout_ms", ctypes.c_int32),
        ("tcp_endpoint", ctypes.c_char_p),
        ("curve_key_file", ctypes.c_char_p),
        ("authorized_keys_file", ctypes.c_char_p),
        ("insecure", ctypes.c_int32),
        ("alone_timeout_ms", ctypes.c_int32),
    ]


def _package_dir():
    return Path(__file__).resolve().parent


def _candidates(library, env_var, subdir):
    env = os.environ.get(env_var)
    if env:
        # An explicit choice is the only one tried: a wrong path should fail, not be ignored.
        return [Path(env)]
    found = [_package_dir() / library]
    build_dir = os.environ.get("COLOADER_BUILD_DIR")
    if build_dir:
        found.append(Path(build_dir) / subdir / library)
    found.append(_package_dir().parent.parent / "build" / subdir / library)
    return found


def find_library(library: str = LIBRARY_NAME) -> str:
    """The path of `library` (the consumer's by default) that loading would use; LibraryNotFound if none."""
    env_var, subdir = (("COLOADER_PRODUCER_LIBRARY", "producer") if library == PRODUCER_LIBRARY_NAME
                       else ("COLOADER_LIBRARY", "client"))
    tried = _candidates(library, env_var, subdir)
    for path in tried:
        if path.is_file():
            return path
    raise LibraryNotFound(
        "cannot find " + library + "; looked at: " + ", ".join(str(p) for p in tried)
        + ". Install the package (pip install ./python), build the tree (cmake -S . -B build && "
        "cmake --build build), or set " + env_var + " to the library's path.",
        E_NOT_FOUND)


_lib = None
_producer_lib = None
_lock = threading.Lock()


# What the libraries say besides errors, each to its logger once the program has configured
# logging (at the library's levels), else to stderr as the library itself would write it:
# - the consumer library's messages (coloader_set_log_handler: "waiting up to 60 s for producer
#   ..." is INFO) to "coloader", as "coloader: MESSAGE";
# - the producer's lines (coloader_producer_set_log_handler: consumers coming and going, decode
#   choices, skipped files, how the run ended) to "coloader.producer", after the local date and
#   time as `coloader serve` writes them.
_LOG_HANDLER = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
logger = logging.getLogger("coloader")
producer_logger = logging.getLogger("coloader.producer")


def _with_time(text):
    now = time.time()
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now)) + ".%03d " % int(now % 1 * 1000) + text


def _log_handler(to, as_stderr_line):
    def handle(level, message, _user):
        text = message.decode(errors="replace")
        if to.hasHandlers():
            to.log(level, text)
        else:
            print(as_stderr_line(text), file=sys.stderr, flush=True)
    return _LOG_HANDLER(handle)


# Kept alive as long as the libraries may call them.
_log_callback = _log_handler(logger, lambda text: "coloader: " + text)
_producer_log_callback = _log_handler(producer_logger, _with_time)


def _stop_logging_to_python(set_handler):
    # At exit, before the interpreter goes: a library thread still running then writes to
    # stderr instead of calling into a finalising Python.
    set_handler(_LOG_HANDLER(), None)


def _declare(lib):
    c_consumer_p = ctypes.c_void_p
    c_batch_p = ctypes.c_void_p
    protos = {
        "coloader_last_error": (ctypes.c_char_p, []),
        "coloader_version": (ctypes.c_char_p, []),
        "coloader_set_log_handler": (None, [_LOG_HANDLER, ctypes.c_void_p]),
        "coloader_consumer_open": (ctypes.c_int, [ctypes.POINTER(ConsumerOptions),
                                                  ctypes.POINTER(c_consumer_p)]),
        "coloader_consumer_open_start": (ctypes.c_int, [ctypes.POINTER(ConsumerOptions),
                                                        ctypes.POINTER(c_consumer_p)]),
        "coloader_consumer_open_wait": (ctypes.c_int, [c_consumer_p, ctypes.c_int32]),
        "coloader_consumer_next_epoch": (ctypes.c_int, [c_consumer_p]),
        "coloader_consumer_next_epoch_wait": (ctypes.c_int, [c_consumer_p, ctypes.c_int32]),
        "coloader_consumer_next_batch_wait": (ctypes.c_int, [c_consumer_p, ctypes.c_void_p, ctypes.c_int32,
                                                             ctypes.POINTER(c_batch_p)]),
        "coloader_consumer_finished": (ctypes.c_int32, [c_consumer_p]),
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
        "coloader_consumer_seed": (ctypes.c_uint64, [c_consumer_p]),
        "coloader_consumer_data_key": (ctypes.c_char_p, [c_consumer_p]),
        "coloader_consumer_node_rank": (ctypes.c_int32, [c_consumer_p]),
        "coloader_consumer_num_nodes": (ctypes.c_int32, [c_consumer_p]),
        "coloader_consumer_num_classes": (ctypes.c_uint32, [c_consumer_p]),
        "coloader_consumer_class_name": (ctypes.c_char_p, [c_consumer_p, ctypes.c_uint32]),
        "coloader_consumer_no_catch_up": (ctypes.c_char_p, [c_consumer_p]),
        "coloader_consumer_split_begin": (ctypes.c_uint64, [c_consumer_p]),
        "coloader_consumer_split_origin": (ctypes.c_uint64, [c_consumer_p]),
        "coloader_consumer_samples_seen": (ctypes.c_uint64, [c_consumer_p]),
        "coloader_consumer_resume": (ctypes.c_int, [c_consumer_p, ctypes.c_uint64, ctypes.c_uint64,
                                                    ctypes.c_uint64]),
        "coloader_consumer_resume_origin": (ctypes.c_int, [c_consumer_p, ctypes.c_uint64, ctypes.c_uint64,
                                                           ctypes.c_uint64, ctypes.c_uint64]),
        "coloader_consumer_resume_note": (ctypes.c_char_p, [c_consumer_p]),
        "coloader_consumer_close": (None, [c_consumer_p]),
        "coloader_consumer_num_fields": (ctypes.c_uint32, [c_consumer_p]),
        "coloader_consumer_field": (ctypes.c_int, [c_consumer_p, ctypes.c_uint32, ctypes.POINTER(Field)]),
        "coloader_consumer_structure": (ctypes.c_char_p, [c_consumer_p]),
        "coloader_batch_info_get": (ctypes.c_int, [c_batch_p, ctypes.POINTER(BatchInfo)]),
        "coloader_batch_field": (ctypes.c_void_p, [c_batch_p, ctypes.c_uint32]),
        "coloader_batch_host_field": (ctypes.c_void_p, [c_batch_p, ctypes.c_uint32]),
        "coloader_batch_fields": (ctypes.c_int, [c_batch_p, ctypes.c_uint32, ctypes.POINTER(ctypes.c_void_p)]),
        "coloader_batch_release": (None, [c_batch_p]),
        "coloader_struct_size": (ctypes.c_size_t, [ctypes.c_char_p]),
        "coloader_dtype_name": (ctypes.c_char_p, [ctypes.c_uint32]),
        "coloader_layout_name": (ctypes.c_char_p, [ctypes.c_uint32]),
    }
    _set_prototypes(lib, protos)
    _check_sizes(lib.coloader_struct_size, {"consumer_options": ConsumerOptions, "batch_info": BatchInfo,
                                            "field": Field})
    lib.coloader_set_log_handler(_log_callback, None)
    atexit.register(_stop_logging_to_python, lib.coloader_set_log_handler)


def _declare_producer(lib):
    protos = {
        "coloader_producer_last_error": (ctypes.c_char_p, []),
        "coloader_producer_struct_size": (ctypes.c_size_t, [ctypes.c_char_p]),
        "coloader_producer_set_log_handler": (None, [_LOG_HANDLER, ctypes.c_void_p]),
        "coloader_producer_open": (ctypes.c_int, [ctypes.POINTER(ProducerOptions), ctypes.POINTER(ctypes.c_void_p)]),
        "coloader_producer_publish": (ctypes.c_int, [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p),
                                                     ctypes.c_uint32, ctypes.c_void_p]),
        "coloader_producer_wait": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_int32]),
        "coloader_producer_end_epoch": (ctypes.c_int, [ctypes.c_void_p]),
        "coloader_producer_tcp_endpoint": (ctypes.c_char_p, [ctypes.c_void_p]),
        "coloader_producer_finish": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_int32]),
        "coloader_producer_fail": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_char_p]),
        "coloader_producer_close": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_int32]),
        "coloader_recipe_image_size": (ctypes.c_int, [ctypes.c_char_p, ctypes.POINTER(ctypes.c_int32)]),
        "coloader_recipe_apply": (ctypes.c_int, [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_int32, ctypes.c_int32,
                                                 ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_int32,
                                                 ctypes.c_void_p]),
        "coloader_augment_op": (ctypes.c_int, [ctypes.c_char_p, ctypes.c_double, ctypes.c_void_p, ctypes.c_int32,
                                               ctypes.c_int32, ctypes.c_void_p]),
    }
    _set_prototypes(lib, protos)
    _check_sizes(lib.coloader_producer_struct_size, {"producer_options": ProducerOptions, "field": Field})
    lib.coloader_producer_set_log_handler(_producer_log_callback, None)
    atexit.register(_stop_logging_to_python, lib.coloader_producer_set_log_handler)


def _set_prototypes(lib, protos):
    for name, (restype, argtypes) in protos.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes


def _check_sizes(struct_size, structs):
    for name, struct in structs.items():
        theirs = struct_size(name.encode())
        if theirs != ctypes.sizeof(struct):
            raise AttributeError("the library's %s is %d bytes, this package's %d: the package and the "
                                 "library come from different versions; reinstall them together"
                                 % (name, theirs, ctypes.sizeof(struct)))


def _load(library, declare):
    path = find_library(library)
    try:
        loaded = ctypes.CDLL(str(path))
        declare(loaded)
    except (OSError, AttributeError) as e:
        raise LibraryNotFound("cannot load " + str(path) + ": " + str(e), E_INTERNAL) from e
    return loaded


def lib():
    """The consumer's library (ctypes.CDLL: every call releases the GIL while it runs)."""
    global _lib
    if _lib is None:
        with _lock:
            if _lib is None:
                _lib = _load(LIBRARY_NAME, _declare)
    return _lib


def producer_lib():
    """The producer's library, loaded on first use by coloader.Producer."""
    global _producer_lib
    if _producer_lib is None:
        with _lock:
            if _producer_lib is None:
                _producer_lib = _load(PRODUCER_LIBRARY_NAME, _declare_producer)
    return _producer_lib


def _raise(rc, message):
    message = message.decode("utf-8", "replace") if message else "unknown error (code %d)" % rc
    raise _ERRORS.get(rc, ColoaderError)(message, rc)


def check(rc):
    """Returns rc when it is OK, END or AGAIN; raises the matching ColoaderError otherwise."""
    if rc < 0:
        _raise(rc, lib().coloader_last_error())
    return rc


# How long one call into the library may block. Python runs its signal handlers (Ctrl-C's
# KeyboardInterrupt) only between bytecodes, never while a foreign call blocks: every wait is
# therefore made of calls of at most this long, as torch's DataLoader waits on its workers.
WAIT_SLICE_MS = 100


def wait(call):
    """Repeats `call(WAIT_SLICE_MS)` (a library wait that returns AGAIN when that many ms passed;
    the library keeps the overall deadline) until it gives an outcome, which check() returns or
    raises. A signal handler's exception (KeyboardInterrupt) surfaces between the calls."""
    while True:
        rc = call(WAIT_SLICE_MS)
        if rc != AGAIN:
            return check(rc)


def check_producer(rc):
    """check() for the producer's library, whose last error is its own."""
    if rc < 0:
        _raise(rc, producer_lib().coloader_producer_last_error())
    return rc


def wait_producer(call):
    """wait() for the producer's library."""
    while True:
        rc = call(WAIT_SLICE_MS)
        if rc != AGAIN:
            return check_producer(rc)


def dtype_names():
    """{code: name} of the C ABI's dtypes, read from the library ("uint8", "float32", ...)."""
    return _names(lib().coloader_dtype_name)


def layout_names():
    """{code: name} of the C ABI's layouts ("nhwc", "nchw")."""
    return _names(lib().coloader_layout_name)


def _names(fn):
    out, code = {}, 0
    while True:
        name = fn(code)
        if name is None:
            return out
        out[code] = name.decode()
        code += 1


def version() -> str:
    """The C library's version string."""
    return lib().coloader_version().decode()
