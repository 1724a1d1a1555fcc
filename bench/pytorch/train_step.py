#!/usr/bin/python3
"""PyTorch peer benchmark: float32 CPU training steps of a small Llama 3 model.

Uses the model in internal/model/llama/testdata/reference.py (the same code
that writes titan's golden test file) and times complete training steps:
forward, cross-entropy, backward, clip_grad_norm_(1.0) and AdamW. Prints one
JSON line with the mean step time and tokens per second.

    /usr/bin/python3 bench/pytorch/train_step.py --threads 2 --steps 10
"""

import argparse
import json
import os
import sys
import time

import torch

sys.dont_write_bytecode = True  # keep __pycache__ out of the testdata folder
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "internal", "model", "llama", "testdata"))

import reference  # noqa: E402  (the shared model code)


def require_openblas():
    """Refuse to run on Debian's reference BLAS: without libopenblas0-pthread
    torch silently falls back to it, about 25x slower, which would make any
    comparison meaningless."""
    a = torch.randn(64, 64)
    (a @ a).sum().item()  # load the BLAS
    with open("/proc/self/maps") as f:
        maps = f.read()
    if "openblas" not in maps:
        blas = sorted({l.split()[-1] for l in maps.splitlines() if "blas" in l.lower() and "/" in l})
        sys.exit("train_step.py: torch is not using OpenBLAS (loaded: %s); "
                 "install libopenblas0-pthread (apt-get install libopenblas0-pthread) and retry"
                 % (", ".join(blas) or "no BLAS library"))


def main():
    require_openblas()
    ap = argparse.ArgumentParser(description="PyTorch Llama 3 training-step benchmark")
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                    help="torch intra-op threads (default: the CPUs this process may use)")
    ap.add_argument("--steps", type=int, default=10, help="timed steps")
    ap.add_argument("--warmup", type=int, default=3, help="untimed warm-up steps")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=0, help="0: same as --heads")
    ap.add_argument("--ffn", type=int, default=768)
    ap.add_argument("--vocab", type=int, default=2000)
    ap.add_argument("--attention", choices=["fused", "explicit"], default="fused",
                    help="fused: scale+mask folded into one baddbmm (exact); "
                         "explicit: matmul, scale, masked_fill (the reference path)")
    ap.add_argument("--autocast", choices=["none", "bfloat16"], default="none",
                    help="bfloat16: forward under torch.autocast('cpu', dtype=torch.bfloat16), PyTorch's CPU mixed precision")
    args = ap.parse_args()
    if args.steps < 1:
        ap.error("--steps must be at least 1")

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg = reference.LlamaConfig(
        dim=args.dim, n_layers=args.layers, n_heads=args.heads,
        n_kv_heads=args.kv_heads or args.heads, vocab_size=args.vocab,
        ffn_hidden=args.ffn)
    model = reference.Transformer(cfg, attention=args.attention)
    reference.init_params(model, seed=1, std=0.02)

    g = torch.Generator().manual_seed(2)
    seq = torch.randint(0, cfg.vocab_size, (args.batch, args.seq + 1), generator=g)
    tokens, targets = seq[:, :-1].contiguous(), seq[:, 1:].contiguous()
    freqs_cis = reference.precompute_freqs_cis(cfg, args.seq)

    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=3e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)

    import contextlib
    amp = (torch.autocast("cpu", dtype=torch.bfloat16) if args.autocast == "bfloat16"
           else contextlib.nullcontext())

    def step():
        opt.zero_grad(set_to_none=True)
        with amp:
            _, loss = reference.loss_fn(model, tokens, targets, freqs_cis)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, max_norm=1.0)
        opt.step()
        return loss.item()

    for _ in range(args.warmup):
        step()
    start = time.perf_counter()
    for _ in range(args.steps):
        loss = step()
    elapsed = time.perf_counter() - start

    step_s = elapsed / args.steps
    print(json.dumps({
        "impl": "pytorch",
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "attention": args.attention,
        "autocast": args.autocast,
        "batch": args.batch, "seq": args.seq,
        "step_ms": round(step_s * 1e3, 2),
        "tokens_per_sec": round(args.batch * args.seq / step_s, 1),
        "loss": round(loss, 6),
    }))


if __name__ == "__main__":
    main()
