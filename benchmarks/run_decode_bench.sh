#!/usr/bin/env bash
# Decode + augment cost per core: coloader's SampleTransform (as shipped: DCT scaling and only
# the crop's region decoded; without the region decode; with neither) against PIL +
# torchvision, on the same files, each pinned to the same single core.
#
#   benchmarks/run_decode_bench.sh DATASET_DIR [extra flags for both, e.g. --limit 1000 --passes 2]
#
# Environment: DECODE_BENCH  the decode_bench binary (default build/benchmarks/decode_bench)
#              PYTHON        a Python with Pillow, torch, torchvision (default /usr/bin/python3)
#              CPU           the core to pin to (default: the last one)
# Make a dataset first with scripts/make_dataset.py (real photographs, ImageNet-like sizes).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
if [[ $# -lt 1 ]]; then
  sed -n '2,10p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
  exit 2
fi
data="$1"
shift
bench="${DECODE_BENCH:-$root/build/benchmarks/decode_bench}"
python="${PYTHON:-/usr/bin/python3}"
cpu="${CPU:-$(($(nproc) - 1))}"
[[ -x "$bench" ]] || { echo "run_decode_bench: $bench not found: build it (cmake --build build --target decode_bench) or set DECODE_BENCH" >&2; exit 1; }
[[ -d "$data" ]] || { echo "run_decode_bench: $data is not a directory: make one with scripts/make_dataset.py" >&2; exit 1; }

out="$(mktemp)"
trap 'rm -f "$out"' EXIT
echo "run_decode_bench: $(find "$data" -type f | wc -l) files under $data, pinned to CPU $cpu" >&2
taskset -c "$cpu" "$bench" "$data" "$@" >>"$out"
taskset -c "$cpu" "$python" "$here/pil_decode_bench.py" "$data" "$@" >>"$out"

"$python" - "$out" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
pil = next((r for r in rows if r["impl"].startswith("pil")), None)
print(f"{'pipeline (1 core, %s %d, float32 NCHW)' % (rows[0]['mode'], rows[0]['size']):<46}{'images/s':>10}{'ms/image':>10}{'vs PIL':>8}{'errors':>8}")
for r in rows:
    name = {"dct_region": "coloader, DCT scaling + crop's region only",
            "dct": "coloader, DCT scaling, whole image", "no_dct": "coloader, whole image, full size",
            "pil": "PIL + torchvision transforms"}.get(r["config"], r["config"])
    ratio = f"{r['images_per_s'] / pil['images_per_s']:.2f}x" if pil else "-"
    print(f"{name:<46}{r['images_per_s']:>10.1f}{1000 / r['images_per_s']:>10.2f}{ratio:>8}{r['errors']:>8}")
for r in rows:
    if "scale_hist" in r:
        h = r["scale_hist"]
        total = sum(h.values()) or 1
        print(f"DCT scale histogram ({r['config']}): " +
              ", ".join(f"1/{d}: {n} ({100 * n / total:.0f}%)" for d, n in h.items()))
PY
