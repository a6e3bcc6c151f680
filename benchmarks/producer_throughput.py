#!/usr/bin/env python3
"""Producer throughput with every core: images/s delivered to one consumer, and the producer's
CPU time per image, host path vs GPU path (--device), on the same files in one run.
With --gpu-decode, also the GPU path with `serve --decode gpu` (nvJPEG + GPU augmentation),
with every core reading files and with only 2 worker threads: cores busy = producer CPU
time / wall time. With --whole-decode, also the host path with `serve --no-crop-decode` (every
JPEG decoded whole, as before the crop-region decode). With --shards N, also the same images
as WebDataset tar shards of N samples (written by `coloader shard`), host path, and on --device
with --decode auto: shards against loose files, side by side (with --stream, also over HTTP,
through pipe: and gzip-compressed).

From the CPU seconds per image follows how many cores it takes to feed one ResNet-50 training
job (~4,000 images/s on an H100 in bf16).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESNET50_IMAGES_PER_S = 4000


def run(binary, data, device, workers, batch, epochs, env, name, decode="cpu", whole=False, extra=()):
    serve = [binary, "serve", "--data", data, "--name", name, "--batch-size", str(batch), "--epochs", str(epochs),
             "--workers", str(workers), "--window", "8", "--quiet", "--decode", decode, *extra]
    serve += ["--no-crop-decode"] if whole else []
    consume = [binary, "consume", "--name", name, "--json"]
    if device:
        serve += ["--device", device]
        consume += ["--device"]
    t0 = time.monotonic()
    p = subprocess.Popen(serve, env=env, stderr=subprocess.PIPE, text=True)
    line = p.stderr.readline()
    log = [line]
    while line and "serving" not in line:
        line = p.stderr.readline()
        log.append(line)
    if not line:
        sys.exit(f"producer failed: {p.stderr.read()}")
    c = subprocess.run(consume, env=env, capture_output=True, text=True)
    log += p.stderr.readlines()
    _, status, ru = os.wait4(p.pid, 0)
    sys.stderr.write("".join(l for l in log if "decode" in l))
    wall = time.monotonic() - t0
    if c.returncode != 0 or os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"run failed: {c.stderr}")
    epochs_out = [json.loads(l) for l in c.stdout.splitlines()]
    images = sum(e["samples"] for e in epochs_out)
    ips = sorted(e["images_per_s"] for e in epochs_out)[len(epochs_out) // 2]
    cpu = ru.ru_utime + ru.ru_stime
    source = "files" if "{" not in data else "http" if data.startswith("http") else "pipe" if data.startswith("pipe:") \
        else "tar.gz" if data.endswith(".gz") else "shards"
    return {"source": source, "path": "device" if device else "host", "decode": decode + ("-whole" if whole else ""),
            "workers": workers, "images": images,
            "images_per_s": round(ips), "producer_cpu_s": round(cpu, 2), "cores_busy": round(cpu / wall, 1),
            "images_per_cpu_s": round(images / cpu), "cores_for_resnet50": round(RESNET50_IMAGES_PER_S * cpu / images, 1),
            "path_reported": epochs_out[0]["path"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True)
    ap.add_argument("--device", default=None, help="e.g. cuda:0; omit to measure the host path only")
    ap.add_argument("--workers", type=int, default=os.cpu_count())
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--binary", default=os.path.join(ROOT, "build", "tools", "coloader"))
    ap.add_argument("--gpu-decode", action="store_true", help="also --decode gpu on --device (all workers, then 2)")
    ap.add_argument("--whole-decode", action="store_true", help="also the host path with --no-crop-decode")
    ap.add_argument("--shards", type=int, default=0, metavar="N",
                    help="also the images as tar shards of N samples (coloader shard), host path and --device auto")
    ap.add_argument("--stream", action="store_true",
                    help="with --shards: also the shards streamed over HTTP (a local http.server), through pipe:cat "
                         "and gzip-compressed (.tar.gz, read whole)")
    args = ap.parse_args()
    env = dict(os.environ, COLOADER_RUN_DIR=tempfile.mkdtemp(prefix="coloader-tp-"))
    rows = [run(args.binary, args.data, None, args.workers, args.batch_size, args.epochs, env, "tphost")]
    if args.whole_decode:
        rows.append(run(args.binary, args.data, None, args.workers, args.batch_size, args.epochs, env, "tpwhole",
                        whole=True))
    if args.device:
        rows.append(run(args.binary, args.data, args.device, args.workers, args.batch_size, args.epochs, env, "tpdev"))
    if args.device and args.gpu_decode:
        for workers in (args.workers, 2):
            rows.append(run(args.binary, args.data, args.device, workers, args.batch_size, args.epochs, env,
                            "tpgpu", decode="gpu"))
    if args.shards:
        out = tempfile.mkdtemp(prefix="coloader-tp-shards-")
        subprocess.run([args.binary, "shard", "--data", args.data, "--out", os.path.join(out, "s-%06d.tar"),
                        "--shard-size", str(args.shards), "--quiet"], check=True, stdout=subprocess.DEVNULL)
        last = len([f for f in os.listdir(out) if f.endswith(".tar")]) - 1
        pattern = os.path.join(out, "s-{000000..%06d}.tar" % last)
        pairs = [(None, "cpu")] + ([(args.device, "auto")] if args.device else [])
        sources = [(args.data, "tpfiles"), (pattern, "tpshards")]
        server = None
        if args.stream:
            server = subprocess.Popen([sys.executable, "-u", "-m", "http.server", "--bind", "127.0.0.1", "0"], cwd=out,
                                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            port = server.stdout.readline().split(" port ")[1].split(" ")[0]  # "Serving HTTP on ... port P ..."
            name = os.path.basename(pattern)
            sources += [(f"http://127.0.0.1:{port}/{name}", "tphttp"), ("pipe:cat " + pattern, "tppipe")]
            gz = tempfile.mkdtemp(prefix="coloader-tp-gz-")
            for f in os.listdir(out):
                with open(os.path.join(gz, f + ".gz"), "wb") as dst:
                    subprocess.run(["gzip", "-c", os.path.join(out, f)], stdout=dst, check=True)
            sources.append((os.path.join(gz, os.path.basename(pattern) + ".gz"), "tpgz"))
        for device, decode in pairs:
            for data, name in sources:
                rows.append(run(args.binary, data, device, args.workers, args.batch_size, args.epochs, env, name,
                                decode=decode))
        if server:
            server.terminate()
    print(f"{'source':<8}{'path':<8}{'decode':>10}{'workers':>8}{'images/s':>10}{'CPU s':>8}{'cores busy':>12}{'img/CPU-s':>11}"
          f"{'cores for RN50':>16}")
    for r in rows:
        print(f"{r['source']:<8}{r['path']:<8}{r['decode']:>10}{r['workers']:>8}{r['images_per_s']:>10}{r['producer_cpu_s']:>8}"
              f"{r['cores_busy']:>12}{r['images_per_cpu_s']:>11}{r['cores_for_resnet50']:>16}")
    for r in rows:
        print(json.dumps(r))


if __name__ == "__main__":
    main()
