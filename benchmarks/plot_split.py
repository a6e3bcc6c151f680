#!/usr/bin/env python3
"""Issue 24's figure: each setup's fraction of the synthetic ceiling by number of jobs, per model,
from the split suite's results.csv files (scripts/gpu.sh split); one marker per run.

    benchmarks/plot_split.py OUT.png RUN1/results.csv [RUN2/results.csv ...]
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

SETUPS = [("coloader-auto", "auto (engines + CPU)", "#76b900"), ("coloader-gpudecode", "gpu (engines alone)", "#1f77b4"),
          ("coloader", "cpu (workers alone)", "#888888")]


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    out, paths = sys.argv[1], sys.argv[2:]
    runs = []
    for p in paths:
        rows = [r for r in csv.DictReader(open(p)) if r.get("status") == "ok" and not r.get("variant")]
        ceiling = {(r["model"], r["n"]): float(r["agg_img_s"]) for r in rows if r["setup"] == "synthetic"}
        runs.append((rows, ceiling))
    models = sorted({r["model"] for rows, _ in runs for r in rows}, key=lambda m: (m != "resnet18", m))
    fig, axes = plt.subplots(1, len(models), figsize=(5 * len(models), 3.8), sharey=True, squeeze=False)
    for ax, model in zip(axes[0], models):
        for k, (setup, label, color) in enumerate(SETUPS):
            dodge = 0.12 * (k - 1)  # the three setups side by side at each N
            xs, ys = [], []
            for rows, ceiling in runs:
                for r in rows:
                    c = ceiling.get((r["model"], r["n"]))
                    if r["model"] == model and r["setup"] == setup and c:
                        xs.append(int(r["n"]) + dodge)
                        ys.append(float(r["agg_img_s"]) / c)
            ax.scatter(xs, ys, color=color, label=label, s=36, alpha=0.85)
        ax.axhline(0.95, color="#cc0000", lw=0.8, ls="--")
        ax.set_title(f"{model}, H200 under MPS")
        ax.set_xlabel("jobs on the GPU")
        ax.set_xticks([1, 2, 4])
        ax.set_ylim(0.5, 1.08)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("of the synthetic ceiling")
    axes[0][0].legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main()
