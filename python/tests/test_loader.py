"""coloader.Loader against a real producer process, through the build tree: errors, exact
epochs, late joins (passes and peeks: test_passes.py), lifetimes of the tensors it hands out, torch, the device fallback and tcp://.
The contract a training job relies on (isolation, endings, waiting, holding, resume, the
DataLoader shape) has its own suite, test_contract.py.

Runs with: /usr/bin/python3 -m pytest -q python/tests
"""

import gc
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import warnings

import pytest

from support import (
    BINARY, NUM_CLASSES, NUM_IMAGES, PRODUCER_BATCH, PYTHON_DIR, STEP_TIMEOUT, coloader, expected_sizes, in_thread,
    loader_for, needs_build, reaped, run_epoch, start_reading, torch)

# These tests read to the end of the stream on purpose; test_contract.py checks the warning.
pytestmark = [needs_build, pytest.mark.filterwarnings("ignore::coloader.FinishedWarning")]


# ---------------------------------------------------------------------------------------------
# Errors


def test_missing_producer_raises_producer_not_found(env):
    with pytest.raises(coloader.ProducerNotFound) as e:
        coloader.Loader("no-such-producer-here", wait_for_producer=0)
    assert "no-such-producer-here" in str(e.value)
    assert isinstance(e.value, coloader.ColoaderError)
    assert e.value.code == -2


def test_loader_started_before_its_producer_waits_for_it(dataset, env, caplog):
    # Jobs launched together with the producer may come up first: the Loader waits for it, and
    # says so through the "coloader" logger (the library's message, handed to Python logging).
    caplog.set_level(logging.INFO, logger="coloader")
    started = []

    def start_producer():
        started.append(subprocess.Popen(
            [BINARY, "serve", "--data", str(dataset), "--name", "late", "--batch-size", "16",
             "--image-size", "32", "--workers", "2", "--quiet"], stderr=subprocess.DEVNULL))

    timer = threading.Timer(0.3, start_producer)
    timer.start()
    try:
        with coloader.Loader("late", batch_size=16, wait_for_producer=20) as loader:
            seen = [i for _ in loader for i in loader.indices.tolist()]
        assert sorted(seen) == list(range(NUM_IMAGES))
    finally:
        timer.join()
        for p in started:
            assert p.wait(timeout=30) == 0
    said = [r for r in caplog.records if r.name == "coloader" and "waiting up to 20 s for producer 'late'" in r.message]
    assert len(said) == 1 and said[0].levelno == logging.INFO, caplog.records


def test_without_logging_configured_the_library_says_it_on_stderr(env):
    code = ("import coloader\n"
            "try:\n    coloader.Loader('nobody-serves-this', wait_for_producer=1)\n"
            "except coloader.ProducerNotFound:\n    print('not found')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=STEP_TIMEOUT,
                         env=dict(os.environ, PYTHONPATH=str(PYTHON_DIR)))
    assert out.stdout.strip() == "not found", out.stderr
    assert "coloader: waiting up to 1 s for producer 'nobody-serves-this'" in out.stderr


def test_bad_arguments_raise_invalid_argument(env):
    with pytest.raises(coloader.InvalidArgument):
        coloader.Loader()
    with pytest.raises(ValueError):
        coloader.Loader("x", batch_size=0)


def test_python_m_coloader_runs_the_binary(serve):
    p = serve(epochs=None)
    env = dict(os.environ, PYTHONPATH=str(PYTHON_DIR), COLOADER_BINARY=str(BINARY))
    out = subprocess.run([sys.executable, "-m", "coloader", "status", "--name", p.name, "--json"],
                         capture_output=True, text=True, timeout=STEP_TIMEOUT, env=env)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["name"] == p.name
    env["COLOADER_BINARY"] = "/nonexistent/coloader"
    out = subprocess.run([sys.executable, "-m", "coloader", "status"], capture_output=True, text=True,
                         timeout=STEP_TIMEOUT, env=env)
    assert out.returncode == 127 and "COLOADER_BINARY" in out.stderr


# ---------------------------------------------------------------------------------------------
# Epochs


