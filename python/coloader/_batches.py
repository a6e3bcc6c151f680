"""What a coloader.Loader hands to Python: the consumer session, one lease per batch, the stream
each device batch is ordered on, and the tensors over a batch's memory (host views through numpy,
device memory through __cuda_array_interface__). Private to the package; coloader.loader says what
the rules are.

Ownership: a batch's one owner object is its BatchLease, which holds the C lease
(coloader_batch*); every array and tensor over the batch holds the lease, so the producer's
slot (or the private buffer) stays until the last of them goes, and the lease is released
exactly once. Each lease holds the Session, so the consumer leaves its producer only when the
Loader is closed and no tensor of it is left.
"""

import ctypes
import json
import warnings

import numpy as np

from . import _lib, _reaper, _structure

# dtype names (the codes come from the library: _lib.dtype_names) -> numpy dtypes of the host
# views. numpy has no bfloat16: its bytes are viewed as int16 and the tensor is reinterpreted
# as torch.bfloat16.
_NUMPY_BY_NAME = {"uint8": np.uint8, "float32": np.float32, "bfloat16": np.int16, "float16": np.float16}
# The same names -> __cuda_array_interface__ typestrs (bfloat16 again as int16: no typestr
# names it, and int16 is what every torch version accepts, unlike uint16).
_TYPESTR_BY_NAME = {"uint8": "|u1", "float32": "<f4", "bfloat16": "<i2", "float16": "<f2"}


def dtype_tables():
    """(numpy dtype by code, typestr by code, the bfloat16 code), read from the library once."""
    global _DTYPE_TABLES
    if _DTYPE_TABLES is None:
        names = _lib.dtype_names()
        _DTYPE_TABLES = ({c: _NUMPY_BY_NAME[n] for c, n in names.items() if n in _NUMPY_BY_NAME},
                         {c: _TYPESTR_BY_NAME[n] for c, n in names.items() if n in _TYPESTR_BY_NAME},
                         next(c for c, n in names.items() if n == "bfloat16"))
    return _DTYPE_TABLES


_DTYPE_TABLES = None
_NHWC_CODE = None


def nhwc_code():
    """The library's code of the NHWC layout."""
    global _NHWC_CODE
    if _NHWC_CODE is None:
        _NHWC_CODE = next(c for c, n in _lib.layout_names().items() if n == "nhwc")
    return _NHWC_CODE


class Session:
    """Owns the coloader_consumer*. Referenced by the Loader and by every live batch lease, so
    the consumer leaves the producer only when the Loader is closed *and* no tensor is left:
    leaving earlier would let the producer reclaim, and overwrite, slots still in use."""

    __slots__ = ("ptr", "streams", "__weakref__")

    def __init__(self, ptr):
        self.ptr = ptr
        self.streams = {}  # device path: the torch streams batches were ordered on, by (device, handle)

    def close(self):
        """Closes now, on this thread (it may wait; see close_session)."""
        ptr, self.ptr = self.ptr, None
        streams, self.streams = self.streams, {}
        close_session(ptr, streams)

    def __del__(self):
        # The garbage collector may run this anywhere: the closing, which waits, goes to the
        # reaper thread (coloader/_reaper.py). The job holds the pointer and the streams, not
        # self, so nothing is resurrected.
        ptr, self.ptr = self.ptr, None
        if ptr:
            streams, self.streams = self.streams, {}
            try:
                _reaper.submit(lambda: close_session(ptr, streams))
            except Exception:  # interpreter shutdown: no thread can be started any more
                pass


class StreamOrder:
    """Which torch stream a Loader's next() orders each batch on: the one current on the batch's
    device at that moment. next() runs every step, on a thread just woken from waiting for the GPU,
    where making a torch Stream object costs tens of µs: the raw handle is read instead (torch's
    own reader, which its compiler uses, where this torch has it), and the object is made again
    only when the current stream changed. Keyed by (device, handle): a handle alone is ambiguous,
    the default stream being 0 on every GPU."""

    __slots__ = ("_torch", "_read_raw", "_stream", "_key", "_arg")

    def __init__(self, torch):
        self._torch = torch
        self._read_raw = getattr(torch._C, "_cuda_getCurrentRawStream", None) or (
            lambda device: torch.cuda.current_stream(device).cuda_stream)
        self._stream = self._key = self._arg = None

    def current(self, device, session):
        """(the torch stream current on `device`, its handle as the library's argument); a new
        stream is made to wait for the previous one and registered with `session` (which
        synchronises its streams before saying goodbye)."""
        key = (device, self._read_raw(device))
        if key == self._key and key in session.streams:
            return self._stream, self._arg
        stream = self._torch.cuda.current_stream(device)
        key = (device, stream.cuda_stream)
        if self._stream is not None and self._key != key:
            # The batch may come from the slot the previous one was sliced from, which only the
            # previous stream was made to wait for.
            stream.wait_stream(self._stream)
        self._stream, self._key, self._arg = stream, key, ctypes.c_void_p(stream.cuda_stream)
        session.streams.setdefault(key, stream)
        return stream, self._arg


