"""coloader.Loader: a DataLoader-like iterable over the batches of a running coloader producer.

    loader = coloader.Loader("imagenet", batch_size=96, timeout=60)
    for epoch in range(90):
        for images, labels in loader:          # one iter() is one epoch
            images = images.to("cuda", non_blocking=True)
            ...

    # Or, with a producer started with --device cuda:0, straight from its GPU memory:
    loader = coloader.Loader("imagenet", batch_size=96, device="cuda")
    for images, labels in loader:              # CUDA tensors, zero-copy (CUDA IPC)
        ...

Memory and lifetime
    `images` and `labels` are zero-copy views of a producer slot in shared memory (or, for a
    batch that straddles two producer slots, of a private buffer the C++ consumer gathered it
    into). While any tensor viewing a batch is alive, the producer will not reuse that slot;
    when the last one goes (the usual `del` or rebinding in the next loop iteration, or the
    garbage collector), the slot is released, exactly once. Each batch has one owner object
    (_BatchLease) that holds the C lease; the numpy arrays under both tensors are built on
    ctypes arrays that carry a reference to it, so either tensor alone keeps the slot. On the
    device path the same holds with CUDA tensors: each is made by torch.as_tensor from a small
    object exposing __cuda_array_interface__ that holds the lease, and torch keeps that object
    alive for as long as the tensor's storage lives.
    Releasing never blocks, so it is safe from the garbage collector and from any thread.
    Closing the Loader (close(), the end of a `with` block, or its garbage collection) does
    not pull the memory from under tensors still alive: the consumer stays attached, holding
    their slots, until the last of them is dropped, and leaves the producer then.

    Holding tensors holds back the producer: it runs at most `--window` batches ahead of the
    slowest consumer, and a slot one consumer holds is a slot nobody gets. Keep a batch only
    as long as the step needs it; copy what must live longer (`images.clone()`,
    `.to(device)`).

Read-only
    The shared memory is mapped read-only. The tensors must not be written in place
    (`images.mul_(2)`, `images[0] = 0`, `torch.nn.functional.relu(images, inplace=True)`
    crash the process with SIGSEGV): normalise into new tensors or move to the device first,
    as a training step does anyway. The numpy arrays under them are marked non-writable;
    torch.from_numpy's warning about that is silenced here, on purpose. On the device path
    nothing enforces it (CUDA IPC memory is writable, and torch refuses a read-only
    __cuda_array_interface__), but the rule is the same and matters more: an in-place write
    changes the batch that every other consumer of the producer is reading.

The device path (device="cuda")
    With a producer started with `--device cuda:N`, images and labels are CUDA tensors that
    view the producer's GPU memory, mapped once per process through CUDA IPC; nothing is
    copied per batch (a batch that straddles two producer slots is gathered on the GPU). The
    tensors are on the producer's GPU: "cuda" and "cuda:N" both ask for CUDA tensors, and N
    (or the current device for "cuda") is the GPU this consumer computes on, which a producer
    with rings on several GPUs uses to choose one. The dtype is the producer's --output
    (uint8 NHWC, float32, bfloat16 or float16 NCHW); labels are int64 on the same GPU;
    `loader.indices` stays a CPU tensor.

    Streams: next() makes the CUDA stream that is current at that moment (on the batch's
    device) wait for the producer's work on the batch, without synchronising the host. The
    tensors are therefore ready for work enqueued on that stream; to use them on another
    stream, make it wait first (`other.wait_stream(torch.cuda.current_stream())`), or
    synchronise. The slot is released when the last tensor goes, ordered after the work
    enqueued on that same stream by then: the producer may overwrite it only once that work
    has finished, so kernels already queued on it can still read the batch. Work queued on
    other streams is not waited for: keep a batch's tensors alive until such work is done
    (`tensor.record_stream()` does not help: the memory is not torch's allocator's). One
    stream per Loader is the intended use; when the current stream changes between batches,
    the new stream is made to wait for the previous one (one event), which keeps slices of
    one producer slot taken on both streams correctly ordered.

    Fallback: when the producer has no device ring, this process cannot map it (another
    container, a MIG instance), or PyTorch has no CUDA, the Loader warns once
    (DeviceFallbackWarning, with the reason) and yields CPU tensors from shared memory as
    without `device`. `loader.on_device` and `loader.fallback_reason` tell which path is used.

Epochs
    Each iter(loader) starts an epoch. Starting one before the previous finished skips the
    rest of the previous one (it is released unread). A consumer that joins while the producer
    is mid-epoch first gets the rest of that epoch, with `loader.partial` True, then whole
    epochs; `wait_for_epoch=True` joins at the next boundary instead. len(loader) is the
    number of batches of a whole epoch for this batch size. When the producer has delivered
    every epoch it was started for (`coloader serve --epochs N`), a further iter(loader)
    yields nothing: the loop body does not run. A producer that died or went away raises
    ProducerGone instead, within its heartbeat timeout, never a hang.

Distributed jobs and resume (docs/DISTRIBUTED.md, coloader/distributed.py)
    The ranks of a data-parallel job form a consumer group: each gets its share of every epoch,
    all the same number of batches (len(loader) per rank). rank=None reads torch.distributed,
    torchrun or Slurm (repr says which). A rank that leaves ends its group: the others get
    coloader.GroupBroken. state_dict()/load_state_dict() checkpoint and resume the position.

Waiting
    With timeout=0 a wait for the next batch lasts as long as the producer lives; Ctrl-C is
    handled when the wait ends, as with any blocking C call. A timeout raises coloader.Timeout,
    after which next() may be called again and resumes the batch it interrupted: a batch that
    straddles producer slots keeps the samples it had gathered (client/slicing.cc), so none are
    lost or repeated.

Threads
    A Loader and its iterators are for one thread at a time. Tensors may be dropped anywhere.
"""

