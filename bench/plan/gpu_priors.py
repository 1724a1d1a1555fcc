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
    (the ring's output merge), bytes moved per second;
  - SDPA's default backend against flash alone at table 2's CP1 shape
    (torchtitan 9dec370 restricts SDPA to flash or efficient attention
    only when context parallelism is on);
  - one context-parallel rank's attention in one layer as PyTorch's
    load-balanced ring runs it (rotate method allgather; 8B's 32 query
    heads, the key/value heads repeated to them; 32768 tokens a rank, as
    in every row of table 2), at cp 1, 2, 4 and 8: the all-gathered
    key/value buffer, cp flash blocks forward, the recomputation (full AC)
    and cp blocks backward, the eager float32 merges, the concatenations
    before every exchange and the float32 key/value gradients passed
    around the ring. The transfers need cp GPUs and are left out;
    everything one rank computes and allocates is in. Then the same with
    the device filled until only the ring's working set and a margin are
    free, as the published rows ran at 84 GiB of 95. Published, the
    attention time a rank spends per block is about 1.2x CP1's at cp 2
    and 1.9-2x at cp 4 and 8 (bench/plan/README.md); titan plan assumes
    the same per block. If one rank alone reproduces the growth, the
    merges or the allocator explain it; if not, it needs the cp GPUs.

Attention FLOPs are counted as titan plan counts them: 4 x queries x keys x
heads x head_dim for a full block, half of that under a causal mask, and
2.5 times the forward for the backward. Ratios need no peak: attention /
matmul are both bf16 tensor-core rates; float8 / matmul is divided by the
float8-to-bf16 peak ratio (--fp8-peak-ratio, 2 on Hopper).

Prints one JSON object. Needs a CUDA GPU and torch >= 2.1 (SDPA's flash
backend; torch._scaled_mm for float8, skipped where missing). --smoke runs
every part at toy shapes on whatever device there is (the CPU and Debian's
torch 1.13 included, with a plain softmax in place of flash attention), so
that the one run a lent GPU allows is not lost to a mistake in this script:
its figures mean nothing.

    python3 bench/plan/gpu_priors.py [--hbm-bytes-per-s 3.35e12] > priors.json
    titan plan --reference --priors priors.json   # the published rows under them
    python3 bench/plan/gpu_priors.py --smoke
"""

import argparse
import contextlib
import json
import math
import statistics
import sys
import time

import torch
import torch.nn.functional as F


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, dev, warmup=3, reps=10):
    """Median seconds of fn() over reps calls, the device synchronised
    around each."""
    for _ in range(warmup):
        fn()
    sync(dev)
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync(dev)
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def sdpa_backend(*names):
    """A context that restricts SDPA to the named backends (FLASH_ATTENTION,
    EFFICIENT_ATTENTION, CUDNN_ATTENTION); none: SDPA's own choice."""
    if not names or not torch.cuda.is_available():
        return contextlib.nullcontext()
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        return sdpa_kernel([getattr(SDPBackend, n) for n in names])
    except (ImportError, AttributeError):
        return torch.backends.cuda.sdp_kernel(enable_flash="FLASH_ATTENTION" in names, enable_math=False,
                                              enable_mem_efficient="EFFICIENT_ATTENTION" in names)


def has_flash(dev):
    return dev.type == "cuda" and hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention")


def plain_block(q, k, v, causal):
    """out and logsumexp of one attention block by a plain softmax (the
    smoke test's stand-in for flash attention)."""
    s = (q.float() @ k.float().transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    return (torch.softmax(s, -1) @ v.float()).to(q.dtype), torch.logsumexp(s, -1)


def block_fwd(q, k, v, causal):
    """One block of ring attention: (out, logsumexp, what its backward
    needs), with flash attention's ATen op as PyTorch's ring calls it."""
    if has_flash(q.device):
        r = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal)
        # What the backward needs besides the merged output and logsumexp
        # (sequence bounds, the RNG state): the block's own output is not
        # kept, as PyTorch's ring keeps none.
        return r[0], r[1], (None, None) + tuple(r[2:])
    out, lse = plain_block(q, k, v, causal)
    return out, lse, None


def block_bwd(dout, q, k, v, out, lse, causal, meta):
    """The block's gradients of q, k and v given the merged output and
    logsumexp, as PyTorch's ring backward calls flash's backward op (else
    the same arithmetic written out: probabilities from the merged
    logsumexp, D = rowsum(dout * out))."""
    if meta is not None:
        g = torch.ops.aten._scaled_dot_product_flash_attention_backward(
            dout, q, k, v, out, lse, meta[2], meta[3], meta[4], meta[5], 0.0, causal, meta[6], meta[7])
        return g[0], g[1], g[2]
    scale = 1 / math.sqrt(q.shape[-1])
    qf, kf, vf, of, dof = (t.float() for t in (q, k, v, out, dout))
    s = (qf @ kf.transpose(-1, -2)) * scale
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    p = torch.exp(s - lse.float().unsqueeze(-1))
    dv = p.transpose(-1, -2) @ dof
    ds = p * (dof @ vf.transpose(-1, -2) - (dof * of).sum(-1, keepdim=True))
    return tuple(x.to(q.dtype) for x in ((ds @ kf) * scale, (ds.transpose(-1, -2) @ qf) * scale, dv))


def sdpa(q, k, v, causal):
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return plain_block(q, k, v, causal)[0]


def matmuls(dev, tokens, dim=4096, ffn=14336, kv=1024, tp=1):
    """bf16 and float8 rates (FLOP/s) of the 8B layer's products on one
    of tp tensor-parallel ranks (column-wise wq, wk, w1; row-wise wo, w2)."""
    shapes = [(dim, dim // tp), (dim, kv // tp), (dim, ffn // tp), (dim // tp, dim), (ffn // tp, dim)]  # (in, out)
    out = {"bf16": {}, "fp8": {}}
    total = {"bf16": [0.0, 0.0], "fp8": [0.0, 0.0]}
    fp8 = dev.type == "cuda" and hasattr(torch, "_scaled_mm") and hasattr(torch, "float8_e4m3fn")
    for k, n in shapes:
        x = torch.randn(tokens, k, device=dev, dtype=torch.bfloat16)
        w = torch.randn(n, k, device=dev, dtype=torch.bfloat16)
        flops = 2.0 * tokens * k * n
        s = timed(lambda: x @ w.t(), dev)
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
            s = timed(f8, dev)
        except RuntimeError as e:
            out["fp8_error"] = str(e).splitlines()[0]
            fp8 = False
            continue
        out["fp8"][f"{tokens}x{k}x{n}"] = flops / s
        total["fp8"][0] += flops
        total["fp8"][1] += s
    rate = {t: (v[0] / v[1] if v[1] > 0 else None) for t, v in total.items()}
    return out, rate


def attention(dev, batch, heads, q_len, k_len, causal, hd=128, backends=("FLASH_ATTENTION",)):
    """Forward and forward+backward rates (FLOP/s) of SDPA restricted to
    backends (empty: its own choice)."""
    q = torch.randn(batch, heads, q_len, hd, device=dev, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(batch, heads, k_len, hd, device=dev, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(batch, heads, k_len, hd, device=dev, dtype=torch.bfloat16, requires_grad=True)
    fwd_flops = 4.0 * batch * heads * q_len * k_len * hd * (0.5 if causal else 1.0)
    with sdpa_backend(*backends):
        with torch.no_grad():
            sf = timed(lambda: sdpa(q, k, v, causal), dev, reps=5)
        g = torch.randn_like(sdpa(q, k, v, causal))

        def fb():
            sdpa(q, k, v, causal).backward(g)
        sfb = timed(fb, dev, warmup=2, reps=5)
    return {"shape": f"{batch}x{heads}x{q_len}x{k_len}x{hd}{' causal' if causal else ''}",
            "backends": list(backends) or "default",
            "forward_flops_per_s": fwd_flops / sf,
            "forward_backward_flops_per_s": 3.5 * fwd_flops / sfb,
            "backward_over_forward_time": (sfb - sf) / sf}


def elementwise(dev, n=1 << 28):
    """Bytes per second of a bf16 add (two reads, one write) and of the
    ring merge's float32 scaled difference out - s * (out - block)."""
    a = torch.randn(n, device=dev, dtype=torch.bfloat16)
    b = torch.randn(n, device=dev, dtype=torch.bfloat16)
    add = 3 * 2 * n / timed(lambda: a + b, dev)
    o = torch.randn(n // 2, device=dev, dtype=torch.float32)
    blk = torch.randn(n // 2, device=dev, dtype=torch.float32)
    s = torch.rand(n // 2, device=dev, dtype=torch.float32)
    # eager: (o - blk), s * that, o - that: three kernels, nine float32 passes
    merge = 9 * 4 * (n // 2) / timed(lambda: o - s * (o - blk), dev)
    return {"bf16_add_bytes_per_s": add, "fp32_merge_bytes_per_s": merge}


class RingRank:
    """One rank of PyTorch's load-balanced ring attention (torch 2.6's
    _templated_ring_attention and its backward, rotate method allgather)
    for one layer: rank `rank` of cp, s local tokens (chunks rank and
    2cp-1-rank of the sequence), heads query heads with the key/value heads
    already repeated to them (Llama's repeat_kv comes before SDPA)."""

    def __init__(self, dev, cp, rank, s, heads, hd, whole=None):
        self.dev, self.cp, self.rank, self.half = dev, cp, rank, s // 2
        if whole is None:  # timing: every rank's shards alike
            shape = (1, heads, s, hd)
            self.q, self.k, self.v = (torch.randn(shape, device=dev, dtype=torch.bfloat16) for _ in range(3))
            self.dout = torch.randn(shape, device=dev, dtype=torch.bfloat16)
            self.others = None
        else:  # checking: (q, k, v, dout) of the whole sequence, cut as the load balancer cuts it
            self.q, self.k, self.v, self.dout = (self.shard(t, rank) for t in whole)
            self.others = [(self.shard(whole[1], j), self.shard(whole[2], j)) for j in range(cp)]

    def shard(self, t, rank):
        """Rank rank's tokens of t: chunks rank and 2cp-1-rank of 2cp."""
        c = t.chunk(2 * self.cp, dim=2)
        return torch.cat([c[rank], c[2 * self.cp - 1 - rank]], dim=2)

    def gathered(self):
        """The all-gathered key/value buffer in ring order (step i holds rank
        rank-i's): cp ranks' concatenated k and v. The transfer needs cp
        GPUs; what one rank does is here: the concatenation, the buffer,
        and its writes (of its own shards where the others' are unknown)."""
        local = torch.cat([self.k.flatten(), self.v.flatten()])
        buf = torch.empty(self.cp * local.numel(), device=self.dev, dtype=local.dtype)
        if self.others is None:
            buf.view(self.cp, -1).copy_(local.expand(self.cp, -1))
        else:
            for j, (k, v) in enumerate(self.others):
                buf.view(self.cp, -1)[j].copy_(torch.cat([k.flatten(), v.flatten()]))
        n = self.k.numel()
        chunks = buf.chunk(self.cp)
        return [(c[:n].view(self.k.shape), c[n:].view(self.v.shape))
                for c in (chunks[(self.rank - i) % self.cp] for i in range(self.cp))]

    def pick(self, i, k, v):
        """Step i's block: (q, k, v, causal, which query half (None: both),
        which key half)."""
        h = self.half
        if i == 0:
            return self.q, k, v, True, None, None
        if i <= self.rank:  # keys from an earlier rank: its first chunk, every query
            return self.q, k[:, :, :h], v[:, :, :h], False, None, 0
        return self.q[:, :, h:], k, v, False, 1, None  # a later rank: our second chunk's queries, all its keys

    def forward(self):
        """cp blocks and the eager float32 merges; returns the merged
        output, logsumexp and each block's metadata for the backward."""
        out = lse = None
        metas = []
        for i, (k, v) in enumerate(self.gathered()):
            if 0 < i < self.cp - 1:
                torch.cat([k.flatten(), v.flatten()])  # the buffer PyTorch's forward builds before every exchange
            q, k, v, causal, qhalf, _ = self.pick(i, k, v)
            bo, bl, meta = block_fwd(q, k, v, causal)
            metas.append(meta)
            bl = bl.unsqueeze(-1).float()
            if out is None:
                out, lse = bo.float(), bl
                continue
            o, l = (out, lse) if qhalf is None else (out[:, :, self.half:], lse[:, :, self.half:])
            o = o - torch.sigmoid(bl - l) * (o - bo)
            l = l - F.logsigmoid(l - bl)
            if qhalf is None:
                out, lse = o, l
            else:  # PyTorch rebuilds the whole buffers by concatenation
                out = torch.cat([out[:, :, : self.half], o], dim=2)
                lse = torch.cat([lse[:, :, : self.half], l], dim=2)
        return out.to(self.q.dtype), lse.squeeze(-1), metas

    def backward(self, out, lse, metas):
        """cp blocks backward: float32 accumulators of dq and of the
        key/value gradients received from the ring (a fresh buffer each
        step), the concatenations before every exchange."""
        h = self.half
        dq = torch.zeros(self.q.shape, device=self.dev, dtype=torch.float32)
        dk = dv = sent = None
        for i, (k, v) in enumerate(self.gathered()):
            if i != self.cp - 1:
                torch.cat([k.flatten(), v.flatten()])  # the buffer PyTorch builds to pass on
            q, kk, vv, causal, qhalf, khalf = self.pick(i, k, v)
            o, do, l = (out, self.dout, lse) if qhalf is None else (out[:, :, h:], self.dout[:, :, h:], lse[:, :, h:].contiguous())
            gq, gk, gv = block_bwd(do, q, kk, vv, o, l, causal, metas[i])
            if i == 0:
                dk, dv = torch.zeros(self.k.shape, device=self.dev, dtype=torch.float32), torch.zeros(self.v.shape, device=self.dev, dtype=torch.float32)
            else:  # the previous rank's gradients arrive (its buffer, sent on, is ours here)
                recv = torch.empty_like(sent).copy_(sent)
                dk, dv = recv[: self.k.numel()].view(self.k.shape), recv[self.k.numel():].view(self.v.shape)
            if khalf is not None:
                dk = torch.cat([dk[:, :, :h] + gk, dk[:, :, h:]], dim=2)
                dv = torch.cat([dv[:, :, :h] + gv, dv[:, :, h:]], dim=2)
            else:
                dk, dv = dk + gk, dv + gv
            sent = torch.cat([dk.flatten(), dv.flatten()])  # the gradients passed on
            if qhalf is None:
                dq += gq
            else:
                dq = torch.cat([dq[:, :, :h], dq[:, :, h:] + gq], dim=2)
        return dq.to(self.q.dtype)

    def layer(self):
        """A layer under full activation checkpointing: forward, the
        recomputed forward, backward."""
        self.forward()
        out, lse, metas = self.forward()
        self.backward(out, lse, metas)


def ring(dev, s, heads, hd, cps=(1, 2, 4, 8), fill=False, reps=3):
    """Seconds of a layer's attention on one cp rank at each cp (the middle
    rank, whose blocks are half of each kind), and seconds per block against
    cp 1's. fill: first allocate what leaves only twice the largest
    working set free, and count the caching allocator's retries."""
    res = {"tokens_per_rank": s, "heads": heads, "head_dim": hd, "filled": fill, "cp": {}}
    filler = None
    if fill and dev.type == "cuda":
        torch.cuda.empty_cache()
        probe = RingRank(dev, max(cps), max(cps) // 2, s, heads, hd)
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        probe.layer()
        sync(dev)
        need = torch.cuda.max_memory_allocated() - base
        del probe
        torch.cuda.empty_cache()
        free, total = torch.cuda.mem_get_info()
        spare = max(0, free - 2 * need)
        filler = torch.empty(spare, dtype=torch.uint8, device=dev)
        res.update(working_set_bytes=need, filled_bytes=spare, device_bytes=total)
    per_block1 = None
    for cp in cps:
        r = RingRank(dev, cp, cp // 2, s, heads, hd)
        retries = torch.cuda.memory_stats().get("num_alloc_retries", 0) if dev.type == "cuda" else 0
        t = timed(r.layer, dev, warmup=1, reps=reps)
        retries = (torch.cuda.memory_stats().get("num_alloc_retries", 0) if dev.type == "cuda" else 0) - retries
        per_block = t / cp
        per_block1 = per_block1 or per_block
        res["cp"][str(cp)] = {"layer_s": t, "per_block_s": per_block, "per_block_vs_cp1": per_block / per_block1, "alloc_retries": retries}
        del r
    del filler
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return res


def ring_check(dev, cp=4, s=32, heads=2, hd=8):
    """Float32 on the CPU: every rank's merged forward output and query
    gradient from RingRank against causal attention over the whole
    sequence and autograd (largest absolute differences). The emulation
    is PyTorch's algorithm only if these are rounding."""
    torch.manual_seed(1)
    whole = [torch.randn(1, heads, cp * s, hd, dtype=torch.float32) for _ in range(4)]
    q, k, v = (t.clone().requires_grad_() for t in whole[:3])
    out, _ = plain_block(q, k, v, True)
    out.backward(whole[3])
    worst = {"forward": 0.0, "dq": 0.0}
    for rank in range(cp):
        r = RingRank(torch.device("cpu"), cp, rank, s, heads, hd, whole=[t.float() for t in whole])
        for t in (r.q, r.k, r.v, r.dout):
            assert t.dtype == torch.float32
        o, lse, metas = r.forward()
        dq = r.backward(o.float(), lse, metas)
        worst["forward"] = max(worst["forward"], (o.float() - r.shard(out.detach(), rank)).abs().max().item())
        worst["dq"] = max(worst["dq"], (dq.float() - r.shard(q.grad, rank)).abs().max().item())
    return worst


# Memory bandwidth (bytes/s) by the device names torch reports, from the
# vendors' data sheets, for the element-wise fraction.
HBM = [("H100 80GB HBM3", 3.35e12), ("H100 PCIe", 2.0e12), ("H100 NVL", 3.9e12), ("H200", 4.8e12),
       ("A100-SXM4-80GB", 2.039e12), ("A100 80GB PCIe", 1.935e12), ("A100-SXM4-40GB", 1.555e12), ("B200", 8.0e12)]


def hbm_of(name):
    return next((bw for key, bw in HBM if key in name), 0)


def part(results, name, fn):
    """Runs one measurement; a failure is recorded, not fatal, so that the
    other parts of the one GPU run still report."""
    try:
        results[name] = fn()
    except Exception as e:  # noqa: BLE001 - any failure of one part
        results[name] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
        results.setdefault("errors", []).append(name)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=16384, help="rows of the products (8B FSDP8: local batch 2 x 8192)")
    ap.add_argument("--fp8-peak-ratio", type=float, default=2.0, help="float8 dense peak over bf16 dense peak (2 on Hopper)")
    ap.add_argument("--hbm-bytes-per-s", type=float, default=None,
                    help="the GPU's memory bandwidth, for the element-wise fraction (default: from the device's name where known; 0: not computed)")
    ap.add_argument("--smoke", action="store_true", help="toy shapes on any device: checks that the script runs, measures nothing")
    args = ap.parse_args()
    if args.smoke:
        dev = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
        tokens, dims, seq, heads, hd, ew = 64, dict(dim=64, ffn=128, kv=16), 128, 4, 16, 1 << 12
    else:
        if not torch.cuda.is_available():
            sys.exit("gpu_priors.py: torch sees no CUDA device (--smoke runs the script on the CPU, measuring nothing)")
        if not hasattr(F, "scaled_dot_product_attention"):
            sys.exit(f"gpu_priors.py: torch {torch.__version__} has no scaled_dot_product_attention (needs >= 2.0)")
        dev = torch.device("cuda:0")
        tokens, dims, seq, heads, hd, ew = args.tokens, {}, 32768, 32, 128, 1 << 28
    torch.manual_seed(0)
    res = {"device": torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu", "torch": torch.__version__, "smoke": args.smoke}
    part(res, "matmul", lambda: matmuls(dev, tokens, **dims))
    # Table A's 8B FSDP8 x TP8 (local batch 12 x 8192): each rank's products
    # are an eighth as wide; titan plan times them at the same efficiency.
    part(res, "matmul_tp8", lambda: matmuls(dev, 6 * tokens, tp=8, **dims))
    s, h2 = seq, seq // 2
    part(res, "attention", lambda: [attention(dev, 2, heads, s // 4, s // 4, True, hd), attention(dev, 1, heads, s, s, True, hd),
                                    attention(dev, 1, heads, s, h2, False, hd), attention(dev, 1, heads, h2, s, False, hd)])
    # The CP1 row runs without context parallelism: SDPA picks its backend.
    part(res, "attention_default_backend", lambda: attention(dev, 1, heads, s, s, True, hd, backends=()))
    part(res, "elementwise", lambda: elementwise(dev, ew))
    if args.smoke:
        part(res, "ring_check", lambda: ring_check(dev))
    part(res, "ring", lambda: ring(dev, s, heads, hd))
    part(res, "ring_filled", lambda: ring(dev, s, heads, hd, fill=True))
    # The priors titan plan assumes, measured: attention's rate over the
    # bf16 matmul's (plan: 0.60), float8's efficiency over bf16's (plan:
    # 0.75), element-wise bytes/s over the bandwidth (plan: 0.70).
    mm = res.get("matmul")
    bf16 = mm[1]["bf16"] if isinstance(mm, tuple) else None
    fp8 = mm[1]["fp8"] if isinstance(mm, tuple) else None
    mm8 = res.get("matmul_tp8")
    if bf16:
        res["matmul_bf16_flops_per_s"], res["matmul_fp8_flops_per_s"] = bf16, fp8
        if isinstance(mm8, tuple):
            res["matmul_tp8_bf16_rel"] = mm8[1]["bf16"] / bf16
            res["matmul_tp8_fp8_rel"] = mm8[1]["fp8"] / fp8 if mm8[1]["fp8"] and fp8 else None
        if isinstance(res.get("attention"), list):
            res["attention_rel"] = {a["shape"]: a["forward_backward_flops_per_s"] / bf16 for a in res["attention"]}
        res["fp8_rel"] = fp8 / bf16 / args.fp8_peak_ratio if fp8 else None
    hbm = args.hbm_bytes_per_s if args.hbm_bytes_per_s is not None else hbm_of(res["device"])
    res["hbm_bytes_per_s"] = hbm or None
    if hbm > 0 and "error" not in res.get("elementwise", {"error": 1}):
        res["elementwise_fraction"] = {k: v / hbm for k, v in res["elementwise"].items()}
    res["plan_priors"] = {"attention_rel": 0.60, "fp8_rel": 0.75, "elementwise": 0.70}
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