def close_session(ptr, streams):
    if not ptr:
        return
    try:
        # The releases of the last batches are callbacks queued on these streams; they must
        # have run (the GPU work reading those slots is done) before the goodbye, which hands
        # every slot of this consumer back to the producer. Usually they have: this waits
        # only for work still queued at the loader's end.
        for stream in streams.values():
            if not stream.query():
                stream.synchronize()
    finally:
        # Says goodbye and joins the consumer's I/O thread (at most one poll interval).
        _lib.lib().coloader_consumer_close(ptr)


class BatchLease:
    """Owns one coloader_batch*: the producer's slot stays held until this object goes."""

    __slots__ = ("_ptr", "_session", "_cuda", "_wait", "_order", "_copies", "__weakref__")

    def __init__(self, ptr, session, cuda=None):
        self._ptr = ptr
        self._session = session  # released after the batch (attributes outlive __del__)
        self._cuda = cuda        # torch.cuda on the device path
        self._wait = None        # (stream the batch was ordered on, device whose current stream reads it)
        self._order = None       # device path: the torch stream it was taken on
        self._copies = None      # device path: tensors of torch's memory made from the batch (fields cut to shape)

    def release(self):
        ptr, self._ptr = self._ptr, None
        if not ptr:
            return
        try:
            if self._wait is not None:
                # The batch was ordered on a stream of another device than its own; the release
                # (a callback on that stream) must also follow the work enqueued on the batch's
                # device's current stream.
                stream, batch_device = self._wait
                stream.wait_stream(self._cuda.current_stream(batch_device))
        finally:
            # Non-blocking by design: it queues the ack for the consumer's I/O thread, on the
            # device path behind the work enqueued on the batch's stream (an event its release
            # thread waits for). The library leaves the caller's current device as it was.
            _lib.lib().coloader_batch_release(ptr)

    def __del__(self):
        try:
            self.release()
        except Exception:  # interpreter shutdown: modules may already be torn down
            pass


def host_view(lease, address, nbytes, dtype, shape, writable):
    """A numpy array over `nbytes` at `address`, keeping `lease` alive; read-only unless
    `writable` (the batch's own copy-on-write view, or a private buffer)."""
    buf = (ctypes.c_char * nbytes).from_address(address)
    buf._coloader_lease = lease  # array.base is `buf`; `buf` keeps the lease
    arr = np.frombuffer(buf, dtype=dtype).reshape(shape)
    arr.flags.writeable = writable
    return arr


class CudaArray:
    """A batch's device memory as __cuda_array_interface__ (version 3), for torch.as_tensor.
    torch keeps this object alive as long as the tensor's storage, and it holds the lease."""

    __slots__ = ("__cuda_array_interface__", "_lease")

    def __init__(self, lease, address, typestr, shape, stream):
        self._lease = lease
        self.__cuda_array_interface__ = {
            "version": 3,
            "shape": tuple(shape),
            "typestr": typestr,
            "strides": None,  # C-contiguous
            # torch refuses read-only (TypeError "the read only flag is not supported"). By
            # default the memory is this consumer's own copy; with zero_copy it is the
            # producer's, and the job has promised not to write it.
            "data": (address, False),
            # The stream the data is ordered on (0, the legacy default stream, is spelt 1 in
            # the interface). torch ignores it; it is right for any other reader.
            "stream": stream if stream else 1,
        }


def cuda_tensor(torch, lease, address, typestr, shape, device, stream, bfloat16=False):
    """A zero-copy CUDA tensor over the batch memory at `address`, keeping `lease` alive."""
    obj = CudaArray(lease, address, typestr, shape, stream)
    tensor = torch.as_tensor(obj, device=torch.device("cuda", device))
    if tensor.data_ptr() != address:  # torch would copy only if the devices disagreed
        raise _lib.ColoaderError("torch.as_tensor copied the batch instead of viewing it (cuda:%d, "
                                 "pointer 0x%x); please report this" % (device, address))
    if bfloat16:
        tensor = tensor.view(torch.bfloat16)  # shares the storage, and with it the lease
    return tensor


def from_numpy(torch, arr):
    if arr.flags.writeable:  # the usual case: no warning to silence (and no filter to install)
        return torch.from_numpy(arr)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(arr)


