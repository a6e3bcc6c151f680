"""coloader.Producer shares any DataLoader's batches: a language-model dict of token tensors, and
nested tuples, lists and dicts of every dtype, reach consumers of other batch sizes exactly
(values, dtypes, per-sample shapes checked sample by sample against the dataset), on the host
path here and on the device path in test_structures_gpu.py."""
import collections
import json
import os
import subprocess
import sys
import threading

import pytest
import torch

from support import PYTHON_DIR, coloader, needs_build

pytestmark = needs_build

N = 97        # a prime: no batch size below divides it
SEQ = 128     # tokens per sample
VOCAB = 1000


class Tokens(torch.utils.data.Dataset):
    """A language-model dataset made on the fly: sample i is a dict of int64 input_ids, a bool
    attention_mask (i % 50 padding tokens at the end) and int64 per-token labels, all derived
    from i, so that what a consumer got can be checked sample by sample."""

    def __len__(self):
        return N

    def __getitem__(self, i):
        return lm_sample(i)


def lm_sample(i):
    ids = (torch.arange(SEQ, dtype=torch.int64) * 7 + i * 13) % VOCAB
    mask = torch.arange(SEQ) < SEQ - i % 50
    return {"input_ids": ids, "attention_mask": mask, "labels": torch.where(mask, ids, torch.tensor(-100))}


# A consumer process: reads `epochs` epochs of the producer's batches with its own batch size
# (on the device path with "cuda") and prints, per epoch, what it saw checked against the
# dataset; with "scribble" it then writes over every tensor of every batch, in place.
CONSUMER = """
import json, sys, torch, coloader
sys.path.insert(0, sys.argv[4])
from test_structures import lm_sample
name, batch, epochs, device, scribble = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[5], sys.argv[6]
loader = coloader.Loader(name, batch_size=batch, wait_for_producer=30, timeout=30, device=device or None)
print(json.dumps({"schema": [[p, str(d), list(s)] for p, d, s in loader.schema]}), flush=True)
for _ in range(epochs):
    seen, wrong, sizes, places = [], 0, [], set()
    for b in loader:
        assert isinstance(b, dict) and list(b) == ["input_ids", "attention_mask", "labels"], b.keys()
        sizes.append(len(loader.indices))
        places |= {str(t.device) for t in b.values()}
        host = {k: t.cpu() for k, t in b.items()}
        for j, i in enumerate(loader.indices.tolist()):
            want = lm_sample(i)
            for k in want:
                got = host[k][j]
                if got.dtype != want[k].dtype or got.shape != want[k].shape or not torch.equal(got, want[k]):
                    wrong += 1
        if scribble:
            for t in b.values():
                t.logical_not_() if t.dtype == torch.bool else t.add_(1)
        seen += loader.indices.tolist()
    print(json.dumps({"seen": sorted(seen), "wrong": wrong, "sizes": sizes, "places": sorted(places)}), flush=True)
"""


def consumer(name, batch, epochs, device="", scribble=False):
    return subprocess.Popen([sys.executable, "-c", CONSUMER, name, str(batch), str(epochs), os.path.dirname(__file__),
                             device, "1" if scribble else ""],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=str(PYTHON_DIR)))


def read_consumer(c, batch, epochs):
    """What the consumer process printed, its epochs checked: (schema line, epoch lines)."""
    out, err = c.communicate(timeout=120)
    assert c.returncode == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    assert lines[0]["schema"] == [['["input_ids"]', "torch.int64", [SEQ]],
                                  ['["attention_mask"]', "torch.bool", [SEQ]],
                                  ['["labels"]', "torch.int64", [SEQ]]]
    assert len(lines) == 1 + epochs, out
    for epoch in lines[1:]:
        assert epoch["seen"] == list(range(N))  # every sample exactly once
        assert epoch["wrong"] == 0
        assert epoch["sizes"] == [batch] * (N // batch) + [N % batch]
    return lines[1:]


def test_two_consumers_get_exact_epochs_of_a_language_model_dict(env):
    # Unshuffled: loader.indices are the samples' positions in the epoch, here their dataset
    # indices, so every sample can be checked against the dataset.
    loader = torch.utils.data.DataLoader(Tokens(), batch_size=32, num_workers=2)
    producer = coloader.Producer(loader, name="tokens", min_consumers=2)
    # The first writes over every tensor of its batches in place: the other sees the dataset.
    consumers = [consumer("tokens", 24, 2, scribble=True), consumer("tokens", 40, 2)]
    ended = []
    thread = threading.Thread(target=lambda: ended.append(producer.run(epochs=2)), daemon=True)
    thread.start()
    for c, batch in zip(consumers, (24, 40)):
        assert [e["places"] for e in read_consumer(c, batch, 2)] == [["cpu"]] * 2
    thread.join(timeout=30)
    assert ended == ["delivered"]


def every_dtype_sample(i):
    """Nested tuple/list/dict of one tensor per dtype, per-sample shapes from scalar to 3-D."""
    g = torch.Generator().manual_seed(i)
    r = torch.rand(2, 3, 4, generator=g)
    return (
        {"bool": r[0, 0] > 0.5, "uint8": (r[0] * 255).to(torch.uint8), "int8": (r[1, 0] * 200 - 100).to(torch.int8)},
        [(r * 60000 - 30000).to(torch.int16), torch.tensor(i * 100003, dtype=torch.int32),
         torch.tensor(i * 10**12, dtype=torch.int64)],
        {"half": {"float16": r[1].to(torch.float16), "bfloat16": r[0].to(torch.bfloat16)},
         "float32": r, "float64": r.double()[0, 0] * 1e-300,
         "complex64": torch.complex(r[0], r[1])},
    )


class EveryDtype(torch.utils.data.Dataset):
    def __len__(self):
        return N

    def __getitem__(self, i):
        return every_dtype_sample(i)


def leaves(x):
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, dict):
        return [t for v in x.values() for t in leaves(v)]
    return [t for v in x for t in leaves(v)]