def test_exact_epochs_for_any_batch_size(serve):
    epochs = 2
    configs = [dict(batch_size=5), dict(batch_size=16), dict(batch_size=40),
               dict(batch_size=40, drop_last=True), dict()]
    p = serve("--min-consumers", str(len(configs)), epochs=epochs)
    loaders = [loader_for(p, **c) for c in configs]
    for loader, c in zip(loaders, configs):
        batch = c.get("batch_size", PRODUCER_BATCH)
        assert loader.batch_size == batch
        assert len(loader) == len(expected_sizes(batch, c.get("drop_last", False)))
        assert loader.epoch_samples == NUM_IMAGES and loader.dataset_size == NUM_IMAGES

    def consume(loader):
        return [(run_epoch(loader), loader.epoch, loader.partial) for _ in range(epochs)]

    joins = [in_thread(consume, loader) for loader in loaders]
    results = [join() for join in joins]

    label_of = {}
    for loader, c, result in zip(loaders, configs, results):
        batch = c.get("batch_size", PRODUCER_BATCH)
        drop_last = c.get("drop_last", False)
        for epoch, ((sizes, indices, labels), number, partial) in enumerate(result):
            assert number == epoch and not partial
            assert sizes == expected_sizes(batch, drop_last), c
            if drop_last:
                assert len(set(indices)) == len(indices) == sum(sizes)
                assert set(indices) <= set(range(NUM_IMAGES))
            else:
                assert sorted(indices) == list(range(NUM_IMAGES)), c
            for i, l in labels.items():  # the same sample has the same label everywhere
                assert label_of.setdefault(i, l) == l
    assert set(label_of.values()) == set(range(NUM_CLASSES))

    # The producer delivered every epoch: a further epoch is empty, not an error or a hang.
    for loader in loaders:
        assert list(loader) == []
        assert list(loader) == []
        loader.close()
    assert p.wait() == 0


def test_the_datasets_classes_are_the_image_folders(serve, dataset):
    # Issue 43: loader.dataset had no classes / class_to_idx, which ImageFolder users read.
    import torchvision
    folder = torchvision.datasets.ImageFolder(str(dataset))
    p = serve()
    loader = loader_for(p, batch_size=16)
    assert loader.dataset.classes == folder.classes == ["class%d" % i for i in range(NUM_CLASSES)]
    assert loader.dataset.class_to_idx == folder.class_to_idx
    # The labels name the same classes: sample i's label is that of ImageFolder's sample i.
    _, indices, labels = run_epoch(loader)
    assert sorted(indices) == list(range(len(folder)))
    assert all(labels[i] == folder.samples[i][1] for i in indices)
    loader.close()


@pytest.mark.parametrize("catch_up", [True, False], ids=["catch-up", "no-catch-up"])
def test_late_join_is_caught_up_or_warned_of(serve, catch_up):
    """A Loader that joins mid-epoch: with catch-up (the default) every epoch is whole, the first
    one too; with --no-catch-up the first is the rest of the one it joined, partial, and a
    PartialEpochWarning says why."""
    p = serve(*([] if catch_up else ["--no-catch-up"]), epochs=3, window=2)
    first = loader_for(p, batch_size=PRODUCER_BATCH)
    go = threading.Event()

    def run_first():
        it = iter(first)
        head = [next(it)[1].shape[0] for _ in range(2)]
        go.wait(STEP_TIMEOUT)  # holds the producer mid-epoch 0 (window 2) while `late` joins
        rest = run_epoch_from(it, first)
        return [head + rest] + [run_epoch(first)[0] for _ in range(2)]

    def run_epoch_from(it, loader):
        return [images.shape[0] for images, _ in it]

    join_first = in_thread(run_first)
    p.wait_for(lambda st: st["batches_published"] >= 2, "the first batches")
    late = loader_for(p, batch_size=7)
    waiting = loader_for(p, batch_size=7, wait_for_epoch=True)

    def three_epochs(loader):
        return [(run_epoch(loader), loader.epoch, loader.partial) for _ in range(3)]

    # Every consumer must keep moving (back-pressure), so each runs in its own thread. A Loader
    # attaches at its first iter(): both are attached (the producer says so) while `first`
    # still holds epoch 0, so that `waiting` joins at epoch 1's boundary.
    # (The warnings of every thread land in one record: catch_warnings patches the module.)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        join_late, join_waiting = in_thread(three_epochs, late), in_thread(three_epochs, waiting)
        deadline = time.monotonic() + STEP_TIMEOUT
        while sum(" attached: " in line for line in p.lines) < 3:
            assert time.monotonic() < deadline, "the consumers did not attach:\n" + "".join(p.lines)
            time.sleep(0.01)
        go.set()
        late_epochs, waiting_epochs = join_late(), join_waiting()
    late_warned = [w for w in caught if issubclass(w.category, coloader.PartialEpochWarning)]

    (sizes, indices, _), epoch, partial = late_epochs[0]
    if catch_up:
        assert not partial and epoch == 0 and not late_warned
        assert sorted(indices) == list(range(NUM_IMAGES)) and sizes == expected_sizes(7)
    else:
        assert partial and epoch == 0
        assert 0 < len(indices) < NUM_IMAGES and len(set(indices)) == len(indices)
        assert len(late_warned) == 1 and "--no-catch-up" in str(late_warned[0].message)  # `waiting` has none
    for n, ((sizes, indices, _), epoch, partial) in enumerate(late_epochs[1:], start=1):
        assert not partial and epoch == n
        assert sorted(indices) == list(range(NUM_IMAGES)) and sizes == expected_sizes(7)
    # wait_for_epoch: the first epoch it sees is epoch 1, whole; after epoch 2 the stream ends.
    (sizes, indices, _), epoch, partial = waiting_epochs[0]
    assert not partial and epoch == 1 and sorted(indices) == list(range(NUM_IMAGES))
    (sizes, indices, _), epoch, partial = waiting_epochs[1]
    assert not partial and epoch == 2 and sorted(indices) == list(range(NUM_IMAGES))
    assert waiting_epochs[2][0] == ([], [], {})
    assert join_first() == [expected_sizes(PRODUCER_BATCH)] * 3
    for loader in (first, late, waiting):
        assert list(loader) == []
        loader.close()


