"""The contract a training job relies on when it replaces its DataLoader with coloader.Loader, as a
conformance suite: every test runs real producer processes (`coloader serve`), real consumer
processes where another job is meant, and real signals.

What is checked, and where it comes from:
  * DataLoader's documented semantics: len() is the number of batches an epoch yields, for any
    batch size and drop_last, with the same sizes as torch.utils.data.DataLoader; one iter() is
    one epoch; breaking out and iterating again starts the next one; every sample once per epoch.
  * torchdata's StatefulDataLoader: its own suite, test_resume.py.
  * coloader's contract (docs/DESIGN.md "What a training job can rely on"): isolation of what a
    job does to its tensors, finished and stopped producers told apart, every wait wakes for
    Ctrl-C and for the producer's death, and a job that keeps batches or stops reading stalls
    nobody beyond the window.

Runs with: /usr/bin/python3 -m pytest -q python/tests/test_contract.py
"""

import gc
import os
import signal
import subprocess
import sys
import time
import warnings

import pytest

from support import (
    NUM_IMAGES, PRODUCER_BATCH, PYTHON_DIR, STEP_TIMEOUT, coloader, expected_sizes, in_thread,
    loader_for, needs_build, read_until_held_back, run_epoch, start_reading, torch)

pytestmark = needs_build

ALL = list(range(NUM_IMAGES))


def child(code, *args, **popen):
    """A Python child process running `code` with the source tree's package (another job)."""
    env = dict(os.environ, PYTHONPATH=str(PYTHON_DIR), PYTHONUNBUFFERED="1")
    return subprocess.Popen([sys.executable, "-c", code, *map(str, args)], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **popen)


def read_line(proc, want, timeout=STEP_TIMEOUT):
    """The next stdout line of `proc`, which must start with `want` (bounded by a thread join)."""
    line = in_thread(proc.stdout.readline)(timeout)
    assert line.startswith(want), "expected %r from the child, got %r; stderr: %s" % (
        want, line, proc.stderr.read() if proc.poll() is not None else "(running)")
    return line


def pixels_by_index(loader, iterator=None):
    """{dataset index: the sample's pixels as bytes} over one epoch."""
    out = {}
    for images, _ in (loader if iterator is None else iterator):
        for i, sample in zip(loader.indices.tolist(), images):
            out[i] = sample.contiguous().numpy().tobytes()
    return out


# ---------------------------------------------------------------------------------------------
# DataLoader's semantics


def test_len_and_batch_sizes_match_torch_dataloader_for_any_batch_size_and_drop_last(serve):
    p = serve(epochs=None)
    for batch in (1, 7, PRODUCER_BATCH, 17, NUM_IMAGES, 200):
        for drop_last in (False, True):
            reference = [len(b) for b in torch.utils.data.DataLoader(range(NUM_IMAGES), batch_size=batch,
                                                                      drop_last=drop_last)]
            with loader_for(p, batch_size=batch, drop_last=drop_last, wait_for_epoch=True) as loader:
                sizes, indices, _ = run_epoch(loader)
                assert (len(loader), sizes) == (len(reference), reference), (batch, drop_last)
                assert loader.batch_size == batch and loader.drop_last == drop_last
                assert len(set(indices)) == len(indices) == sum(reference)


def test_breaking_out_and_iterating_again_starts_the_next_epoch_whole(serve):
    p = serve(epochs=3)
    with loader_for(p, batch_size=10) as loader:
        for n, _ in enumerate(loader):
            if n == 2:
                break
        assert loader.epoch == 0
        for epoch in (1, 2):
            _, indices, _ = run_epoch(loader)
            assert loader.epoch == epoch and not loader.partial and sorted(indices) == ALL
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert list(loader) == []
        assert loader.finished and [w.category for w in caught] == [coloader.FinishedWarning]


# ---------------------------------------------------------------------------------------------
# Isolation: what a job does to its tensors changes nothing another job sees, and never crashes it.

WRITER = r"""
import sys, torch, coloader
loader = coloader.Loader(sys.argv[1], batch_size=int(sys.argv[2]), timeout=10)
print("attached", flush=True)
writes = 0
for images, labels in loader:
    # What normalisation in place, activations in place and numpy do to a batch.
    images.sub_(0.5).div_(0.25)
    images[0] = 0
    torch.nn.functional.relu(images, inplace=True)
    images.numpy()[1] = 7.0
    labels.mul_(0)
    assert float(images[0].abs().sum()) == 0.0 and float(images[1].max()) == 7.0, "a write was lost"
    assert int(labels.abs().sum()) == 0
    images.zero_()
    assert float(images.abs().sum()) == 0.0
    writes += 1
print("wrote", writes, flush=True)
"""


