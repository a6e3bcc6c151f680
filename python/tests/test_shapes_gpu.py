"""Batches whose shapes vary, on the device path: padded-to-longest language-model batches and
lists of samples of different sizes placed in GPU memory reach consumer processes of other batch
sizes (and a group's ranks) as CUDA tensors, every value and shape exact; the samples' shapes are
read from the host copy the library keeps, never from the GPU. Skipped without a CUDA device
(run on the GPU machine)."""
import pytest
import torch

from support import coloader, needs_build
from test_shapes import Scenes, check_group, consumer, keep_apart, lm_producer, read_as_group, read_consumer, run_in_thread

pytestmark = [
    needs_build,
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (torch.cuda.is_available() is False)"),
]


def test_padded_to_longest_batches_reach_device_consumers_and_a_group_exactly(env):
    producer = lm_producer("texts-gpu", 5, device="cuda:0")  # three processes and two ranks
    jobs = [consumer("texts-gpu", 13, 2, "lm", device="cuda"), consumer("texts-gpu", 40, 2, "lm", device="cuda"),
            consumer("texts-gpu", 24, 2, "lm")]
    thread, ended = run_in_thread(producer, 2)
    group = read_as_group("texts-gpu", device="cuda")
    for job, places in zip(jobs, (["cuda:0"], ["cuda:0"], ["cpu"])):
        _, epochs = read_consumer(job, 2)
        assert [e["places"] for e in epochs] == [places] * 2
    check_group(*group)
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
