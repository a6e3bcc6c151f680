#!/usr/bin/env bash
# A real, throw-away Slurm cluster on this one machine, for coloader's Slurm test.
#
#   tests/slurm/cluster.sh start [--nodes N]   bring it up; returns when every node is idle
#   tests/slurm/cluster.sh status              daemons and node states
#   tests/slurm/cluster.sh stop                cancel jobs, stop daemons, remove the state
#
# Debian's slurm-wlm (slurmctld, slurmd) and munge, installed here when missing, run as root
# with everything they write under one state directory: $SLURM_TEST_DIR, default
# /var/tmp/coloader-slurm. After `start`, `source $SLURM_TEST_DIR/env` points sbatch, srun,
# squeue, ... at this cluster (SLURM_CONF) and nothing else on the machine is touched.
#
# Nodes: two ways to run N slurmd on one machine, SLURM_TEST_ISOLATION=ns|host (auto: ns where
# namespaces can be made, else host).
#
# ns: every node is a slurmd in namespaces of its own, so that N nodes share one machine and
# still look like N machines to Slurm and to coloader:
#   - network: its own IP on a private bridge (10.77.0.0/24 by default), so each slurmd has
#     its own address and port, as on a cluster;
#   - UTS: its hostname is its NodeName;
#   - mount: a private /tmp and /dev/shm (a node's producer and consumers meet there, as they
#     would in a node's local /tmp and /dev/shm; two nodes' producers of the same name do not
#     collide) and an /etc/hosts naming the cluster; everything else, this state directory,
#     the build and the dataset included, is shared, like a cluster's shared file system;
#   - PID: the node's processes die with it, so `stop` leaves no job step behind.
#
# host: Slurm's own multiple-slurmd mode (Debian builds it: `scontrol show config` says
# MULTIPLE_SLURMD = Yes): every slurmd in this machine's namespaces, told apart by
# `slurmd -N NAME` and a port of its own. The nodes then share /tmp and /dev/shm, so a
# TaskProlog gives each node's tasks their own COLOADER_RUN_DIR and TMPDIR, which is what a
# node-local /tmp gives them on a cluster. See docs/SLURM_NOTES.md.
#
# Exit codes (the test's contract):
#   0   done
#   77  Slurm cannot run here; one line on stderr, "SKIP: <reason>", says why (not root, no
#       package, a daemon that will not start, a node that never becomes idle, ...)
#   1   it started but misbehaves (start runs a first job on every node: `srun printenv`),
#       or anything else went wrong (status: the cluster is not up)
#   2   usage
# Functions called only through wait_for look unreachable to shellcheck.
# shellcheck disable=SC2317
set -euo pipefail

SELF=$(readlink -f "$0")
DIR=${SLURM_TEST_DIR:-/var/tmp/coloader-slurm}
SUBNET=${SLURM_TEST_SUBNET:-10.77.0}          # /24 for the namespaced nodes; .1 is the controller
# slurmctld listens on PORT_BASE, namespaced slurmd on PORT_BASE+1, host-mode slurmd on
# PORT_BASE+2+i (node ni).
PORT_BASE=${SLURM_TEST_PORT_BASE:-16817}
ISOLATION=${SLURM_TEST_ISOLATION:-auto}
BRIDGE=clslurm0                               # at most 15 characters (IFNAMSIZ)
NS_PREFIX=clslurm-
# The bridge and namespace names are the machine's, not the state directory's: this file says
# which test cluster made them, so that one cluster's stop never takes down another's nodes.
NET_OWNER=/run/coloader-slurm-test.net
# In a state directory we made; nothing else is ever removed.
OURS=.coloader-slurm-test
# Marks every process this cluster starts (daemons, and through them job steps), so that
# `stop` can find and end exactly those by pid, whatever happened to the pid files.
MARK="COLOADER_SLURM_CLUSTER=$DIR"

log() { echo "cluster: $*" >&2; }
skip() { echo "SKIP: $*" >&2; exit 77; }
die() { echo "cluster: error: $*" >&2; exit 1; }

