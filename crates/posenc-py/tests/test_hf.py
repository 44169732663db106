"""posenc.hf on tiny random transformers models (no download).

Each architecture is built from its config class (seeded, 2 layers, hidden
64, 4 heads, 2 key/value heads); the logits are checked against the model
itself (a window covering the input changes nothing, remove restores every
bit, prefill equals token-by-token decoding), against transformers' own
scaled config (yarn, dynamic), and against a float64 reference attention
written here on posenc's method plan (queries and keys rotated at each
range's remapped positions, one softmax)."""

import copy
import warnings

import pytest

torch = pytest.importorskip("torch")
tf = pytest.importorskip("transformers")

import posenc  # noqa: E402
import posenc.hf as ph  # noqa: E402
import posenc.torch as pt  # noqa: E402

warnings.filterwarnings("ignore")
tf.logging.set_verbosity_error()

COMMON = dict(
    hidden_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    num_hidden_layers=2,
    intermediate_size=128,
    vocab_size=100,
    max_position_embeddings=64,
)
IDS = dict(pad_token_id=0, eos_token_id=1, bos_token_id=2)
GEMMA = dict(head_dim=16, layer_types=["sliding_attention", "full_attention"], sliding_window=8, **IDS)
ARCHS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 16}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": None}),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {"partial_rotary_factor": 0.5, **IDS}),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", {**GEMMA, "attn_logit_softcapping": 2.0}),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", GEMMA),
}
COVER = ["self-extend:2:64", "rerope:64", "leaky-rerope:64:4", "dca:64:8", "sinks:4:64"]
ACTIVE = ["self-extend:2:8", "rerope:8", "leaky-rerope:8:4", "dca:16:4", "sinks:2:8"]


def build(arch, **over):
    cname, mname, extra = ARCHS[arch]
    cfg = getattr(tf, cname)(**{**COMMON, **extra, **over})
    torch.manual_seed(0)
    return getattr(tf, mname)(cfg).eval()


def tokens(n, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 100, (1, n), generator=g)


@torch.no_grad()
def logits(model, ids):
    return model(ids).logits


@torch.no_grad()
def decoded(model, ids):
    cache = tf.DynamicCache(config=model.config)
    steps = [model(ids[:, i : i + 1], cache=cache, use_cache=True).logits for i in range(ids.shape[1])]
    return torch.cat(steps, dim=1)


# ------------------------------------------------------------ every architecture


@pytest.mark.parametrize("arch", list(ARCHS))
def test_architectures_cover_change_decode_remove(arch):
    model = build(arch)
    ids = tokens(24)
    impl = model.config._attn_implementation
    rotary = {id(m): m._buffers.get("inv_freq", m._buffers.get("full_attention_inv_freq")) for m in model.modules() if "inv_freq" in m._buffers or "full_attention_inv_freq" in m._buffers}
    base = logits(model, ids)
    for name in COVER:  # (a) a window covering the input leaves every logit
        ph.apply(model, name)
        assert model.config._attn_implementation.startswith("posenc_")
        assert (logits(model, ids) - base).abs().max().item() < 1e-5, name
    name = "self-extend:2:4"
    ph.apply(model, name)
    active = logits(model, ids)
    assert (active - base).abs().max().item() > 1e-4  # (b) an active method changes them
    assert (decoded(model, ids) - active).abs().max().item() < 1e-5  # (e)
    ph.remove(model)  # (d)
    assert model.config._attn_implementation == impl
    for m in model.modules():
        if id(m) in rotary:
            assert m._buffers.get("inv_freq", m._buffers.get("full_attention_inv_freq")) is rotary[id(m)]
    assert torch.equal(logits(model, ids), base)


@pytest.mark.parametrize("backend", ["fused", "torch"])
@pytest.mark.parametrize("name", ACTIVE + ["self-extend:2:8+yarn:2"])
def test_llama_methods_prefill_equals_decoding(name, backend):
    model = build("llama")
    ids = tokens(20)
    ph.apply(model, name, backend=backend)
    pt._TRACE = []
    try:
        full = logits(model, ids)
        fused_calls = len(pt._TRACE)
    finally:
        pt._TRACE = None
    assert (fused_calls > 0) == (backend == "fused")  # (f) the path asked for ran
    assert (decoded(model, ids) - full).abs().max().item() < 1e-5


