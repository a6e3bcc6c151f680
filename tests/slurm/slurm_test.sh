#!/usr/bin/env bash
# coloader on a real Slurm: brings up a test cluster on this machine (tests/slurm/cluster.sh),
# submits examples/slurm/coloader.sbatch, and checks from the consumers' --json lines that
# every epoch was exact, on one node and, where two nodes can run here, on two.
#
#   tests/slurm/slurm_test.sh BUILD_DIR [--coloader PATH] [--nodes auto|1|2]
#
# Each job: one producer per node (`serve --rank NODE --world-size NODES --forever`), then
# 2 ranks per node, the node's ranks one consumer group (`coloader consume --group job-ID
# --rank SLURM_LOCALID --world-size 2 --node-rank SLURM_NODEID --num-nodes NODES --epochs 2
# --json --indices`, batch size 5) splitting that node's share; the job stops the producers
# when they are done. The ranks start either when every producer answers (the job's wait
# step) or, in the last job, at once beside the producers (no wait step; `consume --wait-ms`
# waits). Exact means, for every epoch, from the indices every rank lists: no rank's epoch
# is partial, every rank of the job took the same number of batches and samples, no sample
# was taken twice, and the samples of all ranks of all nodes are the dataset (0..N-1) once.
# (N divides by the job's ranks, so there is no padding to allow for.)
#
# Exit: 0 passed; 77 skipped (Slurm cannot run here; the reason is printed); 1 failed.
# Bounded: the dataset 120 s, cluster start about 2 min at worst (45 s for the nodes, 30 s
# for a first job), each job 90 s, the cluster's stop about 25 s at worst.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
SBATCH_SCRIPT=$REPO/examples/slurm/coloader.sbatch
IMAGES=64          # the dataset: divisible by 2 nodes, so the shares have no padding
JOB_TIMEOUT_S=90

usage() { echo "usage: $0 BUILD_DIR [--coloader PATH] [--nodes auto|1|2]" >&2; exit 2; }
say() { echo "slurm_test: $*" >&2; }
fail() { echo "FAIL: $*" >&2; exit 1; }