# wait_for SECONDS WHAT COMMAND...: polls COMMAND every 0.2 s until it succeeds; 1 on timeout.
wait_for() {
  local secs=$1 what=$2; shift 2
  local deadline=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS >= deadline)); then
      log "gave up after ${secs}s waiting for $what"
      return 1
    fi
    sleep 0.2
  done
}

# The last meaningful line of a log, for a one-line SKIP reason.
last_line() { [[ -f $1 ]] && grep -v '^\s*$' "$1" | tail -n 1 | cut -c1-300 || echo "(no log $1)"; }

# ---------------------------------------------------------------------------------------------
# Packages

install_packages() {
  local need=()
  for cmd in slurmctld slurmd sbatch munged mungekey; do command -v "$cmd" >/dev/null || need=(slurm-wlm munge); done
  ((${#need[@]})) || return 0
  log "installing ${need[*]} (apt)"
  # The packages' maintainer scripts would start the system's own munged/slurmd/slurmctld;
  # a policy-rc.d that says no keeps them stopped (containers usually have one already).
  local policy=/usr/sbin/policy-rc.d made_policy=0
  if [[ ! -e $policy ]]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy" && made_policy=1
  fi
  local out rc=0
  # DPkg::Lock::Timeout: another apt run (scripts/setup.sh) may hold the lock; wait for it.
  out=$(DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq \
          --no-install-recommends "${need[@]}" 2>&1) || rc=$?
  if ((rc != 0)); then  # the package lists may be missing (fresh container): update once
    out=$( (apt-get -o DPkg::Lock::Timeout=300 update -qq &&
            DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq \
              --no-install-recommends "${need[@]}") 2>&1) && rc=0 || rc=$?
  fi
  ((made_policy)) && rm -f "$policy"
  ((rc == 0)) || skip "apt-get install ${need[*]} failed: $(tail -n 1 <<<"$out")"
}

# ---------------------------------------------------------------------------------------------
# Configuration

node_names() { local i; for ((i = 0; i < NODES; i++)); do echo "n$i"; done; }
node_ip() { echo "$SUBNET.$((10 + ${1#n}))"; }

write_config() {
  local conf=$DIR/slurm.conf ctl_addr hw
  # The hardware as slurmd itself sees it (CPUs, sockets, cores, threads, memory): a node
  # declared larger than it is would be drained as "Low socket*core*thread count".
  hw=$(slurmd -C) || skip "slurmd -C failed: $hw"
  hw=$(head -n 1 <<<"$hw" | sed 's/^NodeName=[^ ]* //')
  if [[ $MODE == ns ]]; then ctl_addr=$SUBNET.1; else ctl_addr=127.0.0.1; fi
  local prolog=""
  if [[ $MODE == host ]]; then
    # A TaskProlog's "export NAME=VALUE" lines on stdout go into the task's environment.
    cat >"$DIR/task_prolog.sh" <<EOF
#!/bin/sh
# This test cluster's nodes share one /tmp (multiple-slurmd mode): give each its own.
echo "export COLOADER_RUN_DIR=$DIR/nodes/\$SLURMD_NODENAME/run"
echo "export TMPDIR=$DIR/nodes/\$SLURMD_NODENAME/tmp"
EOF
    chmod 755 "$DIR/task_prolog.sh"
    prolog="TaskProlog=$DIR/task_prolog.sh"
  fi
  cat >"$conf" <<EOF
# Written by tests/slurm/cluster.sh for a throw-away test cluster; removed by its stop.
ClusterName=coloadertest
# slurmctld checks that it runs on the host named here; clients reach it at the address.
SlurmctldHost=$(hostname -s)($ctl_addr)
SlurmctldPort=$PORT_BASE
SlurmdPort=$((PORT_BASE + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# Our own munged, not the system's /run/munge.
AuthInfo=socket=$DIR/munge/munge.socket.2
StateSaveLocation=$DIR/ctld
SlurmdSpoolDir=$DIR/nodes/%n/spool
SlurmctldPidFile=$DIR/ctld/slurmctld.pid
SlurmdPidFile=$DIR/nodes/%n/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
# No systemd and no delegated cgroup here: track a job's processes through /proc and
# leave task placement alone.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
# Cores are the consumable resource; memory is not, so steps need no --mem.
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
ReturnToService=2
# Finished jobs stay visible to scontrol for their exit code (there is no accounting).
MinJobAge=600
KillWait=5
SlurmdTimeout=30
MessageTimeout=10
InactiveLimit=0
$prolog
EOF
  local n
  for n in $(node_names); do
    if [[ $MODE == ns ]]; then
      echo "NodeName=$n NodeAddr=$(node_ip "$n") NodeHostname=$n $hw State=UNKNOWN" >>"$conf"
    else  # one address for all: a port each (multiple-slurmd mode)
      echo "NodeName=$n NodeAddr=127.0.0.1 NodeHostname=$(hostname -s) Port=$((PORT_BASE + 2 + ${n#n})) $hw State=UNKNOWN" >>"$conf"
    fi
  done
  # No time limit of its own: a job asking for more than a partition's MaxTime would pend.
  echo "PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP" >>"$conf"

  # /etc/hosts inside each namespaced node: the node names and the controller's host.
  {
    echo "127.0.0.1 localhost"
    echo "$SUBNET.1 $(hostname -s)"
    for n in $(node_names); do echo "$(node_ip "$n") $n"; done
  } >"$DIR/hosts"

  cat >"$DIR/env" <<EOF
# source this to use the test cluster
export SLURM_CONF=$conf
EOF
}

# ---------------------------------------------------------------------------------------------
# Daemons

start_munge() {
  mkdir -p "$DIR/munge"
  chmod 700 "$DIR/munge"
  mungekey --create --keyfile="$DIR/munge/munge.key" 2>"$DIR/log/mungekey.log" ||
    skip "mungekey failed: $(last_line "$DIR/log/mungekey.log")"
  chmod 400 "$DIR/munge/munge.key"
  # -F: stays in the foreground, so its pid is ours to stop; setsid: not in our session.
  env "$MARK" setsid munged -F --force --key-file="$DIR/munge/munge.key" \
    --socket="$DIR/munge/munge.socket.2" --pid-file="$DIR/munge/munged.pid" \
    --seed-file="$DIR/munge/munged.seed" --log-file="$DIR/log/munged.log" \
    </dev/null >>"$DIR/log/munged.out" 2>&1 &
  echo $! >"$DIR/run/munged.pid"
  munge_ok() { munge -n -S "$DIR/munge/munge.socket.2" | unmunge -S "$DIR/munge/munge.socket.2"; }
  wait_for 15 "munged to answer" munge_ok ||
    skip "munged does not start: $(last_line "$DIR/log/munged.out") $(last_line "$DIR/log/munged.log")"
}

start_controller() {
  env "$MARK" SLURM_CONF="$DIR/slurm.conf" setsid slurmctld -D -i -f "$DIR/slurm.conf" \
    </dev/null >>"$DIR/log/slurmctld.out" 2>&1 &
  echo $! >"$DIR/run/slurmctld.ctl.pid"
  ctld_up() { kill -0 "$(cat "$DIR/run/slurmctld.ctl.pid")" && grep -q 'is UP' <<<"$(scontrol ping)"; }
  wait_for 30 "slurmctld to answer scontrol ping" ctld_up ||
    skip "slurmctld does not start: $(last_line "$DIR/log/slurmctld.out") / $(last_line "$DIR/log/slurmctld.log")"
}

# The network: a bridge with the controller's address, and per node a namespace joined to it
# by a veth pair.
setup_network() {
  echo "$DIR" >"$NET_OWNER"
  ip link add "$BRIDGE" type bridge || return 1
  ip addr add "$SUBNET.1/24" dev "$BRIDGE" || return 1
  ip link set "$BRIDGE" up || return 1
  local n ns
  for n in $(node_names); do
    ns=$NS_PREFIX$n
    ip netns add "$ns" || return 1
    ip link add "clv-$n" type veth peer name "clp-$n" || return 1
    ip link set "clv-$n" master "$BRIDGE" up || return 1
    ip link set "clp-$n" netns "$ns" || return 1
    ip -n "$ns" link set "clp-$n" name eth0 || return 1
    ip -n "$ns" addr add "$(node_ip "$n")/24" dev eth0 || return 1
    ip -n "$ns" link set eth0 up || return 1
    ip -n "$ns" link set lo up || return 1
  done
  # A host firewall that filters bridged traffic (br_netfilter and a FORWARD policy of DROP)
  # would keep the nodes from the controller: they then never register, and start says so
  # with their last log lines. No firewall rule is changed here.
  return 0
}

# owns_network: the bridge and namespaces (if any) are this cluster's.
owns_network() { [[ -f $NET_OWNER && $(cat "$NET_OWNER") == "$DIR" ]]; }

# Removes the nodes' network, with whatever still runs in a node's namespace (by pid).
teardown_network() {
  local n pid
  for n in n0 n1 n2 n3 n4 n5 n6 n7; do
    for pid in $(ns_pids "$n"); do kill -KILL "$pid" 2>/dev/null || true; done
    ip link del "clv-$n" 2>/dev/null || true
    ip netns del "$NS_PREFIX$n" 2>/dev/null || true
  done
  ip link del "$BRIDGE" 2>/dev/null || true
  rm -f "$NET_OWNER"
}

start_nodes() {
  local n
  for n in $(node_names); do
    mkdir -p "$DIR/nodes/$n/spool" "$DIR/nodes/$n/tmp"
    chmod 1777 "$DIR/nodes/$n/tmp"
    if [[ $MODE == ns ]]; then
      # `_node` runs as PID 1 of the node's PID namespace (see below).
      # nsenter, not `ip netns exec`: the latter mounts a fresh /sys, hiding /sys/fs/cgroup,
      # and Debian's slurmd 22.05 will not start without a cgroup file system to look at.
      env "$MARK" SLURM_CONF="$DIR/slurm.conf" setsid nsenter --net="/run/netns/$NS_PREFIX$n" \
        unshare --uts --mount --pid --fork --kill-child=TERM --mount-proc --propagation private \
        bash "$SELF" _node "$n" </dev/null >>"$DIR/log/slurmd-$n.out" 2>&1 &
    else
      env "$MARK" SLURM_CONF="$DIR/slurm.conf" setsid slurmd -D -N "$n" -f "$DIR/slurm.conf" \
        </dev/null >>"$DIR/log/slurmd-$n.out" 2>&1 &
    fi
    echo $! >"$DIR/run/node-$n.pid"
  done
}

# Inside a node's namespaces: make it look like its own machine, then run slurmd. This bash
# stays PID 1 of the namespace, reaping the job steps that slurmd's double fork leaves to it;
# when slurmd ends, it ends, and the kernel ends whatever is left in the namespace.
node_main() {
  local n=$1
  hostname "$n"
  mount --bind "$DIR/nodes/$n/tmp" /tmp
  mount -t tmpfs -o mode=1777 tmpfs /dev/shm
  mount --bind "$DIR/hosts" /etc/hosts
  # Its steps return to slurmd's working directory: one the node can see, whatever the
  # caller's was (a checkout under /tmp is behind the node's private /tmp).
  cd "$DIR"
  slurmd -D -N "$n" -f "$DIR/slurm.conf" &
  local pid=$!
  trap 'kill -TERM $pid 2>/dev/null' TERM INT
  # `wait` returns early on a trapped signal: keep waiting until slurmd itself is gone.
  while kill -0 "$pid" 2>/dev/null; do wait "$pid" || true; done
}

nodes_idle() {
  local states n
  for n in $(node_names); do  # a node that died will not become idle: stop waiting at once
    kill -0 "$(cat "$DIR/run/node-$n.pid")" 2>/dev/null || { NODE_DIED=$n; return 0; }
  done
  states=$(sinfo -h -N -o '%N %t' 2>/dev/null) || return 1
  [[ $(grep -c ' idle$' <<<"$states") -eq $NODES ]]
}

# ---------------------------------------------------------------------------------------------
# Commands

cmd_start() {
  NODES=1
  while (($#)); do
    case $1 in
      --nodes) NODES=${2:?--nodes needs a value}; shift 2 ;;
      *) echo "usage: $0 start [--nodes N]" >&2; exit 2 ;;
    esac
  done
  [[ $NODES =~ ^[1-8]$ ]] || { echo "cluster: --nodes must be 1..8" >&2; exit 2; }
  (($(id -u) == 0)) || skip "needs root (the daemons run as root, the nodes in namespaces)"
  [[ $DIR == /* ]] || die "SLURM_TEST_DIR must be an absolute path, got $DIR"
  if [[ -f $DIR/run/slurmctld.ctl.pid ]] && kill -0 "$(cat "$DIR/run/slurmctld.ctl.pid")" 2>/dev/null; then
    die "a test cluster is already running in $DIR; run '$0 stop' first"
  fi
  install_packages

  MODE=$ISOLATION
  [[ $MODE =~ ^(auto|ns|host)$ ]] || { echo "cluster: SLURM_TEST_ISOLATION must be auto, ns or host" >&2; exit 2; }
  if [[ $MODE == auto ]]; then
    MODE=host
    if command -v ip >/dev/null && command -v unshare >/dev/null && command -v nsenter >/dev/null &&
       ip netns add "${NS_PREFIX}probe" 2>/dev/null; then
      ip netns del "${NS_PREFIX}probe"
      unshare --uts --mount --pid --fork --mount-proc true 2>/dev/null && MODE=ns
    fi
  fi
  if [[ $MODE == ns ]]; then
    # The nodes see their own /tmp and /dev/shm; state must live on the shared file system.
    case $DIR/ in /tmp/* | /dev/shm/*) die "SLURM_TEST_DIR=$DIR is under /tmp or /dev/shm, which each node replaces with its own; use e.g. /var/tmp/..." ;; esac
  fi
  log "starting $NODES node(s), mode $MODE, state in $DIR"

  if [[ -d $DIR && -n $(ls -A "$DIR") && ! -e $DIR/$OURS ]]; then
    die "SLURM_TEST_DIR=$DIR is not empty and not a test cluster's; give an empty or new directory"
  fi
  rm -rf "$DIR"
  mkdir -p "$DIR"/{run,log,ctld}
  touch "$DIR/$OURS"
  chmod 755 "$DIR"
  # From here on a failure leaves nothing behind.
  trap 'rc=$?; if ((rc != 0)); then log "start failed; tearing down"; cmd_stop --keep-logs >/dev/null 2>&1 || true; fi' EXIT
  echo "$NODES" >"$DIR/nodes.count"
  echo "$MODE" >"$DIR/mode"
  write_config
  export SLURM_CONF=$DIR/slurm.conf

  for ((p = PORT_BASE; p <= PORT_BASE + 1 + NODES; p++)); do
    [[ -z $(ss -Hltn "sport = :$p") ]] ||
      skip "port $p is in use (another test cluster? set SLURM_TEST_PORT_BASE)"
  done
  if [[ $MODE == ns ]]; then
    if ip link show "$BRIDGE" >/dev/null 2>&1 || [[ -f $NET_OWNER ]]; then
      local owner
      owner=$(cat "$NET_OWNER" 2>/dev/null || echo "?")
      if [[ -f $owner/run/slurmctld.ctl.pid ]] && kill -0 "$(cat "$owner/run/slurmctld.ctl.pid")" 2>/dev/null; then
        skip "the test cluster in $owner is running (stop it: SLURM_TEST_DIR=$owner $0 stop)"
      fi
      # The remains of a test cluster whose controller is gone (a run that was killed).
      log "removing the network left by the test cluster in $owner"
      teardown_network
    fi
    if grep -q "inet $SUBNET\." <<<"$(ip -4 addr show)"; then
      skip "subnet $SUBNET.0/24 is already in use here (set SLURM_TEST_SUBNET)"
    fi
    setup_network || skip "cannot build the nodes' network (bridge/veth/netns): see ip's message above"
  fi

  start_munge
  start_controller
  # (Here and below never `cmd | grep -q`: grep's early exit can kill cmd with SIGPIPE, and
  # pipefail then fails the pipeline whatever grep found.)
  if [[ $MODE == host ]] && ((NODES > 1)) &&
     ! grep -Eq '^MULTIPLE_SLURMD += +Yes' <<<"$(scontrol show config)"; then
    skip "$NODES nodes on one host need namespaces (isolation $ISOLATION) or a slurmd built with --enable-multiple-slurmd (this one is not)"
  fi
  start_nodes
  NODE_DIED=
  if ! wait_for 45 "all $NODES node(s) to be idle" nodes_idle || [[ -n $NODE_DIED ]]; then
    local why
    why=$(sinfo -h -N -o '%N %t %E' 2>/dev/null | tr '\n' ';')
    for n in $(node_names); do
      why+=" $n: $(last_line "$DIR/log/slurmd-$n.out") / $(last_line "$DIR/log/slurmd-$n.log")"
    done
    skip "nodes never became idle: $why"
  fi
  # A job on every node: the nodes are idle, so this must work. If it does not (srun cannot
  # reach a node, a node's step cannot call back), the cluster started but misbehaves: 1.
  local ran want
  want=$(node_names | sort | tr '\n' ' ')
  # --chdir: the caller may stand where the nodes cannot (a checkout under /tmp, private on each).
  ran=$(timeout 30 srun --chdir="$DIR" --nodes="$NODES" --ntasks-per-node=1 --time=1 printenv SLURMD_NODENAME 2>&1 | sort | tr '\n' ' ') ||
    die "a first job on all $NODES node(s) failed: $ran"
  [[ $ran == "$want" ]] || die "a first job on all $NODES node(s) ran on '$ran', expected '$want'"
  trap - EXIT
  log "up: $(sinfo -h -N -o '%N:%t' | tr '\n' ' ')(source $DIR/env)"
}

# Pids of live processes carrying this cluster's mark in their environment.
marked_pids() {
  local f
  # -z: an environ file is NUL-separated NAME=VALUE entries, one "line" each for grep.
  # shellcheck disable=SC2013  # /proc paths have no spaces
  for f in $(grep -lzxF -- "$MARK" /proc/[0-9]*/environ 2>/dev/null); do
    f=${f#/proc/}; echo "${f%/environ}"
  done
}

# with_descendants PID...: the PIDs and all their descendants.
with_descendants() {
  (($#)) || return 0
  ps -e -o pid= -o ppid= | awk -v roots="$*" '
    BEGIN { n = split(roots, r, " "); for (i = 1; i <= n; i++) keep[r[i]] = 1 }
    { parent[$1] = $2 }
    END {
      do { changed = 0
           for (p in parent) if (!(p in keep) && (parent[p] in keep)) { keep[p] = 1; changed = 1 }
      } while (changed)
      for (p in keep) print p
    }'
}

# ns_pids NODE: the processes in a namespaced node's network namespace (none if it has none).
ns_pids() {
  grep -qw "$NS_PREFIX$1" <<<"$(ip netns list 2>/dev/null)" || return 0
  ip netns pids "$NS_PREFIX$1" 2>/dev/null || true
}

# running PID: the process exists and is not a zombie (our daemons' parent is this machine's
# init, which may take a second to reap them; a zombie has stopped all the same).
running() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  stat=${stat##*) }
  [[ ${stat%% *} != Z ]]
}

# stop_pids SECONDS PID...: waits up to SECONDS for the PIDs (already signalled) to exit,
# then KILLs those still there.
stop_pids() {
  local secs=$1 pid alive; shift
  local deadline=$((SECONDS + secs))
  while :; do
    alive=()
    for pid in "$@"; do running "$pid" && alive+=("$pid"); done
    ((${#alive[@]} == 0 || SECONDS >= deadline)) && break
    sleep 0.1
  done
  for pid in "${alive[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
}

cmd_stop() {
  # Best effort, all the way to the end: one step failing must not leave the rest running.
  set +e
  local keep_logs=0
  [[ ${1:-} == --keep-logs ]] && keep_logs=1
  [[ -e $DIR/$OURS ]] || { log "no test cluster in $DIR"; return 0; }
  export SLURM_CONF=$DIR/slurm.conf
  # Jobs first, while slurmctld and slurmd can still end them cleanly.
  if [[ -f $DIR/run/slurmctld.ctl.pid ]] && kill -0 "$(cat "$DIR/run/slurmctld.ctl.pid")" 2>/dev/null; then
    scancel --full --quiet --signal=KILL --state=RUNNING 2>/dev/null || true
    scancel --quiet 2>/dev/null || true
    no_jobs() { [[ -z $(squeue -h -o %i 2>/dev/null) ]]; }
    wait_for 10 "jobs to end" no_jobs || true
  fi
  # Nodes before the controller, all at once: TERM each slurmd (inside a namespaced node it is
  # not the pid we started, which is unshare), give them 5 s together, then KILL what is left
  # in the nodes, by pid.
  local f n pid pids=()
  for f in "$DIR"/run/node-*.pid; do
    [[ -f $f ]] || continue
    n=$(basename "$f" .pid); n=${n#node-}
    pids+=("$(cat "$f")")
    for pid in $(ns_pids "$n"); do
      [[ $(cat "/proc/$pid/comm" 2>/dev/null) == slurmd ]] && kill -TERM "$pid" 2>/dev/null
    done
    kill -TERM "$(cat "$f")" 2>/dev/null || true
  done
  stop_pids 5 "${pids[@]}"
  owns_network && teardown_network
  pids=()
  for f in "$DIR"/run/slurmctld.ctl.pid "$DIR"/run/munged.pid; do
    [[ -f $f ]] && pids+=("$(cat "$f")") && kill -TERM "$(cat "$f")" 2>/dev/null
  done
  stop_pids 5 "${pids[@]}"
  # Anything else that carries the mark, and its descendants: the job steps (slurmstepd and
  # their tasks) of a node run without namespaces, should scancel not have ended them.
  # shellcheck disable=SC2046  # a list of pids
  for pid in $(with_descendants $(marked_pids)); do
    [[ $pid == "$$" ]] || kill -KILL "$pid" 2>/dev/null || true
  done
  if ((keep_logs)); then
    # A failed start keeps its logs for the one reading the SKIP line.
    find "$DIR" -mindepth 1 -maxdepth 1 ! -name log ! -name "$OURS" -exec rm -rf {} + 2>/dev/null || true
  else
    rm -rf "$DIR"
  fi
  log "stopped"
}

cmd_status() {
  [[ -f $DIR/slurm.conf ]] || { echo "no test cluster in $DIR"; return 1; }
  export SLURM_CONF=$DIR/slurm.conf
  echo "state: $DIR (mode $(cat "$DIR/mode"), $(cat "$DIR/nodes.count") node(s))"
  local f ok=0
  for f in "$DIR"/run/*.pid; do
    local pid; pid=$(cat "$f")
    if kill -0 "$pid" 2>/dev/null; then echo "  $(basename "$f" .pid): pid $pid"; else echo "  $(basename "$f" .pid): not running"; ok=1; fi
  done
  sinfo -N -o '%N %t %c %m %E' || ok=1
  squeue || ok=1
  return $ok
}

# Each branch ends in exit: a node's bash runs as long as its node, and bash reads a script as
# it goes; were it to read on after the `esac`, an edit of this file meanwhile would be run.
case ${1:-} in
  start) shift; cmd_start "$@"; exit ;;
  stop) shift; cmd_stop "$@"; exit ;;
  status) cmd_status; exit ;;
  _node) node_main "$2"; exit ;;
  *) echo "usage: $0 start [--nodes N] | stop | status   (state: \$SLURM_TEST_DIR, default /var/tmp/coloader-slurm)" >&2; exit 2 ;;
esac