CHILD = r"""
import sys, time, coloader
loader = coloader.Loader(sys.argv[1], batch_size=5, timeout=10)
for epoch in range(100):
    for images, labels in loader:
        print("ready", flush=True)
        time.sleep(0.05)
"""


def test_killed_consumer_does_not_stall_the_others(serve):
    p = serve("--min-consumers", "2", epochs=2, window=3)
    survivor = loader_for(p, batch_size=PRODUCER_BATCH, timeout=5)
    first_epoch = start_reading(survivor)  # attached: the producer starts once the child is too
    env = dict(os.environ, PYTHONPATH=str(PYTHON_DIR))
    child = subprocess.Popen([sys.executable, "-c", CHILD, p.name], stdout=subprocess.PIPE, text=True, env=env)
    with reaped(child):
        assert child.stdout.readline().strip() == "ready"  # mid-epoch 0, holding a batch
        assert p.consumer(child.pid)["held"] >= 1
        child.send_signal(signal.SIGKILL)
        child.wait(STEP_TIMEOUT)
    start = time.monotonic()
    epochs = [first_epoch(), None]
    for epoch in range(2):
        sizes, indices, _ = run_epoch(survivor, epochs[epoch])
        assert survivor.epoch == epoch and not survivor.partial
        assert sorted(indices) == list(range(NUM_IMAGES))
    assert time.monotonic() - start < STEP_TIMEOUT
    assert list(survivor) == []
    survivor.close()
    assert p.wait() == 0


# ---------------------------------------------------------------------------------------------
# Lifetime: a slot is released when its last tensor goes, exactly once, and not before.


