#!/usr/bin/env python3
"""N collocated training jobs on one GPU under MPS, fed by per-job DataLoaders, a TensorSocket
producer, or one coloader producer: throughput, CPU, memory, GPU use, hand-off and fairness.

    benchmarks/collocated/collocated.py --data DIR --out OUT --quick   one device command (< 9 min)
    benchmarks/collocated/collocated.py --data DIR --out OUT --full    the whole matrix (< 30 min)
    benchmarks/collocated/collocated.py --data DIR --out OUT --tiny    a smoke test (N 1 and 2)
    benchmarks/collocated/collocated.py --data DIR --out OUT --gpudecode --shard K/5
                                                                       issue 16's matrix, a fifth at a time
    benchmarks/collocated/collocated.py --report OUT [OUT2 ...]        tables and plots from results.csv

Setups (same files, same cores: every process of a setup runs under taskset on --cores):
  dataloader          each job has its own torch DataLoader (PIL + torchvision, pin_memory);
                      workers per job tuned per N (stated in the output)
  tensorsocket        one TensorSocket 0.0.5 producer wrapping one such DataLoader; jobs are
                      TensorConsumers (CUDA tensors through CUDA IPC)
  coloader            one `coloader serve --device cuda:0` (C++ decode, GPU ring); jobs use
                      coloader.Loader(device="cuda"): each batch copied on the GPU for its job
                      (the default; the figures in docs/ before the job-contract issue were
                      zero-copy views)
  coloader-pyfed      coloader.Producer wrapping the same DataLoader as tensorsocket (host
                      ring); jobs use coloader.Loader() and copy to the GPU: the transport alone
  synthetic           a batch made on the GPU and reused: the ceiling
  synthetic+decode    synthetic jobs while a coloader producer decodes onto the GPU alongside,
                      drained by `coloader consume --device`: the GPU cost of decoding
  synthetic+burn      synthetic jobs beside as many busy loops as a producer has workers
                      (--burn-nice): the cost of CPU load alone, without decoding or GPU work
  synthetic+delay     synthetic jobs whose thread spins --delay-ms before each batch: what a
                      hand-off's CPU time on the job's thread costs, without its data
  coloader-gpudecode, synthetic+gpudecode
                      the same with `--decode gpu` (nvJPEG), run only when `coloader serve
                      --help` lists --decode
  coloader-auto, synthetic+autodecode
                      the same with `--decode auto` (the engines and the CPU split each batch)
  coloader-gpudecode-spin
                      coloader-gpudecode with `--gpu-wait spin` (CUDA's default spinning wait
                      instead of the producer's blocking one): what the wait costs in CPU
Each job (collocated_job.py, beside this file) trains a torchvision ResNet with bf16 autocast
and channels_last, batch 128, RandomResizedCrop 224 + flip + normalise.

Method: the jobs warm up (synthetic steps, then real ones) and print WARM; when all have, a
window of --window seconds is measured. Images = the samples of every step that finished on
the GPU inside the window. CPU = utime+stime of every process the setup started and of all
their descendants, live ones and reaped ones (cutime+cstime), read from /proc at both ends of
the window: core-seconds per 1,000 images; the producer's own CPU also per kind of thread
(/proc/PID/task: cl-worker, cl-gpulane, the session loop, CUDA's), to say where it goes. Host
memory = peak of the summed PSS. GPU memory from nvidia-smi (--query-compute-apps per
process, memory.used for the total above the idle level), GPU utilisation = mean of nvidia-smi samples every 200 ms. next() = time a job spends
in next(loader), p50/p99 over the window (hand-off plus any wait for data). Fairness: a separate
pass runs 4 jobs of different speeds on a small dataset for 2 epochs each and counts the
distinct samples every job received per epoch.
"""
import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import time

from collocated_probes import (all_stats, count_images, cpu_sample, machine_line, say,  # noqa: F401 (the tests' API)
                               thread_cores, thread_cpu, tree)
from collocated_report import read_rows, read_saved, summarise, write_report  # noqa: F401
from collocated_runner import (ALL_SETUPS, COLUMNS, GPU_DECODE, PROFILES, ROOT, Bench, plan,  # noqa: F401
                               run_fairness)


