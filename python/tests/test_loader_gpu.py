"""coloader.Loader(device="cuda") against a real producer with a device ring (--device cuda:0).

Runs with: python3 -m pytest -q python/tests/test_loader_gpu.py (on a machine with a CUDA GPU;
everywhere else every test here is skipped). The producer, the build tree, the dataset and the
status helpers are those of test_loader.py. The tensors these tests get view the producer's GPU
memory through CUDA IPC; the host path of the same producer (a Loader without `device`) is the
reference they are compared with.
"""

import gc
import os
import signal
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from support import (  # noqa: E402
    NUM_CLASSES,
    NUM_IMAGES,
    PRODUCER_BATCH,
    PYTHON_DIR,
    STEP_TIMEOUT,
    missing_build,
    coloader,
    expected_sizes,
    in_thread,
    loader_for,
    run_epoch,
    start_reading,
    torch,
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(),
                       reason="needs a CUDA device (torch.cuda.is_available() is False)"),
    pytest.mark.skipif(missing_build() is not None, reason=missing_build() or ""),
]

DEVICE = torch.device("cuda", 0)
OUTPUTS = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
           "uint8": torch.uint8}


def serve_gpu(serve, *args, output="float32", **kwargs):
    return serve("--device", "cuda:0", "--output", output, *args, **kwargs)


def image_shape(n, output):
    return (n, 3, 32, 32)  # NCHW whatever the producer's memory layout (uint8's is NHWC)


def check_batch(images, labels, loader, output):
    n = images.shape[0]
    assert images.is_cuda and images.device == DEVICE, images.device
    assert images.dtype == OUTPUTS[output] and tuple(images.shape) == image_shape(n, output)
    # uint8 lies NHWC in memory: an NCHW tensor with channels_last strides.
    assert images.is_contiguous(memory_format=torch.channels_last if output == "uint8" else torch.contiguous_format)
    assert labels.is_cuda and labels.device == DEVICE and labels.dtype == torch.int64
    assert tuple(labels.shape) == (n,)
    assert loader.indices.device.type == "cpu" and tuple(loader.indices.shape) == (n,)


# ---------------------------------------------------------------------------------------------
# Exact epochs, dtypes and shapes


@pytest.mark.parametrize("output", ["float32", "bfloat16", "uint8"])
@pytest.mark.parametrize("batch_size", [PRODUCER_BATCH, 5])  # views of a slot; gathered on the GPU
def test_exact_epochs_of_cuda_tensors(serve, output, batch_size):
    epochs = 2
    p = serve_gpu(serve, output=output, epochs=epochs)
    with loader_for(p, batch_size=batch_size, device="cuda") as loader:
        assert loader.on_device and loader.fallback_reason == ""
        label_of = {}
        for epoch in range(epochs):
            sizes, indices = [], []
            for images, labels in loader:
                check_batch(images, labels, loader, output)
                if output == "uint8":
                    assert 0 <= int(images.min()) and int(images.max()) <= 255
                else:
                    assert bool(torch.isfinite(images.float()).all())
                sizes.append(images.shape[0])
                for i, l in zip(loader.indices.tolist(), labels.tolist()):
                    indices.append(i)
                    assert label_of.setdefault(i, l) == l  # a sample keeps its label
            assert loader.epoch == epoch and not loader.partial
            assert sizes == expected_sizes(batch_size)
            assert sorted(indices) == list(range(NUM_IMAGES))
        assert set(label_of.values()) == set(range(NUM_CLASSES))
        del images, labels  # the last batch's slot: the producer finishes once it comes back
        assert list(loader) == []
    assert p.wait() == 0


def test_cuda_n_and_the_current_device_are_left_as_they_were(serve):
    p = serve_gpu(serve, epochs=1)
    before = torch.cuda.current_device()
    with loader_for(p, batch_size=PRODUCER_BATCH, device="cuda:0") as loader:
        assert loader.on_device
        for images, labels in loader:
            assert images.device == DEVICE
            assert torch.cuda.current_device() == before
        del images, labels
        gc.collect()
        assert torch.cuda.current_device() == before
    assert p.wait() == 0


# ---------------------------------------------------------------------------------------------
# Zero-copy, and the same content as the host path