def test_tensors_keep_their_slot_until_the_last_one_goes(serve):
    p = serve(epochs=1, window=3)
    loader = loader_for(p, batch_size=PRODUCER_BATCH)  # one consumer batch per slot: views
    pid = os.getpid()
    acked = lambda: p.consumer(pid)["acked"]  # noqa: E731
    it = iter(loader)

    images0, labels0 = next(it)
    first_labels = labels0.tolist()
    p.wait_for(lambda st: st["consumers"][0]["received"] >= 1, "an announcement")
    assert acked() == 0 and p.status()["slots_in_use"] >= 1

    # Batch 1 released entirely; batch 0's images dropped, but its labels are still alive.
    images1, labels1 = next(it)
    del images0, images1, labels1
    gc.collect()
    st = p.wait_for(lambda st: st["consumers"][0]["acked"] >= 1, "the ack of batch 1")
    # Acks travel in order of release: had batch 0 gone with its images, it would be counted.
    assert st["consumers"][0]["acked"] == 1 and st["consumers"][0]["held"] >= 1
    assert labels0.tolist() == first_labels  # still readable, and still batch 0's

    del labels0
    gc.collect()
    p.wait_for(lambda st: st["consumers"][0]["acked"] == 2, "the ack of batch 0")

    # An array viewing the batch (numpy, a slice, a reshape) holds it as well.
    images2, labels2 = next(it)
    view = images2[1:3].reshape(-1).numpy()
    del images2, labels2
    gc.collect()
    images3, labels3 = next(it)
    del images3, labels3
    gc.collect()
    st = p.wait_for(lambda st: st["consumers"][0]["acked"] >= 3, "the ack of batch 3")
    assert st["consumers"][0]["acked"] == 3
    del view
    gc.collect()
    p.wait_for(lambda st: st["consumers"][0]["acked"] == 4, "the ack of batch 2")

    # The rest of the epoch; the last batch stays bound to the loop variables. Every epoch
    # published, the producer asks for it back: the consumer copies it (the tensors keep their
    # address and values) and acks, and the run ends while the job still holds it.
    for images, labels in it:
        pass
    last = (images.numpy().tobytes(), labels.tolist(), images.data_ptr())
    assert p.wait() == 0
    assert any("every epoch delivered" in line for line in p.lines), p.lines
    assert (images.numpy().tobytes(), labels.tolist(), images.data_ptr()) == last
    # Exactly one ack per lease (an extra ack would have got this consumer dropped, a missing
    # one would have kept the producer waiting): letting go of the copy acks nothing more.
    assert not any("rejected" in line or "dropped" in line for line in p.lines), p.lines
    del images, labels
    gc.collect()
    assert list(loader) == []
    loader.close()


def test_a_loader_closed_holding_its_last_batch_does_not_keep_the_producer(serve):
    # A job that ends its loop, keeps the last batch (a logger, a metric) and close()s: the
    # producer of --epochs 1 ends at once, not when that job's tensors die.
    p = serve(epochs=1, window=3)
    loader = loader_for(p, batch_size=PRODUCER_BATCH)
    kept = None
    for kept in loader:
        pass
    values = [t.clone() for t in kept]
    loader.close()
    started = time.monotonic()
    assert p.wait() == 0, p.lines
    assert time.monotonic() - started < 5, "the producer waited for the tensors the closed Loader's job keeps"
    assert all(torch.equal(t, v) for t, v in zip(kept, values))  # still the last batch's values


def test_tensors_outlive_the_loader(serve):
    """Closing the Loader leaves the producer only once no tensor of it is left."""
    p = serve(epochs=None, window=3)
    loader = loader_for(p, batch_size=5)
    it = iter(loader)
    kept = [next(it) for _ in range(4)]  # batch 3 straddles producer slots: a gathered copy
    copies = [(i.numpy().tobytes(), l.tolist()) for i, l in kept]
    loader.close()
    with pytest.raises(coloader.ColoaderError):
        iter(loader)
    # Still attached and holding the slots: the producer cannot have reused them.
    st = p.status()
    assert len(st["consumers"]) == 1 and st["consumers"][0]["held"] >= 1
    for (images, labels), (ci, cl) in zip(kept, copies):
        assert images.numpy().tobytes() == ci and labels.tolist() == cl
    del kept, images, labels, it
    gc.collect()
    p.wait_for(lambda st: st["consumers"] == [], "the consumer to leave")


def test_dropping_the_last_reference_closes_on_the_reaper_not_in_the_collector(serve, monkeypatch):
    """The garbage collector never waits for a consumer's goodbye or its GPU work: the finaliser
    hands the closing to the reaper thread, which says goodbye soon after."""
    from coloader import _reaper
    p = serve(epochs=None, window=3)
    loader = loader_for(p, batch_size=5)
    images, labels = next(iter(loader))
    lib = coloader._lib.lib()
    real_close = lib.coloader_consumer_close
    closed_on = []

    def recording_close(ptr):
        closed_on.append(threading.current_thread().name)
        return real_close(ptr)

    monkeypatch.setattr(lib, "coloader_consumer_close", recording_close)
    del loader, images, labels
    gc.collect()
    assert _reaper.drain(10), "the reaper did not close the consumer"
    assert closed_on == [_reaper.THREAD_NAME]
    p.wait_for(lambda st: st["consumers"] == [], "the consumer to leave")


