"""coloader.Loader: a DataLoader-like iterable over the batches of a running coloader producer.

    loader = coloader.Loader("imagenet", batch_size=96, timeout=60)
    for epoch in range(90):
        for images, labels in loader:          # one iter() is one epoch
            images = images.to("cuda", non_blocking=True)
            ...

    # Or, with a producer started with --device cuda:0, straight from its GPU memory:
    loader = coloader.Loader("imagenet", batch_size=96, device="cuda")
    for images, labels in loader:              # CUDA tensors, copied on the GPU for this job
        ...

The contract (docs/DESIGN.md "What a training job can rely on")
    Isolation: a batch is the job's own. Whatever it does to its tensors (in-place ops, keeping
    them) changes nothing another job sees and never crashes the job.
      * Host path: the tensors view this consumer's private copy-on-write mapping of the
        producer's slot. Reading is zero-copy; a page the job writes becomes its own (the
        producer's memory and every other job's batch stay as they were).
      * Device path: each batch is copied on the GPU, on the job's stream, into memory of its
        own (tens of microseconds per batch on an H200: docs/BENCHMARKS.md), and the producer's
        slot goes back as soon as the copy is done.
      * zero_copy=True opts out, for a job that promises never to write its batches: the host
        tensors view the producer's memory mapped read-only (a write faults: SIGSEGV), the device
        tensors the producer's GPU memory itself (a write there changes what every other job
        reads: CUDA IPC mappings cannot be made read-only).
    Holding: keeping batches (a list for logging) stalls nobody. When the producer needs a slot
    back, the batch kept in it is copied into the job's own memory first, at the same address,
    so the tensors never change. A job that stops reading (an evaluation, a checkpoint) holds the
    others back for the producer's --lag-timeout-ms at most: its unread batches go back, and
    when it reads again it gets the rest of its epoch (decoded again), then whole epochs. A DDP
    rank, or a job over tcp://, is detached instead after --stall-timeout-ms while others wait
    (ConsumerDetached, saying so); a Timeout names the consumer that holds the producer back.
    Endings: when the producer has served every epoch it was started for, a further epoch is
    empty at once (the loop body does not run; a FinishedWarning says so once, and `finished`
    is True), whatever tensors are still held. A producer stopped (SIGTERM), killed or crashed
    before that raises ProducerStopped after the last batch it delivered, naming it, its pid,
    how it ended and where the stream stopped; the cut epoch is `partial`. Never a quiet end.
    Waiting: every wait (for the producer to start, its handshake, a batch, an epoch) returns to
    Python at least every 0.1 s, so Ctrl-C raises KeyboardInterrupt at once, and each ends with
    the producer's death.

Memory and lifetime
    While any tensor of a batch is alive, its memory stays: each batch has one owner object
    (coloader._batches.BatchLease) that holds the C lease, and every array and tensor over the
    batch holds it. When the last one goes (the usual rebinding in the next loop iteration, or
    the garbage collector), the producer's slot is released, exactly once. Releasing never
    blocks, so it is safe from the garbage collector and from any thread. Closing the Loader
    (close(), the end of a `with` block, or its garbage collection) does not pull the memory
    from under tensors still alive: the consumer leaves the producer once the last is dropped.

The device path (device="cuda")
    With a producer started with `--device cuda:N`, images and labels are CUDA tensors on the
    producer's GPU: "cuda" and "cuda:N" both ask for CUDA tensors, and N (or the current
    device for "cuda") is the GPU this consumer computes on, which a producer with rings on
    several GPUs uses to choose one. The dtype is the producer's --output; labels are int64 on
    the same GPU; `loader.indices` stays a CPU tensor.

    Streams: next() makes the CUDA stream that is current at that moment (on the batch's
    device) wait for the producer's work on the batch, and copies it there, without
    synchronising the host. The tensors are therefore ready for work enqueued on that stream;
    to use them on another stream, make it wait first (`other.wait_stream(
    torch.cuda.current_stream())`), or synchronise. The batch's memory is freed when its last
    tensor goes, ordered after the work enqueued on that same stream by then; work queued on
    other streams is not waited for (`tensor.record_stream()` does not help: the memory is not
    torch's allocator's). One stream per Loader is the intended use; when the current stream
    changes between batches, the new stream is made to wait for the previous one. (With
    prefetch, the batch ahead is copied on the stream that was current at the previous next();
    if another is current when it is handed out, that one is made to wait for it, and its
    memory is freed after the work of both.) A caller-fed producer's field cut to its batch's
    shapes (coloader.Producer, shapes that vary) is a copy in torch's memory, made on the
    batch's stream, and recorded on the one it is handed out on.

    Fallback: when the producer has no device ring, this process cannot map it (another
    container, a MIG instance), or PyTorch has no CUDA, the Loader warns once
    (DeviceFallbackWarning, with the reason) and yields CPU tensors as without `device`.
    `loader.on_device` and `loader.fallback_reason` tell which path is used.

Epochs
    Each iter(loader) starts an epoch. Starting one before the previous finished skips the
    rest of the previous one (it is released unread), except after a peek: a pass left after
    its first batch (next(iter(loader))) costs that batch, not the epoch, and the next iter()
    continues that epoch, the peeked batch first (a copy of it as the job left it, made then:
    what the loop writes does not reach the peeked tensors; one batch short if the job let go of
    it); once per epoch. A consumer that joins while the producer
    is mid-epoch reads the rest of that epoch with the others, then the samples it missed,
    decoded again for it alone (catch-up): every epoch is whole. Where the producer cannot do
    that (`serve --no-catch-up`, a coloader.Producer, a consumer group), the first epoch is the
    rest of the one it joined, with `loader.partial` True and a PartialEpochWarning saying why;
    `wait_for_epoch=True` joins at the next boundary instead. After load_state_dict() the first
    epoch is the rest of the saved one (`partial` True unless the state was at its start, no
    warning). len(loader) is the number of batches of a whole epoch for this batch size. The consumer attaches to the
    producer (is counted, and waited for) at its first iter(): a Loader made early and not
    iterated yet holds nobody back.

Layout
    Images come NCHW, as torchvision gives them. A producer serving uint8 (`--output uint8`,
    NHWC in memory) gives NCHW tensors with channels_last strides, which convolutions read
    fastest; layout="nhwc" gives the NHWC shape instead.

DataLoader's arguments
    num_workers, pin_memory, pin_memory_device, shuffle, persistent_workers, prefetch_factor,
    worker_init_fn, multiprocessing_context, generator and in_order are accepted, with a
    one-time IgnoredArgumentWarning saying what the producer does in their place.
    `len(loader.dataset)`, `loader.sampler.set_epoch(e)`, `len(loader.sampler)`,
    `loader.batch_size` and `loader.drop_last` mean what they mean in torch.

Distributed jobs and resume (docs/DISTRIBUTED.md, coloader/distributed.py)
    The ranks of a data-parallel job form a consumer group: each gets its share of every epoch,
    all the same number of batches (len(loader) per rank). rank=None reads torch.distributed,
    torchrun or Slurm (repr says which). A rank that leaves ends its group: the others get
    coloader.GroupBroken. A group that misses ranks says so within group_wait seconds.
    state_dict()/load_state_dict() checkpoint and resume the position (a job alone resumes
    exactly even while the producer serves others: it serves the rest of the saved epoch); a
    state that does not fit is refused before anything is read.

Waiting
    timeout=0 waits for a batch as long as the producer lives. A timeout raises
    coloader.Timeout, after which next() may be called again and resumes the batch it
    interrupted (a batch that straddles producer slots keeps what it had gathered). The timeout
    counts from the call of next(), not from the previous batch: a job may compute for longer.

Prefetch
    On the device path, as next() hands out a batch, a thread of the Loader's takes the next one
    from the producer (its copy queued on the job's stream) and makes its tensors, so that the
    next next() only hands over what is ready (27-40 µs instead of 180-290 on an H100 for a
    batch of token tensors: docs/BENCHMARKS.md, "Token batches"). One batch ahead,
    never more, and never at iter(); the batch ahead is counted (state_dict(), indices) only when
    handed out, and discarded unread by iter() (kept when it continues a peek), load_state_dict()
    and close(). It holds a copy of
    its own, not the producer's memory: on the host path or with zero_copy it would hold a ring
    slot, one more per consumer than the producer's spare slots are counted for, so there it is
    off unless prefetch=True (then give the producer a --spare-slots more).

Threads
    A Loader and its iterators are for one thread at a time (its own prefetch thread aside).
    Tensors may be dropped anywhere.
"""

