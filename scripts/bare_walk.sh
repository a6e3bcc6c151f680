#!/usr/bin/env bash
# The README's install on a bare machine (issue 43), a step of CI: a Debian 12 root made by
# debootstrap (minbase: no git, no compiler, no pip, no torch), git installed in it (the one thing
# a user needs to have a clone), a fresh clone of this repository's HEAD, then
#   1. the commands between the README's "bare-walk" marks, verbatim, as root;
#   2. scripts/make_dataset.py: 120 real-photo JPEGs;
#   3. tests/package/walk_check.py with the venv's Python: the installed `coloader serve`,
#      `coloader consume` and a Python Loader started at one moment, every image once an epoch.
#
#   scripts/bare_walk.sh          (as root: debootstrap, chroot, mount)
#
# The root is made afresh each run under WALK_DIR (default build-walk/, git-ignored), in private
# mount and PID namespaces (scripts/lib/debian_root.sh): its mounts and processes end with the
# script. A walk that passes removes the root (WALK_KEEP=1 keeps it); one that fails leaves it to
# look into. WALK_MIRROR: the Debian mirror (default deb.debian.org).
set -euo pipefail
source "$(dirname "$0")/lib/debian_root.sh"
start=$SECONDS
if [[ $(id -u) -ne 0 ]]; then
  echo "bare_walk: needs root (debootstrap, chroot and mount); run it with sudo" >&2
  exit 2
fi
if ! command -v debootstrap >/dev/null; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
fi
debian_root_isolate "$0" "$@"
cd "$(dirname "$0")/.."
repo=$(pwd)

# The README's lines, as written (between the marks, inside the fence).
if [[ $(grep -c '<!-- bare-walk: begin -->' README.md) -ne 1 || $(grep -c '<!-- bare-walk: end -->' README.md) -ne 1 ]]; then
  echo "bare_walk: README.md must have one <!-- bare-walk: begin --> and one <!-- bare-walk: end --> mark" >&2
  exit 1
fi
steps=$(sed -n '/<!-- bare-walk: begin -->/,/<!-- bare-walk: end -->/p' README.md | sed '/^<!--/d; /^```/d')
if [[ -z ${steps//[[:space:]]/} ]]; then
  echo "bare_walk: README.md has no commands between <!-- bare-walk: begin --> and <!-- bare-walk: end -->" >&2
  exit 1
fi

dir=$(realpath -m "${WALK_DIR:-build-walk}")
root=$dir/root
if [[ $dir == / || $dir == "$HOME" ]]; then
  echo "bare_walk: WALK_DIR=$dir would put the root where it must not be removed" >&2
  exit 2
fi
rm -rf --one-file-system "$root"
mkdir -p "$dir"

echo "bare_walk: debootstrap --variant=minbase bookworm $root"
if ! timeout 1200 debootstrap --variant=minbase bookworm "$root" "${WALK_MIRROR:-http://deb.debian.org/debian}" \
    >"$dir/debootstrap.log" 2>&1; then
  tail -20 "$dir/debootstrap.log" >&2
  echo "bare_walk: debootstrap failed (the whole log: $dir/debootstrap.log)" >&2
  exit 1
fi
mkdir -p "$root/src"
debian_root_enter "$root" 2g
mount --bind -o ro "$repo" "$root/src"
echo "bare_walk: root ready in $((SECONDS - start)) s; the README's lines:"
echo "$steps" | sed 's/^/  | /'

# A clean environment, as a login on the bare machine would have.
debian_root_env
# (The whole walk is bounded: the build and the apt packages are most of it, ~6 min here.)
timeout 2400 chroot "$root" /usr/bin/env -i HOME=/root LANG=C.UTF-8 TERM=dumb "${DEBIAN_ROOT_ENV[@]}" \
  PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  bash -c '
set -euo pipefail
step() { echo "bare_walk: [$((SECONDS))s] $*"; }
step "apt-get install git (all a user needs for a clone)"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends git ca-certificates >/dev/null
update-ca-certificates >/dev/null 2>&1  # (ca-certificates took in the network'"'"'s own, above)
git -c safe.directory="*" clone -q /src /root/coloader  # (a checkout another user owns, under sudo)
cd /root/coloader
step "the README, verbatim"
bash -euo pipefail -x -c "$1"
step "a data set of real photos (the walk'"'"'s own test data: scripts/make_dataset.py reads mate-backgrounds)"
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends mate-backgrounds python3-pil >/dev/null
~/coloader-env/bin/python scripts/make_dataset.py --out /tmp/walk-data --images 120 --classes 4 --seed 0
step "serve, consume and a Python Loader, started at once"
cd /tmp && timeout 600 ~/coloader-env/bin/python /root/coloader/tests/package/walk_check.py ~/coloader-env /tmp/walk-data
' bare-walk "$steps"
echo "bare_walk: passed in $((SECONDS - start)) s"
if [[ -z ${WALK_KEEP:-} ]]; then
  umount -l "$root/src" "$root/dev/shm" "$root/proc"  # (-l: a straggler still in the root)
  rm -rf --one-file-system "$root"
fi
