#!/usr/bin/env python3
"""A job on torchvision's reference recipe, served natively, with MixUp and CutMix applied by the
job to its own CUDA batch (they mix labels across a batch, so they belong to the job, not to the
shared producer):

    python -m coloader serve --data /data/imagenet/train --name imagenet --device cuda:0 \
        --transform examples/recipes/reference.py --forever &
    python3 examples/recipes/train_reference.py --name imagenet --epochs 1 --steps 50

Needs torchvision >= 0.16 for transforms.v2.MixUp / CutMix (the GPU machine's has them).
"""
import argparse

import torch
import torchvision

import coloader


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--name", default="imagenet")
    ap.add_argument("--num-classes", type=int, default=1000)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--steps", type=int, default=0, help="stop each epoch after this many steps (0: all)")
    args = ap.parse_args()

    from torchvision.transforms import v2

    # torchvision's reference: mixup alpha 0.2, cutmix alpha 1.0, one of the two per batch.
    mix = v2.RandomChoice([v2.MixUp(alpha=0.2, num_classes=args.num_classes),
                           v2.CutMix(alpha=1.0, num_classes=args.num_classes)])
    model = torchvision.models.resnet50(num_classes=args.num_classes).cuda().to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9, weight_decay=2e-5)
    loader = coloader.Loader(args.name, batch_size=args.batch_size, device="cuda")
    for epoch in range(args.epochs):
        for step, (images, labels) in enumerate(loader):
            images, soft_labels = mix(images, labels)  # on the GPU, on this job's own batch
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = torch.nn.functional.cross_entropy(model(images), soft_labels, label_smoothing=0.1)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if step % 20 == 0:
                print("epoch %d step %d loss %.3f" % (epoch, step, loss.item()), flush=True)
            if args.steps and step + 1 >= args.steps:
                break


if __name__ == "__main__":
    main()