import ctypes
import os
import warnings

import numpy as np

from . import _lib, _reaper
from .distributed import ResumeWarning, _Stateful, _topology

# dtype names (the codes come from the library: _lib.dtype_names) -> numpy dtypes of the host
# views. numpy has no bfloat16: its bytes are viewed as int16 and the tensor is reinterpreted
# as torch.bfloat16.
_NUMPY_BY_NAME = {"uint8": np.uint8, "float32": np.float32, "bfloat16": np.int16, "float16": np.float16}
# The same names -> __cuda_array_interface__ typestrs (bfloat16 again as int16: no typestr
# names it, and int16 is what every torch version accepts, unlike uint16).
_TYPESTR_BY_NAME = {"uint8": "|u1", "float32": "<f4", "bfloat16": "<i2", "float16": "<f2"}


def _dtype_tables():
    """(numpy dtype by code, typestr by code, the bfloat16 code), read from the library once."""
    global _DTYPE_TABLES
    if _DTYPE_TABLES is None:
        names = _lib.dtype_names()
        _DTYPE_TABLES = ({c: _NUMPY_BY_NAME[n] for c, n in names.items() if n in _NUMPY_BY_NAME},
                         {c: _TYPESTR_BY_NAME[n] for c, n in names.items() if n in _TYPESTR_BY_NAME},
                         next(c for c, n in names.items() if n == "bfloat16"))
    return _DTYPE_TABLES


_DTYPE_TABLES = None


class DeviceFallbackWarning(RuntimeWarning):
    """Loader(device="cuda") is using host memory, and yields CPU tensors (see the message)."""


class _Session:
    """Owns the coloader_consumer*. Referenced by the Loader and by every live batch lease, so
    the consumer leaves the producer only when the Loader is closed *and* no tensor is left:
    leaving earlier would let the producer reclaim, and overwrite, slots still in use."""

    __slots__ = ("ptr", "streams", "__weakref__")

    def __init__(self, ptr):
        self.ptr = ptr
        self.streams = {}  # device path: the torch streams batches were ordered on, by handle

    def close(self):
        """Closes now, on this thread (it may wait; see _close)."""
        ptr, self.ptr = self.ptr, None
        streams, self.streams = self.streams, {}
        _close(ptr, streams)

    def __del__(self):
        # The garbage collector may run this anywhere: the closing, which waits, goes to the
        # reaper thread (coloader/_reaper.py). The job holds the pointer and the streams, not
        # self, so nothing is resurrected.
        ptr, self.ptr = self.ptr, None
        if ptr:
            streams, self.streams = self.streams, {}
            try:
                _reaper.submit(lambda: _close(ptr, streams))
            except Exception:  # interpreter shutdown: no thread can be started any more
                pass


