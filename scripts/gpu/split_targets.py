#!/usr/bin/env python3
"""Issue 24's targets against collocated.py results.csv files (the split suite of scripts/gpu.sh):
per model and N, --decode auto (coloader-auto) beside gpu (coloader-gpudecode) and cpu
(coloader), each as a fraction of the synthetic ceiling of the same run, with the whole machine's
busy cores and the producer's cores per 10k img/s; each target marked met or missed.

  scripts/gpu/split_targets.py results.csv [results2.csv ...]

Targets (ResNet-18 unless said): 1 job >= 0.95 of the ceiling on at most half the machine cores
--decode cpu needs for its result; 2 and 4 jobs >= 0.97 with the producer <= 0.5 core per 10k
img/s; auto never more than 3% below the better of cpu and gpu, on fewer cores than cpu; ResNet-50
no worse than gpu (today's default). Where repeats ran, the median of each setup is used."""
import csv
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from decode_targets import mark, producer_cores  # noqa: E402

SETUPS = {"auto": "coloader-auto", "gpu": "coloader-gpudecode", "cpu": "coloader"}


def medians(paths):
    """{(model, setup, n): {'img_s', 'machine', 'producer'}}: medians over the repeats that ran."""
    groups = {}
    for p in paths:
        for r in csv.DictReader(open(p)):
            if r.get("status") == "ok" and not r.get("variant"):
                groups.setdefault((r["model"], r["setup"], int(r["n"])), []).append(r)
    out = {}
    for key, rs in groups.items():
        med = lambda f: statistics.median(f(r) for r in rs)
        out[key] = {"img_s": med(lambda r: float(r["agg_img_s"] or 0)),
                    "machine": med(lambda r: float(r["cores_busy"] or 0)),
                    "producer": med(lambda r: producer_cores(r.get("producer_threads"))),
                    "repeats": len(rs)}
    return out


def others(paths, m):
    """The rows beside the targets' (a --variant, synthetic+burn): one line each, as a fraction of
    the ceiling at the same model and N, with what says where the time went."""
    lines = []
    for p in paths:
        for r in csv.DictReader(open(p)):
            if r.get("status") != "ok" or (not r.get("variant") and r["setup"] in list(SETUPS.values()) + ["synthetic"]):
                continue
            ceiling = m.get((r["model"], "synthetic", int(r["n"])))
            frac = float(r["agg_img_s"] or 0) / ceiling["img_s"] if ceiling and ceiling["img_s"] else float("nan")
            lines.append(f"| {r['model']} | {r['n']} | {r['setup']} | {float(r['agg_img_s'] or 0):,.0f} | {frac:.2f} "
                         f"| {float(r['cores_busy'] or 0):.1f} | {r.get('next_p50_us') or '-'} |")
    if lines:
        print()
        print("Beside the targets (variants and probes, each against the same ceiling):")
        print()
        print("| model | N | setup | img/s | of ceiling | machine cores | next() p50 µs |")
        print("| --- | ---: | --- | ---: | ---: | ---: | ---: |")
        print("\n".join(lines))


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    m = medians(sys.argv[1:])
    print("| model | N | ceiling img/s | auto: of ceiling, machine cores, producer cores/10k img/s | gpu: the same "
          "| cpu: the same | targets |")
    print("| --- | ---: | ---: | --- | --- | --- | --- |")
    for model, n in sorted({(k[0], k[2]) for k in m}, key=lambda k: (k[0] != "resnet18", k)):
        ceiling = m.get((model, "synthetic", n))
        if not ceiling or not ceiling["img_s"]:
            continue
        row = {name: m.get((model, setup, n)) for name, setup in SETUPS.items()}

        def cell(r):
            if not r:
                return "-"
            per10k = r["producer"] / (r["img_s"] / 10000) if r["img_s"] else float("nan")
            return f"{r['img_s'] / ceiling['img_s']:.2f}, {r['machine']:.1f}, {per10k:.2f}"

        marks = []
        a, g, c = row["auto"], row["gpu"], row["cpu"]
        if a:
            frac = a["img_s"] / ceiling["img_s"]
            if model == "resnet18" and n == 1:
                marks.append(f">= 0.95 {mark(frac >= 0.95)}")
                if c:
                    marks.append(f"<= half cpu's cores {mark(a['machine'] <= 0.5 * c['machine'])}")
            if model == "resnet18" and n in (2, 4):
                marks.append(f">= 0.97 {mark(frac >= 0.97)}")
                per10k = a["producer"] / (a["img_s"] / 10000) if a["img_s"] else float("inf")
                marks.append(f"producer <= 0.5/10k {mark(per10k <= 0.5)}")
            best = max((r["img_s"] for r in (g, c) if r), default=0)
            if best:
                marks.append(f"within 3% of the best {mark(a['img_s'] >= 0.97 * best)}")
            if c and a["img_s"] >= 0.97 * c["img_s"]:
                marks.append(f"fewer cores than cpu {mark(a['machine'] < c['machine'])}")
            if model == "resnet50" and g:
                marks.append(f"no worse than gpu {mark(a['img_s'] >= 0.97 * g['img_s'])}")
        print(f"| {model} | {n} | {ceiling['img_s']:,.0f} | {cell(a)} | {cell(g)} | {cell(c)} | {'; '.join(marks)} |")
    others(sys.argv[1:], m)
    reps = sorted({v["repeats"] for v in m.values()})
    print()
    print(f"Repeats per setup: {', '.join(map(str, reps))} (medians where more than one).")


if __name__ == "__main__":
    main()
