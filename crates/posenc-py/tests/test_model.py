"""posenc.Model and posenc.finetune against the ``posenc`` command.

Each probe's dict must equal what ``posenc ... --json`` prints for the same
arguments (timings aside), on SmolLM2-135M's GGUF (``scripts/get-model.sh``
puts it in ``models/``). Without that file the tests that need it skip,
unless ``POSENC_REQUIRE_MODEL=1``.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import threading

import pytest

import posenc

ROOT = pathlib.Path(__file__).resolve().parents[3]
GGUF = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"

#: Keys holding wall-clock measurements, which differ between two runs.
TIMINGS = {"seconds", "seconds_this_run", "forward_seconds", "tokens_per_second"}


def _binary() -> pathlib.Path | None:
    for profile in ("debug", "release"):
        p = ROOT / "target" / profile / "posenc"
        if p.is_file():
            return p
    return None


def _need_model() -> None:
    if not GGUF.is_file():
        if os.environ.get("POSENC_REQUIRE_MODEL") == "1":
            pytest.fail(f"{GGUF} is missing (POSENC_REQUIRE_MODEL=1): run scripts/get-model.sh")
        pytest.skip(f"{GGUF} is missing: run scripts/get-model.sh")


@pytest.fixture(scope="module")
def model() -> posenc.Model:
    _need_model()
    return posenc.Model.load(GGUF)


def cli_json(*args: str) -> dict:
    exe = _binary()
    if exe is None:
        if os.environ.get("POSENC_REQUIRE_MODEL") == "1":
            pytest.fail("no target/debug/posenc or target/release/posenc: cargo build -p posenc-cli")
        pytest.skip("no target/debug/posenc or target/release/posenc: cargo build -p posenc-cli")
    out = subprocess.run(
        [str(exe), *args, "--json"], capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def untimed(v):
    """``v`` without its timings (the trials' own ``seconds`` too)."""
    if isinstance(v, dict):
        return {k: untimed(x) for k, x in v.items() if k not in TIMINGS}
    if isinstance(v, list):
        return [untimed(x) for x in v]
    return v


def test_properties(model):
    assert model.trained_length == 8192
    c = model.config
    assert c["num_layers"] == 30 and c["trained_length"] == model.trained_length
    assert "GGUF" in model.source or "gguf" in model.source.lower()
    assert "Model(" in repr(model)


def test_perplexity_equals_the_cli(model, tmp_path):
    text = tmp_path / "text.txt"
    text.write_text(posenc_text(), encoding="utf-8")
    ticks = []
    got = model.perplexity(
        text=text,
        length=64,
        scalings=["none", "yarn:2"],
        band=16,
        per_position=True,
        progress=lambda d, t, w: ticks.append((d, t, w)),
    )
    want = cli_json(
        "perplexity", "--model", str(GGUF), "--text", str(text), "--length", "64",
        "--scaling", "none,yarn:2", "--band", "16", "--per-position",
    )
    assert untimed(got) == untimed(want)
    # A description first, then one tick per layer per scaling (the
    # pass's places to stop inside a layer repeat a count: not shown).
    assert ticks[0][0] == 0 and "window of 64 tokens" in ticks[0][2]
    assert [d for d, _, _ in ticks] == list(range(61))
    assert ticks[-1][:2] == (60, 60) and ticks[-1][2] == "yarn:2"
    # The same text given as a string scores the same.
    again = model.perplexity(text=posenc_text(), length=64, scalings="none,yarn:2", band=16)
    assert untimed(again)["scalings"]["none"]["bands"] == untimed(want)["scalings"]["none"]["bands"]


def test_default_text_equals_the_cli(model):
    got = model.perplexity(length=32, scalings="linear:2")
    want = cli_json("perplexity", "--model", str(GGUF), "--length", "32", "--scaling", "linear:2")
    assert untimed(got) == untimed(want)


def test_passkey_equals_the_cli(model):
    # Two lengths, two scalings, one depth: each trial greedy-decodes its
    # answer token by token (seconds each in CI's dev-profile build).
    got = model.passkey([128, 160], [1.0], trials=1, scalings=["none", "yarn:2"], seed=3)
    want = cli_json(
        "passkey", "--model", str(GGUF), "--lengths", "128,160", "--depths", "1",
        "--trials", "1", "--scaling", "none,yarn:2", "--seed", "3",
    )
    assert untimed(got) == untimed(want)


def test_passkey_haystack_as_text_or_path(model, tmp_path):
    words = " ".join(f"word{i} and some filler text" for i in range(200))
    hay = tmp_path / "hay.txt"
    hay.write_text(words, encoding="utf-8")
    a = model.passkey([160], [0.5], haystack=words)
    b = model.passkey([160], [0.5], haystack=hay)
    want = cli_json("passkey", "--model", str(GGUF), "--lengths", "160", "--depths", "0.5",
                    "--trials", "1", "--scaling", "none", "--haystack", str(hay))
    assert untimed(a) == untimed(b) == untimed(want)


def test_generate_equals_the_cli(model, tmp_path):
    got = model.generate("The capital of France is", max_new_tokens=8)
    want = cli_json("generate", "--model", str(GGUF), "--prompt", "The capital of France is",
                    "--max-tokens", "8", "--scaling", "none")
    assert got == want["text"]
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("The capital of France is", encoding="utf-8")
    assert model.generate(prompt, max_new_tokens=8) == got
    sampled = model.generate("Once upon a time", max_new_tokens=6, temperature=0.8, top_p=0.9, seed=5)
    want = cli_json("generate", "--model", str(GGUF), "--prompt", "Once upon a time",
                    "--max-tokens", "6", "--scaling", "none", "--temperature", "0.8",
                    "--top-p", "0.9", "--seed", "5")
    assert sampled == want["text"]


@pytest.mark.parametrize(
    "call, needle",
    [
        (lambda m: m.perplexity(length=1), "--length must be in 2..="),
        (lambda m: m.perplexity(length=32, scalings="warp:2"), "warp"),
        (lambda m: m.perplexity(length=32, band=0), "--band must be at least 1"),
        (lambda m: m.perplexity(text=pathlib.Path("/no/such/file"), length=32), "/no/such/file"),
        (lambda m: m.perplexity(text=pathlib.Path("/dev/null"), length=32), "not a regular file"),
        (lambda m: m.perplexity(text="too short", length=64), "fewer than the window of 64"),
        (lambda m: m.perplexity(text=3), "give a str"),
        (lambda m: m.passkey([128], [1.5]), "depth"),
        (lambda m: m.passkey([-1], [0.0]), "lengths must be at least 0"),
        (lambda m: m.passkey([128], [0.0], haystack="few words"), "--haystack"),
        (lambda m: m.generate("", max_new_tokens=4), "the prompt has no tokens"),
        (lambda m: m.generate("hi", temperature=-1.0), "temperature"),
        (lambda m: m.perplexity(length=32, adapter=pathlib.Path("/no/such/adapter")), "adapter"),
    ],
)
def test_bad_inputs_raise_one_line(model, call, needle):
    with pytest.raises(posenc.PosencError) as e:
        call(model)
    msg = str(e.value)
    assert needle in msg and "\n" not in msg, msg


def test_bad_model_paths_raise_one_line(tmp_path):
    for path, needle in [
        (tmp_path / "none.gguf", "none.gguf"),
        (pathlib.Path("/dev/null"), "not a regular file"),
    ]:
        with pytest.raises(posenc.PosencError) as e:
            posenc.Model.load(path)
        assert needle in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(posenc.PosencError, match="products"):
        posenc.Model.load(tmp_path / "x.gguf", products="f16")


def test_a_raising_callback_stops_the_call(model):
    calls = []

    def progress(done, total, what):
        calls.append(done)
        if done >= 3:
            raise RuntimeError("stop here")

    with pytest.raises(RuntimeError, match="stop here"):
        model.perplexity(length=64, scalings=["none", "yarn:2"], progress=progress)
    assert calls[-1] == 3
    # The model still works, its weights unchanged.
    a = model.perplexity(length=32)
    b = model.perplexity(length=32)
    assert untimed(a) == untimed(b)


def test_ctrl_c_raises_keyboard_interrupt_promptly(model):
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals reach the main thread only")
    timer = threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            model.perplexity(length=4096, scalings=["none", "yarn:2", "linear:2"])
    finally:
        timer.cancel()


def test_ctrl_c_stops_a_passkey_trial_within_a_second(model):
    """A 2,048-token trial's prefill takes seconds on two cores: the stop
    comes between its layers (a layer is about 0.1-0.4 s here), not at the
    trial's end."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals reach the main thread only")
    import time

    sent = []
    timer = threading.Timer(1.0, lambda: (sent.append(time.perf_counter()), os.kill(os.getpid(), signal.SIGINT)))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            model.passkey([2048], [0.5], trials=3, scalings="none", progress=False)
        assert sent, "the call ended before the signal"
        assert time.perf_counter() - sent[0] < 1.0
    finally:
        timer.cancel()


def test_ctrl_c_stops_a_long_prefill_within_a_second(model):
    """A 3,000-token prompt's pass takes seconds on two cores: generate
    stops between its layers, before the first new token."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals reach the main thread only")
    import time

    prompt = " ".join(["the river ran past the old mill"] * 400)
    sent = []
    timer = threading.Timer(1.0, lambda: (sent.append(time.perf_counter()), os.kill(os.getpid(), signal.SIGINT)))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            model.generate(prompt, max_new_tokens=4)
        assert sent, "the call ended before the signal"
        assert time.perf_counter() - sent[0] < 1.0
    finally:
        timer.cancel()


