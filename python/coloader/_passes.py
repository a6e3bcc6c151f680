"""One pass of a coloader.Loader (an iter()): an epoch, or the rest of one whose pass was a peek
(Loader.__iter__ decides which; docs/DESIGN.md, "A peek costs a batch, not an epoch")."""

from . import _batches


def copy_after(cuda, batch, read_on):
    """A copy of `batch` (a peek's, yielded again) made after the work on the CUDA stream it was
    read on (None: a host batch), and before that stream releases it."""
    if read_on is None:
        return _batches.clone(batch)
    current = cuda.current_stream(read_on.device)
    current.wait_stream(read_on)
    with cuda.device(read_on.device):
        copy = _batches.clone(batch)
    read_on.wait_stream(current)  # its release (ordered on read_on) waits for the copy
    return copy


class _EpochIterator:
    """One pass of a Loader: an epoch, or the rest of one whose pass was a peek (`replay`: its
    first batch, yielded again first). A Timeout leaves it usable: next() may be called again,
    and the interrupted batch resumes where it stopped."""

    def __init__(self, loader, generation, done, replay=None):
        self._loader = loader
        self._generation = generation
        self._done = done
        self._replay = replay

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
        if self._replay is not None:
            # A copy, so that what this pass writes into it does not reach the tensors the peek
            # handed out (a batch kept to look at later). Already counted in the epoch's samples:
            # the library handed it out once.
            (batch, loader._count, loader._indices_bytes, read_on), self._replay = self._replay, None
            loader._indices = None
            loader._pass_yielded += 1
            return copy_after(loader._cuda, batch, read_on)
        if loader._pass_yielded == 1:
            loader._first = None  # a second batch is asked for: the pass was not a peek
        batch = loader._next(session)
        if batch is None:
            self._done = loader._pass_ended = True
            raise StopIteration
        loader._seen += loader._count
        loader._pass_yielded += 1
        # The first batch of a pass is remembered until the second is asked for: if the pass ends
        # there (a peek), the next one yields it again (Loader.__iter__). Weakly, not a copy: a job
        # that does not peek pays nothing, and a batch still goes when its last tensor does.
        # (A group's rank remembers it strongly: one let go would leave that rank a batch short,
        # and its all-reduce waiting on the others.)
        remember = (lambda: batch) if loader.world_size > 1 else _batches.weak(batch)
        loader._first = ((remember, loader._count, loader._indices_bytes, loader._read_on)
                         if loader._pass_yielded == 1 and not loader._pass_continues else None)
        return batch
