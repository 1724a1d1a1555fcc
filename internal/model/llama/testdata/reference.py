#!/usr/bin/python3
"""PyTorch reference for titan's Llama 3 model (in the style of llm.c's test_gpt2).

Running this script builds a tiny Llama 3 model in plain float32 PyTorch on the
CPU, runs one forward/backward pass and ten AdamW steps on a fixed batch, and
writes every input, parameter, activation and gradient that titan's Go tests
compare against to llama_tiny_reference.bin next to this file.

The model code (LlamaConfig, Transformer, precompute_freqs_cis, ...) is also
imported by bench/pytorch/train_step.py, so the benchmark and the golden file
use the same math.

Only torch, numpy and the standard library are used. Regenerate with:

    /usr/bin/python3 internal/model/llama/testdata/reference.py

File format (little-endian):

    8 bytes   magic "TITANREF"
    uint32    version (1)
    uint32    header length H
    H bytes   UTF-8 JSON: {"config": {...}, "tensors": [{"name", "dtype",
              "shape", "offset"}, ...]}; padded with spaces so the data
              section starts at a multiple of 4 bytes
    data      raw float32/int32 tensors in the listed order; "offset" is the
              byte offset of each tensor from the start of the data section
"""

import argparse
import json
import math
import os
import struct
import sys
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

MAGIC = b"TITANREF"
VERSION = 1


# ---------------------------------------------------------------------------
# Model


@dataclass
class RopeScaling:
    """Llama 3.1 RoPE frequency scaling parameters."""

    factor: float = 8.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclass
class LlamaConfig:
    """Shape and numerics of a Llama 3 model."""

    dim: int = 32
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int = 2
    vocab_size: int = 64
    ffn_hidden: int = 0  # 0: derive from dim and multiple_of like Llama 3
    multiple_of: int = 16
    norm_eps: float = 1e-5
    rope_theta: float = 500000.0
    rope_scaling: RopeScaling = field(default_factory=RopeScaling)

    def __post_init__(self):
        if self.dim % self.n_heads != 0:
            raise ValueError(f"dim {self.dim} not divisible by n_heads {self.n_heads}")
        if self.n_heads % self.n_kv_heads != 0:
            raise ValueError(
                f"n_heads {self.n_heads} not divisible by n_kv_heads {self.n_kv_heads}")
        if self.head_dim % 2 != 0:
            raise ValueError(f"head_dim {self.head_dim} must be even for RoPE")
        if self.ffn_hidden == 0:
            self.ffn_hidden = llama_ffn_hidden(self.dim, self.multiple_of)

    @property
    def head_dim(self):
        return self.dim // self.n_heads


def llama_ffn_hidden(dim, multiple_of):
    """SwiGLU hidden size: 2/3 of 4*dim, rounded up to a multiple of multiple_of."""
    hidden = int(2 * (4 * dim) / 3)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


def rope_frequencies(head_dim, theta, scaling):
    """Per-pair rotation frequencies (float64) with Llama 3.1 scaling applied.

    freq_i = 1 / theta^(2i/head_dim) for i < head_dim/2. High frequencies
    (wavelength below original/high_freq_factor) are kept, low frequencies
    (wavelength above original/low_freq_factor) are divided by factor, and
    the band in between is interpolated linearly in original/wavelength.
    """
    i = torch.arange(0, head_dim, 2, dtype=torch.float64)[: head_dim // 2]
    freqs = 1.0 / (theta ** (i / head_dim))
    if scaling is None:
        return freqs
    orig = float(scaling.original_max_position_embeddings)
    low, high = scaling.low_freq_factor, scaling.high_freq_factor
    wavelen = 2.0 * math.pi / freqs
    smooth = (orig / wavelen - low) / (high - low)
    mid = (1.0 - smooth) * freqs / scaling.factor + smooth * freqs
    out = torch.where(wavelen > orig / low, freqs / scaling.factor, mid)
    out = torch.where(wavelen < orig / high, freqs, out)
    return out


def precompute_freqs_cis(cfg, seq_len, dtype=torch.complex64):
    """cis(t * freq_i) as a complex [seq_len, head_dim/2] tensor.

    The angles are computed in float64 and rounded once to the requested
    complex dtype.
    """
    freqs = rope_frequencies(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
    t = torch.arange(seq_len, dtype=torch.float64)
    angles = torch.outer(t, freqs)
    return torch.polar(torch.ones_like(angles), angles).to(dtype)


def apply_rope(x, freqs_cis):
    """Rotates pairs (2i, 2i+1) of the last dim of x [B, T, H, HD] by freqs_cis [T, HD/2]."""
    xc = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2))
    xc = xc * freqs_cis[None, :, None, :]
    return torch.view_as_real(xc).flatten(3)


