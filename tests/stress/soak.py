#!/usr/bin/env python3
"""Soak: two real producers serving for --duration seconds while consumers join and leave
every few seconds (random batch sizes; each leaves by itself after 1-3 epochs, or is
SIGKILLed after 2-15 s). Every --interval seconds each producer's resident memory,
open fds and throughput are sampled into a CSV; at the end the samples are plotted (PNG,
with matplotlib where it is installed) and checked:

  exact   every whole epoch any consumer finished had every sample exactly once
  flat    per producer, the open fds once every consumer is gone at the end are no more than
          after a warm-up consumer came and went before the churn (both counted once the
          count settles); the open fds net of attached consumers (2 each: the connection and
          its pidfd) do not grow from the first third of the run to the last (medians: a
          consumer connecting or leaving at the moment of a sample shifts one sample by one);
          RSS over the last third stays within --rss-tolerance of the first third (after the
          first sample)
  alive   both producers served throughout (throughput > 0 in every interval with consumers)

    tests/stress/soak.py --coloader build/tools/coloader --duration 120        # CI
    tests/stress/soak.py --coloader ... --duration 3600 --device cuda:0 --out docs/soak  # GPU
Exit status 0 when every check holds.
"""
import argparse
import csv
import json
import os
import random
import signal
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

PRODUCERS = [("soakA", 16), ("soakB", 8)]
BATCH_SIZES = [1, 4, 7, 8, 16, 24, 32, 50]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--coloader", required=True)
    ap.add_argument("--duration", type=float, default=120)
    ap.add_argument("--interval", type=float, default=10, help="seconds between samples")
    ap.add_argument("--images", type=int, default=211)
    ap.add_argument("--image-size", type=int, default=64)
    ap.add_argument("--max-consumers", type=int, default=3, help="per producer")
    ap.add_argument("--join-every", type=float, default=3, help="mean seconds between joins")
    ap.add_argument("--device", default="")
    ap.add_argument("--rss-tolerance", type=float, default=0.10)
    ap.add_argument("--out", default="soak", help="writes OUT.csv, OUT.png, OUT.json")
    ap.add_argument("--seed", type=int, default=int(time.time()) % 100000)
    ap.add_argument("--keep", action="store_true", help="keep the logs")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    s = harness.Session(os.path.abspath(a.coloader), keep=a.keep)
    data = os.path.join(s.tmp, "data")
    harness.make_dataset(data, a.images, seed=a.seed)
    print(f"soak: seed {a.seed}, {a.duration:.0f} s, samples every {a.interval:.0f} s"
          + (f", logs in {s.logs}" if a.keep else ""), flush=True)

    producers = {}
    for name, batch in PRODUCERS:
        extra = ["--forever", "--batch-size", str(batch), "--image-size", str(a.image_size), "--workers", "2",
                 "--window", "4", "--heartbeat-ms", "100", "--heartbeat-timeout-ms", "2000"]
        if a.device:
            extra += ["--device", a.device]
        producers[name] = s.serve(name + str(os.getpid()), data, extra)
    names = {name: name + str(os.getpid()) for name, _ in PRODUCERS}

    failures = []
    # What each producer holds alone once a consumer has come and gone (ZeroMQ opens some of
    # its fds on the first connection): the baseline the end is held to.
    alone_fds = {}
    for name, proc in producers.items():
        warm = s.spawn(["consume", "--name", names[name], "--json", "--batch-size", "8", "--epochs", "1"],
                       f"{name}-warm-up")
        if warm.wait(60) != 0:
            failures.append(f"{name}: the warm-up consumer ended with {warm.rc}: {warm.stderr()[-400:]!r}")
        alone_fds[name] = settled_alone_fds(s, names[name], proc)
    consumers = []      # (proc, producer, killed, leave_at)
    counts = {"joined": 0, "left_done": 0, "left_killed": 0, "whole_epochs": 0}

    def judge(c):
        p, prod, killed, _ = c
        rc = p.poll()
        ok = rc == 0 or (killed and rc == -signal.SIGKILL)
        if not ok:
            failures.append(f"{p.tag} ended with {rc}: {p.stderr()[-400:]!r}")
        for line in p.stdout().splitlines():
            e = json.loads(line)
            if e["samples"] != e["unique_samples"]:
                failures.append(f"{p.tag}: repeated samples in epoch {e['epoch']}")
            elif not e["partial"]:
                counts["whole_epochs"] += 1
                if e["samples"] != a.images:
                    failures.append(f"{p.tag}: whole epoch {e['epoch']} has {e['samples']} of {a.images}")

    rows = []
    last = {name: (time.monotonic(), 0) for name in producers}
    t0 = time.monotonic()
    next_sample = t0 + a.interval
    next_join = t0
    while time.monotonic() - t0 < a.duration:
        now = time.monotonic()
        if now >= next_join:
            next_join = now + rng.uniform(0.3, 1.7) * a.join_every
            name = rng.choice(list(producers))
            if sum(1 for c in consumers if c[1] == name) < a.max_consumers:
                args = ["consume", "--name", names[name], "--json", "--batch-size", str(rng.choice(BATCH_SIZES))]
                if rng.random() < 0.3:
                    args += ["--wait-for-epoch"]
                leave_at = None
                if rng.random() < 0.5:
                    args += ["--epochs", str(rng.randint(1, 3))]  # leaves by itself
                else:
                    leave_at = now + rng.uniform(2, 15)           # is killed
                if a.device:
                    args += ["--device"]
                consumers.append((s.spawn(args, f"{name}-consume"), name, False, leave_at))
                counts["joined"] += 1
        for c in list(consumers):
            p, name, killed, leave_at = c
            if leave_at is not None and now >= leave_at and p.poll() is None:
                p.signal(signal.SIGKILL)
                p.wait(10)
                consumers[consumers.index(c)] = c = (p, name, True, leave_at)
            if p.poll() is not None:
                judge(c)
                counts["left_killed" if c[2] else "left_done"] += 1
                consumers.remove(c)
        if now >= next_sample:
            next_sample += a.interval
            for name, proc in producers.items():
                if proc.poll() is not None:
                    failures.append(f"producer {name} died: rc {proc.rc}: {proc.stderr()[-600:]!r}")
                    continue
                st = s.status(names[name]) or {}
                rss, anon = harness.rss_kib(proc.pid)
                published = st.get("samples_published", 0)
                t_prev, pub_prev = last[name]
                rate = (published - pub_prev) / (now - t_prev)
                last[name] = (now, published)
                attached = len(st.get("consumers", []))
                rows.append({"t_s": round(now - t0, 1), "producer": name, "rss_kib": rss, "anon_kib": anon,
                             "fds": harness.fd_count(proc.pid), "consumers": attached,
                             "images_per_s": round(rate, 1), "samples_published": published})
                print(f"soak: {rows[-1]}", flush=True)
                if attached and rate <= 0:
                    print(f"soak: {name} made nothing with consumers attached: {json.dumps(st)}", flush=True)
        time.sleep(0.05)

    for c in consumers:
        c[0].signal(signal.SIGKILL)
        c[0].wait(10)
        judge((c[0], c[1], True, None))
    # With every consumer gone, each producer's fds settle back to what it had alone.
    idle_fds = {name: settled_alone_fds(s, names[name], proc) for name, proc in producers.items()}
    for name, proc in producers.items():
        proc.signal(signal.SIGTERM)
        if proc.wait(15) != 0:
            failures.append(f"producer {name} did not stop cleanly: {proc.rc}")
    for name in producers:
        shm, run = s.leftovers(names[name])
        if shm or run:
            failures.append(f"{name} left behind {shm + run}")

    flat = check_flat(rows, a, failures, alone_fds, idle_fds)
    write_outputs(rows, a, counts, flat, failures)
    s.close()
    verdict = "PASS" if not failures else f"FAIL ({len(failures)} problems)"
    for f in failures:
        print("FAIL:", f)
    print(f"soak: {verdict}: {counts}, flat: {json.dumps(flat)}", flush=True)
    return 0 if not failures else 1


