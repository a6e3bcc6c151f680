"""Consumer groups through the Python package: real torchrun + DDP (gloo, CPU) over
examples/ddp_train.py against a real producer, and a 2-rank job SIGKILLed mid-epoch and
resumed from its checkpoint. What each rank trained on is read from the ranks' own logs
(examples/ddp_train.py writes every step's dataset indices), not from coloader's counters.

Runs with: /usr/bin/python3 -m pytest -q python/tests/test_groups.py
(Debian's torch 1.13 under Python 3.11 needs torchrun's --redirects/--tee given: its default
"0" does not parse there; see _torchrun.)
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from support import (  # noqa: E402
    BINARY, NUM_IMAGES, PRODUCER_BATCH, REPO, STEP_TIMEOUT, needs_build, reaped, torch)

import coloader  # noqa: E402

EXAMPLE = REPO / "examples" / "ddp_train.py"
BATCH = 8
PER_RANK = (NUM_IMAGES + 1) // 2  # ceil(103 / 2): DistributedSampler's count for 2 replicas
STEPS = (PER_RANK + BATCH - 1) // BATCH

pytestmark = [needs_build,
              pytest.mark.skipif(not hasattr(torch, "distributed") or not torch.distributed.is_available(),
                                 reason="this torch has no torch.distributed")]


def _free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(log_dir, name, *extra, epochs=2):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(_free_port()),
           "--redirects", "2", "--tee", "2", "--log_dir", str(log_dir / "torchrun"),
           str(EXAMPLE), "--name", name, "--epochs", str(epochs), "--batch-size", str(BATCH),
           "--classes", "3", "--log-dir", str(log_dir), "--timeout", str(STEP_TIMEOUT), *extra]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)  # its own process group: killed whole below


def _descendants(pid):
    """Every live descendant of pid, from /proc (children first found, then theirs)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            for task in os.listdir("/proc/%d/task" % p):
                with open("/proc/%d/task/%s/children" % (p, task)) as f:
                    kids = [int(c) for c in f.read().split()]
                out += kids
                todo += kids
        except OSError:  # gone meanwhile
            pass
    return out


