#!/usr/bin/env python3
"""posenc's lab against its PyTorch twin, side by side, in one run.

For each model size, alternates `posenc bench train --json` and
`scripts/bench/torch_twin.py --json` for --rounds rounds (so that both see the
same machine, whatever else it is doing), and reports per encoding the median
over rounds of each one's median ms/step, the parameter counts (which must be
equal) and the ratio PyTorch / posenc (> 1: posenc is faster). Both use the
same number of threads (--threads, default 2: RAYON_NUM_THREADS for posenc,
torch.set_num_threads for PyTorch).

Usage (a venv with torch; never needed by the tests or CI):
    cargo build --release -p posenc-cli
    python scripts/bench/train_vs_torch.py [--rounds 5] [--pe nope,rope,alibi,t5,shaw] [--json]
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


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--pe", default="nope,rope,alibi,t5,shaw")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--posenc", default=str(ROOT / "target/release/posenc"))
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    env = dict(os.environ, RAYON_NUM_THREADS=str(a.threads))
    rows = []
    for (layers, d, h, t, b, steps) in SIZES:
        size = dict(layers=layers, d_model=d, heads=h, len=t, batch=b)
        args = ["--layers", str(layers), "--d-model", str(d), "--heads", str(h), "--len", str(t), "--batch", str(b), "--pe", a.pe, "--steps", str(steps)]
        ours, theirs = {}, {}
        params = {}
        for _ in range(a.rounds):
            for c in run([a.posenc, "bench", "train", *args, "--json"], env)["cases"]:
                ours.setdefault(c["pe"], []).append(c["ms_per_step"])
                params.setdefault(c["pe"], [None, None])[0] = c["params"]
            twin = [a.python, str(ROOT / "scripts/bench/torch_twin.py"), *args, "--threads", str(a.threads), "--json"]
            for c in run(twin, env)["cases"]:
                theirs.setdefault(c["pe"], []).append(c["ms_per_step"])
                params.setdefault(c["pe"], [None, None])[1] = c["params"]
        nope = statistics.median(ours["nope"]) if "nope" in ours else None
        for pe in a.pe.split(","):
            o, t_ = statistics.median(ours[pe]), statistics.median(theirs[pe])
            rows.append(dict(size=size, pe=pe, params_posenc=params[pe][0], params_torch=params[pe][1],
                             posenc_ms=o, torch_ms=t_, torch_over_posenc=t_ / o,
                             posenc_vs_nope=(o / nope) if nope else None))
    if a.json:
        print(json.dumps(dict(threads=a.threads, rounds=a.rounds, rows=rows), indent=2))
        return
    print(f"threads {a.threads}, median of {a.rounds} alternating rounds")
    print(f"{'size (L, d, H, T, B)':<24} {'pe':<6} {'params':>8} {'posenc ms':>10} {'torch ms':>9} {'torch/posenc':>13} {'vs NoPE':>8}")
    for r in rows:
        s = r["size"]
        label = f"{s['layers']}, {s['d_model']}, {s['heads']}, {s['len']}, {s['batch']}"
        same = "" if r["params_posenc"] == r["params_torch"] else f" (torch {r['params_torch']})"
        print(f"{label:<24} {r['pe']:<6} {r['params_posenc']:>8}{same} {r['posenc_ms']:>10.2f} {r['torch_ms']:>9.2f} {r['torch_over_posenc']:>13.2f} {r['posenc_vs_nope']:>8.2f}")


if __name__ == "__main__":
    main()
