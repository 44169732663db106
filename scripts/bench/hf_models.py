#!/usr/bin/env python3
"""posenc.hf on SmolLM2-135M (transformers, from the project's GGUF, float32)
beside transformers' own unpatched ``sdpa`` model, on CPU.

Two measurements (docs/speed.md, "posenc.hf beside transformers"):

- ``memory``: the peak resident memory of one forward over ``--mem-length``
  tokens (16,384), each configuration in a fresh subprocess: the model
  loaded, the kernel's peak counter reset (``/proc/self/clear_refs`` ``5``,
  so that loading's own peak is forgotten), the resident set read as the
  baseline, one forward, the peak (``VmHWM``) minus the baseline. Configurations: ``sdpa`` (unpatched),
  ``self-extend:4:1024`` on the forced PyTorch path (``backend="torch"``)
  and on the fused path.
- ``speed``: forward seconds at ``--lengths`` (4,096 and 16,384), 2 threads
  (``torch.set_num_threads(2)``, ``RAYON_NUM_THREADS=2``), one process, an
  untimed ``--warmup``-token forward of each configuration first, then the
  configurations alternated inside each round (``--rounds``), median of
  the rounds: unpatched ``sdpa``; posenc's fused path with
  ``self-extend:4:1024``; posenc's fused path with no change to the logits
  (``self-extend:2:65536``: a window covering the input, every pair at its
  true position, the method's work done in posenc's kernels). With
  ``--attention-time``, also the seconds inside each layer's attention
  function (transformers' ``sdpa`` function, or the one posenc.hf
  registered: the inverse rotation and the fused pass) per layer: the part
  of the forward that differs between the configurations, with less of the
  round-to-round spread of the whole forward.

Every forward is ``model(ids, logits_to_keep=1)``: the whole prompt through
every layer and the last position's logits (a prefill), so that the
``T × vocabulary`` logits (3.2 GB at 16,384 tokens, the same for every
configuration) neither dominate the memory nor the time.

A third, ``attention-memory``, measures one attention call alone at
SmolLM2's shapes on random inputs, each length and path in a fresh process
(the peak resident memory over the inputs): posenc.hf's method attention on
the PyTorch path and the fused path, and PyTorch's causal ``sdpa``.

    python scripts/bench/hf_models.py memory
    python scripts/bench/hf_models.py speed --rounds 3
    python scripts/bench/hf_models.py attention-memory --lengths 2048,4096,8192
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
GGUF = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
TEXT = ROOT / "assets" / "corpus" / "pride-and-prejudice.txt"
COVER = "self-extend:2:65536"


os.environ.setdefault("TQDM_DISABLE", "1")  # no GGUF dequantization bar in the output


def setup_threads(n: int) -> None:
    os.environ["RAYON_NUM_THREADS"] = str(n)
    os.environ["OMP_NUM_THREADS"] = str(n)
    import torch

    torch.set_num_threads(n)


def load(path: pathlib.Path):
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    if path.suffix == ".gguf":
        model = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
        tok = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    else:
        model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        tok = transformers.AutoTokenizer.from_pretrained(path)
    model.set_attn_implementation("sdpa")
    return model.eval(), tok


def tokens(tok, n: int):
    import torch

    ids = tok(TEXT.read_text(encoding="utf-8"))["input_ids"]
    while len(ids) < n:  # the book has about 160k tokens; repeat it for longer windows
        ids = ids + ids
    return torch.tensor([ids[:n]])


def configure(model, name: str):
    import posenc.hf as ph

    if name == "sdpa":
        return
    method, _, backend = name.partition("@")
    ph.apply(model, method, backend=backend or None)


def unconfigure(model, name: str):
    import posenc.hf as ph

    if name != "sdpa":
        ph.remove(model)


def time_attention(model, sink: list):
    """Wraps the attention function the model's layers call (transformers'
    registry entry for the model's implementation: ``sdpa``, or the one
    posenc.hf registered) so that each call's seconds add to ``sink[0]``;
    returns the function that unwraps it."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    key = model.config._attn_implementation
    local = ALL_ATTENTION_FUNCTIONS._local_mapping
    had = local.get(key)
    inner = ALL_ATTENTION_FUNCTIONS[key]

    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            sink[0] += time.perf_counter() - t0

    ALL_ATTENTION_FUNCTIONS[key] = timed

    def undo():
        if had is None:
            del ALL_ATTENTION_FUNCTIONS[key]
        else:
            ALL_ATTENTION_FUNCTIONS[key] = had

    return undo


