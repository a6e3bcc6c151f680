#!/usr/bin/env python3
"""Is the default placement a default? Draws traces from families of workloads (job mixes,
arrival rates, how many jobs share a dataset, how far memory estimates are off, 2/4/8 GPUs),
replays each through `coloader simulate` under every policy with and without sharing, and
reports how the default (sharing-aware, sharing on) compares with the best run per trace:
its makespan and mean JCT over the best, and its OOMs beside fifo-exclusive's.

One family is held out: its mix, arrival rate and estimate error are values the tuning families
never take, and nothing was chosen looking at it; it is reported apart.

    /usr/bin/python3 scripts/placement_families.py --out docs/results/placement/families
    /usr/bin/python3 scripts/placement_families.py --traces 20 --held-out 0 -- --recovery grow

Arguments after `--` go to every `coloader simulate` (to weigh a candidate rule). Writes
traces.csv (one row per trace), summary.md (the tables) and families.png (the distributions);
CPU only, about 20 s on two cores.
"""
import argparse
import csv
import json
import os
import random
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
from compare_policies import simulate  # noqa: E402
from make_trace import make_trace  # noqa: E402

# The axes the tuning families are drawn from: each trace takes one value of each at random.
MIXES = {  # light/medium/heavy shares (scripts/make_trace.py's classes)
    "project": (0.50, 0.35, 0.15),
    "carma-65-27-8": (0.65, 0.27, 0.08),
    "carma-83-17": (0.83, 0.17, 0.0),
    "heavy": (0.30, 0.40, 0.30),
}
MEAN_GAPS_S = (45.0, 90.0, 180.0)
SHARING = ("none", "project", "one")
ESTIMATE_ERRORS = {"exact": (1.0, 1.0), "project": (0.97, 1.20), "noisy": (0.75, 1.20)}
GPUS = (2, 4, 8)
JOBS_PER_GPU = 20
CORES_PER_GPU = 16
# The held-out family: a bimodal mix, a rate and an estimate error that no tuning trace has.
HELD_OUT = {"mix": ("bimodal", (0.45, 0.15, 0.40)), "mean_gap_s": 60.0,
            "estimate_error": ("held-out", (0.85, 1.10))}
DEFAULT = ("sharing-aware", "1")
EXCLUSIVE = ("fifo-exclusive", "1")


def draw(index, held_out):
    """Trace `index` of its family: the axes it takes and the trace itself."""
    rng = random.Random(f"{'held-out' if held_out else 'tuning'}-{index}")
    if held_out:
        mix_name, mix = HELD_OUT["mix"]
        gap = HELD_OUT["mean_gap_s"]
        err_name, err = HELD_OUT["estimate_error"]
    else:
        mix_name = rng.choice(sorted(MIXES))
        mix = MIXES[mix_name]
        gap = rng.choice(MEAN_GAPS_S)
        err_name = rng.choice(sorted(ESTIMATE_ERRORS))
        err = ESTIMATE_ERRORS[err_name]
    sharing = rng.choice(SHARING)
    gpus = rng.choice(GPUS)
    seed = rng.randrange(1 << 30)
    trace = make_trace(seed, JOBS_PER_GPU * gpus, gap, CORES_PER_GPU * gpus, list(mix), err, sharing)
    axes = {"family": "held-out" if held_out else "tuning", "index": index, "mix": mix_name, "mean_gap_s": gap,
            "sharing": sharing, "estimate_error": err_name, "gpus": gpus, "jobs": JOBS_PER_GPU * gpus, "seed": seed}
    return axes, trace


def score(axes, runs):
    """The default against the best run that finished as many jobs (makespan and JCT count
    finished jobs only)."""
    d = runs[DEFAULT]
    done = int(d["jobs_done"])
    peers = [r for r in runs.values() if int(r["jobs_done"]) == done]
    best_m = min(peers, key=lambda r: float(r["makespan_s"]))
    best_j = min(peers, key=lambda r: float(r["mean_jct_s"]))
    row = dict(axes)
    row.update({
        "makespan_ratio": float(d["makespan_s"]) / float(best_m["makespan_s"]),
        "jct_ratio": float(d["mean_jct_s"]) / float(best_j["mean_jct_s"]),
        "best_makespan_run": f"{best_m['policy']}/{'on' if best_m['sharing'] == '1' else 'off'}",
        "best_jct_run": f"{best_j['policy']}/{'on' if best_j['sharing'] == '1' else 'off'}",
        "ooms": int(d["ooms"]), "pressure_ooms": int(d["pressure_ooms"]), "retries": int(d["retries"]),
        "lost_gpu_s": float(d["lost_gpu_s"]), "failed": int(d["failed"]), "impossible": int(d["impossible"]),
        "exclusive_ooms": int(runs[EXCLUSIVE]["ooms"]), "exclusive_failed": int(runs[EXCLUSIVE]["failed"]),
        "jobs_done": done, "most_done": max(int(r["jobs_done"]) for r in runs.values()),
        "memory_util": float(d["mean_memory_util"]),
    })
    return row


def quantile(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * (len(xs) - 1) + 0.5))]


