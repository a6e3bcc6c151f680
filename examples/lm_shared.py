#!/usr/bin/env python3
"""Two training jobs share one tokenised text dataset through coloader.Producer.

    python examples/lm_shared.py                     # a producer and two jobs, on the GPU if any
    python examples/lm_shared.py --jobs 3 --epochs 2 --max-chunks 2000

One process (`produce`) runs the user's own DataLoader once and publishes its batches, dicts of
int64 input_ids [B, 128], a bool attention_mask [B, 128] and int64 per-token labels [B, 128];
each job (`train`) reads them with coloader.Loader at its own batch size and trains a small
causal transformer. Without arguments this script starts all of them and waits.

The text is what every Python installation ships, the standard library's own source, tokenised
at the byte level (vocabulary 256): no download and no tokenizer package. The last chunk of
each file is padded, so the mask and the -100 labels there matter.
"""
import argparse
import os
import subprocess
import sys
import sysconfig
import time

import torch
from torch import nn
from torch.nn import functional as F

import coloader

SEQ = 128
VOCAB = 256
PAD = 0


def stdlib_files(limit):
    """The first `limit` bytes' worth of the standard library's .py files, in a fixed order."""
    root = sysconfig.get_paths()["stdlib"]
    names, total = [], 0
    for name in sorted(os.listdir(root)):
        path = os.path.join(root, name)
        if name.endswith(".py") and os.path.isfile(path) and total < limit:
            names.append(path)
            total += os.path.getsize(path)
    return names


class ByteChunks(torch.utils.data.Dataset):
    """Chunks of SEQ + 1 bytes of each file: input_ids the first SEQ, labels the next token of
    each; a file's last chunk padded (attention_mask False, labels -100 there)."""

    def __init__(self, max_chunks):
        self.chunks = []
        for path in stdlib_files(limit=max_chunks * SEQ):
            data = open(path, "rb").read()
            for start in range(0, len(data) - 1, SEQ):
                self.chunks.append(data[start:start + SEQ + 1])
                if len(self.chunks) == max_chunks:
                    return

    def __len__(self):
        return len(self.chunks)

    def __getitem__(self, i):
        chunk = torch.tensor(list(self.chunks[i]), dtype=torch.int64)
        n = len(chunk) - 1
        ids = torch.full((SEQ,), PAD, dtype=torch.int64)
        labels = torch.full((SEQ,), -100, dtype=torch.int64)
        ids[:n], labels[:n] = chunk[:-1], chunk[1:]
        return {"input_ids": ids, "attention_mask": torch.arange(SEQ) < n, "labels": labels}


class TinyLM(nn.Module):
    """A small causal transformer over bytes."""

    def __init__(self, width=128, layers=2, heads=4):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, width)
        self.position = nn.Parameter(torch.zeros(SEQ, width))
        layer = nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0, batch_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers)
        self.head = nn.Linear(width, VOCAB)
        self.register_buffer("causal", torch.triu(torch.ones(SEQ, SEQ, dtype=torch.bool), diagonal=1))

    def forward(self, ids, mask):
        x = self.embed(ids) + self.position
        x = self.blocks(x, mask=self.causal, src_key_padding_mask=~mask)
        return self.head(x)


def produce(a):
    loader = torch.utils.data.DataLoader(ByteChunks(a.max_chunks), batch_size=64, shuffle=True, num_workers=2)
    producer = coloader.Producer(loader, name=a.name, min_consumers=a.jobs, device=a.device)
    print("producer: %d chunks of %d bytes, %d batches of 64 per epoch, for %d job(s)"
          % (len(loader.dataset), SEQ, len(loader), a.jobs), flush=True)
    print("producer: %s" % producer.run(epochs=a.epochs), flush=True)


def join(a, make_model):
    """A job's side, as both examples set it up: (device, its Loader, its model there): on the
    producer's GPU (device path) when it has one, else on the CPU."""
    device = torch.device("cuda" if a.device else "cpu")
    loader = coloader.Loader(a.name, batch_size=a.batch_size, device="cuda" if a.device else None,
                             wait_for_producer=60)
    torch.manual_seed(a.job)
    return device, loader, make_model().to(device)


def train(a):
    device, loader, model = join(a, TinyLM)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for epoch in range(a.epochs):
        started, steps, total = time.monotonic(), 0, 0.0
        for batch in loader:
            logits = model(batch["input_ids"].to(device), batch["attention_mask"].to(device))
            loss = F.cross_entropy(logits.reshape(-1, VOCAB), batch["labels"].to(device).reshape(-1), ignore_index=-100)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            steps, total = steps + 1, total + loss.item()
        print("job %d: epoch %d, %d steps of %d, mean loss %.3f (%.2f nats/byte at the end), %.1f s"
              % (a.job, epoch, steps, a.batch_size, total / max(1, steps), loss.item(), time.monotonic() - started),
              flush=True)
    loader.close()


def launch(a, script=__file__, extra=()):
    """The producer and the jobs of `script`, as processes started together (each job waits for
    the producer); the exit status of the first that failed."""
    me = [sys.executable, os.path.abspath(script), "--name", a.name, "--epochs", str(a.epochs),
          "--max-chunks", str(a.max_chunks), "--device", a.device or ""] + list(extra)
    procs = [subprocess.Popen(me + ["--jobs", str(a.jobs), "produce"])]
    for job in range(a.jobs):
        procs.append(subprocess.Popen(me + ["--job", str(job), "--batch-size", str(24 + 16 * job), "train"]))
    codes = [p.wait() for p in procs]
    return next((c for c in codes if c != 0), 0)


def arguments(doc, samples=600, extra=None):
    """The command line both examples share (the role, the producer's name, jobs, devices)."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("role", nargs="?", choices=["produce", "train"], help="without it: start the producer and the jobs")
    ap.add_argument("--name", default="%s-%d" % (os.path.basename(sys.argv[0]).split(".")[0], os.getpid()))
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--job", type=int, default=0)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--max-chunks", type=int, default=samples, help="samples per epoch")
    ap.add_argument("--device", default="cuda:0" if torch.cuda.is_available() else "",
                    help='"cuda:N" places the batches in that GPU\'s memory; "" keeps them in host memory')
    if extra:
        extra(ap)
    a = ap.parse_args()
    a.device = a.device or None
    return a


def main():
    a = arguments(__doc__)
    if a.role == "produce":
        produce(a)
    elif a.role == "train":
        train(a)
    else:
        sys.exit(launch(a))


if __name__ == "__main__":
    main()