def _gone(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")  # a zombie has stopped
    except OSError:
        return True


def _kill_job(run):
    """SIGKILLs torchrun and every process under it, and waits until none runs. Recent torch
    starts each rank in a session of its own, so killing torchrun's process group alone would
    leave the ranks running: one could write a checkpoint after the test has read the last."""
    victims = _descendants(run.pid)
    os.killpg(run.pid, signal.SIGKILL)
    for pid in victims:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    run.wait()
    deadline = time.monotonic() + 30
    while not all(_gone(p) for p in victims):
        assert time.monotonic() < deadline, "ranks still running 30 s after SIGKILL: %s" % victims
        time.sleep(0.02)


def _steps(log_dir, rank):
    """The rank's step lines (epoch, indices), in order; a line cut by a kill is not one."""
    out = []
    path = log_dir / ("rank%d.jsonl" % rank)
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if "indices" in rec:
            out.append(rec)
    return out


def _summaries(log_dir, rank):
    """The rank's end-of-epoch lines (epoch, steps, samples, partial), in order."""
    return [json.loads(l) for l in (log_dir / ("rank%d.jsonl" % rank)).read_text().splitlines() if '"steps"' in l]


def _indices_by_epoch(log_dir):
    """{rank: {epoch: every dataset index the rank trained on in it}} from both ranks' logs."""
    per_rank = {}
    for rank in (0, 1):
        by_epoch = per_rank[rank] = {}
        for rec in _steps(log_dir, rank):
            by_epoch.setdefault(rec["epoch"], []).extend(rec["indices"])
    return per_rank


def _check_exact(per_rank_epoch_indices, epochs):
    """Each rank: exactly its share per epoch (PER_RANK samples in STEPS steps); both ranks
    together: every sample, with the one padding repeat ceil(103/2)*2 - 103 = 1. `epochs`: how
    many from 0, or which."""
    for e in (range(epochs) if isinstance(epochs, int) else epochs):
        union = []
        for rank in (0, 1):
            got = per_rank_epoch_indices[rank].get(e, [])
            assert len(got) == PER_RANK, "rank %d epoch %d: %d samples, want %d" % (rank, e, len(got), PER_RANK)
            union += got
        assert sorted(set(union)) == list(range(NUM_IMAGES)), "epoch %d: the ranks' union is not the dataset" % e
        assert len(union) - NUM_IMAGES == 2 * PER_RANK - NUM_IMAGES


def test_torchrun_ddp_ranks_split_every_epoch(serve, tmp_path):
    producer = serve(epochs=2)
    run = _torchrun(tmp_path, producer.name)
    out, _ = run.communicate(timeout=120)
    assert run.returncode == 0, out
    for rank in (0, 1):
        assert [s["steps"] for s in _summaries(tmp_path, rank)] == [STEPS, STEPS]  # equal step counts
    _check_exact(_indices_by_epoch(tmp_path), 2)
    assert producer.wait() == 0


def test_a_ddp_job_started_after_another_is_caught_up_to_whole_epochs(serve, tmp_path):
    """torchrun's 2 ranks (gloo all-reduce every step) start while another job reads epoch 0: the
    producer serves them the rest of it with that job, then what they missed, decoded again once
    for both; each rank gets its equal share of the whole epoch, and the epoch is not partial."""
    producer = serve(epochs=2, window=2)
    # The other job holds its first batch of epoch 0 (the producer stays within --window of it)
    # until the group is there, then reads on: at the group's pace once it reads the shared stream
    # too, so its timeout covers the ranks' start (torch, DDP's set-up; slow on a loaded machine).
    with coloader.Loader(producer.name, batch_size=PRODUCER_BATCH, timeout=120) as other:
        batches = iter(other)
        next(batches)
        run = _torchrun(tmp_path, producer.name)
        try:
            producer.wait_for(lambda st: len(st["consumers"]) == 3, "the group's 2 ranks", timeout=120)
        except AssertionError:
            run.kill()
            raise AssertionError(run.communicate()[0])
        assert sum(1 for _ in batches) == (NUM_IMAGES + PRODUCER_BATCH - 1) // PRODUCER_BATCH - 1
    out, _ = run.communicate(timeout=120)
    assert run.returncode == 0, out
    for rank in (0, 1):
        summaries = _summaries(tmp_path, rank)
        assert [(s["epoch"], s["steps"], s["partial"]) for s in summaries] == [(0, STEPS, False), (1, STEPS, False)], (
            summaries, "".join(producer.lines))
    _check_exact(_indices_by_epoch(tmp_path), 2)
    assert any("joined epoch 0" in l and "its 2 ranks" in l for l in producer.lines), "".join(producer.lines)
    assert producer.wait() == 0


def _kill_after_a_mid_epoch_checkpoint(run, ckpt, epoch=lambda: 1):
    """Waits for the job's checkpoint inside epoch epoch() (some of its steps taken), SIGKILLs the
    job, and gives the loader state of the last checkpoint written before the kill."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        state = None
        if ckpt.exists():
            try:
                state = torch.load(str(ckpt))["loader"]
            except Exception:  # being replaced this instant
                state = None
            if state and state["epoch"] == epoch() and 0 < state["samples_seen_in_epoch"] < PER_RANK - BATCH:
                break
        assert run.poll() is None, run.communicate()[0]
        time.sleep(0.02)
    else:
        pytest.fail("no mid-epoch checkpoint in epoch 1")
    _kill_job(run)
    return torch.load(str(ckpt))["loader"]


def _resumed_run(first, second, state, epochs=range(3)):
    """{rank: {epoch: indices}} over a job killed after `state` was saved and resumed from it: the
    first run's steps up to the checkpoint (what the resumed model had trained on), then the
    second run's; no sample twice within a rank's epoch (the one repeat is across ranks)."""
    kept_steps = state["samples_seen_in_epoch"] // BATCH
    per_rank = {}
    for rank in (0, 1):
        by_epoch = per_rank[rank] = {}
        seen_in = {}
        for rec in _steps(first, rank):
            e = rec["epoch"]
            seen_in[e] = seen_in.get(e, 0) + 1
            if e < state["epoch"] or (e == state["epoch"] and seen_in[e] <= kept_steps):
                by_epoch.setdefault(e, []).extend(rec["indices"])
        for rec in _steps(second, rank):
            by_epoch.setdefault(rec["epoch"], []).extend(rec["indices"])
        for e in epochs:
            assert len(set(by_epoch.get(e, []))) == len(by_epoch.get(e, [])), (rank, e, sorted(by_epoch[e]))
    return per_rank


def test_group_killed_mid_epoch_resumes_exactly_from_its_checkpoint(serve, tmp_path):
    ckpt = tmp_path / "ckpt.pt"
    producer = serve(epochs=3, window=2)
    first = tmp_path / "first"
    # No --group: each run's group is named after torchrun's rendezvous (another port each time),
    # and the second run must resume the first's state all the same.
    run = _torchrun(first, producer.name, "--checkpoint", str(ckpt), "--checkpoint-every", "2", "--step-ms", "40",
                    epochs=3)
    # Wait for a checkpoint inside epoch 1 (mid-epoch: some of its steps taken), then SIGKILL
    # both ranks (and torchrun) and the producer: a crashed node.
    state = _kill_after_a_mid_epoch_checkpoint(run, ckpt)
    producer.stop()
    assert state["epoch"] == 1 and state["world_size"] == 2 and state["group"].startswith("torch-")

    # Restart: the producer from the job's own checkpoint (`serve --resume CKPT --resume-key
    # loader`: it starts at the round where the group resumes), the job from the same file.
    restarted = serve("--resume", str(ckpt), "--resume-key", "loader", epochs=3, window=2, via_python=True)
    assert any("resuming at epoch 1" in l for l in restarted.lines)
    second = tmp_path / "second"
    run = _torchrun(second, restarted.name, "--checkpoint", str(ckpt), "--resume", epochs=3)
    out, _ = run.communicate(timeout=120)
    assert run.returncode == 0, out
    assert "could not be resumed exactly" not in out, out

    _check_exact(_resumed_run(first, second, state), 3)


def test_a_state_of_another_group_size_or_seed_is_refused(serve):
    producer = serve(epochs=None)
    loader = coloader.Loader(producer.name, batch_size=BATCH, rank=0, world_size=1, timeout=STEP_TIMEOUT)
    state = loader.state_dict()
    with pytest.raises(coloader.InvalidArgument, match="world size 2 in the state, 1 here"):
        loader.load_state_dict(dict(state, world_size=2))
    with pytest.raises(coloader.InvalidArgument, match="seed 5 in the state, 0 here"):
        loader.load_state_dict(dict(state, seed=5))
    with pytest.raises(coloader.InvalidArgument, match="data key 'feed' in the state"):
        loader.load_state_dict(dict(state, data_key="feed"))
    loader.close()


def test_rank_from_the_environment_needs_a_group_name(serve, monkeypatch):
    producer = serve(epochs=None)
    for var in ("TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT", "SLURM_JOB_ID", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(coloader.InvalidArgument, match="needs a group name"):
        coloader.Loader(producer.name, wait_for_producer=0)
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "3")
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    # Node 1 of 2 asks a producer that serves the whole dataset (--world-size 1): refused,
    # naming both sides.
    with pytest.raises(coloader.InvalidArgument, match=r"node 1 of 2, but producer '.*' serves shard 0 of 1"):
        coloader.Loader(producer.name, wait_for_producer=0)


def test_a_shared_producer_that_moved_on_warns_and_continues_at_the_next_epoch(serve):
    # A shared producer is not restarted for one job: when it has passed the saved point and
    # cannot serve the rest (--no-catch-up), the Loader says so (ResumeWarning, naming what is
    # skipped) and goes on with whole epochs.
    producer = serve("--no-catch-up", epochs=None)
    saved = coloader.Loader(producer.name, batch_size=BATCH, rank=0, world_size=1, group="solo",
                            timeout=STEP_TIMEOUT)
    it = iter(saved)
    for _ in range(3):
        next(it)
    state = saved.state_dict()
    assert state["epoch"] == 0 and state["samples_seen_in_epoch"] == 3 * BATCH
    del it
    saved.close()
    other = coloader.Loader(producer.name, batch_size=BATCH, timeout=STEP_TIMEOUT)
    for _epoch in range(2):  # the producer moves on, into epoch 1 and beyond
        for batch in other:
            del batch  # (a batch still referenced would keep `other` attached, holding the producer back)
    other.close()
    resumed = coloader.Loader(producer.name, batch_size=BATCH, rank=0, world_size=1, group="solo",
                              timeout=STEP_TIMEOUT)
    resumed.load_state_dict(state)
    with pytest.warns(coloader.ResumeWarning, match="skipped"):
        batches = sum(1 for _ in resumed)
    assert resumed.epoch >= 1 and batches > 0
    resumed.close()


def test_a_killed_rank_raises_group_broken_in_the_others(serve):
    producer = serve(epochs=None, window=2)
    other = subprocess.Popen([str(BINARY), "consume", "--name", producer.name, "--group", "pair", "--rank", "1",
                              "--world-size", "2", "--batch-size", str(BATCH), "--step-ms", "20"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        loader = coloader.Loader(producer.name, batch_size=BATCH, rank=0, world_size=2, group="pair",
                                 timeout=STEP_TIMEOUT)
        assert len(loader) == STEPS
        it = iter(loader)
        next(it)
        other.kill()
        t0 = time.monotonic()
        with pytest.raises(coloader.GroupBroken, match="rank 1 of group pair left at epoch"):
            for _ in range(10 * STEPS):
                for _ in loader:
                    pass
        assert time.monotonic() - t0 < 1.5 + 2.0  # the heartbeat timeout (pidfd sees it at once), plus slack
        assert isinstance(coloader.GroupBroken("x"), coloader.ProducerGone)
    finally:
        other.kill()
        other.wait()


def test_a_rank_closed_mid_epoch_ends_its_group_but_one_that_finished_does_not(serve):
    """close() before this rank's share of the epoch is taken (an exception in the training
    loop, say) ends the group for the others: their all-reduce would wait for it forever.
    close() after the share is taken (the end of training) lets them read the rest."""
    producer = serve(epochs=None, window=2)

    def rank_1(group, epochs):  # the other rank: the reference consumer, 20 ms a step
        return subprocess.Popen([str(BINARY), "consume", "--name", producer.name, "--group", group, "--rank", "1",
                                 "--world-size", "2", "--batch-size", str(BATCH), "--epochs", str(epochs),
                                 "--step-ms", "20", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    other = rank_1("pair", 2)
    try:
        loader = coloader.Loader(producer.name, batch_size=BATCH, rank=0, world_size=2, group="pair",
                                 timeout=STEP_TIMEOUT)
        it = iter(loader)
        next(it)
        loader.close()  # one step into the epoch
        _, err = other.communicate(timeout=30)
        assert other.returncode == 1, err
        assert "rank 0 of group pair left at epoch" in err, err
    finally:
        other.kill()
        other.wait()

    other = rank_1("done", 1)
    try:
        loader = coloader.Loader(producer.name, batch_size=BATCH, rank=0, world_size=2, group="done",
                                 timeout=STEP_TIMEOUT)
        # The group joins the running producer mid-epoch: its first epoch is the rest of it.
        steps = sum(1 for _ in loader)  # rank 0 reads at once, rank 1 at 20 ms a step
        loader.close()
        out, err = other.communicate(timeout=30)
        assert other.returncode == 0, err
        epoch = json.loads(out.splitlines()[0])
        assert steps > 0 and epoch["batches"] == steps, (steps, epoch)
    finally:
        other.kill()
        other.wait()


@pytest.mark.parametrize("catch_up", [True, False], ids=["catch-up", "no-catch-up"])
def test_a_ddp_job_killed_and_restarted_while_another_reads_on_resumes_exactly(serve, tmp_path, catch_up):
    """Issue 39, test 3: torchrun's 2 ranks and another job read one producer; the DDP job is
    SIGKILLed mid-way through its second epoch and restarted from its checkpoint while the other
    reads on (the producer is not restarted). The producer serves both ranks the rest of that
    epoch, decoded again once, each rank its equal share of exactly what it had not read; then
    whole epochs. Without catch-up the rest cannot be served: a ResumeWarning says so."""
    ckpt = tmp_path / "ckpt.pt"
    producer = serve(*([] if catch_up else ["--no-catch-up"]), epochs=None, window=2)
    other = subprocess.Popen([str(BINARY), "consume", "--name", producer.name, "--step-ms", "100"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    with reaped(other):
        first = tmp_path / "first"
        run = _torchrun(first, producer.name, "--checkpoint", str(ckpt), "--checkpoint-every", "2", "--step-ms", "150",
                        epochs=3)

        def second_epoch():  # the job's first epoch is whichever the producer was in when it came
            steps = _steps(first, 0) if (first / "rank0.jsonl").exists() else []
            return steps[0]["epoch"] + 1 if steps else -1

        state = _kill_after_a_mid_epoch_checkpoint(run, ckpt, second_epoch)
        e = state["epoch"]
        assert other.poll() is None, other.stderr.read()  # it reads on meanwhile
        second = tmp_path / "second"  # (its --epochs counts the producer's epoch numbers)
        run = _torchrun(second, producer.name, "--checkpoint", str(ckpt), "--resume", epochs=e + 2)
        out, _ = run.communicate(timeout=120)
        assert run.returncode == 0, out
        assert other.poll() is None, other.stderr.read()
    if not catch_up:
        assert "ResumeWarning" in out and "skipped" in out, out
        return
    assert "ResumeWarning" not in out and "could not be resumed exactly" not in out, out
    assert any("resumes a saved state" in l for l in producer.lines), "".join(producer.lines)
    _check_exact(_resumed_run(first, second, state, epochs=range(e - 1, e + 2)), range(e - 1, e + 2))
    for rank in (0, 1):  # the resumed epoch's rest, then whole epochs, equal steps on both ranks
        summaries = _summaries(second, rank)
        assert [(s["epoch"], s["partial"]) for s in summaries] == [(e, True), (e + 1, False)], summaries
    assert _summaries(second, 0)[0]["steps"] == _summaries(second, 1)[0]["steps"]
