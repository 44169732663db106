"""The RoPE base each transformers config class uses when config.json gives none.

Writes crates/posenc/tests/fixtures/class-default-theta.json, read by
crates/posenc/tests/rope_class_defaults.rs. Run with transformers installed:

    python scripts/rope/gen_class_default_theta.py
"""
import json
import pathlib

import transformers
from transformers import CONFIG_MAPPING

TYPES = [
    "apertus", "bitnet", "cohere", "cwm", "ernie4_5", "ernie4_5_moe", "exaone", "flex_olmo",
    "gpt_oss", "helium", "lfm2", "lfm2_moe", "longcat_flash", "minimax", "minimax_m2", "mixtral",
    "olmo3", "phimoe", "csm", "solar_open", "sarvam_moe", "qwen2_vl", "qwen2_5_vl",
    "qwen2_5_omni", "qwen3_vl", "qwen3_vl_moe", "llama4", "smollm3", "llama", "mistral", "qwen2",
    "qwen3",
]

out = []
for t in TYPES:
    text = CONFIG_MAPPING[t]().get_text_config()
    params = text.rope_parameters
    if "rope_theta" in params:
        theta = params["rope_theta"]
    else:  # one dict per layer type (OLMo 3): every one has the same base here
        thetas = {p["rope_theta"] for p in params.values()}
        assert len(thetas) == 1, (t, params)
        theta = thetas.pop()
    out.append({"model_type": t, "rope_theta": theta})

path = pathlib.Path(__file__).resolve().parents[2] / "crates/posenc/tests/fixtures/class-default-theta.json"
path.write_text(json.dumps({"transformers": transformers.__version__, "models": out}, indent=1) + "\n")
print(f"wrote {path} ({len(out)} model types)")
