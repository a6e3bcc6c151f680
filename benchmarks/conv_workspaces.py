#!/usr/bin/env python3
"""The estimator's table of cuDNN convolution workspaces, from measured allocator histories.

benchmarks/allocation_replay.py keeps, for each ground-truth configuration run on the GPU, the
caching allocator's history of three training steps with every allocation tied to the operator
that made it. This reads those histories (the .npz files, or the tar files they came back in)
and writes, for every convolution layer and batch size of the last step, what the operator
allocated in order: its outputs and the workspaces it allocated and freed before returning
(python/coloader/estimator/workspaces.py reads it; docs/ESTIMATOR.md says why a table).

    /usr/bin/python3 benchmarks/conv_workspaces.py benchmarks/data/allocation_traces_h200.tar
    /usr/bin/python3 benchmarks/conv_workspaces.py TRACE_DIR --out /tmp/table.csv.gz
"""
import argparse
import io
import json
import sys
import tarfile
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))


def histories(paths):
    """(name, npz) of every history in the given .npz files, folders and .tar files."""
    import numpy as np

    for p in map(Path, paths):
        if p.is_dir():
            for f in sorted(p.glob("*.npz")):
                yield f.name, np.load(f)
        elif p.suffix == ".tar":
            with tarfile.open(p) as tar:
                for m in sorted(tar.getmembers(), key=lambda m: m.name):
                    if m.name.endswith(".npz"):
                        yield m.name, np.load(io.BytesIO(tar.extractfile(m).read()))
        else:
            yield p.name, np.load(p)


def main():
    from coloader.estimator import workspaces

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("traces", nargs="+", help=".npz files, folders of them, or the .tar files they came back in")
    ap.add_argument("--out", default=str(workspaces.TABLE))
    args = ap.parse_args()
    measured = defaultdict(lambda: ([], set()))  # Layer -> ([Program], {(model, batch)})
    n_hist = n_conv = 0
    for name, h in histories(args.traces):
        meta = json.loads(str(h["meta"]))
        if not meta["summary"].get("attributed"):
            print(f"{name}: allocations not tied to operators; skipped", file=sys.stderr)
            continue
        last, end = meta["marks"][-2][0], meta["marks"][-1][0]  # the last step's allocation counters
        found = workspaces.measured_programs(meta["names"], h["ops"].tolist(), meta["args"], h["actions"],
                                             h["addrs"], h["sizes"], meta["base"], last, end)
        for layer, prog in found:
            progs, sources = measured[layer]
            progs.append(prog)
            sources.add((meta["model"], int(meta["batch_size"])))
        n_hist += 1
        n_conv += len(found)
    rows = [(layer, workspaces.most_common(progs), sources) for layer, (progs, sources) in measured.items()]
    workspaces.write_table(rows, args.out)
    layers = {workspaces.layer_key(layer) for layer, _, _ in rows}
    with_ws = sum(1 for _, p, _ in rows if p.workspace_bytes())
    print(f"{n_hist} histories, {n_conv} convolution calls: {len(rows)} (layer, batch) entries of {len(layers)} "
          f"layers, {with_ws} with workspaces -> {args.out}")


if __name__ == "__main__":
    main()
