"""Batches whose shapes vary, on the device path: padded-to-longest language-model batches and
lists of samples of different sizes placed in GPU memory reach consumer processes of other batch
sizes (and a group's ranks) as CUDA tensors, every value and shape exact; the samples' shapes are
read from the host copy the library keeps, never from the GPU. Skipped without a CUDA device
(run on the GPU machine)."""
import pytest
import torch

from support import coloader, needs_build
from test_shapes import N, Scenes, consumer, keep_apart, lm_producer, read_consumer, run_in_thread

pytestmark = [
    needs_build,
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (torch.cuda.is_available() is False)"),
]


def test_padded_to_longest_batches_reach_device_consumers_and_a_group_exactly(env):
    producer = lm_producer("texts-gpu", 6, device="cuda:0")  # four processes and two ranks
    # Copies gathered across producer batches (13, 40), views of the producer's memory from
    # inside its batches (zero_copy at 8: the shapes read from the host slot), the host path (24).
    jobs = [consumer("texts-gpu", 13, 2, "lm", device="cuda"), consumer("texts-gpu", 40, 2, "lm", device="cuda"),
            consumer("texts-gpu", 8, 2, "lm", device="cuda-zc"), consumer("texts-gpu", 24, 2, "lm")]
    # A group's ranks pad their last round with a sample taken twice: its shapes come along (from
    # the host copy the group stashes with the sample). Processes of their own: CUDA IPC does not
    # map the producer's memory into the producer's own process.
    ranks = [consumer("texts-gpu", 8, 2, "lm", device="cuda", rank=r) for r in range(2)]
    thread, ended = run_in_thread(producer, 2)
    for job, places in zip(jobs, (["cuda:0"], ["cuda:0"], ["cuda:0"], ["cpu"])):
        _, epochs = read_consumer(job, 2)
        assert [e["places"] for e in epochs] == [places] * 2
    shares = [read_consumer(rank, 2, whole=False)[1] for rank in ranks]
    for e0, e1 in zip(*shares):
        assert e0["places"] == e1["places"] == ["cuda:0"]
        assert sorted(set(e0["seen"]) | set(e1["seen"])) == list(range(N)) and len(e0["seen"]) == len(e1["seen"])
    thread.join(timeout=60)
    assert ended == ["delivered"]


def test_lists_of_samples_reach_device_consumers_as_lists_of_cuda_tensors_exactly(env):
    loader = torch.utils.data.DataLoader(Scenes(), batch_size=16, collate_fn=keep_apart)
    producer = coloader.Producer(loader, name="scenes-gpu", min_consumers=2, device="cuda:0")
    jobs = [consumer("scenes-gpu", 7, 2, "det", device="cuda"), consumer("scenes-gpu", 40, 2, "det")]
    thread, ended = run_in_thread(producer, 2)
    for job, places in zip(jobs, (["cuda:0"], ["cpu"])):
        _, epochs = read_consumer(job, 2)
        assert [e["places"] for e in epochs] == [places] * 2
    thread.join(timeout=60)
    assert ended == ["delivered"]


def test_a_device_reader_of_one_sample_per_batch_releases_every_slot(env):
    # At a batch of one, a field cut to the sample's shape is already contiguous: a view of the
    # batch, which the Loader must not keep as a copy of its own (a view kept by the batch's
    # lease held the lease for ever, and with zero_copy the producer's slot: the stream stalled
    # once the ring's slots were all held).
    producer = lm_producer("texts-one", 1, device="cuda:0")
    job = consumer("texts-one", 1, 2, "lm", device="cuda-zc")
    thread, ended = run_in_thread(producer, 2)
    _, epochs = read_consumer(job, 2)
    assert [e["places"] for e in epochs] == [["cuda:0"]] * 2
    thread.join(timeout=60)
    assert ended == ["delivered"]