def host_and_device_batches(p, batch_size, streams=None, zero_copy=False):
    """Reads one epoch through a host-path and a device-path Loader of the same producer, in
    lock step (both fit in its window), and compares each pair of batches as it goes."""
    host = loader_for(p, batch_size=batch_size)
    device = loader_for(p, batch_size=batch_size, device="cuda", zero_copy=zero_copy)
    assert device.on_device and not host.on_device
    host_start = start_reading(host)  # both attach before either waits (--min-consumers 2)
    device_it = iter(device)
    host_it = host_start()
    allocated = torch.cuda.memory_allocated()
    compared = []
    for k, (host_images, host_labels) in enumerate(host_it):
        stream = streams[k % len(streams)] if streams else torch.cuda.current_stream()
        with torch.cuda.stream(stream):
            images, labels = next(device_it)
            if k == 0:
                # Nothing is allocated through torch for a batch: a zero-copy view is the
                # producer's memory, a copy the consumer's own pool's.
                assert torch.cuda.memory_allocated() == allocated
            assert device.indices.tolist() == host.indices.tolist()
            got_images, got_labels = images.cpu(), labels.cpu()  # ordered on `stream`: waits for it
        # Copies of the host batch: its views would hold the host slots, and the producer.
        compared.append((host.indices.tolist(), host_images.clone(), got_images, host_labels.clone(),
                         got_labels))
        del images, labels, host_images, host_labels
    with pytest.raises(StopIteration):
        next(device_it)
    host.close()
    device.close()
    return compared


@pytest.mark.parametrize("zero_copy", [False, True])
@pytest.mark.parametrize("output", ["uint8", "float32", "bfloat16", "float16"])
def test_device_batches_equal_the_host_batches(serve, output, zero_copy):
    p = serve_gpu(serve, "--min-consumers", "2", "--seed", "7", output=output, epochs=1)
    compared = host_and_device_batches(p, PRODUCER_BATCH, zero_copy=zero_copy)
    indices = [i for c in compared for i in c[0]]
    assert sorted(indices) == list(range(NUM_IMAGES))
    for _, host_images, device_images, host_labels, device_labels in compared:
        assert device_images.dtype == host_images.dtype == OUTPUTS[output]
        assert torch.equal(device_labels, host_labels)
        if output == "uint8":
            assert torch.equal(device_images, host_images)  # the same bytes, uploaded
        else:
            # Normalised on the GPU for the device ring and on the CPU for the host slots.
            tolerance = {"float32": 1e-5, "bfloat16": 1e-2, "float16": 1e-3}[output]
            torch.testing.assert_close(device_images.float(), host_images.float(),
                                       rtol=tolerance, atol=tolerance)
    assert p.wait() == 0


def test_alternating_streams_see_the_same_data(serve):
    """Batches of 5 slice producer slots of 16; each next() runs under another stream."""
    p = serve_gpu(serve, "--min-consumers", "2", "--seed", "3", output="uint8", epochs=1)
    streams = [torch.cuda.Stream(), torch.cuda.current_stream(), torch.cuda.Stream()]
    compared = host_and_device_batches(p, 5, streams=streams)
    assert sorted(i for c in compared for i in c[0]) == list(range(NUM_IMAGES))
    for _, host_images, device_images, host_labels, device_labels in compared:
        assert torch.equal(device_images, host_images) and torch.equal(device_labels, host_labels)
    assert p.wait() == 0


# ---------------------------------------------------------------------------------------------
# Lifetime: a slot is released when its last tensor goes (and its stream work is done), once


