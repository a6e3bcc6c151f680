#!/usr/bin/env python3
"""The memory estimator against its ground truth: estimates every measured configuration of
docs/results/memory_ground_truth.csv (without a GPU), fits the calibrated margins, and prints
the accuracy table of docs/ESTIMATOR.md and draws docs/estimator.png.

Accuracy is given as the median absolute error, the worst under- and overestimates, the share
of configurations underestimated by more than 5%, and GPUMemNet-style bin accuracy: the share
of configurations whose estimate falls in the same 1, 2 or 8 GiB bin as the measured peak
(bin = floor(MiB / (size * 1024))). The issue's targets are marked met or missed.

The estimate places measured cuDNN workspaces in the traced sequence
(coloader.estimator.workspaces), and that table was measured on these same configurations, so
each configuration is also estimated with the table's entries from itself left out: from its own
batch size of its model ("leave one batch size out": the layers are known, at other batch sizes)
and from its whole model ("leave one model out": an architecture the table has not seen, with
the margins also fitted without it).

    /usr/bin/python3 benchmarks/estimator_accuracy.py            # estimate (cached) + report
    /usr/bin/python3 benchmarks/estimator_accuracy.py --refresh  # re-run every estimate

The raw estimates (the trace, the workspaces and the allocator model, before the calibrated
terms) are cached in docs/results/memory_estimates.csv, keyed by configuration, torch version
and the workspace table and code, since tracing 154 configurations takes minutes on two cores.
"""

import argparse
import csv
import hashlib
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))

GT = REPO / "docs/results/memory_ground_truth.csv"
RAW = REPO / "docs/results/memory_estimates.csv"
BIN_GIB = (1, 2, 8)
# Issue 26's accuracy targets on the measured configurations: (summary key, bound, "max"/"min").
TARGETS = [("median |error|", 0.03, "max"), ("1 GiB bin accuracy", 0.95, "min"), ("under by >5%", 0.02, "max")]
# The table's entries each estimate may use: all; none of its own (model, batch); none of its model.
FOLDS = ("all", "lobo", "lomo")
RAW_FIELDS = ["model", "batch_size", "precision", "optimizer", "torch", "table", "traced_peak_live_mib",
              "live_peak_mib", "uses_cublas", "uses_cudnn", "convolutions"] + \
             [f"{f}_{k}" for f in FOLDS for k in ("allocated_mib", "reserved_mib", "unmeasured")]
# The margins' grid: the factor on reserved bytes, and its growth per share of unmeasured layers.
MARGINS = [1 + i / 400 for i in range(0, 41)]
UNMEASURED = [i / 100 for i in range(0, 16)]
# The worst underestimate the fit allows: what `coloader plan`'s default --memory-margin (5% on
# every estimate, which becomes the job's MPS memory limit) covers, 1 - 1/1.05 = 4.76%.
BOUND = 1 - 1 / 1.05


def key(r):
    return (r["model"], int(r["batch_size"]), r["precision"], r["optimizer"])


def table_id():
    """What the cached figures depend on besides torch: the workspace table and the code that
    traces, places the workspaces and replays."""
    from coloader.estimator import core, memtrace, workspaces

    h = hashlib.sha256(workspaces.TABLE.read_bytes())
    for module in (core, memtrace, workspaces):
        h.update(Path(module.__file__).read_bytes())
    return h.hexdigest()[:12]


