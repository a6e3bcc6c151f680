#!/usr/bin/env bash
# Installs a wheel into a Debian 11 root (glibc 2.31, Python 3.9; made by debootstrap, the oldest
# release these machines reach) and runs it there as a user would (issue 43):
#   pip install into a venv; `coloader --version`; the package's C libraries loaded by Python;
#   the installed `coloader serve` and `coloader consume` over real JPEGs, every image once in
#   each of two epochs; and tests/package/walk_check.py (a Python Loader beside them) where the
#   root has torch (Debian 11's python3-torch, when apt has it).
#
#   scripts/manylinux/old_glibc_check.sh dist/coloader-*-manylinux_2_28_x86_64.whl     (as root)
#
# The root is kept in build-manylinux/bullseye (tests/package/test_glibc_floor.py makes the same one).
set -euo pipefail
source "$(dirname "$0")/../lib/debian_root.sh"
wheel=$(realpath "${1:?usage: old_glibc_check.sh WHEEL}")
[[ $(id -u) -eq 0 ]] || { echo "old_glibc_check: needs root (debootstrap, chroot, mount)" >&2; exit 2; }
debian_root_isolate "$0" "$wheel"
cd "$(dirname "$0")/../.."
repo=$(pwd)
root=$repo/build-manylinux/bullseye
if [[ ! -x $root/usr/bin/env ]]; then
  rm -rf "$root"
  debootstrap --variant=minbase bullseye "$root" http://deb.debian.org/debian >"$repo/build-manylinux/bullseye.log" 2>&1 || {
    tail -20 "$repo/build-manylinux/bullseye.log" >&2
    exit 1
  }
fi
debian_root_enter "$root" 1g
rm -rf "$root/check" && mkdir -p "$root/check"
cp "$wheel" "$root/check/"
cp tests/package/walk_check.py "$root/check/"
/usr/bin/python3 scripts/make_dataset.py --out "$root/check/data" --images 120 --classes 4 --seed 0 >/dev/null
debian_root_env
chroot "$root" /usr/bin/env -i HOME=/root LANG=C.UTF-8 "${DEBIAN_ROOT_ENV[@]}" PATH=/usr/sbin:/usr/bin:/sbin:/bin bash -c '
set -euo pipefail
echo "old_glibc_check: $(ldd --version | head -1)"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3 python3-venv python3-numpy \
  ca-certificates >/dev/null
update-ca-certificates >/dev/null 2>&1
torch=0
if DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-torch >/dev/null 2>&1; then torch=1; fi
rm -rf /root/env
python3 -m venv --system-site-packages /root/env
/root/env/bin/pip install -q /check/coloader-*.whl
/root/env/bin/coloader --version
/root/env/bin/python -c "import coloader; print(\"old_glibc_check: import coloader\", coloader.__version__, \"library\", coloader.library_version())"
cd /tmp
timeout 300 /root/env/bin/coloader serve --data /check/data --name old --batch-size 32 --image-size 64 --epochs 2 --quiet &
serve=$!
out=$(timeout 120 /root/env/bin/coloader consume --name old --batch-size 20 --json)
wait $serve
echo "$out"
[[ $(echo "$out" | grep -c "\"samples\":120,\"unique_samples\":120") -eq 2 ]] || { echo "old_glibc_check: consume did not see every image once in each of two epochs" >&2; exit 1; }
if ((torch)); then
  timeout 600 /root/env/bin/python /check/walk_check.py /root/env /check/data
else
  echo "old_glibc_check: no python3-torch for this release: the Python Loader was not run here"
fi
echo "old_glibc_check: passed"
'
