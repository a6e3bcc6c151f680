# A Debian root made by debootstrap and entered as a bare machine would be: shared by
# scripts/bare_walk.sh and scripts/manylinux/old_glibc_check.sh. Source it, then
#
#   debian_root_isolate "$0" "$@"   first of all: runs the calling script again in private mount and
#                                   PID namespaces, so that nothing it mounts (nor debootstrap's own
#                                   mounts) reaches this machine's mount table, and nothing it starts
#                                   outlives it, whatever way it ends (an error, Ctrl-C, SIGTERM, or
#                                   unshare killed)
#   debian_root_enter ROOT SHM      mounts /proc and a tmpfs /dev/shm of size SHM in ROOT, and copies
#                                   in this machine's resolv.conf and network trust (below)
#   debian_root_env                 sets DEBIAN_ROOT_ENV: the CA and proxy variables this machine sets,
#                                   as NAME=value words for `env -i`
#
# Mounts made in private namespaces go when the last process in them does: no unmount on exit to
# get right. (An earlier unmount-on-exit trap read its list from a pipeline that `set -e` cut
# short, so it unmounted nothing and left /proc and a read-only bind of the checkout mounted
# inside the CI clone.)

debian_root_isolate() {
  local script=$1
  shift
  [[ -n ${COLOADER_DEBIAN_ROOT_NS:-} ]] && return 0
  if ! command -v unshare >/dev/null; then
    echo "$(basename "$script"): needs unshare (util-linux) for private mount and PID namespaces" >&2
    exit 2
  fi
  # PID 1 of the new namespace is a small shell that runs the script and waits: when it ends,
  # the kernel kills every process left in the namespace. The kernel gives PID 1 only the
  # signals it has a handler for, so it traps INT and TERM (Ctrl-C reaches it with its process
  # group) and ends; --kill-child sends it SIGKILL, which always gets through, when unshare
  # itself is killed. (unshare --fork ignores SIGINT and SIGQUIT, and a shell cannot trap a
  # signal ignored when it started: env --default-signal gives them back.)
  exec unshare --mount --propagation private --pid --fork --kill-child \
    /usr/bin/env --default-signal=INT,QUIT COLOADER_DEBIAN_ROOT_NS=1 \
    "$BASH" -c 'trap "exit 130" INT; trap "exit 143" TERM; "$@" & wait $!' debian-root "$BASH" "$script" "$@"
}

debian_root_enter() {
  local root=$1 shm=$2
  mount -t proc proc "$root/proc"
  mkdir -p "$root/dev/shm"
  mount -t tmpfs -o "size=$shm,mode=1777" tmpfs "$root/dev/shm"  # the host ring lives there
  cp /etc/resolv.conf "$root/etc/resolv.conf"
  # The network's own trust, as a site's machine image carries it: where TLS to the package
  # registries goes through a proxy with a certificate of its own (as on the machines this
  # project is built on), its CA certificates and pip's settings are copied into the root;
  # nothing else of this machine is.
  if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
    mkdir -p "$root/usr/local/share/ca-certificates"
    cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
  fi
  if [[ -f /etc/pip.conf ]]; then cp /etc/pip.conf "$root/etc/pip.conf"; fi
}

debian_root_env() {
  # (The CA variables only where this machine sets them: pip's vendored certifi does not read
  # the system's store. A proxy, where this machine uses one, likewise.)
  DEBIAN_ROOT_ENV=()
  local v
  for v in PIP_CERT REQUESTS_CA_BUNDLE SSL_CERT_FILE SSL_CERT_DIR PIP_DEFAULT_TIMEOUT http_proxy https_proxy \
    no_proxy HTTP_PROXY HTTPS_PROXY NO_PROXY; do
    if [[ -n ${!v:-} ]]; then DEBIAN_ROOT_ENV+=("$v=${!v}"); fi
  done
}