def test_in_place_writes_change_nothing_another_job_sees_and_do_not_crash(serve):
    p = serve("--min-consumers", "3", "--seed", "5", epochs=1)
    reader = loader_for(p, batch_size=PRODUCER_BATCH)        # the job's own views
    reference = loader_for(p, batch_size=PRODUCER_BATCH, zero_copy=True)  # the producer's memory
    reads = [start_reading(reader), start_reading(reference)]
    writer = child(WRITER, p.name, PRODUCER_BATCH)  # the same slots: same batch size
    try:
        read_line(writer, "attached")
        iterators = [r() for r in reads]
        theirs_join = in_thread(pixels_by_index, reference, iterators[1])  # all three read together
        mine, theirs = pixels_by_index(reader, iterators[0]), theirs_join()
        assert writer.wait(STEP_TIMEOUT) == 0, writer.stderr.read()
        assert read_line(writer, "wrote").split()[1] == str(len(expected_sizes(PRODUCER_BATCH)))
    finally:
        writer.kill()
        writer.wait()
    assert sorted(mine) == sorted(theirs) == ALL
    zero = bytes(len(mine[0]))
    assert all(mine[i] == theirs[i] for i in ALL), "another job's writes reached this job's batches"
    assert not any(mine[i] == zero for i in ALL)
    assert p.wait() == 0


def test_kept_batches_keep_what_the_job_wrote_and_stall_nobody(serve):
    """A job that keeps its batches (a list, for logging) and writes into them: its kept tensors keep
    their contents while the ring's slots are reused for newer batches (they were copied away when
    the producer needed them), and another job reading at full speed never waits for it."""
    p = serve("--min-consumers", "2", "--spare-slots", "0", epochs=1, window=2)
    slots = p.status()["slots"]  # asked now: once the epoch is out and read, the producer ends
    keeper = loader_for(p, batch_size=PRODUCER_BATCH)
    other = loader_for(p, batch_size=PRODUCER_BATCH, timeout=5)
    keeper_start = start_reading(keeper)
    other_epoch = in_thread(run_epoch, other)
    kept, expect = [], []
    for n, (images, labels) in enumerate(keeper_start()):
        images[:, 0] = float(n)  # this job's own mark
        kept.append((images, labels, keeper.indices.clone()))
        expect.append(images.clone())
    sizes, indices, _ = other_epoch()
    assert sizes == expected_sizes(PRODUCER_BATCH) and sorted(indices) == ALL
    assert len(kept) == len(expected_sizes(PRODUCER_BATCH)) > slots  # more than the ring holds
    for (images, _, _), before in zip(kept, expect):
        assert torch.equal(images, before)
    assert sorted(i for _, _, idx in kept for i in idx.tolist()) == ALL
    del kept, images, labels
    gc.collect()
    keeper.close()
    other.close()
    assert p.wait() == 0


ZERO_COPY_WRITER = r"""
import sys, coloader
loader = coloader.Loader(sys.argv[1], batch_size=16, timeout=10, zero_copy=True)
for images, labels in loader:
    print("writing", flush=True)
    images.mul_(2)
    print("wrote", flush=True)
"""


def test_a_zero_copy_job_that_writes_faults_and_others_read_on_unharmed(serve):
    """zero_copy is a promise not to write; a job that breaks it is stopped by the read-only
    mapping (SIGSEGV) before anything of the producer's changes, and the others read on."""
    p = serve("--min-consumers", "2", "--seed", "5", epochs=1)
    other = loader_for(p, batch_size=PRODUCER_BATCH)
    start = start_reading(other)
    writer = child(ZERO_COPY_WRITER, p.name)
    try:
        read_line(writer, "writing")
        assert writer.wait(STEP_TIMEOUT) == -signal.SIGSEGV
    finally:
        writer.kill()
        writer.wait()
    sizes, indices, _ = run_epoch(other, start())
    assert sorted(indices) == ALL
    other.close()
    assert p.wait() == 0


# ---------------------------------------------------------------------------------------------
# Endings: finished and stopped are told apart, and never a hang or a quiet end.


