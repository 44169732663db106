#!/usr/bin/env python3
"""A LoRA training step of posenc (`posenc finetune --model`) beside PyTorch +
PEFT's, on the same GGUF, LoRA rank, window and thread count, in one run.

posenc: `posenc finetune --model GGUF --length W --steps N --lora R --lr 1e-3
--warmup 0 --seed 1 --out TMP --quiet` with RAYON_NUM_THREADS=THREADS, in its
own process; the time of steps 2..N is read from TMP/metrics.jsonl
(`elapsed_s` of step N minus that of step 1), so the load and the first step
are not counted.

PyTorch: this script again in `--torch-worker` mode, in its own process:
transformers loads the GGUF (dequantised to float32, sdpa attention),
`peft.get_peft_model` with LoraConfig(r=R, lora_alpha=8, target_modules
q_proj,v_proj, dropout 0), AdamW (lr 1e-3, weight decay 0.01), a step being
`model(input_ids=x, labels=x).loss.backward()`, gradient clipping to 1.0,
`opt.step()`, `opt.zero_grad()` on a window of W tokens of the text;
`torch.set_num_threads(THREADS)`; steps 2..N timed.

Both read the same text (Pride and Prejudice by default). Prints tokens per
second of each, their ratio, each process's peak RSS and the first step's
loss on each side (not the same window: a sanity check, not a parity one;
parity is tested in crates/posenc-tune/tests).

Usage (a venv with torch, transformers, gguf and peft; never needed by the
tests or CI):
    cargo build --release -p posenc-cli
    /work/venv/bin/python scripts/bench/finetune_vs_peft.py [--model GGUF]
        [--window 512] [--steps 6] [--rank 8] [--threads 2] [--posenc PATH]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEFAULT_GGUF = REPO / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_TEXT = REPO / "assets" / "corpus" / "pride-and-prejudice.txt"
DEFAULT_POSENC = REPO / "target" / "release" / "posenc"


def run_child(cmd, env):
    """Runs cmd (under /usr/bin/time -f %M, whose line ends stderr); returns
    (stdout, stderr)."""
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = p.communicate()
    if p.returncode != 0:
        raise SystemExit(f"{cmd[0]} failed ({p.returncode}): {err.strip()[-2000:]}")
    return out, err


def posenc_side(args):
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "ft"
        env = dict(os.environ, RAYON_NUM_THREADS=str(args.threads))
        cmd = [
            "/usr/bin/time", "-f", "%M", str(args.posenc), "finetune", "--model", str(args.model),
            "--length", str(args.window), "--steps", str(args.steps), "--lora", str(args.rank),
            "--lr", "1e-3", "--warmup", "0", "--seed", "1", "--out", str(out), "--quiet",
            "--text", str(args.text),
        ]
        _, err = run_child(cmd, env)
        peak_mb = int(err.strip().splitlines()[-1]) / 1024
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    by_step = {r["step"]: r for r in rows}
    secs = by_step[args.steps]["elapsed_s"] - by_step[1]["elapsed_s"]
    return {
        "tokens_per_s": args.window * (args.steps - 1) / secs,
        "peak_mb": peak_mb,
        "first_loss": by_step[1]["loss"],
    }


def torch_worker(args):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import resource

    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(args.threads)
    torch.manual_seed(1)
    d, name = os.path.split(os.path.abspath(args.model))
    tok = AutoTokenizer.from_pretrained(d, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=name, dtype=torch.float32)
    model = get_peft_model(
        model,
        LoraConfig(r=args.rank, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"]),
    )
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3, weight_decay=0.01)
    ids = tok(Path(args.text).read_text(encoding="utf-8"), add_special_tokens=False)["input_ids"]
    train = ids[: int(len(ids) * 0.9)]
    g = torch.Generator().manual_seed(1)
    times, first = [], None
    for step in range(args.steps):
        start = int(torch.randint(0, len(train) - args.window, (1,), generator=g))
        x = torch.as_tensor([train[start : start + args.window]], dtype=torch.long)
        t0 = time.perf_counter()
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
        opt.step()
        opt.zero_grad()
        times.append(time.perf_counter() - t0)
        if first is None:
            first = float(loss)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({
        "tokens_per_s": args.window * (args.steps - 1) / sum(times[1:]),
        "peak_mb": peak_mb,
        "first_loss": first,
        "attention": model.config._attn_implementation,
        "torch": torch.__version__,
    }))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=DEFAULT_GGUF)
    ap.add_argument("--text", type=Path, default=DEFAULT_TEXT)
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--posenc", type=Path, default=DEFAULT_POSENC)
    ap.add_argument("--torch-worker", action="store_true")
    args = ap.parse_args()
    if args.steps < 2:
        raise SystemExit("--steps must be at least 2 (the first step is not timed)")
    if args.torch_worker:
        torch_worker(args)
        return
    p = posenc_side(args)
    cmd = [sys.executable, __file__, "--torch-worker"] + sys.argv[1:]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    t_cmd = ["/usr/bin/time", "-f", "%M"] + cmd
    out, err = run_child(t_cmd, env)
    t = json.loads(out.strip().splitlines()[-1])
    t["peak_mb"] = int(err.strip().splitlines()[-1]) / 1024
    print(f"window {args.window}, LoRA r={args.rank} on q_proj,v_proj, {args.threads} threads, "
          f"steps 2..{args.steps} timed; PyTorch {t['torch']} ({t['attention']}) + PEFT")
    print("| side | tokens/s | peak RSS | first step's loss |")
    print("|---|---|---|---|")
    print(f"| posenc | {p['tokens_per_s']:.1f} | {p['peak_mb']:.0f} MB | {p['first_loss']:.4f} |")
    print(f"| PyTorch + PEFT | {t['tokens_per_s']:.1f} | {t['peak_mb']:.0f} MB | {t['first_loss']:.4f} |")
    print(f"ratio (posenc / PyTorch): {p['tokens_per_s'] / t['tokens_per_s']:.2f}")


if __name__ == "__main__":
    main()