def test_timeout_while_gathering_a_straddling_batch_loses_nothing(serve):
    p = serve("--min-consumers", "2", "--spare-slots", "0", epochs=1, window=2, batch_size=PRODUCER_BATCH)
    # zero_copy: the held batch holds its slot (a copy-on-write view would be copied away)
    holder = loader_for(p, batch_size=PRODUCER_BATCH, zero_copy=True)
    other = loader_for(p, batch_size=5, timeout=1.0)
    holder_start = start_reading(holder)
    it = iter(other)
    holder_it = holder_start()
    held = next(holder_it)
    indices = []
    with pytest.raises(coloader.Timeout):  # 6 batches of 5 fit in the 2 published slots
        while True:
            next(it)
            indices += other.indices.tolist()
    assert len(indices) == 30
    del held
    gc.collect()
    holder_join = in_thread(lambda: [images.shape[0] for images, _ in holder_it])
    for _ in it:
        indices += other.indices.tolist()
    holder_join()
    for loader in (holder, other):
        loader.close()
    assert sorted(indices) == list(range(NUM_IMAGES))


# ---------------------------------------------------------------------------------------------
# Torch


def test_float32_nchw_tensors_work_with_torch_ops(serve):
    p = serve(epochs=1)
    with loader_for(p, batch_size=8) as loader:
        images, labels = next(iter(loader))
        assert images.shape == (8, 3, 32, 32) and images.dtype == torch.float32
        assert labels.shape == (8,) and labels.dtype == torch.int64
        assert 0 <= int(labels.min()) and int(labels.max()) < NUM_CLASSES
        assert torch.isfinite(images).all()
        assert abs(float(images.mean())) < 1.0 and 0.2 < float(images.std()) < 3.0
        flipped = torch.flip(images, dims=[3]) * 2 + 1  # out-of-place ops make new tensors
        assert flipped.shape == images.shape and flipped.is_contiguous()
        one_hot = torch.nn.functional.one_hot(labels, NUM_CLASSES)
        assert one_hot.sum() == 8
        del images, labels


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, NUM_CLASSES))


def test_training_loop_with_autocast_bfloat16(serve):
    p = serve(epochs=2)
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    steps = 0
    with loader_for(p, batch_size=16) as loader:
        for epoch in range(2):
            for images, labels in loader:
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    logits = model(images)
                    loss = torch.nn.functional.cross_entropy(logits, labels)
                assert logits.dtype == torch.bfloat16
                opt.zero_grad()
                loss.backward()
                opt.step()
                assert torch.isfinite(loss)
                steps += 1
    assert steps == 2 * len(expected_sizes(16))
    # The loop variables still hold the last batch, and with it the last slot: the producer
    # finishes only once they are gone.
    del images, labels
    assert p.wait() == 0


def test_torch_compile(serve):
    if not hasattr(torch, "compile"):
        pytest.skip("torch.compile needs PyTorch 2.x; this is PyTorch %s (Debian 12 ships 1.13)" % torch.__version__)
    p = serve(epochs=1)
    model = make_model()
    try:
        compiled = torch.compile(model)
        compiled(torch.zeros(2, 3, 32, 32))
    except Exception as e:  # inductor needs a working C++ toolchain and Triton/OpenMP setup
        pytest.skip("torch.compile does not work on this CPU build: %s" % str(e).splitlines()[0])
    with loader_for(p, batch_size=16) as loader:
        for images, labels in loader:
            assert compiled(images).shape == (images.shape[0], NUM_CLASSES)


# ---------------------------------------------------------------------------------------------
# The device path, as far as it can be tested without a GPU (test_loader_gpu.py has the rest)


def test_c_api_device_request_against_a_host_producer_falls_back(serve):
    """The C ABI's device fields: asked for, refused (no device ring), reported; the host path works."""
    import ctypes

    from coloader import _lib

    p = serve(epochs=1)
    lib = _lib.lib()
    opts = _lib.ConsumerOptions()
    opts.name = p.name.encode()
    opts.batch_size = 5
    opts.timeout_ms = STEP_TIMEOUT * 1000
    opts.device = 1
    ptr = ctypes.c_void_p()
    _lib.check(lib.coloader_consumer_open(ctypes.byref(opts), ctypes.byref(ptr)))
    try:
        assert lib.coloader_consumer_on_device(ptr) == 0
        assert b"--device" in lib.coloader_consumer_fallback_reason(ptr)
        assert lib.coloader_consumer_on_device(None) == 0
        assert lib.coloader_consumer_fallback_reason(None) == b""
        assert _lib.check(lib.coloader_consumer_next_epoch(ptr)) == _lib.OK
        batch = ctypes.c_void_p()
        # A stream is ignored on the host path; NULL is the default stream.
        assert _lib.check(lib.coloader_consumer_next_batch_on_stream(ptr, None, ctypes.byref(batch))) == _lib.OK
        info = _lib.BatchInfo()
        _lib.check(lib.coloader_batch_info_get(batch, ctypes.byref(info)))
        assert info.device == -1 and info.device_labels is None and info.size == 5
        lib.coloader_batch_release(batch)
        with pytest.raises(coloader.InvalidArgument):
            _lib.check(lib.coloader_consumer_next_batch_on_stream(ptr, None, None))
    finally:
        lib.coloader_consumer_close(ptr)


