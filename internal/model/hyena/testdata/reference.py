#!/usr/bin/python3
"""PyTorch reference for titan's Hyena language model.

Running this script builds tiny Hyena LMs (orders 2 and 3) in plain PyTorch
from the model's definition (see the Go package doc of internal/model/hyena),
fills them with fixed random weights, runs one forward and backward pass in
float64 on a fixed batch and writes the weights, the batch, the logits, the
mean loss and every parameter's gradient to hyena_o<order>_reference.bin
next to this file, for titan's Go tests to compare against.

Before writing, it checks itself: the FFT long convolution against a direct
sum, the model's forward against a second, loop-based implementation of the
operator, causality, and the autograd gradients against central finite
differences.

Only torch, numpy and the standard library are used. Regenerate with:

    /usr/bin/python3 internal/model/hyena/testdata/reference.py

The file format is the TITANREF format of internal/model/llama/testdata
(little-endian): 8 bytes "TITANREF", uint32 version 1, uint32 header length
H, H bytes of JSON {"config": {...}, "tensors": [{"name", "dtype", "shape",
"offset"}]} padded with spaces to a multiple of 4 bytes, then the raw
tensors; offsets count bytes from the start of the data section. Every
float tensor is stored as float32 (the weights are float32 values; the
results are float64 values rounded once).
"""

import argparse
import json
import math
import os
import struct
import sys
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

MAGIC = b"TITANREF"
VERSION = 1


@dataclass
class HyenaConfig:
    """Shape of a Hyena LM (the keys of configs/hyena.toml)."""

    d_model: int = 16
    n_layer: int = 2
    d_inner: int = 40
    vocab_size: int = 29
    pad_vocab_size_multiple: int = 8
    order: int = 2
    emb_dim: int = 5
    filter_order: int = 8
    short_filter_order: int = 3
    num_inner_mlps: int = 2
    l_max: int = 24
    w: float = 1.0
    modulate: bool = True
    layer_norm_epsilon: float = 1e-5

    @property
    def padded_vocab(self):
        m = self.pad_vocab_size_multiple
        return (self.vocab_size + m - 1) // m * m

    @property
    def filter_channels(self):
        return self.d_model * (self.order - 1)


# ---------------------------------------------------------------------------
# Model


def causal_conv_fft(x, h):
    """y[..., c, t] = sum_{s<=t} h[c, t-s] x[..., c, s] by zero-padded FFT.

    x is [B, C, L], h [C, L]; padding both to 2L makes the circular
    convolution linear, and the first L outputs are the causal ones.
    """
    L = x.shape[-1]
    n = 2 * L
    y = torch.fft.irfft(torch.fft.rfft(x, n=n) * torch.fft.rfft(h, n=n), n=n)
    return y[..., :L]


def causal_conv_direct(x, h):
    """The same convolution as an explicit double loop (for the self-check)."""
    B, C, L = x.shape
    y = torch.zeros_like(x)
    for t in range(L):
        for s in range(t + 1):
            y[:, :, t] += h[:, t - s] * x[:, :, s]
    return y


class Sin(nn.Module):
    """sin(freq * x) with a trainable frequency per feature."""

    def __init__(self, dim, w):
        super().__init__()
        self.freq = nn.Parameter(w * torch.ones(1, dim))

    def forward(self, x):
        return torch.sin(self.freq * x)


class PositionalEmbedding(nn.Module):
    """Trainable positional features z [1, l_max, emb_dim]."""

    def __init__(self, cfg):
        super().__init__()
        L, E = cfg.l_max, cfg.emb_dim
        bands = (E - 1) // 2
        t = torch.linspace(0, 1, L, dtype=torch.float64)[:, None]
        w = 2 * math.pi * torch.arange(L, dtype=torch.float64)[:, None] / L
        f = torch.linspace(1e-4, bands - 1, bands, dtype=torch.float64)[None, :]
        z = torch.cat([t, torch.cos(f * w), -torch.sin(f * w)], dim=-1)
        self.z = nn.Parameter(z[None].float())


