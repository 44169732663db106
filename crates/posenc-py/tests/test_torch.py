"""posenc.torch against a plain-PyTorch reference (float64, transformers'
`rotate_half` rotation with posenc's cos/sin tables, an explicit logits
matrix and softmax), values and gradients, on the fused path and on the
pure-PyTorch path; the training-free methods against their authors' code
(the outputs of `scripts/methods/hf_methods.py attention`); no copy of
contiguous CPU inputs; bad inputs raise PosencError."""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import posenc  # noqa: E402
import posenc.torch as pt  # noqa: E402
from conftest import METHOD_FIXTURES, load  # noqa: E402

SCALINGS = ["model", "none", "linear:2", "dynamic:2", "ntk:2", "yarn:2"]
BACKENDS = ["fused", "torch"]


def base_rope(layout="half-split", dim=16, mpe=16):
    return posenc.RopeConfig.plain(10000.0, dim, layout=layout, max_position_embeddings=mpe)


def rotate_ref(x, rope, pos):
    """transformers' apply_rotary_pos_emb (float64) with the config's own
    full-width tables at positions `pos` (B, T)."""
    b, h, t, d = x.shape
    seq = int(pos.max()) + 1
    c, s = rope.cos_sin(pos.reshape(-1).tolist(), dtype="float64", seq_len=seq)
    c = torch.from_numpy(c).view(b, 1, t, -1)
    s = torch.from_numpy(s).view(b, 1, t, -1)
    rd = c.shape[-1]
    xr, rest = x[..., :rd].double(), x[..., rd:].double()
    if rope.layout == "half-split":
        x1, x2 = xr[..., : rd // 2], xr[..., rd // 2 :]
        rot = torch.cat((-x2, x1), dim=-1)
    else:
        x1, x2 = xr[..., 0::2], xr[..., 1::2]
        rot = torch.stack((-x2, x1), dim=-1).flatten(-2)
    return torch.cat((xr * c + rot * s, rest), dim=-1)


def attention_ref(q, k, v, causal=True, rope=None, slopes=None, kpos=None, scale=None):
    b, h, t, d = q.shape
    hk, s = k.shape[1], k.shape[2]
    if kpos is None:
        kpos = torch.arange(s).expand(b, s)
    qpos = kpos[:, s - t :]
    q, k, v = q.double(), k.double(), v.double()
    if rope is not None:
        seq = int(kpos.max()) + 1
        # one frequency table for the call's length (dynamic scalings)
        q = rotate_ref_at(q, rope, qpos, seq)
        k = rotate_ref_at(k, rope, kpos, seq)
    g = h // hk
    k = k.repeat_interleave(g, 1)
    v = v.repeat_interleave(g, 1)
    sc = (1.0 / math.sqrt(d)) if scale is None else scale
    logits = q @ k.transpose(-1, -2) * sc
    if slopes is not None:
        r = (kpos[:, None, :] - qpos[:, :, None]).double()
        if not causal:
            r = -r.abs()
        logits = logits + torch.as_tensor(slopes, dtype=torch.float64)[None, :, None, None] * r[:, None]
    if causal:
        i = torch.arange(t)[:, None]
        j = torch.arange(s)[None, :]
        logits = logits.masked_fill(j > i + (s - t), float("-inf"))
    return torch.softmax(logits, -1) @ v


def rotate_ref_at(x, rope, pos, seq):
    b, h, t, d = x.shape
    c, s = rope.cos_sin(pos.reshape(-1).tolist(), dtype="float64", seq_len=seq)
    c = torch.from_numpy(c).view(b, 1, t, -1)
    s = torch.from_numpy(s).view(b, 1, t, -1)
    rd = c.shape[-1]
    xr, rest = x[..., :rd], x[..., rd:]
    if rope.layout == "half-split":
        rot = torch.cat((-xr[..., rd // 2 :], xr[..., : rd // 2]), dim=-1)
    else:
        rot = torch.stack((-xr[..., 1::2], xr[..., 0::2]), dim=-1).flatten(-2)
    return torch.cat((xr * c + rot * s, rest), dim=-1)


def close(a, b, rel=1e-5):
    a, b = a.double(), b.double()
    scale = max(b.abs().max().item(), 1e-6)
    err = (a - b).abs().max().item()
    assert err <= rel * scale, f"max |diff| {err:.3g} > {rel} × {scale:.3g}"


def inputs(b=2, h=4, hk=2, t=24, s=None, d=16, seed=0, grad=True):
    g = torch.Generator().manual_seed(seed)
    s = t if s is None else s
    q = torch.randn(b, h, t, d, generator=g)
    k = torch.randn(b, hk, s, d, generator=g)
    v = torch.randn(b, hk, s, d, generator=g)
    return [x.requires_grad_(grad) for x in (q, k, v)]


def grads(out, xs, seed=1):
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return torch.autograd.grad(out, xs, g.to(out.dtype))


# ---------------------------------------------------------------- apply_rope


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("scaling", SCALINGS)
def test_apply_rope_equals_reference_values_and_grads(scaling, backend):
    rope = base_rope().with_scaling(scaling)
    q, k, _ = inputs(t=40)
    for offset in (0, 7):
        qr, kr = pt.apply_rope(q, k, rope, offset=offset, backend=backend)
        pos = torch.arange(offset, offset + 40).expand(2, 40)
        seq = offset + 40
        qw, kw = rotate_ref_at(q.double(), rope, pos, seq), rotate_ref_at(k.double(), rope, pos, seq)
        close(qr, qw)
        close(kr, kw)
        gq, gk = grads(qr.sum() * 0 + (qr * qw.float().detach()).sum() + (kr * 2).sum(), (q, k))
        gqw, gkw = grads((qw * qw.detach()).sum() + (kw * 2).sum(), (q, k))
        close(gq, gqw)
        close(gk, gkw)


@pytest.mark.parametrize("backend", BACKENDS)
def test_apply_rope_position_ids_interleaved_partial(backend):
    rope = posenc.RopeConfig.plain(500.0, 8, layout="interleaved", head_dim=12, max_position_embeddings=64)
    q, k, _ = inputs(t=10, d=12)
    ids = torch.tensor([[5, 3, 9, 0, 1, 2, 40, 41, 42, 7], [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]])
    qr, kr = pt.apply_rope(q, k, rope, position_ids=ids, backend=backend)
    close(qr, rotate_ref_at(q.double(), rope, ids, 43))
    close(kr, rotate_ref_at(k.double(), rope, ids, 43))
    # the last 4 entries (past rotary_dim 8) pass through
    assert torch.equal(qr[..., 8:], q[..., 8:])


def test_apply_rope_bfloat16_fused_equals_torch_path():
    rope = base_rope().with_scaling("yarn:2")
    q, k, _ = inputs(t=33, grad=False)
    qb, kb = q.bfloat16(), k.bfloat16()
    a = pt.apply_rope(qb, kb, rope)
    b = pt.apply_rope(qb, kb, rope, backend="torch")
    assert a[0].dtype == torch.bfloat16
    # both round one float32 rotation to bfloat16
    assert (a[0].float() - b[0].float()).abs().max().item() <= 2 ** -7 * b[0].abs().max().item()


def test_apply_rope_equals_transformers_formula_on_llama3():
    """transformers' apply_rotary_pos_emb with the cos/sin of the same
    config, in float32."""
    rope = posenc.RopeConfig.from_hf(
        {"model_type": "llama", "hidden_size": 256, "num_attention_heads": 4, "max_position_embeddings": 2048,
         "rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
         "high_freq_factor": 4.0, "original_max_position_embeddings": 256}}
    )
    q, k, _ = inputs(t=64, d=64, grad=False)
    c, s = (torch.from_numpy(x)[None, None] for x in rope.cos_sin(list(range(64))))

    def rotate_half(x):
        return torch.cat((-x[..., 32:], x[..., :32]), dim=-1)

    close(pt.apply_rope(q, k, rope)[0], q * c + rotate_half(q) * s, rel=2e-6)


# ---------------------------------------------------------------- attention


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("scaling", SCALINGS)
def test_attention_rope_each_scaling(scaling, backend):
    rope = base_rope().with_scaling(scaling)
    q, k, v = inputs(t=40)
    out = pt.attention(q, k, v, rope=rope, backend=backend)
    ref = attention_ref(q, k, v, rope=rope)
    close(out, ref)
    for a, b in zip(grads(out, (q, k, v)), grads(ref, (q, k, v))):
        close(a, b)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("causal", [True, False])
def test_attention_alibi_gqa_offset_kv_cache(backend, causal):
    q, k, v = inputs(b=2, h=6, hk=2, t=9, s=30)
    slopes = posenc.alibi_slopes(6)
    for offset in (0, 100):
        out = pt.attention(q, k, v, causal=causal, alibi=True, offset=offset, backend=backend)
        kpos = torch.arange(offset, offset + 30).expand(2, 30)
        ref = attention_ref(q, k, v, causal=causal, slopes=slopes, kpos=kpos)
        close(out, ref)
        for a, b in zip(grads(out, (q, k, v)), grads(ref, (q, k, v))):
            close(a, b)


@pytest.mark.parametrize("backend", BACKENDS)
def test_attention_rope_alibi_position_ids_and_scale(backend):
    rope = base_rope(mpe=64).with_scaling("dynamic:2")
    q, k, v = inputs(b=2, h=4, hk=1, t=12, s=12)
    ids = torch.stack([torch.arange(12) * 3, torch.arange(12) + 50])
    out = pt.attention(q, k, v, rope=rope, alibi=[0.5, 0.25, 0.1, 0.0], position_ids=ids, scale=0.3, backend=backend)
    ref = attention_ref(q, k, v, rope=rope, slopes=[0.5, 0.25, 0.1, 0.0], kpos=ids, scale=0.3)
    close(out, ref)
    for a, b in zip(grads(out, (q, k, v)), grads(ref, (q, k, v))):
        close(a, b)


def test_attention_torch_path_blocks_equal_one_block():
    rope = base_rope().with_scaling("yarn:2")
    q, k, v = inputs(t=50, grad=False)
    a = pt._torch_attention(q, k, v, True, 0.25, rope, None, torch.arange(50).expand(2, 50), torch.arange(50).expand(2, 50), None, block=7)
    b = pt._torch_attention(q, k, v, True, 0.25, rope, None, torch.arange(50).expand(2, 50), torch.arange(50).expand(2, 50), None, block=1024)
    close(a, b, rel=1e-6)



@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("nf", [8, 4])
def test_rotate_without_autograd_is_the_autograd_arithmetic(dtype, nf):
    """rotate's in-place form (no autograd: one output, no cat) gives the
    very bits of its differentiable form, partial rotation and broadcast
    tables included, on contiguous and sliced inputs."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 3, 9, 16, generator=g).to(dtype)
    for c, s in [(torch.randn(2, 9, nf, generator=g), torch.randn(2, 9, nf, generator=g)),
                 (torch.randn(1, 9, nf, generator=g), torch.randn(1, 9, nf, generator=g))]:
        for xi, ci, si in [(x, c, s), (x[:, :, 2:7], c[:, 2:7], s[:, 2:7])]:
            with torch.no_grad():
                fast = pt.rotate(xi, ci, si, "half-split")
            slow = pt.rotate(xi.detach().clone().requires_grad_(True), ci, si, "half-split")
            assert fast.dtype == slow.dtype == dtype and fast.shape == slow.shape
            assert torch.equal(fast, slow.detach())

def method_ref(q, k, v, rope, softcap=None):
    """A method in float64 written out: each range's queries and keys
    rotated by posenc's plan tables, every logit of the (T, S) matrix, one
    softmax (a query seeing no key gives 0)."""
    b, h, t, d = q.shape
    s = k.shape[2]
    views, qscale, logit_scale = rope._method_plan(t, s)
    g = h // k.shape[1]
    q, k, v = q.double(), k.double().repeat_interleave(g, 1), v.double().repeat_interleave(g, 1)
    q = q * torch.from_numpy(qscale).double()[None, None, :, None]
    lg = torch.full((b, h, t, s), float("-inf"), dtype=torch.float64)
    kidx = torch.arange(s)
    for qc, qs, kc, ks, lo, hi in views:
        d64 = lambda a: torch.from_numpy(a).double()  # noqa: E731
        x = pt.rotate(q, d64(qc), d64(qs), rope.layout) @ pt.rotate(k, d64(kc), d64(ks), rope.layout).transpose(-1, -2)
        x = x * logit_scale / math.sqrt(d)
        if softcap is not None:
            x = torch.tanh(x / softcap) * softcap
        inside = (kidx[None, :] >= torch.from_numpy(lo)[:, None]) & (kidx[None, :] < torch.from_numpy(hi)[:, None])
        lg = torch.where(inside, x, lg)
    return torch.nan_to_num(torch.softmax(lg, -1), nan=0.0) @ v


@pytest.mark.parametrize("spec", ["self-extend:4:8", "rerope:8", "leaky-rerope:8:2", "dca:12:4", "sinks:2:10",
                                  "self-extend:2:8+yarn:2"])
@pytest.mark.parametrize("t,s", [(50, 50), (9, 50), (1, 50)])
def test_method_torch_path_key_chunks_equal_one_softmax(spec, t, s):
    """The torch path's flash attention (query blocks by key chunks, merged
    by a running log-sum-exp) equals one softmax over the whole logits
    matrix, for blocks and chunks that cut every range (and a chunk of one
    key), prefill and the last queries of a cache, with Gemma 2's
    soft-capping; the float64 gradient too."""
    rope = base_rope(mpe=16).with_scaling(spec)
    g = torch.Generator().manual_seed(5)
    q = torch.randn(2, 6, t, 16, generator=g, dtype=torch.float64)
    k, v = (torch.randn(2, 2, s, 16, generator=g, dtype=torch.float64) for _ in range(2))
    for block, chunk in [(5, 7), (3, 1), (64, 64)]:
        for cap in (None, 2.0):
            with torch.no_grad():
                got = pt._torch_method_attention(q, k, v, rope, block=block, chunk=chunk, softcap=cap)
            assert (got - method_ref(q, k, v, rope, cap)).abs().max().item() < 1e-12
    qg, kg, vg = (x.clone().requires_grad_(True) for x in (q, k, v))
    got = pt._torch_method_attention(qg, kg, vg, rope, block=4, chunk=6)
    want = method_ref(qg, kg, vg, rope)
    for a, b in zip(grads(got, (qg, kg, vg)), grads(want, (qg, kg, vg))):
        assert (a - b).abs().max().item() < 1e-10


def test_method_torch_path_never_holds_the_logits_matrix():
    """Every tensor the torch path's method attention creates is at most
    the size of its inputs or of one block by one chunk: nothing of size
    T × S per head (the logits matrix), however long the input."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Largest(TorchDispatchMode):
        most = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for o in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(o, torch.Tensor):
                    Largest.most = max(Largest.most, o.numel())
            return out

    rope = base_rope(dim=8, mpe=16).with_scaling("self-extend:4:32")
    t, h, d = 768, 4, 8
    q = torch.randn(1, h, t, d)
    k, v = torch.randn(1, 2, t, d), torch.randn(1, 2, t, d)
    with torch.no_grad(), Largest():
        out = pt._torch_method_attention(q, k, v, rope, block=32, chunk=64)
    assert Largest.most <= max(q.numel(), h * 32 * 64)
    assert Largest.most * 16 < h * t * t  # the logits matrix would be 2,359,296 floats
    assert (out - method_ref(q, k, v, rope).float()).abs().max().item() < 1e-5

METHODS = load(METHOD_FIXTURES / "attention.json")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("spec", [m for m in METHODS["methods"] if m != "plain"])
def test_methods_equal_their_authors_code(spec, backend):
    """The outputs of the authors' code ported in scripts/methods/hf_methods.py
    (q/k/v and outputs in crates/posenc-models/tests/fixtures/methods/attention.json):
    trained length 16 for ReRoPE's log-n, max_position_embeddings 32 for DCA."""
    sh = METHODS["settings"]["shapes"]
    t, h, hk, d = sh["T"], sh["heads"], sh["kv_heads"], sh["head_dim"]
    q = torch.tensor(METHODS["q"]).view(1, h, t, d)
    k = torch.tensor(METHODS["k"]).view(1, hk, t, d)
    v = torch.tensor(METHODS["v"]).view(1, hk, t, d)
    mpe = 32 if spec.startswith("dca") else 16
    rope = posenc.RopeConfig.plain(10000.0, d, max_position_embeddings=mpe)
    try:
        m = rope.with_scaling(spec)
    except posenc.PosencError as e:
        # Self-Extend with a window its group does not divide: posenc
        # refuses what the authors' code rounds (their float shift).
        assert spec == "self-extend:3:10" and "divide" in str(e)
        return
    want = torch.tensor(METHODS["methods"][spec]["output"]).view(1, h, t, d)
    out = pt.attention(q, k, v, rope=m, backend=backend)
    close(out, want, rel=2e-5)
    # the same through method=
    close(pt.attention(q, k, v, rope=rope, method=spec, backend=backend), want, rel=2e-5)


@pytest.mark.parametrize("spec", ["self-extend:4:8", "rerope:8", "leaky-rerope:8:2", "dca:12:4", "sinks:2:10"])
def test_method_gradients(spec):
    """The methods' gradient (the torch path's, also behind the fused
    forward) is the true gradient of their forward: gradcheck in float64,
    and the fused path's gradient equals it."""
    rope = posenc.RopeConfig.plain(10000.0, 8, max_position_embeddings=8).with_scaling(spec)
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 20, 8, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    assert torch.autograd.gradcheck(lambda a, b, c: pt.attention(a, b, c, rope=rope, backend="torch"), (q, k, v), fast_mode=True)
    q32, k32, v32 = (x.detach().float().requires_grad_(True) for x in (q, k, v))
    out = pt.attention(q32, k32, v32, rope=rope)
    ref = pt.attention(q, k, v, rope=rope, backend="torch")
    close(out, ref)
    for a, b in zip(grads(out, (q32, k32, v32)), grads(ref.float(), (q, k, v))):
        close(a, b, rel=2e-5)


def test_method_window_covering_input_is_plain_attention():
    rope = base_rope(mpe=64)
    q, k, v = inputs(t=30, grad=False)
    plain = pt.attention(q, k, v, rope=rope)
    for spec in ["self-extend:4:64", "rerope:64", "sinks:4:64"]:
        close(pt.attention(q, k, v, rope=rope, method=spec), plain, rel=2e-6)


def test_method_fused_writes_the_layers_layout():
    """posenc.hf's entry: the kernel writes (B, T, H, D), returned as its
    (B, H, T, D) view, the bits of ``attention`` (merged ranges and the one
    range of a covering window alike); transpose(1, 2) is the buffer itself."""
    rope = base_rope(mpe=64)
    q, k, v = inputs(t=70, grad=False)
    for spec in ["self-extend:4:16", "self-extend:4:512", "sinks:4:32", "dca:48:16"]:
        r = rope.with_scaling(spec)
        out = pt._method_fused(q, k, v, r)
        assert out.shape == q.shape
        layer = out.transpose(1, 2)
        assert layer.is_contiguous()
        assert layer.contiguous().data_ptr() == layer.data_ptr()
        assert torch.equal(out, pt.attention(q, k, v, rope=r)), spec


# ---------------------------------------------------------------- no copy


def test_fused_ops_read_and_write_the_tensors_memory():
    rope = base_rope()
    q, k, v = inputs(grad=False)
    pt._TRACE = []
    try:
        qr, kr = pt.apply_rope(q, k, rope)
        tr = list(pt._TRACE)
        # q, its output, k, its output: each view's pointer is the tensor's
        assert tr[0] == (q.data_ptr(), q.data_ptr())
        assert tr[1] == (qr.data_ptr(), qr.data_ptr())
        assert tr[2] == (k.data_ptr(), k.data_ptr())
        assert tr[3] == (kr.data_ptr(), kr.data_ptr())
        pt._TRACE = []
        out = pt.attention(q, k, v, rope=rope)
        tr = list(pt._TRACE)
        assert [p for p, _ in tr[:4]] == [q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr()]
        assert all(a == b for a, b in tr)
        pt._TRACE = []
        qb, kb = q.bfloat16(), k.bfloat16()
        pt.apply_rope(qb, kb, rope)
        assert pt._TRACE[0] == (qb.data_ptr(), qb.data_ptr())
    finally:
        pt._TRACE = None


def test_non_contiguous_inputs_are_made_contiguous_once():
    rope = base_rope()
    q, k, _ = inputs(grad=False)
    qt = q.transpose(1, 2).contiguous().transpose(1, 2)  # (B, H, T, D) view of a (B, T, H, D) buffer
    assert not qt.is_contiguous()
    a = pt.apply_rope(qt, k, rope)[0]
    b = pt.apply_rope(q, k, rope)[0]
    assert torch.equal(a, b)


# ---------------------------------------------------------------- kept logits


def live_kept():
    return posenc._posenc._kept_pool_bytes()[0]


KEPT_CASES = {
    "rope-yarn": dict(kw=lambda: dict(rope=base_rope().with_scaling("yarn:2")), shape=dict(t=40)),
    "alibi-gqa-offset-causal": dict(kw=lambda: dict(alibi=True, offset=100), shape=dict(b=2, h=6, hk=2, t=9, s=30)),
    "alibi-bidirectional": dict(kw=lambda: dict(alibi=True, causal=False), shape=dict(b=2, h=6, hk=3, t=20, s=33)),
    "rope-position-ids": dict(
        kw=lambda: dict(rope=base_rope(mpe=64), position_ids=torch.stack([torch.arange(12) * 3, torch.arange(12) + 50])),
        shape=dict(b=2, h=4, hk=1, t=12, s=12),
    ),
    # more than 1,024 keys: the forward's long tiles
    "rope-long": dict(kw=lambda: dict(rope=base_rope(dim=8, mpe=2048)), shape=dict(b=1, h=2, hk=1, t=1100, d=8)),
}


@pytest.mark.parametrize("case", list(KEPT_CASES))
def test_kept_logits_give_the_recomputed_gradients_bit_for_bit(case):
    c = KEPT_CASES[case]
    q, k, v = inputs(**c["shape"])
    before = live_kept()
    kept = pt.attention(q, k, v, keep_logits=True, **c["kw"]())
    assert live_kept() > before  # held from the forward ...
    gk = grads(kept, (q, k, v))
    assert live_kept() == before  # ... to the backward, then given back
    recomputed = pt.attention(q, k, v, keep_logits=False, **c["kw"]())
    assert live_kept() == before
    assert torch.equal(kept, recomputed)
    for a, b in zip(gk, grads(recomputed, (q, k, v))):
        assert torch.equal(a, b)


def test_a_second_backward_recomputes_the_logits_it_gave_back():
    q, k, v = inputs(t=40)
    out = pt.attention(q, k, v, rope=base_rope(), keep_logits=True)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(3))
    first = torch.autograd.grad(out, (q, k, v), g, retain_graph=True)
    assert live_kept() == 0
    second = torch.autograd.grad(out, (q, k, v), g)
    for a, b in zip(first, second):
        assert torch.equal(a, b)


def test_kept_logits_stay_within_their_budget():
    q, k, v = inputs(b=1, h=2, hk=1, t=64)
    budget = pt.KEEP_LOGITS_BYTES
    try:
        pt.KEEP_LOGITS_BYTES = 0
        out = pt.attention(q, k, v)
        assert live_kept() == 0
        grads(out, (q, k, v))
        # one call's logits: (B, H) pairs × rows × 128-key tiles × 4 bytes
        one = 2 * 64 * 128 * 4
        x = pt.attention(q, k, v, keep_logits=True)
        assert live_kept() >= one  # (an idle buffer may be larger)
        del x
        assert live_kept() == 0  # dropped with the graph
        # room for one call's logits: the first keeps, the second recomputes
        pt.KEEP_LOGITS_BYTES = one + one // 2
        a = pt.attention(q, k, v)
        one = live_kept()
        assert 0 < one <= pt.KEEP_LOGITS_BYTES
        b = pt.attention(q, k, v)
        assert live_kept() == one
        ga, gb = grads(a, (q, k, v)), grads(b, (q, k, v))
        assert live_kept() == 0
        for x, y in zip(ga, gb):
            assert torch.equal(x, y)
        # without a gradient nothing is kept
        with torch.no_grad():
            pt.attention(q, k, v, keep_logits=True)
        assert live_kept() == 0
    finally:
        pt.KEEP_LOGITS_BYTES = budget
    live, idle = posenc._posenc._kept_pool_bytes()
    assert live + idle <= 256 << 20


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "call, words",
    [
        (lambda q, k, v, r: pt.apply_rope(q[0], k, r), "4-d"),
        (lambda q, k, v, r: pt.apply_rope(q.long(), k, r), "floating-point"),
        (lambda q, k, v, r: pt.apply_rope(q, k, "yarn:2"), "RopeConfig"),
        (lambda q, k, v, r: pt.apply_rope(q, k[:, :, :5], r), "differ"),
        (lambda q, k, v, r: pt.apply_rope(q, k, r, offset=-1), "offset"),
        (lambda q, k, v, r: pt.apply_rope(q, k, r, position_ids=torch.zeros(3, 24, dtype=torch.long)), "position_ids"),
        (lambda q, k, v, r: pt.apply_rope(q, k, r, position_ids=-torch.ones(24, dtype=torch.long)), ">= 0"),
        (lambda q, k, v, r: pt.apply_rope(q, k, r.with_scaling("rerope:8")), "attention method"),
        (lambda q, k, v, r: pt.apply_rope(q.double(), k.double(), r, backend="fused"), "fused kernels"),
        (lambda q, k, v, r: pt.attention(q, k, v[:, :, :3]), "shape of k"),
        (lambda q, k, v, r: pt.attention(q[:, :3], k, v), "do not divide"),
        (lambda q, k, v, r: pt.attention(q, k[:, :, :4], v[:, :, :4]), "T <= S"),
        (lambda q, k, v, r: pt.attention(q, k, v, method="self-extend:4:8"), "needs rope"),
        (lambda q, k, v, r: pt.attention(q, k, v, rope=r, method="bogus:1"), "unknown"),
        (lambda q, k, v, r: pt.attention(q, k, v, rope=r, method="rerope:8", causal=False), "causal only"),
        (lambda q, k, v, r: pt.attention(q, k, v, alibi=[1.0]), "slopes"),
        (lambda q, k, v, r: pt.attention(q, k, v, scale=float("nan")), "finite"),
        (lambda q, k, v, r: pt.attention(q, k, v, scale="x"), "scale: expected a number"),
        # the last key's position past an int64's, on each path
        (lambda q, k, v, r: pt.apply_rope(q, k, r, offset=2**63 - 3), "past an int64"),
        (lambda q, k, v, r: pt.apply_rope(q, k, r, offset=2**64), "past an int64"),
        (lambda q, k, v, r: pt.apply_rope(q, k, r, offset=2**63 - 3, backend="torch"), "past an int64"),
        (lambda q, k, v, r: pt.attention(q, k, v, rope=r, offset=2**63 - 3), "past an int64"),
        (lambda q, k, v, r: pt.attention(q, k, v, alibi=True, offset=2**63 - 3), "past an int64"),
        (lambda q, k, v, r: pt.attention(q, k, v, alibi=True, offset=2**63 - 3, backend="torch"), "past an int64"),
        (lambda q, k, v, r: pt.attention(q, k.to("meta"), v.to("meta")), "on cpu"),
        (lambda q, k, v, r: pt.attention(q, k, v, backend="gpu"), "backend"),
        (lambda q, k, v, r: pt.attention(q, k, v, keep_logits="yes"), "keep_logits"),
    ],
)
def test_bad_inputs_raise_posenc_error(call, words):
    q, k, v = inputs(grad=False)
    with pytest.raises(posenc.PosencError) as e:
        call(q, k, v, base_rope())
    assert words in str(e.value)
    assert "\n" not in str(e.value)


