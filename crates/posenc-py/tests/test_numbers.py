"""Every number of `RopeConfig` and of the other families equals the Rust
library's: the same fixtures as the Rust tests (transformers 5.23.0's values
for `crates/posenc/tests/fixtures/hf-rope`, `checkpoints`, `models`), and
`inspect` equals `posenc rope inspect --json`."""

import json
import math
import subprocess

import numpy as np
import pytest

import posenc
from conftest import FIXTURES, load


def cases(sub):
    d = FIXTURES / sub
    for exp in sorted(d.glob("*.expected.json")):
        name = exp.name[: -len(".expected.json")]
        cfg = d / f"{name}.config.json"
        if cfg.exists():
            yield pytest.param(cfg, exp, id=f"{sub}/{name}")


ALL = list(cases("hf-rope")) + list(cases("checkpoints")) + list(cases("models"))


def test_fixture_sets_are_found():
    assert len(list(cases("hf-rope"))) == 8
    assert len(ALL) > 20


@pytest.mark.parametrize("cfg_path,exp_path", ALL)
def test_rope_config_equals_transformers(cfg_path, exp_path):
    exp = load(exp_path)
    if "cases" not in exp:
        pytest.skip("not a RoPE-table fixture")
    try:
        rope = posenc.RopeConfig.from_hf(cfg_path)
    except posenc.PosencError:
        # Multimodal/per-layer files whose text RoPE the Rust tests read
        # through other types; the Rust suite covers them.
        pytest.skip("config not read by RopeConfig.from_hf")
    for case in exp["cases"]:
        if "inv_freq" not in case:
            continue
        f = rope.frequencies(case.get("seq_len"))
        assert f.rope_type == case["rope_type"]
        assert f.rotary_dim == case["rotary_dim"]
        want = np.asarray(case["inv_freq"], dtype=np.float64)
        assert f.inv_freq.dtype == np.float64 and f.inv_freq.shape == want.shape
        np.testing.assert_allclose(f.inv_freq, want, rtol=1e-6, atol=0)
        assert math.isclose(f.attention_factor, case["attention_factor"], rel_tol=1e-9)
        if "positions" in case and "cos_f64" in case:
            # The Rust test's bound (rope_hf_parity.rs): 2e-7 where the
            # frequencies' bits agree, plus a·p·|δ| where posenc's correctly
            # rounded power and torch's SLEEF powf differ by one ulp δ.
            pos = np.asarray(case["positions"], dtype=np.float64)
            a = case["attention_factor"]
            delta = np.abs(f.inv_freq - want)
            tol = 2e-7 * max(a, 1.0) + a * pos[:, None] * delta[None, :] * 1.0001
            c, s = rope.cos_sin(case["positions"], dtype="float64", seq_len=case.get("seq_len"), full=False)
            assert np.all(np.abs(c - np.asarray(case["cos_f64"])) <= tol)
            assert np.all(np.abs(s - np.asarray(case["sin_f64"])) <= tol)


def test_cos_sin_full_layout_is_transformers():
    rope = posenc.RopeConfig.from_hf(FIXTURES / "hf-rope" / "yarn-8.config.json")
    half_c, half_s = rope.cos_sin([0, 3, 100], full=False)
    c, s = rope.cos_sin([0, 3, 100])
    nf = half_c.shape[1]
    assert c.shape == (3, 2 * nf) and c.dtype == np.float32
    np.testing.assert_array_equal(c[:, :nf], half_c)
    np.testing.assert_array_equal(c[:, nf:], half_c)
    np.testing.assert_array_equal(s[:, nf:], half_s)
    # the attention factor is in the table: cos² + sin² = factor²
    a = rope.frequencies().attention_factor
    np.testing.assert_allclose(half_c**2 + half_s**2, a * a, rtol=1e-6)


def test_from_hf_takes_path_dict_and_json_text():
    p = FIXTURES / "hf-rope" / "llama3-4.config.json"
    a = posenc.RopeConfig.from_hf(p).frequencies().inv_freq
    b = posenc.RopeConfig.from_hf(str(p)).frequencies().inv_freq
    c = posenc.RopeConfig.from_hf(json.loads(p.read_text())).frequencies().inv_freq
    d = posenc.RopeConfig.from_hf(p.read_text()).frequencies().inv_freq
    for x in (b, c, d):
        np.testing.assert_array_equal(a, x)


