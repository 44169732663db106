#!/usr/bin/env python3
"""The PyTorch twin of posenc's lab transformer, for `posenc bench train`.

The same model as `posenc_lab::model::Transformer` in decoder mode: token
embedding (plus the positional encoding at its hook), N pre-LayerNorm blocks
(LayerNorm -> fused qkv Linear -> attention -> output Linear; LayerNorm ->
Linear(d, 4d) -> GELU (tanh approximation, as the lab's) -> Linear(4d, d)),
a final LayerNorm and a head tied to the token embedding; cross-entropy over
every position, AdamW (betas 0.9/0.95, eps 1e-8, weight decay 0.01 on
matrices only, as the lab's), gradient clipping at 1.0. It prints its
parameter count, which must equal the one `posenc bench train` prints for the
same sizes and encoding.

Timed: one full training step (zero_grad, forward, backward, clipping, AdamW
step) on a random batch, median over --steps steps after one warm-up step, on
--threads threads (default 2, the development machine's cores).

Attention takes PyTorch's fastest CPU path for each encoding:
`scaled_dot_product_attention` with `is_causal` (NoPE, RoPE, learned,
sinusoidal) or with an additive float mask (ALiBi, T5); Shaw's relative
keys and values are composed from matmuls, as in Shaw et al.

Usage (a venv with torch; never needed by the tests or CI):
    python scripts/bench/torch_twin.py --layers 4 --d-model 128 --heads 4 \
        --len 128 --batch 32 --pe nope,rope --steps 10 [--json]
"""

import argparse
import json
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def alibi_slopes(h):
    def pow2(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(h).is_integer():
        return pow2(h)
    c = 2 ** math.floor(math.log2(h))
    return pow2(c) + alibi_slopes(2 * c)[0::2][: h - c]


def t5_buckets(rel, num_buckets=32, max_distance=128):
    # Causal (unidirectional) T5 buckets of relative = key - query.
    n = -rel
    n = torch.clamp(n, min=0)
    max_exact = num_buckets // 2
    is_small = n < max_exact
    val_large = max_exact + (
        torch.log(n.float() / max_exact + 1e-20)
        / math.log(max_distance / max_exact)
        * (num_buckets - max_exact)
    ).to(torch.long)
    val_large = torch.clamp(val_large, max=num_buckets - 1)
    return torch.where(is_small, n, val_large)


class Attention(nn.Module):
    def __init__(self, d, h, pe, shaw_k):
        super().__init__()
        self.h, self.hd = h, d // h
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.pe = pe
        if pe == "shaw":
            self.shaw_k = shaw_k
            self.ak = nn.Parameter(torch.randn(2 * shaw_k + 1, self.hd) * 0.02)
            self.av = nn.Parameter(torch.randn(2 * shaw_k + 1, self.hd) * 0.02)

    def forward(self, x, rope, bias):
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.h, self.hd).permute(2, 0, 3, 1, 4)
        if rope is not None:
            cos, sin = rope
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        if self.pe == "shaw":
            scale = 1.0 / math.sqrt(self.hd)
            pos = torch.arange(t)
            rel = (pos[None, :] - pos[:, None]).clamp(-self.shaw_k, self.shaw_k) + self.shaw_k
            ak, av = self.ak[rel], self.av[rel]  # (T, T, hd)
            logits = (q @ k.transpose(-1, -2) + torch.einsum("bhid,ijd->bhij", q, ak)) * scale
            mask = torch.ones(t, t, dtype=torch.bool).triu(1)
            att = logits.masked_fill(mask, float("-inf")).softmax(-1)
            out = att @ v + torch.einsum("bhij,ijd->bhid", att, av)
        elif bias is not None:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        else:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(out.transpose(1, 2).reshape(b, t, d))


def rotate(x, cos, sin):
    # Half-split pairs (i, i + d/2), as the lab's default RoPE.
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class Block(nn.Module):
    def __init__(self, d, h, pe, shaw_k):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = Attention(d, h, pe, shaw_k)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x, rope, bias):
        x = x + self.attn(self.ln1(x), rope, bias)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))


