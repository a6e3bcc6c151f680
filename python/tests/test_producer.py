"""coloader.Producer: a producer fed by the user's own torch DataLoader (custom Dataset), its
batches consumed with other batch sizes by real consumer processes and by Loaders."""
import json
import logging
import subprocess
import threading
import warnings

import pytest
import torch

from support import BINARY, PYTHON_DIR, coloader, needs_build

pytestmark = needs_build

N = 97  # a prime: no batch size below divides it


class Squares(torch.utils.data.Dataset):
    """Sample i is a 3x4x4 tensor filled with i, labelled i: what a consumer got can be checked
    sample by sample."""

    def __len__(self):
        return N

    def __getitem__(self, i):
        return torch.full((3, 4, 4), float(i)), i


def start(producer, epochs):
    t = threading.Thread(target=producer.run, args=(epochs,), daemon=True)
    t.start()
    return t


def consume(name, *args):
    return subprocess.Popen([str(BINARY), "consume", "--name", name, "--json", "--wait-ms", "20000", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_consumers_of_any_batch_size_see_exact_epochs(env):
    loader = torch.utils.data.DataLoader(Squares(), batch_size=10, shuffle=True, num_workers=2)
    producer = coloader.Producer(loader, name="squares", min_consumers=3, heartbeat=0.1, heartbeat_timeout=1.5)
    consumers = [consume("squares", "--batch-size", b) for b in ("3", "10", "25")]
    thread = start(producer, epochs=2)
    for c, batch in zip(consumers, (3, 10, 25)):
        out, err = c.communicate(timeout=60)
        assert c.returncode == 0, err
        epochs = [json.loads(line) for line in out.splitlines()]
        assert len(epochs) == 2
        for e in epochs:
            assert e["samples"] == e["unique_samples"] == N
            assert e["index_sum"] == N * (N - 1) // 2
            assert e["batches"] == e["expected_batches"] == -(-N // batch)
    thread.join(timeout=30)
    assert not thread.is_alive()


def test_loader_gets_the_datasets_own_samples(env):
    # Unshuffled: the consumer's dataset indices are positions in the epoch, here the samples'
    # own indices, so every pixel and label can be checked against them.
    loader = torch.utils.data.DataLoader(Squares(), batch_size=8, shuffle=False)
    producer = coloader.Producer(loader, name="squares2")
    thread = start(producer, epochs=1)
    with coloader.Loader("squares2", batch_size=13, wait_for_producer=20) as consumer:
        assert len(consumer) == -(-N // 13)
        assert not hasattr(consumer.dataset, "classes")  # no image folder: no class names
        with pytest.raises(AttributeError, match="'squares2' has no class names"):
            consumer.dataset.class_to_idx
        seen = []
        for images, labels in consumer:
            assert images.shape[1:] == (3, 4, 4) and images.dtype == torch.float32
            idx = consumer.indices
            assert torch.equal(labels, idx)
            assert torch.equal(images[:, 0, 0, 0], idx.float())
            assert torch.equal(images.amax(dim=(1, 2, 3)), images.amin(dim=(1, 2, 3)))
            seen += idx.tolist()
    assert seen == list(range(N))
    thread.join(timeout=30)
    assert not thread.is_alive()


@pytest.mark.parametrize("persistent", [False, True])
def test_consumers_of_a_shuffled_dataloader_see_the_datasets_own_indices(env, persistent):
    # Issue 40: loader.indices were positions in the epoch, so a job could not tell which
    # samples it got. Sample i is filled with i and labelled i: each consumer's indices must be
    # its samples' own, through the workers' prefetching and a consumer batch size that slices
    # across the producer's batches; with persistent workers too, whose iterator was made
    # (by an epoch read before) with the DataLoader's own batch sampler.
    loader = torch.utils.data.DataLoader(Squares(), batch_size=8, shuffle=True, num_workers=2,
                                         persistent_workers=persistent)
    sampler_before = loader.batch_sampler
    if persistent:
        assert sum(len(labels) for _, labels in loader) == N
    producer = coloader.Producer(loader, name="shuffled")
    thread = start(producer, epochs=2)
    with coloader.Loader("shuffled", batch_size=13, wait_for_producer=20) as consumer:
        for _ in range(2):
            seen = []
            for images, labels in consumer:
                assert torch.equal(consumer.indices, labels)
                assert torch.equal(images[:, 0, 0, 0], labels.float())
                seen += consumer.indices.tolist()
            assert sorted(seen) == list(range(N)) and seen != list(range(N))  # whole, and shuffled
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert loader.batch_sampler is sampler_before  # the DataLoader is as it was
    if persistent:
        assert loader._iterator._index_sampler is sampler_before
        assert sum(len(labels) for _, labels in loader) == N


def test_publish_takes_the_batchs_indices_and_refuses_a_wrong_count(env):
    producer = coloader.Producer([], name="given")
    batch = (torch.zeros(3, 2), torch.zeros(3, dtype=torch.int64))
    with pytest.raises(ValueError, match="2 indices for a batch of 3 samples"):
        producer.publish(batch, indices=[7, 8])
    producer.close(timeout=1)


def test_a_batch_that_breaks_the_first_ones_schema_is_refused_naming_the_tensor(env):
    # The first batch states the schema and each tensor's maximum shape; one that pads to a longer
    # sequence is refused with the tensor's path, its shape, the maximum and the fix.
    batches = [{"input_ids": torch.zeros(4, 3, dtype=torch.int64)}, {"input_ids": torch.zeros(4, 5, dtype=torch.int64)}]
    p = coloader.Producer(batches, name="mixed")
    t = threading.Thread(target=lambda: coloader.Loader("mixed", wait_for_producer=20).__iter__().__next__())
    t.start()
    with pytest.raises(ValueError, match=r'batch\["input_ids"\] has per-sample shape \(5,\), larger than its '
                                         r'maximum \(3,\) \(the first batch\'s\).*max_shapes.*max_length'):
        p.run()
    t.join(timeout=30)
    assert p.schema == [('["input_ids"]', torch.int64, (3,))]


class BreaksAt(torch.utils.data.Dataset):
    """256 samples; reading sample `bad` raises, as a dataset meeting a file it cannot read does."""

    def __init__(self, bad):
        self.bad = bad

    def __len__(self):
        return 256

    def __getitem__(self, i):
        if i == self.bad:
            raise ValueError("sample %d is unreadable" % i)
        return torch.full((3, 4, 4), float(i)), i


def read_until_stopped(name, batch_size, outcome):
    """A job's loop: counts the samples it gets and keeps how its stream ended."""
    with coloader.Loader(name, batch_size=batch_size, wait_for_producer=20) as loader:
        seen = 0
        try:
            for batch in loader:
                seen += len(batch[1] if isinstance(batch, (tuple, list)) else next(iter(batch.values())))
            outcome.append(("ended", seen, loader.partial, ""))
        except coloader.ProducerStopped as e:
            outcome.append(("stopped", seen, loader.partial, str(e)))


def test_a_dataloader_that_raises_stops_every_job_with_its_error_not_a_delivered_end(env):
    # Sample 200 of 256 raises inside the DataLoader: run() re-raises it, and every job (a
    # Loader, and a consumer process) reads the 200 samples published, then hears why the stream
    # ends, its epoch cut. Before: 192 samples, partial False, a FinishedWarning and exit 0.
    loader = torch.utils.data.DataLoader(BreaksAt(200), batch_size=8)
    producer = coloader.Producer(loader, name="breaks", min_consumers=3)
    outcomes = [[], []]
    jobs = [threading.Thread(target=read_until_stopped, args=("breaks", b, o)) for b, o in zip((13, 32), outcomes)]
    for j in jobs:
        j.start()
    process = consume("breaks", "--batch-size", "5")
    with pytest.raises(ValueError, match="sample 200 is unreadable"):
        producer.run(epochs=2)
    assert producer.ended == "failed"
    for j in jobs:
        j.join(timeout=30)
    for (how, seen, partial, said), in outcomes:
        assert how == "stopped" and seen == 200 and partial, (how, seen, partial, said)
        assert "its DataLoader raised ValueError: sample 200 is unreadable (epoch 0, after 25 batches)" in said, said
        assert "stream stopped at epoch 0, sample 200 of 256" in said, said
    out, err = process.communicate(timeout=30)
    assert process.returncode != 0, (out, err)
    assert "its DataLoader raised ValueError: sample 200 is unreadable" in err, err


def test_a_batch_that_breaks_the_schema_stops_the_jobs_with_its_error(env):
    batches = [{"ids": torch.zeros(4, 3, dtype=torch.int64)}] * 3 + [{"ids": torch.zeros(4, 5, dtype=torch.int64)}]
    producer = coloader.Producer(batches, name="padded")
    outcome = []
    job = threading.Thread(target=read_until_stopped, args=("padded", 4, outcome))
    job.start()
    with pytest.raises(ValueError, match="per-sample shape"):
        producer.run()
    job.join(timeout=30)
    [(how, seen, partial, said)] = outcome
    assert how == "stopped" and seen == 12 and partial, outcome
    assert "publishing its batch raised ValueError: batch[\"ids\"] has per-sample shape (5,)" in said, said


def test_what_cannot_travel_is_named(env):
    with pytest.raises(TypeError, match=r'batch\["text"\]\[0\] is a str: coloader carries tensors'):
        coloader.Producer([{"text": ["a", "b"], "ids": torch.zeros(2, 3)}], name="text").run()
    with pytest.raises(TypeError, match=r"batch\[1\] is torch.uint16|batch\[1\] is a int"):
        unsigned = getattr(torch, "uint16", None)
        bad = torch.zeros(2, dtype=unsigned) if unsigned is not None else 7
        coloader.Producer([(torch.zeros(2, 3), bad)], name="unsigned").run()
    with pytest.raises(ValueError, match=r"batch\[1\] has 3 samples, batch\[0\] 2"):
        coloader.Producer([(torch.zeros(2, 3), torch.zeros(3))], name="counts").run()
    with pytest.raises(ValueError, match=r"batch\[0\] is a scalar tensor"):
        coloader.Producer([(torch.tensor(1.0), torch.zeros(3))], name="scalar").run()


def test_remote_consumers_over_tcp_with_curve_keys(env, tmp_path):
    # A Python-fed producer also serving tcp:// (loopback here): a Loader with a listed key sees
    # whole epochs with the batches carried over the network; a producer without keys refuses.
    for who in ("server", "client"):
        subprocess.run([str(BINARY), "keygen", "--out", str(tmp_path / who)], check=True, capture_output=True)
    (tmp_path / "authorized").write_text((tmp_path / "client.pub").read_text())
    loader = torch.utils.data.DataLoader(Squares(), batch_size=10, shuffle=True)
    producer = coloader.Producer(loader, name="squares-tcp", tcp="tcp://127.0.0.1:*",
                                 curve_key=tmp_path / "server.key", authorized_keys=tmp_path / "authorized")
    assert producer.tcp_endpoint is None  # opened by the first batch
    thread = start(producer, epochs=2)
    for _ in range(2000):
        if producer.tcp_endpoint or not thread.is_alive():
            break
        threading.Event().wait(0.01)
    endpoint = producer.tcp_endpoint
    assert endpoint and endpoint.startswith("tcp://127.0.0.1:") and not endpoint.endswith(":*"), endpoint
    with coloader.Loader(endpoint=endpoint, batch_size=7, timeout=20, curve_key=tmp_path / "client.key",
                         server_key=tmp_path / "server.pub") as remote:
        for _ in range(2):
            seen = []
            for images, labels in remote:
                assert torch.equal(images[:, 0, 0, 0], labels.float())  # the samples' own content
                seen += labels.tolist()
            assert sorted(seen) == list(range(N))
    del images, labels  # the last batch's tensors keep the consumer attached until they go
    thread.join(timeout=30)
    assert not thread.is_alive()

    keyless = coloader.Producer(loader, name="squares-open", tcp="tcp://127.0.0.1:*")
    with pytest.raises(coloader.InvalidArgument, match="without authentication"):
        keyless.run()


def run_in_thread(producer, epochs):
    """Runs producer.run(epochs) on a thread; returns (thread, what run returned as a list)."""
    ended = []
    t = threading.Thread(target=lambda: ended.append(producer.run(epochs)), daemon=True)
    t.start()
    return t, ended


def test_run_ends_when_its_consumers_are_gone_and_says_so(env):
    loader = torch.utils.data.DataLoader(Squares(), batch_size=4)
    producer = coloader.Producer(loader, name="left", alone_timeout=0.5)
    thread, ended = run_in_thread(producer, epochs=3)
    with coloader.Loader("left", batch_size=4, wait_for_producer=20) as consumer:
        batches = iter(consumer)
        for _ in range(3):
            next(batches)
    thread.join(timeout=30)
    assert not thread.is_alive(), "run() still waits for consumers that left"
    assert ended == ["consumers gone"]
    assert not any(f.name.startswith("left") for f in env.iterdir()), "its socket was left behind"


def test_the_producers_log_lines_go_to_python_logging_at_their_levels(env, caplog, capfd):
    # Issue 43: the producer side wrote its lines to stderr with printf, out of reach of the
    # program's logging; they now go to the "coloader.producer" logger once logging is set up.
    caplog.set_level(logging.INFO, logger="coloader")
    producer = coloader.Producer(torch.utils.data.DataLoader(Squares(), batch_size=4), name="logs",
                                 alone_timeout=0.5)
    thread, ended = run_in_thread(producer, epochs=3)
    with coloader.Loader("logs", batch_size=4, wait_for_producer=20) as consumer:
        next(iter(consumer))
    thread.join(timeout=30)
    assert ended == ["consumers gone"]
    lines = [(r.name, r.levelno, r.getMessage()) for r in caplog.records if r.name == "coloader.producer"]
    assert any(level == logging.INFO and "[coloader logs] consumer 1 connected" in text for _, level, text in lines), \
        lines
    assert any(level == logging.WARNING and "every consumer left and none came back" in text
               for _, level, text in lines), lines
    assert "[coloader logs]" not in capfd.readouterr().err  # none went past logging to stderr


def test_run_that_delivers_every_epoch_says_so(env):
    producer = coloader.Producer(torch.utils.data.DataLoader(Squares(), batch_size=10), name="whole",
                                 alone_timeout=0.5)
    thread, ended = run_in_thread(producer, epochs=2)
    with coloader.Loader("whole", batch_size=7, wait_for_producer=20) as consumer:
        for _ in range(2):
            assert sum(len(labels) for _, labels in consumer) == N
    thread.join(timeout=30)
    assert ended == ["delivered"]


# A producer stopped with SIGTERM (as a job scheduler stops it) while it waits for its first
# consumer, or with Ctrl-C: it removes its socket and its shared memory, as `serve` does.
SCRIPT = """
import signal, sys, torch, coloader
signal.signal(signal.SIGINT, signal.default_int_handler)  # as at a terminal (CI may start us with it ignored)
batches = [(torch.zeros(4, 3), torch.zeros(4, dtype=torch.int64))] * 10
print("running", flush=True)
coloader.Producer(batches, name=sys.argv[1]).run(epochs=1)
"""


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_a_stopped_producer_cleans_up(env, sig):
    import os
    import signal
    import sys
    import time

    name = "stopped-" + sig.lower()
    before = set(os.listdir("/dev/shm"))
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, name], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=dict(os.environ, PYTHONPATH=str(PYTHON_DIR)))
    assert proc.stdout.readline() == "running\n"
    sock = env / (name + ".sock")
    deadline = time.monotonic() + 20
    while not sock.exists() and time.monotonic() < deadline:  # the first publish opens it
        time.sleep(0.02)
    assert sock.exists(), proc.stderr.read() if proc.poll() is not None else "no socket"
    mine = {f for f in set(os.listdir("/dev/shm")) - before if name in f}  # its ring and mailboxes
    assert mine
    proc.send_signal(getattr(signal, sig))
    proc.wait(timeout=20)
    assert not sock.exists()
    assert not mine & set(os.listdir("/dev/shm"))


def test_a_signal_as_the_producer_opens_still_cleans_up(env, monkeypatch):
    """The socket and ring exist once the library's open returns; a Ctrl-C handled right then
    (before Python has kept the pointer) must still close them. The signal is made
    deterministic here: the open itself raises KeyboardInterrupt as it returns."""
    import os

    import torch

    from coloader import _lib

    lib = _lib.producer_lib()
    real = lib.coloader_producer_open

    def open_then_interrupted(*args):
        assert real(*args) == 0
        raise KeyboardInterrupt

    monkeypatch.setattr(lib, "coloader_producer_open", open_then_interrupted)
    name = "interrupted-at-open"
    before = set(os.listdir("/dev/shm"))
    batches = [(torch.zeros(4, 3), torch.zeros(4, dtype=torch.int64))] * 2
    producer = coloader.Producer(batches, name=name)
    with pytest.raises(KeyboardInterrupt):
        producer.run(epochs=1)
    assert not (env / (name + ".sock")).exists()
    assert not {f for f in set(os.listdir("/dev/shm")) - before if name in f}
    assert producer.ended == "failed"


# Ctrl-C while run() waits at its end for a consumer that still reads (a slow training step):
# heard within a wait step, and the producer is stopped and cleaned up.
SLOW_END = """
import signal, sys, torch, coloader
signal.signal(signal.SIGINT, signal.default_int_handler)  # as at a terminal (CI may start us with it ignored)
batches = [(torch.zeros(4, 3), torch.zeros(4, dtype=torch.int64))] * 2
print("running", flush=True)
print(coloader.Producer(batches, name=sys.argv[1], alone_timeout=None).run(epochs=1), flush=True)
"""


def test_ctrl_c_is_heard_while_run_waits_for_a_slow_consumer(env):
    import os
    import signal
    import sys
    import time

    name = "slow-end"
    proc = subprocess.Popen([sys.executable, "-c", SLOW_END, name], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=dict(os.environ, PYTHONPATH=str(PYTHON_DIR)))
    assert proc.stdout.readline() == "running\n"
    consumer = consume(name, "--step-ms", "60000")  # takes its first batch, then sleeps a minute
    try:
        deadline = time.monotonic() + 20
        while "consumer 1 attached" not in proc.stderr.readline():  # the producer logs it
            assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.5)  # both batches out: run() is in its final wait (nothing to wait *for* here)
        started = time.monotonic()
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=20)
        assert time.monotonic() - started < 10, "Ctrl-C waited for the consumer's step"
        assert not (env / (name + ".sock")).exists(), proc.stderr.read()
    finally:
        consumer.kill()
        consumer.wait()


