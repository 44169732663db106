#!/usr/bin/env python3
"""Reference RoPE tables for real checkpoints, computed by Hugging Face transformers itself.

For every `NAME.config.json` in the input directory (the rope-relevant keys of a
published `config.json`), this loads the config with transformers' own
`AutoConfig.from_pretrained` (so `rope_scaling` / `rope_parameters`
standardisation, GPT-NeoX `rotary_pct`, DeepSeek `qk_rope_head_dim`, Phi-3's
top-level `original_max_position_embeddings` ... are handled by transformers),
instantiates the model's own `*RotaryEmbedding` module and reads its
`inv_freq` buffer and `attention_scaling`. Cases with an explicit `seq_len`
(dynamic NTK, LongRoPE long factors) call `ROPE_INIT_FUNCTIONS[rope_type]`
with that `seq_len`, as transformers' `dynamic_rope_update` does.

It writes `NAME.expected.json` in the same shape as the shared
`fixtures/hf-rope/*.expected.json`:
  cases[]: seq_len, rope_type, rotary_dim (2 x len(inv_freq)), inv_freq (float32
  values), attention_factor, positions, cos_f64/sin_f64 (float64 evaluation of
  cos/sin(position x inv_freq) x attention_factor from the float32 frequencies)
  and cos_hf_f32/sin_hf_f32 (transformers' float32 path: float32 angle).

Usage (venv with torch + transformers==5.23.0):
    python scripts/rope/gen_checkpoint_fixtures.py crates/posenc/tests/fixtures/checkpoints
    python scripts/rope/gen_checkpoint_fixtures.py --check /work/shared/fixtures/hf-rope
`--check` recomputes existing expected files and reports the largest difference
(used to validate this script against the shared fixtures).
"""

import argparse
import importlib
import json
import math
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
import transformers
from transformers import AutoConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

POSITIONS = [0, 1, 2, 7, 100, 1023, 4095, 32767, 131071, 1000000, 10000000]


def rotary_module(config):
    """The model's own rotary embedding module, built from `config`."""
    mt = config.model_type
    mod = importlib.import_module(f"transformers.models.{mt}.modeling_{mt}")
    names = [n for n in dir(mod) if n.endswith("RotaryEmbedding") and not n.startswith("_")]
    # prefer the plain one (e.g. LlamaRotaryEmbedding, not a subclass variant)
    names.sort(key=len)
    if not names:
        raise SystemExit(f"no RotaryEmbedding in {mod.__name__}")
    return getattr(mod, names[0])(config)


def rope_type_of(config):
    return config.rope_parameters.get("rope_type", "default")


def case(config, rope, seq_len, positions):
    rt = rope_type_of(config)
    if seq_len is None:
        inv = rope.inv_freq.detach().to(torch.float32).clone()
        af = float(rope.attention_scaling)
    else:
        inv, af = ROPE_INIT_FUNCTIONS[rt](config, None, seq_len=seq_len)
        inv = inv.to(torch.float32)
        af = float(af)
    inv64 = inv.double().numpy()
    pos64 = np.array(positions, dtype=np.float64)
    ang = pos64[:, None] * inv64[None, :]
    cos64 = np.cos(ang) * af
    sin64 = np.sin(ang) * af
    ang32 = torch.tensor(positions, dtype=torch.float32)[:, None] * inv[None, :]
    cos32 = ang32.cos() * af
    sin32 = ang32.sin() * af
    return {
        "seq_len": seq_len,
        "rope_type": rt,
        "rotary_dim": 2 * inv.numel(),
        "inv_freq": [float(v) for v in inv.tolist()],
        "attention_factor": af,
        "positions": positions,
        "cos_f64": cos64.tolist(),
        "sin_f64": sin64.tolist(),
        "cos_hf_f32": cos32.tolist(),
        "sin_hf_f32": sin32.tolist(),
    }


def load(config_path):
    raw = json.loads(Path(config_path).read_text())
    with tempfile.TemporaryDirectory() as d:
        Path(d, "config.json").write_text(json.dumps(raw))
        return AutoConfig.from_pretrained(d)


def seq_lens_for(config):
    rt = rope_type_of(config)
    if rt == "longrope":
        return [None, config.rope_parameters["original_max_position_embeddings"] + 1]
    if rt == "dynamic":
        return [None, 4 * config.max_position_embeddings]
    return [None]


def generate(directory):
    for cfg in sorted(Path(directory).glob("*.config.json")):
        name = cfg.name[: -len(".config.json")]
        config = load(cfg)
        rope = rotary_module(config)
        cases = [case(config, rope, s, POSITIONS) for s in seq_lens_for(config)]
        out = {"name": name, "transformers": transformers.__version__, "cases": cases}
        Path(directory, f"{name}.expected.json").write_text(json.dumps(out, indent=1) + "\n")
        c = cases[0]
        print(f"{name}: {c['rope_type']} rotary_dim={c['rotary_dim']} attention_factor={c['attention_factor']}")


def check(directory):
    worst = 0.0
    for exp in sorted(Path(directory).glob("*.expected.json")):
        name = exp.name[: -len(".expected.json")]
        ref = json.loads(exp.read_text())
        config = load(Path(directory, f"{name}.config.json"))
        rope = rotary_module(config)
        for rc in ref["cases"]:
            c = case(config, rope, rc["seq_len"], rc["positions"])
            assert c["rope_type"] == rc["rope_type"], (name, c["rope_type"], rc["rope_type"])
            assert c["rotary_dim"] == rc["rotary_dim"], name
            d_inv = max(abs(a - b) / abs(b) if b else abs(a) for a, b in zip(c["inv_freq"], rc["inv_freq"]))
            d_af = abs(c["attention_factor"] - rc["attention_factor"])
            d_cos = float(np.max(np.abs(np.array(c["cos_f64"]) - np.array(rc["cos_f64"]))))
            worst = max(worst, d_inv, d_af, d_cos)
            print(f"{name} seq_len={rc['seq_len']}: inv_freq rel {d_inv:.3g}, attention_factor {d_af:.3g}, cos {d_cos:.3g}")
    print("worst", worst)
    return worst


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("directory")
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args()
    if a.check:
        sys.exit(0 if check(a.directory) == 0.0 else 1)
    generate(a.directory)
