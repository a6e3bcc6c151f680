#!/usr/bin/env python3
"""The PyTorch-side baseline for decode_bench: one thread doing what torchvision's ImageFolder
loader and the standard ImageNet training transforms do per sample, on the same files:

    PIL.Image.open(path).convert("RGB")          (torchvision's pil_loader)
    RandomResizedCrop(224) + RandomHorizontalFlip() + ToTensor() + Normalize(ImageNet)

Prints one JSON line like decode_bench's. Needs Pillow, torch and torchvision
(on Debian: /usr/bin/python3 with python3-torchvision).

    pil_decode_bench.py DATASET_DIR [--limit N] [--size 224] [--passes P] [--mode train|eval]
"""
import argparse
import json
import os
import sys
import time

import torch
from PIL import Image
from torchvision import transforms


def list_files(root, limit):
    """Every regular file under root, sorted by path: the list decode_bench builds."""
    files = []
    for dirpath, _, names in os.walk(root):
        files += [os.path.join(dirpath, n) for n in names if os.path.isfile(os.path.join(dirpath, n))]
    files.sort()
    return files[:limit] if limit else files


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("root")
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--passes", type=int, default=1)
    ap.add_argument("--mode", choices=["train", "eval"], default="train")
    args = ap.parse_args()

    torch.set_num_threads(1)  # one core, as a DataLoader worker uses
    torch.manual_seed(0)
    normalize = transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
    if args.mode == "train":
        tf = transforms.Compose([transforms.RandomResizedCrop(args.size), transforms.RandomHorizontalFlip(),
                                 transforms.ToTensor(), normalize])
    else:
        tf = transforms.Compose([transforms.Resize(round(args.size * 256 / 224)), transforms.CenterCrop(args.size),
                                 transforms.ToTensor(), normalize])
    files = list_files(args.root, args.limit)
    if not files:
        sys.exit(f"pil_decode_bench: no files under {args.root}")

    def one(path):
        with open(path, "rb") as f:
            img = Image.open(f).convert("RGB")
        return tf(img)

    for path in files[:50]:  # warm-up, as decode_bench does
        try:
            one(path)
        except Exception:
            pass
    errors = done = 0
    start = time.perf_counter()
    for _ in range(args.passes):
        for path in files:
            try:
                one(path)
            except Exception as e:  # what a loader would have to skip: truncated, not an image
                if errors < 5:
                    print(f"pil_decode_bench: {path}: {e}", file=sys.stderr)
                errors += 1
            done += 1
    secs = time.perf_counter() - start
    print(json.dumps({"bench": "decode", "impl": "pil+torchvision", "config": "pil", "mode": args.mode,
                      "size": args.size, "images": done, "errors": errors, "seconds": round(secs, 4),
                      "images_per_s": round(done / secs, 1)}), flush=True)


if __name__ == "__main__":
    main()
