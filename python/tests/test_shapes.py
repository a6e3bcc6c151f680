"""Batches whose shapes vary: a language-model DataLoader that pads each batch to its longest
sample, and a detection-like one whose batches are lists of samples (images of different sizes,
a different number of boxes each), reach consumer processes of other batch sizes with every value
and shape exact, checked sample by sample against the dataset. The device path is in
test_shapes_gpu.py."""
import json
import os
import subprocess
import sys
import threading

import numpy as np
import pytest
import torch

from support import PYTHON_DIR, coloader, needs_build

pytestmark = needs_build

N = 97          # a prime: no batch size below divides it
BATCH = 16      # the producer's batch size
MAX_LEN = 72    # tokens at most per sample
PAD_ID, LABEL_PAD = 0, -100


def length(i):
    return 3 + (i // BATCH) * 10 + (i * 5) % 7  # 3..66 tokens, longer from one producer batch to the next


def lm_sample(i):
    ids = (torch.arange(length(i), dtype=torch.int64) * 7 + i * 13) % 999 + 1  # never the pad id
    return {"input_ids": ids, "attention_mask": torch.ones(length(i), dtype=torch.bool), "labels": ids.clone()}


class Texts(torch.utils.data.Dataset):
    def __len__(self):
        return N

    def __getitem__(self, i):
        return lm_sample(i)


def pad_to_longest(samples, longest=None):
    """What Hugging Face's DataCollatorWithPadding does: pads each batch to its longest sample
    (or to `longest`)."""
    longest = longest or max(len(s["input_ids"]) for s in samples)

    def pad(key, value):
        return torch.stack([torch.nn.functional.pad(s[key], (0, longest - len(s[key])), value=value) for s in samples])
    return {"input_ids": pad("input_ids", PAD_ID), "attention_mask": pad("attention_mask", False),
            "labels": pad("labels", LABEL_PAD)}


def lm_expected(indices):
    """The rule: a consumer's batch is as long as the longest producer batch its samples came
    from (here batches of BATCH in order), each sample padded with its field's pad value."""
    longest = max(max(length(j) for j in range(b * BATCH, min(N, (b + 1) * BATCH))) for b in {i // BATCH for i in indices})
    return pad_to_longest([lm_sample(i) for i in indices], longest), longest


def det_sample(i):
    """An image of its own size, and as many boxes as it has objects (none for some)."""
    g = torch.Generator().manual_seed(i)
    h, w = 8 + i % 13, 9 + (i * 5) % 11
    boxes = torch.rand(i % 4, 4, generator=g)
    return {"image": torch.randint(0, 256, (3, h, w), generator=g, dtype=torch.uint8), "boxes": boxes,
            "label": torch.tensor(i % 10)}


class Scenes(torch.utils.data.Dataset):
    def __len__(self):
        return N

    def __getitem__(self, i):
        return det_sample(i)


def keep_apart(samples):
    """A detection collate: images and targets stay lists of samples; the labels are batched."""
    return ([s["image"] for s in samples], [{"boxes": s["boxes"]} for s in samples],
            torch.stack([s["label"] for s in samples]))


# A consumer process: reads `epochs` epochs at its own batch size (the device path with "cuda")
# and prints per epoch what it saw, checked sample by sample against the dataset.
CONSUMER = """
import json, sys, torch, coloader
sys.path.insert(0, sys.argv[4])
from test_shapes import lm_expected, det_sample
name, batch, epochs, device, kind = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[5], sys.argv[6]
group = dict(rank=int(sys.argv[7]), world_size=2, group="lm") if len(sys.argv) > 7 else {}
zero_copy = device.endswith("-zc")  # "cuda-zc": the device path's views of the producer's memory
loader = coloader.Loader(name, batch_size=batch, wait_for_producer=30, timeout=30,
                         device=device.replace("-zc", "") or None, zero_copy=zero_copy, **group)
print(json.dumps({"schema": [[p, str(d), list(s)] for p, d, s in loader.schema]}), flush=True)
for _ in range(epochs):
    seen, wrong, lengths, places = [], [], [], set()
    for b in loader:
        indices = loader.indices.tolist()
        if kind == "lm":
            want, longest = lm_expected(indices)
            lengths.append(longest)
            places |= {str(t.device) for t in b.values()}
            for k in want:
                got = b[k].cpu()
                if got.dtype != want[k].dtype or got.shape != (len(indices), longest) or not torch.equal(got, want[k]):
                    wrong.append([k, indices[0], list(got.shape)])
                if not b[k].is_contiguous():
                    wrong.append([k, "not contiguous"])
        else:
            images, targets, labels = b
            assert isinstance(images, list) and isinstance(targets, list) and len(images) == len(indices)
            places |= {str(t.device) for t in images + [labels]}
            for j, i in enumerate(indices):
                s = det_sample(i)
                got = [images[j].cpu(), targets[j]["boxes"].cpu(), labels[j].cpu()]
                for g, w in zip(got, [s["image"], s["boxes"], s["label"]]):
                    if g.dtype != w.dtype or g.shape != w.shape or not torch.equal(g, w):
                        wrong.append([i, list(g.shape), list(w.shape)])
        seen += indices
    print(json.dumps({"seen": sorted(seen), "wrong": wrong[:5], "lengths": lengths, "places": sorted(places)}),
          flush=True)
"""


def consumer(name, batch, epochs, kind, device="", rank=None):
    """A consumer process (with `rank`, one of a group of two)."""
    return subprocess.Popen([sys.executable, "-c", CONSUMER, name, str(batch), str(epochs), os.path.dirname(__file__),
                             device, kind] + ([str(rank)] if rank is not None else []),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=str(PYTHON_DIR)))


def read_consumer(c, epochs, whole=True):
    """What the consumer process printed, its epochs checked exact (and whole, unless it is a
    group's rank): (schema, epochs)."""
    out, err = c.communicate(timeout=120)
    assert c.returncode == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    assert len(lines) == 1 + epochs, out
    for epoch in lines[1:]:
        assert not whole or epoch["seen"] == list(range(N))  # every sample exactly once
        assert epoch["wrong"] == [], epoch["wrong"]
    return lines[0]["schema"], lines[1:]


def run_in_thread(producer, epochs):
    ended = []
    thread = threading.Thread(target=lambda: ended.append(producer.run(epochs=epochs)), daemon=True)
    thread.start()
    return thread, ended


def lm_producer(name, consumers, device=None):
    loader = torch.utils.data.DataLoader(Texts(), batch_size=BATCH, collate_fn=pad_to_longest, num_workers=2)
    return coloader.Producer(loader, name=name, min_consumers=consumers, device=device,
                             max_shapes={"input_ids": (MAX_LEN,), "attention_mask": (MAX_LEN,),
                                         "labels": (MAX_LEN,)},
                             pad={"labels": LABEL_PAD})


def test_padded_to_longest_batches_reach_consumers_of_any_batch_size_exactly(env):
    producer = lm_producer("texts", 3)
    # At the producer's batch size: its batches exactly. At others: batches that mix two producer
    # batches, padded to the longer one with each field's pad value.
    jobs = {b: consumer("texts", b, 2, "lm") for b in (BATCH, 13, 40)}
    thread, ended = run_in_thread(producer, 2)
    for b, job in jobs.items():
        schema, epochs = read_consumer(job, 2)
        assert schema == [['["input_ids"]', "torch.int64", [MAX_LEN]], ['["attention_mask"]', "torch.bool", [MAX_LEN]],
                          ['["labels"]', "torch.int64", [MAX_LEN]]]
        lengths = epochs[0]["lengths"]
        assert len(lengths) == -(-N // b) and len(set(lengths)) >= 3 and max(lengths) < MAX_LEN, lengths
        if b == BATCH:
            assert lengths == [max(length(i) for i in range(s, min(N, s + b))) for s in range(0, N, b)]
    thread.join(timeout=30)
    assert ended == ["delivered"]
    assert producer.schema[0] == ('["input_ids"]', torch.int64, (MAX_LEN,))


def read_as_group(name, device=None):
    """Two ranks of a group read one epoch each (the last round padded with a sample taken twice,
    its shapes along); returns {rank: (indices seen, tensors that differ from the rule)}."""
    results = {}

    def rank(r):
        with coloader.Loader(name, batch_size=8, rank=r, world_size=2, group="lm", device=device,
                             wait_for_producer=30, timeout=30) as loader:
            seen, wrong = [], 0
            for b in loader:
                want, longest = lm_expected(loader.indices.tolist())
                wrong += sum(not torch.equal(b[k].cpu(), want[k]) for k in want)
                seen += loader.indices.tolist()
                assert b["input_ids"].device.type == ("cuda" if device else "cpu")
            results[r] = (seen, wrong)
    ranks = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    for t in ranks:
        t.start()
    return ranks, results


def check_group(ranks, results):
    for t in ranks:
        t.join(timeout=60)
    (seen0, wrong0), (seen1, wrong1) = results[0], results[1]
    assert wrong0 == wrong1 == 0
    assert sorted(set(seen0) | set(seen1)) == list(range(N)) and len(seen0) == len(seen1) == (N + 1) // 2


def test_a_groups_ranks_get_padded_batches_exactly_their_last_round_padded_too(env):
    producer = lm_producer("texts-ddp", 2)
    thread, ended = run_in_thread(producer, 1)
    check_group(*read_as_group("texts-ddp"))
    thread.join(timeout=30)
    assert ended == ["delivered"]


def test_lists_of_samples_of_different_sizes_reach_consumers_as_lists_exactly(env):
    loader = torch.utils.data.DataLoader(Scenes(), batch_size=BATCH, collate_fn=keep_apart)
    producer = coloader.Producer(loader, name="scenes", min_consumers=2)
    jobs = [consumer("scenes", b, 2, "det") for b in (7, 40)]
    thread, ended = run_in_thread(producer, 2)
    for job in jobs:
        schema, _ = read_consumer(job, 2)
        # The rooms: the largest image and box count of the first batch (samples 0..15).
        assert schema == [["[0][*]", "torch.uint8", [3, 20, 19]], ['[1][*]["boxes"]', "torch.float32", [3, 4]],
                          ["[2]", "torch.int64", []]]
    thread.join(timeout=30)
    assert ended == ["delivered"]


def test_a_list_of_samples_is_named_where_it_cannot_be_told_and_told_apart_from_batched_tensors(env):
    # Published by hand, the producer has no batch size to tell a list of samples by: it is named.
    batches = [[torch.arange(n) for n in (3, 1, 4)], [torch.arange(n) for n in (1, 5)]]
    producer = coloader.Producer(batches, name="named", samples=[""], max_shapes={"[*]": (5,)})
    thread, ended = run_in_thread(producer, 1)
    with coloader.Loader("named", batch_size=2, wait_for_producer=20, timeout=20) as loader:
        got = [[t.tolist() for t in b] for b in loader]
    assert got == [[[0, 1, 2], [0]], [[0, 1, 2, 3], [0]], [[0, 1, 2, 3, 4]]]
    thread.join(timeout=30)
    # A (features, targets) pair of one dtype is batched, not two samples; a list of a batch's
    # images is samples.
    looks = coloader._structure.looks_like_samples
    assert not looks((torch.zeros(64, 8), torch.zeros(64, 1)), 64, torch)
    assert not looks((torch.zeros(2, 8), torch.zeros(2, 1)), 2, torch)
    assert not looks((torch.zeros(2, 8), torch.zeros(1, 8)), 2, torch)  # ids and broadcast position ids
    assert looks([torch.zeros(3, 5, 5)] * 64, 64, torch)
    assert not looks([torch.zeros(3, 5, 5), torch.zeros(5, 5)] * 32, 64, torch)  # unlike samples


def test_a_batch_past_its_maximum_is_refused_naming_the_field_its_shape_and_the_maximum(env):
    batches = [{"ids": torch.zeros(4, 3, dtype=torch.int64)}, {"ids": torch.ones(4, 2, dtype=torch.int64)},
               {"ids": torch.zeros(4, 9, dtype=torch.int64)}]
    producer = coloader.Producer(batches, name="grows", max_shapes={"ids": (8,)})
    outcome = []

    def job():
        with coloader.Loader("grows", batch_size=4, wait_for_producer=20, timeout=20) as loader:
            try:
                for b in loader:
                    outcome.append(b["ids"].shape[1])
            except coloader.ProducerStopped as e:
                outcome.append(str(e))
    t = threading.Thread(target=job)
    t.start()
    with pytest.raises(ValueError, match=r'batch\["ids"\] has per-sample shape \(9,\), larger than its maximum '
                                         r'\(8,\) \(given in max_shapes\).*max_shapes=\{\'\["ids"\]\': \(9,\)\}'):
        producer.run()
    t.join(timeout=30)
    assert outcome[:2] == [3, 2] and "larger than its maximum" in outcome[2], outcome
    with pytest.raises(ValueError, match=r'max_shapes names \["id"\], which the first batch does not have'):
        coloader.Producer(batches, name="typo", max_shapes={"id": (8,)}).publish(batches[0])
    with pytest.raises(ValueError, match=r'gives batch\["ids"\] the maximum \(2,\), but the first batch has \(3,\)'):
        coloader.Producer(batches, name="small", max_shapes={"ids": (2,)}).publish(batches[0])


def test_a_list_of_scalars_per_sample_and_the_options_checked_at_the_first_batch(env):
    # One scalar tensor per sample in a list: no dimension to carry, but the rows still say how
    # many samples each batch of the consumer holds.
    batches = [(torch.arange(4.0), [torch.tensor(i) for i in range(4)]), (torch.arange(2.0), [torch.tensor(9)] * 2)]
    producer = coloader.Producer(batches, name="scalars", samples=["[1]"], max_shapes={})
    thread, ended = run_in_thread(producer, 1)
    with coloader.Loader("scalars", batch_size=3, wait_for_producer=20, timeout=20) as loader:
        got = [(x.tolist(), [t.item() for t in items]) for x, items in loader]
    assert got == [([0.0, 1.0, 2.0], [0, 1, 2]), ([3.0, 0.0, 1.0], [3, 9, 9])]
    thread.join(timeout=30)
    batch = {"ids": torch.zeros(4, 3, dtype=torch.int64), "mask": torch.ones(4, 3, dtype=torch.bool)}
    with pytest.raises(ValueError, match=r'samples names batch\["boxes"\], which the first batch has no list'):
        coloader.Producer([], name="nosuch", samples=["boxes"]).publish(batch)
    with pytest.raises(ValueError, match=r'pad gives batch\["ids"\] the value \'x\', which a torch.int64 tensor'):
        coloader.Producer([], name="badpad", pad={"ids": "x"}).publish(batch)
    one = coloader.Producer([], name="int-max", max_shapes={"ids": 8}, pad=-100)  # a 1-D maximum as an int
    one._prepare(batch)  # states the schema (publish() would wait for a consumer)
    assert one.schema == [('["ids"]', torch.int64, (8,)), ('["mask"]', torch.bool, (3,))]
    assert one._schema.pads == [-100, False]  # one value for all pads every field but the masks
    one.close(timeout=1)


def test_a_structure_or_shapes_the_schema_cannot_hold_are_refused():
    fields = [("[0]", torch.int64, (4,), 32), ("#shapes", torch.int32, (1,), 4)]
    check = coloader._structure.check_structure
    check({"shaped": [{"tuple": [{"padded": [0, 0]}]}, 1]}, fields)
    for bad in ({"tuple": [{"samples": ["list", {"dict": []}]}, 0]},      # a list of samples, no shapes
                {"shaped": [{"tuple": [{"padded": [0, 1]}]}, 1]},         # columns past the shapes field
                {"shaped": [{"samples": ["list", {"sample": [0, 0, 2]}]}, 1]}):  # dimensions unlike the field's
        with pytest.raises(ValueError):
            check(bad, fields)
    rebuild = coloader._structure.compile_rebuild({"shaped": [{"padded": [0, 0]}, 1]}, fields, torch)
    leaves = [torch.arange(8).reshape(2, 4)]
    assert rebuild(leaves, np.array([[2], [3]], dtype=np.int32), []).tolist() == [[0, 1, 2], [4, 5, 6]]
    with pytest.raises(ValueError, match="past its fields' rooms"):
        rebuild(leaves, np.array([[2], [5]], dtype=np.int32), [])
