#!/usr/bin/env python3
"""Draws docs/benchmarks.png from the benchmark outputs in docs/results/ (the text the
benchmark scripts print): hand-off latency per path and consumer count against a
torch.multiprocessing queue, decode + augment throughput per core against PIL + torchvision,
and CPU seconds of a shared producer against independent loaders.

    benchmarks/plot_results.py [--results docs/results] [--out docs/benchmarks.png]
Needs matplotlib (Debian: python3-matplotlib).
"""
import argparse
import os
import re

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read(results, name):
    with open(os.path.join(results, name)) as f:
        return f.read()


def handoff(results):
    rows = []
    for name in ("handoff_host.txt", "handoff_gpu.txt"):
        for m in re.finditer(r"(host|GPU) path, (\d) consumer\(s\): hand-off p50 ([\d.]+) us, p99 ([\d.]+) us",
                             read(results, name)):
            rows.append((f"{m[1]}, {m[2]} cons.", float(m[3]), float(m[4])))
    m = re.search(r"p50 ([\d.]+) us, p99 ([\d.]+) us", read(results, "handoff_torch_queue.txt"))
    rows.append(("torch mp queue", float(m[1]), float(m[2])))
    return rows


def decode(results):
    text = read(results, "decode_bench_devbox.txt")
    rows = []
    for label in ("coloader, DCT scaling", "coloader, no DCT scaling", "PIL + torchvision transforms"):
        m = re.search(re.escape(label) + r"\s+([\d.]+)", text)
        rows.append((label.replace(" transforms", ""), float(m[1])))
    return rows


def cpu_share(results):
    text = read(results, "cpu_share_devbox.txt")
    shared = float(re.search(r"shared producer\s+CPU\s+([\d.]+)", text)[1])
    solo = float(re.search(r"independent\s+CPU\s+([\d.]+)", text)[1])
    n = int(re.match(r"(\d+) consumers", text)[1])
    return n, shared, solo


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", default=os.path.join(ROOT, "docs", "results"))
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "benchmarks.png"))
    args = ap.parse_args()

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    rows = handoff(args.results)
    ax = axes[0]
    x = range(len(rows))
    ax.bar([i - 0.2 for i in x], [r[1] for r in rows], 0.4, label="p50")
    ax.bar([i + 0.2 for i in x], [r[2] for r in rows], 0.4, label="p99")
    ax.axhline(50, color="grey", linestyle="--", linewidth=1, label="target p50")
    ax.set_xticks(list(x), [r[0] for r in rows], rotation=25, ha="right")
    ax.set_yscale("log")
    ax.set_ylabel("µs (log scale)")
    ax.set_title("Hand-off latency, H200 machine")
    ax.legend()

    rows = decode(args.results)
    ax = axes[1]
    ax.bar([r[0] for r in rows], [r[1] for r in rows], color=["C0", "C0", "C7"])
    for i, r in enumerate(rows):
        ax.text(i, r[1], f"{r[1]:.0f}\n({r[1] / rows[-1][1]:.2f}x)", ha="center", va="bottom")
    ax.set_ylabel("images/s on one core")
    ax.set_ylim(0, max(r[1] for r in rows) * 1.3)
    ax.set_title("Decode + augment (train, 224, float32)")
    ax.tick_params(axis="x", rotation=15)

    n, shared, solo = cpu_share(args.results)
    ax = axes[2]
    ax.bar([f"1 producer\n+ {n} consumers", f"{n} independent\nloaders"], [shared, solo], color=["C0", "C7"])
    ax.text(0, shared, f"{shared:.1f} s ({shared / solo:.2f}x)", ha="center", va="bottom")
    ax.text(1, solo, f"{solo:.1f} s", ha="center", va="bottom")
    ax.set_ylabel("CPU seconds, all processes")
    ax.set_ylim(0, solo * 1.2)
    ax.set_title(f"CPU for {n} jobs reading the same data")

    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print("plot_results: wrote", args.out)


if __name__ == "__main__":
    main()