def test_cuda_requested_without_a_device_path_warns_and_yields_cpu_tensors(serve):
    """Here either PyTorch has no CUDA or the producer has no device ring: both fall back."""
    p = serve("--min-consumers", "2", epochs=1)
    host = loader_for(p, batch_size=10)
    assert not host.on_device and host.fallback_reason == ""
    with pytest.warns(coloader.DeviceFallbackWarning) as caught:
        loader = loader_for(p, batch_size=10, device="cuda")
    assert len(caught) == 1
    assert not loader.on_device and loader.fallback_reason
    assert loader.fallback_reason in str(caught[0].message)
    join_host = in_thread(run_epoch, host)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once, at construction: not per batch
        for images, labels in loader:
            assert images.device.type == "cpu" and labels.device.type == "cpu"
            assert images.dtype == torch.float32 and images.shape[1:] == (3, 32, 32)
    sizes, indices, _ = join_host()
    assert sorted(indices) == list(range(NUM_IMAGES))
    del images, labels  # the last batch's slot: the producer finishes once it is back
    for each in (host, loader):
        each.close()
    assert p.wait() == 0


def test_bad_device_raises_invalid_argument(env):
    with pytest.raises(coloader.InvalidArgument):
        coloader.Loader("x", device="no-such-device")


def test_tcp_endpoint_with_curve_keys(serve, tmp_path):
    """A Loader over tcp:// (a consumer on another machine, here loopback) with CURVE keys:
    exact epochs; a key the producer does not list is refused with InvalidArgument."""
    for who in ("server", "client", "stranger"):
        subprocess.run([str(BINARY), "keygen", "--out", str(tmp_path / who)], check=True, capture_output=True)
    (tmp_path / "authorized").write_text((tmp_path / "client.pub").read_text())
    p = serve("--tcp", "tcp://127.0.0.1:*", "--curve-key", str(tmp_path / "server.key"),
              "--authorized-keys", str(tmp_path / "authorized"), epochs=None)
    deadline = time.monotonic() + STEP_TIMEOUT
    while not any("also serving on tcp://" in line for line in p.lines) and time.monotonic() < deadline:
        time.sleep(0.01)
    line = next(line for line in p.lines if "also serving on tcp://" in line)
    endpoint = line.split("also serving on ")[1].split()[0]
    with coloader.Loader(endpoint=endpoint, batch_size=10, timeout=STEP_TIMEOUT,
                         curve_key=tmp_path / "client.key", server_key=tmp_path / "server.pub") as loader:
        for _ in range(2):
            sizes, indices, _ = run_epoch(loader)
            assert sorted(indices) == list(range(NUM_IMAGES))
            assert sizes == expected_sizes(10)
    with pytest.raises(coloader.InvalidArgument, match="refused this consumer's key"):
        coloader.Loader(endpoint=endpoint, curve_key=str(tmp_path / "stranger.key"),
                        server_key=str(tmp_path / "server.pub"))


def test_closing_a_loader_another_thread_waits_in_ends_that_wait(serve):
    # A Loader closed (or dropped) while another thread waits in its iter() or next(): the wait
    # ends with an error saying so. It held only the consumer's raw pointer before, and the
    # consumer was freed under it (a segfault).
    p = serve("--min-consumers", "2", epochs=1)  # one reader: the run never starts
    loader = loader_for(p, batch_size=PRODUCER_BATCH)
    waiter = in_thread(lambda: pytest.raises(coloader.ColoaderError, iter, loader).value)
    deadline = time.monotonic() + STEP_TIMEOUT
    while " attached: " not in "".join(p.lines):  # the waiter is in iter()
        assert time.monotonic() < deadline, "".join(p.lines)
        time.sleep(0.01)
    loader.close()
    gc.collect()
    assert "closed while this call waited" in str(waiter(STEP_TIMEOUT))
