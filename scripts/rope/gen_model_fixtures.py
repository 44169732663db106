#!/usr/bin/env python3
"""Per-layer, multimodal and vision RoPE reference values, computed by Hugging Face transformers itself.

Pinned: transformers==5.23.0 with torch 2.15 (the versions every value in
`crates/posenc/tests/fixtures/models/*.expected.json` was produced with; the
script refuses another transformers version unless `--any-version`).

For every `NAME.config.json` in the directory (the RoPE-relevant keys of a
published `config.json`, written from the model cards and public copies of the
files: Qwen2-VL-7B-Instruct, Qwen2.5-VL-7B-Instruct, Qwen3-VL-8B-Instruct,
Gemma 3 1B and 4B, Gemma 4 E2B, Llama 4 Scout, SmolLM3-3B, Pixtral 12B; plus
`hunyuan-dense-ntk-alpha`, a config with Hunyuan's NTK-alpha keys) this loads
the config with `AutoConfig` and writes `NAME.expected.json`:

- `layers`: per decoder layer, its layer type, or "nope" where transformers'
  attention does not apply RoPE (Llama 4 / SmolLM3 `no_rope_layers`);
- `layer_types`: for each layer type with RoPE, what the model's own
  `*RotaryEmbedding` module holds (`inv_freq`, `attention_scaling`; the
  per-layer-type buffers `{type}_inv_freq` for Gemma 3/4), its `rope_type`,
  `rotary_dim` and the f64 table cos/sin(position x inv_freq) x attention
  factor at POSITIONS;
- `mrope` (Qwen-VL): the section layout as transformers' own
  `recomposition_frequencies` lays it out (run on float64 angles, so the
  table is exact), the table at the position ids of the sequences below, and
  the position ids and `rope_deltas` of `get_rope_index` (called on the model
  built on the meta device, with `mm_token_type_ids` and grids) for a
  text-image-text prompt and a video prompt;
- `vision`: the encoder's 2-D RoPE: Qwen-VL (`Qwen2VLVisionRotaryEmbedding`
  and `get_vision_position_ids` with the spatial-merge reordering), Pixtral
  (`PixtralVisionRotaryEmbedding`, positions of the model's meshgrid) and
  Llama 4 (`Llama4VisionRotaryEmbedding._compute_freqs_ci`, whose own f32
  angles are captured to read each column's frequency and axis exactly; the
  f64 table is then evaluated from them);
- `temperature` (Llama 4): the NoPE-layer query scale of
  `Llama4TextAttention`, evaluated with the module's float32 expression;
- `softmax_scale` (DeepSeek-V3, from `../checkpoints/deepseek-v3.config.json`):
  `yarn_apply_mscale` of the model file.

Usage (venv with torch + transformers==5.23.0):
    python scripts/rope/gen_model_fixtures.py crates/posenc/tests/fixtures/models
"""

import argparse
import importlib
import json
import re
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
import transformers
from transformers import AutoConfig

PINNED = "5.23.0"
POSITIONS = [0, 1, 2, 7, 100, 1023, 4095, 32767, 131071, 1000000, 10000000]


def dumps(obj):
    """JSON with one line per list of numbers (diff-friendly, compact)."""
    text = json.dumps(obj, indent=1)
    return re.sub(r"\[\s*([-0-9.eE+,\snulNaIfity]*?)\s*\]",
                  lambda m: "[" + ", ".join(x.strip() for x in m.group(1).split(",") if x.strip()) + "]", text)


def load(config_path):
    raw = json.loads(Path(config_path).read_text())
    with tempfile.TemporaryDirectory() as d:
        Path(d, "config.json").write_text(json.dumps(raw))
        return AutoConfig.from_pretrained(d)


def modeling(model_type):
    return importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")


def text_of(config):
    return getattr(config, "text_config", None) or config


