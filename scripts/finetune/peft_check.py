#!/usr/bin/env python3
"""A posenc-written LoRA adapter loaded by PEFT, and its merged checkpoint by transformers.

1. Trains an adapter with posenc on the tiny Llama 3.1 of
   `crates/posenc-models/tests/fixtures/tiny-llama31` (a word-level
   tokenizer over its 256 ids, a seeded text):

       posenc finetune --model tiny-llama31 --tokenizer tokenizer.json --text text.txt
           --length 64 --pose 16 --scaling yarn:2 --steps 16 --lora 4 --alpha 8
           --targets q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj
           --train embed,norm --lr 1e-2 --warmup 0 --merge --out OUT --quiet

2. Loads the base model with transformers (float32, eager attention) under
   the merged checkpoint's config (YaRN x2 in `rope_scaling`), puts the
   adapter on it with `PeftModel.from_pretrained(model, OUT)` (LoRA on all
   seven projections, the embedding and every norm as `modules_to_save`),
   and computes transformers' loss (`labels = input_ids`) on the text's
   last 64 tokens (its held-out tenth) at two sets of position ids: 0..63,
   and PoSE-style 0..31 then 80..111;
3. loads `OUT/merged` with `AutoModelForCausalLM.from_pretrained` alone and
   computes the same losses; loads its tokenizer with `AutoTokenizer`;
4. writes the adapter (`adapter_config.json`, `adapter_model.safetensors`)
   and `peft-check.json` into `crates/posenc-tune/tests/fixtures/peft-llama31/`:

       {"torch", "transformers", "peft": versions, "command": [...],
        "tokens": [...],
        "cases": {"contiguous" | "pose": {"positions": [...],
                  "peft_loss": float, "merged_loss": float}},
        "tokenizer_check": {"text": "w1 w2 w3", "ids": [...]}}

`crates/posenc-tune/tests/peft.rs` reads them: posenc's loss with the
adapter applied (the trainable model, and the adapter merged into the
loaded decoder) must match within 1e-5 relative.

Usage (the tests read the stored files; this is never run by CI):
    cargo build --release -p posenc-cli
    HF_HUB_OFFLINE=1 /work/venv/bin/python scripts/finetune/peft_check.py [--posenc target/release/posenc]
"""

import argparse
import json
import os
import random
import shutil
import subprocess
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import peft
import torch
import transformers
from peft import PeftModel
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "crates/posenc-models/tests/fixtures/tiny-llama31"
OUT = ROOT / "crates/posenc-tune/tests/fixtures/peft-llama31"
SEED = 27
TARGETS = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"


def word_tokenizer():
    """A word-level tokenizer.json over the tiny model's 256 ids: w0..w254, [UNK]."""
    vocab = {f"w{i}": i for i in range(255)}
    vocab["[UNK]"] = 255
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
        "normalizer": None, "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": None, "decoder": None,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"},
    }


def loss(model, tokens, positions):
    ids = torch.tensor([tokens])
    pos = torch.tensor([positions])
    with torch.no_grad():
        return model(input_ids=ids, position_ids=pos, labels=ids).loss.item()


def main():
    ap = argparse.ArgumentParser()
    default = ROOT / "target/release/posenc"
    if not default.exists():
        default = ROOT / "target/debug/posenc"
    ap.add_argument("--posenc", type=Path, default=default)
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="posenc-peft-check-"))
    (work / "tokenizer.json").write_text(json.dumps(word_tokenizer()))
    rng = random.Random(SEED)
    period = [rng.randrange(255) for _ in range(97)]
    (work / "text.txt").write_text(" ".join(f"w{period[i % 97]}" for i in range(3000)))
    out = work / "out"
    cmd = [
        str(args.posenc), "finetune", "--model", str(BASE),
        "--tokenizer", str(work / "tokenizer.json"), "--text", str(work / "text.txt"),
        "--length", "64", "--pose", "16", "--scaling", "yarn:2", "--steps", "16",
        "--lora", "4", "--alpha", "8", "--targets", TARGETS, "--train", "embed,norm",
        "--lr", "1e-2", "--warmup", "0", "--merge", "--out", str(out), "--quiet",
    ]
    subprocess.run(cmd, check=True)

    # The text's last 64 tokens: in its held-out tenth, never trained on.
    tokens = [period[i % 97] for i in range(3000 - 64, 3000)]
    cases = {
        "contiguous": list(range(64)),
        "pose": list(range(32)) + list(range(80, 112)),
    }

    config = AutoConfig.from_pretrained(out / "merged")
    config._attn_implementation = "eager"
    base = AutoModelForCausalLM.from_pretrained(BASE, config=config, dtype=torch.float32)
    with_adapter = PeftModel.from_pretrained(base, out)
    with_adapter.eval()
    merged = AutoModelForCausalLM.from_pretrained(
        out / "merged", dtype=torch.float32, attn_implementation="eager")
    merged.eval()
    plain = AutoModelForCausalLM.from_pretrained(BASE, config=config, dtype=torch.float32)
    plain.eval()

    result = {}
    for name, positions in cases.items():
        p = loss(with_adapter, tokens, positions)
        m = loss(merged, tokens, positions)
        b = loss(plain, tokens, positions)
        print(f"{name}: PEFT {p:.7f}, merged {m:.7f}, base without the adapter {b:.7f}")
        assert abs(p - m) <= 1e-5 * abs(p), (p, m)
        assert abs(p - b) > 1e-3, "the adapter changes nothing"
        result[name] = {"positions": positions, "peft_loss": p, "merged_loss": m}

    tk = AutoTokenizer.from_pretrained(out / "merged")
    text = "w1 w2 w3"
    ids = tk(text, add_special_tokens=False)["input_ids"]
    assert ids == [1, 2, 3], ids

    OUT.mkdir(parents=True, exist_ok=True)
    for f in ["adapter_config.json", "adapter_model.safetensors"]:
        shutil.copy(out / f, OUT / f)
    shown = [c if not c.startswith("/") else Path(c).name for c in cmd]
    (OUT / "peft-check.json").write_text(json.dumps({
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "peft": peft.__version__,
        "command": shown,
        "tokens": tokens,
        "cases": result,
        "tokenizer_check": {"text": text, "ids": ids},
    }, indent=1) + "\n")
    print(f"wrote {OUT}")
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