def test_a_loader_joining_mid_epoch_is_told_why_its_epoch_is_partial(env):
    # A caller-fed producer hands each batch over once: it cannot catch a late Loader up, so that
    # Loader's first epoch is the rest of the one it joined, and a PartialEpochWarning says why.
    loader = torch.utils.data.DataLoader(Squares(), batch_size=8, shuffle=False)
    producer = coloader.Producer(loader, name="squares-late", window=2, heartbeat=0.1, heartbeat_timeout=1.5)
    attached = threading.Event()

    class Watch(logging.Handler):  # the producer's lines reach the "coloader.producer" logger
        def emit(self, record):
            if "consumer 2 attached" in record.getMessage():
                attached.set()

    watch, said = Watch(), logging.getLogger("coloader.producer")
    level = said.level
    said.addHandler(watch)
    said.setLevel(logging.INFO)  # "attached" is INFO
    thread = start(producer, epochs=2)
    try:
        with coloader.Loader("squares-late", batch_size=8, wait_for_producer=20) as first, \
                coloader.Loader("squares-late", batch_size=8, wait_for_producer=20) as late:
            it = iter(first)
            next(it)  # the producer is mid-epoch 0, held there by this reader (window 2)

            def late_reader():
                return [[i for _ in late for i in late.indices.tolist()] + [late.partial] for _ in range(2)]

            def first_reader():
                assert attached.wait(20), "the late Loader did not attach"  # at its first iter()
                return [i for _ in it for i in first.indices.tolist()], [i for _ in first for i in first.indices.tolist()]

            # (The warnings of every thread land in one record: catch_warnings patches the module.)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                late_epochs, (first_rest, first_whole) = in_parallel(late_reader, first_reader)
    finally:
        said.removeHandler(watch)
        said.setLevel(level)
    warned = [w for w in caught if issubclass(w.category, coloader.PartialEpochWarning)]
    *rest, partial = late_epochs[0]
    assert partial and 0 < len(rest) < N and rest == list(range(N - len(rest), N))
    assert len(warned) == 1 and "coloader.Producer" in str(warned[0].message)
    assert "map-style Dataset" in str(warned[0].message)
    assert late_epochs[1] == list(range(N)) + [False] and first_whole == list(range(N))
    thread.join(timeout=30)
    assert not thread.is_alive()


def in_parallel(*calls):
    """Runs each call on a thread of its own (readers of one producer must move together) and
    returns their results in order."""
    results = [None] * len(calls)

    def run(i):
        results[i] = calls[i]()

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
        assert not t.is_alive(), "a reader did not finish"
    return results
