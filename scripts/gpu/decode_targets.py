#!/usr/bin/env python3
"""Issue 16's targets against a collocated.py results.csv (scripts/gpu.sh decode-profile and
decode-x2 suites of scripts/gpu.sh): for every coloader-gpudecode row, its fraction of the synthetic ceiling at
the same model and N, the whole machine's busy cores, the producer's cores (its threads, summed)
and those per 10k images/s, each target marked met or missed.

  scripts/gpu/decode_targets.py results.csv [--gpus G]

With --gpus G the N jobs were spread over G GPUs (job i on GPU i mod G): the slowest and fastest
job are shown against the ceiling's, since each GPU's fraction is its jobs' against its own."""
import argparse
import csv

FRACTION_1JOB = 0.95     # 1 job (or every GPU, with --gpus): of the synthetic ceiling
MACHINE_1JOB = 1.5       # whole-machine cores with 1 job
PRODUCER_PER_10K = 0.5   # producer cores per 10k img/s


def producer_cores(threads):
    """'cl-gpulane 0.88; cl-worker 0.23; ...' -> 1.11"""
    total = 0.0
    for part in filter(None, (p.strip() for p in (threads or "").split(";"))):
        try:
            total += float(part.rsplit(" ", 1)[1])
        except (IndexError, ValueError):
            pass
    return total


def mark(ok):
    return "met" if ok else "**missed**"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("--gpus", type=int, default=1)
    a = ap.parse_args()
    rows = [r for r in csv.DictReader(open(a.csv)) if r.get("status") == "ok"]
    ceiling = {(r["model"], r["n"]): r for r in rows if r["setup"] == "synthetic"}
    print(f"Targets: 1 job >= {FRACTION_1JOB} of the ceiling{' (every GPU)' if a.gpus > 1 else ''}; whole machine "
          f"with 1 job <= {MACHINE_1JOB} cores; producer <= {PRODUCER_PER_10K} core per 10k img/s.")
    print()
    print("| model | setup | N | img/s | of ceiling | jobs min/max of the ceiling's | machine cores | producer cores "
          "| producer cores per 10k img/s | targets |")
    print("| --- | --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | --- |")
    for r in rows:
        if not r["setup"].startswith("coloader-gpudecode"):
            continue
        c = ceiling.get((r["model"], r["n"]))
        got = float(r["agg_img_s"] or 0)
        frac = got / float(c["agg_img_s"]) if c and float(c["agg_img_s"] or 0) else None
        spread = "-"
        if c and float(c["job_img_s_median"] or 0):
            cm = float(c["job_img_s_median"])
            spread = f"{float(r['job_img_s_min']) / cm:.2f}/{float(r['job_img_s_max']) / cm:.2f}"
        prod = producer_cores(r.get("producer_threads"))
        per10k = prod / (got / 10000) if got else None
        machine = float(r["cores_busy"] or 0)
        marks = []
        one_job = int(r["n"]) == 1 or a.gpus > 1  # the 1-job target; on several GPUs every row (1 or 2 per GPU)
        if frac is not None and one_job:
            marks.append(f"fraction {mark(frac >= FRACTION_1JOB)}")
        if int(r["n"]) == 1:
            marks.append(f"machine {mark(machine <= MACHINE_1JOB)}")
        if per10k is not None:
            marks.append(f"producer {mark(per10k <= PRODUCER_PER_10K)}")
        print(f"| {r['model']} | {r['setup']} | {r['n']} | {got:,.0f} | {'-' if frac is None else f'{frac:.2f}'} | "
              f"{spread} | {machine:.2f} | {prod:.2f} | {'-' if per10k is None else f'{per10k:.2f}'} | "
              f"{'; '.join(marks)} |")


if __name__ == "__main__":
    main()
