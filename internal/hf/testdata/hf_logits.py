#!/usr/bin/python3
"""Logits of a Hugging Face Llama checkpoint, computed in the Hugging Face convention.

This is an independent float32 PyTorch Llama written the way transformers'
LlamaForCausalLM is: parameters named model.embed_tokens / model.layers.N.* /
lm_head, rotate-half RoPE (pairs (i, i + head_dim/2) sharing frequency i) with
Llama 3.1 "llama3" frequency scaling, grouped-query attention in which query head
h reads key/value head h // (heads / kv_heads). titan's Go test exports its
golden tiny model with internal/hf and checks that this script reproduces the
golden logits, which were computed in titan's (interleaved-RoPE) convention.

Needs only torch, numpy and the standard library: there is no transformers or
safetensors module, so config.json and the safetensors files (one
model.safetensors, or shards listed by model.safetensors.index.json) are parsed
by hand. F32, BF16 and F16 tensors are accepted.

Usage:

    /usr/bin/python3 hf_logits.py --tokens TOKENS.json --model DIR --out LOGITS.bin \
        [--model DIR2 --out LOGITS2.bin ...]

TOKENS.json holds a list of equal-length token id lists [B][T]; each LOGITS.bin
receives the logits of its model as raw little-endian float32 [B, T, vocab_size].

RoPE angles are computed in float64 and rounded once to float32 cos/sin
(transformers computes them in float32; that only changes rounding).
"""

import argparse
import json
import math
import os
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F


def read_safetensors(path):
    """Returns {name: float32 torch tensor} for one safetensors file."""
    with open(path, "rb") as f:
        buf = f.read()
    if len(buf) < 8:
        raise ValueError(f"{path}: too short")
    (n,) = struct.unpack_from("<Q", buf, 0)
    if 8 + n > len(buf):
        raise ValueError(f"{path}: header length {n} past end of file")
    header = json.loads(buf[8:8 + n].decode("utf-8"))
    base = 8 + n
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        begin, end = e["data_offsets"]
        raw = buf[base + begin:base + end]
        shape = e["shape"]
        dt = e["dtype"]
        if dt == "F32":
            a = np.frombuffer(raw, "<f4").copy()
        elif dt == "BF16":
            a = (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32)
        elif dt == "F16":
            a = np.frombuffer(raw, "<f2").astype(np.float32)
        else:
            raise ValueError(f"{path}: tensor {name}: unsupported dtype {dt}")
        out[name] = torch.from_numpy(a.reshape(shape))
    return out


def read_checkpoint(model_dir):
    single = os.path.join(model_dir, "model.safetensors")
    if os.path.exists(single):
        return read_safetensors(single)
    with open(os.path.join(model_dir, "model.safetensors.index.json")) as f:
        weight_map = json.load(f)["weight_map"]
    tensors = {}
    for shard in sorted(set(weight_map.values())):
        for name, t in read_safetensors(os.path.join(model_dir, shard)).items():
            if weight_map.get(name) != shard:
                raise ValueError(f"{shard}: tensor {name} not mapped to it by the index")
            tensors[name] = t
    missing = set(weight_map) - set(tensors)
    if missing:
        raise ValueError(f"index lists tensors absent from the shards: {sorted(missing)}")
    return tensors