def raw_estimates(rows, refresh):
    """The cached raw figures of every row, estimating what the cache lacks."""
    import torch

    from coloader.estimator import core, workspaces, zoo

    cache, tid = {}, table_id()
    if RAW.exists() and not refresh:
        for r in csv.DictReader(open(RAW)):
            if r["torch"] == torch.__version__ and r.get("table") == tid:
                cache[key(r)] = r
    entries = workspaces.read_table()
    tables = {}

    def table(fold, model, batch):
        k = (fold, model, batch if fold == "lobo" else None)
        if k not in tables:
            exclude = {"all": None, "lobo": lambda m, b: (m, b) == (model, batch),
                       "lomo": lambda m, b: m == model}[fold]
            tables[k] = workspaces.ConvWorkspaces(entries, exclude=exclude)
        return tables[k]

    traces = {}
    todo = sorted((r for r in rows if key(r) not in cache), key=key)
    for i, r in enumerate(todo):
        model, batch, precision, optimizer = key(r)
        if (model, batch, precision) not in traces:  # the trace does not depend on the optimizer
            module, spec = zoo.build(model, device="meta", image_size=None, seq_len=512)
            module.train()
            traces = {(model, batch, precision): core.trace_step(module, spec, batch, precision)}
        tr, trainable = traces[(model, batch, precision)]
        row = dict(model=model, batch_size=batch, precision=precision, optimizer=optimizer, torch=torch.__version__,
                   table=tid, traced_peak_live_mib=round(tr.peak_bytes / 2**20, 1),
                   uses_cublas=bool(tr.ops & core._CUBLAS_OPS), uses_cudnn=bool(tr.ops & core._CUDNN_OPS))
        # What a FakeTensor-style tracker reports: the peak of live tensors over the steps,
        # optimizer state included; no workspaces, no allocator, no context.
        bare, _ = core._replay(tr.events, tr.live, trainable, optimizer)
        row["live_peak_mib"] = round(bare.peak_allocated / 2**20, 1)
        for fold in FOLDS:
            events, cover = workspaces.insert(tr.events, tr.windows, table(fold, model, batch))
            alloc, _ = core._replay(events, tr.live, trainable, optimizer)
            row.update({f"{fold}_allocated_mib": round(alloc.peak_allocated / 2**20, 1),
                        f"{fold}_reserved_mib": round(alloc.peak_reserved / 2**20, 1),
                        f"{fold}_unmeasured": round(cover.unmeasured_share, 4), "convolutions": cover.convolutions})
        cache[key(r)] = row
        print(f"[{i + 1}/{len(todo)}] {model} b{batch} {precision} {optimizer}: {row['all_reserved_mib']:.0f} MiB "
              f"reserved (raw); without its batch size {row['lobo_reserved_mib']:.0f}, without its model "
              f"{row['lomo_reserved_mib']:.0f}", flush=True)
        with open(RAW, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=RAW_FIELDS, extrasaction="ignore")
            w.writeheader()
            w.writerows(sorted(cache.values(), key=key))
    return cache


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--refresh", action="store_true", help="re-run every estimate instead of reading the cache")
    ap.add_argument("--only-estimate", action="store_true", help="fill the cache; no report")
    args = ap.parse_args()
    rows = [r for r in csv.DictReader(open(GT)) if r["status"] == "ok"]
    raw = raw_estimates(rows, args.refresh)
    if args.only_estimate:
        return
    report(rows, raw)


def measured_mib(r):
    """What nvidia-smi showed for the process at its peak (NVML's per-process figure)."""
    if r["nvml_process_mib"]:
        return float(r["nvml_process_mib"])
    return float(r["max_reserved_mib"]) + float(r["context_mib"] or 0)


def calibrated(e, cal, fold="all"):
    """The estimator's total from the raw figures `e` (a cache row) of `fold` and calibration
    `cal`, the same arithmetic as coloader.estimator.core.estimate_module."""
    from coloader.estimator import core

    flags = {"uses_cublas": str(e["uses_cublas"]) == "True", "uses_cudnn": str(e["uses_cudnn"]) == "True"}
    return core.calibrated_total(float(e[f"{fold}_reserved_mib"]), float(e[f"{fold}_unmeasured"]), flags, cal)


def estimates(rows, raw, cal, fold="all"):
    """(measured, estimate) MiB for each row."""
    return [(measured_mib(r), calibrated(raw[key(r)], cal, fold)) for r in rows]


def errors(pairs):
    return [(e - m) / m for m, e in pairs]