def table(inv, af, positions):
    inv64 = np.asarray(inv, dtype=np.float64)
    ang = np.asarray(positions, dtype=np.float64)[:, None] * inv64[None, :]
    return (np.cos(ang) * af).tolist(), (np.sin(ang) * af).tolist()


def layer_entry(rope_type, inv, af, head_dim):
    inv = inv.detach().to(torch.float32)
    cos, sin = table(inv.double().numpy(), float(af), POSITIONS)
    return {
        "rope_type": rope_type,
        "rotary_dim": 2 * inv.numel(),
        "head_dim": head_dim,
        "inv_freq": [float(v) for v in inv.tolist()],
        "attention_factor": float(af),
        "positions": POSITIONS,
        "cos_f64": cos,
        "sin_f64": sin,
    }


# --------------------------------------------------------------------------- text / per layer

def per_layer(config):
    """(layers, layer_types) as the model's own modules see them."""
    tc = text_of(config)
    mt = tc.model_type
    n = tc.num_hidden_layers
    layer_types = list(getattr(tc, "layer_types", None) or ["full_attention"] * n)
    use_rope = [True] * n
    if getattr(tc, "no_rope_layers", None) is not None:
        use_rope = [bool(tc.no_rope_layers[i]) for i in range(n)]  # attention: self.use_rope = no_rope_layers[i]
    layers = [lt if r else "nope" for lt, r in zip(layer_types, use_rope)]

    base = mt.replace("_text", "")
    mod = modeling(base)
    entries = {}
    if base in ("gemma3", "gemma4"):
        cls = {"gemma3": "Gemma3RotaryEmbedding", "gemma4": "Gemma4TextRotaryEmbedding"}[base]
        rope = getattr(mod, cls)(tc)
        for lt in sorted(set(l for l in layers if l != "nope")):
            inv = getattr(rope, f"{lt}_inv_freq")
            af = getattr(rope, f"{lt}_attention_scaling")
            head_dim = tc.per_layer_config[lt].head_dim if base == "gemma4" else tc.head_dim
            entries[lt] = layer_entry(rope.rope_type[lt], inv, af, head_dim)
    else:
        names = [c for c in dir(mod) if c.endswith("RotaryEmbedding") and "Vision" not in c and not c.startswith("_")]
        names.sort(key=len)
        rope = getattr(mod, names[0])(tc)
        head_dim = getattr(tc, "head_dim", None) or tc.hidden_size // tc.num_attention_heads
        for lt in sorted(set(l for l in layers if l != "nope")):
            entries[lt] = layer_entry(rope.rope_type, rope.inv_freq, rope.attention_scaling, head_dim)
    return layers, entries, rope


# --------------------------------------------------------------------------- M-RoPE

def mrope_layout(rope, n_freq):
    """Which axis each output column of recomposition_frequencies takes, from a probe tensor."""
    probe = torch.stack([torch.full((1, 1, n_freq), float(a), dtype=torch.float64) for a in range(3)])
    out = rope.recomposition_frequencies(probe.clone())[0, 0]
    return out


def mrope_table(rope, positions_thw):
    """cos/sin in f64 through the model's own recomposition (pure indexing)."""
    pos = torch.tensor(positions_thw, dtype=torch.float64).T[:, None, :]  # (3, 1, N)
    inv = rope.inv_freq.to(torch.float32).double()
    ang = pos[..., None] * inv  # (3, 1, N, F)
    af = float(rope.attention_scaling)
    cos = rope.recomposition_frequencies(ang.cos() * af)[0]
    sin = rope.recomposition_frequencies(ang.sin() * af)[0]
    return cos, sin


