#!/usr/bin/env python3
"""posenc.torch.attention in a steady loop, for comparing two builds of the
package (run this script once per build, alternating; docs/speed.md).

At python_ops.py's shape and inputs (its `setup`: `B=1, H=8, T=2048, D=64`,
causal, Llama 3's RoPE inside, 2 threads): the forward alone (no gradient) and the forward +
backward, `--calls` calls of each, best and median; and a hash of the bits of
the output and of the three gradients, so that two builds that should give
the same bits can be checked to.

`--order` instead times, 8 times each, posenc's forward + backward right
after a call of the PyTorch peer (transformers' `apply_rotary_pos_emb` and
`scaled_dot_product_attention`) and right after one of its own, and the
peer's the same way: whether one library's calls slow the next call of the
other (on two cores, PyTorch's OpenMP workers keep spinning for a while
after each parallel region).

Usage (the package installed, or on PYTHONPATH):
    python scripts/bench/attention_ab.py LABEL [--calls 12] [--seq 2048]
    python scripts/bench/attention_ab.py LABEL --order
"""

import argparse
import hashlib
import statistics
import sys
import time

from python_ops import setup


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("label", help="a name for this build, printed first")
    ap.add_argument("--calls", type=int, default=12)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--order", action="store_true")
    args = ap.parse_args()
    bench = setup(args.seq, args.threads)
    torch, pt, rope, q, k, v = bench.torch, bench.pt, bench.rope, bench.q, bench.k, bench.v
    fwd_bwd, peer = bench.posenc_attn, bench.torch_attn

    def fwd():
        with torch.no_grad():
            return pt.attention(q, k, v, rope=rope)

    def ms(fn):
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3

    if args.order:
        fwd_bwd()
        peer()
        rows = {
            "posenc after PyTorch": [],
            "posenc after posenc": [],
            "PyTorch after posenc": [],
            "PyTorch after PyTorch": [],
        }
        for _ in range(8):
            peer()
            rows["posenc after PyTorch"].append(ms(fwd_bwd))
            fwd_bwd()
            rows["posenc after posenc"].append(ms(fwd_bwd))
            fwd_bwd()
            rows["PyTorch after posenc"].append(ms(peer))
            peer()
            rows["PyTorch after PyTorch"].append(ms(peer))
        for name, xs in rows.items():
            print(f"{args.label}: {name:22s} min {min(xs):7.2f} ms  median {statistics.median(xs):7.2f} ms")
        return

    digest = hashlib.sha256(b"".join(x.detach().numpy().tobytes() for x in fwd_bwd()))
    tf, tb = [], []
    for _ in range(args.calls):
        tf.append(ms(fwd))
        tb.append(ms(fwd_bwd))
    print(
        f"{args.label}: bits {digest.hexdigest()[:16]}  forward best {min(tf):.2f} median "
        f"{statistics.median(tf):.2f} ms  forward + backward best {min(tb):.2f} median "
        f"{statistics.median(tb):.2f} ms"
    )


if __name__ == "__main__":
    sys.exit(main())
