#!/usr/bin/env python3
"""PyTorch reference of `make gpu-check`: training steps of the same Llama as
titan on the same GPU, in PyTorch eager with bfloat16 autocast (float32
master weights, AdamW), using the model of internal/model/llama/testdata/
reference.py with fused (SDPA) attention. Prints one JSON line: step time,
tokens per second and MFU against the peak given on the command line (the
peak `titan devices` computes for this GPU), with titan's FLOPs per token
(6 x non-embedding parameters + 12 x layers x dim x seq).

    python3 bench/gpu/torch_llama.py --peak-tflops 989.5 --steps 10
"""

import argparse
import json
import os
import sys
import time

import torch

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "internal", "model", "llama", "testdata"))

import reference  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--dim", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--ffn", type=int, default=8192)
    ap.add_argument("--peak-tflops", type=float, required=True)
    ap.add_argument("--compile", action="store_true", help="torch.compile the model (default: eager)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("torch_llama.py: torch sees no CUDA device")
    dev = torch.device("cuda:0")
    torch.manual_seed(0)
    cfg = reference.LlamaConfig(dim=args.dim, n_layers=args.layers, n_heads=args.heads,
                                n_kv_heads=args.kv_heads, vocab_size=args.vocab, ffn_hidden=args.ffn)
    cfg.rope_scaling.factor = 32.0
    model = reference.Transformer(cfg, attention="fused")
    reference.init_params(model, seed=1, std=0.02)
    model.to(dev)
    fwd = torch.compile(model) if args.compile else model
    g = torch.Generator().manual_seed(2)
    seq = torch.randint(0, cfg.vocab_size, (args.batch, args.seq + 1), generator=g).to(dev)
    tokens, targets = seq[:, :-1].contiguous(), seq[:, 1:].contiguous()
    freqs_cis = reference.precompute_freqs_cis(cfg, args.seq).to(dev)
    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=3e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, fused=True)

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            _, loss = reference.loss_fn(fwd, tokens, targets, freqs_cis)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, max_norm=1.0)
        opt.step()
        return loss

    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(args.steps):
        loss = step()
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    step_s = elapsed / args.steps
    n_params = sum(p.numel() for p in params)
    non_emb = n_params - cfg.vocab_size * cfg.dim
    flops_per_token = 6 * non_emb + 12 * cfg.n_layers * cfg.dim * args.seq
    tps = args.batch * args.seq / step_s
    print(json.dumps({
        "impl": "pytorch-compile" if args.compile else "pytorch-eager",
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(0),
        "params": n_params,
        "batch": args.batch, "seq": args.seq,
        "step_ms": round(step_s * 1e3, 1),
        "tokens_per_sec": round(tps, 1),
        "mfu": round(tps * flops_per_token / (args.peak_tflops * 1e12), 4),
        "max_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2),
        "loss": round(float(loss), 4),
    }))


if __name__ == "__main__":
    main()
