"""Data-parallel training (torchrun + DDP) reading a shared coloader producer.

    coloader serve --data /data/imagenet/train --name imagenet --batch-size 256 --forever &
    torchrun --nproc_per_node 2 examples/ddp_train.py --name imagenet --epochs 2 --log-dir logs/

Killed and resumed: the job checkpoints its model and its loader's position in one file, and
after a crash (the job, the producer or the whole node) both restart from that file:

    coloader serve --data DIR --name imagenet --epochs 90 &
    torchrun --nproc_per_node 2 examples/ddp_train.py --name imagenet --epochs 90 --log-dir logs/ \
        --checkpoint ckpt.pt --checkpoint-every 100
    # ... the job and the producer die mid-epoch ...
    coloader serve --data DIR --name imagenet --epochs 90 --resume ckpt.pt --resume-key loader &
    torchrun --nproc_per_node 2 examples/ddp_train.py --name imagenet --epochs 90 --log-dir logs/ \
        --checkpoint ckpt.pt --checkpoint-every 100 --resume

The producer starts at the round where the job's ranks resume (`serve --resume` reads the
torch checkpoint through the coloader command the package installs); each rank's
load_state_dict() checks the state (data, seed, world size, batch size) before it reads
anything, and the rest of the interrupted epoch comes exactly once. torchrun names the group
after its rendezvous, which changes with the port: the position, not the name, is what resumes.

Each rank builds `coloader.Loader(name, batch_size, rank=None)`: the rank, world size and group
name come from torchrun's environment (or torch.distributed), so the two ranks form one
consumer group and each gets its own share of every epoch (docs/DISTRIBUTED.md), with the same
number of batches, so DDP's all-reduce never waits on a rank that has run out. gloo on CPU,
NCCL when CUDA is there (each rank on cuda:LOCAL_RANK, reading the producer's ring on that GPU
when the producer was started with --device cuda:0,cuda:1,...).

Every rank writes what it trained on to LOG_DIR/rank<R>.jsonl: one line per step
{"epoch", "step", "indices"} (the dataset indices of the batch), and per epoch a line
{"epoch", "steps", "samples", "images_per_s"}: what a test (or a sceptical user) checks the
split against, independently of coloader's own counters. --checkpoint saves the model and
loader.state_dict() every --checkpoint-every steps (rank 0 writes it; every rank's loader state
is the same but for its rank), and --resume restarts from it.
"""

import argparse
import contextlib
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import coloader  # noqa: E402


def make_model(kind, channels, classes):
    if kind == "resnet18":
        import torchvision
        return torchvision.models.resnet18(num_classes=classes)
    return small_model(channels, classes)


def small_model(channels, classes):
    # Small enough for a CPU test; the point is the data path and DDP, not the accuracy.
    return nn.Sequential(nn.Conv2d(channels, 8, 3, stride=2, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(8, classes))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--name", required=True, help="the producer's name (coloader serve --name)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--classes", type=int, default=1000)
    p.add_argument("--model", choices=["small", "resnet18"], default="small",
                   help="small: a tiny CNN for CPU tests; resnet18: torchvision's (bf16 autocast on CUDA)")
    p.add_argument("--log-dir", required=True)
    p.add_argument("--group", help="the consumer group's name (default: derived from torchrun's environment)")
    p.add_argument("--checkpoint", help="a file to save (and with --resume, load) model + loader state")
    p.add_argument("--checkpoint-every", type=int, default=0, help="steps between checkpoints (0: per epoch)")
    p.add_argument("--resume", action="store_true")
    p.add_argument("--timeout", type=float, default=60)
    p.add_argument("--step-ms", type=float, default=0, help="extra time per step (tests: a slower model)")
    args = p.parse_args()

    # A GPU per local rank, or the CPU (NCCL cannot put two ranks on one GPU).
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    cuda = torch.cuda.is_available() and torch.cuda.device_count() >= local_ranks
    if torch.cuda.is_available() and not cuda:
        print("ddp_train: %d local ranks and %d GPU(s): training on the CPU (gloo)"
              % (local_ranks, torch.cuda.device_count()), file=sys.stderr, flush=True)
    dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank()
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)

    loader = coloader.Loader(args.name, batch_size=args.batch_size, timeout=args.timeout,
                             device="cuda" if cuda else None, group=args.group)
    print("rank %d: %r, %d batches per epoch" % (rank, loader, len(loader)), file=sys.stderr, flush=True)
    model = None
    opt = None
    start_epoch = 0
    if args.resume and args.checkpoint and os.path.exists(args.checkpoint):
        ckpt = torch.load(args.checkpoint)
        state = dict(ckpt["loader"], rank=loader.rank)  # saved by rank 0; the rest is the same
        loader.load_state_dict(state)
        start_epoch = state["epoch"]

    os.makedirs(args.log_dir, exist_ok=True)
    log = open(os.path.join(args.log_dir, "rank%d.jsonl" % rank), "a")
    epochs_done = start_epoch
    while epochs_done < args.epochs:
        steps = samples = 0
        t0 = time.monotonic()
        for images, labels in loader:
            if model is None:  # built from the first batch's shape
                channels = images.shape[1]
                net = make_model(args.model, channels, args.classes).to(device)
                if cuda:
                    net = net.to(memory_format=torch.channels_last)
                model = nn.parallel.DistributedDataParallel(
                    net,
                    device_ids=[local_rank] if cuda else None)
                opt = torch.optim.SGD(model.parameters(), lr=0.01)
                if args.resume and args.checkpoint and os.path.exists(args.checkpoint):
                    model.module.load_state_dict(torch.load(args.checkpoint)["model"])
            # Logged before the step: a checkpoint taken after step k (by rank 0, once every rank's
            # all-reduce of step k is done) finds step k in every rank's log.
            log.write(json.dumps({"epoch": loader.epoch, "step": steps + 1, "indices": loader.indices.tolist()}) + "\n")
            log.flush()
            images = images.to(device, non_blocking=True).float()  # NCHW (uint8 too: channels_last)
            labels = labels.to(device, non_blocking=True) % args.classes
            with torch.autocast("cuda", dtype=torch.bfloat16) if cuda else contextlib.nullcontext():
                loss = nn.functional.cross_entropy(model(images), labels)
            opt.zero_grad()
            loss.backward()  # the all-reduce: every rank must take the same number of steps
            opt.step()
            if args.step_ms:
                time.sleep(args.step_ms / 1000)
            steps += 1
            samples += int(labels.shape[0])
            if args.checkpoint and args.checkpoint_every and steps % args.checkpoint_every == 0 and rank == 0:
                tmp = args.checkpoint + ".tmp"
                torch.save({"model": model.module.state_dict(), "loader": loader.state_dict()}, tmp)
                os.replace(tmp, args.checkpoint)  # a kill leaves the old or the new, never half
        if cuda:
            torch.cuda.synchronize()  # images/s counts finished steps
        secs = time.monotonic() - t0
        log.write(json.dumps({"epoch": loader.epoch, "steps": steps, "samples": samples,
                              "images_per_s": samples / secs if secs > 0 else 0.0, "partial": loader.partial}) + "\n")
        log.flush()
        if steps == 0:
            break  # the producer has no more epochs
        epochs_done += 1
    log.close()
    loader.close()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
