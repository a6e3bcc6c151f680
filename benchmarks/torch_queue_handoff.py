#!/usr/bin/env python3
"""Baseline for the GPU hand-off: a torch.multiprocessing queue of CUDA tensors (what a
PyTorch user reaches for to share batches between processes). A producer process puts a
fresh (128, 3, 224, 224) float32 CUDA tensor with its creation time; the consumer takes it
and records the time until it holds the tensor. Prints p50/p99 in microseconds.
"""
import json
import time

import torch
import torch.multiprocessing as mp


def producer(q, n, ready):
    x = torch.empty(128, 3, 224, 224, device="cuda")
    ready.wait()
    for _ in range(n):
        y = x.clone()
        torch.cuda.synchronize()
        q.put((time.monotonic_ns(), y))
        time.sleep(0.005)  # the consumer is always waiting, as in the coloader measurement
    q.put(None)
    time.sleep(2)  # keep the tensors' memory alive until the consumer is done with them


def main():
    mp.set_start_method("spawn")
    q = mp.Queue()
    ready = mp.Event()
    n = 300
    p = mp.Process(target=producer, args=(q, n, ready))
    p.start()
    torch.zeros(1, device="cuda")  # create this process's context before timing
    ready.set()
    lat = []
    while True:
        item = q.get()
        if item is None:
            break
        t, tensor = item
        lat.append((time.monotonic_ns() - t) / 1000)
        del tensor
    p.join()
    lat = sorted(lat[20:])  # the first hand-offs open the IPC handles
    r = {"p50_us": round(lat[len(lat) // 2], 1), "p99_us": round(lat[int(len(lat) * 0.99)], 1), "n": len(lat)}
    print(f"torch.multiprocessing queue, CUDA tensors: p50 {r['p50_us']} us, p99 {r['p99_us']} us ({r['n']} hand-offs)")
    print(json.dumps(r))


if __name__ == "__main__":
    main()
