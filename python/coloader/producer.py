"""coloader.Producer: share the batches of your own PyTorch DataLoader.

    import coloader, torch
    loader = torch.utils.data.DataLoader(MyDataset(), batch_size=64, num_workers=8)
    coloader.Producer(loader, name="mydata").run(epochs=10)     # in one process
    ...
    for images, labels in coloader.Loader("mydata", batch_size=32):  # in each training job
        ...

The producer keeps the user's dataset code (any Dataset, any transforms, any collate) and
publishes each batch once, through the same ring and protocol as `coloader serve`: every
consumer sees exact epochs with its own batch size, may join late, and may die without
stalling the others.

What a batch may be: whatever the DataLoader yields, as long as its leaves are tensors: a
tensor, or tuples, lists and dicts (str keys) of them nested to any depth, e.g.
{"input_ids": int64 [B, 128], "attention_mask": bool [B, 128], "labels": int64 [B, 128]}.
Every tensor has the batch's B samples along its first dimension (or is one sample's, in a list
of the batch's samples); dtypes are any of bool, uint8, int8, int16, int32, int64, float16,
bfloat16, float32, float64 and complex64. The first batch states the schema: each tensor's path,
dtype, and the most one sample holds (its shape then, or max_shapes). Later batches may be
smaller: a collate that pads to each batch's longest, lists of samples of different sizes
(images, boxes). One past the maximum, or of another structure or dtype, makes publish() raise
ValueError naming the tensor and the fix. Consumers get the same structure at their own batch
size, each padded tensor at the longest of their own batch's samples (padded with the field's
pad value), each sample of a list at its own shape (coloader.Loader yields it; tuples stay
tuples, dicts keep their order). The indices consumers see (loader.indices) are the samples'
dataset indices where the DataLoader's batch sampler says them (a map-style Dataset, batches in
order: _BatchIndices), else their positions in the epoch.

With device="cuda:N" the ring also lives in GPU N's memory: consumers there that ask for the
device path (coloader.Loader(..., device="cuda")) get every tensor on the GPU, each batch their
own copy; others read host memory.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import logging
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

from . import _lib, _structure

if TYPE_CHECKING:
    import torch


def _dtype_codes(torch):
    """{torch dtype: the C ABI's code}, the codes read from the library (coloader_dtype_name)."""
    return {getattr(torch, name): code for code, name in _lib.dtype_names().items() if hasattr(torch, name)}


def _device_index(device, torch):
    """The CUDA ordinal of `device` ("cuda:1", torch.device, an int), -1 for None."""
    if device is None:
        return -1
    d = torch.device(device) if not isinstance(device, int) else torch.device("cuda", device)
    if d.type != "cuda":
        raise ValueError("device=%r: coloader.Producer places batches on a CUDA device (\"cuda:N\") or, "
                         "with None, in host memory only" % (device,))
    return d.index if d.index is not None else torch.cuda.current_device()


class _sigterm_as_exit:
    """SIGTERM raises SystemExit in the main thread while in effect, where SIGTERM still has its
    default action (which would end the process without cleaning up); elsewhere it does nothing."""

    def __enter__(self):
        self._previous = None
        if threading.current_thread() is threading.main_thread() and \
                signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
            self._previous = signal.signal(signal.SIGTERM, self._exit)
        return self

    @staticmethod
    def _exit(signum, frame):
        sys.exit(128 + signum)

    def __exit__(self, *exc):
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
        return False


class _BatchIndices:
    """The dataset indices of each batch a torch DataLoader yields, where its batch sampler says
    them: a map-style Dataset batched by the DataLoader, its batches delivered in order. For the
    run, the DataLoader's batch sampler is one that records each list of indices as the
    DataLoader's iterator takes it (workers prefetch ahead of what was yielded: a queue), and
    take() gives those of the batch just yielded. Restored when the run ends."""

    def __init__(self, loader):
        self._loader = loader
        self._inner = loader.batch_sampler
        self._taken = collections.deque()

    @staticmethod
    def applies(iterable, torch) -> bool:
        # DataLoader itself: a subclass may yield other batches than its sampler's, in another
        # order (a repeating sampler, batches re-yielded to even out ranks).
        data = torch.utils.data
        return (type(iterable) is data.DataLoader and iterable.batch_sampler is not None and
                not isinstance(iterable.dataset, data.IterableDataset) and getattr(iterable, "in_order", True))

    def __iter__(self):
        for indices in self._inner:
            self._taken.append(indices)
            yield indices

    def __len__(self):
        return len(self._inner)

    def __enter__(self):
        self._install(self)
        return self

    def __exit__(self, *exc):
        self._install(self._inner)
        return False

    def _install(self, sampler):
        # DataLoader refuses a new batch_sampler once made, so it is set underneath; a new
        # iterator reads it when made. One kept by persistent_workers holds the one it was made
        # with, and reads that at each epoch's start: it is set there too.
        object.__setattr__(self._loader, "batch_sampler", sampler)
        kept = getattr(self._loader, "_iterator", None)
        if kept is not None and hasattr(kept, "_index_sampler"):
            kept._index_sampler = sampler

    def take(self, count: int) -> Optional[List[int]]:
        """The indices of the batch just yielded, when it holds `count` samples (else None: a
        collate that changed the batch's size; its samples get positions)."""
        if not self._taken:
            return None
        try:
            indices = [int(i) for i in self._taken.popleft()]
        except (TypeError, ValueError):  # not dataset indices (keys, (index, size) pairs, ...)
            return None
        return indices if len(indices) == count else None


class Producer:
    """Publishes the batches of `iterable` (e.g. a torch DataLoader) under `name`.

    Args:
      iterable: anything iterable once per epoch; each item a batch (see the module docstring).
      name: what consumers connect to (coloader.Loader(name)).
      batch_size: the most samples one batch carries; default: iterable.batch_size, else the
        first batch's size.
      window: how many batches the producer may run ahead of how far the slowest consumer has
        read (the ring has this many slots and a few spares).
      min_consumers: the first epoch starts when this many consumers are attached.
      epoch_samples: samples per epoch, for len() on the consumers; default: len() of the
        DataLoader's sampler (or dataset), when it has one.
      tcp: also serve consumers on other machines at this tcp:// endpoint ("tcp://0.0.0.0:5555";
        port * picks a free one, see tcp_endpoint). They read the host path, batches sent over
        the network. It needs curve_key (this producer's key pair, from `coloader keygen`) and
        authorized_keys (a file of the consumers' public keys), or insecure=True.
      device: "cuda:N" also places every batch in GPU N's memory, for consumers that read the
        device path; None (the default) serves host memory only.
      max_shapes: {field: shape}, the most one sample of a field may hold, for fields whose
        batches can grow past the first batch's (a field named by its path, '["input_ids"]',
        '[0][*]' for the items of a list of samples, or a top-level key or index); the ring is
        sized for it.
      pad: the value a padded field is filled with past each batch's shape: one for every field
        or {field: value}; default 0 (False). Give the value your collate pads with (e.g.
        {"labels": -100}): consumers at other batch sizes see it where they mix batches.
      samples: the paths of the lists (or tuples) in a batch that hold one tensor (or structure
        of tensors) per sample; found by themselves in a DataLoader's batches when their length
        is its batch size and some tensor in them is not batched (docs/DESIGN.md).

      alone_timeout: once the first epoch has started (min_consumers attached), the run ends
        when no consumer has been attached for this many seconds: run() returns "consumers gone"
        and publish() False. None (or 0) waits for consumers forever (one may come back, e.g. a
        job restarting from a checkpoint that takes longer). Before the first epoch the
        producer waits for min_consumers however long it takes.

    run(epochs) publishes that many epochs, waits until the consumers have released every batch
    and returns "delivered"; or returns "consumers gone" when they all left first (the log line
    says how far it got). When the iterable raises (or a batch breaks the schema, or Ctrl-C),
    run() re-raises it, and every consumer reads what was published, then gets ProducerStopped
    naming the exception, its epoch cut (partial): a failed stream never ends as a delivered
    one. publish() blocks while the ring is full (the slowest consumer sets the pace), in steps
    short enough for Ctrl-C. In the main thread, run() turns SIGTERM into
    SystemExit for its duration, so that a stopped producer removes its ring and socket as
    `coloader serve` does.
    """

    def __init__(self, iterable: Iterable[Any], name: str, batch_size: Optional[int] = None, *, window: int = 4,
                 min_consumers: int = 1, epoch_samples: Optional[int] = None, heartbeat: Optional[float] = None,
                 heartbeat_timeout: Optional[float] = None, tcp: Optional[str] = None, curve_key: Optional[str] = None,
                 authorized_keys: Optional[str] = None, insecure: bool = False, alone_timeout: Optional[float] = 10.0,
                 device: Union[str, "torch.device", None] = None, max_shapes: Optional[Dict[Any, Sequence[int]]] = None,
                 pad: Union[float, bool, Dict[Any, Union[float, bool]]] = 0,
                 samples: Optional[Sequence[Any]] = None) -> None:
        import torch

        self._torch = torch
        self._iterable = iterable
        self._name = name
        self._batch_size = batch_size or getattr(iterable, "batch_size", None)
        self._window = int(window)
        self._min_consumers = int(min_consumers)
        self._epoch_samples = epoch_samples if epoch_samples is not None else self._guess_epoch_samples(iterable)
        self._heartbeat = heartbeat
        self._heartbeat_timeout = heartbeat_timeout
        self._tcp = tcp
        self._curve_key = curve_key
        self._authorized_keys = authorized_keys
        self._insecure = bool(insecure)
        self._alone_timeout = alone_timeout
        self._device = _device_index(device, torch)
        self.ended = None  # how the run ended: "delivered", "consumers gone", "failed" (set by close)
        self._tcp_endpoint = None
        self._ptr = None
        self._schema = None  # stated by the first batch (_structure.Schema)
        self._max_shapes = dict(max_shapes or {})
        self._pad = pad
        self._sample_lists = frozenset(_structure.as_path(p) for p in (samples or ()))

    @staticmethod
    def _guess_epoch_samples(iterable):
        for attr in ("sampler", "dataset"):
            obj = getattr(iterable, attr, None)
            try:
                n = len(obj) if obj is not None else None
            except TypeError:
                n = None
            if n is not None:
                if getattr(iterable, "drop_last", False) and getattr(iterable, "batch_size", None):
                    n -= n % iterable.batch_size
                return n
        return 0

    def _open(self, flat):
        """Opens the producer with the schema of the first batch."""
        torch = self._torch
        found = {path: n for path, n in flat.lists}
        unknown = sorted(self._sample_lists - set(found))
        if unknown:
            raise ValueError("samples names %s, which the first batch has no list or tuple at"
                             % ", ".join("batch" + p for p in unknown))
        for path in sorted(set(found) - self._sample_lists):
            logging.getLogger("coloader.producer").info(
                "batch%s is taken for a list of samples (%d alike items, the batch size, none of %d samples): its items "
                "travel at their own shapes", path, found[path], found[path])
        schema = _structure.Schema(flat, self._max_shapes, self._pad)
        if not flat.leaves:
            raise TypeError("the first batch holds no tensor (%s): coloader.Producer publishes tensors"
                            % schema.structure)
        codes = _dtype_codes(torch)
        rows = schema.fields()
        if len(rows) > _lib.MAX_FIELDS:
            raise ValueError("the batch has %d tensors%s: coloader carries at most %d" % (
                len(flat.leaves), " (and one for their shapes)" if len(rows) > len(flat.leaves) else "",
                _lib.MAX_FIELDS))
        fields = (_lib.Field * len(rows))()
        for f, (path, dtype, room, flags) in zip(fields, rows):
            dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
            if dtype not in codes:
                raise TypeError("batch%s is %s: coloader carries %s" % (path, dtype, ", ".join(
                    str(d).replace("torch.", "") for d in codes)))
            if len(room) > _lib.MAX_FIELD_DIMS:
                raise ValueError("batch%s has %d dimensions per sample (at most %d): reshape it in collate_fn"
                                 % (path, len(room), _lib.MAX_FIELD_DIMS))
            f.path = path.encode()
            f.dtype = codes[dtype]
            f.ndim = len(room)
            for i, d in enumerate(room):
                f.shape[i] = int(d)
            f.flags = flags
        opts = _lib.ProducerOptions()
        opts.name = self._name.encode()
        opts.batch_size = int(self._batch_size or schema.count)
        opts.fields = fields
        opts.num_fields = len(rows)
        opts.structure = schema.wire_structure.encode()
        opts.on_device = 1 if self._device >= 0 else 0
        opts.device = max(0, self._device)
        opts.window = self._window
        opts.min_consumers = self._min_consumers
        opts.epoch_samples = int(self._epoch_samples or 0)
        opts.heartbeat_ms = int(self._heartbeat * 1000) if self._heartbeat else 0
        opts.heartbeat_timeout_ms = int(self._heartbeat_timeout * 1000) if self._heartbeat_timeout else 0
        opts.tcp_endpoint = str(self._tcp).encode() if self._tcp else None
        opts.curve_key_file = str(self._curve_key).encode() if self._curve_key else None
        opts.authorized_keys_file = str(self._authorized_keys).encode() if self._authorized_keys else None
        opts.insecure = 1 if self._insecure else 0
        opts.alone_timeout_ms = min(2**31 - 1, max(1, int(self._alone_timeout * 1000))) if self._alone_timeout else 0
        ptr = ctypes.c_void_p()
        # Held before the call: a signal (Ctrl-C) handled as it returns must find the producer
        # to close, whose socket and ring exist by then (the library fills `ptr` in place).
        self._schema = schema
        self._ptr = ptr
        try:
            _lib.check_producer(_lib.producer_lib().coloader_producer_open(ctypes.byref(opts), ctypes.byref(ptr)))
        except BaseException:
            if not ptr.value:
                self._ptr = self._schema = None
            raise
        self._tcp_endpoint = _lib.producer_lib().coloader_producer_tcp_endpoint(ptr).decode() or None

    @property
    def schema(self) -> Optional[List[Tuple[str, "torch.dtype", Tuple[int, ...]]]]:
        """[(path, dtype, the most one sample holds)] of the batches, as the first batch (and
        max_shapes) stated them (None before it). The items of a list of samples have paths
        such as '[0][*]'."""
        s = self._schema
        return None if s is None else [(p, d, s.storage_shape(i)) for i, (p, d) in enumerate(zip(s.paths, s.dtypes))]

    @property
    def tcp_endpoint(self) -> Optional[str]:
        """The tcp:// endpoint remote consumers connect to, its port resolved: known once the
        first batch has opened the producer (None before, and without tcp)."""
        return self._tcp_endpoint

    def publish(self, batch: Any, indices: Optional[Sequence[int]] = None) -> bool:
        """Publishes one batch (blocks while every slot is in use). True once published; False
        when the run has ended because its consumers all left (alone_timeout). The first batch
        states the schema; a later one that breaks it raises ValueError naming the tensor.
        `indices`: the samples' dataset indices, one per sample (consumers' loader.indices);
        None: their positions in the epoch."""
        flat, count = self._prepare(batch)
        return self._publish(flat, count, indices)

    def _prepare(self, batch):
        """(the batch as leaves, its sample count), checked against the schema (the first batch
        states it and opens the producer)."""
        s = self._schema
        if s is None:
            flat = _structure.flatten(batch, self._torch, self._sample_lists, guess=self._batch_size)
            self._open(flat)
        else:
            flat = _structure.flatten(batch, self._torch, s.sample_lists)
        return flat, self._schema.check(flat)

    def _publish(self, flat, count, indices):
        if indices is not None and len(indices) != count:
            raise ValueError("publish() got %d indices for a batch of %d samples" % (len(indices), count))
        leaves = self._schema.pack(flat, count, self._torch)
        pointers = (ctypes.c_void_p * len(leaves))(*[t.data_ptr() for t in leaves])
        lib, ptr = _lib.producer_lib(), self._ptr
        if _lib.wait_producer(lambda ms: lib.coloader_producer_wait(ptr, ms)) == _lib.END:
            return False
        index_array = None if indices is None else (ctypes.c_int64 * count)(*indices)
        rc = _lib.check_producer(lib.coloader_producer_publish(ptr, pointers, count, index_array))
        return rc != _lib.END

    def end_epoch(self) -> None:
        if self._ptr is not None:
            _lib.check_producer(_lib.producer_lib().coloader_producer_end_epoch(self._ptr))

    def run(self, epochs: int = 1) -> str:
        """Publishes `epochs` epochs of the iterable, then close()s. Returns how it ended:
        "delivered" (every batch published and released) or "consumers gone"."""
        recorded = _BatchIndices(self._iterable) if _BatchIndices.applies(self._iterable, self._torch) else None
        with _sigterm_as_exit(), (recorded if recorded is not None else contextlib.nullcontext()):
            source = "its %s" % type(self._iterable).__name__
            epoch = batches = 0
            doing = source
            try:
                for epoch in range(epochs):
                    batches = 0
                    for batch in self._iterable:
                        doing = "publishing its batch"
                        flat, count = self._prepare(batch)
                        indices = None if recorded is None else recorded.take(count)
                        if not self._publish(flat, count, indices):
                            return self.close()
                        doing = source
                        batches += 1
                    self.end_epoch()
                doing = None  # every epoch is published: what follows is the wait for the releases
                return self.close()
            except BaseException as e:
                if doing is None:  # interrupted while waiting at the end: stopped, not failed
                    self.close(timeout=5.0)
                else:
                    self.fail(e, "%s raised" % doing, "epoch %d, after %d batches" % (epoch, batches))
                raise

    def fail(self, error: Union[BaseException, str], what: Optional[str] = None, where: Optional[str] = None) -> str:
        """Ends the stream because the data failed (`error`: the exception, or a message):
        consumers read what was published, then get ProducerStopped naming it, their epoch cut.
        run() and a `with` block that raises call it; call it yourself when you publish() in a
        loop of your own. Waits at most 5 s for consumers to release their batches."""
        if self._ptr is None or not self._ptr.value:
            return self.ended
        if isinstance(error, BaseException):
            said = str(error)
            error = type(error).__name__ + (": " + said if said else "")
        why = (what + " " if what else "") + error + (" (%s)" % where if where else "")
        _lib.producer_lib().coloader_producer_fail(self._ptr, why.encode("utf-8", "replace"))
        self.close(timeout=5.0)  # consumers are told; do not wait on them for long
        self.ended = "failed"
        return self.ended

    def close(self, timeout: Optional[float] = None) -> str:
        """Waits until consumers released every batch (at most `timeout` seconds; None waits
        while any consumer lives, and alone_timeout once none does), tells them the producer is
        done, and frees it. Returns how the run ended (also in .ended): "delivered", "consumers
        gone", or "stopped" when `timeout` passed first."""
        if self._ptr is None or not self._ptr.value:  # (not opened, or its open failed)
            self._ptr = None
            return self.ended
        lib, ptr = _lib.producer_lib(), self._ptr
        # Wait in short steps, so that Ctrl-C and SIGTERM are heard while consumers read on (an
        # interrupted close leaves the producer open: the caller's handler closes it again).
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            step = _lib.WAIT_SLICE_MS if deadline is None else \
                max(0, min(_lib.WAIT_SLICE_MS, int((deadline - time.monotonic()) * 1000)))
            ended = _lib.check_producer(lib.coloader_producer_finish(ptr, step)) == 0
            if ended or (deadline is not None and time.monotonic() >= deadline):
                break
        self._ptr = None
        rc = lib.coloader_producer_close(ptr, 0 if ended else 1)  # 1 ms: stops a run still going
        if rc != _lib.E_TIMEOUT:
            _lib.check_producer(rc)
        if self.ended is None:
            self.ended = {_lib.END: "consumers gone", _lib.E_TIMEOUT: "stopped"}.get(rc, "delivered")
        return self.ended

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if exc[0] is not None:
            self.fail(exc[1])
        else:
            self.close()
        return False