def test_zero_copy_cuda_tensors_keep_their_slot_until_the_last_one_goes(serve):
    p = serve_gpu(serve, epochs=1, window=3)
    # one batch per slot: views of the producer's memory itself
    loader = loader_for(p, batch_size=PRODUCER_BATCH, device="cuda", zero_copy=True)
    assert loader.on_device
    acked = lambda: p.consumer()["acked"]  # noqa: E731
    it = iter(loader)

    images0, labels0 = next(it)
    p.wait_for(lambda st: st["consumers"][0]["received"] >= 1, "an announcement")
    assert acked() == 0 and p.status()["slots_in_use"] >= 1

    # Batch 1 released entirely; batch 0's images dropped, but its labels are still alive.
    images1, labels1 = next(it)
    del images0, images1, labels1
    gc.collect()
    st = p.wait_for(lambda st: st["consumers"][0]["acked"] >= 1, "the ack of batch 1")
    assert st["consumers"][0]["acked"] == 1 and st["consumers"][0]["held"] >= 1
    assert labels0.tolist() == labels0.clone().tolist()  # still readable
    del labels0
    gc.collect()
    p.wait_for(lambda st: st["consumers"][0]["acked"] == 2, "the ack of batch 0")

    # A view of a view (slice, reshape, dtype view) holds the batch as well.
    images2, labels2 = next(it)
    view = images2[1:3].reshape(-1).view(torch.int32)
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

    # The release waits for the work queued on the batch's stream: with a kernel reading the
    # batch behind a ~1 s spin, the ack cannot come before the stream gets there.
    images4, labels4 = next(it)
    spin = hasattr(torch.cuda, "_sleep")
    t0 = time.monotonic()
    if spin:
        torch.cuda._sleep(2_000_000_000)  # GPU clock cycles: about a second on an H100/H200
    total = images4.float().sum()  # queued behind the spin (torch may or may not block here)
    del images4, labels4
    gc.collect()
    p.wait_for(lambda st: st["consumers"][0]["acked"] == 5, "the ack of batch 4, after the kernel")
    waited = time.monotonic() - t0
    if spin:
        # The ack was queued behind the ~1 s spin: it cannot come sooner, wherever the host waited.
        assert waited > 0.8, f"batch 4 was acked {waited:.3f} s after the spin was queued, before it ended"
    assert torch.isfinite(total)

    for images, labels in it:  # the rest; the last batch stays bound to the loop variables
        pass
    st = p.wait_for(lambda st: st["consumers"][0]["received"] == 7 and st["consumers"][0]["acked"] == 6,
                    "every batch but the last acked")
    assert st["consumers"][0]["held"] == 1
    del images, labels
    gc.collect()
    assert p.wait() == 0  # exactly one ack per lease, or the producer would not finish
    assert any("every epoch delivered" in line for line in p.lines), p.lines
    assert list(loader) == []
    loader.close()


@pytest.mark.parametrize("zero_copy", [False, True])
def test_cuda_tensors_outlive_the_loader(serve, zero_copy):
    p = serve_gpu(serve, epochs=None, window=3)
    loader = loader_for(p, batch_size=5, device="cuda", zero_copy=zero_copy)
    it = iter(loader)
    kept = [next(it) for _ in range(4)]  # batch 3 straddles producer slots: gathered on the GPU
    copies = [(i.cpu(), l.cpu()) for i, l in kept]
    loader.close()
    with pytest.raises(coloader.ColoaderError):
        iter(loader)
    st = p.status()
    # Still attached, until the last tensor goes (zero-copy views still hold their slots).
    assert len(st["consumers"]) == 1 and st["consumers"][0]["held"] >= 1
    for (images, labels), (ci, cl) in zip(kept, copies):
        assert torch.equal(images.cpu(), ci) and torch.equal(labels.cpu(), cl)
    # Work still queued when the last tensor goes: the consumer leaves (and hands its slots
    # back) only once it has run.
    if hasattr(torch.cuda, "_sleep"):
        torch.cuda._sleep(500_000_000)
    sums = [images.float().sum() for images, _ in kept]
    del kept, images, labels, it
    gc.collect()
    p.wait_for(lambda st: st["consumers"] == [], "the consumer to leave")
    expected = [float(ci.float().sum()) for ci, _ in copies]
    assert [float(s) for s in sums] == pytest.approx(expected, rel=1e-5)


def test_cuda_tensors_dropped_in_another_thread(serve):
    p = serve_gpu(serve, epochs=1, window=3)
    with loader_for(p, batch_size=PRODUCER_BATCH, device="cuda", zero_copy=True) as loader:
        it = iter(loader)
        box = [next(it)]
        in_thread(lambda: (box.clear(), gc.collect()))()  # the last reference goes there
        p.wait_for(lambda st: st["consumers"][0]["acked"] == 1, "the ack of batch 0")
        for images, labels in it:
            pass
        del images, labels
    assert p.wait() == 0


# ---------------------------------------------------------------------------------------------
# Training on the tensors


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, NUM_CLASSES))


