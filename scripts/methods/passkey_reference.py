#!/usr/bin/env python3
"""Greedy passkey answers from transformers on SmolLM2-135M, for `posenc passkey`'s parity test.

Writes `crates/posenc-models/tests/fixtures/methods/passkey-greedy.json`.

The prompt is the landmark-attention passkey prompt exactly as published
(epfml/landmark-attention `llama/run_test.py` `generate_prompt`, copied
verbatim into jquesnelle/yarn `eval/passkey.py`):

    lines = [
        "There is an important info hidden inside a lot of irrelevant text. Find it and memorize them. I will quiz you about the important information there.",
        garbage_inf[:n_prefix],
        f"The pass key is {K}. Remember it. {K} is the pass key.",
        garbage_inf[:n_garbage - n_prefix],
        "What is the pass key? The pass key is",
    ]
    prompt = "\\n".join(lines)

with `garbage_inf = " ".join([FILLER] * 10000)` and FILLER = "The grass is
green. The sky is blue. The sun is yellow. Here we go. There and back again."
Note that the published code measures the haystack in CHARACTERS, not in
filler repetitions: `n_garbage` characters of the endless filler (so the cut
can fall inside a sentence or a word), split into a prefix of `n_prefix`
characters and a suffix of `n_garbage - n_prefix` characters, BOTH taken from
the start of `garbage_inf` (the suffix is `garbage_inf[:n_suffix]`, not the
continuation of the prefix).

Choices made here (the published code draws the split and the key at random):

- depth d in [0, 1]: `n_prefix = floor(d * n_garbage)` (the published code
  draws `n_prefix = random.randint(0, n_garbage)`);
- target length T tokens: YaRN's `eval/passkey.py` search, with its default
  `--length-step 128`: starting from n = 0, repeat `last_n = n; n += 128;
  tokens = len(encode(prompt(n)))` while `tokens < T`; `n_garbage = last_n`,
  i.e. the largest multiple of 128 characters whose prompt is shorter than T
  tokens (so a 2,048 target gives a prompt a few dozen tokens short of 2,048).
  Here the prompt measured is this trial's own (its depth and key), so the
  search is deterministic;
- tokenization: the GGUF's tokenizer through transformers with its default
  special-token handling, which for SmolLM2 adds no BOS (the pipeline in the
  published code tokenizes the same way); the ids counted and fed are
  exactly `tok(prompt)["input_ids"]`;
- generation: `model.generate(ids, do_sample=False, max_new_tokens=10)` with
  the model's generation config (EOS id 2 stops early, pad id 2), KV cache on,
  sdpa attention, float32, CPU, 2 threads: the same greedy decode as
  `pipeline("text-generation")(prompt, max_new_tokens=10)` in the published
  code. The answer read = the first integer in the decoded new text
  (`re.search(r"\\d+", text)`), as YaRN's `test_model` reads it;
- scalings: "none" (the GGUF's default RoPE, theta 1e5) and "yarn:2"
  (transformers' rope_parameters {"rope_type": "yarn", "factor": 2,
  "original_max_position_embeddings": 8192, "beta_fast": 32, "beta_slow": 1,
  "rope_theta": 1e5}, max_position_embeddings 16384), installed exactly as
  `scripts/models/gguf_reference.py` installs them (the rotary module rebuilt
  from a config copy);
- keys 17253 and 42931 (fixed), depth 0.5, targets 2,048 and 16,384 tokens.

Every run is appended to the JSON as soon as it finishes (the 16k runs take
several minutes each on 2 cores).

Command (from the repository root; needs /work/venv with torch, transformers,
gguf, accelerate; `bash scripts/get-model.sh` fetches the model):
    HF_HUB_OFFLINE=1 nohup /work/venv/bin/python scripts/methods/passkey_reference.py \\
        > /tmp/passkey.log 2>&1 &
Options: --gguf PATH, --lengths 2048,16384, --keys 17253,42931, --depth 0.5,
--scalings none,yarn:2, --out PATH, --threads 2.
"""

import argparse
import copy
import json
import math
import os
import re
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch
import transformers

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts" / "models"))
from gguf_reference import install_scaling, scaling_rope_parameters, trained_length  # noqa: E402

DEFAULT_GGUF = REPO / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
OUT = REPO / "crates" / "posenc-models" / "tests" / "fixtures" / "methods" / "passkey-greedy.json"

TASK = (
    "There is an important info hidden inside a lot of irrelevant text. Find it and memorize them. "
    "I will quiz you about the important information there."
)
FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
GARBAGE_INF = " ".join([FILLER] * 10000)
QUESTION = "What is the pass key? The pass key is"
LENGTH_STEP = 128


def needle(key):
    return f"The pass key is {key}. Remember it. {key} is the pass key."


def prefix_chars(n_garbage, depth):
    return int(math.floor(depth * n_garbage))


def build_prompt(n_garbage, depth, key):
    n_prefix = prefix_chars(n_garbage, depth)
    assert 0 <= n_prefix <= n_garbage <= len(GARBAGE_INF)
    lines = [TASK, GARBAGE_INF[:n_prefix], needle(key), GARBAGE_INF[: n_garbage - n_prefix], QUESTION]
    return "\n".join(lines)


