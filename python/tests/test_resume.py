"""The contract's resume part (torchdata's StatefulDataLoader): state_dict() at the start, in the
middle and at the end of an epoch, and load_state_dict() into a new job gives exactly the rest,
through the producer's `serve --resume` (a JSON state, or a training script's torch checkpoint);
a state that does not fit, or lies past its epoch, is refused and changes nothing.

Runs with: /usr/bin/python3 -m pytest -q python/tests/test_resume.py
"""

import json
import os
import signal
import subprocess
import sys
import threading
import warnings

import pytest

from support import (BINARY, NUM_IMAGES, PRODUCER_BATCH, PYTHON_DIR, STEP_TIMEOUT, coloader, expected_sizes, in_thread,
                     loader_for, needs_build, reaped, run_epoch, start_reading, torch)

pytestmark = needs_build

ALL = list(range(NUM_IMAGES))


def _resume(serve, state_path, state, batch_size, **producer):
    state_path.write_text(json.dumps(state))
    p = serve("--resume", str(state_path), **producer)
    loader = loader_for(p, batch_size=batch_size)
    loader.load_state_dict(state)
    return p, loader


@pytest.mark.parametrize("where", ["start", "middle", "end"])
def test_state_dict_resumes_exactly_the_rest_of_the_epoch(serve, tmp_path, where):
    batch = 10
    p = serve(epochs=3)
    loader = loader_for(p, batch_size=batch)
    seen = []
    if where == "start":
        run_epoch(loader)
        it = iter(loader)  # epoch 1 begun, nothing read
    else:
        it = iter(loader)
        for _ in range(4 if where == "middle" else len(loader)):
            next(it)
            seen += loader.indices.tolist()
    state = loader.state_dict()
    loader.close()
    p.stop()  # the job and its producer die

    p2, resumed = _resume(serve, tmp_path / "state.json", state, batch, epochs=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # resumed exactly: no ResumeWarning
        rest = run_epoch(resumed)[1]
    if where == "end":
        # A finished epoch resumes at the next one, whole.
        assert resumed.epoch == 1 and sorted(rest) == ALL
    else:
        assert resumed.epoch == state["epoch"] and resumed.partial == bool(seen)
        assert sorted(seen + rest) == ALL and not set(seen) & set(rest)
    resumed.close()


def _three_batches_then_state(serve):
    """A job reads 3 batches of 10 and saves its state; then it and its producer die. Returns
    (the indices it had seen, the state)."""
    p = serve(epochs=2)
    loader = loader_for(p, batch_size=10)
    it = iter(loader)
    seen = []
    for _ in range(3):
        next(it)
        seen += loader.indices.tolist()
    state = loader.state_dict()
    loader.close()
    p.stop()
    return seen, state


class _RunsCode:
    """What a hostile checkpoint may hold: unpickling it runs a command."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, ("touch %s" % self.marker,))


def test_serve_resumes_from_a_training_checkpoint_with_floats_and_runs_none_of_its_code(serve, tmp_path):
    """`serve --resume CKPT --resume-key loader` with what a training script saves: a model, an
    optimizer (Python floats: torch 1.13's weights-only loader failed on them, and the job waited
    60 s for a producer that never started), numpy's RNG state, an argparse.Namespace. The state
    is read and resumed exactly; an object whose unpickling would run a command is left unbuilt."""
    import argparse

    import numpy as np

    seen, state = _three_batches_then_state(serve)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    marker = tmp_path / "code-ran"
    ckpt = tmp_path / "ckpt.pt"
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "rng": np.random.get_state(),
                "args": argparse.Namespace(lr=0.1), "hostile": _RunsCode(marker), "loader": state}, str(ckpt))
    p2 = serve("--resume", str(ckpt), "--resume-key", "loader", epochs=2, via_python=True)
    assert any("resuming at epoch 0" in line for line in p2.lines), p2.lines
    resumed = loader_for(p2, batch_size=10)
    resumed.load_state_dict(state)
    rest = run_epoch(resumed)[1]
    assert sorted(seen + rest) == ALL and not set(seen) & set(rest)
    resumed.close()
    assert not marker.exists(), "unpickling the checkpoint ran its code"


def test_a_state_past_its_epoch_is_refused_by_the_loader_as_by_serve(serve, dataset, tmp_path):
    """A position past the epoch (more samples seen than a rank's share, or a split beginning
    past its end) is another data set's state: load_state_dict refuses it, naming the numbers, as
    `serve --resume` does. Before, the Loader took it as the start of the next epoch."""
    _, state = _three_batches_then_state(serve)
    p = serve(epochs=2)
    loader = loader_for(p, batch_size=10)
    with pytest.raises(coloader.InvalidArgument, match=r"the state has seen 1000000 samples of epoch 0, but a "
                                                       r"rank's share of it is %d" % NUM_IMAGES):
        loader.load_state_dict(dict(state, samples_seen_in_epoch=10 ** 6))
    with pytest.raises(coloader.InvalidArgument, match=r"split begins at position %d of an epoch of %d samples"
                                                       % (NUM_IMAGES, NUM_IMAGES)):
        loader.load_state_dict(dict(state, split_begin=NUM_IMAGES))
    state_path = tmp_path / "past.json"
    state_path.write_text(json.dumps(dict(state, samples_seen_in_epoch=10 ** 6)))
    refused = subprocess.run([str(BINARY), "serve", "--data", str(dataset), "--name", "past", "--image-size", "32",
                              "--resume", str(state_path)], capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "the state has seen 1000000 samples of epoch 0" in refused.stderr, refused
    loader.load_state_dict(state)  # nothing changed: the right state still resumes
    loader.close()


def test_a_refused_state_changes_nothing_and_a_retry_resumes_exactly(serve, tmp_path):
    """A state that does not fit this Loader (another batch size here) is refused before the
    consumer attaches, so the producer has not moved when the job is retried correctly."""
    seen, state = _three_batches_then_state(serve)
    state_path = tmp_path / "state.json"
    state_path.write_text(json.dumps(state))
    p2 = serve("--resume", str(state_path), epochs=2)
    wrong = loader_for(p2, batch_size=12)
    with pytest.raises(coloader.InvalidArgument, match="batch size 10 in the state, 12 here"):
        wrong.load_state_dict(state)
    wrong.close()
    right = loader_for(p2, batch_size=10)
    right.load_state_dict(state)
    rest = run_epoch(right)[1]
    assert sorted(seen + rest) == ALL and not set(seen) & set(rest)
    right.close()


def test_a_group_restarted_under_another_name_resumes(serve, tmp_path):
    """torchrun names a group after its rendezvous (host:port); a job restarted on another port is
    the same job, and its ranks' states resume."""
    p = serve(epochs=2, window=4)
    ranks = [loader_for(p, batch_size=8, rank=r, world_size=2, group="torch-127.0.0.1:29500-w2") for r in (0, 1)]
    starts = [start_reading(r) for r in ranks]
    seen = []
    for r, start in zip(ranks, starts):
        it = start()
        for _ in range(2):
            next(it)
            seen += r.indices.tolist()
    states = [r.state_dict() for r in ranks]
    for r in ranks:
        r.close()
    p.stop()
    state_path = tmp_path / "state.json"
    state_path.write_text(json.dumps(states[0]))
    p2 = serve("--resume", str(state_path), epochs=2, window=4)
    again = [loader_for(p2, batch_size=8, rank=r, world_size=2, group="torch-127.0.0.1:29611-w2") for r in (0, 1)]
    for loader, state in zip(again, states):
        loader.load_state_dict(state)
    epochs = [in_thread(run_epoch, r) for r in again]
    rest = [i for e in epochs for i in e()[1]]
    assert sorted(set(seen + rest)) == ALL and not set(seen) & set(rest)
    for r in again:
        r.close()


# A job that saves its state after 3 batches of epoch 0, reads 2 more and trains on (until it is
# killed); restarted with the state, it reads to the end of the run. One JSON line per batch.
JOB = r"""
import json, sys, time, warnings, coloader
name, state_path, restarted = sys.argv[1], sys.argv[2], sys.argv[3] == "restarted"
warnings.simplefilter("always")
loader = coloader.Loader(name, batch_size=10, timeout=30)
if restarted:
    with open(state_path) as f:
        loader.load_state_dict(json.load(f))
read = 0
while True:
    got = False
    for images, labels in loader:
        got = True
        read += 1
        print(json.dumps({"epoch": loader.epoch, "partial": loader.partial, "indices": loader.indices.tolist()}),
              flush=True)
        if not restarted and read == 3:
            with open(state_path, "w") as f:
                json.dump(loader.state_dict(), f)
        if not restarted and read == 5:
            print("training", flush=True)
            time.sleep(600)  # killed here
    if not got:
        break
"""


def _job(p, state_path, restarted):
    env = dict(os.environ, PYTHONPATH=str(PYTHON_DIR))
    return subprocess.Popen([sys.executable, "-c", JOB, p.name, str(state_path), "restarted" if restarted else "first"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


@pytest.mark.parametrize("catch_up", [True, False], ids=["catch-up", "no-catch-up"])
def test_a_job_killed_and_restarted_while_another_reads_on_resumes_exactly(serve, tmp_path, catch_up):
    """Issue 39's test 2: a job SIGKILLed mid-epoch 0 and restarted from its state_dict while
    another job reads on (the shared stream is in epoch 1 by then) gets exactly the samples of
    epoch 0 it had not read when it saved, then whole epochs 1 and 2; the other job's epochs stay
    whole. Without catch-up the rest cannot be served: a ResumeWarning says so."""
    p = serve("--min-consumers", "2", *([] if catch_up else ["--no-catch-up"]), epochs=3, window=2)
    other = loader_for(p, batch_size=PRODUCER_BATCH)
    first_epoch = start_reading(other)  # both start at epoch 0's beginning
    go = threading.Event()

    def read_on():  # epoch 0, two batches of epoch 1, then (once the job is back) on to the end
        epochs = [run_epoch(other, first_epoch())]
        it = iter(other)
        head = [next(it) for _ in range(2)]
        go.wait(3 * STEP_TIMEOUT)
        sizes, indices, _ = run_epoch(other, it)
        epochs.append(([h[1].shape[0] for h in head] + sizes, None, None))
        epochs.append(run_epoch(other))
        return epochs

    state_path = tmp_path / "state.json"
    first = _job(p, state_path, restarted=False)
    reading = in_thread(read_on)
    with reaped(first):
        lines = [first.stdout.readline() for _ in range(6)]
        assert lines[-1].strip() == "training", lines + [first.stderr.read()]
        seen = [i for line in lines[:3] for i in json.loads(line)["indices"]]
        first.send_signal(signal.SIGKILL)
        first.wait(STEP_TIMEOUT)
    # The shared stream went on into epoch 1 (the other job holds it there) past the saved point.
    p.wait_for(lambda st: st["epoch"] >= 1 and len(st["consumers"]) == 1, "the other job in epoch 1 alone")
    restarted = _job(p, state_path, restarted=True)
    p.wait_for(lambda st: len(st["consumers"]) == 2, "the restarted job")
    go.set()
    out, err = restarted.communicate(timeout=3 * STEP_TIMEOUT)
    assert restarted.returncode == 0, err
    batches = [json.loads(line) for line in out.splitlines()]
    epochs = {}
    for b in batches:
        epochs.setdefault(b["epoch"], []).append(b)
    if catch_up:
        assert sorted(epochs) == [0, 1, 2], (sorted(epochs), err)
        rest = [i for b in epochs[0] for i in b["indices"]]
        assert sorted(seen + rest) == ALL and not set(seen) & set(rest)
        assert all(b["partial"] for b in epochs[0])  # the rest of an epoch begun before
        for e in (1, 2):
            assert sorted(i for b in epochs[e] for i in b["indices"]) == ALL
            assert not any(b["partial"] for b in epochs[e])
        assert "ResumeWarning" not in err and "PartialEpochWarning" not in err, err
    else:
        assert 0 not in epochs and "ResumeWarning" in err and "rest is skipped" in err, err
    sizes = [s for s, _, _ in reading()]
    assert sizes == [expected_sizes(PRODUCER_BATCH)] * 3  # the other job: whole epochs throughout
    other.close()


def test_a_state_of_an_epoch_this_run_does_not_serve_is_refused_naming_both(serve):
    """A saved epoch beyond the producer's run (--epochs counts from epoch 0 of the whole run):
    the producer says so instead of serving nothing; a state that had read the last epoch whole
    ends the stream (the run is over for it)."""
    _, state = _three_batches_then_state(serve)
    p = serve(epochs=2)
    loader = loader_for(p, batch_size=10)
    loader.load_state_dict(dict(state, epoch=7))
    with pytest.raises(coloader.ColoaderError, match="resumes epoch 7, but this producer serves 2"):
        next(iter(loader))
    loader.close()
    done = loader_for(p, batch_size=10)
    done.load_state_dict(dict(state, epoch=1, samples_seen_in_epoch=NUM_IMAGES))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert list(done) == []
    assert not [w for w in caught if issubclass(w.category, coloader.ResumeWarning)]  # nothing was owed
    done.close()


def test_a_caught_up_jobs_state_resumes_exactly_through_serve_resume(serve, tmp_path):
    """A job that joined mid-epoch was caught up (its epoch runs from its first position P to
    the end, then 0..P-1) and saved its state within the part decoded for it; the job and its
    producer die. `serve --resume` with that state and load_state_dict() give exactly the rest,
    [P + k - N, P), then whole epochs."""
    p = serve(epochs=2, window=2)
    first = loader_for(p, batch_size=PRODUCER_BATCH)
    it = iter(first)
    next(it)  # holds the producer mid-epoch 0 while `late` joins
    late = loader_for(p, batch_size=10)
    late_it = start_reading(late)
    p.wait_for(lambda st: len(st["consumers"]) == 2, "the late job")
    reading = in_thread(lambda: (run_epoch(first, it), run_epoch(first)))  # on to the end, holding nobody
    late_it = late_it()
    seen = []
    while len(seen) < NUM_IMAGES - 10:  # well into its own part (P > 10: it joined after a batch)
        next(late_it)
        seen += late.indices.tolist()
    state = late.state_dict()
    assert state["split_begin"] > 0 and state["samples_seen_in_epoch"] > NUM_IMAGES - state["split_begin"]
    late.close()  # the job dies
    reading()
    first.close()
    p.stop()

    p2, resumed = _resume(serve, tmp_path / "state.json", state, 10, epochs=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", coloader.ResumeWarning)
        rest = run_epoch(resumed)[1]
        assert resumed.epoch == 0 and resumed.partial
        assert sorted(seen + rest) == ALL and not set(seen) & set(rest)
        whole = run_epoch(resumed)[1]
    assert resumed.epoch == 1 and not resumed.partial and sorted(whole) == ALL
    resumed.close()
