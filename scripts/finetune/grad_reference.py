#!/usr/bin/env python3
"""PyTorch + PEFT reference gradients of LoRA fine-tuning, for `posenc-tune`'s tests.

For each tiny random decoder of `crates/posenc-models/tests/fixtures`
(`tiny-llama31`: Llama 3.1's llama3 scaling, untied head; `tiny-qwen25`:
Qwen2.5's YaRN, q/k/v biases, head tied to the embedding), this script

1. loads the checkpoint with transformers (float32, eager attention, CPU,
   `model.train()`; the configs have no dropout);
2. wraps it with PEFT LoRA (r = 4, lora_alpha = 8, so scaling 2; dropout 0;
   targets q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj)
   and sets every LoRA factor to a fixed nonzero seeded value
   (`torch.Generator().manual_seed(SEED + 1)`, layers in order, targets in
   the order above, A then B): A ~ U(-1/sqrt(in), 1/sqrt(in)) (PEFT's own
   initial range), B ~ U(-0.05, 0.05) (nonzero, so that A's gradient is
   nonzero);
3. makes `model.embed_tokens.weight` and every RMSNorm weight trainable too
   (LongLoRA's `embed,norm`; for the tied Qwen2.5 the head is the same
   parameter, so its gradient is the sum of both uses);
4. runs one forward on `tokens` (64 ids, `numpy.random.RandomState(SEED)
   .randint(0, 256, 64)`) with `labels = tokens` (transformers' shifted mean
   cross-entropy over the 63 next tokens) and position ids 0..63, and one
   backward;
5. repeats 4 with PoSE-style skipped position ids (`pose`: 0..31 then
   80..111, Zhu et al. 2024), recording the loss and every gradient;
6. takes one `torch.optim.AdamW` step (lr 1e-3, betas (0.9, 0.999), eps 1e-8,
   weight decay 0, no clipping) from the gradients of 4 over every trainable
   parameter, and records a few updated LoRA factors.

Writes `crates/posenc-tune/tests/fixtures/grads-{llama31,qwen25}.json`:

    {"torch", "transformers", "peft": versions,
     "model": fixture directory name, "lora": {"r", "alpha", "dropout", "targets"},
     "tokens": [...],
     "lora_init": {PEFT name: [flattened row-major floats]},   # lora_A: (r, in), lora_B: (out, r)
     "cases": {"contiguous" | "pose": {
         "positions": [...], "loss": float,
         "grads": {name: [floats]} for every LoRA factor and RMSNorm weight,
         "embed_grad": {"norm": Frobenius norm, "rows": {token id: [floats]}}}},
     "adamw": {"lr", "betas", "eps", "weight_decay",
               "updated": {PEFT name: [floats]}}}

LoRA names are PEFT's saved-adapter names
(`base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight`), base
parameters their Hugging Face names (`model.norm.weight`). Floats are written
with 9 significant digits (exact for float32).

Usage (the tests read the stored files; this is never run by CI):
    /work/venv/bin/pip install peft
    HF_HUB_OFFLINE=1 /work/venv/bin/python scripts/finetune/grad_reference.py
"""

import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import numpy as np
import peft
import torch
import transformers
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "crates/posenc-models/tests/fixtures"
OUT = ROOT / "crates/posenc-tune/tests/fixtures"
SEED = 27
T = 64
RANK = 4
ALPHA = 8
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# Rows of the embedding gradient written out: four ids in the input, four not.
EMBED_ROWS_IN = 4
EMBED_ROWS_OUT = 4
PREFIX = "base_model.model."
# The updated factors recorded after the AdamW step.
ADAMW_RECORDED = [
    "model.layers.0.self_attn.q_proj.lora_A",
    "model.layers.0.self_attn.q_proj.lora_B",
    "model.layers.1.mlp.down_proj.lora_A",
    "model.layers.1.mlp.down_proj.lora_B",
]


def f32_list(t):
    return [float("%.9g" % v) for v in t.detach().reshape(-1).to(torch.float64).tolist()]


def adapter_name(name):
    """PEFT's parameter name (`...lora_A.default.weight`) as saved (`...lora_A.weight`)."""
    return name.replace(".default.", ".")