def test_an_epoch_past_the_last_ends_at_once_with_the_last_batch_still_held(serve):
    """`for e in range(3): for x, y in loader:` against `serve --epochs 2`: the loop keeps the last
    batch bound while it asks for a third epoch, which must end at once (and say why), not wait
    for that batch's release."""
    p = serve(epochs=2)
    loader = coloader.Loader(p.name, batch_size=10, timeout=0)  # no timeout: a hang would stay one

    def three_epochs():
        seen = []
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(3):
                n = 0
                for images, labels in loader:
                    n += len(labels)
                seen.append(n)
        return seen, images, [w.category for w in caught]

    seen, held, categories = in_thread(three_epochs)(STEP_TIMEOUT)
    assert seen == [NUM_IMAGES, NUM_IMAGES, 0]
    assert loader.finished and categories == [coloader.FinishedWarning]
    assert p.proc.poll() is None  # it waits for the held batch before exiting
    del held
    gc.collect()
    loader.close()
    assert p.wait() == 0


@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL"])
def test_a_producer_stopped_mid_stream_raises_producer_stopped_after_its_last_batch(serve, how):
    """SIGTERM (asked to stop) and SIGKILL (killed, crashed) in epoch 1 of a long run: the batches
    it delivered come, then ProducerStopped names it, its pid, how it ended and where the stream
    stopped; the cut epoch is partial. Never a quiet end."""
    p = serve(epochs=None, window=2)
    loader = loader_for(p, batch_size=10, timeout=30)
    run_epoch(loader)
    it = iter(loader)
    next(it)
    start = time.monotonic()
    p.proc.send_signal(getattr(signal, how))
    got = 1
    with pytest.raises(coloader.ProducerStopped) as e:
        for _ in range(100):
            next(it)
            got += 1
    assert time.monotonic() - start < 3.0
    message = str(e.value)
    assert isinstance(e.value, coloader.ProducerGone)
    assert "'%s'" % p.name in message and "pid %d" % p.proc.pid in message
    assert ("asked to stop (SIGTERM)" if how == "SIGTERM" else "killed") in message, message
    assert "stream stopped at epoch 1, sample" in message, message
    assert loader.epoch == 1 and loader.partial and not loader.finished
    assert got < len(loader)
    with pytest.raises(coloader.ProducerStopped):
        iter(loader)  # and so does every later epoch: the loop does not run on empty
    loader.close()


# ---------------------------------------------------------------------------------------------
# Waiting: every wait wakes for Ctrl-C and for the producer's death.

WAITER = r"""
import signal, sys, time, torch, coloader  # torch first: a signal must not land in its import
# As at a terminal: a test runner started in the background (CI) passes SIGINT on ignored, and
# Python then installs no KeyboardInterrupt handler.
signal.signal(signal.SIGINT, signal.default_int_handler)
where = sys.argv[2]
try:
    if where == "batch":
        loader = coloader.Loader(sys.argv[1], timeout=0)
        print("waiting", flush=True)
        start = time.monotonic()
        next(iter(loader))
    elif where == "ahead":  # next() waits for the batch the Loader's own thread is taking ahead
        import threading
        stopper = coloader.Loader(sys.argv[1], timeout=0, client_name="stopper")
        loader = coloader.Loader(sys.argv[1], timeout=0, prefetch=True)
        threading.Thread(target=lambda: next(iter(stopper)), daemon=True).start()  # one batch, then it stops
        it = iter(loader)
        next(it)
        print("waiting", flush=True)
        start = time.monotonic()
        for _ in it:  # until the window is full: the producer waits for the stopper
            pass
    else:  # a producer that has not started yet
        print("waiting", flush=True)
        start = time.monotonic()
        coloader.Loader(sys.argv[1], wait_for_producer=600)
except KeyboardInterrupt:
    print("interrupted", time.monotonic() - start, flush=True)
"""


@pytest.mark.parametrize("where", ["batch", "ahead", "producer"])
def test_ctrl_c_interrupts_every_wait_at_once(serve, where):
    if where == "batch":
        name = serve("--min-consumers", "2", epochs=1).name  # waits for a second consumer: no batch comes
    elif where == "ahead":
        name = serve("--min-consumers", "2", epochs=1, window=2).name
    else:
        name = "nobody-%d" % os.getpid()
    waiter = child(WAITER, name, where)
    try:
        read_line(waiter, "waiting")
        time.sleep(0.3)  # let it block in the wait (what is measured is the time after the signal)
        sent = time.monotonic()
        waiter.send_signal(signal.SIGINT)
        line = read_line(waiter, "interrupted")
        assert time.monotonic() - sent < 1.0, line
        assert waiter.wait(STEP_TIMEOUT) == 0, waiter.stderr.read()
    finally:
        waiter.kill()
        waiter.wait()


