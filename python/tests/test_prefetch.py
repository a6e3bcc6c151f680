"""The batch ahead (coloader/_prefetch.py): next() hands over a batch taken on the Loader's own
thread while the job computed, and nothing the job sees changes: exact epochs, a batch counted
when it is handed out, iter() and close() dropping what was taken ahead, a Timeout that counts
from next() and still names who holds the producer back. On by default only on the device path
(test_loader_gpu.py); here on the host path with prefetch=True, where it runs on any machine.

Runs with: /usr/bin/python3 -m pytest -q python/tests/test_prefetch.py
"""

import gc
import os
import threading
import time

import pytest

from support import (
    NUM_IMAGES, PRODUCER_BATCH, expected_sizes, in_thread, loader_for, needs_build, read_until_held_back,
    run_epoch)

pytestmark = needs_build
ALL = list(range(NUM_IMAGES))


def wait_until(predicate, what, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting for " + what
        time.sleep(0.005)


@pytest.mark.parametrize("prefetch", [True, False])
def test_the_batch_ahead_is_taken_off_the_jobs_thread(serve, monkeypatch, prefetch):
    from coloader import _lib

    p = serve(epochs=1)
    lib = _lib.lib()
    real = lib.coloader_consumer_next_batch_wait
    takers = []

    def recording(*args):
        takers.append(threading.current_thread().name)
        return real(*args)

    monkeypatch.setattr(lib, "coloader_consumer_next_batch_wait", recording)
    with loader_for(p, batch_size=PRODUCER_BATCH, prefetch=prefetch) as loader:
        sizes = [images.shape[0] for images, _ in loader]
    assert sizes == expected_sizes(PRODUCER_BATCH)
    mine = threading.current_thread().name
    if prefetch:
        # The first batch of the epoch on the job's thread (nothing was taken ahead at iter()),
        # every later one, and the end, on the Loader's.
        # (a take may be several calls of one wait slice each)
        first = takers.index("coloader-prefetch")
        assert set(takers[:first]) == {mine} and set(takers[first:]) == {"coloader-prefetch"}, takers
    else:
        assert set(takers) == {mine}


def test_epochs_stay_exact_and_a_batch_counts_when_handed_out(serve):
    p = serve(epochs=2)
    batch = 7  # divides neither the producer's batch (16) nor the dataset (103)
    with loader_for(p, batch_size=batch, prefetch=True) as loader:
        for epoch in range(2):
            seen, sizes, indices = 0, [], []
            for images, labels in loader:
                # The next batch is taken while "the job computes"; the state still says what
                # was handed out.
                wait_until(lambda: loader._prefetch.ready, "the batch ahead")
                seen += images.shape[0]
                assert loader.state_dict()["samples_seen_in_epoch"] == seen
                assert loader.state_dict()["epoch"] == epoch
                assert loader.indices.shape[0] == images.shape[0] == labels.shape[0]
                sizes.append(images.shape[0])
                indices += loader.indices.tolist()
            assert sizes == expected_sizes(batch)
            assert sorted(indices) == ALL


def test_iter_drops_the_batch_ahead_and_starts_a_whole_epoch(serve):
    p = serve(epochs=2)
    with loader_for(p, batch_size=PRODUCER_BATCH, prefetch=True) as loader:
        it = iter(loader)
        next(it)
        next(it)
        wait_until(lambda: loader._prefetch.ready, "the batch ahead")
        sizes, indices, _ = run_epoch(loader)  # skips the rest of epoch 0, the batch ahead with it
        assert sizes == expected_sizes(PRODUCER_BATCH) and sorted(indices) == ALL
        assert loader.epoch == 1


def test_a_loader_dropped_or_closed_with_a_batch_ahead_lets_go(serve):
    p = serve(epochs=None)
    pid = os.getpid()
    loader = loader_for(p, batch_size=PRODUCER_BATCH, prefetch=True)
    images, labels = next(iter(loader))
    ahead = loader._prefetch
    wait_until(lambda: ahead.ready, "the batch ahead")
    thread = ahead._thread
    loader.close()
    thread.join(5)
    assert not thread.is_alive(), "close() left the prefetch thread running"
    del images, labels
    gc.collect()
    p.wait_for(lambda st: st["consumers"] == [], "the closed consumer to leave")

    # Dropped without close(): the thread holds the Loader only while it takes a batch, so the
    # Loader is collected, and its consumer leaves once its tensors are gone.
    loader = loader_for(p, batch_size=PRODUCER_BATCH, prefetch=True)
    images, labels = next(iter(loader))
    ahead = loader._prefetch
    wait_until(lambda: ahead.ready, "the batch ahead")
    p.wait_for(lambda st: [c["pid"] for c in st["consumers"]] == [pid], "the second consumer")
    thread = ahead._thread
    del loader, images, labels
    gc.collect()
    p.wait_for(lambda st: st["consumers"] == [], "the dropped consumer to leave")
    thread.join(5)
    assert not thread.is_alive(), "the prefetch thread outlived its Loader"


def test_a_timeout_counts_from_next_and_names_the_holder(serve):
    """The take ahead waits past the Loader's timeout (the job may compute for longer); next()
    applies it from its own call and raises the library's Timeout, which names who holds the
    producer back; after it the take goes on, and a job that computed longer than the timeout
    still gets its batch."""
    p = serve("--min-consumers", "2", "--stall-timeout-ms", "60000", epochs=1, window=2)
    r = read_until_held_back(p, timeout=0.7, prefetch=True)
    stopper, stopper_it, held, other, other_it, got = r.stopper, r.stopper_it, r.held, r.loader, r.it, r.got
    said = str(r.timeout)
    assert "pid %d" % os.getpid() in said and "'stopper'" in said, said
    assert other._prefetch.outstanding  # the take goes on
    time.sleep(1.5)  # the job computes for longer than its timeout
    del held
    rest = in_thread(lambda: sum(1 for _ in stopper_it))
    sizes = [next(other_it)[1].shape[0]]  # no Timeout: the producer moves again
    sizes += [labels.shape[0] for _, labels in other_it]
    rest()
    assert got + len(sizes) == len(expected_sizes(PRODUCER_BATCH))
    for loader in (stopper, other):
        loader.close()


def held_back(serve, **kwargs):
    """read_until_held_back with prefetch: (producer, the Loader, its iterator, the batch the
    stopper holds), a take ahead waiting."""
    p = serve("--min-consumers", "2", "--stall-timeout-ms", "60000", epochs=1, window=2)
    r = read_until_held_back(p, prefetch=True, **kwargs)
    assert r.loader._prefetch.outstanding
    return p, r.loader, r.it, r.held


def test_a_loader_whose_take_ahead_failed_or_timed_out_still_lets_go(serve):
    """An error the take ahead keeps for the job (a Timeout, the producer's death) keeps no frame
    of the take: closed, the consumer leaves at once; dropped, the Loader is collected and its
    thread ends."""
    import weakref

    p, other, it, held = held_back(serve, timeout=0.5, client_name="other")
    other.close()
    del it
    gc.collect()
    p.wait_for(lambda st: [c["name"] for c in st["consumers"]] == ["stopper"], "the closed consumer to leave")

    # The producer dies while a take ahead waits: the error is kept for a next() that never
    # comes, and the Loader is dropped.
    p, again, it, held = held_back(serve, timeout=0.5)
    ahead, alive = again._prefetch, weakref.ref(again)
    thread = ahead._thread
    p.stop()
    wait_until(lambda: ahead.ready, "the take ahead to fail")
    del again, it
    gc.collect()
    assert alive() is None, "the Loader outlived the error its take ahead kept"
    thread.join(5)
    assert not thread.is_alive(), "the prefetch thread outlived its Loader"