class HyenaFilter(nn.Module):
    """Implicit long filters: an MLP of z with one shared Sin, modulated."""

    def __init__(self, cfg):
        super().__init__()
        C, Fo = cfg.filter_channels, cfg.filter_order
        self.cfg = cfg
        self.bias = nn.Parameter(torch.zeros(C))  # the per-channel skip term
        self.pos_emb = PositionalEmbedding(cfg)
        act = Sin(Fo, cfg.w)  # one module: the same freq at every activation
        layers = [nn.Linear(cfg.emb_dim, Fo), act]
        for _ in range(cfg.num_inner_mlps):
            layers += [nn.Linear(Fo, Fo), act]
        layers.append(nn.Linear(Fo, C, bias=False))
        self.implicit_filter = nn.Sequential(*layers)
        lo, hi = math.log(1e-2) / 1.5, math.log(1e-2) / 0.3
        self.register_buffer("deltas", torch.linspace(lo, hi, C, dtype=torch.float64))
        self.register_buffer("t", torch.linspace(0, 1, cfg.l_max, dtype=torch.float64))

    def filter(self, L):
        """The filters for length L: [L, C], channel c = d*(order-1) + o."""
        h = self.implicit_filter(self.pos_emb.z[0, :L])
        if self.cfg.modulate:
            decay = torch.exp(-self.t[:L, None] * self.deltas.abs()[None, :])
            h = h * decay.to(h.dtype)
        return h


class HyenaOperator(nn.Module):
    """in_proj, causal short conv, gated chain of long convs, out_proj."""

    def __init__(self, cfg):
        super().__init__()
        D, N, K = cfg.d_model, cfg.order, cfg.short_filter_order
        self.cfg = cfg
        self.in_proj = nn.Linear(D, (N + 1) * D)
        self.short_filter = nn.Conv1d((N + 1) * D, (N + 1) * D, K, groups=(N + 1) * D, padding=K - 1)
        self.filter_fn = HyenaFilter(cfg)
        self.out_proj = nn.Linear(D, D)

    def filters(self, L):
        """h [order-1, D, L] and the skip terms [order-1, D] per convolution."""
        D, N = self.cfg.d_model, self.cfg.order
        h = self.filter_fn.filter(L).reshape(L, D, N - 1).permute(2, 1, 0)
        skip = self.filter_fn.bias.reshape(D, N - 1).t()
        return h, skip

    def forward(self, u, conv=causal_conv_fft):
        B, L, D = u.shape
        N = self.cfg.order
        z = self.in_proj(u).transpose(1, 2)  # [B, (N+1)D, L]
        zc = self.short_filter(z)[..., :L]  # causal: w[K-1] multiplies the current input
        *x, v = zc.split(D, dim=1)
        h, skip = self.filters(L)
        for o in range(N - 1):
            v = v * x[N - 1 - o]
            v = conv(v, h[o]) + skip[o][None, :, None] * v
        return self.out_proj((v * x[0]).transpose(1, 2))


class Mlp(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.fc1 = nn.Linear(cfg.d_model, cfg.d_inner)
        self.fc2 = nn.Linear(cfg.d_inner, cfg.d_model)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class Block(nn.Module):
    """Pre-norm: h += mixer(norm1(h)); h += mlp(norm2(h))."""

    def __init__(self, cfg):
        super().__init__()
        self.norm1 = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_epsilon)
        self.mixer = HyenaOperator(cfg)
        self.norm2 = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_epsilon)
        self.mlp = Mlp(cfg)

    def forward(self, h, conv):
        h = h + self.mixer(self.norm1(h), conv)
        return h + self.mlp(self.norm2(h))


