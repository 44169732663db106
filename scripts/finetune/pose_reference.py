#!/usr/bin/env python3
"""PoSE's position ids as the authors' training script draws them, for `posenc-tune`'s tests.

Zhu et al. 2024, "PoSE: Efficient Context Window Extension of LLMs via
Positional Skip-wise Training". `pose_chunk` below is the body of
`train_preprocess_function_pose` in `src/train_pose.py` of
github.com/dwzhu-pku/PoSE (commit a3d4ba8), copied verbatim for one
document: only the tokenizer call (`tokenizer(inputs, ..., max_length=
model_max_position_embeddings*5)`) is left out, since the document arrives
as ids, and `torch.arange` is replaced by a list (same values). The draws
come from Python's global `random` module, as in their script.

`posenc_windows` draws one training step's windows as `posenc_tune::data`
does: `random.seed(step_seed(seed, step))` (`batch_seed` of posenc-lab,
SplitMix64, ported below), then for each window a document of
`d = min(5*L, n)` tokens at `start = random.randint(0, n - d)` of the
training tokens, then the authors' function on that document.

Writes `crates/posenc-tune/tests/fixtures/pose-reference.json`:

    {"python": version, "source": "dwzhu-pku/PoSE@a3d4ba8 src/train_pose.py",
     "chunks": [{"seed", "doc_len", "window", "target",
                 "draws": [{"input_ids": [...], "position_ids": [...]}, ...]}],
     "windows": [{"seed", "train_len", "window", "target", "step", "batch",
                  "windows": [{"start", "input_ids", "position_ids"}]}]}

`chunks`: `random.seed(seed)`, then the authors' function on the document
`list(range(doc_len))` (ids = offsets), several times in a row.
`windows`: the training tokens are `list(range(train_len))`.

Usage (the tests read the stored file; this is never run by CI):
    python3 scripts/finetune/pose_reference.py
"""

import json
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "crates/posenc-tune/tests/fixtures/pose-reference.json"

MASK = (1 << 64) - 1


def pose_chunk(ids, scaled_max_position_embeddings, model_max_position_embeddings):
    """The authors' loop body for one document `ids` (verbatim but for the
    tokenizer and torch): returns (chunked_ids, pos_ids)."""
    len_chunk = min(len(ids), model_max_position_embeddings)
    len_input = len(ids)
    lt1 = 0
    rt1 = random.randint(1, (len_chunk+1)//2)
    rt2 = random.randint(lt1+len_chunk, len_input)
    lt2 = rt2 - (len_chunk - (rt1-lt1))
    chunked_ids = ids[lt1:rt1] + ids[lt2:rt2]

    pos_ids = list(range(len(chunked_ids)))  # torch.arange(len(chunked_ids))
    len_pos_ids = len(pos_ids)
    # lt = random.randint(0, scaled_max_position_embeddings-len_pos_ids)
    lt = 0 # this revision makes the coverage possiblity more uniform for large relative positions
    rt = random.randint(lt, scaled_max_position_embeddings-len_pos_ids)

    # pos_ids[:rt1-lt1] += lt ; pos_ids[rt1-lt1:] += rt
    pos_ids = [p + lt for p in pos_ids[:rt1-lt1]] + [p + rt for p in pos_ids[rt1-lt1:]]
    return chunked_ids, pos_ids


def splitmix64(state):
    state = (state + 0x9E3779B97F4A7C15) & MASK
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return state, z ^ (z >> 31)


def batch_seed(seed, step, stream):
    """posenc_lab::checkpoint::batch_seed."""
    _, first = splitmix64((seed ^ ((stream * 0xA0761D6478BD642F) & MASK)) & MASK)
    return first ^ ((step * 0xE7037ED1A0B428DB) & MASK)


WINDOW_STREAM = 27  # posenc_tune::data::WINDOW_STREAM


def posenc_windows(train_len, window, target, seed, step, batch):
    """posenc_tune::data::Windows::step for PoSE windows."""
    train = list(range(train_len))
    random.seed(batch_seed(seed, step, WINDOW_STREAM))
    d = min(5 * window, train_len)
    out = []
    for _ in range(batch):
        start = random.randint(0, train_len - d)
        doc = train[start:start + d]
        ids, pos = pose_chunk(doc, target, window)
        out.append({"start": start, "input_ids": ids, "position_ids": pos})
    return out


def main():
    chunks = []
    for seed, doc_len, window, target in [
        (0, 40, 8, 64),
        (27, 1280, 256, 16384),
        ((1 << 40) + 7, 500, 100, 1 << 22),
        (3, 7, 7, 9),
        (12345, 100, 3, 1000),
    ]:
        random.seed(seed)
        draws = []
        for _ in range(4):
            ids, pos = pose_chunk(list(range(doc_len)), target, window)
            draws.append({"input_ids": ids, "position_ids": pos})
        chunks.append({"seed": seed, "doc_len": doc_len, "window": window,
                       "target": target, "draws": draws})
    windows = []
    for seed, train_len, window, target, step, batch in [
        (0, 900, 16, 128, 0, 3),
        (0, 900, 16, 128, 41, 2),
        (7, 900, 200, 400, 5, 2),
        (2**63 + 5, 5000, 64, 4096, 1000, 2),
    ]:
        windows.append({"seed": seed, "train_len": train_len, "window": window,
                        "target": target, "step": step, "batch": batch,
                        "windows": posenc_windows(train_len, window, target, seed, step, batch)})
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({
        "python": sys.version.split()[0],
        "source": "dwzhu-pku/PoSE@a3d4ba8 src/train_pose.py train_preprocess_function_pose",
        "chunks": chunks,
        "windows": windows,
    }) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
