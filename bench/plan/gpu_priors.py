#!/usr/bin/env python3
"""The GPU priors of `titan plan`, measured with PyTorch on this GPU.

titan plan calibrates a GPU cluster on one published row (8B FSDP8) and
fixes the efficiencies that row cannot tell apart from the matmul's before
any other row is looked at (internal/plan/reference.go): attention at 0.60
of the matmul efficiency, float8 products at 0.75 of it (against the float8
peak), element-wise kernels at 0.70 of the memory bandwidth. This script
measures those ratios on the GPU it runs on, at the shapes of the published
rows, so that the priors can be checked instead of assumed:

  - bf16 matmuls of Llama 3.1 8B's linear layers (16384 tokens: local batch
    2 x 8192) and the same products in float8 (torch._scaled_mm, e4m3,
    tensorwise scales); then one TP8 rank's (98304 tokens, an eighth of
    each product's width: table A), whose efficiency titan plan takes to
    be the same;
  - flash attention (SDPA), forward and forward+backward, at table 1's
    shape (2 x 8192, causal), table 2's CP1 shape (32768, causal) and the
    two block shapes of PyTorch's load-balanced ring at CP >= 2 (32768
    queries x 16384 keys and 16384 x 32768, not causal);
  - element-wise bandwidth: a bf16 add and a float32 scaled difference
    (the ring's output merge), bytes moved per second.

Attention FLOPs are counted as titan plan counts them: 4 x queries x keys x
heads x head_dim for a full block, half of that under a causal mask, and
2.5 times the forward for the backward. Ratios need no peak: attention /
matmul are both bf16 tensor-core rates; float8 / matmul is divided by the
float8-to-bf16 peak ratio (--fp8-peak-ratio, 2 on Hopper).

Prints one JSON object. Needs a CUDA GPU and torch >= 2.1 (SDPA's flash
backend; torch._scaled_mm for float8, skipped where missing).

    python3 bench/plan/gpu_priors.py [--hbm-bytes-per-s 3.35e12]
"""

import argparse
import json
import statistics
import sys

import torch


def timed(fn, warmup=3, reps=10):
    """Median seconds of fn() over reps CUDA-event-timed calls."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b) / 1e3)
    return statistics.median(ts)


def flash_only():
    """A context that restricts SDPA to the flash backend (as torchtitan's
    runs on H100 chose it)."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        return sdpa_kernel([SDPBackend.FLASH_ATTENTION])
    except ImportError:
        return torch.backends.cuda.sdp_kernel(enable_flash=True, enable_math=False, enable_mem_efficient=False)