def test_backends_agree_and_env_forces_torch(monkeypatch):
    model = build("llama")
    ids = tokens(32)
    ph.apply(model, "dca:16:4")
    pt._TRACE = []
    try:
        fused = logits(model, ids)
        assert pt._TRACE, "the default on CPU float32 is the fused path"
        pt._TRACE.clear()
        monkeypatch.setenv("POSENC_TORCH_PATH", "1")
        if hasattr(pt, "_ENV_TORCH"):  # posenc.torch reads the variable once, at import
            monkeypatch.setattr(pt, "_ENV_TORCH", True)
        torch_path = logits(model, ids)
        assert pt._TRACE == []
    finally:
        pt._TRACE = None
    assert (fused - torch_path).abs().max().item() < 1e-5


# ------------------------------------------------------------ (c) a float64 reference


def _ref_rotate(x, c, s, rd):
    h = rd // 2
    x1, x2, rest = x[..., :h], x[..., h:rd], x[..., rd:]
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s, rest), dim=-1)


def reference_model(model, rope):
    """The model in float64 with its rotary tables set to identity (queries
    and keys reach attention unrotated) and an attention that rotates them
    per range of the method's plan and takes one softmax."""
    ref = copy.deepcopy(model).double()
    for m in ref.modules():
        if "inv_freq" in m._buffers:
            m._buffers["inv_freq"] = torch.zeros_like(m._buffers["inv_freq"])
            m.attention_scaling = 1.0
            m.rope_type = "default"

    def attn(module, q, k, v, mask, scaling=None, dropout=0.0, softcap=None, **kw):
        t, s = q.shape[2], k.shape[2]
        views, qscale, logit_scale = rope._method_plan(t, s)
        g = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
        q = q * torch.from_numpy(qscale).double()[None, None, :, None]
        lg = torch.full((q.shape[0], q.shape[1], t, s), float("-inf"), dtype=torch.float64)
        kidx = torch.arange(s)
        for qc, qs, kc, ks, lo, hi in views:
            d64 = lambda a: torch.from_numpy(a).double().unsqueeze(1)  # noqa: E731
            qr = _ref_rotate(q, d64(qc), d64(qs), rope.rotary_dim)
            kr = _ref_rotate(k, d64(kc), d64(ks), rope.rotary_dim)
            x = (qr @ kr.transpose(-1, -2)) * scaling * logit_scale
            if softcap is not None:
                x = torch.tanh(x / softcap) * softcap
            inside = (kidx[None, :] >= torch.from_numpy(lo)[:, None]) & (kidx[None, :] < torch.from_numpy(hi)[:, None])
            lg = torch.where(inside, x, lg)
        p = torch.softmax(lg, -1)
        return (p @ v).transpose(1, 2).contiguous(), None

    tf.AttentionInterface.register("posenc_test_reference", attn)
    ref.set_attn_implementation("posenc_test_reference")
    return ref


@pytest.mark.parametrize(
    "arch,name,backend",
    [("llama", n, b) for n in ACTIVE + ["self-extend:2:8+yarn:2"] for b in ("fused", "torch")]
    + [("gemma2", "self-extend:2:8", None), ("gemma2", "dca:16:4", None), ("phi3", "rerope:8", None)],
)
def test_methods_equal_a_per_range_reference(arch, name, backend):
    over = {"layer_types": ["full_attention"] * 2} if arch == "gemma2" else {}
    model = build(arch, **over)
    ids = tokens(40)
    rope = ph.apply(model, name, backend=backend)
    got = logits(model, ids)
    ph.remove(model)
    want = logits(reference_model(model, rope), ids)
    assert (got.double() - want).abs().max().item() < 1e-4
    assert (logits(model, ids).double() - want).abs().max().item() > 1e-4  # the method matters here


# ------------------------------------------------------------ (g) frequency scalings


