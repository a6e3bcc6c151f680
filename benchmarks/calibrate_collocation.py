#!/usr/bin/env python3
"""Fits the simulator's collocation slowdown model to measured collocation.

The simulator (placement/simulator.cc) slows each of n jobs sharing a GPU under MPS by
    (1 + interference * (n - 1)) * max(1, U / sm_saturation),   U = the jobs' summed activity,
where a job's activity is the share of the GPU it keeps busy alone. This script takes the
collocated benchmark's `synthetic` rows (N copies of one model training on data already on
the GPU: no loader in the way) and compares the model with what was measured.

A job's activity is taken as its throughput alone over the highest aggregate throughput of
its copies (the GPU's capacity for that model). That is what a user can measure with the same
benchmark; it is not DCGM's SM activity, and with throughput alone the saturation point and
the activity scale cannot be told apart: sm_saturation 1.0 is the definition that goes with
this activity, and the fit says how much interference is left on top of sharing the SMs.

    benchmarks/calibrate_collocation.py docs/results/collocated_*_h200.csv [--out FILE]
"""
import argparse
import collections
import csv
import math
import statistics
import sys


def measured(paths):
    """{model: {n: median aggregate images/s}} over the synthetic rows of every file."""
    runs = collections.defaultdict(lambda: collections.defaultdict(list))
    for path in paths:
        with open(path) as f:
            for r in csv.DictReader(f):
                if r.get("setup") == "synthetic" and r.get("status") == "ok" and float(r["agg_img_s"]) > 0:
                    runs[r["model"]][int(r["n"])].append(float(r["agg_img_s"]))
    return {m: {n: statistics.median(v) for n, v in by_n.items()} for m, by_n in runs.items()}


def slowdown(n, u, interference, saturation):
    return (1 + interference * (n - 1)) * max(1.0, u / saturation)


def points(data):
    """(model, n, activity, measured per-job slowdown) for every model measured alone and collocated."""
    out = []
    for model, by_n in sorted(data.items()):
        if 1 not in by_n or len(by_n) < 2:
            continue
        alone, capacity = by_n[1], max(by_n.values())
        for n, agg in sorted(by_n.items()):
            if n > 1:
                out.append((model, n, alone / capacity, alone / (agg / n)))
    return out


def rms_log_error(pts, interference, saturation):
    errs = [math.log(slowdown(n, n * a, interference, saturation) / s) for _, n, a, s in pts]
    return math.sqrt(sum(e * e for e in errs) / len(errs))


def fit_interference(pts, saturation):
    grid = [i / 1000 for i in range(0, 101)]
    return min(grid, key=lambda i: rms_log_error(pts, i, saturation))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv", nargs="+", help="collocated benchmark CSVs (benchmarks/collocated/collocated.py --out)")
    ap.add_argument("--out", help="also write the report here")
    a = ap.parse_args()
    pts = points(measured(a.csv))
    if not pts:
        sys.exit("calibrate_collocation: no model has synthetic rows both alone (N=1) and collocated (N>1) in "
                 + ", ".join(a.csv))
    lines = ["# Collocation slowdown: measured (synthetic setup, MPS) against the simulator's model",
             "# sources: " + ", ".join(a.csv), ""]
    for model in sorted({p[0] for p in pts}):
        a_ = next(p[2] for p in pts if p[0] == model)
        lines.append(f"{model}: activity alone {a_:.3f} (images/s alone / highest aggregate of its copies)")
    candidates = [("shipped before calibration", 0.03, 0.9)]
    for sat in (0.9, 1.0):
        candidates.append((f"best interference at sm_saturation {sat}", fit_interference(pts, sat), sat))
    lines += ["", "| model | N | measured slowdown | " + " | ".join(
        f"i={i:g}, sat={s:g}" for _, i, s in candidates) + " |", "| --- | ---: | ---: |" + " ---: |" * len(candidates)]
    for model, n, act, s in pts:
        cells = []
        for _, i, sat in candidates:
            p = slowdown(n, n * act, i, sat)
            cells.append(f"{p:.2f} ({100 * (p / s - 1):+.0f}%)")
        lines.append(f"| {model} | {n} | {s:.2f} | " + " | ".join(cells) + " |")
    lines.append("")
    for label, i, sat in candidates:
        lines.append(f"{label}: interference {i:g}, sm_saturation {sat:g}: rms log error "
                     f"{rms_log_error(pts, i, sat):.3f}")
    text = "\n".join(lines)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