class RMSNorm(nn.Module):
    """y = x * rsqrt(mean(x^2, -1) + eps) * weight."""

    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Attention(nn.Module):
    """Causal grouped-query self-attention with RoPE on q and k.

    attention="explicit" computes scores = (q k^T) * scale, masks them with
    -inf above the diagonal and takes the softmax; "fused" computes the same
    scores with one baddbmm (mask + scale * q k^T, the mask additive 0/-inf),
    which is faster on the CPU and differs only in float32 rounding.
    """

    def __init__(self, cfg, attention="explicit"):
        super().__init__()
        if attention not in ("explicit", "fused"):
            raise ValueError(f"unknown attention implementation {attention!r}")
        self.attention = attention
        self.n_heads = cfg.n_heads
        self.n_kv_heads = cfg.n_kv_heads
        self.head_dim = cfg.head_dim
        self.wq = nn.Linear(cfg.dim, cfg.n_heads * cfg.head_dim, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.wo = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.dim, bias=False)

    def forward(self, x, freqs_cis, mask):
        B, T, _ = x.shape
        q = self.wq(x).view(B, T, self.n_heads, self.head_dim)
        k = self.wk(x).view(B, T, self.n_kv_heads, self.head_dim)
        v = self.wv(x).view(B, T, self.n_kv_heads, self.head_dim)
        q = apply_rope(q, freqs_cis)
        k = apply_rope(k, freqs_cis)
        rep = self.n_heads // self.n_kv_heads
        if rep > 1:
            # Query head h reads kv head h // rep.
            k = k.repeat_interleave(rep, dim=2)
            v = v.repeat_interleave(rep, dim=2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [B, H, T, HD]
        scale = 1.0 / math.sqrt(self.head_dim)
        if self.attention == "fused":
            H = self.n_heads
            bias = torch.zeros(T, T, dtype=q.dtype).masked_fill(mask, float("-inf"))
            scores = torch.baddbmm(bias.expand(B * H, T, T),
                                   q.reshape(B * H, T, self.head_dim),
                                   k.reshape(B * H, T, self.head_dim).transpose(1, 2),
                                   alpha=scale).view(B, H, T, T)
        else:
            scores = (q @ k.transpose(-2, -1)) * scale
            scores = scores.masked_fill(mask, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out = (probs @ v).transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim)
        return self.wo(out)


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x)."""

    def __init__(self, cfg):
        super().__init__()
        self.w1 = nn.Linear(cfg.dim, cfg.ffn_hidden, bias=False)
        self.w2 = nn.Linear(cfg.ffn_hidden, cfg.dim, bias=False)
        self.w3 = nn.Linear(cfg.dim, cfg.ffn_hidden, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    """Pre-norm block: h += attn(norm(h)); h += ffn(norm(h))."""

    def __init__(self, cfg, attention="explicit"):
        super().__init__()
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attention = Attention(cfg, attention)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.feed_forward = FeedForward(cfg)

    def forward(self, h, freqs_cis, mask):
        h = h + self.attention(self.attention_norm(h), freqs_cis, mask)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    """Llama 3 decoder: embedding, blocks, final RMSNorm, untied output projection.

    attention selects the Attention implementation ("explicit" or "fused").
    """

    def __init__(self, cfg, attention="explicit"):
        super().__init__()
        self.cfg = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(
            TransformerBlock(cfg, attention) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)

    def forward(self, tokens, freqs_cis):
        T = tokens.shape[1]
        mask = torch.ones(T, T, dtype=torch.bool).triu(1)  # True above the diagonal
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h, freqs_cis[:T], mask)
        return self.output(self.norm(h))


def param_names(cfg):
    """Parameter names in titan's flat-buffer order."""
    names = ["tok_embeddings.weight"]
    for i in range(cfg.n_layers):
        p = f"layers.{i}."
        names += [p + "attention_norm.weight", p + "attention.wq.weight",
                  p + "attention.wk.weight", p + "attention.wv.weight",
                  p + "attention.wo.weight", p + "ffn_norm.weight",
                  p + "feed_forward.w1.weight", p + "feed_forward.w2.weight",
                  p + "feed_forward.w3.weight"]
    return names + ["norm.weight", "output.weight"]