def _rope_params(kind, **extra):
    return {"rope_type": kind, "rope_theta": 10000.0, "factor": 2.0, "original_max_position_embeddings": 32, **extra}


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_yarn_equals_transformers_rope_scaling(arch):
    model = build(arch, max_position_embeddings=32)
    ids = tokens(48)
    base = logits(model, ids)
    rope = ph.apply(model, "yarn:2")
    assert model.config._attn_implementation in ("sdpa", "eager")  # no attention function for a scaling
    got = logits(model, ids)
    theirs = build(arch, max_position_embeddings=32, rope_parameters=_rope_params("yarn"))
    assert rope.scaling == "yarn:2"
    assert (got - logits(theirs, ids)).abs().max().item() < 1e-5
    assert (got - base).abs().max().item() > 1e-4
    ph.remove(model)
    assert torch.equal(logits(model, ids), base)


def test_dynamic_equals_transformers_dynamic():
    model = build("llama", max_position_embeddings=32)
    ids = tokens(48)
    ph.apply(model, "dynamic:2")
    theirs = build("llama", max_position_embeddings=32, rope_parameters=_rope_params("dynamic"))
    for n in (48, 20, 40):  # grows, back below the trained length, grows again
        assert (logits(model, ids[:, :n]) - logits(theirs, ids[:, :n])).abs().max().item() < 1e-5, n
    ph.remove(model)


def test_bfloat16_model_runs_the_method():
    model = build("llama").to(torch.bfloat16)
    ids = tokens(24)
    base = logits(model, ids).float()
    ph.apply(model, "self-extend:2:64")
    assert (logits(model, ids).float() - base).abs().max().item() < 5e-2
    ph.remove(model)
    assert torch.equal(logits(model, ids).float(), base)


# ------------------------------------------------------------ what is refused


def test_refusals():
    ids = tokens(16)
    gpt2 = tf.GPT2LMHeadModel(tf.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=100)).eval()
    with pytest.raises(posenc.PosencError, match="RoPE"):
        ph.apply(gpt2, "self-extend:2:8")
    sliding = build("mistral", sliding_window=16)
    with pytest.raises(posenc.PosencError, match="every attention layer"):
        ph.apply(sliding, "self-extend:2:8")
    ph.apply(sliding, "yarn:2")  # a frequency scaling is served on a sliding model
    ph.remove(sliding)
    dyn = build("llama", rope_parameters=_rope_params("dynamic"))
    with pytest.raises(posenc.PosencError, match="change with the length"):
        ph.apply(dyn, "rerope:8")
    model = build("llama")
    with pytest.raises(posenc.PosencError):
        ph.apply(model, "self-extend:two:8")
    with pytest.raises(posenc.PosencError, match="was not called"):
        ph.remove(model)
    ph.apply(model, "self-extend:2:8")
    with torch.no_grad():
        with pytest.raises(posenc.PosencError, match="contiguous from 0"):
            model(ids, position_ids=torch.arange(5, 5 + ids.shape[1])[None])
        mask = torch.ones_like(ids)
        mask[0, 0] = 0
        with pytest.raises(posenc.PosencError, match="mask"):
            model(ids, attention_mask=mask)
    ph.remove(model)


# ------------------------------------------------------------ perplexity