def _close(ptr, streams):
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


class _BatchLease:
    """Owns one coloader_batch*: the producer's slot stays held until this object goes."""

    __slots__ = ("_ptr", "_session", "_cuda", "_wait", "__weakref__")

    def __init__(self, ptr, session, cuda=None):
        self._ptr = ptr
        self._session = session  # released after the batch (attributes outlive __del__)
        self._cuda = cuda        # torch.cuda on the device path
        self._wait = None        # (stream the batch was ordered on, device whose current stream reads it)

    def release(self):
        ptr, self._ptr = self._ptr, None
        if not ptr:
            return
        cuda, device = self._cuda, None
        try:
            if cuda is not None:
                # The C++ side calls cudaSetDevice(the producer's GPU) on this thread; the
                # caller's current device is put back below.
                device = cuda.current_device()
                if self._wait is not None:
                    # The batch was ordered on a stream of another device than its own; the
                    # release (a callback on that stream) must also follow the work enqueued
                    # on the batch's device's current stream.
                    stream, batch_device = self._wait
                    stream.wait_stream(cuda.current_stream(batch_device))
        finally:
            # Non-blocking by design: it queues the ack for the consumer's I/O thread, on the
            # device path behind the work enqueued on the batch's stream (cudaLaunchHostFunc).
            _lib.lib().coloader_batch_release(ptr)
            if device is not None:
                cuda.set_device(device)

    def __del__(self):
        try:
            self.release()
        except Exception:  # interpreter shutdown: modules may already be torn down
            pass


def _view(lease, address, nbytes, dtype, shape):
    """A read-only numpy array over `nbytes` at `address`, keeping `lease` alive."""
    buf = (ctypes.c_char * nbytes).from_address(address)
    buf._coloader_lease = lease  # array.base is `buf`; `buf` keeps the lease
    arr = np.frombuffer(buf, dtype=dtype).reshape(shape)
    arr.flags.writeable = False
    return arr


class _CudaArray:
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
            # torch refuses read-only (TypeError "the read only flag is not supported"); the
            # tensors must be treated as read-only all the same (see the module docstring).
            "data": (address, False),
            # The stream the data is ordered on (0, the legacy default stream, is spelt 1 in
            # the interface). torch ignores it; it is right for any other reader.
            "stream": stream if stream else 1,
        }


def _cuda_tensor(torch, lease, address, typestr, shape, device, stream, bfloat16=False):
    """A zero-copy CUDA tensor over the batch memory at `address`, keeping `lease` alive."""
    obj = _CudaArray(lease, address, typestr, shape, stream)
    tensor = torch.as_tensor(obj, device=torch.device("cuda", device))
    if tensor.data_ptr() != address:  # torch would copy only if the devices disagreed
        raise _lib.ColoaderError("torch.as_tensor copied the batch instead of viewing it (cuda:%d, "
                                 "pointer 0x%x); please report this" % (device, address))
    if bfloat16:
        tensor = tensor.view(torch.bfloat16)  # shares the storage, and with it the lease
    return tensor


def _from_numpy(torch, arr):
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(arr)


class _EpochIterator:
    """One epoch of a Loader. A Timeout leaves it usable: next() may be called again, and the
    interrupted batch resumes where it stopped."""

    def __init__(self, loader, generation, done):
        self._loader = loader
        self._generation = generation
        self._done = done

    def __iter__(self):
        return self

    def __len__(self):
        return len(self._loader)

    def __next__(self):
        loader = self._loader
        session = loader._session
        if self._done or loader._generation != self._generation or session is None:
            self._done = True
            raise StopIteration
        batch = loader._next(session)
        if batch is None:
            self._done = True
            raise StopIteration
        loader._seen += int(batch[1].shape[0])
        return batch


