#!/usr/bin/env python3
"""Draws docs/gpu_decode.png from docs/results/producer_throughput_gpu_decode.txt (the JSON lines
that benchmarks/producer_throughput.py --gpu-decode prints): images/s and cores busy of the
producer, CPU decode on every core vs GPU decode. Needs matplotlib (/usr/bin/python3)."""
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
rows = [json.loads(l) for l in open(os.path.join(ROOT, "docs/results/producer_throughput_gpu_decode.txt"))
        if l.startswith("{")]
labels = [f"{'GPU ring' if r['path'] == 'device' else 'host path'}\n{r['decode']} decode\n{r['workers']} workers" for r in rows]
colors = ["#888888" if r["decode"] == "cpu" else "#76b900" for r in rows]
fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
a.bar(labels, [r["images_per_s"] for r in rows], color=colors)
a.set_ylabel("images/s delivered")
a.set_title("Producer throughput (H200 machine, 16 cores)")
b.bar(labels, [r["cores_busy"] for r in rows], color=colors)
b.set_ylabel("cores busy (CPU time / wall)")
b.set_title("Producer CPU")
for ax, key in ((a, "images_per_s"), (b, "cores_busy")):
    for i, r in enumerate(rows):
        ax.text(i, r[key], f"{r[key]:,}", ha="center", va="bottom", fontsize=9)
    ax.tick_params(axis="x", labelsize=8)
fig.tight_layout()
out = os.path.join(ROOT, "docs/gpu_decode.png")
fig.savefig(out, dpi=110)
print(f"wrote {out}")
