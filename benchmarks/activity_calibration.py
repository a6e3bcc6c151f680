#!/usr/bin/env python3
"""Fits and checks the estimator's step-time and SM-activity model (coloader.estimator.activity).

Reads the steady-state step times measured alone (docs/results/step_time_alone.csv, from
benchmarks/step_time_ground_truth.py on an H200), traces every configuration's step on the
meta device (the kernels' FLOPs and bytes; cached in --cache, since tracing 158 configurations
takes minutes), fits STEP_CALIBRATION's constants to the step times, and prints:

- the step-time fit: median and worst |error|, in-sample and with each model left out of the fit;
- the activity predicted for the configurations whose activity was measured, against the
  measurement: docs/results/sm_activity_mps.csv (N copies under MPS) and the collocation
  benchmark's ResNet-18/50 figures (docs/BENCHMARKS.md).

    /usr/bin/python3 benchmarks/activity_calibration.py [--fit] [--cache /tmp/activity_work.pt]

Without --fit it checks STEP_CALIBRATION as it stands in python/coloader/estimator/activity.py; with it,
the fitted constants are printed for that file (a reviewed change, as with the memory terms).
"""

import argparse
import csv
import math
import os
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "python"))

import torch  # noqa: E402

from coloader.estimator import activity, core  # noqa: E402

FITTED = ("rate_low", "rate_conv32", "rate_mm32", "bandwidth", "launch_s", "fill_elems")
# What the fit may choose: the H200's dense peaks bound the rates and bandwidth from above
# (bf16 990 TFLOP/s, TF32 495, FP32 67, HBM3e 4.8 TB/s); unbounded, it once priced bf16 at 6
# PFLOP/s, explaining bf16 steps by launches and bytes alone.
BOUNDS = {"rate_low": (50e12, 990e12), "rate_conv32": (20e12, 495e12), "rate_mm32": (10e12, 67e12),
          "bandwidth": (0.5e12, 4.8e12), "launch_s": (1e-6, 200e-6), "fill_elems": (1e3, 1e8)}
# docs/BENCHMARKS.md "Results: GPU decode": images/s alone over the aggregate at 4 jobs under
# MPS, bf16 autocast, batch 128, channels_last, SGD (benchmarks/collocated/collocated_job.py).
COLLOCATED = {"torchvision:resnet18": 11763 / 14222, "torchvision:resnet50": 4220 / 4892}


def key(row):
    return (row["model"], int(row["batch_size"]), row["precision"], row["optimizer"],
            row["channels_last"] in ("True", "1", "true"))


def trace(cfg):
    model, batch, precision, optimizer, cl = cfg
    work = activity.WorkCounter()
    core.estimate(model, batch, optimizer, precision, cl, work=work)
    return torch.tensor(work.kernels, dtype=torch.float64).reshape(-1, 4)


def load_work(cfgs, cache):
    work = torch.load(cache) if cache and os.path.exists(cache) else {}
    missing = [c for c in cfgs if c not in work]
    for i, c in enumerate(missing):
        print(f"tracing {i + 1}/{len(missing)}: {c}", file=sys.stderr, flush=True)
        work[c] = trace(c)
        if cache and (i % 10 == 9 or i == len(missing) - 1):
            torch.save(work, cache)
    return work


class Batch:
    """Every configuration's kernels in one tensor, so one calibration is priced at once."""

    def __init__(self, cfgs, work):
        self.kernels = torch.cat([work[c] for c in cfgs])
        self.owner = torch.cat([torch.full((len(work[c]),), i, dtype=torch.long) for i, c in enumerate(cfgs)])
        self.n = len(cfgs)

    def predict(self, cal):
        full, charged = activity.kernel_times(self.kernels, cal)
        step = torch.zeros(self.n, dtype=torch.float64).index_add_(0, self.owner, charged)
        busy = torch.zeros(self.n, dtype=torch.float64).index_add_(0, self.owner, full)
        return step, busy / step


def fit(batch, measured, start):
    """Least squares on log(step predicted / measured), robust to a few outliers, over the
    logarithms of the constants."""
    from scipy.optimize import least_squares

    x0 = [math.log(start[k]) for k in FITTED]
    target = torch.log(torch.tensor(measured, dtype=torch.float64))

    def residuals(x):
        step, _ = batch.predict(dict(zip(FITTED, map(math.exp, x))))
        return (torch.log(step) - target).numpy()

    bounds = ([math.log(BOUNDS[k][0]) for k in FITTED], [math.log(BOUNDS[k][1]) for k in FITTED])
    res = least_squares(residuals, x0, bounds=bounds, loss="soft_l1", f_scale=0.1, diff_step=1e-2)
    return dict(zip(FITTED, map(math.exp, res.x)))