def read_schema(torch, ptr):
    """A caller-fed producer's schema (coloader.Producer), checked at connect: ([(path, torch
    dtype, per-sample room, sample bytes)], a function (leaves, shapes) -> batch
    (_structure.compile_rebuild), the index of the samples' shapes field or None), or (None,
    None, None) for a producer of images. Every dtype must be one this torch has, and the
    structure must name each field once; otherwise ProtocolError."""
    lib = _lib.lib()
    n = lib.coloader_consumer_num_fields(ptr)
    if n == 0:
        return None, None, None
    names = _lib.dtype_names()
    fields = []
    for i in range(n):
        f = _lib.Field()
        _lib.check(lib.coloader_consumer_field(ptr, i, ctypes.byref(f)))
        path = f.path.decode("utf-8", "replace")
        dtype = getattr(torch, names.get(f.dtype, "?"), None)
        if not isinstance(dtype, torch.dtype):
            raise _lib.ProtocolError("the producer's batch%s has dtype code %d, which this torch %s does not "
                                     "have" % (path, f.dtype, torch.__version__), _lib.E_PROTOCOL)
        shape = tuple(f.shape[d] for d in range(f.ndim))
        nbytes = torch.empty((), dtype=dtype).element_size()
        for d in shape:
            nbytes *= d
        fields.append((path, dtype, shape, nbytes, f.flags))
    try:
        structure = json.loads(lib.coloader_consumer_structure(ptr).decode("utf-8"))
        _structure.check_structure(structure, fields)
        shapes = structure["shaped"][1] if isinstance(structure, dict) and "shaped" in structure else None
        if shapes is not None and (fields[shapes][1] != torch.int32 or not fields[shapes][4] & _lib.FIELD_ON_HOST):
            raise ValueError("its shapes field is %s%s" % (fields[shapes][1], "" if fields[shapes][4] & _lib.FIELD_ON_HOST
                                                           else ", not kept on the host"))
        rebuild = _structure.compile_rebuild(structure, fields, torch)
    except (ValueError, RecursionError) as e:
        raise _lib.ProtocolError("the producer's batch structure is not one this package reads (%s): install "
                                 "the same coloader on both sides" % e, _lib.E_PROTOCOL) from None
    return [f[:4] for f in fields], rebuild, shapes


def shapes_of(lease, field, count, width):
    """The samples' shapes (the shapes field's rows) of the batch `lease` holds, read from host
    memory on either path: an int32 numpy array [count, width], valid while the lease is."""
    address = _lib.lib().coloader_batch_host_field(lease._ptr, field)
    if not address:
        raise _lib.ProtocolError("the library gave no host copy of the batch's shapes", _lib.E_PROTOCOL)
    return np.frombuffer((ctypes.c_int32 * (count * width)).from_address(address), dtype=np.int32).reshape(count, width)


def field_tensors(torch, lease, info, fields, stream, writable):
    """The batch's fields as tensors, each holding `lease`. The fields lie in one batch's memory,
    in order: one uint8 tensor over the span from the first to the end of the last (one
    interface crossing, not one per field), and each field a view of its part, reinterpreted as
    its dtype. Host views are read-only unless `writable`; device ones are ordered on `stream`."""
    n = info.size
    out = (ctypes.c_void_p * len(fields))()
    _lib.check(_lib.lib().coloader_batch_fields(lease._ptr, len(fields), out))  # every pointer in one call
    addresses = list(out)
    if not all(addresses):
        raise _lib.ProtocolError("the library gave no memory for a field of the batch", _lib.E_PROTOCOL)
    # From 8 bytes below the first field's start at most (the start of its region, or samples of
    # it before this batch's): every field lies at a multiple of its element size from there,
    # as a view as another dtype needs (a batch from sample k of a slot whose first field has
    # samples of an odd size starts at an odd address).
    first = addresses[0] - addresses[0] % 8
    span = addresses[-1] + n * fields[-1][3] - first
    if info.device >= 0:
        raw = cuda_tensor(torch, lease, first, "|u1", (span,), info.device, stream.cuda_stream)
    else:
        raw = from_numpy(torch, host_view(lease, first, span, np.uint8, (span,), writable))
    return [raw.narrow(0, a - first, n * nbytes).view(dtype).reshape((n,) + shape)
            for a, (_, dtype, shape, nbytes) in zip(addresses, fields)]


def clone(batch):
    """A copy of `batch` (tensors in any nesting of tuples, lists and dicts; other leaves as they
    are), as it is now, whatever is later written into the original."""
    if isinstance(batch, dict):
        return type(batch)((k, clone(v)) for k, v in batch.items())
    if isinstance(batch, (tuple, list)):
        items = [clone(v) for v in batch]
        return type(batch)(*items) if hasattr(batch, "_fields") else type(batch)(items)
    return batch.clone() if callable(getattr(batch, "clone", None)) else batch


def weak(batch):
    """A way back to `batch` that does not keep it alive (its tensors keep their slot or memory
    only while the job holds them): called, it gives the batch (its structure rebuilt over the
    same tensors), or None once any tensor in it is gone."""
    import weakref

    gone = object()

    def strip(b):
        if isinstance(b, dict):
            return "dict", type(b), [(k, strip(v)) for k, v in b.items()]
        if isinstance(b, (tuple, list)):
            return "seq", type(b), [strip(v) for v in b]
        try:
            return "weak", weakref.ref(b), None
        except TypeError:  # a leaf that cannot be referred to weakly (a number, a string, None): kept
            return "kept", b, None

    def rebuild(node):
        how, what, items = node
        if how == "kept":
            return what
        if how == "weak":
            leaf = what()
            return gone if leaf is None else leaf
        if how == "dict":
            pairs = [(k, rebuild(v)) for k, v in items]
            return gone if any(v is gone for _, v in pairs) else what(pairs)
        values = [rebuild(v) for v in items]
        if any(v is gone for v in values):
            return gone
        return what(*values) if hasattr(what, "_fields") else what(values)

    node = strip(batch)

    def back():
        b = rebuild(node)
        return None if b is gone else b

    return back
