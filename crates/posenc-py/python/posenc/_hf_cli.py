"""``python -m posenc.hf``: posenc's probes on a transformers model from a shell.

    python -m posenc.hf passkey --model DIR_OR_HUB_NAME [--gguf-file F] \\
        --lengths 2048,4096 --depths 0,0.5,1 --trials 2 --methods none,self-extend:4:1024 [--json]
    python -m posenc.hf perplexity --model DIR_OR_HUB_NAME [--gguf-file F] \\
        --text FILE --length 4096 --methods none,yarn:2 [--band 1024] [--json]

``--model`` may also name a ``.gguf`` file (its folder and name are then
``from_pretrained``'s directory and ``gguf_file``). ``--json`` prints the
dict ``posenc.hf.passkey`` / ``posenc.hf.perplexity`` return (the shape of
``posenc passkey --json`` / ``posenc perplexity --json``); without it, a
table. Every error is one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
from typing import List, Optional

PROG = "python -m posenc.hf"


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        sys.exit(2)


def _numbers(kind, flag):
    def parse(s: str):
        out = []
        for p in s.split(","):
            if not p.strip():
                continue
            try:
                out.append(kind(p.strip()))
            except ValueError:
                raise argparse.ArgumentTypeError(f"{p.strip()!r} is not a number") from None
        if not out:
            raise argparse.ArgumentTypeError("give at least one value")
        return out

    parse.__name__ = flag
    return parse


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description="posenc's probes on a Hugging Face transformers model.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def common(q):
        q.add_argument("--model", required=True, help="a checkpoint directory, a Hub name, or a .gguf file")
        q.add_argument("--gguf-file", help="the GGUF file inside --model (transformers' gguf_file=)")
        q.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
        q.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, mps ... (default cpu)")
        q.add_argument("--backend", choices=["fused", "torch"], help="force posenc's fused or PyTorch path")
        q.add_argument("--json", action="store_true", help="print the result as JSON")
        q.add_argument("--quiet", action="store_true", help="no progress bar")

    k = sub.add_parser("passkey", help="passkey / needle retrieval over length x depth")
    common(k)
    k.add_argument("--lengths", type=_numbers(int, "--lengths"), default=[2048, 4096, 8192, 12288, 16384])
    k.add_argument("--depths", type=_numbers(float, "--depths"), default=[0.0, 0.25, 0.5, 0.75, 1.0])
    k.add_argument("--trials", type=int, default=2)
    k.add_argument("--methods", default="none,yarn:2", help="comma-separated scaling and method names")
    k.add_argument("--haystack", type=pathlib.Path, help="a UTF-8 text for RULER's needle (default: landmark)")
    k.add_argument("--seed", type=int, default=0)

    q = sub.add_parser("perplexity", help="loss per band for each scaling or method")
    common(q)
    q.add_argument("--text", type=pathlib.Path, required=True, help="the UTF-8 text to score (tokenized whole)")
    q.add_argument("--length", type=int, help="window in tokens (default: twice the trained length)")
    q.add_argument("--methods", default="none,linear:2,dynamic:2,ntk:2,yarn:2")
    q.add_argument("--band", type=int, default=1024)
    q.add_argument("--per-position", action="store_true")
    return p


def _load(a):
    import torch
    import transformers

    name, gguf = a.model, a.gguf_file
    path = pathlib.Path(name)
    if gguf is None and path.suffix == ".gguf":  # there: _check_early
        name, gguf = str(path.parent), path.name
    kw = {"gguf_file": gguf} if gguf else {}
    transformers.logging.set_verbosity_error()
    # Errors are one line on stderr: no loading bars before them.
    transformers.utils.logging.disable_progress_bar()
    tok = transformers.AutoTokenizer.from_pretrained(name, **kw)
    model = transformers.AutoModelForCausalLM.from_pretrained(name, dtype=getattr(torch, a.dtype), **kw)
    return model.to(a.device).eval(), tok


def _passkey_table(r) -> str:
    lines = []
    for name, m in r["methods"].items():
        lines.append(f"{name}: greedy exact match (mean log-probability of the answer)")
        lines.append("length  " + "  ".join(f"depth {d}" for d in r["depths"]))
        for length in r["lengths"]:
            acc, lp = m["accuracy"].get(str(length), {}), m["logprob"].get(str(length), {})
            cells = []
            for d in r["depths"]:
                key = next((k for k in acc if float(k) == float(d)), None)
                cells.append("-" if key is None else f"{acc[key]:.2f} ({lp[key]:.2f})")
            lines.append(f"{length}  " + "  ".join(cells))
        lines.append("")
    return "\n".join(lines)


def _perplexity_table(r) -> str:
    lines = ["method  " + "  ".join(next(iter(r["scalings"].values()))["bands"].keys())]
    for name, s in r["scalings"].items():
        lines.append(f"{name}  " + "  ".join("-" if v is None else f"{v:.4f}" for v in s["bands"].values()))
    return "\n".join(lines)


def _check_early(a) -> None:
    """What can be refused before torch and transformers are imported
    (seconds) and the model is read: the grid and the names of a passkey
    run (as ``posenc passkey`` checks them), a ``.gguf`` file that is not
    there."""
    from ._posenc import PasskeyProbe

    path = pathlib.Path(a.model)
    if a.gguf_file is None and path.suffix == ".gguf" and not path.is_file():
        raise FileNotFoundError(f"--model {a.model}: no such file")
    if a.command == "passkey":
        PasskeyProbe.check(a.lengths, a.depths, a.trials, a.methods.split(","))


def main(argv: Optional[List[str]] = None) -> int:
    a = _parser().parse_args(argv)
    try:
        from ._posenc import PosencError
    except ImportError as e:  # pragma: no cover - depends on the install
        sys.stderr.write(f"{PROG}: error: {e}\n")
        return 2
    try:
        _check_early(a)
        from . import hf

        for name in a.methods.split(","):  # refused before the model is read
            hf._split(name)
        model, tok = _load(a)
        progress = False if a.quiet or (a.json and not sys.stderr.isatty()) else None
        if a.command == "passkey":
            r = hf.passkey(
                model, tok, a.lengths, a.depths, a.trials, a.methods, haystack=a.haystack, seed=a.seed,
                backend=a.backend, progress=progress,
            )
            text = json.dumps(r, indent=2) if a.json else _passkey_table(r)
        else:
            r = hf.perplexity(
                model, tok, a.text, a.length, a.methods, band=a.band, per_position=a.per_position, backend=a.backend,
            )
            text = json.dumps(r, indent=2) if a.json else _perplexity_table(r)
    except ImportError as e:  # pragma: no cover - depends on the install
        sys.stderr.write(f"{PROG}: error: {e}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write(f"{PROG}: interrupted\n")
        return 130
    except (PosencError, OSError, ValueError, RuntimeError) as e:
        msg = " ".join(str(e).split()) or type(e).__name__
        sys.stderr.write(f"{PROG}: error: {msg}\n")
        return 2
    print(text)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
