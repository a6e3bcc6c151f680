"""What each iter() of a coloader.Loader is, side by side with torch's DataLoader: a new pass (the
next epoch, the rest of an unfinished one skipped), except after a peek, which costs its batch,
not the epoch (docs/DESIGN.md, "A peek costs a batch, not an epoch"). Against a real producer
process, through the build tree.

Runs with: /usr/bin/python3 -m pytest -q python/tests/test_passes.py
"""

import pytest

from support import NUM_IMAGES, PRODUCER_BATCH, coloader, expected_sizes, loader_for, needs_build, run_epoch, torch

pytestmark = [needs_build, pytest.mark.filterwarnings("ignore::coloader.FinishedWarning")]


def test_new_iter_skips_the_rest_of_an_unfinished_epoch(serve):
    p = serve(epochs=3)
    with loader_for(p, batch_size=10) as loader:
        it = iter(loader)
        next(it), next(it)
        assert loader.epoch == 0
        sizes, indices, _ = run_epoch(loader)  # epoch 0's rest is released unread
        assert loader.epoch == 1
        assert sorted(indices) == list(range(NUM_IMAGES))
        with pytest.raises(StopIteration):  # the abandoned iterator is finished
            next(it)
        sizes, indices, _ = run_epoch(loader)
        assert loader.epoch == 2 and sorted(indices) == list(range(NUM_IMAGES))
        assert list(loader) == []
    assert p.wait() == 0


@pytest.mark.parametrize("prefetch", [False, True], ids=["plain", "batch-ahead"])
def test_each_iter_is_a_new_pass_as_with_torch_dataloader(serve, prefetch):
    """Issue 39's item 4, side by side with torch's DataLoader over the same number of samples:
    a peek (next(iter(loader))) and then a loop, a loop broken after 3 batches and then another:
    every loop yields the batches DataLoader's does, each a whole epoch. A peek costs its batch,
    not the epoch: the loop after it is that epoch, the peeked batch first (a copy: what the loop
    writes into it does not reach the peeked tensors, kept to look at later; the Loader does not
    keep them itself: see the next test). A loop broken later
    leaves its epoch: the next iter() is the next epoch. So a producer of 3 epochs gives this job a peek and 3 passes, every sample of each
    epoch once. len() is a whole epoch's batches throughout, `epoch` the current pass's number.
    With the batch ahead (the device path's default), the one taken ahead during the peek is the
    loop's second."""
    p = serve(epochs=3)
    loader = loader_for(p, batch_size=10, prefetch=prefetch)
    dl = torch.utils.data.DataLoader(range(NUM_IMAGES), batch_size=10, shuffle=True)
    assert len(loader) == len(dl) == len(expected_sizes(10))

    def loop(it, indices=None):
        sizes = []
        for batch in it:
            sizes.append(len(batch[0] if isinstance(batch, (list, tuple)) else batch))
            if indices is not None:
                indices += loader.indices.tolist()
        return sizes

    (peeked, peeked_labels), _ = next(iter(loader)), next(iter(dl))  # a peek, the batch kept
    peek_indices, as_peeked = loader.indices.tolist(), peeked.clone()
    first, indices = [], []
    for n, (images, _) in enumerate(loader):
        if n == 0:
            first = (loader.indices.tolist(), torch.equal(images, as_peeked))
            images.zero_()  # the loop's writes
        indices += loader.indices.tolist()
    assert loader.epoch == 0 and not loader.partial and first == (peek_indices, True)
    assert torch.equal(peeked, as_peeked)  # the peeked tensors, kept, as they were
    assert sorted(indices) == list(range(NUM_IMAGES)) and len(indices) == sum(loop(dl))
    assert len(loader) == len(dl)
    for source in (loader, dl):  # a loop broken after 3 batches
        for n, _ in enumerate(source):
            if n == 2:
                break
    assert loader.epoch == 1
    indices = []
    assert loop(loader, indices) == loop(dl) == expected_sizes(10)
    assert loader.epoch == 2 and sorted(indices) == list(range(NUM_IMAGES))
    with pytest.warns(coloader.FinishedWarning):  # the producer's 3 epochs were the job's 3 passes
        assert list(loader) == []
    loader.close()


def test_a_peek_whose_batch_was_let_go_costs_that_batch_and_holds_nothing(serve):
    """The Loader remembers a pass's first batch weakly: a peek whose batch the job dropped holds
    no slot (the zero-copy batch's slot goes back at once), and the loop after it is the rest of
    that epoch, one batch short, every other sample once."""
    p = serve(epochs=1, window=2)
    loader = loader_for(p, batch_size=PRODUCER_BATCH, zero_copy=True)
    next(iter(loader))[0].sum()  # looked at, and let go
    peeked = loader.indices.tolist()
    p.wait_for(lambda st: st["consumers"][0]["acked"] >= 1, "the peeked batch's slot back")
    indices = []
    for images, _ in loader:
        indices += loader.indices.tolist()
    assert loader.epoch == 0 and sorted(indices + peeked) == list(range(NUM_IMAGES))
    assert len(indices) == NUM_IMAGES - len(peeked)
    loader.close()


def test_a_peek_let_go_is_said_and_a_state_loaded_after_it_ends_the_iterators_made_before(serve, tmp_path):
    """A peek whose batch was let go warns that the pass is one batch short. load_state_dict() (a
    reconnect mid-run) ends the iterators made before it: an iterator begun after a peek does not
    yield the peeked batch from the connection that was left."""
    p = serve(epochs=2)
    loader = loader_for(p, batch_size=10)
    next(iter(loader))  # let go at once
    with pytest.warns(UserWarning, match="was let go, so this pass is the rest of epoch 0, one batch short"):
        it = iter(loader)
    state = loader.state_dict()
    peeked = next(iter(loader)), loader.indices.tolist()  # (epoch 1's first batch, kept)
    stale = iter(loader)  # would yield the peeked batch again
    loader.load_state_dict(state)
    with pytest.raises(StopIteration):
        next(stale)
    with pytest.raises(StopIteration):
        next(it)
    loader.close()


def test_a_loop_left_after_its_first_batch_every_time_still_moves_through_the_epochs(serve):
    """A peek's continuation is had once: a pass that continues a peek and is itself left after
    one batch ends that epoch, so a loop that breaks after its first batch every time sees each
    epoch's first batch twice and moves on (it is not held to one batch for ever)."""
    p = serve(epochs=3)
    loader = loader_for(p, batch_size=10)
    seen = []
    for epoch in range(6):
        for images, labels in loader:
            seen.append((loader.epoch, tuple(loader.indices.tolist())))
            break
    assert [e for e, _ in seen] == [0, 0, 1, 1, 2, 2]
    assert seen[0][1] == seen[1][1] and seen[2][1] == seen[3][1] and seen[0][1] != seen[2][1]
    with pytest.warns(coloader.FinishedWarning):
        assert list(loader) == []
    loader.close()
