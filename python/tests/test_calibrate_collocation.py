"""benchmarks/calibrate_collocation.py recovers the constants of throughputs made by the
simulator's own model, and says so when the CSVs hold nothing to fit."""
import csv
import os
import subprocess
import sys

import pytest

BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks")
sys.path.insert(0, BENCH)
calibrate = pytest.importorskip("calibrate_collocation")


def write_rows(path, rows):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["model", "setup", "n", "status", "agg_img_s"])
        w.writeheader()
        for r in rows:
            w.writerow(r)


def test_fit_recovers_the_interference_of_a_model_made_trace(tmp_path):
    # A model using 0.7 of the GPU alone at 1,000 img/s; its copies saturate it (capacity
    # 1,000 / 0.7) and lose 2% per neighbour on top.
    alone, act, i = 1000.0, 0.7, 0.02
    rows = [{"model": "m", "setup": "synthetic", "n": 1, "status": "ok", "agg_img_s": alone}]
    for n in (2, 3, 4, 6, 8):
        per_job = alone / calibrate.slowdown(n, n * act, i, 1.0)
        rows.append({"model": "m", "setup": "synthetic", "n": n, "status": "ok", "agg_img_s": n * per_job})
    rows.append({"model": "m", "setup": "coloader", "n": 2, "status": "ok", "agg_img_s": 5.0})  # ignored
    path = tmp_path / "runs.csv"
    write_rows(path, rows)
    pts = calibrate.points(calibrate.measured([str(path)]))
    assert len(pts) == 5
    # The activity is read from the highest aggregate, which interference keeps a little below
    # the GPU's capacity: 0.714 for 0.7.
    assert pts[0][2] == pytest.approx(act, rel=0.03)
    best = calibrate.fit_interference(pts, 1.0)
    assert best == pytest.approx(i, abs=0.006)
    assert calibrate.rms_log_error(pts, best, 1.0) < calibrate.rms_log_error(pts, 0.1, 1.0)


def test_no_collocated_rows_is_a_clear_error(tmp_path):
    path = tmp_path / "alone.csv"
    write_rows(path, [{"model": "m", "setup": "synthetic", "n": 1, "status": "ok", "agg_img_s": 100}])
    r = subprocess.run([sys.executable, os.path.join(BENCH, "calibrate_collocation.py"), str(path)],
                       capture_output=True, text=True)
    assert r.returncode != 0
    assert "alone (N=1) and collocated" in r.stderr and "alone.csv" in r.stderr
