"""posenc's RoPE and attention as PyTorch autograd ops.

``apply_rope(q, k, rope, offset=0, position_ids=None)`` rotates queries and
keys; ``attention(q, k, v, *, causal=True, rope=None, alibi=None,
method=None, offset=0, position_ids=None, scale=None)`` is scaled-dot-product
attention with the position encoding inside, shaped as
``torch.nn.functional.scaled_dot_product_attention``: ``q`` is ``(B, H, T,
D)``, ``k`` and ``v`` are ``(B, H_kv, S, D)`` with ``H_kv`` dividing ``H``
(grouped-query attention).

Two paths compute the same numbers:

- **fused** (CPU ``float32`` and ``bfloat16`` tensors): posenc's fused
  kernels read and write the tensors' own memory through numpy views (no
  copy of a contiguous input; a non-contiguous one is made contiguous once),
  forward and backward, with the GIL released. The attention kernel
  computes in ``float32``: ``bfloat16`` inputs to ``attention`` are widened
  once (RoPE's ``bfloat16`` kernel reads them in place).
- **torch** (any other device or dtype, or forced with ``backend="torch"``
  or the environment variable ``POSENC_TORCH_PATH=1``, read at import): plain PyTorch ops on
  the same cos/sin tables, which posenc's Rust library computes (angles in
  ``float64``), so it runs on a GPU too. Attention runs in query blocks, so
  no ``T × S`` matrix per head is held for long inputs.

Positions: keys are at ``offset .. offset + S`` (or ``position_ids``, one
row of ``S`` ids per batch entry, or one row shared); queries are at the last
``T`` key positions, and the causal mask is aligned bottom-right (query
``i`` sees keys ``j <= i + S - T``), as in a KV cache.

Training-free methods (``method="self-extend:4:1024"``, ``"rerope:512"``,
``"leaky-rerope:512:16"``, ``"dca:2048:256"``, ``"sinks:4:1024"``) remap
the positions each query sees its keys at; they need ``rope``, are causal,
number keys from 0 and take no ``alibi``, ``position_ids`` or ``scale``.
Their fused path is forward-only in the kernels, so their gradient is the
torch path's (recomputed in the backward pass).
"""

from __future__ import annotations

import os
from typing import Any, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from . import _posenc
from ._posenc import PosencError, RopeConfig

__all__ = ["apply_rope", "attention", "rotate", "fused_available"]

#: Query rows per block of the torch path's attention.
QUERY_BLOCK = 1024

#: Query rows per block and keys per chunk of the torch path's method
#: attention: one step holds ``(B, H, METHOD_BLOCK, KEY_CHUNK)`` logits
#: (9.4 MB in float32 for 9 heads), whatever the length.
METHOD_BLOCK = 256
KEY_CHUNK = 1024

#: When a list, every fused call appends the data pointers of the buffers
#: it hands to the kernels (a test checks they are the tensors' own).
_TRACE: Optional[list] = None


#: The environment's choice of path (``POSENC_TORCH_PATH=1``), read once at
#: import; ``backend=`` chooses per call.
_ENV_TORCH = os.environ.get("POSENC_TORCH_PATH", "") not in ("", "0")


def _forced_torch(backend: Optional[str]) -> bool:
    if backend is None:
        return _ENV_TORCH
    if backend == "torch":
        return True
    if backend in ("fused", "auto"):
        return False
    raise PosencError(f'backend {backend!r}: use "fused", "torch" or None')


def fused_available(*tensors: torch.Tensor) -> bool:
    """Whether the fused kernels can take these tensors: CPU, one dtype,
    ``float32`` or ``bfloat16``."""
    if not tensors:
        return False
    dt = tensors[0].dtype
    if dt is not torch.float32 and dt is not torch.bfloat16:
        return False
    return all(t.dtype is dt and t.is_cpu for t in tensors)