def load(name):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(
        MODELS / name, dtype=torch.float32, attn_implementation="eager"
    )
    cfg = LoraConfig(
        r=RANK, lora_alpha=ALPHA, lora_dropout=0.0, target_modules=TARGETS, bias="none"
    )
    model = get_peft_model(model, cfg)
    gen = torch.Generator().manual_seed(SEED + 1)
    init = {}
    with torch.no_grad():
        for layer in range(model.config.num_hidden_layers):
            for target in TARGETS:
                block = "self_attn" if target.endswith(("q_proj", "k_proj", "v_proj", "o_proj")) else "mlp"
                module = model.get_submodule(f"{PREFIX}model.layers.{layer}.{block}.{target}")
                a = module.lora_A["default"].weight
                b = module.lora_B["default"].weight
                bound = 1.0 / a.shape[1] ** 0.5
                a.copy_((torch.rand(a.shape, generator=gen) * 2 - 1) * bound)
                b.copy_((torch.rand(b.shape, generator=gen) * 2 - 1) * 0.05)
                base = f"{PREFIX}model.layers.{layer}.{block}.{target}"
                init[f"{base}.lora_A.weight"] = f32_list(a)
                init[f"{base}.lora_B.weight"] = f32_list(b)
    for pname, p in model.named_parameters():
        if pname.endswith("embed_tokens.weight") or "norm" in pname:
            p.requires_grad_(True)
    model.train()
    return model, init


def trainable(model):
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


def run_case(model, tokens, positions):
    model.zero_grad(set_to_none=True)
    ids = torch.tensor([tokens])
    pos = torch.tensor([positions])
    out = model(input_ids=ids, position_ids=pos, labels=ids)
    out.loss.backward()
    grads = {}
    embed = None
    for n, p in trainable(model):
        if n.endswith("embed_tokens.weight"):
            embed = p.grad.detach().clone()
            continue
        key = adapter_name(n) if "lora_" in n else n[len(PREFIX):]
        grads[key] = f32_list(p.grad)
    present = sorted(set(tokens))
    absent = [i for i in range(embed.shape[0]) if i not in set(tokens)]
    rows = present[:EMBED_ROWS_IN] + absent[:EMBED_ROWS_OUT]
    return {
        "positions": positions,
        "loss": float(out.loss.item()),
        "grads": grads,
        "embed_grad": {
            "norm": float(embed.to(torch.float64).norm().item()),
            "rows": {str(r): f32_list(embed[r]) for r in rows},
        },
    }


def main():
    torch.set_num_threads(2)
    tokens = [int(t) for t in np.random.RandomState(SEED).randint(0, 256, T)]
    for short, name in [("llama31", "tiny-llama31"), ("qwen25", "tiny-qwen25")]:
        model, init = load(name)
        pose = list(range(32)) + list(range(80, 112))
        cases = {"pose": run_case(model, tokens, pose)}
        # The contiguous case last: its gradients feed the AdamW step.
        cases["contiguous"] = run_case(model, tokens, list(range(T)))
        opt = torch.optim.AdamW(
            [p for _, p in trainable(model)], lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0
        )
        opt.step()
        updated = {}
        named = dict(model.named_parameters())
        for stem in ADAMW_RECORDED:
            updated[f"{PREFIX}{stem}.weight"] = f32_list(named[f"{PREFIX}{stem}.default.weight"])
        doc = {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "peft": peft.__version__,
            "model": name,
            "lora": {"r": RANK, "alpha": ALPHA, "dropout": 0.0, "targets": TARGETS},
            "tokens": tokens,
            "lora_init": init,
            "cases": cases,
            "adamw": {
                "lr": 1e-3,
                "betas": [0.9, 0.999],
                "eps": 1e-8,
                "weight_decay": 0.0,
                "updated": updated,
            },
        }
        OUT.mkdir(parents=True, exist_ok=True)
        path = OUT / f"grads-{short}.json"
        with open(path, "w", encoding="utf-8") as f:
            json.dump(doc, f, separators=(",", ":"))
            f.write("\n")
        print(f"wrote {path} ({path.stat().st_size} bytes), loss {cases['contiguous']['loss']:.6f}")


if __name__ == "__main__":
    main()
