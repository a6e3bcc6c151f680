"""coloader.Producer(device="cuda:0"): a language-model dict placed in GPU memory reaches consumer
processes of other batch sizes as CUDA tensors, exactly, and a job that writes its batches in
place changes nothing another job sees. Skipped without a CUDA device (run on the GPU machine)."""
import threading

import pytest
import torch

from support import coloader, needs_build
from test_structures import N, Tokens, consumer, read_consumer

pytestmark = [
    needs_build,
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (torch.cuda.is_available() is False)"),
]


def test_cuda_consumers_get_exact_epochs_of_a_language_model_dict_and_writes_stay_their_own(env):
    loader = torch.utils.data.DataLoader(Tokens(), batch_size=32, num_workers=2)
    producer = coloader.Producer(loader, name="tokens-gpu", min_consumers=3, device="cuda:0")
    # A job that writes every tensor of its batches in place, one that reads them after it
    # (both on the device path), and one on the host path of the same ring.
    scribbler = consumer("tokens-gpu", 24, 2, device="cuda", scribble=True)
    reader = consumer("tokens-gpu", 40, 2, device="cuda")
    host = consumer("tokens-gpu", 13, 2)
    ended = []
    thread = threading.Thread(target=lambda: ended.append(producer.run(epochs=2)), daemon=True)
    thread.start()
    assert [e["places"] for e in read_consumer(scribbler, 24, 2)] == [["cuda:0"]] * 2
    assert [e["places"] for e in read_consumer(reader, 40, 2)] == [["cuda:0"]] * 2
    assert [e["places"] for e in read_consumer(host, 13, 2)] == [["cpu"]] * 2
    thread.join(timeout=60)
    assert ended == ["delivered"]
    assert N % 24 and N % 40 and N % 13  # every consumer gathered across producer batches
