"""benchmarks/collocated/collocated.py's report: results.md (tables, the issue's targets met or missed, where
the producer's CPU went) and the plots, from one or more results.csv."""
import csv
import json
import os
import statistics
import tarfile

from collocated_probes import say
from collocated_runner import ALL_SETUPS, COLUMNS, LOADERS

def read_rows(paths):
    rows = []
    for path in paths:
        with open(path) as f:
            rows += list(csv.DictReader(f))
    return rows


def num(x):
    try:
        return float(x)
    except (TypeError, ValueError):
        return float("nan")


def summarise(rows):
    """{(model, setup, n): {column: (median, min, max, count)}} over the repeats that ran."""
    groups = {}
    for r in rows:
        if r.get("status") == "ok":
            groups.setdefault((r["model"], r["setup"], int(r["n"])), []).append(r)
    out = {}
    for key, rs in groups.items():
        tried = ""
        by_workers = {}
        for r in rs:
            by_workers.setdefault(r.get("workers", ""), []).append(r)
        if key[1] == "dataloader" and len(by_workers) > 1:
            # Workers tuned: the count with the highest median throughput stands for the setup.
            agg = {w: statistics.median(num(r["agg_img_s"]) for r in v) for w, v in by_workers.items()}
            best = max(agg, key=agg.get)
            tried = ", ".join(f"{w}: {agg[w]:,.0f}" for w in sorted(agg, key=lambda w: int(w.split("/")[0])))
            rs = by_workers[best]
        stats = {"tried": tried}
        for c in COLUMNS:
            vals = [num(r.get(c)) for r in rs]
            vals = [v for v in vals if v == v]
            if vals:
                stats[c] = (statistics.median(vals), min(vals), max(vals), len(vals))
        stats["workers"] = rs[0].get("workers", "")
        for col in ("producer_threads", "thread_states", "stage_times"):
            stats[col] = " | ".join(r[col] for r in rs if r.get(col))
        exact = [r.get("epochs_exact") for r in rs if r.get("epochs_exact")]
        stats["epochs_exact"] = "; ".join(exact)
        out[key] = stats
    return out


def fmt(stat, digits=0, spread=True):
    if not stat:
        return "–"
    med, lo, hi, k = stat
    s = f"{med:,.{digits}f}"
    if spread and k > 1:
        s += f" ({lo:,.{digits}f}–{hi:,.{digits}f})"
    return s


def targets(summary, model):
    """Lines of the issue's targets, measured against each other (medians)."""
    def get(setup, n, col):
        st = summary.get((model, setup, n), {}).get(col)
        return st[0] if st else float("nan")

    lines = []
    c, dl, ts = (get(s, 4, "cpu_per_1k") for s in ("coloader", "dataloader", "tensorsocket"))
    ci, dli, tsi = (get(s, 4, "agg_img_s") for s in ("coloader", "dataloader", "tensorsocket"))

    def verdict(ok):
        return "n/a" if ok is None else ("met" if ok else "MISSED")

    def ratio(x, y):
        return x / y if x == x and y == y and y else float("nan")

    r1, r2, r3, r4 = ratio(c, dl), ratio(c, ts), ratio(ci, dli), ratio(ci, tsi)
    lines.append(f"| N=4 CPU/1k img, coloader / dataloader | ≤ 0.25 | {r1:.3f} ({c:.2f} / {dl:.2f} core-s) | "
                 f"{verdict(None if r1 != r1 else r1 <= 0.25)} |")
    lines.append(f"| N=4 CPU/1k img, coloader / tensorsocket | ≤ 0.5 | {r2:.3f} ({c:.2f} / {ts:.2f} core-s) | "
                 f"{verdict(None if r2 != r2 else r2 <= 0.5)} |")
    lines.append(f"| N=4 aggregate img/s, coloader / dataloader | ≥ 1 | {r3:.2f} ({ci:,.0f} / {dli:,.0f}) | "
                 f"{verdict(None if r3 != r3 else r3 >= 1)} |")
    lines.append(f"| N=4 aggregate img/s, coloader / tensorsocket | ≥ 1 | {r4:.2f} ({ci:,.0f} / {tsi:,.0f}) | "
                 f"{verdict(None if r4 != r4 else r4 >= 1)} |")
    at8 = sorted(((get(s, 8, "agg_img_s"), s) for s in LOADERS + ["coloader-gpudecode"]
                  if get(s, 8, "agg_img_s") == get(s, 8, "agg_img_s")), reverse=True)
    if at8:
        ranking = ", ".join(f"{s} {v:,.0f}" for v, s in at8)
        lines.append(f"| N=8 highest aggregate img/s | coloader | {ranking} | "
                     f"{verdict(at8[0][1].startswith('coloader') and at8[0][1] != 'coloader-pyfed')} |")
    return lines


