#!/usr/bin/env python3
"""Train a torchvision ResNet on batches from a coloader producer, or from a plain torch
DataLoader, with the same model and loop: a one-flag switch to compare the two.

    # shared: a producer decodes once (coloader serve ... --name imagenet), the job consumes
    python3 examples/train.py --loader coloader --name imagenet --device cuda --amp
    # per-job loading, as without coloader
    python3 examples/train.py --loader torch --data /data/train --workers 8 --device cuda --amp

Prints images/s per epoch (and per --log-every steps). With --loader coloader the producer
does the augmentation (RandomResizedCrop + flip + normalise); with --loader torch, torchvision's
transforms do the same work in this process's workers.
"""
import argparse
import time

import torch
import torchvision


def make_torch_loader(args):
    t = torchvision.transforms
    transform = t.Compose([t.RandomResizedCrop(args.image_size), t.RandomHorizontalFlip(), t.ToTensor(),
                           t.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
    dataset = torchvision.datasets.ImageFolder(args.data, transform=transform)
    return torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, shuffle=True, num_workers=args.workers,
                                       pin_memory=args.device == "cuda", drop_last=False,
                                       persistent_workers=args.workers > 0)


def make_coloader_loader(args):
    import coloader
    return coloader.Loader(args.name, batch_size=args.batch_size, device=args.device if args.device == "cuda" else None,
                           wait_for_producer=args.wait, client_name="examples/train.py")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--loader", choices=["coloader", "torch"], default="coloader")
    ap.add_argument("--name", default="imagenet", help="coloader: the producer's name")
    ap.add_argument("--data", help="torch: an ImageFolder directory")
    ap.add_argument("--workers", type=int, default=4, help="torch: DataLoader workers")
    ap.add_argument("--wait", type=float, default=30.0, help="coloader: seconds to wait for the producer")
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--num-classes", type=int, default=1000)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--steps", type=int, default=0, help="stop each epoch after this many steps (0: all)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--amp", action="store_true", help="bfloat16 autocast")
    ap.add_argument("--channels-last", action="store_true")
    ap.add_argument("--log-every", type=int, default=50)
    args = ap.parse_args()
    if args.loader == "torch" and not args.data:
        ap.error("--loader torch needs --data")

    device = torch.device(args.device)
    model = getattr(torchvision.models, args.model)(num_classes=args.num_classes).to(device)
    if args.channels_last:
        model = model.to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    loss_fn = torch.nn.CrossEntropyLoss()
    loader = make_coloader_loader(args) if args.loader == "coloader" else make_torch_loader(args)

    for epoch in range(args.epochs):
        model.train()
        seen, start, step = 0, time.perf_counter(), 0
        for step, (images, labels) in enumerate(loader, 1):
            images = images.to(device, non_blocking=True)
            labels = labels.to(device, non_blocking=True) % args.num_classes
            if images.dtype == torch.uint8:  # a producer serving raw pixels (NCHW): normalise here
                images = images.float().div_(255)
            if args.channels_last:
                images = images.contiguous(memory_format=torch.channels_last)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.amp):
                loss = loss_fn(model(images), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            seen += images.shape[0]
            if step % args.log_every == 0:
                print(f"epoch {epoch} step {step}: loss {loss.item():.3f}, "
                      f"{seen / (time.perf_counter() - start):.0f} images/s", flush=True)
            if args.steps and step >= args.steps:
                break
        if device.type == "cuda":
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - start
        print(f"epoch {epoch}: {step} steps, {seen} images, {seen / elapsed:.0f} images/s ({args.loader})", flush=True)


if __name__ == "__main__":
    main()