class Twin(nn.Module):
    def __init__(self, vocab, d, layers, h, length, pe, shaw_k):
        super().__init__()
        self.pe, self.h, self.d = pe, h, d
        self.tok = nn.Embedding(vocab, d)
        nn.init.normal_(self.tok.weight, std=0.02)
        if pe == "learned":
            self.pos = nn.Parameter(torch.randn(length, d) * 0.02)
        if pe == "t5":
            self.t5 = nn.Parameter(torch.randn(32, h))
        self.blocks = nn.ModuleList(Block(d, h, pe, shaw_k) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)

    def forward(self, idx):
        b, t = idx.shape
        x = self.tok(idx)
        rope, bias = None, None
        pos = torch.arange(t)
        if self.pe == "learned":
            x = x + self.pos[:t]
        elif self.pe == "sinusoidal":
            x = x * math.sqrt(self.d) + sinusoidal(t, self.d)
        elif self.pe == "rope":
            hd = self.d // self.h
            inv = 1.0 / (10000.0 ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
            ang = (pos[:, None].double() * inv[None, :]).float()
            rope = (ang.cos(), ang.sin())
        if self.pe in ("alibi", "t5"):
            rel = pos[None, :] - pos[:, None]  # key - query
            causal = torch.zeros(t, t).masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
            if self.pe == "alibi":
                slopes = torch.tensor(alibi_slopes(self.h))
                bias = slopes[:, None, None] * rel[None].clamp(max=0).float() + causal
            else:
                bias = self.t5[t5_buckets(rel)].permute(2, 0, 1) + causal
        for blk in self.blocks:
            x = blk(x, rope, bias)
        return self.ln_f(x) @ self.tok.weight.t()


def sinusoidal(t, d):
    pos = torch.arange(t, dtype=torch.float64)[:, None]
    i = torch.arange(0, d, 2, dtype=torch.float64)[None, :]
    ang = pos / (10000.0 ** (i / d))
    pe = torch.zeros(t, d, dtype=torch.float64)
    pe[:, 0::2], pe[:, 1::2] = ang.sin(), ang.cos()
    return pe.float()


def bench(args, pe):
    torch.manual_seed(0)
    model = Twin(args.vocab, args.d_model, args.layers, args.heads, args.len, pe, args.shaw_k)
    n_params = sum(p.numel() for p in model.parameters())
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
        lr=1e-3,
        betas=(0.9, 0.95),
        eps=1e-8,
    )
    g = torch.Generator().manual_seed(0)
    times = []
    for s in range(args.steps + 1):
        idx = torch.randint(0, args.vocab, (args.batch, args.len), generator=g)
        tgt = torch.randint(0, args.vocab, (args.batch, args.len), generator=g)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        logits = model(idx)
        loss = F.cross_entropy(logits.view(-1, args.vocab), tgt.view(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        dt = time.perf_counter() - t0
        if s > 0:
            times.append(dt)
    ms = statistics.median(times) * 1e3
    return {"pe": pe, "params": n_params, "ms_per_step": ms, "tokens_per_s": args.batch * args.len / (ms / 1e3)}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--len", type=int, default=128)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--vocab", type=int, default=32, help="vocabulary (the copy task with 16 symbols: 32)")
    p.add_argument("--shaw-k", type=int, default=16)
    p.add_argument("--pe", default="nope,rope")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    cases = [bench(args, pe.strip()) for pe in args.pe.split(",")]
    out = {
        "framework": f"torch {torch.__version__}",
        "threads": torch.get_num_threads(),
        "model": {"layers": args.layers, "d_model": args.d_model, "heads": args.heads, "length": args.len, "batch": args.batch},
        "cases": cases,
    }
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        for c in cases:
            print(f"{c['pe']:<12} {c['params']:>9} params {c['ms_per_step']:9.2f} ms/step")


if __name__ == "__main__":
    main()
