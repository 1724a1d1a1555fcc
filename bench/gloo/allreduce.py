#!/usr/bin/env python3
"""PyTorch Gloo peer of titan's collective benchmark.

Runs torch.distributed collectives on the gloo backend with N local
processes and prints one JSON line per (op, nproc), with the fields of
titan's comm.BenchResult: op, size_bytes, nproc, transport, time_s,
algbw_gbps, busbw_gbps (GB/s = 1e9 bytes/s, bus factors as nccl-tests:
allreduce 2(n-1)/n; reduce_scatter, all_gather, all_to_all (n-1)/n).

Usage: allreduce.py [--size 64MiB] [--nproc 2,4] [--op allreduce] [--iters 20] [--warmup 5]
"""
import argparse
import json
import os
import re
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def parse_size(s):
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(KiB|MiB|GiB|KB|MB|GB|k|K|m|M|g|G|B)?", s)
    if not m:
        raise ValueError(f"bad size {s!r}")
    mult = {None: 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30,
            "KB": 1e3, "MB": 1e6, "GB": 1e9, "k": 1 << 10, "K": 1 << 10,
            "m": 1 << 20, "M": 1 << 20, "g": 1 << 30, "G": 1 << 30}[m.group(2)]
    return int(float(m.group(1)) * mult)


def bus_factor(op, n):
    f = (n - 1) / n
    return {"allreduce": 2 * f, "reduce_scatter": f, "all_gather": f,
            "all_to_all": f, "broadcast": 1.0}[op]


def worker(rank, n, port, args, q):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=n)
    elems = args.size // 4
    a = torch.arange(elems, dtype=torch.float32).remainder_(1000).mul_(1e-3)
    chunk = elems // n
    if args.op == "allreduce":
        run = lambda: dist.all_reduce(a)
    elif args.op == "broadcast":
        run = lambda: dist.broadcast(a, 0)
    elif args.op == "all_gather":
        b = torch.zeros(chunk, dtype=torch.float32)
        outs = list(a[: chunk * n].chunk(n))
        run = lambda: dist.all_gather(outs, b)
    elif args.op == "reduce_scatter":
        # gloo has no reduce_scatter in torch 1.13: emulate it as
        # all-reduce of the input, the way a user of gloo would.
        run = lambda: dist.all_reduce(a)
    elif args.op == "all_to_all":
        b = torch.zeros(chunk * n, dtype=torch.float32)
        run = lambda: dist.all_to_all_single(b, a[: chunk * n])
    else:
        raise ValueError(args.op)
    for _ in range(args.warmup):
        run()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(args.iters):
        run()
    t = torch.tensor([(time.perf_counter() - t0) / args.iters], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    if rank == 0:
        size = elems * 4
        algbw = size / t.item() / 1e9
        q.put({"impl": "gloo", "op": args.op, "size_bytes": size, "nproc": n,
               "transport": "gloo", "time_s": t.item(), "algbw_gbps": algbw,
               "busbw_gbps": algbw * bus_factor(args.op, n)})
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="64MiB")
    p.add_argument("--nproc", default="2,4")
    p.add_argument("--op", default="allreduce")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    args = p.parse_args()
    args.size = parse_size(args.size)
    ctx = mp.get_context("spawn")
    for op in args.op.split(","):
        for n in (int(x) for x in args.nproc.split(",")):
            a = argparse.Namespace(**vars(args))
            a.op = op
            q = ctx.Queue()
            mp.start_processes(worker, args=(n, free_port(), a, q), nprocs=n, join=True, start_method="spawn")
            print(json.dumps(q.get()), flush=True)


if __name__ == "__main__":
    sys.exit(main())