def _view(t: torch.Tensor) -> np.ndarray:
    """A numpy view of a contiguous CPU tensor's memory (no copy)."""
    a = t.detach().view(torch.int16).numpy() if t.dtype == torch.bfloat16 else t.detach().numpy()
    if _TRACE is not None:
        _TRACE.append((t.data_ptr(), a.ctypes.data))
    return a


def _check4(name: str, t: Any) -> None:
    if not isinstance(t, torch.Tensor):
        raise PosencError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dim() != 4:
        raise PosencError(
            f"{name}: expected a 4-d (batch, heads, seq_len, head_dim) tensor, got shape {tuple(t.shape)}"
        )
    if not t.is_floating_point():
        raise PosencError(f"{name}: expected a floating-point tensor, got {t.dtype}")


def _check_rope(rope: Any) -> RopeConfig:
    if not isinstance(rope, RopeConfig):
        raise PosencError(f"rope: expected a posenc.RopeConfig, got {type(rope).__name__}")
    return rope


def _check_offset(offset: Any, s: int) -> None:
    """Keys at ``offset .. offset + s``: positions an int64 holds."""
    if type(offset) is not int or offset < 0:
        raise PosencError(f"offset: expected an int >= 0, got {offset!r}")
    if offset + s > 2**63:
        raise PosencError(f"offset: the last key's position {offset + s - 1} is past an int64's {2**63 - 1}")


def _key_ids(
    offset: int, position_ids: Any, batch: int, s: int, device: torch.device
) -> Tuple[Optional[np.ndarray], torch.Tensor]:
    """The keys' positions: the ids as a contiguous int64 (B, S) numpy array
    (None with an offset) and as a (B, S) tensor on `device`."""
    if position_ids is None:
        _check_offset(offset, s)
        # (arange's end, one past the last, may be past an int64's)
        pos = torch.arange(s, device=device, dtype=torch.int64) + offset
        return None, pos.unsqueeze(0).expand(batch, s)
    if offset != 0:
        raise PosencError("offset and position_ids: give one of them")
    ids = torch.as_tensor(position_ids)
    if ids.dtype.is_floating_point or ids.dtype == torch.bool or ids.is_complex():
        raise PosencError(f"position_ids: expected integers, got {ids.dtype}")
    if ids.dim() == 1:
        ids = ids.unsqueeze(0)
    if ids.dim() != 2 or ids.shape[1] != s or ids.shape[0] not in (1, batch):
        raise PosencError(
            f"position_ids: expected shape ({batch}, {s}) or ({s},), got {tuple(torch.as_tensor(position_ids).shape)}"
        )
    ids = ids.to(torch.int64).expand(batch, s)
    host = ids.detach().cpu().contiguous().numpy()
    if (host < 0).any():
        raise PosencError(f"position ids must be >= 0, got {int(host.min())}")
    return host, ids.to(device)


# ---------------------------------------------------------------- RoPE


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str) -> torch.Tensor:
    """Rotates the first ``2·cos.shape[-1]`` entries of ``x`` (``(B, H, T,
    D)``) by the half-width tables ``cos``, ``sin`` (``(B, T, D_r/2)``) with
    pairs laid out ``half-split`` or ``interleaved``; the rest passes
    through. Computed in float32 (float64 for float64 inputs)."""
    nf = cos.shape[-1]
    rd = 2 * nf
    work = torch.float64 if x.dtype == torch.float64 else torch.float32
    xr = x[..., :rd].to(work)
    c = cos.to(work).unsqueeze(1)
    s = sin.to(work).unsqueeze(1)
    if layout != "interleaved" and not (
        torch.is_grad_enabled() and (x.requires_grad or cos.requires_grad or sin.requires_grad)
    ):
        # Without autograd: the same products and sums written into one
        # output (no torch.cat, one temporary), bit for bit the path below.
        x1, x2 = xr[..., :nf], xr[..., nf:]
        lead = torch.broadcast_shapes(x1.shape, c.shape)[:-1]
        y = torch.empty(lead + (x.shape[-1],), dtype=work, device=x.device)
        y1, y2 = y[..., :nf], y[..., nf:rd]
        tmp = torch.mul(x2, s)
        torch.mul(x1, c, out=y1).sub_(tmp)
        torch.mul(x1, s, out=tmp)
        torch.mul(x2, c, out=y2).add_(tmp)
        if rd != x.shape[-1]:
            y[..., rd:] = x[..., rd:]
        return y if x.dtype == work else y.to(x.dtype)
    if layout == "interleaved":
        x1, x2 = xr[..., 0::2], xr[..., 1::2]
        y = torch.stack((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).flatten(-2)
    else:
        x1, x2 = xr[..., :nf], xr[..., nf:]
        y = torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)
    y = y.to(x.dtype)
    if rd == x.shape[-1]:
        return y
    return torch.cat((y, x[..., rd:]), dim=-1)