def test_the_last_int64_position_is_served_and_the_kernel_checks_it_too():
    q, k, v = inputs(grad=False)
    t = q.shape[2]
    a = pt.attention(q, k, v, alibi=True, offset=2**63 - t)
    b = pt.attention(q, k, v, alibi=True, offset=2**63 - t, backend="torch")
    assert torch.allclose(a, b, rtol=1e-5, atol=1e-6)
    assert torch.equal(a, pt.attention(q, k, v, alibi=True))  # ALiBi sees only differences
    # Below the Python checks, the library refuses it in its own words.
    with pytest.raises(posenc.PosencError, match="an i64"):
        posenc._posenc._attention_forward(
            (q.numpy(), k.numpy(), v.numpy()), np.empty(q.shape, np.float32), np.empty(q.shape[:3], np.float32),
            (True, None, None, posenc._posenc._alibi_slopes_f32(4), 2**63 - 3, None),
        )


def test_empty_tensors_rotate_to_empty_tensors():
    rope = base_rope()
    for shape in [(0, 4, 24, 16), (2, 4, 0, 16), (2, 0, 24, 16)]:
        q = torch.randn(shape)
        k = torch.randn(shape[0], 2 if shape[1] else 0, shape[2], shape[3])
        for backend in (None, "torch"):
            qr, kr = pt.apply_rope(q, k, rope, backend=backend)
            assert qr.shape == q.shape and kr.shape == k.shape
    with pytest.raises(posenc.PosencError, match="offset"):
        pt.apply_rope(torch.randn(2, 4, 0, 16), torch.randn(2, 2, 0, 16), rope, offset=-1)


def test_kernel_errors_reach_python_with_the_library_words():
    rope = posenc.RopeConfig.plain(10000.0, 32)
    q, k, v = inputs(grad=False)  # head_dim 16 < rotary_dim 32
    with pytest.raises(posenc.PosencError, match="rotates 32 entries"):
        pt.apply_rope(q, k, rope)
    with pytest.raises(posenc.PosencError, match="null buffer"):
        posenc._posenc._rope_ptr(base_rope(), False, 0, 0, (2, 4, 24, 16), 0, 0, (2, 2, 24, 16), 0, None, False)
    with pytest.raises(posenc.PosencError, match="too many elements"):
        big = (1 << 20, 1 << 20, 1 << 20, 16)
        posenc._posenc._rope_ptr(base_rope(), False, 8, 8, big, 8, 8, big, 0, None, False)
    with pytest.raises(posenc.PosencError, match="not contiguous"):
        posenc._posenc._attention_forward(
            (q.numpy()[:, :, ::2], k.numpy()[:, :, ::2], v.numpy()[:, :, ::2]), np.empty((2, 4, 12, 16), np.float32),
            np.empty((2, 4, 12), np.float32), (True, None, None, None, 0, None),
        )