from __future__ import annotations

import ctypes
import os
import warnings
import weakref
from typing import TYPE_CHECKING, Any, List, Optional, Tuple, Union

import numpy as np

from . import _batches, _lib, _prefetch, _structure
from ._dataloader import IgnoredArgumentWarning, _Dataset, _note_dataloader_arguments, _Sampler
from ._passes import _EpochIterator
from ._taking import _Taking
from .distributed import ResumeWarning, _Stateful, _topology

if TYPE_CHECKING:
    import torch


class DeviceFallbackWarning(RuntimeWarning):
    """Loader(device="cuda") is using host memory, and yields CPU tensors (see the message)."""


class FinishedWarning(UserWarning):
    """An epoch was asked for after the producer served every epoch it was started for: it is empty."""


class PartialEpochWarning(UserWarning):
    """The Loader joined mid-epoch and the producer cannot serve it the samples it missed: this
    epoch is the rest of the one it joined (`loader.partial`); the message says why."""


class Loader(_Taking, _Stateful):
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
      device: None or "cpu": CPU tensors. "cuda" or "cuda:N": CUDA tensors from the producer's
        GPU memory (the device path: no host round trip, no host synchronisation). N (default:
        the current device) is the GPU this process computes on, which a producer with several
        GPUs uses to pick the ring it serves from. If the device path is not possible (the
        producer runs without --device, its GPU cannot be mapped from here, or PyTorch has no
        CUDA), a DeviceFallbackWarning says why and the batches are CPU tensors; see on_device
        and fallback_reason. Another device type (e.g. "xpu") gets each batch copied there.
      zero_copy: views of the producer's memory itself, for a job that promises never to write
        its batches (see "Isolation" in the module docstring). Default False: the batches are
        the job's own.
      layout: "nchw" (default) or "nhwc": the shape images come in, whatever the producer's
        memory layout (the other is a strided view, no copy).
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
      group_wait: seconds a group member waits for its group's first batch before it asks the
        producer whether every rank came, and fails naming those that did not.
      prefetch: take the next batch and make its tensors on a thread of the Loader's while the
        job computes (see "Prefetch"). None: where that holds no producer memory (the device
        path, without zero_copy); True: on the host path too; False: in next().
      **dataloader_args: DataLoader's num_workers, pin_memory, shuffle, ... (see "DataLoader's
        arguments"); anything else is a TypeError.
    """

    def __init__(self, name: Optional[str] = None, batch_size: Optional[int] = None, *, drop_last: bool = False,
                 timeout: float = 0, wait_for_epoch: bool = False, endpoint: Optional[str] = None,
                 device: Union[str, "torch.device", None] = None, connect_timeout: float = 5.0,
                 client_name: Optional[str] = None, wait_for_producer: float = 60, curve_key: Optional[str] = None,
                 server_key: Optional[str] = None, rank: Optional[int] = None, world_size: Optional[int] = None,
                 group: Optional[str] = None, node_rank: Optional[int] = None, num_nodes: Optional[int] = None,
                 zero_copy: bool = False, layout: str = "nchw", group_wait: float = 20.0,
                 prefetch: Optional[bool] = None, **dataloader_args: Any) -> None:
        import torch  # imported here so that `import coloader` works without torch

        _note_dataloader_arguments(dataloader_args)
        self._torch = torch
        self._session = None
        self._fields = None  # a caller-fed producer's schema: [(path, torch dtype, room, bytes)]
        self._rebuild = None  # its batches' structure (_structure.compile_rebuild)
        self._shapes_field = None  # the field of the samples' shapes, when they vary
        self._generation = 0
        self._classes = None        # the producer's class names, read once when asked for
        self._indices = None        # the last batch's dataset indices: a tensor made when asked for,
        self._indices_bytes = None  # from these bytes (copied at next(): the slot may go first)
        self._count = 0             # samples in the last batch
        self._ahead_timeout = None  # the library's Timeout while taking the batch ahead
        # The batch ahead (coloader/_prefetch.py): the thread holds this Loader only while it takes.
        self._prefetch = _prefetch.Prefetcher(weakref.WeakMethod(self._take), "coloader-prefetch")
        self._prefetch_wanted = prefetch
        self._prefetching = False  # decided at each connection (the path may change)
        self._seen = 0  # samples yielded in the current epoch (state_dict)
        # The pass under way (__iter__): batches it yielded, whether its epoch ended, whether it
        # continues a peek, and a copy of its first batch while that is all it yielded.
        self._pass_yielded, self._pass_ended, self._pass_continues, self._first = 0, False, False, None
        self._read_on = None  # the CUDA stream the last batch was ordered on (_taking.py)
        self._started = False  # an epoch was begun (load_state_dict must then reconnect)
        self._resume_warned = False
        self._finished_warned = False
        self._partial_warned = False
        self._resumed = False  # load_state_dict(): a resumed epoch is the rest of the saved one
        self._explicit_topology = rank is not None or world_size is not None
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
        for what, value in (("timeout", timeout), ("connect_timeout", connect_timeout),
                            ("wait_for_producer", wait_for_producer), ("group_wait", group_wait)):
            if value is None or value < 0:
                raise _lib.InvalidArgument("%s must be >= 0 seconds, got %r" % (what, value), _lib.E_INVALID)
        if layout not in ("nchw", "nhwc"):
            raise _lib.InvalidArgument("layout must be 'nchw' or 'nhwc', got %r" % (layout,), _lib.E_INVALID)
        self._layout = layout
        self._zero_copy = bool(zero_copy)
        self._device = None         # another accelerator: batches are copied there
        self._cuda = None           # torch.cuda, when the device path is in use
        self._cuda_device = None    # the GPU whose current stream next() passes down
        self._streams = _batches.StreamOrder(torch)  # the stream each batch is ordered on
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
                           client_name, wait_for_producer, curve_key, server_key, group_wait)
        self._connect(self._options())
        if self._fallback:
            warnings.warn("coloader.Loader(%r, device=%r) reads host memory and yields CPU tensors: %s"
                          % (name or endpoint, device, self._fallback), DeviceFallbackWarning, stacklevel=2)

    def _options(self, resume=None):
        """The C options for this Loader; `resume`: a checked state to resume on connecting."""
        (name, endpoint, batch_size, drop_last, wait_for_epoch, connect_timeout, timeout, client_name,
         wait_for_producer, curve_key, server_key, group_wait) = self._opts_args
        ms = lambda seconds: max(1, int(round(seconds * 1000))) if seconds else 0  # noqa: E731
        opts = _lib.ConsumerOptions()
        opts.name = name.encode() if name else None
        opts.endpoint = endpoint.encode() if endpoint else None
        opts.batch_size = int(batch_size) if batch_size is not None else 0
        opts.drop_last = 1 if drop_last else 0
        opts.wait_for_epoch = 1 if wait_for_epoch else 0
        opts.connect_timeout_ms = max(1, ms(connect_timeout))
        opts.timeout_ms = ms(timeout)
        opts.client_name = client_name.encode() if client_name else None
        opts.device = 1 if self._want_cuda else 0
        opts.wait_for_producer_ms = ms(wait_for_producer)
        opts.curve_key_file = os.fsencode(curve_key) if curve_key else None
        opts.curve_server_key = os.fsencode(server_key) if server_key else None
        opts.group = self.group.encode() if self.group else None
        opts.rank = self.rank
        opts.world_size = self.world_size
        opts.node_rank = self.node_rank if self.node_rank is not None else 0
        opts.num_nodes = self.num_nodes if self.num_nodes is not None else 0
        opts.zero_copy = 1 if self._zero_copy else 0
        opts.group_wait_ms = max(1, ms(group_wait))
        if resume is not None:
            opts.has_expect_seed = 1
            opts.expect_seed = int(resume["seed"])
            opts.expect_data_key = str(resume["data_key"]).encode()
            opts.resume = 1
            opts.resume_epoch = int(resume["epoch"])
            opts.resume_begin = int(resume.get("split_begin", 0))
            opts.resume_samples = int(resume["samples_seen_in_epoch"])
            opts.resume_origin = int(resume.get("split_origin", 0))
        return opts

    def _connect(self, opts):
        lib = _lib.lib()
        ptr = ctypes.c_void_p()
        _lib.check(lib.coloader_consumer_open_start(ctypes.byref(opts), ctypes.byref(ptr)))
        session = _batches.Session(ptr.value)  # closes the attempt on any exception below
        cuda = self._torch.cuda if self._want_cuda else None
        previous = cuda.current_device() if cuda is not None else None
        try:
            if cuda is not None:
                # The consumer tells the producer the UUID of this thread's current device;
                # mapping the producer's memory makes its GPU current: both are undone here.
                cuda.set_device(self._cuda_device)
            _lib.wait(lambda ms: lib.coloader_consumer_open_wait(ptr, ms))
        finally:
            if cuda is not None:
                cuda.set_device(previous)
        self._read_schema(ptr.value)  # refused: `session` goes with this frame and closes
        self._session = session
        if self._want_cuda:
            if lib.coloader_consumer_on_device(ptr.value):
                self._cuda, self._fallback = self._torch.cuda, ""
            else:
                self._cuda = None  # a reconnect may fall back where the first connection did not
                reason = lib.coloader_consumer_fallback_reason(ptr.value)
                self._fallback = reason.decode("utf-8", "replace") if reason else "unknown reason"
        # A batch ahead on the host path, or zero-copy, holds a slot of the producer's ring: one
        # more per consumer than the ring's spares are counted for (--spare-slots).
        wanted = self._prefetch_wanted
        self._prefetching = wanted if wanted is not None else (self._cuda is not None and not self._zero_copy)

    def _read_schema(self, ptr):
        """A caller-fed producer's schema, checked at connect (_batches.read_schema)."""
        self._fields, self._rebuild, self._shapes_field = _batches.read_schema(self._torch, ptr)

    @property
    def schema(self) -> Optional[List[Tuple[str, "torch.dtype", Tuple[int, ...]]]]:
        """A caller-fed producer's batches (coloader.Producer): [(path, dtype, the most one sample
        holds)]; None for a producer of images (`coloader serve`), whose batches are (images,
        labels)."""
        self._require_open()
        return None if self._fields is None else [(p, d, s) for p, d, s, _ in self._fields
                                                  if p != _structure.SHAPES_PATH]

    # -- iteration -----------------------------------------------------------------------

    def __iter__(self):
        """Starts the next epoch (skipping what is left of the current one). A peek (a pass left
        after its first batch, as next(iter(loader)) does) costs that batch, not the epoch: the
        next pass is the same epoch, its first batch yielded again (a copy of it as the job left
        it; if the job let go of it, the pass is the rest, one batch short), then the rest. Only
        once: a pass that continues a peek and is itself left after one batch ends that epoch."""
        session = self._session  # read once: close() on another thread may clear it
        if session is None:
            raise _lib.ColoaderError("the loader is closed")
        ptr = session.ptr
        first, self._first = self._first, None
        self._generation += 1
        if first is not None and self._pass_yielded == 1 and not self._pass_ended:
            # A peek: this pass continues its epoch (the batch ahead, if any, is this pass's), from
            # the peeked batch if the job still holds it, else from the one after it.
            self._pass_yielded, self._pass_continues = 0, True
            batch = first[0]()
            if batch is None:
                warnings.warn("coloader.Loader(%r): the batch peeked with next(iter(loader)) was let go, so this pass "
                              "is the rest of epoch %d, one batch short (keep the peeked batch, all of it, to get it "
                              "again first)" % (self.name or self._endpoint, self.epoch), stacklevel=2)
            replay = None if batch is None else (batch,) + first[1:]
            return _EpochIterator(self, self._generation, done=False, replay=replay)
        self._pass_yielded, self._pass_ended, self._pass_continues = 0, False, False
        if not self._started:
            self._check_topology_still_holds()
        self._discard_ahead()  # of the epoch it skips the rest of
        lib = _lib.lib()
        rc = _lib.wait(self._while_open(session, lambda ms: lib.coloader_consumer_next_epoch_wait(ptr, ms)))
        self._started = True
        # A resumed epoch counts what the saved state had seen.
        self._seen = int(lib.coloader_consumer_samples_seen(ptr))
        note = lib.coloader_consumer_resume_note(ptr)
        if note and not self._resume_warned:
            self._resume_warned = True
            warnings.warn("coloader.Loader(%r): the saved state could not be resumed exactly: producer %s"
                          % (self.name, note.decode("utf-8", "replace")), ResumeWarning, stacklevel=2)
        if rc != _lib.END and not self._partial_warned and not self._resumed and lib.coloader_consumer_partial(ptr):
            self._partial_warned = True
            why = lib.coloader_consumer_no_catch_up(ptr).decode("utf-8", "replace") or \
                "the producer resumed this epoch from a saved state (serve --resume) and serves the rest of it"
            warnings.warn("coloader.Loader(%r) joined epoch %d mid-way and gets only the rest of it (loader.partial): %s"
                          "; wait_for_epoch=True joins at the next epoch's start instead"
                          % (self.name or self._endpoint, int(lib.coloader_consumer_epoch(ptr)), why),
                          PartialEpochWarning, stacklevel=2)
        if rc == _lib.END and not self._finished_warned:
            self._finished_warned = True
            warnings.warn("coloader.Loader(%r): the producer has served every epoch it was started for "
                          "(coloader serve --epochs): this epoch, and any after it, is empty"
                          % (self.name or self._endpoint), FinishedWarning, stacklevel=2)
        return _EpochIterator(self, self._generation, done=(rc == _lib.END))

    def _check_topology_still_holds(self):
        """A Loader made before torch.distributed.init_process_group (mp.spawn) found no rank and
        would read every sample on every rank: say so before the first epoch."""
        if self._explicit_topology or self.world_size > 1 or self.group:
            return
        dist = getattr(self._torch, "distributed", None)
        if dist is not None and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            raise _lib.InvalidArgument(
                "coloader.Loader(%r) was made as a plain consumer (no rank found: %s), but torch.distributed is "
                "now initialised with rank %d of %d: every rank would read every sample. Make the Loader after "
                "torch.distributed.init_process_group, or pass rank=, world_size= and group="
                % (self.name, self._topology_source, dist.get_rank(), dist.get_world_size()), _lib.E_INVALID)

    def __len__(self) -> int:
        """Batches in a whole epoch for this consumer's batch size (and drop_last)."""
        return int(_lib.lib().coloader_consumer_len(self._require_open()))

    # -- state ---------------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        """The current epoch's number (the producer's count, from 0)."""
        return int(_lib.lib().coloader_consumer_epoch(self._require_open()))

    @property
    def partial(self) -> bool:
        """True when the current epoch is not whole: joined mid-way where the producer cannot
        catch it up (see PartialEpochWarning), or cut by the producer's stop."""
        return bool(_lib.lib().coloader_consumer_partial(self._require_open()))

    @property
    def finished(self) -> bool:
        """True once the producer has served every epoch it was started for (further epochs are empty)."""
        return bool(_lib.lib().coloader_consumer_finished(self._require_open()))

    @property
    def indices(self) -> Optional["torch.Tensor"]:
        """int64 tensor of the dataset indices of the last batch returned (a copy), or None."""
        if self._indices is None and self._indices_bytes is not None:
            # (numpy, not torch.frombuffer: that is torch >= 1.10, and Debian 11's torch is 1.7)
            self._indices = self._torch.from_numpy(np.frombuffer(bytearray(self._indices_bytes), dtype=np.int64))
        return self._indices

    @property
    def batch_size(self) -> int:
        return int(_lib.lib().coloader_consumer_batch_size(self._require_open()))

    @property
    def drop_last(self) -> bool:
        return bool(self._opts_args[3])

    @property
    def dataset(self) -> _Dataset:
        """An object whose len() is the dataset's size (all of it, not this node's shard)."""
        return _Dataset(self)

    def _class_names(self):
        if self._classes is None:
            ptr, lib = self._require_open(), _lib.lib()
            self._classes = tuple(lib.coloader_consumer_class_name(ptr, i).decode(errors="replace")
                                  for i in range(lib.coloader_consumer_num_classes(ptr)))
        return self._classes

    @property
    def sampler(self) -> _Sampler:
        """An object with set_epoch() and len() (this consumer's samples per epoch), as a
        DistributedSampler has."""
        if getattr(self, "_sampler", None) is None:
            self._sampler = _Sampler(self)
        return self._sampler

    @property
    def dataset_size(self) -> int:
        return int(_lib.lib().coloader_consumer_dataset_size(self._require_open()))

    @property
    def epoch_samples(self) -> int:
        """Samples in a whole epoch (this producer's shard of the dataset)."""
        return int(_lib.lib().coloader_consumer_epoch_samples(self._require_open()))

    @property
    def on_device(self) -> bool:
        """True when batches come as CUDA tensors from the producer's GPU memory (device path)."""
        self._require_open()
        return self._cuda is not None

    @property
    def fallback_reason(self) -> str:
        """Why device="cuda" was asked for but the batches are CPU tensors; "" otherwise."""
        return self._fallback

    @property
    def closed(self) -> bool:
        return self._session is None

    # -- lifetime ------------------------------------------------------------------------

    def close(self) -> None:
        """Ends this Loader. Tensors already handed out stay valid, and keep their memory, until
        they are dropped; the consumer leaves the producer when the last of them goes."""
        if getattr(self, "_prefetch", None) is not None:  # (a Loader whose __init__ failed has none)
            self._prefetch.close()
            self._ahead_timeout = None
        self._first = None
        self._generation = getattr(self, "_generation", 0) + 1  # its iterators end
        self._session = None

    def _discard_ahead(self):
        """Drops the batch taken ahead, unread (iter(), load_state_dict())."""
        self._prefetch.discard()
        self._ahead_timeout = None

    def __enter__(self) -> "Loader":
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass

    def _while_open(self, session, call):
        """`call` for _lib.wait, holding `session` (its consumer stays alive while the wait goes
        on) and ended by a ColoaderError once this Loader is closed, e.g. from another thread."""
        def bounded(ms):
            if self._session is not session:
                raise _lib.ColoaderError("the loader was closed while this call waited in it")
            return call(ms)
        return bounded

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