def forward(model, ids) -> float:
    import torch

    t0 = time.perf_counter()
    with torch.no_grad():
        model(ids, logits_to_keep=1)
    return time.perf_counter() - t0


def status_kb(field: str) -> int:
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(field)


# ------------------------------------------------------------ memory


def load_model(path: pathlib.Path):
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    model = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    model.set_attn_implementation("sdpa")
    return model.eval()


def memory_child(model_path: str, ids_path: str, name: str, threads: int) -> None:
    setup_threads(threads)
    import gc

    import torch

    model = load_model(pathlib.Path(model_path))
    ids = torch.load(ids_path)
    configure(model, name)
    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets the peak (VmHWM) to the current resident set: loading's own peak is forgotten
    base = status_kb("VmRSS")
    secs = forward(model, ids)
    peak = status_kb("VmHWM")
    unconfigure(model, name)
    print(json.dumps({"config": name, "length": int(ids.shape[1]), "baseline_mb": base / 1024,
                      "peak_mb": peak / 1024, "forward_peak_mb": (peak - base) / 1024, "seconds": secs}))


def memory(a) -> None:
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    path = pathlib.Path(a.model)
    tok = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    with tempfile.TemporaryDirectory() as d:
        ids_path = os.path.join(d, "ids.pt")
        torch.save(tokens(tok, a.mem_length), ids_path)
        rows = []
        for name in a.configs.split(","):
            p = subprocess.run([sys.executable, __file__, "memory-child", str(path), ids_path, name, str(a.threads)],
                               capture_output=True, text=True)
            if p.returncode != 0:
                sys.exit(f"{name}: {p.stderr.strip().splitlines()[-1] if p.stderr.strip() else p.returncode}")
            rows.append(json.loads(p.stdout.strip().splitlines()[-1]))
            print(json.dumps(rows[-1]), flush=True)
    ref = next((r for r in rows if r["config"] == "sdpa"), None)
    print(f"\nforward peak over the loaded model, {a.mem_length} tokens:")
    for r in rows:
        ratio = f"{r['forward_peak_mb'] / ref['forward_peak_mb']:.2f} x sdpa" if ref else ""
        print(f"  {r['config']:<34} {r['forward_peak_mb']:8.0f} MB  (baseline {r['baseline_mb']:.0f} MB, "
              f"{r['seconds']:.1f} s)  {ratio}")


# ------------------------------------------------------------ one attention call


def attention_child(length: int, config: str, method: str, threads: int) -> None:
    """One attention call at SmolLM2-135M's shapes (9 query heads, 3
    key/value heads, head_dim 64, rope_theta 100,000) on random inputs:
    posenc.hf's method attention on ``config``'s path (``torch`` or
    ``fused``), or PyTorch's causal ``sdpa`` (no RoPE) for scale."""
    setup_threads(threads)
    import torch

    import posenc
    import posenc.hf as ph

    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 9, length, 64, generator=g)
    k, v = (torch.randn(1, 3, length, 64, generator=g) for _ in range(2))
    rope = posenc.RopeConfig.plain(100000.0, 64, max_position_embeddings=8192).with_scaling(method)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    base = status_kb("VmRSS")
    t0 = time.perf_counter()
    with torch.no_grad():
        if config == "sdpa":
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        else:
            out = ph._method_attention(q, k, v, rope, config)
    secs = time.perf_counter() - t0
    peak = status_kb("VmHWM")
    print(json.dumps({"config": config, "method": method, "length": length, "out_mb": out.numel() * 4 / 2**20,
                      "peak_mb": (peak - base) / 1024, "seconds": secs}))