def init_params(model, seed, std):
    """Fills weights with N(0, std^2) and norm weights with 1 + std*N(0, 1), in order."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=torch.float32)
            if name.endswith("norm.weight"):
                p.copy_(1.0 + std * noise)
            else:
                p.copy_(std * noise)


def loss_fn(model, tokens, targets, freqs_cis):
    """Returns (logits, mean cross-entropy over all positions)."""
    logits = model(tokens, freqs_cis)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    return logits, loss


# ---------------------------------------------------------------------------
# Independent checks (float64)


def naive_forward(model, tokens, cfg):
    """Loop-based float64 forward that shares no code with Transformer.forward.

    RoPE is the real rotation x0' = x0 cos - x1 sin, x1' = x0 sin + x1 cos,
    attention walks every (b, h, t) with an explicit kv-head index and causal
    range, and cross-entropy is a direct log-sum-exp.
    """
    P = {n: p.detach().double() for n, p in model.named_parameters()}
    B, T = tokens.shape
    NH, NKV, HD = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    freqs = rope_frequencies(HD, cfg.rope_theta, cfg.rope_scaling)

    def rms(x, w):
        return x / torch.sqrt((x * x).mean(-1, keepdim=True) + cfg.norm_eps) * w

    def rope(x):  # [B, T, H, HD]
        out = x.clone()
        for t in range(T):
            for i in range(HD // 2):
                c, s = math.cos(t * freqs[i].item()), math.sin(t * freqs[i].item())
                x0, x1 = x[:, t, :, 2 * i], x[:, t, :, 2 * i + 1]
                out[:, t, :, 2 * i] = x0 * c - x1 * s
                out[:, t, :, 2 * i + 1] = x0 * s + x1 * c
        return out

    h = P["tok_embeddings.weight"][tokens.long()]
    for l in range(cfg.n_layers):
        p = f"layers.{l}."
        a = rms(h, P[p + "attention_norm.weight"])
        q = rope((a @ P[p + "attention.wq.weight"].T).reshape(B, T, NH, HD))
        k = rope((a @ P[p + "attention.wk.weight"].T).reshape(B, T, NKV, HD))
        v = (a @ P[p + "attention.wv.weight"].T).reshape(B, T, NKV, HD)
        att = torch.zeros(B, T, NH, HD, dtype=torch.float64)
        for b in range(B):
            for hh in range(NH):
                kv = hh // (NH // NKV)
                for t in range(T):
                    s = torch.stack([q[b, t, hh] @ k[b, u, kv] for u in range(t + 1)])
                    s = s / math.sqrt(HD)
                    w = torch.exp(s - s.max())
                    w = w / w.sum()
                    att[b, t, hh] = sum(w[u] * v[b, u, kv] for u in range(t + 1))
        h = h + att.reshape(B, T, NH * HD) @ P[p + "attention.wo.weight"].T
        f = rms(h, P[p + "ffn_norm.weight"])
        g1 = f @ P[p + "feed_forward.w1.weight"].T
        g3 = f @ P[p + "feed_forward.w3.weight"].T
        h = h + (g1 / (1 + torch.exp(-g1)) * g3) @ P[p + "feed_forward.w2.weight"].T
    return rms(h, P["norm.weight"]) @ P["output.weight"].T


def finite_difference_check(model, tokens, targets, cfg, names, per_param, seed):
    """Compares float64 autograd gradients with central differences.

    Returns the worst relative error over per_param random elements of each
    named parameter.
    """
    m64 = Transformer(cfg).double()
    m64.load_state_dict({k: v.double() for k, v in model.state_dict().items()})
    fc = precompute_freqs_cis(cfg, tokens.shape[1], torch.complex128)
    _, loss = loss_fn(m64, tokens, targets, fc)
    m64.zero_grad()
    loss.backward()
    params = dict(m64.named_parameters())
    g = torch.Generator().manual_seed(seed)
    worst = 0.0
    h = 1e-5
    for name in names:
        p = params[name]
        flat = p.data.view(-1)
        for idx in torch.randint(0, flat.numel(), (per_param,), generator=g).tolist():
            old = flat[idx].item()
            with torch.no_grad():
                flat[idx] = old + h
                lp = loss_fn(m64, tokens, targets, fc)[1].item()
                flat[idx] = old - h
                lm = loss_fn(m64, tokens, targets, fc)[1].item()
                flat[idx] = old
            fd = (lp - lm) / (2 * h)
            ag = p.grad.view(-1)[idx].item()
            err = abs(fd - ag) / max(abs(fd), abs(ag), 1e-4)
            worst = max(worst, err)
            print(f"  {name}[{idx}]: autograd {ag:+.9e}  finite-diff {fd:+.9e}  rel err {err:.1e}")
    return worst


# ---------------------------------------------------------------------------
# Golden file


class RefWriter:
    """Collects named tensors and writes the TITANREF file."""

    def __init__(self):
        self.entries = []
        self.blobs = []
        self.offset = 0

    def add(self, name, t):
        if isinstance(t, torch.Tensor):
            t = t.detach().cpu().numpy()
        a = np.asarray(t)
        if a.dtype.kind == "f":
            a, dtype = a.astype("<f4"), "float32"
        elif a.dtype.kind in "iu":
            a, dtype = a.astype("<i4"), "int32"
        else:
            raise ValueError(f"tensor {name}: unsupported dtype {a.dtype}")
        data = np.ascontiguousarray(a).tobytes()
        self.entries.append({"name": name, "dtype": dtype,
                             "shape": list(a.shape), "offset": self.offset})
        pad = (-len(data)) % 4
        self.blobs.append(data + b"\0" * pad)
        self.offset += len(data) + pad

    def write(self, path, config):
        header = json.dumps({"config": config, "tensors": self.entries},
                            separators=(",", ":")).encode("utf-8")
        header += b" " * ((-(len(MAGIC) + 8 + len(header))) % 4)
        with open(path, "wb") as f:
            f.write(MAGIC)
            f.write(struct.pack("<II", VERSION, len(header)))
            f.write(header)
            for b in self.blobs:
                f.write(b)
        return os.path.getsize(path)


def read_ref(path):
    """Reads a TITANREF file into (config, {name: numpy array})."""
    with open(path, "rb") as f:
        buf = f.read()
    if buf[:8] != MAGIC:
        raise ValueError(f"{path}: bad magic {buf[:8]!r}")
    version, hlen = struct.unpack_from("<II", buf, 8)
    if version != VERSION:
        raise ValueError(f"{path}: unsupported version {version}")
    header = json.loads(buf[16:16 + hlen].decode("utf-8"))
    base = 16 + hlen
    out = {}
    for e in header["tensors"]:
        dt = np.dtype("<f4" if e["dtype"] == "float32" else "<i4")
        n = int(np.prod(e["shape"], dtype=np.int64))
        out[e["name"]] = np.frombuffer(buf, dt, n, base + e["offset"]).reshape(e["shape"])
    return header["config"], out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                  "llama_tiny_reference.bin"))
    args = ap.parse_args()

    torch.set_num_threads(1)  # bit-for-bit reproducible reductions
    torch.manual_seed(0)

    cfg = LlamaConfig()
    B, T = 2, 16
    init_std, param_seed, data_seed = 0.1, 1234, 5678
    lr, beta1, beta2, eps, weight_decay, max_norm, steps = 1e-3, 0.9, 0.95, 1e-8, 0.1, 1.0, 10

    model = Transformer(cfg)
    names = [n for n, _ in model.named_parameters()]
    if names != param_names(cfg):
        raise RuntimeError(f"parameter order mismatch: {names}")
    init_params(model, param_seed, init_std)

    g = torch.Generator().manual_seed(data_seed)
    seq = torch.randint(0, cfg.vocab_size, (B, T + 1), generator=g)
    tokens, targets = seq[:, :-1].contiguous(), seq[:, 1:].contiguous()
    freqs_cis = precompute_freqs_cis(cfg, T)

    w = RefWriter()
    w.add("tokens", tokens.to(torch.int32))
    w.add("targets", targets.to(torch.int32))
    w.add("freqs_cos", freqs_cis.real)
    w.add("freqs_sin", freqs_cis.imag)
    for n, p in model.named_parameters():
        w.add("params/" + n, p)

    logits, loss = loss_fn(model, tokens, targets, freqs_cis)
    model.zero_grad()
    loss.backward()
    w.add("logits", logits)
    w.add("loss", loss.reshape(1))
    for n, p in model.named_parameters():
        w.add("grads/" + n, p.grad)
    print(f"initial loss {loss.item():.6f} (ln V = {math.log(cfg.vocab_size):.6f})")

    # Independent float64 checks before the parameters move.
    ref_logits = naive_forward(model, tokens, cfg)
    ref_loss = (torch.logsumexp(ref_logits, -1)
                - ref_logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)).mean()
    logit_err = (logits.double() - ref_logits).abs().max().item()
    loss_err = abs(loss.item() - ref_loss.item())
    print(f"naive float64 forward: max |logits diff| {logit_err:.2e}, |loss diff| {loss_err:.2e}")
    fused = Transformer(cfg, attention="fused")
    fused.load_state_dict(model.state_dict())
    with torch.no_grad():
        fused_err = (fused(tokens, freqs_cis) - logits).abs().max().item()
    print(f"fused attention path: max |logits diff| {fused_err:.2e}")
    pick = torch.Generator().manual_seed(42)
    checked = [names[i] for i in torch.randperm(len(names), generator=pick)[:3].tolist()]
    print(f"finite-difference check (float64, central, h=1e-5) on {checked}:")
    fd_err = finite_difference_check(model, tokens, targets, cfg, checked, 4, seed=7)
    ok = logit_err < 1e-4 and loss_err < 1e-5 and fused_err < 1e-5 and fd_err < 1e-5
    print(f"self-check: worst gradient rel err {fd_err:.1e} -> {'OK' if ok else 'FAILED'}")
    if not ok:
        sys.exit(1)

    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=lr, betas=(beta1, beta2), eps=eps,
                            weight_decay=weight_decay, foreach=False)
    losses, norms = [], []
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        _, loss = loss_fn(model, tokens, targets, freqs_cis)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm=max_norm)
        opt.step()
        losses.append(loss.item())
        norms.append(norm.item())
        print(f"step {step}: loss {losses[-1]:.6f} grad norm {norms[-1]:.6f}")
    w.add("losses", np.array(losses, dtype=np.float32))
    w.add("grad_norms", np.array(norms, dtype=np.float32))
    for n, p in model.named_parameters():
        w.add("params_after/" + n, p)

    config = {
        "dim": cfg.dim, "n_layers": cfg.n_layers, "n_heads": cfg.n_heads,
        "n_kv_heads": cfg.n_kv_heads, "head_dim": cfg.head_dim,
        "vocab_size": cfg.vocab_size, "ffn_hidden": cfg.ffn_hidden,
        "multiple_of": cfg.multiple_of, "norm_eps": cfg.norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": {
            "factor": cfg.rope_scaling.factor,
            "low_freq_factor": cfg.rope_scaling.low_freq_factor,
            "high_freq_factor": cfg.rope_scaling.high_freq_factor,
            "original_max_position_embeddings": cfg.rope_scaling.original_max_position_embeddings,
        },
        "batch": B, "seq_len": T,
        "init_std": init_std, "param_seed": param_seed, "data_seed": data_seed,
        "lr": lr, "beta1": beta1, "beta2": beta2, "eps": eps,
        "weight_decay": weight_decay, "max_norm": max_norm, "steps": steps,
        "clip_eps": 1e-6,
        "torch": torch.__version__,
    }
    size = w.write(args.out, config)
    _, back = read_ref(args.out)
    for n, p in model.named_parameters():
        if not np.array_equal(back["params_after/" + n], p.detach().numpy()):
            raise RuntimeError(f"read-back mismatch for {n}")
    if not np.array_equal(back["logits"], logits.detach().numpy()):
        raise RuntimeError("read-back mismatch for logits")
    print(f"wrote {args.out}: {size} bytes, {len(w.entries)} tensors (read back OK)")


if __name__ == "__main__":
    main()
