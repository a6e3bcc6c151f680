#!/usr/bin/env bash
# Host-path (and, with a GPU, device-path) producer throughput of two wheels, run alternately on
# one machine: a change meant to keep behaviour is checked against the build before it.
#
#   scripts/gpu/ab_throughput.sh OLD.whl NEW.whl [ROUNDS]
#
# Each wheel is unpacked (its binary finds its libraries through its RPATH) and measured by
# benchmarks/producer_throughput.py on one ImageNet-like set (AB_IMAGES, default 6000, made from
# .device/photos), old then new (AB_ORDER="new old" swaps them), ROUNDS times (default 2).
# Writes $OUT/ab_throughput.txt.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
old=${1:?usage: ab_throughput.sh OLD.whl NEW.whl [ROUNDS]} new=${2:?usage: ab_throughput.sh OLD.whl NEW.whl [ROUNDS]}
rounds=${3:-2}
out=${OUT:-./out}
mkdir -p "$out"
report=$out/ab_throughput.txt
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for side in old new; do
  whl=${!side}
  mkdir -p "$work/$side"
  python3 -m zipfile -e "$whl" "$work/$side" || { echo "cannot unpack $whl" >&2; exit 1; }
  chmod +x "$work/$side/coloader/bin/coloader"
done
data=/tmp/coloader-ab-${AB_IMAGES:-6000}
if [[ ! -d $data ]]; then  # made aside and moved into place, so a set cut short is never reused
  rm -rf "$data.part"
  python3 scripts/make_dataset.py --source .device/photos --out "$data.part" --images "${AB_IMAGES:-6000}" \
    --classes 100 >"$out/make_dataset.log" 2>&1 && mv "$data.part" "$data" ||
    { echo "cannot make the dataset: $out/make_dataset.log" >&2; exit 1; }
fi
device=()
command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1 && device=(--device cuda:0 --gpu-decode)
{
  echo "# scripts/gpu/ab_throughput.sh $(basename "$old") $(basename "$new") $rounds; $(nproc) cores; $(date -u +%FT%TZ)"
  nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | sed 's/^/# GPU: /'
  echo "# old = $old"
  echo "# new = $new"
} >"$report"
for ((r = 1; r <= rounds; r++)); do
  for side in ${AB_ORDER:-old new}; do
    echo "== $side (round $r)" >>"$report"
    python3 benchmarks/producer_throughput.py --binary "$work/$side/coloader/bin/coloader" --data "$data" \
      --epochs 3 ${device[@]+"${device[@]}"} >>"$report" 2>>"$out/ab_throughput.err" || echo "   failed (see ab_throughput.err)" >>"$report"
  done
done
cat "$report"
