#!/usr/bin/env python3
"""Tiny random Hugging Face decoders and their transformers reference values, for `posenc-models`' tests.

Writes `crates/posenc-models/tests/fixtures/`:

- `tiny-llama31/` (`config.json` + `model.safetensors`): a `LlamaForCausalLM`
  shaped like Llama 3.1 8B's config (rope theta 500000, `llama3` rope
  scaling factor 8, low/high frequency factors 1/4, but
  `original_max_position_embeddings` 32 and `max_position_embeddings` 128),
  2 layers, hidden 64, 4 heads, 2 KV heads (head_dim 16), intermediate 128,
  vocabulary 256, rms_norm_eps 1e-5, untied head, no attention bias;
- `tiny-qwen25/`: a `Qwen2ForCausalLM` shaped like Qwen2.5's (rope theta 1e6,
  q/k/v biases, `yarn` rope scaling factor 4 with
  `original_max_position_embeddings` 32, `max_position_embeddings` 128),
  same sizes, rms_norm_eps 1e-6, head tied to the embedding (so the
  safetensors file has no `lm_head.weight`).

  Both are float32, built with `torch.manual_seed(0)` and transformers' own
  initialisation (normal, std 0.02), except the RMSNorm weights, drawn as
  1 + 0.1 N(0, 1), and Qwen2's q/k/v biases, drawn as 0.1 N(0, 1), so that a
  norm or bias bug shows in the logits;
- `reference.json`: `{"transformers", "torch", "models": {NAME: {...}}}` with,
  per model, `input_ids` (64 ids, `numpy.random.RandomState(0).randint(0,
  256, 64)`, no BOS), `L` (32: the config's `original_max_position_embeddings`),
  and per RoPE scaling ("model": the config's own; "none", "linear:2",
  "dynamic:2", "ntk:2", "yarn:2": see `gguf_reference.scaling_rope_parameters`)
  the `rope_parameters` given to transformers, the effective `inv_freq` and
  `attention_scaling` of the rotary module (read back after the forward, so
  for "dynamic:2" the frequencies rescaled for the 64-token window, which is
  2L), `logits_first` (positions 0..3, full vocabulary), `logits_last`
  (position 63) and `loss` (63 floats, -log softmax(logits[i])[t[i+1]], the
  log-softmax taken in float64 on the model's float32 logits); plus `greedy`:
  the 16 ids `model.generate(do_sample=False, max_new_tokens=16)` appends to
  the first 8 input ids with the model's own scaling (EOS disabled), and
  `greedy_margins`: the gap between the best and second-best logit at each of
  those steps (they are small for a random model: a gap below ~1e-4 means an
  implementation may pick the other token legitimately).

The reference values are computed on the models as reloaded from the saved
files (sdpa attention, float32, CPU, 2 threads, `model.eval()`, no grad).

Usage (never needed by the tests or CI, which read the stored files):
    HF_HUB_OFFLINE=1 /work/venv/bin/python scripts/models/gen_model_fixtures.py [OUT_DIR]
"""

import argparse
import copy
import json
import os
import shutil
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import numpy as np
import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gguf_reference import (  # noqa: E402
    FIXTURES,
    RotaryProbe,
    install_scaling,
    token_losses,
    trained_length,
    versions,
)

SCALINGS = ["model", "none", "linear:2", "dynamic:2", "ntk:2", "yarn:2"]
T = 64
PROMPT = 8
NEW = 16


def tiny_llama31():
    return LlamaForCausalLM, LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        hidden_act="silu",
        max_position_embeddings=128,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        attention_bias=False,
        mlp_bias=False,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        },
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )


def tiny_qwen25():
    return Qwen2ForCausalLM, Qwen2Config(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        hidden_act="silu",
        max_position_embeddings=128,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        use_sliding_window=False,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 1000000.0,
            "factor": 4.0,
            "original_max_position_embeddings": 32,
        },
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )


MODELS = {"tiny-llama31": tiny_llama31, "tiny-qwen25": tiny_qwen25}


