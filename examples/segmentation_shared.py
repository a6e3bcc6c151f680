#!/usr/bin/env python3
"""Two segmentation jobs share one dataset of {"image", "mask"} batches through coloader.Producer.

    python examples/segmentation_shared.py                 # a producer and two jobs
    python examples/segmentation_shared.py --jobs 3 --size 128

The dataset is drawn here (no download): each image holds a few filled circles and squares on a
noisy background, its mask the class of every pixel (0 background, 1 circle, 2 square). The
producer runs the DataLoader once and publishes dicts of float32 images [B, 3, S, S] and int64
masks [B, S, S]; each job (its own batch size) trains a small fully convolutional network and
reports its pixel accuracy. Launching, roles and devices are those of lm_shared.py.
"""
import os
import sys
import time

import torch
from torch import nn
from torch.nn import functional as F

import coloader

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lm_shared import arguments, join, launch  # noqa: E402

CLASSES = 3


class Shapes(torch.utils.data.Dataset):
    """Image i and its mask, drawn from a generator seeded with i."""

    def __init__(self, count, size):
        self.count, self.size = count, size

    def __len__(self):
        return self.count

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        s = self.size
        y, x = torch.meshgrid(torch.arange(s), torch.arange(s), indexing="ij")
        mask = torch.zeros(s, s, dtype=torch.int64)
        image = torch.rand(3, s, s, generator=g) * 0.3
        for _ in range(int(torch.randint(1, 5, (1,), generator=g))):
            cy, cx = torch.randint(0, s, (2,), generator=g).tolist()
            r = int(torch.randint(s // 10, s // 4, (1,), generator=g))
            kind = int(torch.randint(1, CLASSES, (1,), generator=g))
            inside = ((y - cy) ** 2 + (x - cx) ** 2 <= r * r) if kind == 1 else \
                (((y - cy).abs() <= r) & ((x - cx).abs() <= r))
            colour = torch.rand(3, 1, 1, generator=g) * 0.7 + 0.3
            image = torch.where(inside, colour.expand(3, s, s), image)
            mask[inside] = kind
        return {"image": image, "mask": mask}


def network():
    def block(i, o):
        return nn.Sequential(nn.Conv2d(i, o, 3, padding=1), nn.BatchNorm2d(o), nn.ReLU())
    return nn.Sequential(block(3, 16), block(16, 32), block(32, 32), nn.Conv2d(32, CLASSES, 1))


def produce(a):
    loader = torch.utils.data.DataLoader(Shapes(a.max_chunks, a.size), batch_size=32, shuffle=True, num_workers=2)
    producer = coloader.Producer(loader, name=a.name, min_consumers=a.jobs, device=a.device)
    print("producer: %d images of %dx%d with masks, for %d job(s)" % (len(loader.dataset), a.size, a.size, a.jobs),
          flush=True)
    print("producer: %s" % producer.run(epochs=a.epochs), flush=True)


def train(a):
    device, loader, model = join(a, network)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for epoch in range(a.epochs):
        started, steps, right, pixels = time.monotonic(), 0, 0, 0
        for batch in loader:
            image, mask = batch["image"].to(device), batch["mask"].to(device)
            logits = model(image)
            loss = F.cross_entropy(logits, mask)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            steps += 1
            right += int((logits.argmax(1) == mask).sum())
            pixels += mask.numel()
        print("job %d: epoch %d, %d steps of %d, pixel accuracy %.3f, loss %.3f, %.1f s"
              % (a.job, epoch, steps, a.batch_size, right / max(1, pixels), loss.item(), time.monotonic() - started),
              flush=True)
    loader.close()


def main():
    a = arguments(__doc__, samples=400, extra=lambda ap: ap.add_argument("--size", type=int, default=64))
    if a.role == "produce":
        produce(a)
    elif a.role == "train":
        train(a)
    else:
        sys.exit(launch(a, __file__, ["--size", str(a.size)]))


if __name__ == "__main__":
    main()