@pytest.mark.parametrize("output", ["float32", "bfloat16", "uint8"])
def test_training_step_channels_last_autocast_bfloat16(serve, output):
    p = serve_gpu(serve, output=output, epochs=2)
    model = make_model().to(DEVICE).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    steps = 0
    with loader_for(p, batch_size=PRODUCER_BATCH, device="cuda") as loader:
        for epoch in range(2):
            for images, labels in loader:
                if output == "uint8":
                    # NHWC bytes come as an NCHW tensor with channels_last strides; normalise in
                    # place: the batch is this job's own.
                    assert images.is_contiguous(memory_format=torch.channels_last)
                    x = images.float().div_(255).sub_(0.5)
                    assert x.is_contiguous(memory_format=torch.channels_last)
                else:
                    x = images.contiguous(memory_format=torch.channels_last)
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    logits = model(x)
                    loss = torch.nn.functional.cross_entropy(logits, labels)
                assert logits.dtype == torch.bfloat16
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                steps += 1
                assert torch.isfinite(loss)
    assert steps == 2 * len(expected_sizes(PRODUCER_BATCH))
    del images, labels, x, logits, loss
    assert p.wait() == 0


# ---------------------------------------------------------------------------------------------
# Fallback


def test_host_only_producer_falls_back_with_a_warning(serve):
    p = serve(epochs=1)  # no --device: no device ring
    with pytest.warns(coloader.DeviceFallbackWarning, match="--device") as caught:
        loader = loader_for(p, batch_size=10, device="cuda")
    assert len(caught) == 1
    assert not loader.on_device and "--device" in loader.fallback_reason
    sizes, indices, _ = run_epoch(loader)
    assert sizes == expected_sizes(10) and sorted(indices) == list(range(NUM_IMAGES))
    loader.close()
    assert p.wait() == 0


def test_host_path_of_a_device_producer_needs_no_cuda_request(serve):
    """A Loader without `device` reads a device producer's host slots, in any output dtype."""
    p = serve_gpu(serve, output="bfloat16", epochs=1)
    with loader_for(p, batch_size=PRODUCER_BATCH) as loader:
        assert not loader.on_device and loader.fallback_reason == ""
        for images, labels in loader:
            assert images.device.type == "cpu" and images.dtype == torch.bfloat16
            assert tuple(images.shape) == image_shape(images.shape[0], "bfloat16")
        del images, labels
    assert p.wait() == 0


# ---------------------------------------------------------------------------------------------
# The contract on the device path: a job's in-place writes, kept batches, and the stream's end


WRITER = r"""
import sys, torch, coloader
loader = coloader.Loader(sys.argv[1], batch_size=int(sys.argv[2]), timeout=30, device="cuda")
assert loader.on_device, loader.fallback_reason
print("attached", flush=True)
for images, labels in loader:
    images.sub_(0.5).div_(0.25)
    torch.nn.functional.relu(images, inplace=True)
    labels.mul_(0)
    images.zero_()
    assert float(images.abs().sum()) == 0.0 and int(labels.abs().sum()) == 0
print("done", flush=True)
"""