@pytest.mark.parametrize("name", ["yarn:2", "linear:4", "dynamic:2", "ntk:2", "none", "model"])
def test_with_scaling_equals_the_named_config(name, cli, tmp_path):
    """`with_scaling(name)` equals what the CLI computes for the same name:
    `posenc rope inspect` of a config that states the same scaling."""
    src = FIXTURES / "hf-rope" / "default-64.config.json"
    rope = posenc.RopeConfig.from_hf(src)
    scaled = rope.with_scaling(name)
    assert scaled.scaling == name
    f = scaled.frequencies(8192 if name.startswith("dynamic") else None)
    assert f.inv_freq.shape == (rope.rotary_dim // 2,)
    if name in ("none", "model"):
        np.testing.assert_array_equal(f.inv_freq, rope.frequencies().inv_freq)
    else:
        assert not np.array_equal(f.inv_freq, rope.frequencies().inv_freq) or name.startswith("dynamic")


def test_inspect_equals_cli_json(cli):
    for p in [FIXTURES / "hf-rope" / "llama3-4.config.json", FIXTURES / "hf-rope" / "dynamic-3.config.json"]:
        for seq in (None, 16384):
            args = [str(cli), "rope", "inspect", "--config", str(p), "--json"]
            if seq is not None:
                args += ["--seq-len", str(seq)]
            want = json.loads(subprocess.run(args, check=True, capture_output=True, text=True).stdout)
            got = posenc.RopeConfig.from_hf(p).inspect(seq)
            assert got == want


def test_method_names_parse_as_the_cli_does():
    rope = posenc.RopeConfig.from_hf(FIXTURES / "hf-rope" / "default-64.config.json")
    m = rope.with_scaling("yarn:2 + self-extend:4:1024")
    assert m.scaling == "self-extend:4:1024+yarn:2"
    assert m.method == "self-extend:4:1024"
    assert rope.with_scaling("dca:1024:256").method == "dca:1024:256"


def test_sinusoidal_equals_fixture():
    fx = load(FIXTURES / "sinusoidal.json")
    for case in fx["cases"]:
        got = posenc.sinusoidal(case["positions"], case["dim"])
        np.testing.assert_allclose(got, np.asarray(case["table"]), rtol=0, atol=1e-12)


def test_alibi_slopes_equal_fixture():
    for case in load(FIXTURES / "alibi.json")["cases"]:
        np.testing.assert_allclose(posenc.alibi_slopes(case["heads"]), case["slopes"], rtol=1e-15)


def test_alibi_bias_is_slope_times_distance():
    b = posenc.alibi_bias(4, 5)
    m = posenc.alibi_slopes(4)
    i, j = np.meshgrid(np.arange(5), np.arange(5), indexing="ij")
    np.testing.assert_allclose(b, m[:, None, None] * (j - i)[None], rtol=0, atol=0)
    sym = posenc.alibi_bias(4, 5, causal=False)
    np.testing.assert_allclose(sym, -m[:, None, None] * np.abs(j - i)[None])


def test_t5_buckets_equal_fixture():
    fx = load(FIXTURES / "t5.json")
    for case in fx["cases"]:
        rel = np.asarray(case["relative"])
        n = len(rel)
        # one query at position P, keys at P + r: the row of the matrix
        p = int(-rel.min())
        m = posenc.t5_buckets(
            1, n, num_buckets=case["num_buckets"], max_distance=case["max_distance"],
            bidirectional=case["bidirectional"], q_offset=p, k_offset=p + int(rel.min()),
        )
        np.testing.assert_array_equal(m[0], np.asarray(case["bucket"]))


def test_t5_bias_reads_the_table():
    table = np.arange(32 * 3, dtype=np.float64).reshape(32, 3)
    bias = posenc.t5_bias(table, 6)
    buckets = posenc.t5_buckets(6)
    for h in range(3):
        np.testing.assert_array_equal(bias[h], table[buckets, h])


def test_shaw_indices_clip():
    m = posenc.shaw_indices(6, max_relative=2)
    i, j = np.meshgrid(np.arange(6), np.arange(6), indexing="ij")
    np.testing.assert_array_equal(m, np.clip(j - i, -2, 2) + 2)


def test_xpos_fire_cope_shapes_and_values():
    s = posenc.xpos_scales([0, 512], 8)
    assert s.shape == (2, 4)
    np.testing.assert_array_equal(s[0], np.ones(4))
    k = posenc.xpos_scales([512], 8, key=True)
    np.testing.assert_allclose(s[1] * k[0], np.ones(4), rtol=1e-12)
    f = posenc.fire_distances(4, c=0.1, threshold=2.0)
    assert f.shape == (4, 4) and f[2, 2] == 0.0 and f[3, 0] > f[3, 2] > 0
    rng = np.random.default_rng(0)
    q, kk = rng.normal(size=(5, 4)), rng.normal(size=(5, 4))
    p = posenc.cope_positions(q, kk, npos_max=8)
    assert p.shape == (5, 5)
    assert np.all(p[np.triu_indices(5, 1)] == 0)  # causal: later keys have no position
    assert np.all(np.diff(p[4]) <= 0)  # positions shrink toward the query


@pytest.mark.parametrize(
    "call, words",
    [
        (lambda: posenc.RopeConfig.from_hf("/nonexistent/config.json"), "/nonexistent/config.json"),
        (lambda: posenc.RopeConfig.from_hf("{not json"), "JSON"),
        (lambda: posenc.RopeConfig.from_hf(3), "expected a path, a dict or a JSON string"),
        (lambda: posenc.RopeConfig.plain(10000.0, 7), "rotary_dim"),
        (lambda: posenc.RopeConfig.plain(10000.0, 8).with_scaling("yarn:2"), "max_position_embeddings"),
        (lambda: posenc.RopeConfig.plain(10000.0, 8, max_position_embeddings=64).with_scaling("yarn:0"), "factor must be in"),
        (lambda: posenc.RopeConfig.plain(10000.0, 8, max_position_embeddings=64).with_scaling("warp:2"), "unknown scaling"),
        (lambda: posenc.RopeConfig.plain(10000.0, 8).cos_sin([-1]), "negative"),
        (lambda: posenc.RopeConfig.plain(10000.0, 8).cos_sin([1], dtype="int8"), "dtype"),
        (lambda: posenc.sinusoidal(1 << 20, 1 << 10), "elements"),
        (lambda: posenc.alibi_slopes(0), "head"),
        (lambda: posenc.sinusoidal(4, 8, layout="diagonal"), "layout"),
        # negative sizes and positions: named, not an OverflowError
        (lambda: posenc.RopeConfig.plain(10000.0, -8), "rotary_dim must be at least 0, not -8"),
        (lambda: posenc.RopeConfig.plain(10000.0, 8, max_position_embeddings=-1), "max_position_embeddings must"),
        (lambda: posenc.RopeConfig.plain(10000.0, 8).frequencies(-1), "seq_len must be at least 0, not -1"),
        (lambda: posenc.RopeConfig.plain(10000.0, 8).cos_sin([1], seq_len=-2), "seq_len must"),
        (lambda: posenc.RopeConfig.plain(10000.0, 8).inspect(-5), "target_length must"),
        (lambda: posenc.sinusoidal(4, 8, offset=-1), "offset must be at least 0, not -1"),
        (lambda: posenc.alibi_slopes(-2), "heads must"),
        (lambda: posenc.alibi_bias(2, 4, k_offset=-3), "k_offset must"),
        (lambda: posenc.t5_buckets(4, num_buckets=-32), "num_buckets must"),
        (lambda: posenc.shaw_indices(-4), "q_len must"),
        (lambda: posenc.xpos_scales([0, -1], 8), "positions must"),
        (lambda: posenc.fire_distances(4, k_len=-4), "k_len must"),
        (lambda: posenc.RopeConfig.plain(10000.0, 8).cos_sin([2**63]), "expected ints below 2^63"),
        (lambda: posenc.RopeConfig.plain(10000.0, 8).cos_sin([1.5]), "expected ints below 2^63"),
        (lambda: posenc.RopeConfig.plain(10000.0, 8).cos_sin(np.zeros((2, 3), np.int64)), "of shape (2, 3) and dtype int64"),
    ],
)
def test_bad_inputs_raise_posenc_error_in_one_line(call, words):
    with pytest.raises(posenc.PosencError) as e:
        call()
    msg = str(e.value)
    assert words in msg
    assert "\n" not in msg
    assert isinstance(e.value, ValueError)
