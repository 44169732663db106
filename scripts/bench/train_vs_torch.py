#!/usr/bin/env python3
"""posenc's lab against its PyTorch twin, side by side, in one run.

For each model size, alternates `posenc bench train --json` and
`scripts/bench/torch_twin.py --json` for --rounds rounds (so that both see the
same machine, whatever else it is doing), and reports per encoding the median
over rounds of each one's median ms/step with the spread (lowest and highest
round), the parameter counts (which must be equal) and the ratio
PyTorch / posenc (> 1: posenc is faster). Both use the same number of threads
(--threads, default 2: RAYON_NUM_THREADS for posenc, torch.set_num_threads
for PyTorch).

posenc may run in several variants within the same rounds:
  --simd avx512,avx2   the same binary once per kernel level (POSENC_SIMD),
  --baseline PATH      another posenc binary (say, a build of an older
                       commit), run with its own defaults, labelled "base".
  --variant LABEL=PATH[@LEVEL]
                       any other binary, at a POSENC_SIMD level if given
                       (repeatable): say, a build without the gemm crate's
                       AVX-512 kernels forced to AVX2, which is what an
                       AVX2-only machine runs.

Usage (a venv with torch; never needed by the tests or CI):
    cargo build --release -p posenc-cli
    python scripts/bench/train_vs_torch.py [--rounds 5] [--pe nope,rope,alibi,t5,shaw]
        [--sizes 0,2] [--simd avx512,avx2] [--baseline PATH] [--json]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SIZES = [
    # (layers, d_model, heads, length, batch, steps per round)
    (2, 32, 4, 32, 16, 30),
    (2, 64, 4, 64, 32, 15),
    (4, 128, 4, 128, 32, 5),
]


def run(cmd, env):
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def spread(xs):
    return dict(median=statistics.median(xs), min=min(xs), max=max(xs), n=len(xs))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--pe", default="nope,rope,alibi,t5,shaw")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--posenc", default=str(ROOT / "target/release/posenc"))
    p.add_argument("--simd", default="", help="comma-separated POSENC_SIMD levels to run the posenc binary at (default: its own choice)")
    p.add_argument("--baseline", default="", help="another posenc binary to run in the same rounds (label: base)")
    p.add_argument("--variant", action="append", default=[], help="LABEL=PATH[@LEVEL]: another binary (repeatable)")
    p.add_argument("--sizes", default="", help="indices into SIZES to run (default: all)")
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    env = dict(os.environ, RAYON_NUM_THREADS=str(a.threads))
    env.pop("POSENC_SIMD", None)
    variants = []  # (label, binary, env)
    levels = [s.strip() for s in a.simd.split(",") if s.strip()]
    if levels:
        for lv in levels:
            variants.append((lv, a.posenc, dict(env, POSENC_SIMD=lv)))
    else:
        variants.append(("posenc", a.posenc, env))
    if a.baseline:
        variants.append(("base", a.baseline, env))
    for v in a.variant:
        label, _, rest = v.partition("=")
        path, _, level = rest.partition("@")
        variants.append((label, path, dict(env, POSENC_SIMD=level) if level else env))
    sizes = SIZES if not a.sizes else [SIZES[int(i)] for i in a.sizes.split(",")]
    rows = []
    for (layers, d, h, t, b, steps) in sizes:
        size = dict(layers=layers, d_model=d, heads=h, len=t, batch=b)
        args = ["--layers", str(layers), "--d-model", str(d), "--heads", str(h), "--len", str(t), "--batch", str(b), "--pe", a.pe, "--steps", str(steps)]
        ours = {lab: {} for lab, _, _ in variants}
        theirs = {}
        params = {}
        simd = {}
        for _ in range(a.rounds):
            for lab, binary, venv in variants:
                res = run([binary, "bench", "train", *args, "--json"], venv)
                simd[lab] = res.get("simd", "?")
                for c in res["cases"]:
                    ours[lab].setdefault(c["pe"], []).append(c["ms_per_step"])
                    params.setdefault(c["pe"], [None, None])[0] = c["params"]
            twin = [a.python, str(ROOT / "scripts/bench/torch_twin.py"), *args, "--threads", str(a.threads), "--json"]
            for c in run(twin, env)["cases"]:
                theirs.setdefault(c["pe"], []).append(c["ms_per_step"])
                params.setdefault(c["pe"], [None, None])[1] = c["params"]
        for pe in a.pe.split(","):
            tt = spread(theirs[pe])
            row = dict(size=size, pe=pe, params_posenc=params[pe][0], params_torch=params[pe][1], torch_ms=tt, posenc={})
            for lab, _, _ in variants:
                o = spread(ours[lab][pe])
                nope = statistics.median(ours[lab]["nope"]) if "nope" in ours[lab] else None
                o.update(simd=simd[lab], torch_over_posenc=tt["median"] / o["median"],
                         posenc_vs_nope=(o["median"] / nope) if nope else None)
                row["posenc"][lab] = o
            rows.append(row)
    if a.json:
        print(json.dumps(dict(threads=a.threads, rounds=a.rounds, rows=rows), indent=2))
        return
    print(f"threads {a.threads}, median (lowest-highest) of {a.rounds} alternating rounds, ms per step")
    labels = [lab for lab, _, _ in variants]
    head = f"{'size (L, d, H, T, B)':<22} {'pe':<6} {'params':>8} {'torch ms':>18}"
    for lab in labels:
        head += f" {lab + ' ms':>20} {'torch/' + lab:>12}"
    print(head)
    for r in rows:
        s = r["size"]
        label = f"{s['layers']}, {s['d_model']}, {s['heads']}, {s['len']}, {s['batch']}"
        t = r["torch_ms"]
        line = f"{label:<22} {r['pe']:<6} {r['params_posenc']:>8} {t['median']:>7.2f} ({t['min']:.2f}-{t['max']:.2f})"
        for lab in labels:
            o = r["posenc"][lab]
            line += f" {o['median']:>7.2f} ({o['min']:.2f}-{o['max']:.2f}) {o['torch_over_posenc']:>11.2f}x"
        if r["params_posenc"] != r["params_torch"]:
            line += f" (torch params {r['params_torch']})"
        print(line)
    print("kernels: " + ", ".join(f"{lab}={rows[0]['posenc'][lab]['simd']}" for lab in labels) if rows else "")


if __name__ == "__main__":
    main()
