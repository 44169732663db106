#!/usr/bin/env python3
"""posenc.torch's ops beside PyTorch's, side by side in one run (issue 36).

Four measurements, each the median of `--rounds` rounds, posenc and PyTorch
alternated inside every round, with `--threads` threads for both
(`torch.set_num_threads`, and `RAYON_NUM_THREADS` for posenc's kernels, set
before posenc is imported):

1. attention with RoPE inside, `B=1, H=8, T=2048, D=64`, causal, forward +
   backward: `posenc.torch.attention(q, k, v, rope=rope)` against
   transformers' `apply_rotary_pos_emb` followed by
   `torch.nn.functional.scaled_dot_product_attention(is_causal=True)`
   (the rotation and the attention of a transformers Llama layer);
   posenc as called by default (its forward keeps the logits for the
   backward: 71 MB at this shape) and with `keep_logits=False` (memory
   linear in T, as the peer's); and the same forward alone (no gradient);
2. the rotation alone, forward, same shape for q and k:
   `posenc.torch.apply_rope` against `apply_rotary_pos_emb` (with the
   cos/sin it needs computed once outside the timing, as a model caches
   them);
3. the overhead of one `apply_rope` call on `(1, 1, 1, 64)` tensors.

Each round times a block of calls per measurement: 2 attention calls, 200
rotations (about 50–300 ms a block; blocks of 20, some 5 ms, moved by
several times from run to run on a shared 2-core machine), 2,000 small
calls.

`apply_rotary_pos_emb` is transformers' own function when transformers is
installed, else the same two lines (`q·cos + rotate_half(q)·sin`).
The RoPE is Llama 3's (θ = 500000, head_dim 64, no scaling).

Usage (a venv with torch and the posenc package built in release mode:
`pip install ./crates/posenc-py`):
    python scripts/bench/python_ops.py [--threads 2] [--rounds 7] [--json]
"""

