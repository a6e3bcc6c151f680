#!/usr/bin/env bash
# The fresh-machine demo: installs dependencies, builds, makes a small dataset of real photos,
# runs one producer with three consumers (different batch sizes), shows the producer's status
# while they run, checks every consumer saw every image exactly once, and prints the CPU that
# sharing saved against three independent loaders.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh

data=${COLOADER_DEMO_DATA:-/tmp/coloader-demo-data}
if [[ ! -d "$data" ]]; then
  /usr/bin/python3 scripts/make_dataset.py --out "$data" --images 600 --classes 10 --seed 0
fi
bin=build/tools/coloader
export COLOADER_RUN_DIR=$(mktemp -d /tmp/coloader-demo-run.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$COLOADER_RUN_DIR"' EXIT

echo
echo "== one producer, three consumers (batch sizes 64, 100, 32; 60 ms per step), 2 epochs"
$bin serve --data "$data" --name demo --batch-size 64 --epochs 2 --min-consumers 3 2> >(sed 's/^/  producer: /' >&2) &
producer=$!
for b in 64 100 32; do
  # Started with the producer, as jobs launched together are: each waits for it to come up.
  $bin consume --name demo --batch-size "$b" --json --wait-ms 10000 --step-ms 60 > "$COLOADER_RUN_DIR/consumer-$b.json" 2>&1 &
done
sleep 2  # mid-run: each consumer pretends a training step takes 60 ms
$bin status --name demo | sed 's/^/  /' || true
wait

n=$(find "$data" -type f | wc -l)
echo
echo "== what each consumer saw (dataset of $n images)"
for b in 64 100 32; do
  python3 - "$COLOADER_RUN_DIR/consumer-$b.json" "$n" "$b" <<'PY'
import json, sys
path, n, b = sys.argv[1], int(sys.argv[2]), sys.argv[3]
for line in open(path):
    if not line.startswith("{"): print("  ", line.rstrip()); continue
    e = json.loads(line)
    ok = e["samples"] == n and e["unique_samples"] == n and e["index_sum"] == n * (n - 1) // 2
    print(f"  batch {b:>3}: epoch {e['epoch']}: {e['batches']} batches, {e['samples']} samples, "
          f"{e['unique_samples']} distinct, {e['images_per_s']:.0f} images/s  "
          f"{'exactly once' if ok else 'NOT EXACT'}")
PY
done

echo
echo "== CPU: one shared producer vs three independent loaders, same images"
python3 benchmarks/cpu_share.py --data "$data" --consumers 3 --batch-size 64