def same_structure(a, b):
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor)
    if type(a) is not type(b) or len(a) != len(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same_structure(a[k], b[k]) for k in a)
    return all(same_structure(x, y) for x, y in zip(a, b))


def check_batches(loader, want_sample):
    """Reads one epoch; returns (sorted indices seen, number of leaves that differ from the dataset)."""
    seen, wrong = [], 0
    for b in loader:
        for j, i in enumerate(loader.indices.tolist()):
            want = want_sample(i)
            assert same_structure(b, torch.utils.data.default_collate([want]))
            for got, w in zip(leaves(b), leaves(want)):
                got = got[j]
                if got.dtype != w.dtype or got.shape != w.shape or not torch.equal(got, w):
                    wrong += 1
        seen += loader.indices.tolist()
    return sorted(seen), wrong


def test_every_dtype_and_nesting_arrives_as_the_dataloader_made_it(env):
    loader = torch.utils.data.DataLoader(EveryDtype(), batch_size=5)
    producer = coloader.Producer(loader, name="dtypes")
    thread = threading.Thread(target=producer.run, args=(1,), daemon=True)
    thread.start()
    with coloader.Loader("dtypes", batch_size=7, wait_for_producer=20, timeout=20) as consumer:
        assert [str(d) for _, d, _ in consumer.schema] == [
            "torch.bool", "torch.uint8", "torch.int8", "torch.int16", "torch.int32", "torch.int64", "torch.float16",
            "torch.bfloat16", "torch.float32", "torch.float64", "torch.complex64"]
        assert consumer.schema[5] == ("[1][2]", torch.int64, ())
        assert check_batches(consumer, every_dtype_sample) == (list(range(N)), 0)
    thread.join(timeout=30)
    assert not thread.is_alive()


def test_a_group_pads_its_last_round_with_every_field(env):
    # Two ranks of a group split each epoch into equal shares (97 samples: one sample is taken
    # twice); the padding sample is copied field by field like any other.
    loader = torch.utils.data.DataLoader(Tokens(), batch_size=16)
    producer = coloader.Producer(loader, name="tokens-ddp", min_consumers=2)
    thread = threading.Thread(target=producer.run, args=(1,), daemon=True)
    thread.start()
    results = {}

    def rank(r):
        with coloader.Loader("tokens-ddp", batch_size=8, rank=r, world_size=2, group="lm", wait_for_producer=20,
                             timeout=20) as c:
            results[r] = check_batches(c, lm_sample)

    ranks = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    for t in ranks:
        t.start()
    for t in ranks:
        t.join(timeout=60)
    (seen0, wrong0), (seen1, wrong1) = results[0], results[1]
    assert wrong0 == wrong1 == 0
    assert len(seen0) == len(seen1) == (N + 1) // 2
    assert sorted(set(seen0) | set(seen1)) == list(range(N))
    thread.join(timeout=30)


def test_a_conjugated_view_and_a_mapping_travel_as_their_values(env):
    # x.conj() is a view whose memory holds x (a flag says "conjugate"): consumers get the
    # conjugated values. A Mapping that is not a dict (transformers' BatchEncoding is a
    # UserDict) travels as a dict.
    x = torch.complex(torch.arange(12.0).reshape(4, 3), torch.ones(4, 3))
    producer = coloader.Producer([collections.UserDict({"z": x.conj()})], name="conj")
    thread = threading.Thread(target=producer.run, args=(1,), daemon=True)
    thread.start()
    with coloader.Loader("conj", wait_for_producer=20, timeout=20) as consumer:
        (batch,) = list(consumer)
    assert type(batch) is dict and torch.equal(batch["z"], x.conj().resolve_conj())
    thread.join(timeout=30)


def test_a_job_that_keeps_every_batch_and_loops_once_too_often_sees_the_dataset_and_a_clear_end(env):
    # A ring of 2 + 1 slots and a job that keeps all 13 of its batches: the producer has the
    # kept ones copied away (Reclaim) field by field, and every kept tensor still holds its
    # samples after the epoch. The next epoch of a producer that served its one is empty at
    # once, with a FinishedWarning, not a hang.
    producer = coloader.Producer(torch.utils.data.DataLoader(Tokens(), batch_size=16), name="keeper", window=2)
    thread = threading.Thread(target=producer.run, args=(1,), daemon=True)
    thread.start()
    with coloader.Loader("keeper", batch_size=8, wait_for_producer=20, timeout=20) as consumer:
        kept = [(b, consumer.indices.clone()) for b in consumer]
        with pytest.warns(coloader.FinishedWarning):
            assert list(consumer) == []
    assert len(kept) == -(-N // 8)
    for b, indices in kept:
        for j, i in enumerate(indices.tolist()):
            want = lm_sample(i)
            assert all(torch.equal(b[k][j], want[k]) for k in want), i
    del kept, b  # the consumer leaves once its last tensor goes: then run() returns
    thread.join(timeout=30)
    assert not thread.is_alive()
