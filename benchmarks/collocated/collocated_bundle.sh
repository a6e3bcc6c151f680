#!/usr/bin/env bash
# Packs, into DIR, what benchmarks/collocated/run_collocated.sh needs on the GPU machine when it
# is run from a checkout that does not have this branch's files: the binaries (scripts/gpu_bundle.sh,
# only the coloader binary and library), the Python package, the benchmark scripts,
# make_dataset.py and the wheels (benchmarks/fetch_wheels.sh). DIR mirrors the repository's
# layout, so that `cd DIR && benchmarks/collocated/run_collocated.sh --tiny` runs there. DIR must
# be git-ignored where it is carried from (e.g. /work/main/.dev-i5 with /.dev-*/ in
# .git/info/exclude).
#
#   benchmarks/collocated/collocated_bundle.sh DIR
set -euo pipefail
cd "$(dirname "$0")/../.."
dest=${1:?usage: benchmarks/collocated/collocated_bundle.sh DIR}
mkdir -p "$dest"
COLOADER_BUNDLE="$dest/.device" COLOADER_BUNDLE_TARGETS="coloader coloader_c" scripts/gpu_bundle.sh
rm -rf "$dest/benchmarks" "$dest/scripts" "$dest/python"
mkdir -p "$dest/benchmarks/collocated" "$dest/scripts/gpu" "$dest/python"
cp benchmarks/collocated/*.py benchmarks/collocated/run_collocated.sh "$dest/benchmarks/collocated/"
cp scripts/make_dataset.py "$dest/scripts/"
cp scripts/gpu/env.sh "$dest/scripts/gpu/"
cp -r python/coloader "$dest/python/"
find "$dest/python" -name __pycache__ -prune -exec rm -rf {} +
[[ -d $dest/.whl ]] || benchmarks/fetch_wheels.sh "$dest/.whl" >/dev/null
du -sh "$dest" | sed 's/^/collocated_bundle: /'
