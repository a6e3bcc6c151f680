#!/usr/bin/env python3
"""Training equivalence of a recipe (issue 36): one small classification task, trained with
torchvision's pipeline (ImageFolder + the Compose + DataLoader) and with coloader's translation of
the same Compose (`serve --transform` + coloader.Loader), over several seeds; the held-out
accuracy of each, side by side. The two should agree within the spread over seeds.

The task is made here from real photographs (Debian's mate-backgrounds): each class is one
photograph, its images random crops of it at random sizes, so that telling them apart takes
colour and texture and the recipe's crops, flips and jitter matter. A small CNN at 32x32 trains in
seconds a run on a CPU.

    benchmarks/recipe_equivalence.py [--seeds 3] [--epochs 6] [--classes 8]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torchvision.transforms as T  # noqa: E402
from PIL import Image  # noqa: E402

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def make_task(root, classes, per_class, held_out, seed=0):
    photos = sorted(Path("/usr/share/backgrounds/mate").glob("*/*.jpg"))[:classes]
    if len(photos) < classes:
        sys.exit("needs %d photographs in /usr/share/backgrounds/mate (apt install mate-backgrounds)" % classes)
    rng = np.random.default_rng(seed)
    for c, photo in enumerate(photos):
        image = Image.open(photo).convert("RGB")
        image = image.resize((480, int(480 * image.height / image.width)))
        for i in range(per_class + held_out):
            side = int(rng.integers(60, 200))
            x, y = int(rng.integers(0, image.width - side)), int(rng.integers(0, image.height - side))
            out = root / ("train" if i < per_class else "val") / ("class%02d" % c)
            out.mkdir(parents=True, exist_ok=True)
            image.crop((x, y, x + side, y + side)).resize((96, 96)).save(out / ("%03d.jpg" % i), quality=90)


def model(classes):
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.BatchNorm2d(32), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(32, 64, 3, padding=1), torch.nn.BatchNorm2d(64), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(64, 128, 3, padding=1), torch.nn.BatchNorm2d(128), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(128, classes))


def train(batches_for_epoch, val, classes, epochs, seed):
    torch.manual_seed(seed)
    net = model(classes)
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, epochs)
    for epoch in range(epochs):
        net.train()
        for images, labels in batches_for_epoch(epoch):
            loss = torch.nn.functional.cross_entropy(net(images.float()), labels)
            opt.zero_grad()
            loss.backward()
            opt.step()
        sched.step()
    net.eval()
    correct = total = 0
    with torch.no_grad():
        for images, labels in val:
            correct += int((net(images).argmax(1) == labels).sum())
            total += len(labels)
    return correct / total


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--classes", type=int, default=8)
    ap.add_argument("--per-class", type=int, default=60)
    ap.add_argument("--binary", default=str(ROOT / "build" / "tools" / "coloader"))
    args = ap.parse_args()
    import torchvision

    import coloader
    import coloader.transforms as ct

    torch.set_num_threads(max(1, (os.cpu_count() or 2) - 1))
    root = Path(tempfile.mkdtemp(prefix="coloader-equivalence-"))
    make_task(root, args.classes, args.per_class, held_out=20)
    recipe = T.Compose([T.RandomResizedCrop(32, scale=(0.3, 1.0)), T.RandomHorizontalFlip(),
                        T.ColorJitter(0.3, 0.3, 0.3), T.ToTensor(), T.Normalize(MEAN, STD)])
    evaluation = T.Compose([T.Resize(36), T.CenterCrop(32), T.ToTensor(), T.Normalize(MEAN, STD)])
    val = torch.utils.data.DataLoader(torchvision.datasets.ImageFolder(root / "val", evaluation), batch_size=64)
    recipe_file = root / "recipe.json"
    ct.save(recipe, recipe_file)
    env = dict(os.environ, COLOADER_RUN_DIR=tempfile.mkdtemp(prefix="coloader-equivalence-run-"))
    os.environ["COLOADER_RUN_DIR"] = env["COLOADER_RUN_DIR"]
    results = {"torchvision": [], "coloader": []}
    for seed in range(args.seeds):
        t0 = time.monotonic()
        g = torch.Generator().manual_seed(seed)
        train_set = torchvision.datasets.ImageFolder(root / "train", recipe)
        loader = torch.utils.data.DataLoader(train_set, batch_size=32, shuffle=True, generator=g, num_workers=1)
        results["torchvision"].append(train(lambda epoch: loader, val, args.classes, args.epochs, seed))
        name = "equivalence-%d-%d" % (os.getpid(), seed)
        serve = subprocess.Popen([args.binary, "serve", "--data", str(root / "train"), "--name", name, "--transform",
                                  str(recipe_file), "--seed", str(seed), "--epochs", str(args.epochs), "--batch-size",
                                  "32", "--workers", "1", "--quiet"], env=env, stderr=subprocess.DEVNULL)
        shared = coloader.Loader(name, batch_size=32, wait_for_producer=30, timeout=30)
        results["coloader"].append(train(lambda epoch: shared, val, args.classes, args.epochs, seed))
        shared.close()
        serve.wait(timeout=30)
        sys.stderr.write("seed %d: torchvision %.3f, coloader %.3f (%.0f s)\n" % (
            seed, results["torchvision"][-1], results["coloader"][-1], time.monotonic() - t0))
    for feed, accs in results.items():
        print("%-12s accuracy %.3f (min %.3f, max %.3f) over %d seeds" % (feed, np.mean(accs), min(accs), max(accs),
                                                                         len(accs)))
    print(json.dumps(results))


if __name__ == "__main__":
    main()
