"""posenc on any Hugging Face transformers model, on any device.

``posenc.hf.apply(model, name)`` puts a scaling or a training-free method
(any name ``RopeConfig.with_scaling`` takes: ``"yarn:2"``,
``"self-extend:4:1024"``, ``"rerope:1024"``, ``"leaky-rerope:1024:16"``,
``"dca:6144:1024"``, ``"sinks:4:1024"``, ``"self-extend:4:1024+yarn:2"``)
on a loaded model; ``posenc.hf.remove(model)`` restores it bit for bit.
No modeling file and no class is edited:

- a frequency scaling replaces each rotary embedding module's ``inv_freq``
  buffer and ``attention_scaling`` with posenc's (``rope.frequencies()``),
  the numbers transformers computes from the same ``rope_scaling`` entry;
- a method registers an attention function with
  ``transformers.AttentionInterface`` and switches the model to it. That
  function receives queries and keys already rotated at their true
  positions (keys ``0..S``, queries the last ``T``), undoes the rotation
  with the model's own tables (posenc's ``cos_sin``), and runs
  ``posenc.torch.attention`` with the method, which rotates at the method's
  remapped positions: the fused CPU kernels on CPU float32/bfloat16, the
  pure-PyTorch path elsewhere (GPU), or everywhere with ``backend="torch"``
  or ``POSENC_TORCH_PATH=1``.

Sliding-window layers (Gemma 2/3, Qwen2 with ``use_sliding_window``) keep
the model's own attention: their window already holds every relative
distance below the window, within the trained length. A model whose every
layer slides is refused. Gemma 2's logit soft-capping is served on the
PyTorch path (posenc's method ranges, ``tanh`` capping before the softmax).
"""

from __future__ import annotations

if __name__ == "__main__":  # python -m posenc.hf passkey|perplexity ...
    # Before torch is imported (seconds): a bad argument is refused at once.
    import sys as _sys

    from posenc._hf_cli import main as _main

    _sys.exit(_main())

import itertools
import sys
from typing import Any, Dict, List, Optional

import numpy as np
import torch

from ._posenc import PosencError, RopeConfig
from . import _progress
from . import torch as _pt

__all__ = ["apply", "remove", "rope_of", "perplexity", "passkey"]

_METHODS = ("self-extend", "rerope", "leaky-rerope", "dca", "sinks")
_COUNTER = itertools.count()
_STATE = "_posenc_hf"


def _transformers():
    try:
        import transformers  # noqa: F401
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface
    except ImportError as e:  # pragma: no cover - depends on the install
        raise PosencError(f"posenc.hf needs transformers (pip install transformers): {e}") from None
    return AttentionInterface, AttentionMaskInterface


def _split(name: str):
    """(method part or None, scaling part or None) of a name."""
    if not isinstance(name, str) or not name:
        raise PosencError(f"name: expected a scaling or method name such as 'yarn:2', got {name!r}")
    parts = name.split("+")
    method = [p for p in parts if p.split(":")[0] in _METHODS]
    scaling = [p for p in parts if p.split(":")[0] not in _METHODS]
    if len(method) > 1 or len(scaling) > 1:
        raise PosencError(f"{name}: at most one method and one scaling, as METHOD+SCALING")
    return (method[0] if method else None), (scaling[0] if scaling else None)


def rope_of(model: Any) -> RopeConfig:
    """The model's own RoPE, read from ``model.config`` (transformers 5's
    ``rope_parameters``, ``partial_rotary_factor``, per-layer-type tables:
    the full-attention one)."""
    cfg = getattr(model, "config", None)
    if cfg is None or not hasattr(cfg, "to_dict"):
        raise PosencError(f"{type(model).__name__}: not a transformers model (no config)")
    d = _text_config(model).to_dict()
    if d.get("rope_parameters") is None and d.get("rope_theta") is None and d.get("rope_scaling") is None:
        raise PosencError(f"{d.get('model_type', type(model).__name__)}: the config states no RoPE (rope_parameters)")
    return RopeConfig.from_hf(d)