def test_perplexity_has_the_cli_json_shape_and_restores_the_model():
    model = build("llama", max_position_embeddings=16)
    ids = tokens(40)

    def tokenizer(text, add_special_tokens=False, return_tensors="pt"):
        return {"input_ids": ids}

    base = logits(model, ids)
    r = ph.perplexity(model, tokenizer, "text", 24, "model,yarn:2,self-extend:2:4", band=8, per_position=True)
    assert set(r) == {"model", "trained_length", "length", "band", "forward_seconds", "tokens_per_second", "scalings"}
    assert (r["trained_length"], r["length"], r["band"]) == (16, 24, 8)
    assert list(r["scalings"]) == ["model", "yarn:2", "self-extend:2:4"]
    own = torch.nn.functional.cross_entropy(base[0, :23].double(), ids[0, 1:24], reduction="none")
    run = r["scalings"]["model"]
    assert max(abs(a - b) for a, b in zip(run["loss"], own.tolist())) < 1e-4
    assert list(run["bands"]) == ["0-8", "8-16", "16-24"]
    assert abs(run["mean_inside"] - own[:16].mean().item()) < 1e-4
    assert abs(run["mean_beyond"] - own[16:].mean().item()) < 1e-4
    assert r["scalings"]["yarn:2"]["rope_type"] == "yarn" and r["scalings"]["yarn:2"]["attention_factor"] > 1
    assert r["scalings"]["self-extend:2:4"]["loss"] != run["loss"]
    assert torch.equal(logits(model, ids), base)  # each applied and removed in turn
    with pytest.raises(posenc.PosencError, match="fewer than the window"):
        ph.perplexity(model, tokenizer, "text", 41, ["none"])
    ticks = []
    ph.perplexity(model, tokenizer, "text", 24, "model,rerope:4", band=8, progress=lambda *a: ticks.append(a))
    assert [(d, t) for d, t, _ in ticks] == [(0, 2), (1, 2), (2, 2)] and ticks[-1][2] == "rerope:4"
    with pytest.raises(posenc.PosencError, match="progress: give a callable"):
        ph.perplexity(model, tokenizer, "text", 24, ["model"], progress=3)
    with pytest.raises(posenc.PosencError, match="length: expected an int"):
        ph.perplexity(model, tokenizer, "text", "24", ["model"])
    for bad in (5, ["model", 3]):
        with pytest.raises(posenc.PosencError, match="methods: give a name"):
            ph.perplexity(model, tokenizer, "text", 24, bad)

    # Ctrl-C inside a method's forward: the model is left as loaded.
    def interrupt(*_):
        raise KeyboardInterrupt

    layer = model.model.layers[1]
    hook = layer.register_forward_pre_hook(lambda *a: interrupt() if getattr(model, ph._STATE, None) is not None else None)
    try:
        with pytest.raises(KeyboardInterrupt):
            ph.perplexity(model, tokenizer, "text", 24, "model,self-extend:2:4", band=8, progress=False)
    finally:
        hook.remove()
    assert getattr(model, ph._STATE, None) is None
    assert torch.equal(logits(model, ids), base)
    # A RoPE without a trained length (transformers' own config classes
    # always state one; a custom one may not): refused in words, where the
    # bands inside and beyond it would have no border.
    bare = posenc.RopeConfig.from_hf(dict(hidden_size=64, num_attention_heads=4, rope_theta=1e4))
    assert bare.trained_length is None
    with pytest.raises(posenc.PosencError, match=r"^llama: the config states no trained length"):
        ph._trained_length(bare, model)


@pytest.mark.parametrize("kind", ["yarn", "llama3", "linear"])
def test_a_model_with_its_own_scaling_is_unrotated_by_its_tables(kind):
    extra = {"low_freq_factor": 1.0, "high_freq_factor": 4.0} if kind == "llama3" else {}
    model = build("llama", max_position_embeddings=32, rope_parameters=_rope_params(kind, **extra))
    ids = tokens(40)
    base = logits(model, ids)
    # the model's own scaling stays; the window covers the input, past the trained length (32) too
    # (rerope's log-n query scaling and DCA's logit scale act past it: not a covering case)
    for name in ("self-extend:2:64", "sinks:4:64"):
        ph.apply(model, name)
        assert (logits(model, ids) - base).abs().max().item() < 1e-5, name
    ph.apply(model, "rerope:8")
    assert (logits(model, ids) - base).abs().max().item() > 1e-4
    ph.remove(model)


def test_generate_batches_and_greedy_decoding():
    model = build("qwen3")
    ids = torch.cat([tokens(12, seed=1), tokens(12, seed=2)])
    ph.apply(model, "self-extend:2:4")
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=0)
        again = model(out).logits
    assert out.shape == (2, 20)
    assert torch.equal(again[:, 11:-1].argmax(-1), out[:, 12:])  # each new token the prefill's argmax
    ph.remove(model)


def test_gemma3_scaling_sets_the_full_attention_tables():
    model = build("gemma3", max_position_embeddings=32)
    ids = tokens(40)
    ph.apply(model, "yarn:2")
    got = logits(model, ids)
    full = {**_rope_params("yarn"), "rope_theta": 1000000.0}
    theirs = build(
        "gemma3",
        max_position_embeddings=32,
        rope_parameters={"full_attention": full, "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
    )
    assert (got - logits(theirs, ids)).abs().max().item() < 1e-5
    ph.remove(model)
