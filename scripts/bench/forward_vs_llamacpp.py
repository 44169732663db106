"""llama.cpp's prompt processing on the same GGUF, for the README's speed table.

Runs llama.cpp through the PyPI package llama-cpp-python (which compiles
llama.cpp from source at install: `CMAKE_ARGS="-DGGML_NATIVE=ON" pip install
llama-cpp-python`), with THREADS threads for the batch, over the first T
tokens of the text tokenized by llama.cpp's own tokenizer, and reports tokens
per second of `Llama.eval` (prompt processing, batches of 512). Not the same
work as posenc's `perplexity`: llama.cpp multiplies the Q4_1 weights in their
quantized form and computes logits for the last position only, where posenc
dequantizes to float32 and computes the loss at every position. Peak RSS of
the child is reported as in forward_vs_transformers.py.

Usage:
    python scripts/bench/forward_vs_llamacpp.py --model GGUF --text TEXT \
        [--lengths 4096,16384] [--threads 2]
"""

import argparse
import json
import os
import subprocess
import sys
import time


def worker(args):
    from llama_cpp import Llama

    T = args.length
    llm = Llama(
        model_path=args.model,
        n_ctx=T,
        n_batch=512,
        n_ubatch=512,
        n_threads=args.threads,
        n_threads_batch=args.threads,
        logits_all=False,
        verbose=False,
    )
    text = open(args.text, encoding="utf-8").read()
    ids = llm.tokenize(text.encode("utf-8"), add_bos=False, special=False)[:T]
    if len(ids) < T:
        sys.exit(f"the text has {len(ids)} tokens, fewer than {T}")
    t0 = time.perf_counter()
    llm.eval(ids)
    secs = time.perf_counter() - t0
    print(json.dumps({"T": T, "seconds": secs, "tokens_per_second": T / secs}))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--text", required=True)
    ap.add_argument("--lengths", default="4096,16384")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--length", type=int)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    for T in [int(x) for x in args.lengths.split(",")]:
        cmd = [sys.executable, __file__, "--worker", "--model", args.model, "--text", args.text,
               "--length", str(T), "--threads", str(args.threads)]
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE)
        out = p.stdout.read()
        _, status, ru = os.wait4(p.pid, 0)
        p.returncode = 0
        if status != 0:
            sys.exit(f"llama.cpp worker failed at T={T}")
        res = json.loads(out.decode().strip().splitlines()[-1])
        print(f"T={T} llama.cpp {res['tokens_per_second']:.1f} tok/s ({res['seconds']:.1f} s), "
              f"peak RSS {ru.ru_maxrss / 1024:.0f} MB")


if __name__ == "__main__":
    main()
