#!/usr/bin/env python3
"""One training job of benchmarks/collocated/collocated.py: a torchvision ResNet trained with bf16 autocast
and channels_last on batches of 128 from one of the loaders compared.

    collocated_job.py --loader torch --data DIR --workers W      its own DataLoader (pin_memory)
    collocated_job.py --loader tensorsocket --port P             a TensorSocket 0.0.5 consumer
    collocated_job.py --loader coloader --name NAME              coloader.Loader(device="cuda")
    collocated_job.py --loader coloader-host --name NAME         coloader.Loader() (host memory)
    collocated_job.py --loader synthetic                         one batch made on the GPU, reused

The job first runs --synthetic-warmup steps on a batch made on the GPU (cuDNN's algorithm
search, the allocator), and only then opens its loader, so that no loader fills its queues
while the job is not consuming. After --warmup-steps steps on real batches (or --warmup-max-s
seconds, at least 2 steps) it prints WARM; it trains on until the file --stop-file exists
(or --max-s passes), then writes --result, a JSON object: the time each step finished on the
GPU, each next() call's start and duration, and per epoch the samples and distinct samples it
received. Times are time.monotonic() (CLOCK_MONOTONIC), comparable across processes.

Step completion is read from a blocking-sync CUDA event recorded after each step; the job
waits for step k-1 after enqueuing step k, so one step is in flight and the wait sleeps
rather than spins (a spinning wait would bill the job with CPU it does not need).
"""
import argparse
import collections
import json
import os
import sys
import time

import torch
import torchvision

from collocated_feed import LABEL_STRIDE, MEAN, STD, make_loader


