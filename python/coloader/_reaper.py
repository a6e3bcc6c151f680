"""Closing consumers off the garbage collector's path.

The last reference to a consumer can go anywhere: in a training loop, inside gc.collect(), in
another thread's frame. Closing it waits: for the CUDA work still reading its last batches
(stream synchronisation) and for its I/O thread to say goodbye and join. Python's garbage
collector must never wait on either (a finaliser that blocks stalls every thread that needs
the GIL, and one that synchronises a device inside a collection triggered by a CUDA call can
deadlock). So finalisers hand the closing to this module's one background thread, the reaper,
and return at once. At interpreter exit the queue is drained (bounded), so consumers still
leave their producer cleanly.
"""

import atexit
import queue
import sys
import threading

THREAD_NAME = "coloader-reaper"

_jobs = queue.SimpleQueue()  # put() never blocks and is safe from finalisers and signal handlers
_lock = threading.Lock()
_idle = threading.Condition(_lock)
_pending = 0
_thread = None


def submit(close):
    """Runs close() on the reaper thread, soon; never blocks the caller."""
    global _pending, _thread
    with _lock:
        _pending += 1
        if _thread is None:
            if sys.is_finalizing():
                # A consumer left for module teardown: Python 3.12 refuses new threads here, but
                # 3.11's Thread.start() waits forever for one that never runs. Refuse on both.
                _pending -= 1
                raise RuntimeError("interpreter shutdown: the reaper thread cannot be started")
            _thread = threading.Thread(target=_run, name=THREAD_NAME, daemon=True)
            _thread.start()
    _jobs.put(close)


def drain(timeout=None):
    """Waits until every submitted close has run; False if `timeout` seconds passed first."""
    with _idle:
        return _idle.wait_for(lambda: _pending == 0, timeout)


def _run():
    global _pending
    while True:
        close = _jobs.get()
        try:
            close()
        except Exception:  # a close that failed must not stop the others (nothing to report to)
            pass
        finally:
            del close  # drop what it held before waiting for the next
            with _idle:
                _pending -= 1
                _idle.notify_all()


atexit.register(drain, 10.0)
