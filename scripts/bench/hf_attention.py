#!/usr/bin/env python3
"""One layer's attention at SmolLM2-135M's shapes, posenc beside PyTorch's sdpa
(issue 39), without the rest of the model.

On random queries `(1, 9, T, 64)` and keys and values `(1, 3, T, 64)`, no
gradient, `--threads` threads for both (set as `hf_models.py` sets them,
before posenc is imported), one call of each in turn per round:

- `sdpa`: `torch.nn.functional.scaled_dot_product_attention(q, k, v,
  is_causal=True, enable_gqa=True)`, what transformers' sdpa layer calls on
  a CPU with no mask;
- `posenc`: `posenc.torch.attention(q, k, v, causal=True)`, the fused plain
  attention;
- `method`: the fused path `posenc.hf` runs for a method (`--method`,
  default `self-extend:4:1024`), on the same tensors.

Prints, for each, the best and the median of `--rounds` calls, and sdpa's
median over its median; and the median of the calls' process CPU time
beside `threads × wall − CPU`, the thread time left idle (a pass whose
last tasks keep one thread busy while the others wait). The
floating-point work of the causal products is `T(T+1)/2 · 9 heads · 64 ·
2 products · 2` FLOP; the script prints the rate each median reaches.

Usage: python scripts/bench/hf_attention.py [--lengths 4096,16384] [--rounds 2] [--threads 2]
"""

import argparse
import statistics
import sys
import time

from hf_models import setup_threads


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lengths", default="4096,16384")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--method", default="self-extend:4:1024")
    args = ap.parse_args()
    setup_threads(args.threads)

    import torch
    import torch.nn.functional as F

    import posenc
    import posenc.hf as ph
    import posenc.torch as pt

    heads, kv_heads, d = 9, 3, 64
    cfg = dict(
        hidden_size=heads * d,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        rope_theta=100000.0,
        max_position_embeddings=8192,
        head_dim=d,
    )
    method = posenc.RopeConfig.from_hf(cfg).with_scaling(args.method)
    print(f"posenc {posenc.__version__} ({posenc.simd_level()}), torch {torch.__version__}, "
          f"{args.threads} threads, {args.rounds} rounds; method {args.method}")
    for t in (int(x) for x in args.lengths.split(",")):
        g = torch.Generator().manual_seed(0)
        q = torch.randn(1, heads, t, d, generator=g)
        k = torch.randn(1, kv_heads, t, d, generator=g)
        v = torch.randn(1, kv_heads, t, d, generator=g)
        fns = {
            "sdpa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
            "posenc": lambda: pt.attention(q, k, v, causal=True),
            "method": lambda: ph._method_attention(q, k, v, method, None),
        }
        times = {name: [] for name in fns}
        cpu = {name: [] for name in fns}
        with torch.no_grad():
            for fn in fns.values():
                fn()  # warm
            for _ in range(args.rounds):
                for name, fn in fns.items():
                    t0, c0 = time.perf_counter(), time.process_time()
                    fn()
                    times[name].append(time.perf_counter() - t0)
                    cpu[name].append(time.process_time() - c0)
        flop = t * (t + 1) / 2 * heads * d * 2 * 2
        base = statistics.median(times["sdpa"])
        print(f"{t} tokens ({flop / 1e9:.1f} GFLOP of products):")
        for name, ts in times.items():
            med = statistics.median(ts)
            idle = statistics.median(args.threads * w - c for w, c in zip(ts, cpu[name]))
            print(f"  {name:8s} best {min(ts) * 1e3:8.1f} ms  median {med * 1e3:8.1f} ms  "
                  f"{flop / med / 1e9:6.1f} GFLOP/s  sdpa / this {base / med:5.2f}  "
                  f"CPU {statistics.median(cpu[name]) * 1e3:7.1f} ms  idle {idle * 1e3:5.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
