#!/usr/bin/env python3
"""How well an epoch is shuffled: the share of neighbouring samples (in the order a consumer
receives them) that have the same label, for the same ImageFolder served three ways, side by
side in one run:

  files            the ImageFolder: a global seeded permutation
  shards, mixed    WebDataset shards written by `coloader shard` (a seeded permutation of the
                   source), streamed through pipe:cat: shard order + order within each shard
  shards, sorted   shards written with --no-shuffle (class after class), streamed the same way

A global permutation of C equal classes gives about 1/C; sorted shards streamed in blocks give
long same-class runs inside each shard, which is the known limit of shard-order shuffling.

  benchmarks/shuffle_quality.py --data IMAGEFOLDER [--binary build/tools/coloader] [--epochs 3]
"""
import argparse
import json
import os
import subprocess
import tarfile
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def folder_labels(data):
    """Dataset index -> label, in the order coloader lists an ImageFolder (classes sorted, then
    files sorted by the os.walk order, which for flat class folders is by name)."""
    labels = []
    for label, cls in enumerate(sorted(os.listdir(data))):
        files = sorted(f for f in os.listdir(os.path.join(data, cls)) if not f.startswith("."))
        labels += [label] * len(files)
    return labels


def shard_labels(shards, source_labels):
    """Dataset index of the shards -> label: the k-th image member's key is its source index."""
    labels = []
    for path in shards:
        with tarfile.open(path) as t:
            for m in t.getmembers():
                if not m.name.endswith(".cls"):
                    labels.append(source_labels[int(m.name.split(".")[0])])
    return labels


def serve_and_read(binary, data, epochs, env, name):
    serve = subprocess.Popen([binary, "serve", "--data", data, "--name", name, "--epochs", str(epochs),
                              "--image-size", "16", "--batch-size", "64", "--quiet", "--seed", "1"],
                             env=env, stderr=subprocess.PIPE, text=True)
    c = subprocess.run([binary, "consume", "--name", name, "--json", "--indices"], env=env, capture_output=True,
                       text=True, check=True)
    serve.wait()
    return [json.loads(line)["indices"] for line in c.stdout.splitlines()]


def same_label_share(orders, labels):
    pairs = same = 0
    for order in orders:
        for a, b in zip(order, order[1:]):
            pairs += 1
            same += labels[a] == labels[b]
    return same / pairs


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="an ImageFolder")
    ap.add_argument("--binary", default=os.path.join(ROOT, "build", "tools", "coloader"))
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--shard-size", type=int, default=200)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="coloader-shuffle-")
    env = dict(os.environ, COLOADER_RUN_DIR=os.path.join(work, "run"))
    source = folder_labels(args.data)
    rows = [("files (global permutation)", same_label_share(
        serve_and_read(args.binary, args.data, args.epochs, env, "sqfiles"), source))]
    for kind, flags in (("mixed", []), ("sorted", ["--no-shuffle"])):
        out = os.path.join(work, kind)
        os.makedirs(out)
        subprocess.run([args.binary, "shard", "--data", args.data, "--out", os.path.join(out, "s-%04d.tar"),
                        "--shard-size", str(args.shard_size), "--quiet"] + flags, check=True, stdout=subprocess.DEVNULL)
        shards = sorted(os.path.join(out, f) for f in os.listdir(out))
        pattern = "pipe:cat " + os.path.join(out, "s-{0000..%04d}.tar" % (len(shards) - 1))
        orders = serve_and_read(args.binary, pattern, args.epochs, env, "sq" + kind)
        rows.append((f"shards written {kind}, streamed", same_label_share(orders, shard_labels(shards, source))))
    classes = len(set(source))
    print(f"{len(source)} images, {classes} classes, {args.epochs} epochs, shards of {args.shard_size}; "
          f"ideal share of same-label neighbours 1/{classes} = {1 / classes:.4f}")
    for name, share in rows:
        print(f"  {name:<36} {share:.4f}")


if __name__ == "__main__":
    main()