class HyenaLM(nn.Module):
    """Embedding (no positions), blocks, final LayerNorm, head tied to the embedding."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.padded_vocab, cfg.d_model)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_epsilon)

    def forward(self, tokens, conv=causal_conv_fft):
        h = self.wte(tokens)
        for layer in self.layers:
            h = layer(h, conv)
        return self.ln_f(h) @ self.wte.weight.t()


def param_names(cfg):
    """Parameter names in titan's flat-buffer order (config.go's Layout)."""
    names = ["wte.weight"]
    m = cfg.num_inner_mlps
    for l in range(cfg.n_layer):
        p = f"layers.{l}."
        f = p + "mixer.filter_fn."
        names += [p + "norm1.weight", p + "norm1.bias",
                  p + "mixer.in_proj.weight", p + "mixer.in_proj.bias",
                  p + "mixer.short_filter.weight", p + "mixer.short_filter.bias",
                  f + "bias", f + "pos_emb.z",
                  f + "implicit_filter.0.weight", f + "implicit_filter.0.bias",
                  f + "implicit_filter.1.freq"]
        for i in range(1, m + 1):
            names += [f + f"implicit_filter.{2 * i}.weight", f + f"implicit_filter.{2 * i}.bias"]
        names += [f + f"implicit_filter.{2 * m + 2}.weight",
                  p + "mixer.out_proj.weight", p + "mixer.out_proj.bias",
                  p + "norm2.weight", p + "norm2.bias",
                  p + "mlp.fc1.weight", p + "mlp.fc1.bias",
                  p + "mlp.fc2.weight", p + "mlp.fc2.bias"]
    return names + ["ln_f.weight", "ln_f.bias"]


def fill_params(model, seed):
    """Moderate random float32 weights, so that every gradient is well away from 0.

    Linear weights N(0, 1/fan_in); LayerNorm weights 1 + 0.2 N(0, 1); other
    biases, the short conv, the skip terms 0.4 N(0, 1); z its positional
    features + 0.1 N(0, 1); Sin frequencies 1.5 + 0.3 N(0, 1).
    """
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=torch.float32)
            if name.endswith("pos_emb.z"):
                p.add_(0.1 * noise)
            elif name.endswith(".freq"):
                p.copy_(1.5 + 0.3 * noise)
            elif "norm" in name or name.startswith("ln_f"):
                p.copy_(1 + 0.2 * noise if name.endswith("weight") else 0.4 * noise)
            elif name.endswith(".weight") and p.dim() == 2:
                p.copy_(noise / math.sqrt(p.shape[1]))
            else:
                p.copy_(0.4 * noise)


def loss_fn(model, tokens, targets, conv=causal_conv_fft):
    """(logits, mean cross-entropy over targets >= 0)."""
    logits = model(tokens, conv)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-1)
    return logits, loss


# ---------------------------------------------------------------------------
# Independent checks (float64)


def loop_operator(op, u):
    """The Hyena operator position by position, sharing no code with forward.

    The short conv is an explicit three-tap sum, the long convolution a
    running sum over the history, and the chain follows the recurrence
    channel by channel.
    """
    cfg = op.cfg
    B, L, D = u.shape
    N, K = cfg.order, cfg.short_filter_order
    W, b = op.in_proj.weight, op.in_proj.bias
    cw, cb = op.short_filter.weight[:, 0, :], op.short_filter.bias
    hfull = op.filter_fn.filter(L)  # [L, D(N-1)]
    skip = op.filter_fn.bias
    z = u @ W.t() + b  # [B, L, (N+1)D]
    zc = torch.zeros_like(z)
    for t in range(L):
        acc = cb.clone().expand(B, -1).clone()
        for k in range(K):
            s = t - K + 1 + k
            if s >= 0:
                acc = acc + cw[:, k] * z[:, s]
        zc[:, t] = acc
    xs = [zc[:, :, i * D:(i + 1) * D] for i in range(N + 1)]
    v = xs[N]
    for o in range(N - 1):
        s = v * xs[N - 1 - o]
        y = torch.zeros_like(s)
        for d in range(D):
            c = d * (N - 1) + o
            for t in range(L):
                y[:, t, d] = sum(hfull[t - j, c] * s[:, j, d] for j in range(t + 1)) + skip[c] * s[:, t, d]
        v = y
    return op.out_proj(v * xs[0])


def finite_difference_check(model, tokens, targets, per_param, seed):
    """Worst relative error of autograd against central differences (float64)."""
    _, loss = loss_fn(model, tokens, targets)
    model.zero_grad()
    loss.backward()
    params = dict(model.named_parameters())
    g = torch.Generator().manual_seed(seed)
    worst, h = 0.0, 1e-5
    for name, p in params.items():
        flat = p.data.view(-1)
        for idx in torch.randint(0, flat.numel(), (per_param,), generator=g).tolist():
            old = flat[idx].item()
            with torch.no_grad():
                flat[idx] = old + h
                lp = loss_fn(model, tokens, targets)[1].item()
                flat[idx] = old - h
                lm = loss_fn(model, tokens, targets)[1].item()
                flat[idx] = old
            fd = (lp - lm) / (2 * h)
            ag = p.grad.view(-1)[idx].item()
            worst = max(worst, abs(fd - ag) / max(abs(fd), abs(ag), 1e-4))
    return worst


def self_check(model, tokens, targets):
    """Runs the independent checks on a float64 model; exits on failure."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 3, 9, generator=g, dtype=torch.float64)
    h = torch.randn(3, 9, generator=g, dtype=torch.float64)
    conv_err = (causal_conv_fft(x, h) - causal_conv_direct(x, h)).abs().max().item()
    u = torch.randn(2, tokens.shape[1], model.cfg.d_model, generator=g, dtype=torch.float64)
    with torch.no_grad():
        op = model.layers[0].mixer
        op_err = (op(u) - loop_operator(op, u)).abs().max().item()
        logits = model(tokens)
        changed = tokens.clone()
        j = tokens.shape[1] // 2
        changed[:, j] = (changed[:, j] + 1) % model.cfg.vocab_size
        after = model(changed)
        causal_err = (after[:, :j] - logits[:, :j]).abs().max().item()
        moved = (after[:, j:] - logits[:, j:]).abs().max().item()
    fd_err = finite_difference_check(model, tokens, targets, 2, seed=7)
    ok = conv_err < 1e-12 and op_err < 1e-12 and causal_err < 1e-12 and moved > 1e-6 and fd_err < 1e-6
    print(f"  self-check: FFT vs direct conv {conv_err:.1e}, operator vs loop {op_err:.1e}, "
          f"causality {causal_err:.1e} (later logits move {moved:.1e}), "
          f"finite differences {fd_err:.1e} -> {'OK' if ok else 'FAILED'}")
    if not ok:
        sys.exit(1)


