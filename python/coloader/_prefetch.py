"""The next batch, made ready while the job computes: a Loader's one thread takes batch k+1 from
the library and wraps it in tensors as soon as batch k is handed out, so that next() hands over
what is ready instead of doing that Python work on the training thread (TensorSocket's consumer
does the same). Private to the package; coloader.loader's docstring states the rules to users:

- One batch ahead, never more: the thread takes a batch only when asked, and next() asks as it
  hands one out (never at iter(): a Loader that is only peeked holds nothing more).
- What the job sees does not change: a batch is counted (samples seen, indices) when it is handed
  out, not when it is taken, so a state_dict() between batches does not count the one ahead.
- The take ignores the Loader's timeout (the job may compute for longer than that); next()
  applies it from its own call, and a Timeout there leaves the take going on for the next call.
- iter() (the rest of the epoch is skipped anyway), load_state_dict() and close() discard what
  was taken; a take under way stops within one wait slice (_lib.WAIT_SLICE_MS), or at most the
  library's own wait for a status answer (1 s) when it is building a Timeout's message.
- The thread holds the Loader only while it takes a batch, and an error it keeps for the job
  keeps no frame of it, so that a Loader the job drops is still collected; the thread then ends,
  as it does when the Loader is closed.
"""

import threading
import time
import traceback

# What collect() gives when the wait for the job's timeout ended first.
TIMED_OUT = object()


class Prefetcher:
    """One take at a time of `take(args, cancelled)` on a daemon thread: `take` is a
    weakref.WeakMethod of the owner's, `args` what ask() was given, and `cancelled()` true once
    the take is no longer wanted (it should then return soon, with anything)."""

    def __init__(self, take, name):
        self._take = take
        self._name = name
        self._cond = threading.Condition()
        self._asked = None   # the args of a take asked for and not begun
        self._busy = False   # a take is running
        self._done = None    # (value, error) of the take finished and not collected
        self._cancel = False
        self._closed = False
        self._thread = None

    @property
    def outstanding(self):
        """A take was asked for and not collected (running, or finished)."""
        with self._cond:
            return self._asked is not None or self._busy or self._done is not None

    @property
    def ready(self):
        """The take asked for has finished: collect() returns at once."""
        with self._cond:
            return self._done is not None

    def ask(self, args):
        with self._cond:
            if self._closed:
                return
            self._asked, self._cancel = args, False
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def collect(self, timeout):
        """The value of the take asked for, or its error raised; TIMED_OUT once `timeout` s
        (None: no limit) passed first, the take going on. Waits in slices, so that Ctrl-C's
        KeyboardInterrupt is raised here as in every wait of the package."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._done is None:
                if self._asked is None and not self._busy:
                    raise RuntimeError("coloader: collect() without a take asked for")
                left = 0.1 if deadline is None else min(0.1, deadline - time.monotonic())
                if left <= 0:
                    return TIMED_OUT
                self._cond.wait(left)
            (value, error), self._done = self._done, None
        if error is not None:
            raise error
        return value

    def discard(self):
        """Drops the take asked for, under way or finished; returns once none is under way
        (within one wait slice of the take), except on the thread itself."""
        with self._cond:
            self._asked, self._cancel = None, True
            self._cond.notify_all()
            if threading.current_thread() is not self._thread:
                while self._busy:
                    self._cond.wait(0.1)
            dropped, self._done = self._done, None
        del dropped  # outside the lock: releasing a batch calls into the library

    def close(self):
        with self._cond:
            self._closed = True
        self.discard()

    def _run(self):
        while True:
            with self._cond:
                while self._asked is None and not self._closed:
                    if self._take() is None:  # the owner was collected without close()
                        self._closed = True
                        break
                    self._cond.wait(1.0)
                if self._closed:
                    return
                args, self._asked, self._busy = self._asked, None, True
            take = self._take()
            value = error = None
            if take is not None:
                try:
                    value = take(args, lambda: self._cancel)
                except BaseException as e:  # the job's to see, at its next()
                    traceback.clear_frames(e.__traceback__)  # its frames would hold the owner
                    error = e
            del take, args
            with self._cond:
                self._busy = False
                if not self._cancel and not self._closed:
                    self._done, value, error = (value, error), None, None
                if self._take() is None:
                    self._closed = True  # the owner is gone
                self._cond.notify_all()
            del value, error  # a discarded batch, released outside the lock
