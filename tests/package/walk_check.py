#!/usr/bin/env python3
"""The last step of scripts/bare_walk.sh, run by the venv's Python on the bare machine after the
README's install: a real producer (the installed `coloader serve`), the reference consumer
(`coloader consume`) and a Python Loader, all started at one moment from this one script, and
each must see every image of the data set once in each of two epochs.

    walk_check.py VENV DATA      (DATA: a folder of class folders of JPEGs, scripts/make_dataset.py)
"""
import json
import os
import signal
import subprocess
import sys


def main():
    # A SIGTERM (bare_walk.sh's timeout) ends this like an error, so that `finally` stops both.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("walk: stopped (SIGTERM)"))
    venv, data = sys.argv[1], sys.argv[2]
    images = sum(len(files) for _, _, files in os.walk(data))
    coloader_cmd = os.path.join(venv, "bin", "coloader")
    name = "walk-%d" % os.getpid()
    epochs = 2
    serve = subprocess.Popen([coloader_cmd, "serve", "--data", data, "--name", name, "--batch-size", "32",
                              "--image-size", "64", "--epochs", str(epochs), "--min-consumers", "2", "--quiet"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    consume = subprocess.Popen([coloader_cmd, "consume", "--name", name, "--batch-size", "20", "--json"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        import coloader  # the venv's installed package (its binary and libraries)

        loader = coloader.Loader(name, batch_size=50, wait_for_producer=120, timeout=120)
        print("walk: coloader %s from %s, torch %s" % (coloader.__version__, os.path.dirname(coloader.__file__),
                                                       __import__("torch").__version__), flush=True)
        for epoch in range(epochs):
            seen = []
            for images_batch, labels in loader:
                assert images_batch.shape[1:] == (3, 64, 64), images_batch.shape
                seen.extend(loader.indices.tolist())
            if sorted(seen) != list(range(images)):
                sys.exit("walk: the Loader's epoch %d had %d samples (%d distinct) of %d"
                         % (epoch, len(seen), len(set(seen)), images))
            print("walk: the Loader saw each of the %d images once in epoch %d" % (images, epoch), flush=True)
        # Done with it, as a training script is: a Loader that kept its last batch can keep the
        # producer waiting (docs/DESIGN.md, "Kept batches stall nobody": a known gap).
        loader.close()
        out, err = consume.communicate(timeout=120)
        if consume.returncode != 0:
            sys.exit("walk: coloader consume failed (%d): %s" % (consume.returncode, err[-2000:]))
        reports = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        if len(reports) != epochs or any(r.get("samples") != images for r in reports):
            sys.exit("walk: coloader consume saw %s, not %d samples in each of %d epochs" % (out, images, epochs))
        print("walk: coloader consume saw each of the %d images in each of %d epochs" % (images, epochs), flush=True)
        try:
            _, err = serve.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            sys.exit("walk: coloader serve did not end within 60 s of its last epoch")
        if serve.returncode != 0:
            sys.exit("walk: coloader serve ended with %s: %s" % (serve.returncode, err[-2000:]))
    finally:
        for p in (consume, serve):
            if p.poll() is None:
                p.kill()
                p.wait()
    print("walk: passed")


if __name__ == "__main__":
    main()