def test_a_wait_with_no_timeout_ends_with_the_producers_death(serve):
    p = serve("--min-consumers", "2", epochs=1)
    loader = coloader.Loader(p.name, timeout=0)
    waiting = start_reading(loader)
    p.wait_for(lambda st: len(st["consumers"]) == 1, "the consumer to attach")
    p.proc.send_signal(signal.SIGKILL)
    with pytest.raises(coloader.ProducerStopped, match="before this consumer's first batch"):
        waiting(3.0)
    loader.close()


# ---------------------------------------------------------------------------------------------
# Holding: a job that stops reading stalls nobody beyond the window.


def test_an_idle_loader_holds_nobody_back(serve):
    """A Loader made and not iterated (a validation loader for later) is not attached: the others
    read at full speed, and it still reads whole epochs once it starts."""
    p = serve(epochs=2, window=2)
    idle = loader_for(p, batch_size=PRODUCER_BATCH)
    busy = loader_for(p, batch_size=PRODUCER_BATCH, timeout=2)
    for _ in range(2):
        assert sorted(run_epoch(busy)[1]) == ALL
    with pytest.warns(coloader.FinishedWarning):
        assert list(idle) == []  # it came after the last epoch: finished, not hung
    for loader in (idle, busy):
        loader.close()


def test_a_job_that_stops_reading_is_named_then_detached_and_told_why(serve):
    """The producer runs at most --window batches ahead of its slowest reader. One that stops
    reading, and that is not caught up instead (--lag-timeout-ms 0 here: see the next test), holds
    the others back for --stall-timeout-ms at most: meanwhile their Timeout names it (pid, unread
    batches, idle time); then it is detached, the others go on, and it is told it was the holder
    and what to do."""
    p = serve("--min-consumers", "2", "--stall-timeout-ms", "3000", "--lag-timeout-ms", "0", epochs=1, window=2)
    r = read_until_held_back(p, timeout=0.7)
    stopper, stopper_it, held, other, other_it, got = r.stopper, r.stopper_it, r.held, r.loader, r.it, r.got
    said = str(r.timeout)
    assert "pid %d" % os.getpid() in said and "'stopper'" in said, said
    assert "holds it back" in said and "--stall-timeout-ms" in said
    start = time.monotonic()
    rest = []
    while time.monotonic() - start < 3.0 + 2.0:  # until the stopper is detached, and a bit
        try:
            rest.append(len(next(other_it)[1]))  # the iterator survives its Timeouts
        except coloader.Timeout:
            continue
        except StopIteration:
            break
    assert got + len(rest) == len(expected_sizes(PRODUCER_BATCH))
    with pytest.raises(coloader.ConsumerDetached) as detached:
        for _ in range(100):
            next(stopper_it)
    assert "took no batch for 3 s" in str(detached.value) and "--stall-timeout-ms" in str(detached.value)
    del held
    for loader in (stopper, other):
        loader.close()
    assert p.wait() == 0


def test_a_job_that_pauses_mid_epoch_holds_nobody_back_and_still_reads_whole_epochs(serve):
    """Issue 39: a job that stops reading mid-epoch (an evaluation, a checkpoint) holds the others
    back for --lag-timeout-ms at most. Then the batches it had not taken go back, and when it reads
    again it gets the rest of its epoch, decoded again for it, then whole epochs. The other job
    reads both epochs while it pauses (within its timeout); each job sees every sample of every
    epoch once, and neither sees a partial epoch."""
    p = serve("--min-consumers", "2", "--lag-timeout-ms", "500", epochs=2, window=2)
    pauser = loader_for(p, batch_size=PRODUCER_BATCH, client_name="pauser")
    other = loader_for(p, batch_size=PRODUCER_BATCH, client_name="other")
    pauser_start = start_reading(pauser)
    reading = in_thread(lambda: [run_epoch(other)[1] for _ in range(2)] + [other.partial])
    it = pauser_start()
    head = []
    for _ in range(2):
        held = next(it)  # the last one is held through the pause, as a training step would
        head += pauser.indices.tolist()
    *others, other_partial = reading()  # the pause: until the other job has read both epochs
    assert [sorted(indices) for indices in others] == [ALL, ALL] and not other_partial
    assert any("took no batch for" in line and "'pauser'" in line for line in p.lines), "".join(p.lines)
    del held
    rest = run_epoch(pauser, it)[1]
    assert sorted(head + rest) == ALL and not pauser.partial
    assert sorted(run_epoch(pauser)[1]) == ALL and not pauser.partial
    for loader in (pauser, other):
        loader.close()
    assert p.wait() == 0