def rope_index(config, segments, video_seconds=None):
    """get_rope_index of the model itself (built on the meta device: no weights)."""
    mt = config.model_type
    mod = modeling(mt)
    cls = [c for c in dir(mod) if c.endswith("Model") and c.lower().replace("_", "") == (mt.replace("_", "") + "model")]
    with torch.device("meta"):
        model = getattr(mod, cls[0])(config)
    m = config.vision_config.spatial_merge_size
    types, images, videos = [], [], []
    for s in segments:
        if s[0] == "text":
            types += [0] * s[1]
        else:
            t, h, w = s[1:4]
            tokens = t * (h // m) * (w // m)
            if s[0] == "image":
                images.append([t, h, w])
                types += [1] * tokens
            else:
                videos.append([t, h, w])
                types += [2] * tokens
    ids = torch.zeros((1, len(types)), dtype=torch.long)
    tt = torch.tensor([types], dtype=torch.int32)
    kwargs = dict(
        input_ids=ids,
        mm_token_type_ids=tt,
        image_grid_thw=torch.tensor(images, dtype=torch.long) if images else None,
        video_grid_thw=torch.tensor(videos, dtype=torch.long) if videos else None,
    )
    if video_seconds is not None:
        kwargs["second_per_grid_ts"] = torch.tensor(video_seconds, dtype=torch.float32)
    pos, delta = model.get_rope_index(**kwargs)
    return pos[:, 0, :].tolist(), int(delta[0, 0])


MROPE_SEQUENCES = {
    "qwen2_vl": [
        ("text-image-text", [["text", 5], ["image", 1, 6, 8], ["text", 4]], None),
        ("video", [["text", 3], ["video", 4, 4, 6], ["text", 2]], None),
    ],
    "qwen2_5_vl": [
        ("text-image-text", [["text", 5], ["image", 1, 6, 8], ["text", 4]], None),
        ("video", [["text", 3], ["video", 4, 4, 6], ["text", 2]], [0.5]),
        ("video-default-seconds", [["text", 2], ["video", 3, 2, 4], ["text", 1]], None),
    ],
    "qwen3_vl": [
        ("text-image-text", [["text", 5], ["image", 1, 6, 8], ["text", 4]], None),
        # Qwen3-VL splits a video into one-frame grids, each after its timestamp text
        ("video", [["text", 3], ["video", 1, 4, 6], ["text", 2], ["video", 1, 4, 6], ["text", 2],
                   ["video", 1, 4, 6], ["text", 1]], None),
    ],
}


def mrope_case(config, rope):
    tc = text_of(config)
    base = config.model_type
    n_freq = rope.inv_freq.numel()
    layout = mrope_layout(rope, n_freq)
    half = layout.numel() // 2
    # one frequency per pair: half-split layouts repeat the block, GLM-4V interleaves
    axes = [int(a) for a in layout[:half].tolist()]
    section = list(tc.rope_parameters.get("mrope_section"))
    sequences = []
    all_pos = []
    for name, segs, seconds in MROPE_SEQUENCES[base]:
        # Qwen3-VL: each frame is its own one-frame grid after its timestamp text
        pos, delta = rope_index(config, segs, seconds)
        segs_json = []
        for s in segs:
            if s[0] == "video":
                segs_json.append(s + [seconds[0] if seconds else None])
            else:
                segs_json.append(s)
        sequences.append({"name": name, "segments": segs_json, "position_ids": pos, "rope_delta": delta})
        all_pos += list(map(list, zip(*pos)))
    positions_thw = all_pos + [[1000000, 3, 5], [4095, 4095, 0], [10000000, 10000000, 10000000]]
    cos, sin = mrope_table(rope, positions_thw)
    return {
        "section": section,
        "interleaved": base == "qwen3_vl",
        "axes": axes,
        "sequences": sequences,
        "positions_thw": positions_thw,
        "cos_f64": cos[:, :half].tolist(),
        "sin_f64": sin[:, :half].tolist(),
    }


# --------------------------------------------------------------------------- vision

def vision_qwen(config):
    vc = config.vision_config
    mod = modeling(config.model_type)
    rope = mod.Qwen2VLVisionRotaryEmbedding(vc) if hasattr(mod, "Qwen2VLVisionRotaryEmbedding") else None
    if rope is None:
        name = [c for c in dir(mod) if c.endswith("VisionRotaryEmbedding")][0]
        rope = getattr(mod, name)(vc)
    from transformers.vision_utils import get_vision_position_ids

    grid = [2, 4, 6]
    m = vc.spatial_merge_size
    pos = get_vision_position_ids(torch.tensor([grid]), m)  # (N, 2)
    inv = rope.inv_freq.to(torch.float32)
    ang = pos.double()[..., None] * inv.double()  # (N, 2, F)
    cos = rope.recomposition_frequencies(ang.cos())
    sin = rope.recomposition_frequencies(ang.sin())
    half = cos.shape[-1] // 2
    probe = torch.stack([torch.zeros(inv.numel(), dtype=torch.float64), torch.ones(inv.numel(), dtype=torch.float64)])[None]
    axes = rope.recomposition_frequencies(probe)[0, :half]
    freq = rope.recomposition_frequencies(inv.double()[None, None, :].expand(1, 2, -1).clone())[0, :half]
    head_dim = vc.embed_dim // vc.num_heads if hasattr(vc, "embed_dim") and vc.model_type == "qwen2_vl_vision" else vc.hidden_size // vc.num_heads
    return {
        "kind": "qwen-vl",
        "head_dim": head_dim,
        "rope_theta": float(vc.rope_parameters["rope_theta"]),
        "grid_thw": grid,
        "spatial_merge_size": m,
        "inv_freq": [float(v) for v in freq.tolist()],
        "axes": [int(a) for a in axes.tolist()],
        "positions": pos.tolist(),
        "cos_f64": cos[:, :half].tolist(),
        "sin_f64": sin[:, :half].tolist(),
    }


def vision_pixtral(config):
    vc = config.vision_config
    mod = modeling("pixtral")
    rope = mod.PixtralVisionRotaryEmbedding(vc)
    h, w = 3, 5
    # PixtralVisionModel.forward: meshgrid(arange(h), arange(w), indexing="ij")
    hh, ww = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    pos = torch.stack([hh.flatten(), ww.flatten()], dim=-1)
    inv = rope.inv_freq.to(torch.float32)
    ang = pos.double()[..., None] * inv.double()
    cos = rope.recomposition_frequencies(ang.cos())
    sin = rope.recomposition_frequencies(ang.sin())
    half = cos.shape[-1] // 2
    probe = torch.stack([torch.zeros(inv.numel(), dtype=torch.float64), torch.ones(inv.numel(), dtype=torch.float64)])[None]
    axes = rope.recomposition_frequencies(probe)[0, :half]
    freq = rope.recomposition_frequencies(inv.double()[None, None, :].expand(1, 2, -1).clone())[0, :half]
    return {
        "kind": "pixtral",
        "head_dim": vc.head_dim,
        "rope_theta": float(vc.rope_parameters["rope_theta"]),
        "grid_hw": [h, w],
        "inv_freq": [float(v) for v in freq.tolist()],
        "axes": [int(a) for a in axes.tolist()],
        "positions": pos.tolist(),
        "cos_f64": cos[:, :half].tolist(),
        "sin_f64": sin[:, :half].tolist(),
    }


def vision_llama4(config):
    vc = config.vision_config
    mod = modeling("llama4")
    captured = []
    orig_cos = torch.cos

    def cos_hook(t, *a, **k):
        captured.append(t.detach().clone())
        return orig_cos(t, *a, **k)

    torch.cos = cos_hook
    try:
        freq_ci = mod.Llama4VisionRotaryEmbedding._compute_freqs_ci(vc)
    finally:
        torch.cos = orig_cos
    ang = captured[0][:, 0, :]  # (idx^2 + 1, F) float32 angles of the model, class token masked to 0
    side = vc.image_size // vc.patch_size
    f = ang[0]  # patch 0 is at (x + 1, y + 1) = (1, 1): the angle is the frequency itself
    axes = [0 if ang[1, j] != f[j] else 1 for j in range(f.numel())]  # patch 1 moved along x only
    n = side * side
    positions = [[i % side + 1, i // side + 1] for i in range(n)] + [[0, 0]]
    p = np.asarray(positions, dtype=np.float64)
    inv64 = f.double().numpy()
    a64 = p[:, axes] * inv64[None, :]
    keep = list(range(0, 30)) + [side * side // 2, side * side - 1, side * side]
    # the model's own f32 angles agree with the exact ones
    assert np.max(np.abs(ang.double().numpy() - a64)) < 1e-5
    assert np.max(np.abs(freq_ci.real.double().numpy()[:, 0, :] - np.cos(a64))) < 2e-5
    head_dim = vc.hidden_size // vc.num_attention_heads
    return {
        "kind": "llama4",
        "head_dim": head_dim,
        "rope_theta": float(vc.rope_parameters["rope_theta"]),
        "patches_per_side": side,
        "inv_freq": [float(v) for v in f.tolist()],
        "axes": axes,
        "token_indices": keep,
        "positions": [positions[i] for i in keep],
        "cos_f64": np.cos(a64[keep]).tolist(),
        "sin_f64": np.sin(a64[keep]).tolist(),
    }


# --------------------------------------------------------------------------- Llama 4 temperature

def temperature(tc):
    # Llama4TextAttention.forward, for NoPE layers
    positions = torch.tensor([0, 1, 8190, 8191, 8192, 16383, 16384, 100000, 1000000, 10000000])
    scales = torch.log1p(torch.floor((positions.float() + 1.0) / tc.floor_scale)) * tc.attn_scale + 1.0
    return {
        "floor_scale": float(tc.floor_scale),
        "attn_scale": float(tc.attn_scale),
        "positions": positions.tolist(),
        "scales_f32": [float(v) for v in scales.tolist()],
        "attention_chunk_size": tc.attention_chunk_size,
    }


def softmax_scale(directory):
    cfg_path = Path(directory).parent / "checkpoints" / "deepseek-v3.config.json"
    config = load(cfg_path)
    mod = modeling("deepseek_v3")
    qk = config.qk_nope_head_dim + config.qk_rope_head_dim
    s = mod.yarn_apply_mscale(config.rope_parameters, qk ** (-0.5))
    return {"name": "deepseek-v3", "config": "../checkpoints/deepseek-v3.config.json", "qk_head_dim": qk,
            "softmax_scale": s, "softmax_scale_factor": s / qk ** (-0.5)}


def generate(directory):
    for cfg in sorted(Path(directory).glob("*.config.json")):
        name = cfg.name[: -len(".config.json")]
        config = load(cfg)
        out = {"name": name, "transformers": transformers.__version__}
        if config.model_type == "llava":
            out["vision"] = vision_pixtral(config)
        else:
            layers, entries, rope = per_layer(config)
            out["layers"] = layers
            out["layer_types"] = entries
            if config.model_type in MROPE_SEQUENCES:
                out["mrope"] = mrope_case(config, rope)
                out["vision"] = vision_qwen(config)
            if config.model_type == "llama4":
                out["temperature"] = temperature(text_of(config))
                out["vision"] = vision_llama4(config)
        Path(directory, f"{name}.expected.json").write_text(dumps(out) + "\n")
        print(name, {k: (v["rope_type"], v["rotary_dim"]) for k, v in out.get("layer_types", {}).items()},
              "nope layers:", out.get("layers", []).count("nope"))
    ss = softmax_scale(directory)
    Path(directory, "deepseek-v3.softmax-scale.json").write_text(dumps(ss) + "\n")
    print("deepseek-v3 softmax scale", ss["softmax_scale"])


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("directory")
    ap.add_argument("--any-version", action="store_true")
    a = ap.parse_args()
    if transformers.__version__ != PINNED and not a.any_version:
        sys.exit(f"transformers {transformers.__version__} is not the pinned {PINNED}")
    generate(a.directory)
