"""The accounting and the report of benchmarks/collocated/collocated.py, which otherwise runs only
on the GPU machine: CPU time of reaped descendants is counted, a producer's CPU is split by its
threads, the DataLoader's best worker count stands for it, and the targets are judged from the
figures."""
import csv
import importlib.util
import os
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "collocated"))
collocated = pytest.importorskip("collocated")

from support import BINARY  # noqa: E402

BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.4: pass\n"


def test_cpu_of_a_reaped_grandchild_is_counted():
    # The child runs a grandchild that burns 0.4 s of CPU and is reaped, then sleeps until
    # killed: the grandchild is gone from /proc by the second sample, its time is in the
    # child's cutime.
    child = subprocess.Popen([sys.executable, "-c",
                              f"import subprocess, sys, time; subprocess.run([sys.executable, '-c', {BURN!r}]); "
                              "time.sleep(60)"])
    try:
        before = collocated.cpu_sample([child.pid], [child.pid])
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            stats = collocated.all_stats()
            if len(collocated.tree([child.pid], stats)) == 1 and stats[child.pid][2] > 0:
                break  # the grandchild was reaped
            time.sleep(0.05)
        after = collocated.cpu_sample([child.pid], [child.pid])
    finally:
        child.kill()
        child.wait()
    total = after[0] - before[0]
    own = after[1] - before[1]
    assert total >= 0.3, (before, after)
    assert own < total - 0.25  # the job's own time excludes its children


def write_rows(path, rows):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=collocated.COLUMNS, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)


def row(setup, n, agg, cpu, workers="", repeat=0):
    return dict(model="resnet18", setup=setup, n=n, repeat=repeat, status="ok", agg_img_s=agg, cpu_per_1k=cpu,
                workers=workers, gpu_mem_total_gib=3.0 * n)


def test_report_judges_targets_and_keeps_the_best_dataloader(tmp_path):
    rows = [row("dataloader", 4, 2000, 5.0, "3/job"), row("dataloader", 4, 2500, 5.2, "4/job"),
            row("dataloader", 4, 1800, 4.9, "2/job"),
            row("tensorsocket", 4, 5000, 1.6), row("coloader", 4, 14000, 0.5),
            row("coloader", 4, 13000, 0.6, repeat=1), row("coloader", 4, 15000, 0.55, repeat=2),
            row("dataloader", 8, 1900, 4.6, "1/job"), row("tensorsocket", 8, 6000, 1.5),
            dict(row("coloader", 8, 5000, 0.3), producer_threads="cl-worker 3.10; coloader 0.05"),
            dict(model="resnet18", setup="coloader-pyfed", n=8, repeat=0, status="skipped: past the deadline")]
    write_rows(tmp_path / "results.csv", rows)
    summary = collocated.summarise(collocated.read_rows([tmp_path / "results.csv"]))
    dl = summary[("resnet18", "dataloader", 4)]
    assert dl["agg_img_s"][0] == 2500 and dl["workers"] == "4/job"  # the best of the three tried
    assert summary[("resnet18", "coloader", 4)]["agg_img_s"] == (14000, 13000, 15000, 3)  # median, spread

    md = collocated.write_report(collocated.read_rows([tmp_path / "results.csv"]), str(tmp_path), {}, [])
    lines = {l.split("|")[1].strip(): l for l in md.splitlines() if l.startswith("| N=")}
    assert "0.106" in lines["N=4 CPU/1k img, coloader / dataloader"]  # 0.55 / 5.2, of the 4-worker runs
    assert "met" in lines["N=4 CPU/1k img, coloader / tensorsocket"]
    assert "MISSED" in lines["N=8 highest aggregate img/s"]  # tensorsocket 6,000 > coloader 5,000
    assert "skipped: past the deadline" in md
    assert "* coloader N=8: cl-worker 3.10; coloader 0.05" in md  # where the producer's CPU went
    assert (tmp_path / "results.md").stat().st_size > 0
    if importlib.util.find_spec("matplotlib"):  # scripts/setup.sh --bench installs it; CI need not
        for name in ("throughput.png", "cpu.png", "gpu_mem.png"):
            assert (tmp_path / name).stat().st_size > 0


def test_a_producers_cpu_is_split_by_its_named_threads(serve):
    # A real producer: its decode workers are named cl-worker-N, and the harness groups them.
    p = serve(epochs=None)
    before = collocated.thread_cpu(p.proc.pid)
    t0 = time.monotonic()
    consumer = subprocess.run([str(BINARY), "consume", "--name", p.name, "--epochs", "20"],
                              capture_output=True, text=True, timeout=120)
    assert consumer.returncode == 0, consumer.stderr
    after = collocated.thread_cpu(p.proc.pid)
    assert "cl-worker" in after and "coloader" in after, after
    assert not any(name.startswith("cl-worker-") for name in after)  # the number is stripped
    assert after["cl-worker"] > before.get("cl-worker", 0)  # 20 epochs were decoded there
    line = collocated.thread_cores(before, after, time.monotonic() - t0)
    assert line.startswith("cl-worker "), line  # the busiest kind first