def settled_alone_fds(s, name, proc):
    """The producer's open fds once its status lists no consumer and the count stops changing."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (s.status(name) or {}).get("consumers"):
        time.sleep(0.05)
    return harness.settled_fd_count(proc.pid)


def check_flat(rows, a, failures, alone_fds, idle_fds):
    flat = {}
    for name, _ in PRODUCERS:
        r = [x for x in rows if x["producer"] == name][1:]  # the first sample is the warm-up
        if len(r) < 3:
            failures.append(f"{name}: only {len(r)} samples after warm-up; run longer")
            continue
        third = max(1, len(r) // 3)
        first, lastp = r[:third], r[-third:]
        # The median over each third: a consumer connecting or going at the moment of a sample
        # shifts that sample by one fd either way; a leak raises every later sample.
        net = lambda xs: statistics.median(x["fds"] - 2 * x["consumers"] for x in xs)  # noqa: E731
        rss = lambda xs: statistics.median(x["rss_kib"] for x in xs)  # noqa: E731
        flat[name] = {"fds_net_first": net(first), "fds_net_last": net(lastp),
                      "rss_first_kib": rss(first), "rss_last_kib": rss(lastp)}
        flat[name]["fds_alone_at_start"] = alone_fds.get(name)
        flat[name]["fds_alone_at_end"] = idle_fds.get(name)
        if net(lastp) > net(first):
            failures.append(f"{name}: fds net of consumers grew {net(first)} -> {net(lastp)}")
        if idle_fds.get(name) is None or alone_fds.get(name) is None or idle_fds[name] > alone_fds[name]:
            failures.append(f"{name}: {idle_fds.get(name)} fds open at the end with no consumer, "
                            f"{alone_fds.get(name)} alone after the warm-up")
        if rss(lastp) > rss(first) * (1 + a.rss_tolerance) + 4096:
            failures.append(f"{name}: RSS grew {rss(first)} -> {rss(lastp)} KiB")
        idle = [x for x in r if x["consumers"] > 0 and x["images_per_s"] <= 0]
        if idle:
            failures.append(f"{name}: no throughput in {len(idle)} interval(s) with consumers attached")
    return flat


def write_outputs(rows, a, counts, flat, failures):
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out + ".csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["t_s"])
        w.writeheader()
        w.writerows(rows)
    with open(a.out + ".json", "w") as f:
        json.dump({"duration_s": a.duration, "interval_s": a.interval, "device": a.device or "cpu",
                   "counts": counts, "flat": flat, "failures": failures}, f, indent=1)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("soak: matplotlib not installed; no plot", flush=True)
        return
    fig, axes = plt.subplots(3, 1, figsize=(8, 7), sharex=True)
    for name, _ in PRODUCERS:
        r = [x for x in rows if x["producer"] == name]
        t = [x["t_s"] / 60 for x in r]
        axes[0].plot(t, [x["rss_kib"] / 1024 for x in r], marker=".", label=name)
        axes[1].plot(t, [x["fds"] for x in r], marker=".", label=f"{name} fds")
        axes[1].plot(t, [x["consumers"] for x in r], linestyle=":", label=f"{name} consumers")
        axes[2].plot(t, [x["images_per_s"] for x in r], marker=".", label=name)
    axes[0].set_ylabel("RSS (MiB)")
    axes[1].set_ylabel("open fds / consumers")
    axes[2].set_ylabel("images/s")
    axes[2].set_xlabel("minutes")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper right")
    fig.suptitle(f"coloader soak: 2 producers, consumers joining and leaving ({a.device or 'host path'}, "
                 f"{a.duration / 60:.0f} min, {counts['joined']} consumers)", fontsize=10)
    fig.tight_layout()
    fig.savefig(a.out + ".png", dpi=110)
    print(f"soak: wrote {a.out}.csv, {a.out}.json, {a.out}.png", flush=True)


if __name__ == "__main__":
    sys.exit(main())