# ---------------------------------------------------------------------------------------------
# The DataLoader shape


def test_dataloader_arguments_are_accepted_with_one_note_each(serve):
    p = serve(epochs=1)
    coloader._dataloader._noted.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        a = loader_for(p, batch_size=8, num_workers=8, pin_memory=True, shuffle=True, persistent_workers=True,
                       prefetch_factor=4)
        b = loader_for(p, batch_size=8, num_workers=8, pin_memory=True)
    notes = [str(w.message) for w in caught if w.category is coloader.IgnoredArgumentWarning]
    assert len(notes) == 5 and any("num_workers=8" in n and "coloader serve --workers" in n for n in notes)
    with pytest.raises(TypeError, match="collate_fn would change what the batches hold"):
        loader_for(p, batch_size=8, collate_fn=lambda x: x)
    with pytest.raises(TypeError, match="not_an_argument"):
        loader_for(p, batch_size=8, not_an_argument=1)
    assert len(a.dataset) == NUM_IMAGES and len(a.sampler) == NUM_IMAGES
    a.sampler.set_epoch(3)
    assert a.sampler.epoch == 3 and a.batch_size == 8 and a.drop_last is False
    for loader in (a, b):
        loader.close()


def test_a_rank_share_is_what_a_distributed_sampler_gives(serve):
    p = serve(epochs=1)
    ranks = [loader_for(p, batch_size=8, drop_last=False, rank=r, world_size=2, group="g") for r in (0, 1)]
    reference = torch.utils.data.DistributedSampler(range(NUM_IMAGES), num_replicas=2, rank=0, shuffle=False)
    assert [len(r.sampler) for r in ranks] == [len(reference)] * 2
    assert [len(r) for r in ranks] == [-(-len(reference) // 8)] * 2
    for r in ranks:
        r.close()


def test_uint8_batches_come_nchw_with_channels_last_strides_or_nhwc_on_request(serve):
    p = serve("--output", "uint8", "--min-consumers", "2", epochs=1)
    nchw = loader_for(p, batch_size=8)
    nhwc = loader_for(p, batch_size=8, layout="nhwc")
    starts = [start_reading(nchw), start_reading(nhwc)]
    a, _ = next(starts[0]())
    b, _ = next(starts[1]())
    assert a.shape == (8, 3, 32, 32) and a.is_contiguous(memory_format=torch.channels_last)
    assert b.shape == (8, 32, 32, 3) and b.is_contiguous()
    assert torch.equal(a.permute(0, 2, 3, 1), b)
    del a, b
    for loader in (nchw, nhwc):
        loader.close()


def test_a_group_started_with_the_wrong_world_size_fails_naming_both_sides(serve):
    """Two processes each told world size 3: rank 2 never comes. With no timeout at all, the
    ranks that came still fail within group_wait, naming who came and who did not."""
    p = serve(epochs=1, window=8)
    ranks = [coloader.Loader(p.name, batch_size=8, rank=r, world_size=3, group="g", group_wait=1.5, timeout=0)
             for r in (0, 1)]
    starts = [start_reading(r) for r in ranks]
    for start in starts:
        with pytest.raises(coloader.InvalidArgument) as e:
            start(STEP_TIMEOUT)
        message = str(e.value)
        assert "group 'g'" in message and "rank(s) 0 (pid %d), 1 (pid %d) of 3 came" % ((os.getpid(),) * 2) in message
        assert "rank(s) 2 did not" in message, message
    for r in ranks:
        r.close()


SPAWNED = r"""
import os, sys, torch, torch.distributed as dist, coloader
rank = int(sys.argv[2])
loader = coloader.Loader(sys.argv[1], batch_size=8)   # before init_process_group: no rank found
dist.init_process_group("gloo", init_method="file://" + sys.argv[3], rank=rank, world_size=2)
try:
    iter(loader)
    print("READ EVERYTHING", flush=True)
except coloader.InvalidArgument as e:
    print("REFUSED", e, flush=True)
dist.destroy_process_group()
"""


def test_a_loader_made_before_init_process_group_says_so_instead_of_reading_everything(serve, tmp_path):
    if not torch.distributed.is_available():
        pytest.skip("this torch has no torch.distributed")
    p = serve(epochs=1)
    store = tmp_path / "store"
    procs = [child(SPAWNED, p.name, r, store) for r in (0, 1)]
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=60)
            assert proc.returncode == 0, err
            assert out.startswith("REFUSED") and "init_process_group" in out and "rank %d of 2" % procs.index(proc) in out
    finally:
        for proc in procs:
            proc.kill()