# ---------------------------------------------------------------------------
# Golden file


class RefWriter:
    """Collects named tensors and writes the TITANREF file."""

    def __init__(self):
        self.entries, self.blobs, self.offset = [], [], 0

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
        self.entries.append({"name": name, "dtype": dtype, "shape": list(a.shape), "offset": self.offset})
        self.blobs.append(data)
        self.offset += len(data)

    def write(self, path, config):
        header = json.dumps({"config": config, "tensors": self.entries}, separators=(",", ":")).encode()
        header += b" " * ((-(len(MAGIC) + 8 + len(header))) % 4)
        with open(path, "wb") as f:
            f.write(MAGIC)
            f.write(struct.pack("<II", VERSION, len(header)))
            f.write(header)
            for b in self.blobs:
                f.write(b)
        return os.path.getsize(path)


def build(order, seed):
    """The float64 model of the given order with its float32 weights."""
    cfg = HyenaConfig(order=order)
    model = HyenaLM(cfg)
    names = [n for n, _ in model.named_parameters()]
    if names != param_names(cfg):
        raise RuntimeError(f"parameter order mismatch: {names}")
    fill_params(model, seed)
    return cfg, model.double()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)),
                    help="folder the golden files are written to")
    ap.add_argument("--no-check", action="store_true", help="skip the self-checks")
    args = ap.parse_args()
    torch.set_num_threads(1)
    B, T = 2, 20
    for order in (2, 3):
        cfg, model = build(order, seed=100 + order)
        g = torch.Generator().manual_seed(200 + order)
        tokens = torch.randint(0, cfg.vocab_size, (B, T), generator=g)
        targets = torch.randint(0, cfg.vocab_size, (B, T), generator=g)
        targets[0, 3] = -1  # an ignored position
        print(f"order {order}: {sum(p.numel() for p in model.parameters())} parameters")
        if not args.no_check:
            self_check(model, tokens, targets)
        w = RefWriter()
        w.add("tokens", tokens.to(torch.int32))
        w.add("targets", targets.to(torch.int32))
        for n, p in model.named_parameters():
            w.add("params/" + n, p)
        logits, loss = loss_fn(model, tokens, targets)
        model.zero_grad()
        loss.backward()
        w.add("logits", logits)
        w.add("loss", loss.reshape(1))
        for n, p in model.named_parameters():
            w.add("grads/" + n, p.grad)
        config = {k: getattr(cfg, k) for k in HyenaConfig.__dataclass_fields__}
        config.update({"batch": B, "seq_len": T, "torch": torch.__version__})
        path = os.path.join(args.out, f"hyena_o{order}_reference.bin")
        size = w.write(path, config)
        print(f"  loss {loss.item():.6f}; wrote {path}: {size} bytes, {len(w.entries)} tensors")


if __name__ == "__main__":
    main()