def choose_n_garbage(tok, target, depth, key):
    """YaRN eval/passkey.py's search: the last n (step 128 chars) before the prompt reaches `target` tokens."""
    n, last_n, num_tokens = 0, 0, 0
    while num_tokens < target:
        last_n = n
        n += LENGTH_STEP
        num_tokens = len(tok(build_prompt(n, depth, key))["input_ids"])
    return last_n


def first_int(text):
    m = re.search(r"\d+", text)
    return int(m.group()) if m else None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", default=str(DEFAULT_GGUF))
    ap.add_argument("--lengths", default="2048,16384")
    ap.add_argument("--keys", default="17253,42931")
    ap.add_argument("--depth", type=float, default=0.5)
    ap.add_argument("--scalings", default="none,yarn:2")
    ap.add_argument("--new-tokens", type=int, default=10)
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from transformers import AutoModelForCausalLM, AutoTokenizer

    d, name = os.path.split(os.path.abspath(args.gguf))
    tok = AutoTokenizer.from_pretrained(d, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=name, dtype=torch.float32).eval()
    base = copy.deepcopy(model.config)
    L = trained_length(base)
    lengths = [int(x) for x in args.lengths.split(",")]
    keys = [int(x) for x in args.keys.split(",")]
    scalings = args.scalings.split(",")

    out = {
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "model": f"{name} (transformers GGUF loader, float32, sdpa attention, CPU, {args.threads} threads)",
        "recipe": {
            "source": "epfml/landmark-attention llama/run_test.py generate_prompt, as copied in jquesnelle/yarn eval/passkey.py",
            "task_description": TASK,
            "filler": FILLER,
            "garbage_inf": 'the filler joined with " " 10000 times; haystack pieces are character slices of it',
            "needle": "The pass key is {K}. Remember it. {K} is the pass key.",
            "question": QUESTION,
            "prompt": '"\\n".join([task_description, garbage_inf[:n_prefix], needle, garbage_inf[:n_garbage - n_prefix], question])',
            "n_prefix": "floor(depth * n_garbage) characters (published code: random.randint(0, n_garbage))",
            "n_garbage": "YaRN's search, length step 128 characters: n = 0; repeat {last_n = n; n += 128; t = token count of prompt(n)} while t < target; n_garbage = last_n (prompt measured with this trial's depth and key)",
            "tokenization": "tok(prompt)['input_ids'] with the GGUF tokenizer's defaults: no BOS for SmolLM2",
            "generation": f"model.generate(ids, do_sample=False, max_new_tokens={args.new_tokens}), generation config eos 2 / pad 2 (stops early at EOS), KV cache",
            "answer": "first integer in tok.decode(new_ids) (re.search(r'\\d+')), as YaRN's test_model",
        },
        "notes": {
            "seconds": "wall time of generate on 2 CPU cores shared with other jobs: not a benchmark",
            "margins": "the gap between the best and second-best logit of each greedy step is not recorded; an implementation that differs in float32 rounding may legitimately pick another token where that gap is tiny (a degenerate continuation such as ' the is is ...' is the likely place)"
        },
        "L": L,
        "scalings": {s: {"rope_parameters": scaling_rope_parameters(s, base, L)[0],
                         "max_position_embeddings": scaling_rope_parameters(s, base, L)[1] or base.max_position_embeddings}
                     for s in scalings},
        "runs": [],
    }

    # prompts first (cheap), so that every scaling sees the same ones
    prompts = []
    for T in lengths:
        for key in keys:
            n_garbage = choose_n_garbage(tok, T, args.depth, key)
            prompt = build_prompt(n_garbage, args.depth, key)
            assert f"The pass key is {key}" in prompt
            ids = tok(prompt)["input_ids"]
            prompts.append((T, key, n_garbage, prompt, ids))
            print(f"target {T} key {key}: n_garbage {n_garbage} chars, {len(ids)} tokens", flush=True)

    for T, key, n_garbage, prompt, ids in prompts:
        for scaling in scalings:
            install_scaling(model, scaling, L, base)
            x = torch.as_tensor([ids], dtype=torch.long)
            t0 = time.time()
            with torch.no_grad():
                gen = model.generate(
                    x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=args.new_tokens
                )[0, len(ids):].tolist()
            dt = time.time() - t0
            text = tok.decode(gen)
            read = first_int(text)
            run = {
                "scaling": scaling,
                "target_tokens": T,
                "depth": args.depth,
                "key": key,
                "n_garbage_chars": n_garbage,
                "n_prefix_chars": prefix_chars(n_garbage, args.depth),
                "prompt_chars": len(prompt),
                "prompt_tokens": len(ids),
                "prompt_first_ids": ids[:8],
                "prompt_last_ids": ids[-12:],
                "generated_ids": gen,
                "generated_text": text,
                "read": read,
                "correct": read == key,
                "seconds": round(dt, 1),
            }
            out["runs"].append(run)
            print(f"{scaling:7s} T {T} ({len(ids)} tok) key {key}: {text!r} -> {read} ({dt:.0f} s)", flush=True)
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            with open(args.out, "w", encoding="utf-8") as f:
                json.dump(out, f, indent=1, ensure_ascii=False)
                f.write("\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    sys.exit(main())
