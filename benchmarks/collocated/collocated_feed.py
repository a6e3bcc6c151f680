#!/usr/bin/env python3
"""The data side of benchmarks/collocated/collocated.py, apart from `coloader serve`: the torch DataLoader
that the per-job, TensorSocket and Python-fed coloader setups all use, and the two producers
that wrap one of them.

    collocated_feed.py tensorsocket --data DIR --workers W --consumers N --port P
    collocated_feed.py coloader --data DIR --workers W --consumers N --name NAME

The DataLoader is the usual ImageNet training one: torchvision ImageFolder, PIL decode,
RandomResizedCrop 224 + horizontal flip + ToTensor + Normalize, batch 128, shuffled, not
dropping the last batch, persistent workers. Its labels carry the sample's dataset index as
well as its class (class + LABEL_STRIDE * index), so that every consumer can count the
distinct samples it was given per epoch whatever the transport; the jobs train on
label % LABEL_STRIDE.

tensorsocket: TensorSocket 0.0.5's TensorProducer over the DataLoader, all defaults except
the ports (producer_batch_size 8, consumer_max_buffer_size 10, rubber band 0.5%). It starts
serving when its first consumer's heartbeat arrives; to give every job the same start, this
waits until all N consumers' heartbeats are registered before iterating (public state of its
heartbeat monitor, no change to the library).

coloader: coloader.Producer (the Python-fed producer) over the same DataLoader, host shared
memory, min_consumers N.
"""
import argparse
import os
import sys
import time

LABEL_STRIDE = 1000  # label = class + LABEL_STRIDE * dataset index; classes must be < this
BATCH_SIZE = 128
MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def make_dataset(data, image_size=224):
    import torchvision

    t = torchvision.transforms

    class IndexedImageFolder(torchvision.datasets.ImageFolder):
        def __getitem__(self, index):
            image, target = super().__getitem__(index)
            return image, target + LABEL_STRIDE * index

    # COLLOCATED_RECIPE=reference: torchvision's ResNet-50 recipe (TrivialAugmentWide and
    # RandomErasing(0.1) around the plain one), as examples/recipes/reference.py states it.
    reference = os.environ.get("COLLOCATED_RECIPE", "plain") == "reference"
    transform = t.Compose([t.RandomResizedCrop(image_size), t.RandomHorizontalFlip()]
                          + ([t.TrivialAugmentWide()] if reference else [])
                          + [t.ToTensor(), t.Normalize(MEAN, STD)] + ([t.RandomErasing(0.1)] if reference else []))
    dataset = IndexedImageFolder(data, transform=transform)
    if len(dataset.classes) > LABEL_STRIDE:
        sys.exit(f"collocated: {data} has {len(dataset.classes)} classes; at most {LABEL_STRIDE} are supported")
    return dataset


def make_loader(data, workers, pin_memory, batch_size=BATCH_SIZE, image_size=224):
    import torch

    return torch.utils.data.DataLoader(make_dataset(data, image_size), batch_size=batch_size, shuffle=True,
                                       num_workers=workers, pin_memory=pin_memory, drop_last=False,
                                       persistent_workers=workers > 0)


def serve_tensorsocket(args):
    from tensorsocket import TensorProducer

    loader = make_loader(args.data, args.workers, pin_memory=args.pin_memory, batch_size=args.batch_size,
                         image_size=args.image_size)
    p = args.port
    producer = TensorProducer(loader, port=p, ack_port=p + 1, heart_ports=(p + 2, p + 3))
    deadline = time.monotonic() + args.wait
    while len(producer.hb.consumers) < args.consumers:
        if time.monotonic() > deadline:
            sys.exit(f"collocated_feed: only {len(producer.hb.consumers)} of {args.consumers} TensorSocket "
                     f"consumers appeared within {args.wait:.0f} s")
        time.sleep(0.05)
    print(f"collocated_feed: {args.consumers} consumers registered, serving", file=sys.stderr, flush=True)
    for _ in range(args.epochs):
        for _ in producer:
            pass
    producer.join()


def serve_coloader(args):
    import coloader

    loader = make_loader(args.data, args.workers, pin_memory=False, batch_size=args.batch_size,
                         image_size=args.image_size)
    print("collocated_feed: coloader.Producer starting", file=sys.stderr, flush=True)
    coloader.Producer(loader, name=args.name, batch_size=args.batch_size, min_consumers=args.consumers).run(
        epochs=args.epochs)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("kind", choices=["tensorsocket", "coloader"])
    ap.add_argument("--data", required=True)
    ap.add_argument("--workers", type=int, required=True, help="DataLoader workers")
    ap.add_argument("--consumers", type=int, required=True)
    ap.add_argument("--port", type=int, default=5555, help="tensorsocket: its four ports start here")
    ap.add_argument("--name", default="collocated", help="coloader: the producer's name")
    ap.add_argument("--batch-size", type=int, default=BATCH_SIZE)
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--no-pin-memory", dest="pin_memory", action="store_false",
                    help="tensorsocket: no pinned batches (for a machine without a GPU)")
    ap.add_argument("--epochs", type=int, default=1000, help="epochs to serve (the benchmark stops it sooner)")
    ap.add_argument("--wait", type=float, default=120.0, help="seconds to wait for the consumers")
    args = ap.parse_args()
    if not os.path.isdir(args.data):
        sys.exit(f"collocated_feed: --data {args.data} is not a directory")
    (serve_tensorsocket if args.kind == "tensorsocket" else serve_coloader)(args)


if __name__ == "__main__":
    main()