def _trained_length(rope: RopeConfig, model: Any) -> int:
    """The length ``rope``'s model was trained at (``max_position_embeddings``,
    or the scaling's ``original_max_position_embeddings``)."""
    n = rope.trained_length
    if n is None:
        name = getattr(_text_config(model), "model_type", None) or type(model).__name__
        raise PosencError(
            f"{name}: the config states no trained length (max_position_embeddings), "
            "which the bands inside and beyond it are measured from"
        )
    return n


# ------------------------------------------------------------ rotary modules


def _text_config(model):
    cfg = model.config
    get = getattr(cfg, "get_text_config", None)
    return get() if callable(get) else cfg


def _rotary_modules(model) -> List[Any]:
    """The language model's rotary embedding modules (a vision tower's own
    rotary table, with another config, is left alone)."""
    text = _text_config(model)
    out = []
    for m in model.modules():
        bufs = getattr(m, "_buffers", {})
        if "inv_freq" in bufs or "full_attention_inv_freq" in bufs:
            if getattr(m, "config", text) is text:
                out.append(m)
    return out


def _prefix(m) -> str:
    return "full_attention_" if "full_attention_inv_freq" in m._buffers else ""


def _rope_type(m) -> str:
    t = getattr(m, "rope_type", "default")
    if isinstance(t, dict):
        t = t.get("full_attention", "default")
    return str(t)


def _set_tables(m, rope: RopeConfig, seq_len: Optional[int] = None) -> None:
    p = _prefix(m)
    f = rope.frequencies(seq_len)
    old = m._buffers[p + "inv_freq"]
    # float32 as transformers computes it, then the buffer's own dtype (a model moved to bfloat16 has its
    # inv_freq in bfloat16 too)
    inv = torch.from_numpy(np.asarray(f.inv_freq, dtype=np.float32)).to(old.device, old.dtype)
    if inv.shape != old.shape:
        raise PosencError(
            f"{type(m).__name__}: posenc's table has {inv.shape[0]} frequencies, the model's {old.shape[0]}"
        )
    m._buffers[p + "inv_freq"] = inv
    setattr(m, p + "attention_scaling", float(f.attention_factor))


def _dynamic_forward(m, rope: RopeConfig, orig_forward):
    """transformers' dynamic_rope_update with posenc's tables: grow with the
    longest sequence seen, back to the trained table below it."""
    trained = rope.trained_length
    state = {"cached": trained}

    def forward(x, position_ids, *args, **kwargs):
        seq_len = int(position_ids.max()) + 1
        if seq_len > state["cached"]:
            _set_tables(m, rope, seq_len)
            state["cached"] = seq_len
        elif seq_len < trained and state["cached"] > trained:
            _set_tables(m, rope, None)
            state["cached"] = trained
        return orig_forward(x, position_ids, *args, **kwargs)

    return forward


# ------------------------------------------------------------ attention


def _layer_mask_ok(mask, t: int, s: int) -> bool:
    if mask is None:
        return True
    if not isinstance(mask, torch.Tensor) or mask.dim() != 4:
        return False
    allowed = mask if mask.dtype == torch.bool else (mask == 0)
    qi = torch.arange(t, device=mask.device)[:, None]
    kj = torch.arange(s, device=mask.device)[None, :]
    want = kj <= qi + (s - t)
    if allowed.shape[-2:] != want.shape:
        return False
    return bool(torch.equal(allowed, want.expand_as(allowed)))


def _inverse_tables(cache: Dict[Any, Any], table: RopeConfig, n: int, device, work):
    """The inverse of the model's rotation at positions ``0..n``: its tables
    (attention factor included) are posenc's ``cos_sin``; the inverse is
    ``(c, -s)/(c² + s²)``. Kept per device and dtype, grown by doubling, so a
    decoding step computes none."""
    key = (str(device), work)
    have = cache.get(key)
    if have is None or have[0].shape[0] < n:
        m = max(n, 2 * have[0].shape[0]) if have is not None else n
        c, s = table.cos_sin(list(range(m)), "float64", full=False)
        norm = c * c + s * s
        have = (torch.from_numpy(c / norm).to(device, work), torch.from_numpy(-s / norm).to(device, work))
        cache[key] = have
    return have


def _unrotate(x: torch.Tensor, tables, lo: int, hi: int, layout: str, work) -> torch.Tensor:
    ct, st = tables
    return _pt.rotate(x.to(work), ct[lo:hi].unsqueeze(0), st[lo:hi].unsqueeze(0), layout)