def summarize(rows, title):
    n = len(rows)
    if n == 0:
        return []
    out = [f"### {title}: {n} traces", "",
           "| measure | makespan | mean JCT |", "| --- | ---: | ---: |"]
    for label, f in [("within 3% of the best", lambda xs: f"{sum(x <= 1.03 for x in xs) / n:.0%}"),
                     ("within 10% of the best", lambda xs: f"{sum(x <= 1.10 for x in xs) / n:.0%}"),
                     ("median ratio to the best", lambda xs: f"{quantile(xs, 0.5):.3f}"),
                     ("90th percentile", lambda xs: f"{quantile(xs, 0.9):.3f}"),
                     ("worst", lambda xs: f"{max(xs):.3f}")]:
        out.append(f"| {label} | {f([r['makespan_ratio'] for r in rows])} | {f([r['jct_ratio'] for r in rows])} |")
    more_ooms = [r for r in rows if r["ooms"] > r["exclusive_ooms"]]
    out += ["", f"OOMs: the default {sum(r['ooms'] for r in rows)} (of which from real pressure "
            f"{sum(r['pressure_ooms'] for r in rows)}; retried {sum(r['retries'] for r in rows)}; "
            f"{sum(r['lost_gpu_s'] for r in rows) / 3600:.1f} h of runs lost; failed jobs {sum(r['failed'] for r in rows)}), "
            f"fifo-exclusive {sum(r['exclusive_ooms'] for r in rows)} (failed "
            f"{sum(r['exclusive_failed'] for r in rows)}); the default has more OOMs than fifo-exclusive on "
            f"{len(more_ooms)} of {n} traces. Where the default finished fewer jobs than another run: "
            f"{sum(r['jobs_done'] < r['most_done'] for r in rows)} traces (jobs that no GPU can hold, in every run: "
            f"{sum(r['impossible'] for r in rows)} in all).", ""]
    # Where it loses: the worst traces by either ratio, with their axes.
    worst = sorted(rows, key=lambda r: -max(r["makespan_ratio"], r["jct_ratio"]))[:5]
    out += ["Worst five (makespan / JCT ratio; best runs):", ""]
    for r in worst:
        out.append(f"- {r['family']} {r['index']}: {r['mix']}, gap {r['mean_gap_s']:.0f} s, sharing {r['sharing']}, "
                   f"estimates {r['estimate_error']}, {r['gpus']} GPUs: {r['makespan_ratio']:.3f} / "
                   f"{r['jct_ratio']:.3f} ({r['best_makespan_run']}; {r['best_jct_run']}), OOMs {r['ooms']}")
    by_axis = []
    for axis in ("mix", "sharing", "estimate_error", "gpus", "mean_gap_s"):
        values = sorted({r[axis] for r in rows}, key=lambda v: (isinstance(v, str), v))
        if len(values) < 2:
            continue
        cells = []
        for v in values:
            sel = [r for r in rows if r[axis] == v]
            cells.append(f"{v}: {sum(max(r['makespan_ratio'], r['jct_ratio']) <= 1.03 for r in sel)}/{len(sel)}")
        by_axis.append(f"- {axis}: " + ", ".join(cells))
    if by_axis:
        out += ["", "Traces within 3% on both, by axis:", ""] + by_axis
    return out + [""]


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, key, label in [(axes[0], "makespan_ratio", "makespan"), (axes[1], "jct_ratio", "mean JCT")]:
        for family, style in [("tuning", "-"), ("held-out", "--")]:
            xs = sorted(r[key] for r in rows if r["family"] == family)
            if xs:
                ax.step(xs, [(i + 1) / len(xs) for i in range(len(xs))], style, where="post",
                        label=f"{family} ({len(xs)} traces)")
        ax.axvline(1.03, color="grey", lw=0.8, ls=":")
        ax.axvline(1.10, color="grey", lw=0.8, ls=":")
        ax.set_xlabel(f"default's {label} / best run's")
        ax.set_title(label)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("share of traces at or below")
    axes[0].legend(loc="lower right")
    fig.suptitle("sharing-aware with sharing against the best of 8 runs per trace")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--coloader", default=str(REPO / "build/tools/coloader"))
    ap.add_argument("--traces", type=int, default=120, help="traces drawn from the tuning families")
    ap.add_argument("--held-out", type=int, default=30, help="traces drawn from the held-out family")
    ap.add_argument("--out", type=Path, help="write traces.csv, summary.md and families.png here")
    ap.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1, help="simulations at once")
    ap.add_argument("extra", nargs="*", help="after --: arguments for every coloader simulate")
    args = ap.parse_args()
    if not Path(args.coloader).exists():
        ap.error(f"{args.coloader} does not exist: build it (scripts/build.sh) or pass --coloader")
    draws = [(i, False) for i in range(args.traces)] + [(i, True) for i in range(args.held_out)]
    with tempfile.TemporaryDirectory() as tmp:
        def one(d):
            axes, trace = draw(*d)
            path = Path(tmp) / f"{axes['family']}-{axes['index']}.json"
            path.write_text(json.dumps(trace))
            rows = simulate(args.coloader, path, *args.extra, gpus=axes["gpus"])
            return score(axes, {(r["policy"], r["sharing"]): r for r in rows})

        rows = []
        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            for k, row in enumerate(pool.map(one, draws), 1):
                rows.append(row)
                if k % 10 == 0 or k == len(draws):
                    print(f"placement_families: {k}/{len(draws)} traces", file=sys.stderr)
    flags = " ".join(args.extra) or "none"
    lines = [f"Extra simulate flags: {flags}.", ""]
    lines += summarize([r for r in rows if r["family"] == "tuning"], "Tuning families")
    lines += summarize([r for r in rows if r["family"] == "held-out"], "Held-out family")
    if not rows:
        ap.error("no traces: --traces and --held-out are both 0")
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "summary.md").write_text(text + "\n")
        with open(args.out / "traces.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            for r in rows:
                w.writerow({k: (f"{v:.4f}" if isinstance(v, float) else v) for k, v in r.items()})
        plot(rows, args.out / "families.png")


if __name__ == "__main__":
    main()