def matmuls(dev, tokens, tp=1):
    """bf16 and float8 rates (FLOP/s) of the 8B layer's products on one
    of tp tensor-parallel ranks (column-wise wq, wk, w1; row-wise wo, w2)."""
    dim, ffn, kv = 4096, 14336, 1024
    shapes = [(dim, dim // tp), (dim, kv // tp), (dim, ffn // tp), (dim // tp, dim), (ffn // tp, dim)]  # (in, out)
    out = {"bf16": {}, "fp8": {}}
    total = {"bf16": [0.0, 0.0], "fp8": [0.0, 0.0]}
    fp8 = hasattr(torch, "_scaled_mm") and hasattr(torch, "float8_e4m3fn")
    for k, n in shapes:
        x = torch.randn(tokens, k, device=dev, dtype=torch.bfloat16)
        w = torch.randn(n, k, device=dev, dtype=torch.bfloat16)
        flops = 2.0 * tokens * k * n
        s = timed(lambda: x @ w.t())
        out["bf16"][f"{tokens}x{k}x{n}"] = flops / s
        total["bf16"][0] += flops
        total["bf16"][1] += s
        if not fp8:
            continue
        x8, w8 = x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
        one = torch.ones((), device=dev, dtype=torch.float32)

        def f8():
            # torchao's forward product: fast accumulation. Before torch
            # 2.4 the op also returns the output's amax, as a tuple.
            r = torch._scaled_mm(x8, w8.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16, use_fast_accum=True)
            return r[0] if isinstance(r, tuple) else r
        try:
            s = timed(f8)
        except RuntimeError as e:
            out["fp8_error"] = str(e).splitlines()[0]
            fp8 = False
            continue
        out["fp8"][f"{tokens}x{k}x{n}"] = flops / s
        total["fp8"][0] += flops
        total["fp8"][1] += s
    rate = {t: (v[0] / v[1] if v[1] > 0 else None) for t, v in total.items()}
    return out, rate


def attention(dev, batch, heads, q_len, k_len, causal, hd=128):
    """Forward and forward+backward rates (FLOP/s) of flash attention."""
    q = torch.randn(batch, heads, q_len, hd, device=dev, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(batch, heads, k_len, hd, device=dev, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(batch, heads, k_len, hd, device=dev, dtype=torch.bfloat16, requires_grad=True)
    F = torch.nn.functional
    fwd_flops = 4.0 * batch * heads * q_len * k_len * hd * (0.5 if causal else 1.0)
    with flash_only():
        with torch.no_grad():
            sf = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal), reps=5)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        g = torch.randn_like(o)

        def fb():
            o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            o.backward(g)
        sfb = timed(fb, warmup=2, reps=5)
    return {"shape": f"{batch}x{heads}x{q_len}x{k_len}x{hd}{' causal' if causal else ''}",
            "forward_flops_per_s": fwd_flops / sf,
            "forward_backward_flops_per_s": 3.5 * fwd_flops / sfb,
            "backward_over_forward_time": (sfb - sf) / sf}


def elementwise(dev, n=1 << 28):
    """Bytes per second of a bf16 add (two reads, one write) and of the
    ring merge's float32 scaled difference out - s * (out - block)."""
    a = torch.randn(n, device=dev, dtype=torch.bfloat16)
    b = torch.randn(n, device=dev, dtype=torch.bfloat16)
    add = 3 * 2 * n / timed(lambda: a + b)
    o = torch.randn(n // 2, device=dev, dtype=torch.float32)
    blk = torch.randn(n // 2, device=dev, dtype=torch.float32)
    s = torch.rand(n // 2, device=dev, dtype=torch.float32)
    # eager: (o - blk), s * that, o - that: three kernels, nine float32 passes
    merge = 9 * 4 * (n // 2) / timed(lambda: o - s * (o - blk))
    return {"bf16_add_bytes_per_s": add, "fp32_merge_bytes_per_s": merge}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=16384, help="rows of the products (8B FSDP8: local batch 2 x 8192)")
    ap.add_argument("--fp8-peak-ratio", type=float, default=2.0, help="float8 dense peak over bf16 dense peak (2 on Hopper)")
    ap.add_argument("--hbm-bytes-per-s", type=float, default=0, help="the GPU's memory bandwidth, for the element-wise fraction (0: not computed)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("gpu_priors.py: torch sees no CUDA device")
    if not hasattr(torch.nn.functional, "scaled_dot_product_attention"):
        sys.exit(f"gpu_priors.py: torch {torch.__version__} has no scaled_dot_product_attention (needs >= 2.0)")
    dev = torch.device("cuda:0")
    torch.manual_seed(0)
    mm, rate = matmuls(dev, args.tokens)
    # Table A's 8B FSDP8 x TP8 (local batch 12 x 8192): each rank's products
    # are an eighth as wide; titan plan times them at the same efficiency.
    mm8, rate8 = matmuls(dev, 12 * 8192, tp=8)
    attn = [attention(dev, 2, 32, 8192, 8192, True), attention(dev, 1, 32, 32768, 32768, True),
            attention(dev, 1, 32, 32768, 16384, False), attention(dev, 1, 32, 16384, 32768, False)]
    ew = elementwise(dev)
    bf16 = rate["bf16"]
    res = {
        "device": torch.cuda.get_device_name(0), "torch": torch.__version__,
        "matmul": mm, "matmul_bf16_flops_per_s": bf16, "matmul_fp8_flops_per_s": rate["fp8"],
        "matmul_tp8": mm8, "matmul_tp8_bf16_rel": rate8["bf16"] / bf16,
        "matmul_tp8_fp8_rel": rate8["fp8"] / rate["fp8"] if rate8["fp8"] and rate["fp8"] else None,
        "attention": attn, "elementwise": ew,
        # The priors titan plan assumes, measured: attention's rate over
        # the bf16 matmul's (plan: 0.60), float8's efficiency over bf16's
        # (plan: 0.75), element-wise bytes/s over the bandwidth (plan: 0.70).
        "attention_rel": {a["shape"]: a["forward_backward_flops_per_s"] / bf16 for a in attn},
        "fp8_rel": rate["fp8"] / bf16 / args.fp8_peak_ratio if rate["fp8"] else None,
        "elementwise_fraction": {k: v / args.hbm_bytes_per_s for k, v in ew.items()} if args.hbm_bytes_per_s > 0 else None,
        "plan_priors": {"attention_rel": 0.60, "fp8_rel": 0.75, "elementwise": 0.70},
    }
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