#: Bytes of one step's logits on the PyTorch path (all heads of a batch,
#: a query block by posenc.torch's ``KEY_CHUNK`` keys): the block's rows
#: shrink with the heads, so that a step's working set stays a few tens of
#: MB whatever the model and the length (256 rows for 9 heads, float32).
BLOCK_BYTES = 9 << 20


def _method_attention(q, k, v, rope: RopeConfig, backend, softcap: Optional[float] = None):
    """posenc.torch's method attention: the fused kernels where they serve
    (CPU float32/bfloat16, not forced off, no soft-capping), else its
    PyTorch path (flash attention over key chunks, memory linear in the
    length) in query blocks of at most ``BLOCK_BYTES`` of logits per step,
    with Gemma 2's soft-capping where ``softcap`` is given."""
    if softcap is None and not _pt._forced_torch(backend) and _pt.fused_available(q, k, v):
        return _pt._method_fused(q, k, v, rope)
    b, h, _, _ = q.shape
    per_row = b * h * min(_pt.KEY_CHUNK, k.shape[2]) * q.element_size()
    block = int(max(16, min(_pt.QUERY_BLOCK, BLOCK_BYTES // max(per_row, 1))))
    return _pt._torch_method_attention(q, k, v, rope, block=block, softcap=softcap)


def _make_attention(st: Dict[str, Any]):
    table: RopeConfig = st["table"]
    method_rope: RopeConfig = st["method_rope"]
    backend = st["backend"]
    tables: Dict[Any, Any] = {}

    def posenc_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        if kwargs.get("sliding_window") is not None:
            return st["fallback"](module)(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
        if dropout and module.training:
            raise PosencError("posenc.hf: attention dropout in training mode is not served; call model.eval()")
        b, h, t, d = query.shape
        s = key.shape[2]
        if t > s:
            raise PosencError(f"posenc.hf: {t} queries but {s} keys")
        pid = kwargs.get("position_ids")
        if pid is not None:
            want = torch.arange(s - t, s, device=pid.device)
            if pid.shape[-1] != t or not bool((pid.reshape(-1, t) == want).all()):
                raise PosencError(
                    f"posenc.hf: the methods number keys 0..{s} with the {t} queries last; got position ids "
                    f"{pid.reshape(-1, t)[0, :4].tolist()}... (a cache not contiguous from 0, padding or packed sequences)"
                )
        if not _layer_mask_ok(attention_mask, t, s):
            raise PosencError(
                "posenc.hf: the attention mask hides more than the causal keys (padding, packed sequences or a "
                "static cache); the methods take one unpadded sequence per batch row"
            )
        work = torch.float64 if query.dtype == torch.float64 else torch.float32
        inv = _inverse_tables(tables, table, s, query.device, work)
        q = _unrotate(query, inv, s - t, s, table.layout, work)
        k = _unrotate(key, inv, 0, s, table.layout, work)
        v = value.to(work)
        sc = module.scaling if scaling is None else scaling
        factor = sc * d**0.5  # the model's logit scale, through posenc's 1/sqrt(D)
        if factor != 1.0:  # 1 for the usual 1/sqrt(D) (x * 1.0 is x: no copy for nothing)
            q = q * factor
        softcap = kwargs.get("softcap")
        out = _method_attention(q, k, v, method_rope, backend, None if softcap is None else float(softcap))
        return out.transpose(1, 2).contiguous().to(query.dtype), None

    return posenc_attention


def _fallback_for(orig_impl: str):
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    def get(module):
        if orig_impl == "eager":
            return sys.modules[type(module).__module__].eager_attention_forward
        return ALL_ATTENTION_FUNCTIONS[orig_impl]

    return get


def _configs(model) -> List[Any]:
    seen, out = set(), []
    for m in model.modules():
        c = getattr(m, "config", None)
        if c is not None and hasattr(c, "_attn_implementation_internal") and id(c) not in seen:
            seen.add(id(c))
            out.append(c)
            for key in getattr(c, "sub_configs", {}) or {}:
                sc = getattr(c, key, None)
                if sc is not None and id(sc) not in seen and hasattr(sc, "_attn_implementation_internal"):
                    seen.add(id(sc))
                    out.append(sc)
    return out


def _all_sliding(cfg) -> bool:
    types = getattr(cfg, "layer_types", None)
    if types:
        return all("sliding" in str(x) or "chunked" in str(x) for x in types)
    return getattr(cfg, "sliding_window", None) is not None and getattr(cfg, "use_sliding_window", True) is not False


# ------------------------------------------------------------ apply / remove


def apply(model: Any, name: str, *, backend: Optional[str] = None) -> RopeConfig:
    """Puts the scaling or method ``name`` on ``model`` (in place) and
    returns the ``RopeConfig`` it runs. A model already given one is first
    restored. ``backend``: ``None`` (fused on CPU float32/bfloat16, the
    PyTorch path elsewhere), ``"fused"`` or ``"torch"``."""
    AttentionInterface, AttentionMaskInterface = _transformers()
    if backend not in (None, "fused", "torch", "auto"):
        raise PosencError(f'backend {backend!r}: use "fused", "torch" or None')
    if getattr(model, _STATE, None) is not None:
        remove(model)
    base = rope_of(model)
    method, scaling = _split(name)
    table = base.with_scaling(scaling) if scaling is not None else base
    full = base.with_scaling(name)
    rotary = _rotary_modules(model)
    if not rotary:
        raise PosencError(f"{type(model).__name__}: no rotary embedding module (inv_freq): a model without RoPE")
    model_type = _rope_type(rotary[0])
    cfg = model.config
    st: Dict[str, Any] = {"rotary": [], "configs": [], "name": name, "rope": full}
    if method is not None:
        if "dynamic" in model_type or model_type == "longrope" or (scaling or "").startswith("dynamic"):
            raise PosencError(
                f"{name}: the model's tables change with the length ({model_type if scaling is None else scaling}), "
                "so cached keys were rotated by other tables; name a fixed scaling, as METHOD+yarn:F"
            )
        if table.layout != "half-split":
            raise PosencError(f"{name}: the {table.layout} layout is not served by posenc.hf (half-split only)")
        if _all_sliding(_text_config(model)):
            raise PosencError(
                f"{name}: every attention layer of this model slides over a window, which keeps positions within "
                "it: a method has no full-attention layer to extend"
            )
        if not hasattr(model, "set_attn_implementation"):
            raise PosencError(f"{type(model).__name__}: no set_attn_implementation (transformers >= 5 is needed)")
        orig_impl = cfg._attn_implementation or "sdpa"
        if orig_impl not in ("sdpa", "eager"):
            orig_impl = "sdpa"
    # the tables (frequency scaling)
    if scaling is not None:
        for m in rotary:
            p = _prefix(m)
            saved = {
                "inv_freq": m._buffers[p + "inv_freq"],
                "attention_scaling": m.__dict__.get(p + "attention_scaling"),
                "rope_type": m.__dict__.get("rope_type"),
                "forward": m.__dict__.get("forward"),
            }
            st["rotary"].append((m, p, saved))
            _set_tables(m, table)
            if not isinstance(m.rope_type, dict):
                m.rope_type = "default"  # the decorator then leaves posenc's table alone
            else:
                m.rope_type = {**m.rope_type, "full_attention": "default"}
            if scaling.startswith("dynamic"):
                m.forward = _dynamic_forward(m, table, type(m).forward.__get__(m))
    # the attention (method)
    if method is not None:
        impl = f"posenc_{next(_COUNTER)}"
        st.update(table=table, method_rope=full, backend=backend, fallback=_fallback_for(orig_impl), impl=impl)
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

        AttentionInterface.register(impl, _make_attention(st))
        AttentionMaskInterface.register(impl, ALL_MASK_ATTENTION_FUNCTIONS[orig_impl])
        st["configs"] = [(c, c._attn_implementation_internal) for c in _configs(model)]
        try:
            model.set_attn_implementation(impl)
        except Exception as e:  # pragma: no cover - depends on the model class
            _restore(model, st)
            raise PosencError(f"{type(model).__name__}: transformers refused the attention function: {e}") from None
        if model.config._attn_implementation != impl:
            _restore(model, st)
            raise PosencError(
                f"{type(model).__name__}: its attention does not go through transformers' AttentionInterface"
            )
    setattr(model, _STATE, st)
    return full


def _restore(model, st) -> None:
    for m, p, saved in st["rotary"]:
        m._buffers[p + "inv_freq"] = saved["inv_freq"]
        for key, attr in (("attention_scaling", p + "attention_scaling"), ("rope_type", "rope_type"), ("forward", "forward")):
            if saved[key] is None:
                m.__dict__.pop(attr, None)
            else:
                m.__dict__[attr] = saved[key]
    for c, impl in st["configs"]:
        c._attn_implementation_internal = impl
    if "impl" in st:
        AttentionInterface, AttentionMaskInterface = _transformers()
        AttentionInterface._global_mapping.pop(st["impl"], None)
        AttentionMaskInterface._global_mapping.pop(st["impl"], None)


def remove(model: Any) -> None:
    """Restores a model given ``apply``: the original ``inv_freq`` tensors,
    ``attention_scaling`` and attention implementation."""
    st = getattr(model, _STATE, None)
    if st is None:
        raise PosencError(f"{type(model).__name__}: posenc.hf.apply was not called on this model")
    _restore(model, st)
    delattr(model, _STATE)


# ------------------------------------------------------------ perplexity

DEFAULT_SCALINGS = ("none", "linear:2", "dynamic:2", "ntk:2", "yarn:2")


def _mean(loss: List[float], a: int, b: int) -> Optional[float]:
    part = loss[a : min(b, len(loss))]
    return float(sum(part) / len(part)) if part else None


def _names(methods: Any) -> List[str]:
    """``methods`` as the probes take it: a name, comma-separated names or a
    list of names."""
    if isinstance(methods, str):
        return methods.split(",")
    try:
        names = list(methods)
    except TypeError:
        names = None
    if names is None or not all(isinstance(n, str) for n in names):
        raise PosencError(
            f"methods: give a name (\"self-extend:4:1024\"), comma-separated names or a list of names, not {methods!r}"
        )
    return names


def perplexity(
    model: Any,
    tokenizer: Any,
    text: Any,
    length: Optional[int] = None,
    methods: Any = DEFAULT_SCALINGS,
    *,
    band: int = 1024,
    per_position: bool = False,
    backend: Optional[str] = None,
    progress: Any = None,
) -> Dict[str, Any]:
    """The loss at every position of the first ``length`` tokens of
    ``text`` (a ``str``, or a ``pathlib.Path`` to read) for each name of
    ``methods`` (a list or a comma-separated string; ``"model"`` runs the
    model as loaded), each applied and removed in turn: the dict ``posenc
    perplexity --json`` prints (``"model"`` is the model's class here).
    ``length`` defaults to twice the trained length. ``progress``: as
    ``passkey``'s, one step per name. Ctrl-C raises ``KeyboardInterrupt``
    and leaves the model as loaded."""
    import os
    import time

    if isinstance(text, os.PathLike):
        with open(text, encoding="utf-8") as f:
            text = f.read()
    if not isinstance(text, str):
        raise PosencError(f"text: expected a str or a pathlib.Path, got {type(text).__name__}")
    names = _names(methods)
    if not names:
        raise PosencError("methods: give at least one name")
    if not isinstance(band, int) or band < 1:
        raise PosencError("a band needs at least one position")
    if getattr(model, _STATE, None) is not None:
        raise PosencError("perplexity: the model already has posenc.hf.apply's change; call posenc.hf.remove first")
    tick = _progress.resolve(progress)
    base = rope_of(model)
    trained = _trained_length(base, model)
    if length is None:
        length = 2 * trained
    if type(length) is not int:
        raise PosencError(f"length: expected an int, got {length!r}")
    if length < 2:
        raise PosencError(f"a window of {length} tokens has no target to score: use a length of 2 or more")
    # the tokenizer's default encoding of the whole text, as the command's (a BOS where the tokenizer adds one)
    ids = tokenizer(text, return_tensors="pt")["input_ids"]
    if ids.shape[1] < length:
        raise PosencError(f"the text has {ids.shape[1]} tokens, fewer than the window of {length}")
    device = next(model.parameters()).device
    ids = ids[:, :length].to(device)
    runs: Dict[str, Any] = {}
    total = 0.0
    if tick is not None:
        tick(0, len(names), f"{type(model).__name__}; {length} tokens; {len(names)} runs")
    for done, name in enumerate(names, 1):
        rope = base if name == "model" else base.with_scaling(name)
        if name != "model":
            apply(model, name, backend=backend)
        try:
            t0 = time.perf_counter()
            with torch.no_grad():
                lg = model(ids).logits[0, :-1].double()
                loss = torch.nn.functional.cross_entropy(lg, ids[0, 1:], reduction="none").cpu().tolist()
            secs = time.perf_counter() - t0
        finally:
            if name != "model":
                remove(model)
        freqs = rope.frequencies(length)
        inv = np.asarray(freqs.inv_freq, dtype=np.float32)
        o: Dict[str, Any] = {
            "bands": {f"{a}-{a + band}": _mean(loss, a, a + band) for a in range(0, len(loss), band)},
            "mean_inside": _mean(loss, 0, trained),
            "mean_beyond": _mean(loss, trained, len(loss)),
            "rope_type": rope.rope_type,
            "attention_factor": float(freqs.attention_factor),
            "inv_freq_first": float(inv[0]) if inv.size else 0.0,
            "inv_freq_last": float(inv[-1]) if inv.size else 0.0,
            "forward_seconds": secs,
            "tokens_per_second": length / max(secs, 1e-9),
        }
        if per_position:
            o["loss"] = loss
        runs[name] = o
        total += secs
        if tick is not None:
            tick(done, len(names), name)
    return {
        "model": type(model).__name__,
        "trained_length": trained,
        "length": length,
        "band": band,
        "forward_seconds": total,
        "tokens_per_second": length * len(names) / max(total, 1e-9),
        "scalings": runs,
    }


# ------------------------------------------------------------ passkey


def _tokenizer_json(tokenizer) -> str:
    backend = getattr(tokenizer, "backend_tokenizer", None) or getattr(tokenizer, "_tokenizer", None)
    to_str = getattr(backend, "to_str", None)
    if not callable(to_str):
        raise PosencError(
            f"{type(tokenizer).__name__}: passkey needs a fast tokenizer (one with a tokenizer.json, "
            "AutoTokenizer's default)"
        )
    return to_str()


def _eos_ids(model, tokenizer) -> List[int]:
    for src in (getattr(model, "generation_config", None), getattr(model, "config", None), tokenizer):
        e = getattr(src, "eos_token_id", None)
        if e is not None:
            return [int(x) for x in (e if isinstance(e, (list, tuple)) else [e])]
    return []


def _new_cache(model):
    from transformers import DynamicCache

    return DynamicCache(config=model.config)


def _keep(cache, n: int) -> None:
    """Keeps the first ``n`` positions of ``cache`` (transformers 5's
    ``crop`` takes the count to remove, negative)."""
    have = cache.get_seq_length()
    if have > n:
        cache.crop(n - have)


def _trial(model, st: Dict[str, Any], ids: List[int], answer: List[int], reuse: bool, eos: List[int], max_new: int):
    """One trial as the command's ``Prober::trial`` runs it: prefill from the
    first token that differs from the cached prompt (where ``reuse``), the
    teacher-forced log-probability of the answer, greedy generation of at
    most ``max_new`` tokens. Returns (generated ids, logprob, prefilled)."""
    device = next(model.parameters()).device
    n = len(ids)
    common = 0
    if reuse and st.get("ids") is not None:
        for a, b in zip(ids, st["ids"]):
            if a != b:
                break
            common += 1
        common = min(common, n - 1)
    if common == 0 or st.get("cache") is None:
        st["cache"] = _new_cache(model)
        common = 0
    cache = st["cache"]
    _keep(cache, common)
    st["ids"] = None  # until this trial is done

    def step(tokens):
        x = torch.tensor([tokens], dtype=torch.long, device=device)
        return model(input_ids=x, cache=cache, use_cache=True).logits[0].double()

    def forward_last(tokens):
        x = torch.tensor([tokens], dtype=torch.long, device=device)
        return model(input_ids=x, cache=cache, use_cache=True, logits_to_keep=1).logits[0, -1].double()

    first = forward_last(ids[common:])
    logprob = float(torch.log_softmax(first, -1)[answer[0]])
    if len(answer) > 1:
        lg = torch.log_softmax(step(answer[:-1]), -1)
        logprob += float(sum(lg[r, t] for r, t in enumerate(answer[1:])))
        _keep(cache, n)
    out: List[int] = []
    logits = first
    for i in range(max_new):
        nxt = int(torch.argmax(logits))
        out.append(nxt)
        if nxt in eos or i + 1 == max_new:
            break
        logits = forward_last([nxt])
    _keep(cache, n)
    st["ids"] = list(ids)
    return out, logprob, n - common


def passkey(
    model: Any,
    tokenizer: Any,
    lengths: Any = (2048, 4096, 8192, 12288, 16384),
    depths: Any = (0.0, 0.25, 0.5, 0.75, 1.0),
    trials: int = 1,
    methods: Any = ("none",),
    haystack: Any = None,
    seed: int = 0,
    *,
    backend: Optional[str] = None,
    progress: Any = None,
) -> Dict[str, Any]:
    """Passkey retrieval over ``lengths`` × ``depths`` (``trials`` keys per
    cell) for each name of ``methods`` (a list or a comma-separated string),
    each applied and removed in turn: the dict ``posenc passkey --json``
    prints (``"model"`` is the model's class here). ``haystack``: ``None``
    (the landmark passkey prompt), a ``str`` (RULER's needle hidden in that
    text) or a ``pathlib.Path`` to such a text. The prompts, keys, answer
    reading and the document come from the Rust library (``PasskeyProbe``),
    the prompts tokenized by ``tokenizer``'s own ``tokenizer.json``; only
    the forward passes run here, as the command's trials run them (the KV
    cache of the previous prompt of a length reused where that is exact).
    ``progress``: ``None`` (a tqdm bar when tqdm is installed), ``False``
    (none) or a callable ``(done, total, what)``. Ctrl-C raises
    ``KeyboardInterrupt`` and leaves the model as loaded."""
    import json
    import os
    import time

    from ._posenc import PasskeyProbe

    _transformers()
    names = _names(methods)
    if isinstance(lengths, int) or isinstance(depths, (int, float)):
        raise PosencError("lengths and depths: give lists (one value is a list of one)")
    if isinstance(haystack, os.PathLike):
        with open(haystack, encoding="utf-8") as f:
            haystack = f.read()
    if haystack is not None and not isinstance(haystack, str):
        raise PosencError(f"haystack: give None, a str or a pathlib.Path, not {type(haystack).__name__}")
    if getattr(model, _STATE, None) is not None:
        raise PosencError("passkey: the model already has posenc.hf.apply's change; call posenc.hf.remove first")
    trained = _trained_length(rope_of(model), model)
    probe = PasskeyProbe(
        _tokenizer_json(tokenizer), [int(x) for x in lengths], [float(x) for x in depths], int(trials), names,
        haystack, int(seed),
    )
    tick = _progress.resolve(progress)
    eos = _eos_ids(model, tokenizer)
    total = len(probe.methods) * len(probe.lengths) * len(probe.depths) * probe.trials
    if tick is not None:
        tick(0, total, f"{type(model).__name__}; {probe.format}; trained length {trained}; {total} trials")
    t_all = time.perf_counter()
    done = 0
    for name in probe.methods:
        t0 = time.perf_counter()
        reuse = probe.reuses_cache(name)
        results = []
        apply(model, name, backend=backend)
        try:
            with torch.no_grad():
                for length in probe.lengths:
                    st: Dict[str, Any] = {}
                    what = f"{name} @ {length}"
                    for depth in probe.depths:
                        for trial in range(probe.trials):
                            t1 = time.perf_counter()
                            ids, answer, key = probe.prompt(length, depth, trial)
                            out, logprob, prefilled = _trial(model, st, ids, answer, reuse, eos, probe.max_new_tokens)
                            text, read = probe.read(out)
                            results.append({
                                "length": length, "depth": depth, "key": key, "prompt_tokens": len(ids),
                                "read": read, "correct": read == key, "logprob": logprob,
                                "answer_tokens": len(answer), "generated": text, "prefilled": prefilled,
                                "seconds": time.perf_counter() - t1,
                            })
                            done += 1
                            if tick is not None:
                                tick(done, total, what)
        finally:
            remove(model)
        probe.add_method(name, json.dumps(results), time.perf_counter() - t0)
    return probe.document(type(model).__name__, trained, time.perf_counter() - t_all)