def _tables(rope: RopeConfig, ids_host: np.ndarray, q_len: int, device: torch.device):
    qc, qs, kc, ks = rope._tables(np.ascontiguousarray(ids_host, dtype=np.int64), q_len)
    t = lambda a: torch.from_numpy(a).to(device)  # noqa: E731
    return t(qc), t(qs), t(kc), t(ks)


def _rope_kernel(q, k, rope, offset, ids, inverse):
    """Rotates contiguous q and k into new tensors with the fused kernel,
    which reads and writes the tensors' memory by address (the tensors are
    held here for the whole call)."""
    oq, ok = torch.empty_like(q), torch.empty_like(k)
    if _TRACE is not None:
        _TRACE.extend((t.data_ptr(), t.data_ptr()) for t in (q, oq, k, ok))
    _posenc._rope_ptr(
        rope, q.dtype is torch.bfloat16, q.data_ptr(), oq.data_ptr(), q.shape,
        k.data_ptr(), ok.data_ptr(), k.shape, offset, ids, inverse,
    )  # fmt: skip
    return oq, ok


class _RopeFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, rope, offset, ids):  # type: ignore[override]
        ctx.rope, ctx.offset, ctx.ids = rope, offset, ids
        ctx.shapes = (q.shape, k.shape)
        return _rope_kernel(q.contiguous(), k.contiguous(), rope, offset, ids, False)

    @staticmethod
    def backward(ctx, gq, gk):  # type: ignore[override]
        gq = gk.new_zeros(ctx.shapes[0]) if gq is None else gq
        gk = gq.new_zeros(ctx.shapes[1]) if gk is None else gk
        dq, dk = _rope_kernel(gq.contiguous(), gk.contiguous(), ctx.rope, ctx.offset, ctx.ids, True)
        return dq, dk, None, None, None