def parse_env(text):
    env = {}
    for item in filter(None, (text or "").split(",")):
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise argparse.ArgumentTypeError(f"--serve-env/--job-env want K=V[,K=V...], got {item!r}")
        env[k] = v
    return env


def parse_workers(text):
    table = {}
    for item in filter(None, (text or "").split(",")):
        n, w = item.split(":")
        table[int(n)] = int(w)
    return table


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    prof = ap.add_mutually_exclusive_group()
    for name in PROFILES:
        prof.add_argument(f"--{name}", dest="profile", action="store_const", const=name)
    prof.add_argument("--report", nargs="+", metavar="OUT", help="only write results.md and plots from OUT/results.csv")
    ap.add_argument("--data", help="ImageFolder dataset (scripts/make_dataset.py)")
    ap.add_argument("--fair-data", help="small dataset for the fairness pass")
    ap.add_argument("--fair-setups", help="comma-separated setups of the fairness pass (profile's by default)")
    ap.add_argument("--out", default="collocated-out")
    ap.add_argument("--binary", default=os.environ.get("COLOADER_BINARY", os.path.join(ROOT, "build", "tools", "coloader")))
    ap.add_argument("--setups", help="comma-separated subset of: " + ", ".join(ALL_SETUPS))
    ap.add_argument("--models", help="comma-separated torchvision models (profile's by default)")
    ap.add_argument("--n", help="comma-separated job counts (profile's by default)")
    ap.add_argument("--repeats", type=int)
    ap.add_argument("--window", type=float, help="measured seconds per configuration")
    ap.add_argument("--warmup", type=int, help="real-data warm-up steps per job")
    ap.add_argument("--synthetic-warmup", type=int, default=5)
    ap.add_argument("--warmup-max-s", type=float, default=4.0, help="warm after this long even if fewer steps (>= 2)")
    ap.add_argument("--deadline", type=float, help="seconds; configurations that would end past it are skipped")
    ap.add_argument("--shard", type=lambda t: tuple(int(x) for x in t.split("/")),
                    help="K/M: run every M-th configuration from the K-th (the device tool allows 10 minutes a "
                         "command); merge the outputs with --report OUT1 OUT2 ...")
    ap.add_argument("--cores", help="cores every setup runs on (default: all but the last)")
    ap.add_argument("--dl-workers", type=parse_workers, help="per-job DataLoader workers by N, e.g. 1:14,2:7,4:3,8:1")
    ap.add_argument("--coloader-flags", default="--output float32", help="extra `coloader serve` flags")
    ap.add_argument("--serve-nice", type=int, default=0, help="run `coloader serve` at this niceness (0-19)")
    ap.add_argument("--burn-nice", type=int, default=0, help="the synthetic+burn setup's busy loops' niceness")
    ap.add_argument("--delay-ms", type=float, default=0.3, help="the synthetic+delay setup's spin before each batch")
    ap.add_argument("--drain-step-ms", type=int, default=0,
                    help="the synthetic+*decode setups' drain sleeps this long per batch (0: as fast as it can), "
                         "so the producer decodes at a job's pace")
    ap.add_argument("--gpu-decode-flags", default="--decode gpu", help="added for the *gpudecode setups")
    ap.add_argument("--serve-env", type=parse_env, default={},
                    help="K=V,K=V: environment of `coloader serve` only (e.g. CUDA_MPS_PIPE_DIRECTORY=EMPTY_DIR: "
                         "the producer outside MPS)")
    ap.add_argument("--job-env", type=parse_env, default={},
                    help="K=V,K=V: environment of the training jobs of the non-synthetic setups only (e.g. "
                         "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=80), so the ceiling stays the plain one")
    ap.add_argument("--gpus", type=int, default=1,
                    help="spread the N jobs over G GPUs (job i on GPU i mod G, CUDA_VISIBLE_DEVICES) and give "
                         "serve one ring per GPU (--device cuda:0,...): N counts all jobs")
    ap.add_argument("--variant", default="",
                    help="a label for --serve-env/--job-env/--gpu-decode-flags: its setups become SETUP@LABEL")
    ap.add_argument("--stage-times", action="store_true",
                    help="COLOADER_STAGE_TIMES=1 for serve: its per-stage timers go into the stage_times column")
    ap.add_argument("--thread-states", action="store_true",
                    help="sample what each producer thread does (running, or which system call) in the window")
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--device", default="cuda", help="cpu: try the harness without a GPU (no MPS)")
    ap.add_argument("--no-mps", dest="mps", action="store_false")
    ap.add_argument("--warm-timeout", type=float, default=60.0)
    ap.add_argument("--fairness-timeout", type=float, default=90.0)
    ap.add_argument("--job-max-s", type=float, default=600.0)
    fairness = ap.add_mutually_exclusive_group()
    fairness.add_argument("--fairness", dest="fairness", action="store_true", default=None, help="run the fairness pass")
    fairness.add_argument("--no-fairness", dest="fairness", action="store_false")
    args = ap.parse_args()

    if args.report:
        rows = read_rows([os.path.join(o, "results.csv") for o in args.report])
        fair, meta = [], {}
        for o in reversed(args.report):  # the first output's meta.json wins
            fair = (read_saved(o, "fairness.json") or []) + fair
            meta = read_saved(o, "meta.json") or meta
        print(write_report(rows, args.report[0], meta, fair))
        return

    args.profile = args.profile or "quick"
    p = PROFILES[args.profile]
    if not args.data or not os.path.isdir(args.data):
        sys.exit(f"collocated: --data {args.data!r} is not a directory; make one with scripts/make_dataset.py")
    if not os.access(args.binary, os.X_OK):
        sys.exit(f"collocated: no coloader binary at {args.binary}; build it or pass --binary (or set COLOADER_BINARY)")
    args.models = args.models.split(",") if args.models else p["models"]
    args.n = [int(x) for x in args.n.split(",")] if args.n else None
    args.repeats = args.repeats or p["repeats"]
    args.window = args.window or p["window"]
    args.warmup = args.warmup or p["warmup"]
    # A shard is one device command, which may last 10 minutes, dataset generation included.
    args.deadline = args.deadline or (min(p["deadline"], 500) if args.shard else p["deadline"])
    args.fairness = p["fairness"] if args.fairness is None else args.fairness
    ncpu = len(os.sched_getaffinity(0))
    all_cores = sorted(os.sched_getaffinity(0))
    args.cores = [int(c) for c in args.cores.split(",")] if args.cores else all_cores[:-1] if ncpu > 2 else all_cores
    args.spare_core = next((c for c in all_cores if c not in args.cores), all_cores[-1])
    help_text = subprocess.run([args.binary, "serve", "--help"], capture_output=True, text=True).stdout
    has_gpu_decode = args.has_gpu_decode = "--decode" in help_text
    if "--gpu-wait" not in help_text and "coloader-gpudecode-spin" in (args.setups or ""):
        sys.exit("collocated: coloader-gpudecode-spin needs a coloader whose serve has --gpu-wait; rebuild it")
    setups = args.setups.split(",") if args.setups else list(p["setups"])
    for s in setups:
        if s not in ALL_SETUPS:
            sys.exit(f"collocated: unknown setup {s!r}; choose from {', '.join(ALL_SETUPS)}")
    skipped_setups = []
    if not has_gpu_decode:
        skipped_setups = [s for s in setups if s in GPU_DECODE]
        setups = [s for s in setups if s not in GPU_DECODE]
    os.makedirs(args.out, exist_ok=True)
    start = time.monotonic()
    bench = Bench(args)
    configs = plan(args, setups, bench)
    if args.shard:
        k, m = args.shard
        configs = configs[k - 1::m]
    images = count_images(args.data)
    scaling = (f"profile {args.profile}: models {','.join(args.models)}, N {args.n or p['ns']}"
               f"{' (resnet50 at N ' + str(p['resnet50_ns']) + ')' if 'resnet50' in args.models and not args.n else ''}, "
               f"{len(setups)} setups, {args.repeats} repeat(s), warm-up {args.synthetic_warmup} synthetic + "
               f"{args.warmup} real steps (or {args.warmup_max_s:.0f} s), window {args.window:.0f} s, deadline "
               f"{args.deadline:.0f} s")
    if skipped_setups:
        scaling += f"; not run: {', '.join(skipped_setups)} (`coloader serve --help` lists no --decode)"
    say(scaling)
    say(f"{len(configs)} configurations; cores {args.cores[0]}-{args.cores[-1]} ({len(args.cores)}) for every setup, "
        f"core {args.spare_core} for this script and nvidia-smi; dataset {args.data}: {images} images")
    dl = ", ".join(f"N={n}: {bench.workers('dataloader', n)}" for n in (args.n or p["ns"]))
    sh = ", ".join(f"N={n}: {bench.workers('coloader', n)}" for n in (args.n or p["ns"]))
    say(f"DataLoader workers per job {dl}; shared producer workers {sh}")
    meta = {"title": f"{args.profile} profile", "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "command": " ".join([os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:]), "profile": args.profile,
            "scaling": scaling, "dataset": f"{args.data}: {images} images",
            "machine": machine_line(ncpu),
            "method": (f"every setup on cores {args.cores[0]}-{args.cores[-1]} ({len(args.cores)} cores, taskset); "
                       f"DataLoader workers per job {dl}; producer workers {sh}; coloader serve flags "
                       f"'{args.coloader_flags}'")}
    with open(os.path.join(args.out, "meta.json"), "w") as f:
        json.dump(meta, f)
    csv_path = os.path.join(args.out, "results.csv")
    rows = []
    fair = []
    if args.mps and args.device == "cuda":
        bench.start_mps()
    try:
        with open(csv_path, "w", newline="") as fcsv:
            writer = csv.DictWriter(fcsv, fieldnames=COLUMNS, extrasaction="ignore")
            writer.writeheader()
            durations, tuned = [], {}
            # The fairness pass runs once the targets' configurations have.
            fair_at = next((i for i, c in enumerate(configs) if c[0] != args.models[0] or c[2] not in (4, 8)),
                           len(configs))
            if args.shard and args.shard[0] != 1:
                fair_at = -1  # the first shard runs the fairness pass
            for i, (model, setup, n, rep, workers) in enumerate(configs):
                if i == fair_at and args.fairness:
                    fair = run_fairness(bench, args, setups)
                    with open(os.path.join(args.out, "fairness.json"), "w") as f:
                        json.dump(fair, f)
                guess = statistics.median(durations) if durations else 20.0
                if time.monotonic() - start + guess * (1.3 if model == "resnet50" else 1.0) > args.deadline:
                    row = dict(model=model, setup=setup, n=n, repeat=rep, status="skipped: past the deadline",
                               workers=f"{workers}/job" if workers else "")
                else:
                    row = bench.run_config(model, setup, n, rep, workers)
                    durations.append(row.get("wall_s", 20.0))
                    if workers and row["status"] == "ok":  # tuning: later repeats use the best so far
                        tuned.setdefault((model, n), {})[workers] = row["agg_img_s"]
                        best = tuned[(model, n)]
                        args.dl_workers = {**(args.dl_workers or {}), n: max(best, key=best.get)}
                    say(f"{model} {setup:<20} N={n}{' w' + str(workers) if workers else ''} r{rep}: " + (
                        f"{row['agg_img_s']:>8,.0f} img/s, CPU {row['cpu_per_1k']} core-s/1k img, "
                        f"GPU {row.get('gpu_util_pct', '-')}%, {row['wall_s']} s" if row["status"] == "ok"
                        else row["status"][:400]))
                rows.append(row)
                writer.writerow(row)
                fcsv.flush()
            if args.fairness and not fair and fair_at >= 0:
                fair = run_fairness(bench, args, setups)
                with open(os.path.join(args.out, "fairness.json"), "w") as f:
                    json.dump(fair, f)
            if tuned:
                kept = ",".join(f"{n}:{args.dl_workers[n]}" for n in sorted(args.dl_workers))
                say(f"DataLoader workers kept (for later shards): --dl-workers {kept}")
    finally:
        bench.stop_mps()
    meta["wall_s"] = round(time.monotonic() - start)
    with open(os.path.join(args.out, "meta.json"), "w") as f:
        json.dump(meta, f)
    report = write_report(read_rows([csv_path]), args.out, meta, fair)
    print(report)
    say(f"done in {time.monotonic() - start:.0f} s; {args.out}/results.csv, results.md, throughput.png, cpu.png, gpu_mem.png")


if __name__ == "__main__":
    main()