def errors(pred, measured):
    return [p / m - 1 for p, m in zip(pred.tolist(), measured)]


def summary(errs):
    a = sorted(abs(e) for e in errs)
    return (f"median |error| {100 * statistics.median(a):.1f}%, 90th percentile {100 * a[int(0.9 * (len(a) - 1))]:.1f}%, "
            f"worst {100 * max(errs, key=abs):+.1f}%")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--times", default=str(ROOT / "docs/results/step_time_alone.csv"))
    ap.add_argument("--mps", default=str(ROOT / "docs/results/sm_activity_mps.csv"))
    ap.add_argument("--cache", default="/tmp/coloader_activity_work.pt", help="traced kernels ('' for none)")
    ap.add_argument("--fit", action="store_true", help="refit the constants (else check STEP_CALIBRATION)")
    ap.add_argument("--per-config", action="store_true", help="print every configuration's error")
    args = ap.parse_args()

    rows = [r for r in csv.DictReader(open(args.times)) if r["status"] == "ok"]
    mps = [r for r in csv.DictReader(open(args.mps))] if os.path.exists(args.mps) else []
    cfgs = [key(r) for r in rows]
    measured = [float(r["step_s"]) for r in rows]
    extra = [key(r) for r in mps] + [(m, 128, "bf16-amp", "sgd", True) for m in COLLOCATED]
    work = load_work(sorted(set(cfgs + extra)), args.cache)
    batch = Batch(cfgs, work)

    cal = dict(activity.STEP_CALIBRATION)
    if args.fit:
        cal.update(fit(batch, measured, cal))
        print("fitted constants (for STEP_CALIBRATION in python/coloader/estimator/activity.py):")
        for k in FITTED:
            print(f"    {k!r}: {cal[k]:.3g},")
    step, act = batch.predict(cal)
    errs = errors(step, measured)
    print(f"step time alone, {len(rows)} configurations on {rows[0]['gpu']}: {summary(errs)}")
    for prec in ("fp32", "bf16-amp"):
        sub = [e for e, c in zip(errs, cfgs) if c[2] == prec]
        print(f"  {prec}: {summary(sub)} ({len(sub)})")
    if args.fit:
        # Each model's configurations predicted by constants fitted without that model.
        held = [0.0] * len(cfgs)
        for model in sorted({c[0] for c in cfgs}):
            inside = [i for i, c in enumerate(cfgs) if c[0] != model]
            outside = [i for i, c in enumerate(cfgs) if c[0] == model]
            c_fit = fit(Batch([cfgs[i] for i in inside], work), [measured[i] for i in inside], cal)
            s_out, _ = Batch([cfgs[i] for i in outside], work).predict(c_fit)
            for i, s in zip(outside, s_out.tolist()):
                held[i] = s / measured[i] - 1
        print(f"  each model left out of the fit: {summary(held)}")
    if args.per_config:
        for c, e, s, m, a in sorted(zip(cfgs, errs, step.tolist(), measured, act.tolist()), key=lambda t: t[1]):
            print(f"    {c[0]:<32} b{c[1]:<4} {c[2]:<8} {c[3]:<5} {'cl' if c[4] else '  '}  measured {1e3 * m:7.1f} ms"
                  f"  predicted {1e3 * s:7.1f} ms ({100 * e:+5.1f}%)  activity {a:.2f}")

    print("activity, predicted against measured:")
    checks = [(key(r), float(r["activity"]), f"{r['copies']} copies under MPS, sm_activity_mps.csv") for r in mps]
    checks += [((m, 128, "bf16-amp", "sgd", True), a, "collocation benchmark, BENCHMARKS.md")
               for m, a in COLLOCATED.items()]
    gaps = []
    for c, measured_act, source in checks:
        s, a = Batch([c], work).predict(cal)
        if "MPS" in source:  # the benchmark's two figures are the same jobs measured again
            gaps.append((float(a[0]) - measured_act, 0.5 - measured_act))
        print(f"  {c[0]:<32} b{c[1]:<4} {c[2]:<8} {c[3]:<5} {'cl' if c[4] else '  '}  predicted {float(a[0]):.2f}"
              f"  measured {measured_act:.2f}  (step {1e3 * float(s[0]):.1f} ms; {source})")
    if gaps:
        print(f"  over the {len(gaps)} measured under MPS, mean |predicted - measured| {statistics.mean(abs(g) for g, _ in gaps):.2f}; the planner's old "
              f"default 0.5 is off by {statistics.mean(abs(d) for _, d in gaps):.2f}")


if __name__ == "__main__":
    main()