def thread_share(line, kind):
    """Cores of one kind of thread in a producer_threads entry ('cl-gpulane 1.66; ...'), first repeat."""
    for part in line.split(" | ")[0].split("; "):
        name, _, v = part.rpartition(" ")
        if name == kind:
            return float(v)
    return float("nan")


def variant_table(summary, model):
    """The coloader-gpudecode setups (the default and each --variant) at every N measured: throughput,
    its fraction of the synthetic ceiling, the producer's cores (all and per kind of thread), and
    the lane CPU per image from the stage timers."""
    keys = sorted((k for k in summary if k[0] == model and k[1].startswith("coloader-gpudecode")),
                  key=lambda k: (k[2], k[1] != "coloader-gpudecode", k[1]))
    if not keys:
        return []
    lines = ["| setup | N | img/s | of synthetic | producer cores (all; cl-gpulane; cl-worker) | loading CPU core-s/1k img "
             "| lane CPU µs/img | next() p50 µs |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for k in keys:
        st = summary[k]
        ceiling = summary.get((model, "synthetic", k[2]), {}).get("agg_img_s")
        got = st.get("agg_img_s")
        frac = f"{got[0] / ceiling[0]:.2f}" if got and ceiling and ceiling[0] else "–"
        threads = st.get("producer_threads", "")
        shares = [thread_share(threads, kind) for kind in ("cl-gpulane", "cl-worker", "coloader")]
        cores = sum(x for x in shares if x == x) if any(x == x for x in shares) else float("nan")
        stage = st.get("stage_times", "").split(" | ")[0]
        lane = stage.rpartition("= lane CPU ")[2].split(" ")[0] if "= lane CPU" in stage else "–"
        lines.append(f"| {k[1]} | {k[2]} | {fmt(got)} | {frac} | {cores:.2f}; {thread_share(threads, 'cl-gpulane'):.2f}; "
                     f"{thread_share(threads, 'cl-worker'):.2f} | {fmt(st.get('cpu_loading_per_1k'), 2)} | {lane} | "
                     f"{fmt(st.get('next_p50_us'), spread=False)} |")
    return lines


def write_report(rows, out, meta, fair):
    summary = summarise(rows)
    models = sorted({k[0] for k in summary}, key=lambda m: (m != "resnet18", m))
    md = [f"# Collocated training: {meta.get('title', '')}".rstrip(": "), ""]
    for k in ("machine", "date", "command", "profile", "scaling", "dataset", "method"):
        if meta.get(k):
            md.append(f"* **{k}**: {meta[k]}")
    md.append("")
    for model in models:
        md += [f"## {model}", "",
               "| setup | N | aggregate img/s | per-job img/s (min–max) | CPU core-s / 1k img (jobs + loading) "
               "| cores busy | host mem GiB | GPU mem total GiB | GPU MiB/job (nvidia-smi; torch) | producer GPU MiB "
               "| GPU util % | next() p50 / p99 µs | workers | whole epochs exact |",
               "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for (m, setup, n), st in sorted(summary.items(), key=lambda kv: (ALL_SETUPS.index(kv[0][1])
                                                                          if kv[0][1] in ALL_SETUPS else 99, kv[0][2])):
            if m != model:
                continue
            extra = f", producer {fmt(st.get('producer_img_s'))} img/s" if st.get("producer_img_s") else ""
            md.append(
                f"| {setup} | {n} | {fmt(st.get('agg_img_s'))}{extra} | {fmt(st.get('job_img_s_min'), spread=False)}–"
                f"{fmt(st.get('job_img_s_max'), spread=False)} | {fmt(st.get('cpu_per_1k'), 2)} "
                f"({fmt(st.get('cpu_jobs_per_1k'), 2, False)} + {fmt(st.get('cpu_loading_per_1k'), 2, False)}) | "
                f"{fmt(st.get('cores_busy'), 1)} | {fmt(st.get('host_mem_peak_gib'), 1)} | "
                f"{fmt(st.get('gpu_mem_total_gib'), 1)} | {fmt(st.get('gpu_mem_job_mib'), spread=False)}; "
                f"{fmt(st.get('gpu_mem_job_torch_mib'), spread=False)} | {fmt(st.get('gpu_mem_producer_mib'), spread=False)} | "
                f"{fmt(st.get('gpu_util_pct'))} | {fmt(st.get('next_p50_us'), spread=False)} / "
                f"{fmt(st.get('next_p99_us'), spread=False)} | {st.get('workers', '')} | {st.get('epochs_exact', '')} |")
        tuned = [f"N={k[2]}: {st['tried']}" for k, st in sorted(summary.items(), key=lambda kv: kv[0][2])
                 if k[0] == model and st.get("tried")]
        if tuned:
            md += ["", "DataLoader workers per job tried (median aggregate img/s; the best is in the table): "
                   + "; ".join(tuned)]
        threads = [f"* {k[1]} N={k[2]}: {st['producer_threads']}" for k, st in
                   sorted(summary.items(), key=lambda kv: (kv[0][1], kv[0][2]))
                   if k[0] == model and st.get("producer_threads")]
        if threads:
            md += ["", "Where the producer's CPU went (cores per kind of thread over the window; one entry per "
                   "repeat; cl-worker: reading, decoding, augmenting; cl-gpulane: nvJPEG and the GPU kernels; "
                   "coloader: the session loop):", ""] + threads
        for col, what in (("stage_times", "The producer's stage timers (pipeline/stage_times.h; the whole run, warm-up "
                                          "included): CPU/wall µs per image of each stage; one entry per repeat"),
                          ("thread_states", "What the producer's threads did in the window (sampled every 10 ms: "
                                            "running, or the system call it waited in)")):
            found = [f"* {k[1]} N={k[2]}: {st[col]}" for k, st in sorted(summary.items(), key=lambda kv: (kv[0][1], kv[0][2]))
                     if k[0] == model and st.get(col)]
            if found:
                md += ["", what + ":", ""] + found
        variants = variant_table(summary, model)
        if variants:
            md += ["", f"GPU-decode variants side by side ({model}; fraction = of the synthetic ceiling at the same N):",
                   ""] + variants
        md += ["", f"Targets ({model}, medians of the same run):", "",
               "| target | wanted | measured | |", "| --- | --- | --- | --- |"] + targets(summary, model) + [""]
    errors = [r for r in rows if r.get("status") != "ok"]
    if errors:
        md += ["Configurations that failed or were skipped:", ""]
        md += [f"* {r['model']} {r['setup']} N={r['n']} repeat {r['repeat']}: {r['status'][:300]}" for r in errors]
        md.append("")
    if fair:
        md += ["## Fairness: samples per epoch", "",
               "4 jobs of different speeds (ResNet-18 plus a sleep of 0, 20, 40, 60 ms per step), 2 epochs of a "
               "small dataset; per job, per complete epoch: samples received / distinct samples "
               "(the dataset has the number in the second column).", "",
               "| setup | dataset | job 0 | job 1 | job 2 | job 3 | every epoch exact |", "| --- | ---: | --- | --- | --- | --- | --- |"]
        for f in fair:
            cells = [" ".join(f"{s}/{d}" for s, d in j) or "–" for j in f["jobs"]] + ["–"] * (4 - len(f["jobs"]))
            exact = all(j and all(s == d == f["expected"] for s, d in j) for j in f["jobs"]) and len(f["jobs"]) == 4
            md.append(f"| {f['setup']} | {f['expected']} | " + " | ".join(cells[:4]) +
                      f" | {'yes' if exact else 'NO'}{' (' + f['error'][:200] + ')' if f.get('error') else ''} |")
        md.append("")
    with open(os.path.join(out, "results.md"), "w") as fh:
        fh.write("\n".join(md) + "\n")
    if models:
        plot(summary, models, out)
    return "\n".join(md)