def build_and_save(name, out_dir):
    cls, config = MODELS[name]()
    torch.manual_seed(0)
    model = cls(config).float().eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for mod_name, mod in model.named_modules():
            if type(mod).__name__.endswith("RMSNorm"):
                mod.weight.copy_(1 + 0.1 * torch.randn(mod.weight.shape, generator=g))
            if isinstance(mod, torch.nn.Linear) and mod.bias is not None:
                mod.bias.copy_(0.1 * torch.randn(mod.bias.shape, generator=g))
    d = out_dir / name
    if d.exists():
        shutil.rmtree(d)
    model.save_pretrained(d)
    for extra in d.iterdir():
        if extra.name not in ("config.json", "model.safetensors"):
            extra.unlink()
    assert (d / "model.safetensors").exists()
    print(f"wrote {d}: " + ", ".join(f"{p.name} {p.stat().st_size} B" for p in sorted(d.iterdir())))
    return cls, d


def reference(cls, d, input_ids):
    model = cls.from_pretrained(d, dtype=torch.float32).eval()
    assert model.config._attn_implementation == "sdpa", model.config._attn_implementation
    base = copy.deepcopy(model.config)
    L = trained_length(base)
    x = torch.as_tensor([input_ids], dtype=torch.long)
    entry = {"input_ids": input_ids, "L": L, "config": json.loads(base.to_json_string()), "scalings": {}}
    for scaling in SCALINGS:
        rotary, params, mpe = install_scaling(model, scaling, L, base)
        probe = RotaryProbe(rotary)
        logits = model(input_ids=x, use_cache=False).logits[0].float()
        inv_freq, att = probe.check(rotary)
        probe.close()
        loss = token_losses(logits, input_ids)
        assert loss.shape[0] == T - 1 and torch.isfinite(loss).all()
        entry["scalings"][scaling] = {
            "rope_parameters": params,
            "max_position_embeddings": mpe,
            "inv_freq": inv_freq,
            "attention_scaling": att,
            "logits_first": [[float(v) for v in logits[p].tolist()] for p in range(4)],
            "logits_last": [float(v) for v in logits[T - 1].tolist()],
            "loss": [float(v) for v in loss.tolist()],
        }
        print(
            f"  {scaling:10s} mean loss {loss.mean().item():.5f} inv_freq[0]={inv_freq[0]:.6g} "
            f"inv_freq[-1]={inv_freq[-1]:.6g} attention_scaling={att:.6g}"
        )

    # greedy generation with the model's own scaling (EOS disabled: exactly NEW tokens)
    install_scaling(model, "model", L, base)
    prompt = input_ids[:PROMPT]
    model.generation_config.eos_token_id = None
    model.generation_config.bos_token_id = None
    model.generation_config.pad_token_id = 0
    gen = model.generate(
        torch.as_tensor([prompt]), do_sample=False, max_new_tokens=NEW, eos_token_id=None, pad_token_id=0
    )[0, PROMPT:].tolist()
    seq, margins = list(prompt), []
    for _ in range(NEW):
        last = model(input_ids=torch.as_tensor([seq]), use_cache=False).logits[0, -1]
        top = torch.topk(last, 2).values
        margins.append(float(top[0] - top[1]))
        seq.append(int(last.argmax()))
    assert seq[PROMPT:] == gen, (seq[PROMPT:], gen)
    entry["greedy"] = gen
    entry["greedy_margins"] = margins
    print(f"  greedy {gen} (smallest margin {min(margins):.3g})")
    return entry


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", nargs="?", default=str(FIXTURES))
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)

    input_ids = [int(v) for v in np.random.RandomState(0).randint(0, 256, T)]
    ref = {**versions(), "models": {}}
    with torch.no_grad():
        for name in MODELS:
            cls, d = build_and_save(name, out_dir)
            ref["models"][name] = reference(cls, d, input_ids)
    path = out_dir / "reference.json"
    with open(path, "w", encoding="utf-8") as f:
        json.dump(ref, f)
        f.write("\n")
    print(f"wrote {path} ({path.stat().st_size} bytes)")


if __name__ == "__main__":
    sys.exit(main())