class Loader(_Stateful):
    """Iterates the batches of the coloader producer called `name` (see the module docstring).

    Args:
      name: the producer's name (`coloader serve --name NAME`), looked up in the per-user run
        directory ($COLOADER_RUN_DIR if set).
      batch_size: this consumer's batch size; None for the producer's. Any size works: the
        producer's batches are sliced, and only a batch spanning two of them is copied.
      drop_last: drop each epoch's last batch when it is short.
      timeout: seconds to wait for one batch before raising coloader.Timeout; 0 waits as long
        as the producer lives.
      wait_for_epoch: join at the next epoch boundary rather than mid-epoch.
      endpoint: an explicit ZeroMQ endpoint (e.g. tcp://host:port) instead of a name.
      curve_key, server_key: for a tcp:// producer started with CURVE keys: this consumer's
        key pair file and the producer's public key (Z85 text or its .pub file), both made by
        `coloader keygen`. Remote batches arrive over the network (host path).
      device: None or "cpu": CPU tensors viewing host shared memory. "cuda" or "cuda:N": CUDA
        tensors viewing the producer's GPU memory (the device path: zero-copy, and no host
        synchronisation). They are on the producer's GPU; N (default: the current device)
        is the GPU this process computes on, which a producer with several GPUs uses to pick
        the ring it serves from. If the device path is not possible (the producer runs
        without --device, its GPU cannot be mapped from here, or PyTorch has no CUDA), a
        DeviceFallbackWarning says why and the batches are CPU tensors; see on_device and
        fallback_reason. Another device type (e.g. "xpu") gets each batch copied there with
        `.to(device)`, the slot being released as soon as the copy is made.
      connect_timeout: seconds to wait for the producer's handshake.
      wait_for_producer: seconds to wait for a producer of this name to come up (jobs
        started together with it; said once on stderr); 0 raises ProducerNotFound at once.
      client_name: shown by `coloader status`.
      rank, world_size: this process's rank in its consumer group (the ranks of one
        data-parallel job reading this producer). None: read from torch.distributed or the
        environment (see "Distributed jobs"); a world of one is a plain consumer.
      group: the name all ranks of the job give; None: derived from the launcher (torchrun's
        TORCHELASTIC_RUN_ID or MASTER_ADDR:MASTER_PORT, Slurm's job and step), or required.
      node_rank, num_nodes: the producer shard this job expects (the producer's --rank of
        --world-size); derived with the rank, or None: not checked.

    Streams on the device path: the tensors returned by next() are ready for work enqueued
    on the CUDA stream that was current (on their device) when next() was called: use them
    on that stream, or make another stream wait for it (`s.wait_stream(...)`), or synchronise.
    The batch's slot is released when its last tensor goes, and only after the work enqueued
    on that stream by the time of the release has finished; work on other streams is not
    waited for, so keep the tensors alive until it is done.
    """

    def __init__(self, name=None, batch_size=None, drop_last=False, timeout=0,
                 wait_for_epoch=False, endpoint=None, device=None, connect_timeout=5.0,
                 client_name=None, wait_for_producer=60, curve_key=None, server_key=None,
                 rank=None, world_size=None, group=None, node_rank=None, num_nodes=None):
        import torch  # imported here so that `import coloader` works without torch

        self._torch = torch
        self._session = None
        self._generation = 0
        self._indices = None
        self._seen = 0  # samples yielded in the current epoch (state_dict)
        self._started = False  # an epoch was begun (load_state_dict must then reconnect)
        self._resume_warned = False
        (self.rank, self.world_size, self.group, self.node_rank, self.num_nodes, local_rank,
         self._topology_source) = _topology(torch, rank, world_size, group, node_rank, num_nodes)
        if self.world_size > 1 and not self.group:
            raise _lib.InvalidArgument(
                "rank %d of %d (from %s) needs a group name that all ranks of the job share: pass group=, or "
                "launch with torchrun (TORCHELASTIC_RUN_ID or MASTER_ADDR/MASTER_PORT) or Slurm"
                % (self.rank, self.world_size, self._topology_source), _lib.E_INVALID)
        if device == "cuda" and local_rank is not None:
            device = "cuda:%d" % local_rank  # each rank on its own GPU, reading that GPU's ring
        if not name and not endpoint:
            raise _lib.InvalidArgument("give the producer's name (or an endpoint)", _lib.E_INVALID)
        if batch_size is not None and (int(batch_size) < 1 or int(batch_size) >= 2**32):
            raise _lib.InvalidArgument("batch_size must be a positive integer, got %r" % (batch_size,),
                                       _lib.E_INVALID)
        if timeout is None or timeout < 0:
            raise _lib.InvalidArgument("timeout must be >= 0 seconds (0: no limit), got %r" % (timeout,),
                                       _lib.E_INVALID)
        self._device = None         # another accelerator: batches are copied there
        self._cuda = None           # torch.cuda, when the device path is in use
        self._cuda_device = None    # the GPU whose current stream next() passes down
        self._last_stream = None    # the stream the previous batch was ordered on
        self._fallback = ""         # why CUDA was asked for and is not used
        want_cuda = False
        if device is not None:
            try:
                dev = torch.device(device)
            except (RuntimeError, TypeError, ValueError) as e:
                raise _lib.InvalidArgument("device must be None, 'cpu', 'cuda' or 'cuda:N', got %r (%s)"
                                           % (device, e), _lib.E_INVALID) from e
            if dev.type == "cuda":
                want_cuda = True
                if not torch.cuda.is_available():
                    self._fallback = ("PyTorch has no usable CUDA device (torch.cuda.is_available() is "
                                      "False; torch %s)" % torch.__version__)
                    want_cuda = False
                else:
                    self._cuda_device = dev.index if dev.index is not None else torch.cuda.current_device()
                    if not 0 <= self._cuda_device < torch.cuda.device_count():
                        raise _lib.InvalidArgument("device %r: this process sees %d CUDA device(s)"
                                                   % (device, torch.cuda.device_count()), _lib.E_INVALID)
            elif dev.type != "cpu":
                self._device = dev
        self.name = name
        self._endpoint = endpoint
        self._want_cuda = want_cuda
        self._requested_device = device
        self._opts_args = (name, endpoint, batch_size, drop_last, wait_for_epoch, connect_timeout, timeout,
                           client_name, wait_for_producer, curve_key, server_key)
        self._connect(self._options())
        if self._fallback:
            warnings.warn("coloader.Loader(%r, device=%r) reads host memory and yields CPU tensors: %s"
                          % (name or endpoint, device, self._fallback), DeviceFallbackWarning, stacklevel=2)

    def _options(self, resume=None):
        """The C options for this Loader; `resume`: a checked state to resume on connecting."""
        (name, endpoint, batch_size, drop_last, wait_for_epoch, connect_timeout, timeout, client_name,
         wait_for_producer, curve_key, server_key) = self._opts_args
        want_cuda = self._want_cuda
        opts = _lib.ConsumerOptions()
        opts.name = name.encode() if name else None
        opts.endpoint = endpoint.encode() if endpoint else None
        opts.batch_size = int(batch_size) if batch_size is not None else 0
        opts.drop_last = 1 if drop_last else 0
        opts.wait_for_epoch = 1 if wait_for_epoch else 0
        opts.connect_timeout_ms = max(1, int(round(connect_timeout * 1000)))
        opts.timeout_ms = int(round(timeout * 1000)) if timeout else 0
        if timeout and opts.timeout_ms == 0:
            opts.timeout_ms = 1
        opts.client_name = client_name.encode() if client_name else None
        opts.device = 1 if want_cuda else 0
        opts.wait_for_producer_ms = int(round(wait_for_producer * 1000)) if wait_for_producer else 0
        opts.curve_key_file = os.fsencode(curve_key) if curve_key else None
        opts.curve_server_key = os.fsencode(server_key) if server_key else None
        opts.group = self.group.encode() if self.group else None
        opts.rank = self.rank
        opts.world_size = self.world_size
        opts.node_rank = self.node_rank if self.node_rank is not None else 0
        opts.num_nodes = self.num_nodes if self.num_nodes is not None else 0
        if resume is not None:
            opts.has_expect_seed = 1
            opts.expect_seed = int(resume["seed"])
            opts.expect_data_key = str(resume["data_key"]).encode()
            opts.resume = 1
            opts.resume_epoch = int(resume["epoch"])
            opts.resume_begin = int(resume.get("split_begin", 0))
            opts.resume_samples = int(resume["samples_seen_in_epoch"])
        return opts

    def _connect(self, opts):
        torch = self._torch
        want_cuda = self._want_cuda
        ptr = ctypes.c_void_p()
        if want_cuda:
            cuda = torch.cuda
            previous = cuda.current_device()
            try:
                # The consumer tells the producer the UUID of this thread's current device;
                # mapping the producer's memory makes its GPU current: both are undone here.
                cuda.set_device(self._cuda_device)
                _lib.check(_lib.lib().coloader_consumer_open(ctypes.byref(opts), ctypes.byref(ptr)))
            finally:
                cuda.set_device(previous)
        else:
            _lib.check(_lib.lib().coloader_consumer_open(ctypes.byref(opts), ctypes.byref(ptr)))
        self._session = _Session(ptr.value)
        if want_cuda:
            if _lib.lib().coloader_consumer_on_device(ptr.value):
                self._cuda = torch.cuda
            else:
                reason = _lib.lib().coloader_consumer_fallback_reason(ptr.value)
                self._fallback = reason.decode("utf-8", "replace") if reason else "unknown reason"

    # -- iteration -----------------------------------------------------------------------

    def __iter__(self):
        """Starts the next epoch (skipping what is left of the current one)."""
        ptr = self._require_open()
        self._generation += 1
        rc = _lib.check(_lib.lib().coloader_consumer_next_epoch(ptr))
        self._started = True
        # A resumed epoch counts what the saved state had seen.
        self._seen = int(_lib.lib().coloader_consumer_samples_seen(ptr))
        note = _lib.lib().coloader_consumer_resume_note(ptr)
        if note and not self._resume_warned:
            self._resume_warned = True
            warnings.warn("coloader.Loader(%r): the saved state could not be resumed exactly: producer %s"
                          % (self.name, note.decode("utf-8", "replace")), ResumeWarning, stacklevel=2)
        return _EpochIterator(self, self._generation, done=(rc == _lib.END))

    def __len__(self):
        """Batches in a whole epoch for this consumer's batch size (and drop_last)."""
        return int(_lib.lib().coloader_consumer_len(self._require_open()))

    def _next(self, session):
        """The next batch as (images, labels), or None at the end of the epoch."""
        out = ctypes.c_void_p()
        lib = _lib.lib()
        cuda = self._cuda
        if cuda is None:
            rc = _lib.check(lib.coloader_consumer_next_batch(session.ptr, ctypes.byref(out)))
            return None if rc == _lib.END else self._wrap(_BatchLease(out.value, session))

        previous = cuda.current_device()
        try:
            stream = cuda.current_stream(self._cuda_device)
            last = self._last_stream
            if last is not None and last.cuda_stream != stream.cuda_stream:
                # The batch may come from the slot the previous one was sliced from, which
                # only the previous stream was made to wait for.
                stream.wait_stream(last)
            self._last_stream = stream
            session.streams.setdefault(stream.cuda_stream, stream)
            rc = _lib.check(lib.coloader_consumer_next_batch_on_stream(
                session.ptr, ctypes.c_void_p(stream.cuda_stream), ctypes.byref(out)))
            lease = None if rc == _lib.END else _BatchLease(out.value, session, cuda)
        finally:
            cuda.set_device(previous)  # the C++ side makes the producer's GPU current
        return None if lease is None else self._wrap(lease, stream)

    def _wrap(self, lease, stream=None):
        # On an error below, the lease is released when the last view made so far goes.
        info = _lib.BatchInfo()
        _lib.check(_lib.lib().coloader_batch_info_get(lease._ptr, ctypes.byref(info)))
        numpy_dtypes, typestrs, bfloat16_code = _dtype_tables()
        dtype = numpy_dtypes.get(info.dtype)
        if dtype is None:
            raise _lib.ProtocolError("the producer's batches have an unknown dtype code %d" % info.dtype,
                                     _lib.E_PROTOCOL)
        torch = self._torch
        n = info.size
        shape = tuple(info.shape[i] for i in range(info.ndim))
        # A copy: loader.indices must not keep the slot held after the batch is dropped.
        self._indices = torch.from_numpy(np.ctypeslib.as_array(
            (ctypes.c_int64 * n).from_address(info.indices)).copy())
        if info.device >= 0:
            if stream is None or not info.device_labels:
                raise _lib.ColoaderError("the batch is on CUDA device %d, but this Loader did not ask "
                                         "for the device path" % info.device)
            if stream.device.index != info.device:
                # The producer's GPU is not the one this Loader computes on: the batch was
                # ordered on a stream of the latter. Order the batch's device's current stream
                # after it, and (at release) that stream's work before the release.
                cuda = self._cuda
                cuda.current_stream(info.device).wait_stream(stream)
                lease._wait = (stream, info.device)
                self._cuda_device = info.device  # later batches: that device's current stream
            handle = stream.cuda_stream
            images = _cuda_tensor(torch, lease, info.data, typestrs[info.dtype], shape, info.device,
                                  handle, bfloat16=(info.dtype == bfloat16_code))
            labels = _cuda_tensor(torch, lease, info.device_labels, "<i8", (n,), info.device, handle)
            return images, labels
        images = _from_numpy(torch, _view(lease, info.data, info.bytes, dtype, shape))
        if info.dtype == bfloat16_code:
            images = images.view(torch.bfloat16)
        labels = _from_numpy(torch, _view(lease, info.labels, 8 * n, np.int64, (n,)))
        del lease
        if self._device is not None:
            # A synchronous copy from pageable memory: the views (and the slot) go right after.
            images = images.to(self._device)
            labels = labels.to(self._device)
        return images, labels

    # -- state ---------------------------------------------------------------------------

    @property
    def epoch(self):
        """The current epoch's number (the producer's count, from 0)."""
        return int(_lib.lib().coloader_consumer_epoch(self._require_open()))

    @property
    def partial(self):
        """True when the current epoch was joined mid-way (late join)."""
        return bool(_lib.lib().coloader_consumer_partial(self._require_open()))

    @property
    def indices(self):
        """int64 tensor of the dataset indices of the last batch returned (a copy), or None."""
        return self._indices

    @property
    def batch_size(self):
        return int(_lib.lib().coloader_consumer_batch_size(self._require_open()))

    @property
    def dataset_size(self):
        return int(_lib.lib().coloader_consumer_dataset_size(self._require_open()))

    @property
    def epoch_samples(self):
        """Samples in a whole epoch (this producer's shard of the dataset)."""
        return int(_lib.lib().coloader_consumer_epoch_samples(self._require_open()))

    @property
    def on_device(self):
        """True when batches come as CUDA tensors in the producer's GPU memory (device path)."""
        self._require_open()
        return self._cuda is not None

    @property
    def fallback_reason(self):
        """Why device="cuda" was asked for but the batches are CPU tensors; "" otherwise."""
        return self._fallback

    @property
    def closed(self):
        return self._session is None

    # -- lifetime ------------------------------------------------------------------------

    def close(self):
        """Ends this Loader. Tensors already handed out stay valid, and keep their slots, until
        they are dropped; the consumer leaves the producer when the last of them goes."""
        self._session = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass

    def _require_open(self):
        session = self._session
        if session is None:
            raise _lib.ColoaderError("the loader is closed")
        return session.ptr

    def __repr__(self):
        state = "closed" if self._session is None else "batch_size=%d" % self.batch_size
        if self.world_size > 1 or self.group:
            topology = "rank %d of %d in group %r" % (self.rank, self.world_size, self.group)
            if self.num_nodes:
                topology += " on node %d of %d" % (self.node_rank, self.num_nodes)
        else:
            topology = "a plain consumer"
        return "coloader.Loader(%r, %s, %s; topology from %s)" % (self.name, state, topology, self._topology_source)