(($#)) || usage
BUILD_DIR=$1; shift
COLOADER_BIN="" NODES_WANTED=auto
while (($#)); do
  case $1 in
    --coloader) COLOADER_BIN=${2:?}; shift 2 ;;
    --nodes) NODES_WANTED=${2:?}; shift 2 ;;
    *) usage ;;
  esac
done
[[ $NODES_WANTED =~ ^(auto|1|2)$ ]] || usage
if [[ -z $COLOADER_BIN ]]; then  # the binary's home moved from server/ to tools/
  for c in "$BUILD_DIR/tools/coloader" "$BUILD_DIR/server/coloader"; do
    [[ -x $c ]] && { COLOADER_BIN=$c; break; }
  done
fi
[[ -n $COLOADER_BIN && -x $COLOADER_BIN ]] ||
  fail "no coloader binary (looked in $BUILD_DIR/tools and $BUILD_DIR/server; or pass --coloader PATH)"
COLOADER_BIN=$(readlink -f "$COLOADER_BIN")

# Pillow for the dataset: Debian's python3-pil, which a pyenv python3 on PATH may not see.
PYTHON=
for p in python3 /usr/bin/python3; do
  if command -v "$p" >/dev/null && "$p" -c 'import PIL' 2>/dev/null; then PYTHON=$p; break; fi
done
[[ -n $PYTHON ]] || fail "no python3 with Pillow (apt-get install python3-pil) for scripts/make_dataset.py"

T0=$SECONDS
# Not under /tmp: every node of the cluster has its own /tmp; the state, the dataset and the
# jobs' output must be on the file system the nodes share.
export SLURM_TEST_DIR
SLURM_TEST_DIR=$(mktemp -d /var/tmp/coloader-slurm-test.XXXXXX)
DATA_DIR=$(mktemp -d /var/tmp/coloader-slurm-data.XXXXXX)  # apart: cluster.sh owns its directory
MAKER=""
cleanup() {
  local rc=$?
  set +e  # all of it, whatever fails on the way
  # The dataset maker and its worker processes: a process group of their own (setsid).
  [[ -z $MAKER ]] || { kill -TERM -- "-$MAKER" 2>/dev/null; wait "$MAKER" 2>/dev/null; }
  "$HERE/cluster.sh" stop >/dev/null 2>&1 || say "warning: cluster.sh stop failed"
  # Nothing of the test may outlive it: every daemon and job process names the state
  # directory on its command line (slurm.conf, the dataset) or has it as its working directory.
  local p pid left=()
  for p in $(grep -lzF -e "$SLURM_TEST_DIR" -e "$DATA_DIR" /proc/[0-9]*/cmdline 2>/dev/null) \
           $(find /proc -maxdepth 2 -name cwd -lname "$SLURM_TEST_DIR*" 2>/dev/null); do
    pid=${p#/proc/}; pid=${pid%%/*}
    [[ $pid == "$$" || $pid == "$BASHPID" ]] && continue
    [[ -e /proc/$pid ]] || continue
    left+=("$pid $(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | cut -c1-100)")
  done
  if ((${#left[@]})); then
    printf 'FAIL: left running after the cluster stopped:\n' >&2
    printf '  %s\n' "${left[@]}" >&2
    for p in "${left[@]}"; do kill -KILL "${p%% *}" 2>/dev/null || true; done
    rc=1
  fi
  rm -rf "$SLURM_TEST_DIR" "$DATA_DIR"
  exit "$rc"
}
trap cleanup EXIT

# The binary the nodes run, copied to the shared file system too: a checkout under /tmp (or
# any path a node cannot see) must not keep slurmstepd from starting it. It links only system
# libraries; the copy must find every one of them where it is.
mkdir "$DATA_DIR/bin"
cp "$COLOADER_BIN" "$DATA_DIR/bin/coloader"
COLOADER_BIN=$DATA_DIR/bin/coloader
unresolved=$(ldd "$COLOADER_BIN" 2>&1 | grep -E 'not found|=> /tmp/' || true)
[[ -z $unresolved ]] || fail "the copy of the coloader binary does not find its libraries where the nodes could: $unresolved"
# Under TSan (scripts/sanitize.sh thread) the jobs' processes read a suppressions file: a copy
# beside the binary, for the same reason.
if [[ ${TSAN_OPTIONS:-} =~ suppressions=([^:]+) ]]; then
  cp "${BASH_REMATCH[1]}" "$DATA_DIR/tsan.supp"
  export TSAN_OPTIONS=${TSAN_OPTIONS/suppressions=${BASH_REMATCH[1]}/suppressions=$DATA_DIR/tsan.supp}
fi

# ---- the dataset, made while the cluster starts ---------------------------------------------------
DATA=$DATA_DIR/data
setsid "$PYTHON" "$REPO/scripts/make_dataset.py" --out "$DATA" --images "$IMAGES" --classes 4 --jobs 2 \
  >"$DATA_DIR/make_dataset.log" 2>&1 </dev/null &
MAKER=$!

# ---- the cluster -------------------------------------------------------------------------------
start_cluster() {  # start_cluster N: 0 up, 77 (reason in START_OUT) cannot, else error
  local rc=0
  START_OUT=$("$HERE/cluster.sh" start --nodes "$1" 2>&1) || rc=$?
  return "$rc"
}
NODES=0 TWO_NODE_SKIP=
if [[ $NODES_WANTED != 1 ]]; then
  rc=0; start_cluster 2 || rc=$?
  if ((rc == 0)); then
    NODES=2
  elif ((rc == 77)); then
    TWO_NODE_SKIP=$(grep '^SKIP:' <<<"$START_OUT" | tail -n 1)
    [[ $NODES_WANTED == 2 ]] && { echo "$TWO_NODE_SKIP"; exit 77; }
    say "2 nodes cannot run here (${TWO_NODE_SKIP#SKIP: }); trying 1"
  else
    fail "cluster.sh start --nodes 2: $START_OUT"
  fi
fi
if ((NODES == 0)); then
  rc=0; start_cluster 1 || rc=$?
  if ((rc == 77)); then grep '^SKIP:' <<<"$START_OUT" | tail -n 1; exit 77; fi
  ((rc == 0)) || fail "cluster.sh start --nodes 1: $START_OUT"
  NODES=1
fi
# shellcheck source=/dev/null
source "$SLURM_TEST_DIR/env"
MODE=$(cat "$SLURM_TEST_DIR/mode")
say "cluster up in $((SECONDS - T0))s ($MODE mode): $(sinfo -h -N -o '%N:%t' | tr '\n' ' ')"

# make_dataset.py takes a few seconds (two processes on 64 photos' worth of JPEG encoding).
deadline=$((SECONDS + 120))
while kill -0 "$MAKER" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.2; done
kill -0 "$MAKER" 2>/dev/null && fail "make_dataset.py did not finish within 120 s"
rc=0; wait "$MAKER" || rc=$?
MAKER=""
((rc == 0)) || fail "make_dataset.py: $(tail -n 3 "$DATA_DIR/make_dataset.log")"
N=$(find "$DATA" -name '*.JPEG' | wc -l)
((N == IMAGES)) || fail "make_dataset.py made $N images, not $IMAGES"
say "dataset of $N images ready at $((SECONDS - T0))s"

# ---- one job -----------------------------------------------------------------------------------
# run_job NODES TASKS_PER_NODE step|consumers: submits the example script, waits for it
# (bounded), checks it. The last word says who waits for the producers: the job's wait step,
# or the consumers themselves (started at once, with --wait-ms).
run_job() {
  local nodes=$1 per_node=$2 waiter=$3 t0=$SECONDS
  local out=$SLURM_TEST_DIR/job-${nodes}x$per_node-$waiter
  local wait_s=30 wait_ms=""
  [[ $waiter == consumers ]] && wait_s=0 wait_ms="--wait-ms 30000"
  mkdir -p "$out"
  # XDG_RUNTIME_DIR and COLOADER_RUN_DIR would put every node's producer socket in one shared
  # directory; without them coloader uses the node's own /tmp, as it would on a cluster.
  local id
  # TRAIN_CMD is expanded by each task's bash, not here.
  # shellcheck disable=SC2016
  id=$(env -u XDG_RUNTIME_DIR -u COLOADER_RUN_DIR \
        COLOADER="$COLOADER_BIN" COLOADER_DATA="$DATA" COLOADER_LOG_DIR="$out" OUT="$out" \
        COLOADER_SERVE_ARGS="--batch-size 16 --image-size 64 --workers 1 --forever --quiet" \
        COLOADER_WAIT_S=$wait_s COLOADER_STOP_S=10 \
        TRAIN_CMD='"$COLOADER" consume --name "$COLOADER_NAME" --group "job-$SLURM_JOB_ID" --rank "$SLURM_LOCALID" --world-size "$LOCAL_RANKS" --node-rank "$SLURM_NODEID" --num-nodes "$SLURM_NNODES" --batch-size 5 --epochs 2 --json --indices --timeout-ms 30000 '"$wait_ms"' >"$OUT/rank$SLURM_PROCID-node$SLURM_NODEID.jsonl"' \
        sbatch --parsable --nodes="$nodes" --ntasks-per-node="$per_node" --time=5 \
          --job-name="coloader-test-${nodes}x$per_node" --chdir="$out" --output="$out/job.out" \
          "$SBATCH_SCRIPT") || fail "sbatch failed for ${nodes}x$per_node"
  id=${id%%;*}
  # Poll the job's state (finished jobs stay visible: MinJobAge in cluster.sh's slurm.conf).
  local state="" reason info deadline=$((SECONDS + JOB_TIMEOUT_S))
  while :; do
    info=$(scontrol -o show job "$id" 2>/dev/null || true)
    state=$(sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p' <<<"$info")
    case $state in
      CONFIGURING | RUNNING | COMPLETING | "") ;;
      PENDING)  # waiting for its nodes is fine; pending for any other reason, it never runs
        reason=$(sed -n 's/.* Reason=\([^ ]*\).*/\1/p' <<<"$info")
        if [[ ! $reason =~ ^(None|Resources|Priority|BeginTime)$ ]]; then
          scancel "$id" || true
          fail "job $id (${nodes}x$per_node) cannot run: pending, Reason=$reason"
        fi ;;
      *) break ;;
    esac
    if ((SECONDS >= deadline)); then
      scancel "$id" || true
      say "job $id output:"; cat "$out/job.out" >&2 || true
      fail "job $id (${nodes}x$per_node) did not finish within ${JOB_TIMEOUT_S}s (state $state)"
    fi
    sleep 0.2
  done
  local exit_code
  exit_code=$(sed -n 's/.* ExitCode=\([0-9:]*\).*/\1/p' <<<"$info")
  if [[ $state != COMPLETED || $exit_code != 0:0 ]]; then
    say "job $id output:"; cat "$out/job.out" >&2 || true
    for f in "$out"/coloader-serve-*.log; do [[ -f $f ]] && { say "$f:"; cat "$f" >&2; }; done
    fail "job $id (${nodes}x$per_node) ended $state, exit code $exit_code"
  fi
  # Every producer was stopped by the job, cleanly, after its consumers were done.
  local p
  for ((p = 0; p < nodes; p++)); do
    grep -q 'stopped; consumers were told' "$out/coloader-serve-$id-$p.log" ||
      fail "job $id: producer of node $p did not stop cleanly: $(tail -n 2 "$out/coloader-serve-$id-$p.log" 2>&1)"
  done
  check_epochs "$out" "$nodes" "$per_node" || { say "job $id output:"; cat "$out/job.out" >&2; fail "job $id (${nodes}x$per_node) was not exact"; }
  local where
  where=$(sed -n 's/.*serving .* on \(ipc:[^ ]*\).*/\1/p' "$out"/coloader-serve-"$id"-*.log | tr '\n' ' ')
  say "PASS ${nodes} node(s) x ${per_node} rank(s), producers awaited by $([[ $waiter == step ]] && echo "the job's wait step" || echo "the consumers (--wait-ms)"): job $id, a ${per_node}-rank group per node, 2 exact epochs, $((SECONDS - t0))s (producers on $where)"
}

# check_epochs DIR NODES RANKS_PER_NODE: the exactness rules above, over DIR/rank*-node*.jsonl.
check_epochs() {
  "$PYTHON" - "$@" "$N" <<'EOF'
import collections, glob, json, os, re, sys
out, nodes, per_node, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
epochs, errors = 2, []
files = sorted(glob.glob(os.path.join(out, "rank*-node*.jsonl")))
if len(files) != nodes * per_node:
    errors.append(f"{len(files)} rank outputs, expected {nodes * per_node}: {files}")
by_epoch = {}  # epoch -> [(global rank, node, line)]
for f in files:
    rank, node = map(int, re.search(r"rank(\d+)-node(\d+)", f).groups())
    lines = [json.loads(l) for l in open(f) if l.strip()]
    if len(lines) != epochs:
        errors.append(f"rank {rank} (node {node}): {len(lines)} epoch lines, expected {epochs}")
    for e in lines:
        by_epoch.setdefault(e["epoch"], []).append((rank, node, e))
for epoch in range(epochs):
    seen = by_epoch.get(epoch, [])
    if len(seen) != nodes * per_node:
        errors.append(f"epoch {epoch}: {len(seen)} ranks reported, expected {nodes * per_node}")
        continue
    counts = {(e["batches"], e["samples"]) for _, _, e in seen}
    if len(counts) != 1:
        errors.append(f"epoch {epoch}: ranks took different (batches, samples): "
                      f"{sorted((r, e['batches'], e['samples']) for r, _, e in seen)}")
    taken = collections.Counter()
    for rank, node, e in seen:
        if e["partial"] or e.get("world_size") != per_node or len(e["indices"]) != e["samples"]:
            errors.append(f"epoch {epoch} rank {rank} (node {node}): partial={e['partial']} "
                          f"world_size={e.get('world_size')} samples={e['samples']} listed={len(e['indices'])}")
        taken.update(e["indices"])
    twice = sorted(i for i, c in taken.items() if c > 1)
    missing = sorted(set(range(n)) - set(taken))
    extra = sorted(set(taken) - set(range(n)))
    if twice or missing or extra:
        errors.append(f"epoch {epoch}: the ranks' samples are not the dataset once: "
                      f"taken twice {twice[:10]}, missing {missing[:10]}, not in 0..{n - 1} {extra[:10]}")
for e in errors:
    print("  " + e, file=sys.stderr)
sys.exit(1 if errors else 0)
EOF
}

run_job 1 2 step
if ((NODES == 2)); then
  run_job 2 2 step
fi
run_job "$NODES" 2 consumers
say "done in $((SECONDS - T0))s (cluster of $NODES node(s), $MODE mode${TWO_NODE_SKIP:+; 2 nodes skipped: ${TWO_NODE_SKIP#SKIP: }})"