def llama3_inv_freq(head_dim, theta, scaling):
    """Inverse frequencies of the head_dim/2 rotation pairs (float64), Llama 3.1 scaled."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    if not scaling:
        return inv
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind == "default":
        return inv
    if kind != "llama3":
        raise ValueError(f"unsupported rope_scaling {scaling}")
    factor = scaling["factor"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_len = scaling["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_len / low, old_len / high
    out = []
    for f in inv.tolist():
        wavelen = 2 * math.pi / f
        if wavelen < high_wavelen:
            out.append(f)
        elif wavelen > low_wavelen:
            out.append(f / factor)
        else:
            smooth = (old_len / wavelen - low) / (high - low)
            out.append((1 - smooth) * f / factor + smooth * f)
    return torch.tensor(out, dtype=torch.float64)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rms_norm(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def forward(cfg, P, tokens):
    """Logits [B, T, V] of the LlamaForCausalLM with config cfg and weights P."""
    D = cfg["hidden_size"]
    NH = cfg["num_attention_heads"]
    NKV = cfg.get("num_key_value_heads") or NH
    HD = cfg.get("head_dim") or D // NH
    L = cfg["num_hidden_layers"]
    eps = cfg.get("rms_norm_eps", 1e-6)
    if cfg.get("hidden_act", "silu") != "silu":
        raise ValueError("only silu is supported")
    B, T = tokens.shape

    inv = llama3_inv_freq(HD, cfg.get("rope_theta", 10000.0), cfg.get("rope_scaling"))
    angles = torch.outer(torch.arange(T, dtype=torch.float64), inv)  # [T, HD/2]
    emb = torch.cat((angles, angles), dim=-1)  # [T, HD]
    cos = emb.cos().float()[None, None]  # [1, 1, T, HD]
    sin = emb.sin().float()[None, None]
    mask = torch.full((T, T), float("-inf")).triu(1)

    h = P["model.embed_tokens.weight"][tokens]
    for i in range(L):
        p = f"model.layers.{i}."
        x = rms_norm(h, P[p + "input_layernorm.weight"], eps)
        q = (x @ P[p + "self_attn.q_proj.weight"].T).view(B, T, NH, HD).transpose(1, 2)
        k = (x @ P[p + "self_attn.k_proj.weight"].T).view(B, T, NKV, HD).transpose(1, 2)
        v = (x @ P[p + "self_attn.v_proj.weight"].T).view(B, T, NKV, HD).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = NH // NKV
        k = k[:, :, None].expand(B, NKV, rep, T, HD).reshape(B, NH, T, HD)
        v = v[:, :, None].expand(B, NKV, rep, T, HD).reshape(B, NH, T, HD)
        scores = q @ k.transpose(2, 3) / math.sqrt(HD) + mask
        att = torch.softmax(scores, dim=-1) @ v
        att = att.transpose(1, 2).reshape(B, T, NH * HD)
        h = h + att @ P[p + "self_attn.o_proj.weight"].T
        x = rms_norm(h, P[p + "post_attention_layernorm.weight"], eps)
        gate = x @ P[p + "mlp.gate_proj.weight"].T
        up = x @ P[p + "mlp.up_proj.weight"].T
        h = h + (F.silu(gate) * up) @ P[p + "mlp.down_proj.weight"].T
    h = rms_norm(h, P["model.norm.weight"], eps)
    head = P["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings") else P["lm_head.weight"]
    return h @ head.T


def expected_names(cfg):
    names = {"model.embed_tokens.weight", "model.norm.weight"}
    if not cfg.get("tie_word_embeddings"):
        names.add("lm_head.weight")
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        names |= {p + s for s in (
            "input_layernorm.weight", "post_attention_layernorm.weight",
            "self_attn.q_proj.weight", "self_attn.k_proj.weight",
            "self_attn.v_proj.weight", "self_attn.o_proj.weight",
            "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight")}
    return names


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, action="append",
                    help="Hugging Face model folder (repeatable)")
    ap.add_argument("--out", required=True, action="append",
                    help="output for the matching --model: raw little-endian float32 logits")
    ap.add_argument("--tokens", required=True, help="JSON [B][T] token ids")
    args = ap.parse_args()
    if len(args.model) != len(args.out):
        ap.error("give one --out per --model")
    torch.set_num_threads(1)
    with open(args.tokens) as f:
        tokens = torch.tensor(json.load(f), dtype=torch.long)

    for model_dir, out in zip(args.model, args.out):
        with open(os.path.join(model_dir, "config.json")) as f:
            cfg = json.load(f)
        if cfg.get("model_type") != "llama" or "LlamaForCausalLM" not in cfg.get("architectures", []):
            raise ValueError(f"{model_dir}: not a LlamaForCausalLM config")
        P = read_checkpoint(model_dir)
        want = expected_names(cfg)
        have = {n for n in P if not n.endswith("rotary_emb.inv_freq")}
        if have != want:
            raise ValueError(f"{model_dir}: tensor names: missing {sorted(want - have)}, "
                             f"unexpected {sorted(have - want)}")
        with torch.no_grad():
            logits = forward(cfg, P, tokens)
        with open(out, "wb") as f:
            f.write(logits.contiguous().numpy().astype("<f4").tobytes())
        print(f"{model_dir}: logits {list(logits.shape)} written to {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
