"""PyTorch's float32 and bfloat16 matmul on titan's linear-layer shapes.

Reads shapes from stdin, one per line: "name transA transB m n k beta"
(as `TestPrintLinearShapes` in internal/backend/cpu/gemm prints them),
and for each times C = op(A)·op(B) (beta 0: matmul into a preallocated
C) or C += op(A)·op(B) (beta 1: addmm_), with A stored k×m when transA
and B stored n×k when transB, as titan's benchmark does. float32 runs on
PyTorch's BLAS, bfloat16 (A, B and C in bfloat16) on oneDNN.

Prints one line per shape and dtype: "threads=T/f32/NAME GFLOP/s" and
"threads=T/bf16/NAME GFLOP/s".

Usage: matmul.py --threads T [--seconds S] < shapes.txt
"""
import argparse
import sys
import time

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--seconds", type=float, default=1.0)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    for line in sys.stdin:
        if not line.strip():
            continue
        name, ta, tb, m, n, k, beta = line.split()
        ta, tb, m, n, k, beta = ta == "1", tb == "1", int(m), int(n), int(k), float(beta)
        for label, dt in (("f32", torch.float32), ("bf16", torch.bfloat16)):
            a = torch.randn(k, m) if ta else torch.randn(m, k)
            b = torch.randn(n, k) if tb else torch.randn(k, n)
            a, b = a.to(dt), b.to(dt)
            opa = a.t() if ta else a
            opb = b.t() if tb else b
            c = torch.zeros(m, n, dtype=dt)
            if beta == 0:
                def run():
                    torch.matmul(opa, opb, out=c)
            else:
                def run():
                    c.addmm_(opa, opb)
            for _ in range(3):
                run()
            iters = 0
            start = time.perf_counter()
            while True:
                run()
                iters += 1
                el = time.perf_counter() - start
                if el >= args.seconds:
                    break
            gflops = 2.0 * m * n * k * iters / el / 1e9
            print(f"threads={args.threads}/{label}/{name} {gflops:.1f}", flush=True)


if __name__ == "__main__":
    main()