class Source:
    """Epochs of (images, labels, ids) from one loader; ids are dataset indices (or None)."""

    def __init__(self, args, device):
        self.args, self.device = args, device
        kind = args.loader
        if kind == "torch":
            self.loader = make_loader(args.data, args.workers, pin_memory=device.type == "cuda",
                                      batch_size=args.batch_size, image_size=args.image_size)
        elif kind == "tensorsocket":
            from tensorsocket import TensorConsumer
            p = args.port
            self.loader = TensorConsumer(port=p, ack_port=p + 1, heart_ports=(p + 2, p + 3), batch_size=args.batch_size)
        elif kind in ("coloader", "coloader-host"):
            import coloader
            on_device = kind == "coloader" and device.type == "cuda"
            self.loader = coloader.Loader(args.name, batch_size=args.batch_size, timeout=args.max_s,
                                          device="cuda" if on_device else None,
                                          wait_for_producer=120, client_name=f"collocated job {args.index}")
            if on_device and not self.loader.on_device:
                sys.exit(f"collocated_job: the coloader device path is not in use: {self.loader.fallback_reason}")
        else:
            raise ValueError(kind)

    def epochs(self):
        """Yields one iterator per epoch."""
        while True:
            yield iter(self.loader)

    def ids(self, labels):
        if self.args.loader == "coloader":
            return self.loader.indices  # the native producer's labels are classes only
        return labels // LABEL_STRIDE


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--loader", required=True, choices=["torch", "tensorsocket", "coloader", "coloader-host", "synthetic"])
    ap.add_argument("--index", type=int, default=0, help="this job's number in its group")
    ap.add_argument("--data")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--port", type=int, default=5555)
    ap.add_argument("--name", default="collocated")
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--device", default="cuda", help="cpu: for trying the harness on a machine without a GPU")
    ap.add_argument("--synthetic-warmup", type=int, default=5)
    ap.add_argument("--tail-batch", type=int, default=0,
                    help="size of an epoch's short last batch: warmed up too, or cuDNN's algorithm search "
                         "for that shape (cudnn.benchmark) stalls the job for a second at the first epoch's end")
    ap.add_argument("--warmup-steps", type=int, default=10)
    ap.add_argument("--warmup-max-s", type=float, default=5.0)
    ap.add_argument("--step-sleep-ms", type=float, default=0.0, help="sleep after each step (a slower job)")
    ap.add_argument("--cpu-delay-ms", type=float, default=0.0,
                    help="spin this long on the job's thread before each batch (a hand-off's CPU time, no data)")
    ap.add_argument("--stop-file", required=True)
    ap.add_argument("--result", required=True)
    ap.add_argument("--max-s", type=float, default=600.0)
    args = ap.parse_args()
    if args.loader == "torch" and not args.data:
        ap.error("--loader torch needs --data")

    started = time.monotonic()
    torch.backends.cudnn.benchmark = True
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    cl = torch.channels_last
    model = getattr(torchvision.models, args.model)(num_classes=LABEL_STRIDE).to(device, memory_format=cl)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    loss_fn = torch.nn.CrossEntropyLoss()
    mean = torch.tensor(MEAN, device=device).view(1, 3, 1, 1) * 255
    std = torch.tensor(STD, device=device).view(1, 3, 1, 1) * 255

    def step(images, labels):
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = loss_fn(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    def prepare(images, labels):
        images = images.to(device, non_blocking=True)
        if images.shape[1] != 3 and images.shape[-1] == 3:  # NHWC: the permuted view is channels_last
            images = images.permute(0, 3, 1, 2)
        if images.dtype == torch.uint8:
            images = (images.float() - mean) / std
        return images.contiguous(memory_format=cl), labels.to(device, non_blocking=True) % LABEL_STRIDE

    size = args.image_size
    fixed = (torch.randn(args.batch_size, 3, size, size, device=device).contiguous(memory_format=cl),
             torch.randint(0, LABEL_STRIDE, (args.batch_size,), device=device))
    for _ in range(args.synthetic_warmup):
        step(*fixed)
    if 0 < args.tail_batch < args.batch_size:
        for _ in range(2):
            step(fixed[0][:args.tail_batch], fixed[1][:args.tail_batch])
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    sync()
    ready = time.monotonic()

    source = None if args.loader == "synthetic" else Source(args, device)
    connected = time.monotonic()
    done, sizes, next_start, next_dur, epochs = [], [], [], [], []
    pending = collections.deque()
    steps, warm, stop = 0, False, False
    first_batch = None

    def finish_step():
        event = pending.popleft()
        if event is not None:
            event.synchronize()
        done.append(time.monotonic())

    def epoch_iters():
        if source is None:
            while True:
                yield iter(lambda: fixed, None)  # an endless "epoch" of the one batch
        yield from source.epochs()

    for number, it in enumerate(epoch_iters()):
        ids, samples = [], 0
        while True:
            if args.cpu_delay_ms:
                spin_until = time.perf_counter() + args.cpu_delay_ms / 1000
                while time.perf_counter() < spin_until:
                    pass
            t = time.monotonic()
            try:
                images, labels = next(it)[:2]
            except StopIteration:
                break
            next_start.append(t)
            next_dur.append(time.monotonic() - t)
            if first_batch is None:
                first_batch = time.monotonic()
            if source is not None:
                ids.append(source.ids(labels))
                samples += int(labels.shape[0])
                images, labels = prepare(images, labels)
            sizes.append(int(labels.shape[0]))
            step(images, labels)
            del images, labels  # a loader's slot is released once the step that reads it is enqueued
            event = torch.cuda.Event(blocking=True) if cuda else None
            if event is not None:
                event.record()
            pending.append(event)
            if len(pending) > 1:
                finish_step()
            steps += 1
            if args.step_sleep_ms:
                time.sleep(args.step_sleep_ms / 1000)
            if not warm and (steps >= args.warmup_steps or
                             (steps >= 2 and time.monotonic() - first_batch >= args.warmup_max_s)):
                warm = True
                print(f"WARM {steps}", flush=True)
            if os.path.exists(args.stop_file) or time.monotonic() - started > args.max_s:
                stop = True
                break
        if source is not None and not ids and not stop:
            sys.exit(f"collocated_job: the {args.loader} loader ended (an epoch without batches)")
        if source is not None and (ids or not stop):
            # Distinct samples are counted at the end (one host sync per epoch, after the run).
            epochs.append({"epoch": number, "complete": not stop, "samples": samples, "ids": ids,
                           "partial": bool(getattr(source.loader, "partial", False)) if number == 0 else False})
            if not stop:
                print(f"EPOCH {number} {samples}", flush=True)
        if stop:
            break
    while pending:
        finish_step()
    sync()

    for e in epochs:
        ids = e.pop("ids")
        e["distinct"] = int(torch.unique(torch.cat([i.to("cpu").reshape(-1) for i in ids])).numel()) if ids else 0
    result = {
        "pid": os.getpid(), "index": args.index, "loader": args.loader, "model": args.model,
        "batch_size": args.batch_size, "steps": steps, "warm": warm,
        "startup_s": round(ready - started, 3), "connect_s": round(connected - ready, 3),
        "done": done, "sizes": sizes, "next_start": next_start, "next_s": next_dur, "epochs": epochs,
        "max_memory_reserved": torch.cuda.max_memory_reserved() if cuda else 0,
        "max_memory_allocated": torch.cuda.max_memory_allocated() if cuda else 0,
    }
    with open(args.result + ".tmp", "w") as f:
        json.dump(result, f)
    os.replace(args.result + ".tmp", args.result)
    # TensorSocket's consumer threads and the DataLoader's workers end with the process.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