def plot(summary, models, out):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        say("matplotlib is missing: no plots")
        return
    charts = [("agg_img_s", "aggregate training images/s", "throughput.png"),
              ("cpu_per_1k", "CPU core-seconds per 1,000 images", "cpu.png"),
              ("gpu_mem_total_gib", "GPU memory in use, GiB (nvidia-smi, above idle)", "gpu_mem.png")]
    for col, label, name in charts:
        fig, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 4.2), squeeze=False)
        for ax, model in zip(axes[0], models):
            for setup in ALL_SETUPS:
                pts = sorted((n, st[col]) for (m, s, n), st in summary.items() if m == model and s == setup and col in st)
                if col == "cpu_per_1k" and setup.startswith("synthetic"):
                    continue
                if not pts:
                    continue
                xs = [n for n, _ in pts]
                ys = [v[0] for _, v in pts]
                err = [[v[0] - v[1] for _, v in pts], [v[2] - v[0] for _, v in pts]]
                style = "--" if setup.startswith("synthetic") else "-"
                ax.errorbar(xs, ys, yerr=err, marker="o", linestyle=style, capsize=3, label=setup)
            ax.set_xscale("log", base=2)
            ax.set_xticks([1, 2, 4, 8])
            ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
            ax.set_xlabel("collocated jobs N (one GPU, MPS)")
            ax.set_ylabel(label)
            ax.set_title(model)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(os.path.join(out, name), dpi=110)
        plt.close(fig)


def read_saved(out, name):
    """OUT/name as JSON, or ./name from OUT/runs.tar.gz (where run_collocated.sh packs it)."""
    path = os.path.join(out, name)
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    tarball = os.path.join(out, "runs.tar.gz")
    if os.path.exists(tarball):
        with tarfile.open(tarball) as tar:
            try:
                return json.load(tar.extractfile("./" + name))
            except KeyError:
                return None
    return None
