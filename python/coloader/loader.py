"""coloader.Loader: a DataLoader-like iterable over the batches of a running coloader producer.

    loader = coloader.Loader("imagenet", batch_size=96, timeout=60)
    for epoch in range(90):
        for images, labels in loader:          # one iter() is one epoch
            images = images.to("cuda", non_blocking=True)
            ...

Memory and lifetime
    `images` and `labels` are zero-copy views of a producer slot in shared memory (or, for a
    batch that straddles two producer slots, of a private buffer the C++ consumer gathered it
    into). While any tensor viewing a batch is alive, the producer will not reuse that slot;
    when the last one goes (the usual `del` or rebinding in the next loop iteration, or the
    garbage collector), the slot is released, exactly once. Each batch has one owner object
    (_BatchLease) that holds the C lease; the numpy arrays under both tensors are built on
    ctypes arrays that carry a reference to it, so either tensor alone keeps the slot.
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
    torch.from_numpy's warning about that is silenced here, on purpose.

Epochs
    Each iter(loader) starts an epoch. Starting one before the previous finished skips the
    rest of the previous one (it is released unread). A consumer that joins while the producer
    is mid-epoch first gets the rest of that epoch, with `loader.partial` True, then whole
    epochs; `wait_for_epoch=True` joins at the next boundary instead. len(loader) is the
    number of batches of a whole epoch for this batch size. When the producer has delivered
    every epoch it was started for (`coloader serve --epochs N`), a further iter(loader)
    yields nothing: the loop body does not run. A producer that died or went away raises
    ProducerGone instead, within its heartbeat timeout, never a hang.

Waiting
    With timeout=0 a wait for the next batch lasts as long as the producer lives; Ctrl-C is
    handled when the wait ends, as with any blocking C call. A timeout raises coloader.Timeout,
    after which next() may be called again. Known issue (client/consumer.cc): when the batch
    that timed out spans two producer slots, the samples already taken from the first slot are
    lost to this epoch; use a batch size that divides the producer's if Timeouts are expected.

Threads
    A Loader and its iterators are for one thread at a time. Tensors may be dropped anywhere.
"""

import ctypes
import warnings

import numpy as np

from . import _lib

_DTYPES = {0: np.uint8, 1: np.float32}


class _Session:
    """Owns the coloader_consumer*. Referenced by the Loader and by every live batch lease, so
    the consumer leaves the producer only when the Loader is closed *and* no tensor is left:
    leaving earlier would let the producer reclaim, and overwrite, slots still in use."""

    __slots__ = ("ptr", "__weakref__")

    def __init__(self, ptr):
        self.ptr = ptr

    def close(self):
        ptr, self.ptr = self.ptr, None
        if ptr:
            # Says goodbye and joins the consumer's I/O thread (at most one poll interval).
            _lib.lib().coloader_consumer_close(ptr)

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown: modules may already be torn down
            pass


class _BatchLease:
    """Owns one coloader_batch*: the producer's slot stays held until this object goes."""

    __slots__ = ("_ptr", "_session", "__weakref__")

    def __init__(self, ptr, session):
        self._ptr = ptr
        self._session = session  # released after the batch (attributes outlive __del__)

    def release(self):
        ptr, self._ptr = self._ptr, None
        if ptr:
            # Non-blocking by design (it queues the ack for the consumer's I/O thread).
            _lib.lib().coloader_batch_release(ptr)

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


def _from_numpy(torch, arr):
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(arr)


class _EpochIterator:
    """One epoch of a Loader. A Timeout leaves it usable: next() may be called again (but see
    the known issue: samples are lost when the timed-out batch straddled producer slots)."""

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
        out = ctypes.c_void_p()
        rc = _lib.check(_lib.lib().coloader_consumer_next_batch(session.ptr, ctypes.byref(out)))
        if rc == _lib.END:
            self._done = True
            raise StopIteration
        return loader._wrap(_BatchLease(out.value, session))


class Loader:
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
      device: if given and not the CPU, each batch is copied there (torch `.to(device)`), and
        the shared-memory slot is released as soon as the copy is made.
      connect_timeout: seconds to wait for the producer's handshake.
      client_name: shown by `coloader status`.
    """

    def __init__(self, name=None, batch_size=None, drop_last=False, timeout=0,
                 wait_for_epoch=False, endpoint=None, device=None, connect_timeout=5.0,
                 client_name=None):
        import torch  # imported here so that `import coloader` works without torch

        self._torch = torch
        self._session = None
        self._generation = 0
        self._indices = None
        if not name and not endpoint:
            raise _lib.InvalidArgument("give the producer's name (or an endpoint)", _lib.E_INVALID)
        if batch_size is not None and (int(batch_size) < 1 or int(batch_size) >= 2**32):
            raise _lib.InvalidArgument("batch_size must be a positive integer, got %r" % (batch_size,),
                                       _lib.E_INVALID)
        if timeout is None or timeout < 0:
            raise _lib.InvalidArgument("timeout must be >= 0 seconds (0: no limit), got %r" % (timeout,),
                                       _lib.E_INVALID)
        self._device = None
        if device is not None and torch.device(device).type != "cpu":
            self._device = torch.device(device)
        self.name = name

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
        ptr = ctypes.c_void_p()
        _lib.check(_lib.lib().coloader_consumer_open(ctypes.byref(opts), ctypes.byref(ptr)))
        self._session = _Session(ptr.value)

    # -- iteration -----------------------------------------------------------------------

    def __iter__(self):
        """Starts the next epoch (skipping what is left of the current one)."""
        ptr = self._require_open()
        self._generation += 1
        rc = _lib.check(_lib.lib().coloader_consumer_next_epoch(ptr))
        return _EpochIterator(self, self._generation, done=(rc == _lib.END))

    def __len__(self):
        """Batches in a whole epoch for this consumer's batch size (and drop_last)."""
        return int(_lib.lib().coloader_consumer_len(self._require_open()))

    def _wrap(self, lease):
        # On an error below, the lease is released when the last view made so far goes.
        info = _lib.BatchInfo()
        _lib.check(_lib.lib().coloader_batch_info_get(lease._ptr, ctypes.byref(info)))
        dtype = _DTYPES.get(info.dtype)
        if dtype is None:
            raise _lib.ProtocolError("the producer's batches have an unknown dtype code %d" % info.dtype,
                                     _lib.E_PROTOCOL)
        if info.device >= 0:
            raise _lib.ColoaderError("this build of the Python package reads host memory only, "
                                     "but the batch is on CUDA device %d" % info.device)
        torch = self._torch
        n = info.size
        shape = tuple(info.shape[i] for i in range(info.ndim))
        images = _from_numpy(torch, _view(lease, info.data, info.bytes, dtype, shape))
        labels = _from_numpy(torch, _view(lease, info.labels, 8 * n, np.int64, (n,)))
        # A copy: loader.indices must not keep the slot held after the batch is dropped.
        self._indices = torch.from_numpy(np.ctypeslib.as_array(
            (ctypes.c_int64 * n).from_address(info.indices)).copy())
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
        return "coloader.Loader(%r, %s)" % (self.name, state)
