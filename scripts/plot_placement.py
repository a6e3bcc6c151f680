#!/usr/bin/env python3
"""Draws the simulator's results (coloader simulate --out DIR) into one PNG:
makespan and mean job completion time per policy with and without data sharing, GPU memory and
SM utilisation over time, and the CPU cores the loaders want over time.

    build/tools/coloader simulate --trace examples/trace90.json --gpus 4 --out benchmarks/data/placement
    /usr/bin/python3 scripts/plot_placement.py benchmarks/data/placement docs/placement.png
"""
import csv
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    src = sys.argv[1] if len(sys.argv) > 1 else "benchmarks/data/placement"
    dst = sys.argv[2] if len(sys.argv) > 2 else "docs/placement.png"
    summary = list(csv.DictReader(open(f"{src}/summary.csv")))
    series = defaultdict(lambda: defaultdict(lambda: [0.0, 0.0, 0.0, 0]))  # run -> t -> [mem, sm, cores, gpus]
    for row in csv.DictReader(open(f"{src}/timeseries.csv")):
        run = (row["policy"], row["sharing"] == "1")
        s = series[run][float(row["t_s"]) / 3600]
        s[0] += float(row["memory_mib"])
        s[1] += float(row["sm"])
        s[2] = float(row["cores"])
        s[3] += 1
    policies = list(dict.fromkeys(r["policy"] for r in summary))
    fig, axes = plt.subplots(2, 2, figsize=(13, 8.5))

    ax = axes[0][0]
    width = 0.2
    for k, (key, label) in enumerate([("makespan_s", "makespan"), ("mean_jct_s", "mean JCT")]):
        for share in (False, True):
            vals = [float(r[key]) / 3600 for p in policies for r in summary
                    if r["policy"] == p and (r["sharing"] == "1") == share]
            xs = [i + (2 * k + share - 1.5) * width for i in range(len(policies))]
            ax.bar(xs, vals, width, label=f"{label}, sharing {'on' if share else 'off'}",
                   hatch="//" if share else None, color=f"C{k}", alpha=1.0 if share else 0.55)
    ax.set_xticks(range(len(policies)), policies)
    ax.set_ylabel("hours")
    ax.set_title("90-job trace on 4 GPUs: makespan and mean job completion time")
    ax.legend(fontsize=8)

    show = [("fifo-exclusive", False), ("most-memory", False), ("least-utilised", True), ("sharing-aware", True)]
    for ax, idx, ylabel, title in [(axes[0][1], 1, "mean SM busy fraction", "SM utilisation (mean over GPUs)"),
                                   (axes[1][0], 0, "GiB per GPU (mean)", "GPU memory in use (mean over GPUs)"),
                                   (axes[1][1], 2, "cores", "CPU cores the loaders want")]:
        for policy, share in show:
            pts = sorted(series[(policy, share)].items())
            ts = [t for t, _ in pts]
            if idx == 2:
                ys = [v[2] for _, v in pts]
            elif idx == 0:
                ys = [v[0] / v[3] / 1024 for _, v in pts]
            else:
                ys = [v[1] / v[3] for _, v in pts]
            ax.plot(ts, ys, label=f"{policy}, sharing {'on' if share else 'off'}", lw=1)
        ax.set_xlabel("hours")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.legend(fontsize=8)
    cores = [float(r["peak_cores"]) for r in summary]
    axes[1][1].axhline(64, color="grey", ls=":", lw=1)
    axes[1][1].set_ylim(0, max(cores) * 1.05)
    fig.tight_layout()
    fig.savefig(dst, dpi=110)
    print(f"wrote {dst}")


if __name__ == "__main__":
    main()
