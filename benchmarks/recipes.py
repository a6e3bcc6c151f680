#!/usr/bin/env python3
"""What a recipe costs the producer (issue 36): images/s to one consumer and images per producer
core-second, for torchvision's reference recipe (RandomResizedCrop(176) + flip +
TrivialAugmentWide + Normalize + RandomErasing(0.1)) against the plain one (RandomResizedCrop(176)
+ flip + Normalize), served natively on the host path and with a device ring (--decode cpu, and
--decode auto: the engines where the recipe's ops all have GPU twins), and the reference recipe's
own Compose run by the Python-fed producer (coloader.Producer over a torch DataLoader with the
same workers), on the same files in one run.

    benchmarks/recipes.py --data DIR [--device cuda:0] [--workers N] [--epochs 2]

Prints a table and one JSON line per row; ratios side by side: each row's images/s against the
plain recipe's on the same path, and images per producer core-second against the Python-fed row.
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
sys.path.insert(0, os.path.join(ROOT, "python"))

from producer_throughput import run  # noqa: E402

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def composes(size):
    import torchvision.transforms as T

    plain = T.Compose([T.RandomResizedCrop(size), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)])
    reference = T.Compose([T.RandomResizedCrop(size), T.RandomHorizontalFlip(), T.TrivialAugmentWide(),
                           T.ToTensor(), T.Normalize(MEAN, STD), T.RandomErasing(0.1)])
    return {"plain": plain, "reference": reference}


def python_fed(data, compose, workers, batch, epochs, binary, env):
    """coloader.Producer over a DataLoader(ImageFolder(data, compose)) with `workers` processes, one
    `coloader consume` reading: images/s and the CPU of this process and its workers."""
    import torch
    import torchvision

    import coloader

    name = "tp-pyfed-%d" % os.getpid()
    os.environ["COLOADER_RUN_DIR"] = env["COLOADER_RUN_DIR"]  # where `consume` looks for it
    loader = torch.utils.data.DataLoader(torchvision.datasets.ImageFolder(data, compose), batch_size=batch,
                                         shuffle=True, num_workers=workers,
                                         drop_last=False)
    producer = coloader.Producer(loader, name, window=8)
    consume = subprocess.Popen([binary, "consume", "--name", name, "--json"], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True)
    before = [resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    t0 = time.monotonic()
    outcome = producer.run(epochs)
    wall = time.monotonic() - t0  # from the first batch asked for to the last released
    out, _ = consume.communicate(timeout=60)
    # The workers of each epoch were joined at its end: getrusage counts them.
    after = [resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    cpu = sum((a.ru_utime + a.ru_stime) - (b.ru_utime + b.ru_stime) for a, b in zip(after, before))
    epochs_out = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    images = sum(e["samples"] for e in epochs_out)
    ips = sorted(e["images_per_s"] for e in epochs_out)[len(epochs_out) // 2] if epochs_out else images / wall
    return {"outcome": outcome, "images": images, "images_per_s": round(ips), "wall_images_per_s": round(images / wall),
            "producer_cpu_s": round(cpu, 2), "cores_busy": round(cpu / wall, 1),
            "images_per_cpu_s": round(images / max(cpu, 1e-9))}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True)
    ap.add_argument("--device", default=None, help="e.g. cuda:0; omit for the host path only")
    ap.add_argument("--workers", type=int, default=os.cpu_count())
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--size", type=int, default=176)
    ap.add_argument("--binary", default=os.path.join(ROOT, "build", "tools", "coloader"))
    ap.add_argument("--no-python-fed", action="store_true")
    args = ap.parse_args()

    import coloader.transforms as ct

    env = dict(os.environ, COLOADER_RUN_DIR=tempfile.mkdtemp(prefix="coloader-recipes-"))
    recipes_dir = tempfile.mkdtemp(prefix="coloader-recipes-json-")
    rows = []
    paths = [(None, "cpu")] + ([(args.device, "cpu"), (args.device, "auto")] if args.device else [])
    for label, compose in composes(args.size).items():
        recipe = os.path.join(recipes_dir, label + ".json")
        ct.save(compose, recipe)
        for device, decode in paths:
            sys.stderr.write("recipes: %s on the %s path, --decode %s\n" % (label, "device" if device else "host", decode))
            r = run(args.binary, args.data, device, args.workers, args.batch_size, args.epochs, env,
                    "tp-%s-%s-%s" % (label, "dev" if device else "host", decode), decode=decode,
                    extra=["--transform", recipe])
            # The run's wall time (start to the last batch released) from its CPU time and cores busy.
            wall = r["producer_cpu_s"] / max(r["cores_busy"], 1e-9)
            rows.append(dict(r, recipe=label, feed="native", wall_images_per_s=round(r["images"] / wall)))
    if not args.no_python_fed:
        sys.stderr.write("recipes: reference through coloader.Producer over a DataLoader\n")
        r = python_fed(args.data, composes(args.size)["reference"], args.workers, args.batch_size, args.epochs,
                       args.binary, env)
        rows.append(dict(r, recipe="reference", feed="python-fed", path="host", decode="PIL", workers=args.workers))
    # images/s: the whole run's (start to the last batch released), which no prefetching flatters
    # (a DataLoader's workers prefetch a good part of a small epoch before the consumer's clock
    # starts); epoch images/s: the consumer's median epoch, as producer_throughput.py reports it.
    plain = {(r["path"], r["decode"]): r["wall_images_per_s"] for r in rows if r["recipe"] == "plain"}
    fed = next((r["images_per_cpu_s"] for r in rows if r["feed"] == "python-fed"), None)
    print(f"{'recipe':<10}{'feed':<11}{'path':<7}{'decode':>7}{'images/s':>10}{'vs plain':>9}{'epoch img/s':>12}"
          f"{'cores':>7}{'img/CPU-s':>10}{'vs py-fed':>10}")
    for r in rows:
        base = plain.get((r["path"], r["decode"]))
        r["vs_plain"] = round(r["wall_images_per_s"] / base, 3) if base else None
        r["vs_python_fed_per_core"] = round(r["images_per_cpu_s"] / fed, 2) if fed else None
        print(f"{r['recipe']:<10}{r['feed']:<11}{r['path']:<7}{r['decode']:>7}{r['wall_images_per_s']:>10}"
              f"{r['vs_plain'] if r['vs_plain'] is not None else '-':>9}{r['images_per_s']:>12}{r['cores_busy']:>7}"
              f"{r['images_per_cpu_s']:>10}{r['vs_python_fed_per_core'] if fed else '-':>10}")
    for r in rows:
        print(json.dumps(r))


if __name__ == "__main__":
    main()