def attention_memory(a) -> None:
    print(f"one attention call, (1, 9, T, 64) queries, (1, 3, T, 64) keys and values, float32; "
          f"peak resident memory over the inputs:")
    for length in a.lengths:
        for name in a.configs.split(","):
            p = subprocess.run([sys.executable, __file__, "attention-child", str(length), name, a.method,
                                str(a.threads)], capture_output=True, text=True)
            if p.returncode != 0:
                sys.exit(f"{name}: {p.stderr.strip().splitlines()[-1] if p.stderr.strip() else p.returncode}")
            r = json.loads(p.stdout.strip().splitlines()[-1])
            label = "sdpa (no RoPE)" if name == "sdpa" else f"{a.method}@{name}"
            print(f"  T {length:>6}  {label:<28} {r['peak_mb']:8.0f} MB  ({r['seconds']:.1f} s)", flush=True)


# ------------------------------------------------------------ speed


def cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or "unknown CPU"


def speed(a) -> None:
    setup_threads(a.threads)
    import torch
    import transformers

    import posenc

    model, tok = load(pathlib.Path(a.model))
    configs = a.configs.split(",")
    print(f"{cpu_name()} ({posenc._posenc.simd_level()}), {a.threads} threads, torch {torch.__version__}, "
          f"transformers {transformers.__version__}", flush=True)
    # one short forward per configuration first, untimed, so that no configuration's timed forward
    # pays the process's first-call costs (thread pools, first allocations, posenc's tables)
    warm = tokens(tok, a.warmup)
    for c in configs:
        configure(model, c)
        try:
            forward(model, warm)
        finally:
            unconfigure(model, c)
    print(f"uptime: {open('/proc/loadavg').read().strip()}", flush=True)
    layers = model.config.get_text_config().num_hidden_layers
    for length in a.lengths:
        ids = tokens(tok, length)
        times = {c: [] for c in configs}
        attn = {c: [] for c in configs}
        for r in range(a.rounds):
            for c in configs:
                configure(model, c)
                sink = [0.0]
                undo = time_attention(model, sink) if a.attention_time else None
                try:
                    times[c].append(forward(model, ids))
                finally:
                    if undo:
                        undo()
                    unconfigure(model, c)
                attn[c].append(sink[0] / layers)
                row = {"length": length, "round": r, "config": c, "seconds": times[c][-1],
                       "load": open("/proc/loadavg").read().split()[0]}
                if a.attention_time:
                    row["attention_seconds_per_layer"] = attn[c][-1]
                print(json.dumps(row), flush=True)
        base = statistics.median(times["sdpa"]) if "sdpa" in times else None
        extra = ", attention ms per layer" if a.attention_time else ""
        print(f"\n{length} tokens, median of {a.rounds} (forward seconds, tokens/s, sdpa / config{extra}):")
        for c in configs:
            m = statistics.median(times[c])
            rel = f"{base / m:.2f}" if base else ""
            at = f"  {statistics.median(attn[c]) * 1e3:8.1f} ms" if a.attention_time else ""
            print(f"  {c:<34} {m:8.2f} s  {length / m:8.1f} tok/s  {rel:>4}{at}", flush=True)
    print(f"uptime: {open('/proc/loadavg').read().strip()}")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "memory-child":
        memory_child(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "attention-child":
        attention_child(int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5]))
        return
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=["memory", "speed", "attention-memory"])
    p.add_argument("--model", default=str(GGUF))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--mem-length", type=int, default=16384)
    p.add_argument("--lengths", type=lambda s: [int(x) for x in s.split(",")], default=[4096, 16384])
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--warmup", type=int, default=256, help="tokens of the untimed first forward of each configuration")
    p.add_argument("--configs")
    p.add_argument("--attention-time", action="store_true",
                   help="speed: also time each layer's attention function inside the forward (ms per layer)")
    p.add_argument("--method", default="self-extend:4:1024", help="attention-memory: the method")
    a = p.parse_args()
    if a.configs is None:
        a.configs = {"memory": "sdpa,self-extend:4:1024@torch,self-extend:4:1024@fused",
                     "speed": f"sdpa,self-extend:4:1024@fused,{COVER}@fused",
                     "attention-memory": "sdpa,torch,fused"}[a.what]
    {"memory": memory, "speed": speed, "attention-memory": attention_memory}[a.what](a)


if __name__ == "__main__":
    main()