def test_finetune_checks_out_first(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(posenc.PosencError, match="--out"):
        posenc.finetune(GGUF, f, length=32, steps=1)
    with pytest.raises(posenc.PosencError, match="--out /proc"):
        posenc.finetune(GGUF, pathlib.Path("/proc/posenc-out"), length=32, steps=1)


def test_finetune_equals_the_cli(tmp_path):
    _need_model()
    text = tmp_path / "text.txt"
    text.write_text(posenc_text(), encoding="utf-8")
    ticks = []
    got = posenc.finetune(
        GGUF, tmp_path / "py", length=32, steps=2, text=text, lora=4,
        progress=lambda d, t, w: ticks.append((d, t, w)),
    )
    want = cli_json(
        "finetune", "--model", str(GGUF), "--out", str(tmp_path / "cli"), "--length", "32",
        "--steps", "2", "--text", str(text), "--lora", "4", "--quiet",
    )
    for v in (got, want):
        v.pop("out")
        v.pop("seconds")
        v.pop("tokens_per_s")
        v["finetune"].pop("created", None)
    assert got["final_loss"] == want["final_loss"]
    assert got["steps"] == want["steps"] == 2
    assert ticks[0][0] == 0 and ticks[-1][:2] == (2, 2)
    a = (tmp_path / "py" / "adapter_model.safetensors").read_bytes()
    b = (tmp_path / "cli" / "adapter_model.safetensors").read_bytes()
    assert a == b


def posenc_text() -> str:
    """A few hundred words of English (the start of the built-in text is
    what the CLI reads by default; here any text will do)."""
    return (
        "It is a truth universally acknowledged, that a single man in possession of a good "
        "fortune, must be in want of a wife. However little known the feelings or views of "
        "such a man may be on his first entering a neighbourhood, this truth is so well fixed "
        "in the minds of the surrounding families, that he is considered as the rightful "
        "property of some one or other of their daughters. "
    ) * 12