def test_a_job_writing_its_cuda_batches_in_place_changes_nothing_another_job_sees(serve):
    """Two device jobs on one `serve --device cuda:0` producer; one zeroes every batch in place
    (the issue's 6,000-of-6,000 corrupted samples). The other's batches equal the host path's."""
    import subprocess
    p = serve_gpu(serve, "--min-consumers", "3", "--decode", "cpu", epochs=1)
    reader = loader_for(p, batch_size=PRODUCER_BATCH, device="cuda")
    host = loader_for(p, batch_size=PRODUCER_BATCH)  # the reference: the host copy of the same slots
    starts = [start_reading(reader), start_reading(host)]
    env = dict(os.environ, PYTHONPATH=str(PYTHON_DIR), PYTHONUNBUFFERED="1")
    writer = subprocess.Popen([sys.executable, "-c", WRITER, p.name, str(PRODUCER_BATCH)], env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert in_thread(writer.stdout.readline)(60).startswith("attached")
        iterators = [s() for s in starts]
        on_host = in_thread(lambda: {i: x.clone() for x, _ in iterators[1]
                                     for i, x in zip(host.indices.tolist(), x)})
        on_device = {}
        for images, _ in iterators[0]:
            for i, x in zip(reader.indices.tolist(), images.cpu()):
                on_device[i] = x
        on_host = on_host()
        assert writer.wait(60) == 0, writer.stderr.read()
    finally:
        writer.kill()
        writer.wait()
    assert sorted(on_device) == sorted(on_host) == list(range(NUM_IMAGES))
    assert all(torch.equal(on_device[i], on_host[i]) for i in on_device), "the writer's zeros reached this job"
    for loader in (reader, host):
        loader.close()
    assert p.wait() == 0


def test_cuda_batches_are_the_jobs_own_and_free_their_slot_at_once(serve):
    """The default device batch is a copy: the slot goes back as soon as the copy is done (the
    consumer holds nothing while the job keeps every batch), and what it keeps never changes."""
    p = serve_gpu(serve, epochs=2, window=2)
    with loader_for(p, batch_size=PRODUCER_BATCH, device="cuda") as loader:
        kept = []
        for images, labels in loader:
            kept.append((images, labels, images.clone()))
        torch.cuda.synchronize()
        # Everything of epoch 0 is kept, more than the ring holds: every slot was given back.
        n = len(kept)
        st = p.wait_for(lambda st: st["consumers"][0]["acked"] == n, "the copied slots' acks")
        assert n > st["slots"]
        assert all(torch.equal(images, before) for images, _, before in kept)
        ptrs = {images.data_ptr() for images, _, _ in kept}
        assert len(ptrs) == len(kept)  # each batch its own memory
        del kept, images, labels


def test_the_device_stream_ends_finished_or_stopped_and_says_which(serve):
    p = serve_gpu(serve, epochs=1)
    with loader_for(p, batch_size=10, device="cuda", timeout=0) as loader:
        def two_epochs():
            n = []
            for _ in range(2):
                n.append(sum(len(labels) for _, labels in loader))
            return n
        with pytest.warns(coloader.FinishedWarning):
            assert in_thread(two_epochs)(STEP_TIMEOUT) == [NUM_IMAGES, 0]
        assert loader.finished
    p2 = serve_gpu(serve, epochs=None)
    with loader_for(p2, batch_size=10, device="cuda", timeout=30) as loader:
        it = iter(loader)
        next(it)
        p2.proc.send_signal(signal.SIGTERM)
        with pytest.raises(coloader.ProducerStopped, match="SIGTERM"):
            for _ in range(1000):
                next(it)
        assert loader.partial


@pytest.mark.parametrize("decode", ["cpu", "gpu", "auto"])
def test_a_late_device_reader_is_caught_up_with_the_samples_it_missed(serve, decode):
    # Catch-up on the device path: the samples a late Loader missed are decoded again and
    # uploaded for its ring alone; each equals what the shared stream gave the first reader.
    p = serve_gpu(serve, "--seed", "11", "--decode", decode, epochs=2, window=2)
    first = loader_for(p, batch_size=PRODUCER_BATCH)
    late = loader_for(p, batch_size=7, device="cuda")
    assert late.on_device
    it = iter(first)
    seen = {}
    for _ in range(2):  # the producer is mid-epoch 0, held there by this reader (window 2)
        images, _ = next(it)
        seen.update(zip(first.indices.tolist(), images.clone()))

    def late_epochs():
        out = []
        for _ in range(2):
            got = {}
            for images, labels in late:
                got.update(zip(late.indices.tolist(), images.cpu()))
            out.append((got, late.epoch, late.partial))
        return out

    join_late = in_thread(late_epochs)
    deadline = time.monotonic() + STEP_TIMEOUT
    while sum(" attached: " in line for line in p.lines) < 2:
        assert time.monotonic() < deadline, "the late reader did not attach:\n" + "".join(p.lines)
        time.sleep(0.01)
    for images, _ in it:
        seen.update(zip(first.indices.tolist(), images.clone()))
    first_epoch1 = run_epoch(first)
    got = join_late()
    for epoch, (samples, number, partial) in enumerate(got):
        assert number == epoch and not partial and sorted(samples) == list(range(NUM_IMAGES))
    # Epoch 0 in the order the late reader got it: the shared stream's rest, then what it missed.
    # The host reader's images were normalised on the CPU, the device reader's on the GPU. With
    # --decode auto the CPU workers and the JPEG engines split each batch as demand goes, so a
    # sample decoded again may come from the other decoder (a few levels apart): there only the
    # shared part is compared.
    [joined] = [line for line in p.lines if "joined epoch 0 at sample" in line]
    tail = NUM_IMAGES - int(joined.split(" at sample ")[1].split(":")[0])
    differ = [(k, index, float((image - seen[index]).abs().max()))
              for k, (index, image) in enumerate(got[0][0].items())
              if (k < tail or decode != "auto") and not torch.allclose(image, seen[index], rtol=1e-5, atol=1e-5)]
    assert not differ, "%d of %d samples differ (k, index, most): %s; %s" % (len(differ), NUM_IMAGES, differ[:12], joined)
    assert sorted(first_epoch1[1]) == list(range(NUM_IMAGES))
    first.close()
    late.close()
    assert p.wait() == 0


def test_a_device_reader_that_pauses_mid_epoch_holds_nobody_back_and_reads_whole_epochs(serve):
    # Behind the window on the device path (issue 39): a device Loader (its batch ahead taken on
    # a thread of its own) stops mid-epoch holding a batch; a host Loader reads both epochs
    # meanwhile. The paused one's unread batches go back; when it reads again it gets the rest of
    # its epoch, uploaded for its ring alone, and then epoch 1: every sample once each, the same
    # pixels as the host reader's.
    # (--decode cpu: under auto a sample decoded again may come from the other decoder.)
    p = serve_gpu(serve, "--seed", "13", "--decode", "cpu", "--min-consumers", "2", "--lag-timeout-ms", "500",
                  epochs=2, window=2)
    pauser = loader_for(p, batch_size=PRODUCER_BATCH, device="cuda", client_name="pauser")
    other = loader_for(p, batch_size=PRODUCER_BATCH, client_name="other")
    assert pauser.on_device
    pauser_start = start_reading(pauser)

    def read_both():
        out = []
        for _ in range(2):
            out.append({i: img.clone() for images, _ in other for i, img in zip(other.indices.tolist(), images)})
        return out, other.partial

    reading = in_thread(read_both)
    it = pauser_start()
    got = {}
    for _ in range(2):
        held, _ = next(it)  # the last one is held through the pause
        got.update(zip(pauser.indices.tolist(), held.cpu()))
    (others, other_partial) = reading()  # the pause: until the other has read both epochs
    assert [sorted(e) for e in others] == [list(range(NUM_IMAGES))] * 2 and not other_partial
    assert any("took no batch for" in line and "'pauser'" in line for line in p.lines), "".join(p.lines)
    del held
    epochs = []
    for e in range(2):
        for images, _ in (it if e == 0 else pauser):
            got.update(zip(pauser.indices.tolist(), images.cpu()))
        epochs.append((got, pauser.epoch, pauser.partial))
        got = {}
    for e, (samples, number, partial) in enumerate(epochs):
        assert number == e and not partial and sorted(samples) == list(range(NUM_IMAGES))
        differ = [i for i, img in samples.items() if not torch.allclose(img, others[e][i].cpu(), rtol=1e-5, atol=1e-5)]
        assert not differ, "epoch %d: samples %s differ from the host reader's" % (e, differ[:12])
    for loader in (pauser, other):
        loader.close()
    assert p.wait() == 0


def test_a_peek_on_the_device_costs_its_batch_not_the_epoch(serve):
    # Issue 39's peek on the device path (the batch ahead on by default): the loop after
    # next(iter(loader)) is the same epoch, the peeked batch first (a copy made on the job's
    # stream after the peek's: the loop's writes do not reach the peeked tensors), then the one
    # taken ahead meanwhile, then the rest.
    p = serve_gpu(serve, "--seed", "17", epochs=1, window=2)
    loader = loader_for(p, batch_size=PRODUCER_BATCH, device="cuda")
    assert loader.on_device
    peeked, peeked_labels = next(iter(loader))
    peek_indices, as_peeked = loader.indices.tolist(), peeked.clone()
    got = []
    with torch.cuda.stream(torch.cuda.Stream()):  # the loop on another stream than the peek's
        for n, (images, _) in enumerate(loader):
            if n == 0:
                assert loader.indices.tolist() == peek_indices and torch.equal(images, as_peeked)
                images.zero_()
            got += loader.indices.tolist()
    assert sorted(got) == list(range(NUM_IMAGES)) and loader.epoch == 0 and not loader.partial
    assert torch.equal(peeked, as_peeked)
    loader.close()
