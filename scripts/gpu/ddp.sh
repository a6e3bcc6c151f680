#!/usr/bin/env bash
# Consumer groups on the GPU machine with 2 GPUs (kind nvidia-h200-x2), over a copy of the
# repository that carries .device/ (scripts/gpu_bundle.sh): one producer
#   coloader serve --device cuda:0,cuda:1 --decode gpu
# read at once, under MPS, by
#   job-a  torchrun --nproc_per_node 2  ResNet-18 DDP (NCCL), rank r on cuda:r
#   job-b  torchrun --nproc_per_node 2  ResNet-18 DDP (NCCL), a second group of the same size
#   job-c  torchrun --nproc_per_node 1  ResNet-18 on cuda:0 (a plain consumer)
# (examples/ddp_train.py). Reports each job's images/s, the exactness checks (from the ranks'
# own logs: per epoch both ranks of a group took the same number of steps and together every
# sample; the single job every sample), and the producer's CPU time, in $OUT/gpu_ddp.json;
# logs under $OUT/gpu_ddp/. Exit status 0 only if every check passed.
#
#   DDP_IMAGES (default 12801)   images in the generated ImageNet-like dataset
#   DDP_EPOCHS (default 3)       epochs every job trains
#   DDP_BATCH  (default 128)     per-rank batch size (the producer's batch is the same)
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/env.sh
images=${DDP_IMAGES:-12801}  # odd: the 2-rank groups pad one sample (the device-path padding copy)
epochs=${DDP_EPOCHS:-3}
batch=${DDP_BATCH:-128}
logs=$out/gpu_ddp
rm -rf "$logs"
mkdir -p "$logs"
export COLOADER_RUN_DIR=$(mktemp -d /tmp/gpu-ddp-run-XXXXXX)  # ipc:// paths must stay short too
chmod 0700 "$COLOADER_RUN_DIR"

nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader | tee "$logs/gpus.txt"
if [[ $(nvidia-smi -L | wc -l) -lt 2 ]]; then
  echo "the ddp suite needs 2 GPUs (kind nvidia-h200-x2); this machine has $(nvidia-smi -L | wc -l)" >&2
  exit 2
fi

data=/tmp/coloader-imagenet-like-$images
[[ -d $data ]] || python3 scripts/make_dataset.py --source .device/photos --out "$data" --images "$images" \
  --classes 100 >"$logs/make_dataset.log" 2>&1 || { echo "cannot make the dataset" >&2; exit 1; }

# MPS with its own pipe and log directories (never the machine's default), stopped at the end.
# (Under /tmp: the pipe is a unix socket, whose path must stay short.)
mps_dir=$(mktemp -d /tmp/gpu-ddp-mps-XXXXXX)
export CUDA_MPS_PIPE_DIRECTORY=$mps_dir/pipe CUDA_MPS_LOG_DIRECTORY=$mps_dir/log
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
nvidia-cuda-mps-control -d || { echo "cannot start the MPS control daemon" >&2; exit 1; }
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -KILL -- "-$p" 2>/dev/null || kill -KILL "$p" 2>/dev/null; done
  [[ -n ${producer:-} ]] && kill -KILL "$producer" 2>/dev/null
  echo quit | nvidia-cuda-mps-control >/dev/null 2>&1
}
trap cleanup EXIT

# 5 processes (2 + 2 + 1) must be attached before the first epoch: every job sees whole epochs.
"$COLOADER_BINARY" serve --data "$data" --name ddp --device cuda:0,cuda:1 --decode gpu --output bfloat16 \
  --batch-size "$batch" --epochs "$epochs" --min-consumers 5 --window 6 --quiet \
  >"$logs/producer.out" 2>"$logs/producer.err" &
producer=$!
for _ in $(seq 600); do grep -q serving "$logs/producer.err" && break; sleep 0.1; done
grep -q serving "$logs/producer.err" || { cat "$logs/producer.err" >&2; exit 1; }

start_job() {  # name nproc port
  local name=$1 n=$2 port=$3
  setsid python3 -m torch.distributed.run --nproc_per_node "$n" --master_port "$port" \
    examples/ddp_train.py --name ddp --epochs "$epochs" --batch-size "$batch" --model resnet18 --classes 100 \
    --group "$name" --log-dir "$logs/$name" --timeout 300 >"$logs/$name.log" 2>&1 &
  pids+=($!)
}
t0=$(date +%s.%N)
start_job job-a 2 29511
start_job job-b 2 29512
start_job job-c 1 29513
status=0
for p in "${pids[@]}"; do wait "$p" || status=1; done
wait "$producer" || status=1
t1=$(date +%s.%N)
pids=()
grep -E "done|stopped" "$logs/producer.err" | tail -1

python3 - "$logs" "$images" "$epochs" "$batch" "$t0" "$t1" "$out/gpu_ddp.json" <<'EOF' || status=1
import json, math, re, sys
from pathlib import Path
logs, n, epochs, batch, t0, t1, result = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]), float(sys.argv[6]), sys.argv[7]
report = {"images": n, "epochs": epochs, "batch_size": batch, "wall_s": t1 - t0, "jobs": {}, "checks": []}
ok = True
def check(name, cond, detail=""):
    global ok
    report["checks"].append({"check": name, "ok": bool(cond), "detail": detail})
    ok = ok and bool(cond)
for job, w in (("job-a", 2), ("job-b", 2), ("job-c", 1)):
    per_rank, summaries = [], []
    for r in range(w):
        lines = [json.loads(l) for l in (logs / job / ("rank%d.jsonl" % r)).read_text().splitlines()]
        steps = {}
        for l in lines:
            if "indices" in l:
                steps.setdefault(l["epoch"], []).extend(l["indices"])
        per_rank.append(steps)
        summaries.append([l for l in lines if "steps" in l])
    t = math.ceil(n / w)
    rates = []
    for e in range(epochs):
        union = []
        for r in range(w):
            got = per_rank[r].get(e, [])
            union += got
            check("%s epoch %d rank %d: %d samples (its share)" % (job, e, r, t), len(got) == t, "got %d" % len(got))
        check("%s epoch %d: the ranks together saw every sample" % (job, e), set(union) == set(range(n)),
              "%d distinct" % len(set(union)))
        counts = [s[e]["steps"] if e < len(s) else None for s in summaries]
        check("%s epoch %d: equal step counts" % (job, e), len(set(counts)) == 1, str(counts))
        rates.append(sum(s[e]["images_per_s"] for s in summaries if e < len(s)))
    report["jobs"][job] = {"ranks": w, "images_per_s_per_epoch": rates,
                           "images_per_s": sum(rates[1:]) / max(1, len(rates) - 1) if len(rates) > 1 else rates[0]}
err = (logs / "producer.err").read_text()
m = re.findall(r"CPU ([0-9.]+) s", err)
report["producer_cpu_s"] = float(m[-1]) if m else None
report["producer_cores"] = report["producer_cpu_s"] / report["wall_s"] if m else None
report["ok"] = ok
Path(result).write_text(json.dumps(report, indent=1))
print(json.dumps({k: v for k, v in report.items() if k != "checks"}, indent=1))
print("checks: %d, failed: %s" % (len(report["checks"]), [c for c in report["checks"] if not c["ok"]]))
sys.exit(0 if ok else 1)
EOF
exit $status