def same_bin(measured, estimate, gib):
    """Whether the estimate falls in the measured peak's bin of `gib` GiB (MiB figures)."""
    return int(estimate // (gib * 1024)) == int(measured // (gib * 1024))


def accuracy(pairs):
    """The accuracy figures of (measured, estimate) pairs: median |error|, worst under- and
    overestimate, the share underestimated by more than 5%, and bin accuracy at BIN_GIB."""
    errs = errors(pairs)
    out = {"configurations": len(pairs),
           "median |error|": statistics.median(abs(x) for x in errs),
           "worst underestimate": max(0.0, -min(errs)),
           "worst overestimate": max(0.0, max(errs)),
           "under by >5%": sum(x < -0.05 for x in errs) / len(errs)}
    for g in BIN_GIB:
        out[f"{g} GiB bin accuracy"] = sum(same_bin(m, e, g) for m, e in pairs) / len(pairs)
    return out


def target_marks(acc):
    """{summary key: "met"/"missed"} for issue 26's targets."""
    return {k: "met" if (acc[k] <= bound if kind == "max" else acc[k] >= bound) else "missed"
            for k, bound, kind in TARGETS}


def context_terms(rows, raw):
    """The CUDA context terms: the measured medians (bare context; grown by cuBLAS, by cuDNN)."""
    ctx = {}
    for r in rows:
        e = raw[key(r)]
        ctx.setdefault((str(e["uses_cublas"]), str(e["uses_cudnn"])), []).append(float(r["context_mib"]))
    med = {k: statistics.median(v) for k, v in ctx.items()}
    bare = statistics.median(float(r["bare_context_mib"]) for r in rows)
    cublas = med.get(("True", "False"), med[("True", "True")] - 20) - bare
    cudnn = med.get(("False", "True"), bare + 20) - bare
    return dict(context_mib=bare, cublas_context_mib=cublas, cudnn_context_mib=cudnn)


def fit(rows, raw):
    """The margins with the smallest median absolute error whose worst underestimate is at most
    BOUND, both with the whole table and with each model's own entries left out (the margins'
    second term is for layers the table has not seen)."""
    base = context_terms(rows, raw)
    best = None
    for margin in MARGINS:
        for unmeasured in UNMEASURED:
            cal = dict(base, margin=margin, margin_unmeasured=unmeasured)
            errs = errors(estimates(rows, raw, cal))
            worst = max(-min(errs), -min(errors(estimates(rows, raw, cal, "lomo"))))
            score = (worst > BOUND, statistics.median(abs(x) for x in errs), unmeasured)
            if best is None or score < best[0]:
                best = (score, cal)
    return best[1]


def pct(x):
    return f"{x * 100:.1f}%"


def report(rows, raw):
    cal = fit(rows, raw)
    print("calibration:", {k: round(v, 4) for k, v in cal.items()})
    pairs = estimates(rows, raw, cal)
    errs = errors(pairs)
    raw_pairs = [(measured_mib(r), float(raw[key(r)]["live_peak_mib"])) for r in rows]
    table = [("coloader.estimator, in-sample", accuracy(pairs)),
             ("same, the table without the configuration's own batch size of its model",
              accuracy(estimates(rows, raw, cal, "lobo")))]
    # Each model estimated as one the table has not seen: its entries left out of the table and
    # the margins fitted on the other models only.
    held, held_rows = [], []
    for model in sorted({r["model"] for r in rows}):
        c = fit([r for r in rows if r["model"] != model], raw)
        mine = [r for r in rows if r["model"] == model]
        held += estimates(mine, raw, c, "lomo")
        held_rows += mine
    table.append(("same, the table without the model and the margins fitted without it", accuracy(held)))
    for opt in sorted({r["optimizer"] for r in rows}):
        mine = [r for r in rows if r["optimizer"] == opt]
        table.append((f"{opt} rows, in-sample", accuracy(estimates(mine, raw, cal))))
        others = [r for r in rows if r["optimizer"] != opt]
        table.append((f"{opt} rows, margins fitted on the other optimizers' rows only",
                      accuracy(estimates(mine, raw, fit(others, raw)))))
    table.append(("raw trace: peak live tensors, no allocator, no context", accuracy(raw_pairs)))
    acc = dict(table)
    calib = acc[table[0][0]]
    cover = [float(raw[key(r)]["lomo_unmeasured"]) for r in rows if int(raw[key(r)]["convolutions"])]
    print(f"convolution layers the table lacks when the model is left out: median {pct(statistics.median(cover))} "
          f"of a convolutional model's calls ({len(cover)} configurations)")

    print()
    marks = target_marks(calib)
    print(f"Issue 26's targets, in-sample ({len(rows)} configurations):")
    for k, bound, kind in TARGETS:
        print(f"  {k} {'<=' if kind == 'max' else '>='} {pct(bound)}: {pct(calib[k])}, {marks[k]}")
    print()
    cols = ["median |error|", "worst underestimate", "worst overestimate", "under by >5%"] + \
        [f"{g} GiB bin accuracy" for g in BIN_GIB]
    print("| | configurations | median abs. error | worst underestimate | worst overestimate | under by >5% | "
          + " | ".join(f"{g} GiB-bin accuracy" for g in BIN_GIB) + " |")
    print("|---|---:|" + "---:|" * len(cols))
    print("| target (issue 6) | | <= 10% | <= 5% | | | | | |")
    tgt = {k: ("<= " if kind == "max" else ">= ") + f"{bound * 100:g}%" for k, bound, kind in TARGETS}
    print("| target (issue 26) | |" + "".join(f" {tgt[k]} |" if k in tgt else " |" for k in cols))
    for i, (label, a) in enumerate(table):
        cells = []
        for k in cols:
            cell = "none" if k.startswith("worst") and a[k] == 0 else pct(a[k])
            if k.endswith("bin accuracy"):
                cell += f" ({round(a[k] * a['configurations'])}/{a['configurations']})"
            if i == 0 and k in marks:
                cell += f" ({marks[k]})"
            cells.append(cell)
        print(f"| {label} | {a['configurations']} | " + " | ".join(cells) + " |")

    print()
    margins_grid(rows, raw, cal)
    print()
    bin_edges(rows, errs)

    print()
    print("| model | batch | precision | optimizer | measured MiB | estimate MiB | error | without its model | "
          "raw trace MiB | raw error |")
    print("|---|---:|---|---|---:|---:|---:|---:|---:|---:|")
    lomo = {key(r): e for r, (_, e) in zip(held_rows, held)}
    for r, err in zip(rows, errs):
        m = measured_mib(r)
        rawm = float(raw[key(r)]["live_peak_mib"])
        print(f"| {r['model']} | {r['batch_size']} | {r['precision']} | {r['optimizer']} | {m:.0f} | {m * (1 + err):.0f} | "
              f"{err * 100:+.1f}% | {(lomo[key(r)] - m) / m * 100:+.1f}% | {rawm:.0f} | {(rawm - m) / m * 100:+.1f}% |")
    plot(rows, raw, cal, lomo)
    return cal


def margins_grid(rows, raw, cal):
    """The best 1 GiB-bin accuracy and median over the margins' grid under three bounds on
    underestimates: the trade the fit makes."""
    grid = []
    for margin in [0.98 + i / 400 for i in range(0, 57)]:
        for unmeasured in UNMEASURED:
            c = dict(cal, margin=margin, margin_unmeasured=unmeasured)
            grid.append((accuracy(estimates(rows, raw, c)), accuracy(estimates(rows, raw, c, "lomo")), c))
    print("Over the margins (in-sample; 'held out' is the table without the model):")
    for what, ok in ((f"worst underestimate at most {pct(BOUND)}, in-sample and held out (the fit's bound)",
                      lambda a, h: max(a["worst underestimate"], h["worst underestimate"]) <= BOUND),
                     ("at most 2% of configurations under by >5%, in-sample",
                      lambda a, h: a["under by >5%"] <= 0.02),
                     ("no bound on underestimates", lambda a, h: True)):
        a, h, c = max(((a, h, c) for a, h, c in grid if ok(a, h)),
                      key=lambda x: (x[0]["1 GiB bin accuracy"], -x[0]["median |error|"]))
        print(f"  {what}: best 1 GiB bins {pct(a['1 GiB bin accuracy'])} (median {pct(a['median |error|'])}, worst "
              f"underestimate {pct(a['worst underestimate'])}, under by >5% {pct(a['under by >5%'])}; held out "
              f"{pct(h['1 GiB bin accuracy'])}, worst {pct(h['worst underestimate'])}; margin {c['margin']:.3f} + "
              f"{c['margin_unmeasured']:.2f} x unmeasured share)")


def bin_edges(rows, errs):
    """What 1 GiB bins ask of an estimator's relative error, on the measured peaks: the fitted
    estimator's misses by their size; the accuracy an estimator off by x on every configuration
    would have."""
    meas = [measured_mib(r) for r in rows]
    n = len(rows)
    miss = [e for m, e in zip(meas, errs) if not same_bin(m, m * (1 + e), 1)]
    print(f"1 GiB bins, in-sample: {len(miss)} of {n} configurations miss their bin, "
          f"{sum(e > 0 for e in miss)} of them overestimates; misses within "
          + ", ".join(f"{x * 100:g}%: {sum(abs(e) <= x for e in miss)}" for x in (0.01, 0.02, 0.03, 0.05, 0.1))
          + " of the measured peak")
    edge = [min(m % 1024, 1024 - m % 1024) / m for m in meas]
    print("measured peaks within x of a 1 GiB bin edge: "
          + ", ".join(f"{x * 100:g}%: {sum(d < x for d in edge)}" for x in (0.005, 0.01, 0.02, 0.03, 0.05)))
    print()
    print("An estimate off by x on every configuration, 1 GiB-bin accuracy on these measured peaks:")
    print("| x | every estimate x over | every estimate x under | errors spread evenly over [-x, +x] |")
    print("|---:|---:|---:|---:|")
    k = 200
    for x in (0.005, 0.01, 0.02, 0.03, 0.05, 0.1):
        over = sum(same_bin(m, m * (1 + x), 1) for m in meas) / n
        under = sum(same_bin(m, m * (1 - x), 1) for m in meas) / n
        even = sum(same_bin(m, m * (1 + x * (2 * i / k - 1)), 1) for m in meas for i in range(k + 1)) / (n * (k + 1))
        print(f"| {x * 100:g}% | {pct(over)} | {pct(under)} | {pct(even)} |")


def plot(rows, raw, cal, lomo):
    try:
        import matplotlib
    except ImportError:
        print("(docs/estimator.png not redrawn: this Python has no matplotlib)", file=sys.stderr)
        return

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    meas = [measured_mib(r) / 1024 for r in rows]
    est = [calibrated(raw[key(r)], cal) / 1024 for r in rows]
    held = [lomo[key(r)] / 1024 for r in rows]
    rawv = [float(raw[key(r)]["live_peak_mib"]) / 1024 for r in rows]
    fig, ax = plt.subplots(figsize=(6.5, 6))
    top = max(meas + est + held) * 1.1
    ax.fill_between([0, top], [0, top * 0.95], [0, top * 1.05], color="0.9", label="within 5%")
    ax.plot([0, top], [0, top], color="0.5", lw=0.8)
    ax.scatter(meas, rawv, s=12, marker="x", color="tab:red", label="raw trace (live tensors only)")
    ax.scatter(meas, held, s=14, marker="^", color="tab:orange", label="coloader.estimator, model left out of the table")
    ax.scatter(meas, est, s=14, color="tab:blue", label="coloader.estimator")
    ax.set_xlabel("measured peak, nvidia-smi per process (GiB)")
    ax.set_ylabel("estimated (GiB)")
    ax.set_xlim(0, top)
    ax.set_ylim(0, top)
    ax.set_title(f"Training-step peak GPU memory, {len(rows)} configurations, H200")
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(REPO / "docs/estimator.png", dpi=120)


if __name__ == "__main__":
    main()