def apply_rope(
    q: torch.Tensor,
    k: torch.Tensor,
    rope: RopeConfig,
    offset: int = 0,
    position_ids: Any = None,
    *,
    backend: Optional[str] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Rotates queries ``q`` ``(B, H, T, D)`` and keys ``k`` ``(B, H_kv, T,
    D)`` with ``rope`` (its scaling included) at positions ``offset ..
    offset + T``, or ``position_ids`` (``(B, T)`` or ``(T,)``). Returns new
    tensors ``(q_rot, k_rot)``; differentiable. Equals transformers'
    ``apply_rotary_pos_emb`` with the same config's ``cos`` and ``sin``.

    ``backend``: ``None`` (fused on CPU float32/bfloat16, else torch),
    ``"fused"`` or ``"torch"``."""
    _check4("q", q)
    _check4("k", k)
    if type(rope) is not RopeConfig:
        _check_rope(rope)
    if rope.method is not None:
        raise PosencError(
            f"apply_rope: the rope's scaling has the attention method {rope.method}, which "
            "remaps positions inside attention: use posenc.torch.attention(..., rope=rope)"
        )
    qs, ks = q.shape, k.shape
    if qs[0] != ks[0] or qs[2] != ks[2] or qs[3] != ks[3]:
        raise PosencError(
            f"apply_rope: q {tuple(qs)} and k {tuple(ks)} differ in batch, seq_len or head_dim"
        )
    if q.device != k.device:
        raise PosencError(f"apply_rope: q is on {q.device}, k on {k.device}")
    if rope.rotary_dim > qs[3]:
        raise PosencError(
            f"apply_rope: the rope rotates {rope.rotary_dim} entries, more than head_dim {qs[3]}"
        )
    if q.numel() == 0 or k.numel() == 0:
        # Nothing to rotate (an empty batch, sequence or head): empty
        # tensors back, as transformers' rotation gives.
        _key_ids(offset, position_ids, qs[0], qs[2], q.device)
        return q.clone(), k.clone()
    fused = not _forced_torch(backend) and fused_available(q, k)
    if fused and position_ids is None:
        _check_offset(offset, qs[2])
        ids_host = None
    else:
        ids_host, ids = _key_ids(offset, position_ids, qs[0], qs[2], q.device)
    if fused:
        if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad):
            return _RopeFn.apply(q, k, rope, offset, ids_host)
        return _rope_kernel(q.contiguous(), k.contiguous(), rope, offset, ids_host, False)
    if backend == "fused":
        raise PosencError(
            f"apply_rope: the fused kernels take CPU float32/bfloat16 tensors, got {q.dtype} on {q.device}"
        )
    host = ids.detach().cpu().numpy() if ids_host is None else ids_host
    qc, qs_, kc, ks_ = _tables(rope, host, qs[2], q.device)
    return rotate(q, qc, qs_, rope.layout), rotate(k, kc, ks_, rope.layout)


# ---------------------------------------------------------------- attention


def _alibi_slopes(alibi: Any, heads: int, device: torch.device) -> Optional[torch.Tensor]:
    if alibi is None or alibi is False:
        return None
    if alibi is True:
        return torch.from_numpy(_posenc._alibi_slopes_f32(heads)).to(device)
    s = torch.as_tensor(alibi, dtype=torch.float32).flatten()
    if s.numel() != heads:
        raise PosencError(f"alibi: expected True or {heads} slopes (one per query head), got {s.numel()}")
    if not torch.isfinite(s).all():
        raise PosencError("alibi: every slope must be finite")
    return s.to(device)


def _torch_attention(
    q, k, v, causal, scale, rope, slopes, q_pos, k_pos, ids_host, block=QUERY_BLOCK
):
    """The torch path: rotation by posenc's tables, one softmax per query
    block (float32 arithmetic; float64 for float64 inputs)."""
    b, h, t, d = q.shape
    hk, s = k.shape[1], k.shape[2]
    g = h // hk
    work = torch.float64 if q.dtype == torch.float64 else torch.float32
    if rope is not None:
        host = k_pos.detach().cpu().numpy() if ids_host is None else ids_host
        qc, qs, kc, ks = _tables(rope, host, t, q.device)
        q = rotate(q.to(work), qc, qs, rope.layout)
        k = rotate(k.to(work), kc, ks, rope.layout)
    q, k, v = q.to(work), k.to(work), v.to(work)
    if g > 1:
        k = k.repeat_interleave(g, dim=1)
        v = v.repeat_interleave(g, dim=1)
    outs = []
    shift = s - t
    kidx = torch.arange(s, device=q.device)
    for a in range(0, t, block):
        z = min(t, a + block)
        logits = torch.matmul(q[:, :, a:z], k.transpose(-1, -2)) * scale
        if slopes is not None:
            r = (k_pos[:, None, :] - q_pos[:, a:z, None]).to(work)  # (B, blk, S)
            if not causal:
                r = -r.abs()
            logits = logits + slopes.to(work)[None, :, None, None] * r[:, None]
        if causal:
            qi = torch.arange(a, z, device=q.device)
            hide = kidx[None, :] > (qi[:, None] + shift)
            logits = logits.masked_fill(hide, float("-inf"))
        p = torch.softmax(logits, dim=-1)
        outs.append(torch.matmul(p, v))
    return torch.cat(outs, dim=2)


def _torch_method_attention(q, k, v, rope, block=METHOD_BLOCK, chunk=KEY_CHUNK, softcap=None):
    """A training-free method on the torch path: in each of its ranges,
    queries and keys rotated by posenc's tables for that range; one softmax
    over all ranges (keys outside every range hidden), computed as a
    flash attention in plain PyTorch, so its memory is linear in ``T``.

    Queries run in blocks of ``block`` rows, keys in chunks of ``chunk``:
    a step holds ``(B, H, block, chunk)`` logits, and the chunks' softmax
    sums are merged by a running maximum (the log-sum-exp merge), so no
    ``T × S`` matrix is ever built. Only the chunks a block's ranges reach
    are computed (a causal method skips the keys past each block), and a
    mask is built only where a chunk is not wholly inside a range. The
    keys are rotated once per range at their own ``H_kv`` heads; grouped
    queries share them without a copy (``(B, H_kv, G·block, D)`` rows).
    ``softcap``: Gemma 2's ``cap · tanh(logit / cap)`` on each logit
    before the softmax. Differentiable in ``q``, ``k``, ``v``."""
    b, h, t, d = q.shape
    hk, s = k.shape[1], k.shape[2]
    g = h // hk
    work = torch.float64 if q.dtype == torch.float64 else torch.float32
    views, qscale, logit_scale = rope._method_plan(t, s)
    dev = q.device
    scale = logit_scale / (d**0.5)
    layout = rope.layout
    q, k, v = q.to(work), k.to(work), v.to(work)
    on = lambda a: torch.from_numpy(a).to(dev)  # noqa: E731
    qscale_t = None if bool((qscale == 1.0).all()) else on(qscale).to(work)
    ranges = []
    for qc, qs, kc, ks, lo, hi in views:
        kr = rotate(k, on(kc), on(ks), layout)  # (B, H_kv, S, D), once per range
        ranges.append((on(qc), on(qs), kr, lo, hi, on(lo), on(hi)))
    kidx = torch.arange(s, device=dev)
    neg = torch.finfo(work).min
    grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    inplace = not grad  # without autograd, each step's logits are reused in place
    out = None if grad else torch.empty((b, hk, g, t, d), dtype=work, device=dev)
    outs = []
    for a in range(0, t, block):
        z = min(t, a + block)
        n = z - a
        qb = q[:, :, a:z]
        if qscale_t is not None:
            qb = qb * qscale_t[a:z, None]
        steps = []  # per range: rotated, scaled queries (B, H_kv, G·n, D), keys, lo, hi, key span
        for qc, qs, kr, lo, hi, lo_t, hi_t in ranges:
            lo_b, hi_b = lo[a:z], hi[a:z]
            seen = hi_b > lo_b
            if not seen.any():
                continue
            qr = rotate(qb, qc[:, a:z], qs[:, a:z], layout) * scale
            steps.append((qr.reshape(b, hk, g * n, d), kr, int(lo_b.max()), int(hi_b.min()),
                          lo_t[a:z, None], hi_t[a:z, None], int(lo_b[seen].min()), int(hi_b[seen].max())))
        m = l = acc = None
        k_lo = min((st[6] for st in steps), default=0)
        k_hi = max((st[7] for st in steps), default=0)
        for c0 in range(k_lo, k_hi, chunk):
            c1 = min(k_hi, c0 + chunk)
            logits = None
            for qr, kr, lo_max, hi_min, lo_t, hi_t, r_lo, r_hi in steps:
                if r_hi <= c0 or r_lo >= c1:
                    continue
                lv = torch.matmul(qr, kr[:, :, c0:c1].transpose(-1, -2))
                if softcap is not None:
                    lv = lv.div_(softcap).tanh_().mul_(softcap) if inplace else torch.tanh(lv / softcap) * softcap
                if lo_max <= c0 and hi_min >= c1:
                    logits = lv  # the whole chunk inside this range for every query of the block
                    continue
                ki = kidx[c0:c1][None, :]
                outside = (ki < lo_t) | (ki >= hi_t)  # (n, chunk); the G heads of a key head share it
                lv5 = lv.view(b, hk, g, n, c1 - c0)
                if logits is None:
                    lv5 = lv5.masked_fill_(outside, float("-inf")) if inplace else lv5.masked_fill(outside, float("-inf"))
                else:
                    lv5 = torch.where(outside, logits.view(b, hk, g, n, c1 - c0), lv5)
                logits = lv5.view(b, hk, g * n, c1 - c0)
            if logits is None:
                continue
            top = logits.detach().amax(dim=-1, keepdim=True)  # a stabiliser: the result does not depend on it
            m_new = top if m is None else torch.maximum(m, top)
            m_safe = m_new.clamp(min=neg)  # a row with no key yet: exp(-inf) = 0 everywhere
            p = logits.sub_(m_safe).exp_() if inplace else torch.exp(logits - m_safe)
            pv = torch.matmul(p, v[:, :, c0:c1])
            if m is None:
                l, acc = p.sum(dim=-1, keepdim=True), pv
            else:
                alpha = torch.exp(m - m_safe)
                if inplace:
                    l.mul_(alpha).add_(p.sum(dim=-1, keepdim=True))
                    acc.mul_(alpha).add_(pv)
                else:
                    l = l * alpha + p.sum(dim=-1, keepdim=True)
                    acc = acc * alpha + pv
            m = m_new
        if acc is None:  # no query of the block sees a key
            ob = q.new_zeros((b, hk, g * n, d))
        else:
            ob = acc / torch.where(l > 0, l, torch.ones_like(l))  # a query seeing no key gives 0
        ob = ob.view(b, hk, g, n, d)
        if out is None:
            outs.append(ob)
        else:
            out[:, :, :, a:z] = ob
    if out is None:
        out = torch.cat(outs, dim=3)
    return out.reshape(b, h, t, d)


#: Bytes of logits that fused attention calls waiting for their backward
#: keep by default (``keep_logits=None``), all calls together: a call keeps
#: its own (about ``4·B·H·T·S`` bytes, half that when causal: 71 MB at
#: ``(1, 8, 2048, 64)``) while they fit beside those of the calls before it,
#: else recomputes them. Set it to 0 to keep none.
KEEP_LOGITS_BYTES = 256 << 20


def _keep_bytes(keep_logits: Optional[bool]) -> int:
    """The budget of kept logits for a call (see ``attention``)."""
    if keep_logits is None:
        return max(0, min(int(KEEP_LOGITS_BYTES), (1 << 64) - 1))
    return (1 << 64) - 1 if keep_logits else 0


def _attention_kernel(q, k, v, causal, scale, rope, slopes, offset, ids, keep_bytes=0):
    """The fused forward on contiguous float32 q, k, v: (out, lse, the
    attention tuple the kernels read, kept for the backward, and the logits
    it kept for the backward or None)."""
    b, h, t, _ = q.shape
    out = torch.empty_like(q)
    lse = torch.empty((b, h, t), dtype=torch.float32)
    sl = None if slopes is None else _view(slopes.contiguous())
    attention = (causal, scale, rope, sl, offset, ids)
    kept = _posenc._attention_forward((_view(q), _view(k), _view(v)), _view(out), _view(lse), attention, keep_bytes)
    return out, lse, attention, kept


class _AttentionFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, scale, rope, slopes, offset, ids, keep_bytes):  # type: ignore[override]
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        out, lse, ctx.attention, ctx.kept = _attention_kernel(
            q, k, v, causal, scale, rope, slopes, offset, ids, keep_bytes
        )
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, dout):  # type: ignore[override]
        q, k, v, out, lse = ctx.saved_tensors
        dout = dout.contiguous()
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        # The kept logits serve one backward; a second one (retain_graph)
        # recomputes them. Dropped here, their buffer returns to the pool
        # for the next forward.
        kept, ctx.kept = ctx.kept, None
        _posenc._attention_backward(
            (_view(q), _view(k), _view(v)), _view(out), _view(lse), _view(dout),
            (_view(dq), _view(dk), _view(dv)), ctx.attention, kept,
        )  # fmt: skip
        return dq, dk, dv, None, None, None, None, None, None, None


class _MethodFn(torch.autograd.Function):
    """A method's fused forward; its backward recomputes the torch path.
    With ``bthd`` the kernel writes a ``(B, T, H, D)`` buffer and the output
    is its ``(B, H, T, D)`` view (``transpose(1, 2)`` of it is contiguous:
    what a transformers layer projects from, with no copy)."""

    @staticmethod
    def forward(ctx, q, k, v, rope, bthd=False):  # type: ignore[override]
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        b, h, t, d = q.shape
        buf = torch.empty((b, t, h, d) if bthd else (b, h, t, d), dtype=q.dtype)
        _posenc._method_forward(rope, (_view(q), _view(k), _view(v)), _view(buf), bthd)
        out = buf.transpose(1, 2) if bthd else buf
        ctx.save_for_backward(q, k, v)
        ctx.rope = rope
        return out

    @staticmethod
    def backward(ctx, dout):  # type: ignore[override]
        q, k, v = (x.detach().requires_grad_(True) for x in ctx.saved_tensors)
        with torch.enable_grad():
            out = _torch_method_attention(q, k, v, ctx.rope)
            dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
        return dq, dk, dv, None, None


def _method_fused(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rope: RopeConfig) -> torch.Tensor:
    """A method's fused attention (CPU, checked by the caller) returning
    ``(B, H, T, D)`` as a view of a ``(B, T, H, D)`` buffer in the dtype of
    ``q`` (posenc.hf: the layer's ``transpose(1, 2)`` is then contiguous)."""
    out = _MethodFn.apply(q.float(), k.float(), v.float(), rope, True)
    return out if out.dtype == q.dtype else out.transpose(1, 2).to(q.dtype).transpose(1, 2)


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = True,
    rope: Optional[RopeConfig] = None,
    alibi: Union[None, bool, Sequence[float], torch.Tensor] = None,
    method: Optional[str] = None,
    offset: int = 0,
    position_ids: Any = None,
    scale: Optional[float] = None,
    backend: Optional[str] = None,
    keep_logits: Optional[bool] = None,
) -> torch.Tensor:
    """Scaled-dot-product attention with posenc's position encodings inside.

    ``q`` ``(B, H, T, D)``; ``k``, ``v`` ``(B, H_kv, S, D)`` (``H_kv``
    divides ``H``; ``T <= S``). ``rope``: a ``RopeConfig`` (its scaling
    included) rotating queries and keys at their positions inside the
    kernel. ``alibi``: ``True`` for Press et al.'s slopes over ``H`` heads, or
    ``H`` slopes (``m·(j − i)`` when causal, ``−m·|j − i|`` otherwise).
    ``method``: a training-free method by name (or one set on ``rope`` by
    ``with_scaling``). ``scale`` defaults to ``1/√D``. Returns ``(B, H, T,
    D)`` in the dtype of ``q``; differentiable in ``q``, ``k``, ``v``.

    ``backend``: ``None`` (fused on CPU float32/bfloat16, else torch),
    ``"fused"`` or ``"torch"``.

    ``keep_logits`` (fused path, when a gradient is wanted): the forward
    keeps the logits for the backward, which then skips one of its five
    products (some 7% of a causal forward + backward), for ``4·B·H·T·S``
    bytes (about half when causal) held until the backward. ``None`` keeps
    them while the calls awaiting their backward keep at most
    ``KEEP_LOGITS_BYTES`` (256 MiB) in all; ``True`` always; ``False``
    never (memory linear in ``T``). The gradients are the same either
    way."""
    if keep_logits not in (None, True, False):
        raise PosencError(f"keep_logits: expected None, True or False, got {keep_logits!r}")
    for name, x in (("q", q), ("k", k), ("v", v)):
        _check4(name, x)
    b, h, t, d = q.shape
    if k.shape != v.shape:
        raise PosencError(f"v: expected the shape of k {tuple(k.shape)}, got {tuple(v.shape)}")
    bk, hk, s, dk = k.shape
    if bk != b or dk != d:
        raise PosencError(f"k: expected batch {b} and head_dim {d} as q {tuple(q.shape)}, got {tuple(k.shape)}")
    if hk == 0 or h % hk != 0:
        raise PosencError(f"attention: {hk} key/value heads do not divide {h} query heads")
    if t > s:
        raise PosencError(f"attention: {t} queries but only {s} keys (T <= S)")
    if not (q.device == k.device == v.device):
        raise PosencError(f"attention: q, k, v on {q.device}, {k.device}, {v.device}")
    if scale is not None:
        try:
            scale = float(scale)
        except (TypeError, ValueError):
            raise PosencError(f"scale: expected a number, got {scale!r}") from None
        if not np.isfinite(scale):
            raise PosencError(f"scale must be finite, got {scale}")
    if rope is not None:
        rope = _check_rope(rope)
        if rope.rotary_dim > d:
            raise PosencError(f"attention: the rope rotates {rope.rotary_dim} entries, more than head_dim {d}")
    if method is not None:
        if rope is None:
            raise PosencError(f"method {method!r} needs rope= (the model's RoPE it remaps)")
        if rope.method is not None:
            raise PosencError(f"method {method!r}: the rope already has the method {rope.method}")
        rope = rope.with_scaling(method if rope.scaling in (None, "model") else f"{method}+{rope.scaling}")
    forced = _forced_torch(backend)
    fused = not forced and fused_available(q, k, v)
    if backend == "fused" and not fused:
        raise PosencError(
            f"attention: the fused kernels take CPU float32/bfloat16 tensors, got {q.dtype} on {q.device}"
        )

    if rope is not None and rope.method is not None:
        if not causal or alibi not in (None, False) or position_ids is not None or offset != 0 or scale is not None:
            raise PosencError(
                f"method {rope.method}: causal only, keys numbered from 0; no alibi, position_ids, offset or scale"
            )
        if fused:
            out = _MethodFn.apply(q.float(), k.float(), v.float(), rope)
            return out.to(q.dtype)
        return _torch_method_attention(q, k, v, rope).to(q.dtype)

    slopes = _alibi_slopes(alibi, h, q.device)
    if fused and position_ids is None:
        _check_offset(offset, s)
        ids_host = None
    else:
        ids_host, k_pos = _key_ids(offset, position_ids, b, s, q.device)
    if fused:
        args = (causal, scale, rope, slopes, offset, ids_host)
        if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
            return _AttentionFn.apply(q.float(), k.float(), v.float(), *args, _keep_bytes(keep_logits)).to(q.dtype)
        return _attention_kernel(q.float().contiguous(), k.float().contiguous(), v.float().contiguous(), *args)[0].to(q.dtype)
    q_pos = k_pos[:, s - t :]
    sc = scale if scale is not None else 1.0 / (d**0.5)
    return _torch_attention(q, k, v, causal, sc, rope, slopes, q_pos, k_pos, ids_host).to(q.dtype)
