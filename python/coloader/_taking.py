"""How coloader.Loader takes a batch from the library and makes it tensors (mixed into it): the
take itself (here, or ahead on the prefetch thread: _prefetch.py), and the views over the
batch's memory, host or device, images and labels or a caller-fed producer's fields, in the
layout the Loader gives."""

import ctypes
import time

import numpy as np

from . import _batches, _lib, _prefetch, _structure


class _Taking:
    """Loader's taking of batches (loader.py holds the state these methods use)."""

    def _next(self, session):
        """The next batch as (images, labels), or None at the end of the epoch."""
        stream, handle = (None, None) if self._cuda is None else self._streams.current(self._cuda_device, session)
        self._read_on = stream  # the stream the batch handed out is ordered on (a peek's copy follows it)
        ahead = self._prefetch if self._prefetching else None
        if ahead is None or not ahead.outstanding:
            # Nothing taken ahead (the first batch of an epoch): taken here, as without prefetch.
            taken = self._take((session, stream, handle), None)
        else:
            timeout = self._opts_args[6]
            taken = ahead.collect(timeout if timeout else None)
            # The take began before this call, so the library's own Timeout, which names who
            # holds the producer back, comes soon after ours (the take waits on past it): within
            # a wait slice, and the 1 s the library waits for the producer's status answer.
            grace = time.monotonic() + 1.5
            while taken is _prefetch.TIMED_OUT and self._ahead_timeout is None and time.monotonic() < grace:
                taken = ahead.collect(0.01)
            if taken is _prefetch.TIMED_OUT:
                said, self._ahead_timeout = self._ahead_timeout, None
                raise said or _lib.Timeout(
                    "no batch from %r within %g s" % (self.name or self._endpoint, timeout), _lib.E_TIMEOUT)
        if taken is None:
            self._ahead_timeout = None
            return None
        batch, lease, count, indices = taken
        del taken
        if ahead is not None:
            taken_on = lease._order
            if stream is not None and taken_on is not stream:
                # Taken ahead on the stream current at the previous next(); this one reads it, and
                # the release must follow its work too. Fields cut to the batch's shapes are
                # torch's memory, allocated on that stream: it must not reuse them before this
                # one's work is done.
                stream.wait_stream(taken_on)
                for t in lease._copies or ():
                    t.record_stream(stream)
                if lease._wait is None:
                    lease._wait = (taken_on, stream.device.index)
            self._ahead_timeout = None
            ahead.ask((session, stream, handle))
        lease._copies = None  # handed out: the copies are the job's, not the lease's to keep
        del lease
        self._count, self._indices, self._indices_bytes = count, None, indices
        return batch

    def _take(self, args, cancelled):
        """Takes the next batch from the library: (the batch, its lease, its sample count, its
        indices' bytes), or None at the end of the epoch. `cancelled` None: in next(), with the
        Loader's timeout; else on the prefetch thread, waiting past it until `cancelled()`."""
        session, stream, handle = args
        out = ctypes.c_void_p()
        lib = _lib.lib()
        ptr = session.ptr
        call = lambda ms: lib.coloader_consumer_next_batch_wait(ptr, handle, ms, ctypes.byref(out))  # noqa: E731
        if cancelled is None:
            rc = _lib.wait(self._while_open(session, call))
        else:
            while True:
                if cancelled():
                    return None
                rc = call(_lib.WAIT_SLICE_MS)
                if rc == _lib.E_TIMEOUT:
                    # The job's timeout is next()'s to apply, from its own call: kept for it, as
                    # the library says who holds the producer back, and waited on past.
                    try:
                        _lib.check(rc)
                    except _lib.Timeout as e:
                        self._ahead_timeout = e.with_traceback(None)  # its frames would hold this Loader
                elif rc != _lib.AGAIN:
                    _lib.check(rc)
                    break
        if rc == _lib.END:
            return None
        # The library leaves the caller's current device as it was (it makes the producer's GPU
        # current only within each call).
        lease = _batches.BatchLease(out.value, session, self._cuda if handle is not None else None)
        lease._order = stream
        batch, count, indices = self._wrap(lease, stream)
        return batch, lease, count, indices

    def _wrap(self, lease, stream=None):
        """(the batch, its sample count, its dataset indices as bytes). On an error, the lease is
        released when the last view made so far goes."""
        info = _lib.BatchInfo()
        _lib.check(_lib.lib().coloader_batch_info_get(lease._ptr, ctypes.byref(info)))
        # Copied now (loader.indices must not keep the slot held after the batch is dropped):
        # one call; the tensor is made if loader.indices is read.
        n, indices = info.size, ctypes.string_at(info.indices, 8 * info.size)
        if self._fields is not None:
            return self._wrap_fields(lease, info, stream), n, indices
        numpy_dtypes, typestrs, bfloat16_code = _batches.dtype_tables()
        dtype = numpy_dtypes.get(info.dtype)
        if dtype is None:
            raise _lib.ProtocolError("the producer's batches have an unknown dtype code %d" % info.dtype,
                                     _lib.E_PROTOCOL)
        torch = self._torch
        shape = tuple(info.shape[i] for i in range(info.ndim))
        if info.device >= 0:
            # The producer's GPU may not be the one this Loader computes on: the batch was
            # ordered on a stream of the latter (_order_on orders the batch's device after it).
            self._order_on(lease, info.device, stream)
            handle = stream.cuda_stream
            images = _batches.cuda_tensor(torch, lease, info.data, typestrs[info.dtype], shape, info.device,
                                          handle, bfloat16=(info.dtype == bfloat16_code))
            labels = _batches.cuda_tensor(torch, lease, info.device_labels, "<i8", (n,), info.device, handle)
            return (self._laid_out(images, info.layout), labels), n, indices
        writable = not self._zero_copy or bool(info.gathered)
        images = _batches.from_numpy(torch, _batches.host_view(lease, info.data, info.bytes, dtype, shape, writable))
        if info.dtype == bfloat16_code:
            images = images.view(torch.bfloat16)
        labels = _batches.from_numpy(torch, _batches.host_view(lease, info.labels, 8 * n, np.int64, (n,), writable))
        del lease
        images = self._laid_out(images, info.layout)
        if self._device is not None:
            # A synchronous copy from pageable memory: the views (and the slot) go right after.
            images = images.to(self._device)
            labels = labels.to(self._device)
        return (images, labels), n, indices

    def _wrap_fields(self, lease, info, stream):
        """The batch of a caller-fed producer: its structure, each field a tensor over the batch's
        memory (the same ownership as images: every tensor holds the lease), cut to the shapes
        its samples have."""
        torch = self._torch
        if info.device >= 0:
            self._order_on(lease, info.device, stream)
        leaves = _batches.field_tensors(torch, lease, info, self._fields, stream,
                                        writable=not self._zero_copy or bool(info.gathered))
        shapes = None
        if self._shapes_field is not None:
            shapes = _batches.shapes_of(lease, self._shapes_field, info.size, self._fields[self._shapes_field][2][0])
        if info.device < 0 and self._device is not None:
            leaves = [t.to(self._device) for t in leaves]  # synchronous from pageable memory
        copies, wrong = [], None
        try:
            # A field cut to a batch's shapes is copied: on the stream the batch is read on.
            batch = self._rebuild(leaves, shapes, copies, stream if info.device >= 0 else None)
        except ValueError as e:
            wrong = str(e)  # raised below, with no frame of the rebuild (its views hold the lease)
        if wrong is not None:
            raise _lib.ProtocolError("the producer's batch does not fit its schema: %s" % wrong, _lib.E_PROTOCOL)
        if copies and info.device >= 0:
            lease._copies = copies  # torch's memory: a batch handed out on another stream records it
        return batch

    def _order_on(self, lease, device, stream):
        """A device batch read on `stream`: when that stream is another device's, order the
        batch's device's current stream after it, and the release after that stream's work."""
        if stream is None:
            raise _lib.ColoaderError("the batch is on CUDA device %d, but this Loader did not ask for the "
                                     "device path" % device)
        if stream.device.index != device:
            self._cuda.current_stream(device).wait_stream(stream)
            lease._wait = (stream, device)
            self._cuda_device = device  # later batches: that device's current stream

    def _laid_out(self, images, layout_code):
        """`images` in the shape this Loader gives (a strided view, never a copy)."""
        nhwc = layout_code == _batches.nhwc_code()
        if nhwc and self._layout == "nchw":
            return images.permute(0, 3, 1, 2)  # channels_last strides over the NHWC memory
        if not nhwc and self._layout == "nhwc":
            return images.permute(0, 2, 3, 1)
        return images
