#!/usr/bin/env python3
"""Makes a mixed job trace for `coloader simulate` (a jobs file with arrival_s, duration_s and
actual_memory_mib per job). Seeded: the same seed gives the same trace.

    python3 scripts/make_trace.py --seed 6 --jobs 90 > examples/trace90.json
    python3 scripts/make_trace.py --seed 11 --jobs 60 --mix 0.65,0.27,0.08 --estimate-error 0.75,1.2

Job classes (shares, and the ranges each field is drawn from uniformly) are set below and
described in docs/PLACEMENT.md. Light jobs (small CNNs) train fast, so their per-job loaders
need many CPU cores; heavy jobs (large models) fill the GPU and read slowly. The estimate is
the real peak times U(0.97, 1.20) (--estimate-error): an estimator biased to overestimate that
still misses by up to 3% now and then, as a measured one does. --mix sets the light/medium/heavy
shares (CARMA's traces: 0.65,0.27,0.08 and 0.83,0.17,0). --sharing says how many jobs read one
dataset: `project` (the five pipelines below), `none` (every job its own dataset: nothing to
share) or `one` (every job the same ImageNet pipeline). scripts/placement_families.py draws
whole families of traces through make_trace().
"""
import argparse
import json
import random

CLASSES = [
    # name, share, memory MiB, SM activity, minutes alone, loader cores, models
    ("light", 0.50, (2500, 9000), (0.15, 0.35), (15, 45), (8, 16), ["resnet18", "mobilenet_v3_large", "efficientnet_b0"]),
    ("medium", 0.35, (12000, 30000), (0.35, 0.60), (40, 120), (8, 14), ["resnet50", "densenet121", "convnext_tiny"]),
    ("heavy", 0.15, (40000, 66000), (0.75, 0.95), (90, 240), (4, 8), ["vit_l_16", "convnext_large", "resnet152"]),
]
PIPELINES = [  # name, share, definition
    ("imagenet", 0.45, {"data": "/data/imagenet/train", "image_size": 224}),
    ("imagenet-160", 0.10, {"data": "/data/imagenet/train", "image_size": 160}),
    ("places", 0.20, {"data": "/data/places365/train", "image_size": 224}),
    ("inat", 0.15, {"data": "/data/inat2021/train", "image_size": 224}),
    ("food", 0.10, {"data": "/data/food101/train", "image_size": 224}),
]
SHARING = ("project", "none", "one")


def pick(rng, items):
    r, acc = rng.random(), 0.0
    for item in items:
        acc += item[1]
        if r < acc:
            return item
    return items[-1]


def make_trace(seed, jobs, mean_gap_s=90.0, cpu_cores=64, mix=None, estimate_error=(0.97, 1.20),
               sharing="project"):
    """The trace as a dict (a jobs file); the same arguments give the same trace."""
    shares = mix if mix is not None else [c[1] for c in CLASSES]
    if len(shares) != len(CLASSES) or abs(sum(shares) - 1) > 1e-6 or min(shares) < 0:
        raise ValueError(f"mix expects {len(CLASSES)} shares >= 0 summing to 1, got {shares!r}")
    err_lo, err_hi = estimate_error
    if not 0 < err_lo <= err_hi:
        raise ValueError(f"estimate_error expects 0 < LO <= HI, got {estimate_error!r}")
    if sharing not in SHARING:
        raise ValueError(f"sharing expects one of {', '.join(SHARING)}, got {sharing!r}")
    classes = [(c[0], share) + c[2:] for c, share in zip(CLASSES, shares)]
    rng = random.Random(seed)
    t, out = 0.0, []
    pipelines = {name: d for name, _, d in PIPELINES} if sharing == "project" else {}
    for i in range(jobs):
        cls, _, mem, sm, minutes, cores, models = pick(rng, classes)
        pipeline = pick(rng, PIPELINES)[0]  # drawn whatever the sharing, so one seed's jobs stay the same
        if sharing == "none":
            pipeline = f"own-{i:03d}"
            pipelines[pipeline] = {"data": f"/data/own/{i:03d}/train", "image_size": 224}
        elif sharing == "one":
            pipeline = PIPELINES[0][0]
            pipelines[pipeline] = PIPELINES[0][2]
        actual = round(rng.uniform(*mem))
        out.append({
            "name": f"{cls}-{i:02d}",
            "command": ["python3", "examples/train.py", "--loader", "coloader", "--name", "{producer}",
                        "--model", rng.choice(models)],
            "pipeline": pipeline,
            "memory_mib": round(actual * rng.uniform(err_lo, err_hi)),
            "actual_memory_mib": actual,
            "sm_activity": round(rng.uniform(*sm), 3),
            "loader_cores": rng.randint(*cores),
            "arrival_s": round(t, 1),
            "duration_s": round(rng.uniform(*minutes) * 60),
        })
        t += rng.expovariate(1.0 / mean_gap_s)
    return {
        "comment": f"make_trace.py --seed {seed} --jobs {jobs} --mean-gap-s {mean_gap_s} "
                   f"--mix {','.join(str(x) for x in shares)} --estimate-error {err_lo},{err_hi} --sharing {sharing}",
        "cpu_cores": cpu_cores,
        "pipelines": pipelines,
        "jobs": out,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=6)
    ap.add_argument("--jobs", type=int, default=90)
    ap.add_argument("--mean-gap-s", type=float, default=90.0, help="mean of the exponential arrival gaps")
    ap.add_argument("--cpu-cores", type=int, default=64)
    ap.add_argument("--mix", default=",".join(str(c[1]) for c in CLASSES),
                    help="shares of light,medium,heavy jobs (summing to 1)")
    ap.add_argument("--estimate-error", default="0.97,1.20", help="the estimate is the real peak times U(LO, HI)")
    ap.add_argument("--sharing", default="project", choices=SHARING,
                    help="how many jobs read one dataset: the project's five pipelines, none, or one for all")
    args = ap.parse_args()
    try:
        shares = [float(x) for x in args.mix.split(",")]
        err = tuple(float(x) for x in args.estimate_error.split(","))
        if len(err) != 2:
            raise ValueError
    except ValueError:
        ap.error(f"--mix expects three numbers and --estimate-error two, got {args.mix!r} and {args.estimate_error!r}")
    try:
        trace = make_trace(args.seed, args.jobs, args.mean_gap_s, args.cpu_cores, shares, err, args.sharing)
    except ValueError as e:
        ap.error(str(e))
    print(json.dumps(trace, indent=1))


if __name__ == "__main__":
    main()