import argparse
import json
import os
import platform
import statistics
import sys
import time
import types


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def setup(seq, threads):
    """The bench's inputs and both sides' attention calls, for this script
    and `attention_ab.py`: `RAYON_NUM_THREADS` and torch's threads set
    (before posenc is imported), Llama 3's RoPE, seeded `q, k, v` and an
    output gradient of shape `(1, 8, seq, 64)`, the peer's cos/sin, and
    `posenc_attn()` / `torch_attn()` (forward + backward, returning the
    output and the three gradients)."""
    os.environ["RAYON_NUM_THREADS"] = str(threads)

    import torch
    import torch.nn.functional as F

    import posenc
    import posenc.torch as pt

    torch.set_num_threads(threads)
    try:
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        rope_source = "transformers.models.llama.modeling_llama.apply_rotary_pos_emb"
    except Exception:  # pragma: no cover - transformers not installed

        def rotate_half(x):
            x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
            return torch.cat((-x2, x1), dim=-1)

        def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
            cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
            return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin

        rope_source = "the two lines of transformers' apply_rotary_pos_emb"

    B, H, T, D = 1, 8, seq, 64
    rope = posenc.RopeConfig.plain(500000.0, D, max_position_embeddings=8192)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, H, T, D, generator=g)
    k = torch.randn(B, H, T, D, generator=g)
    v = torch.randn(B, H, T, D, generator=g)
    dout = torch.randn(B, H, T, D, generator=g)
    c, s = (torch.from_numpy(x)[None] for x in rope.cos_sin(list(range(T))))  # (1, T, D)

    def posenc_attn(keep_logits=None):
        qq, kk, vv = (x.detach().requires_grad_(True) for x in (q, k, v))
        out = pt.attention(qq, kk, vv, rope=rope, keep_logits=keep_logits)
        out.backward(dout)
        return out, qq.grad, kk.grad, vv.grad

    def torch_attn():
        qq, kk, vv = (x.detach().requires_grad_(True) for x in (q, k, v))
        qr, kr = apply_rotary_pos_emb(qq, kk, c, s)
        out = F.scaled_dot_product_attention(qr, kr, vv, is_causal=True)
        out.backward(dout)
        return out, qq.grad, kk.grad, vv.grad

    return types.SimpleNamespace(
        torch=torch, F=F, posenc=posenc, pt=pt, rope=rope, shape=(B, H, T, D), q=q, k=k, v=v, dout=dout,
        c=c, s=s, apply_rotary_pos_emb=apply_rotary_pos_emb, rope_source=rope_source,
        posenc_attn=posenc_attn, torch_attn=torch_attn,
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    bench = setup(args.seq, args.threads)
    torch, F, posenc, pt, rope = bench.torch, bench.F, bench.posenc, bench.pt, bench.rope
    q, k, v, c, s = bench.q, bench.k, bench.v, bench.c, bench.s
    apply_rotary_pos_emb, rope_source = bench.apply_rotary_pos_emb, bench.rope_source
    posenc_attn, torch_attn = bench.posenc_attn, bench.torch_attn
    B, H, T, D = bench.shape

    def timed(fn, reps):
        fn()  # warm
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        return (time.perf_counter() - t0) / reps

    def posenc_attn_fwd():
        with torch.no_grad():
            pt.attention(q, k, v, rope=rope)

    def torch_attn_fwd():
        with torch.no_grad():
            qr, kr = apply_rotary_pos_emb(q, k, c, s)
            F.scaled_dot_product_attention(qr, kr, v, is_causal=True)

    def posenc_rope():
        pt.apply_rope(q, k, rope)

    def torch_rope():
        apply_rotary_pos_emb(q, k, c, s)

    q1, k1 = torch.randn(1, 1, 1, 64), torch.randn(1, 1, 1, 64)

    def posenc_small():
        pt.apply_rope(q1, k1, rope)

    # the same numbers first
    with torch.no_grad():
        a = pt.attention(q, k, v, rope=rope)
        qr, kr = apply_rotary_pos_emb(q, k, c, s)
        b = F.scaled_dot_product_attention(qr, kr, v, is_causal=True)
        attn_diff = (a - b).abs().max().item()
        rope_diff = (pt.apply_rope(q, k, rope)[0] - qr).abs().max().item()

    load_before = os.getloadavg()
    rows = {
        "attention_fwd_bwd": ([], []),
        "attention_fwd_bwd_recomputed": ([], []),
        "attention_fwd": ([], []),
        "apply_rope_fwd": ([], []),
        "call_overhead_1x1x1x64": ([], []),
    }
    for _ in range(args.rounds):
        rows["attention_fwd_bwd"][0].append(timed(posenc_attn, 2))
        rows["attention_fwd_bwd"][1].append(timed(torch_attn, 2))
        rows["attention_fwd_bwd_recomputed"][0].append(timed(lambda: posenc_attn(False), 2))
        rows["attention_fwd_bwd_recomputed"][1].append(timed(torch_attn, 2))
        rows["attention_fwd"][0].append(timed(posenc_attn_fwd, 2))
        rows["attention_fwd"][1].append(timed(torch_attn_fwd, 2))
        rows["apply_rope_fwd"][0].append(timed(posenc_rope, 200))
        rows["apply_rope_fwd"][1].append(timed(torch_rope, 200))
        rows["call_overhead_1x1x1x64"][0].append(timed(posenc_small, 2000))
        rows["call_overhead_1x1x1x64"][1].append(float("nan"))

    result = {
        "cpu": cpu_name(),
        "simd": posenc.simd_level(),
        "threads": args.threads,
        "rounds": args.rounds,
        "shape": [B, H, T, D],
        "torch": torch.__version__,
        "posenc": posenc.__version__,
        "peer_rotation": rope_source,
        "max_abs_diff": {"attention": attn_diff, "apply_rope": rope_diff},
        # The 1-minute load average before and after the timed rounds: other
        # processes on the same cores slow both sides, unevenly.
        "load_average_1min": [load_before[0], os.getloadavg()[0]],
        "seconds": {},
    }
    for name, (ps, ts) in rows.items():
        p = statistics.median(ps)
        t = statistics.median(ts) if not all(x != x for x in ts) else None
        result["seconds"][name] = {"posenc": p, "torch": t, "speedup": (t / p) if t else None}
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"CPU {result['cpu']} ({result['simd']}), {args.threads} threads, torch {torch.__version__}, "
          f"median of {args.rounds} rounds; shape (B, H, T, D) = {tuple(result['shape'])}")
    print(f"max |posenc − torch|: attention {attn_diff:.2e}, apply_rope {rope_diff:.2e}")
    lb, la = result["load_average_1min"]
    print(f"1-minute load average: {lb:.2f} before the rounds, {la:.2f} after")
    print(f"{'measurement':28s} {'posenc':>12s} {'PyTorch':>12s} {'speed-up':>9s}")
    for name, r in result["seconds"].items():
        unit = 1e6 if name.startswith("call") else 1e3
        u = "µs" if name.startswith("call") else "ms"
        t = f"{r['torch'] * unit:9.2f} {u}" if r["torch"] else f"{'-':>12s}"
        sp = f"{r['speedup']:8.2f}x" if r["speedup"] else f"{'-':>9s}"
        print(f"{name:28s} {r['posenc'] * unit:9.2f} {u} {t} {sp}")


if __name__ == "__main__":
    sys.exit(main())
