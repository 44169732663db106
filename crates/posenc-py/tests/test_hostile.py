"""Issue 37 through the Python package: hostile model files, adapters,
arguments and checkpoints raise ``posenc.PosencError`` with the command's
one line (the same words as ``posenc``'s, free of control characters),
and ``max_memory=`` refuses a call over the limit before anything large is
allocated, in a child process limited to 1 GiB of address space as the
CLI's suite runs (``crates/posenc-cli/tests/hostile_files.rs``).

The models are the tiny Llama 3.1 of posenc-models' fixtures with a
word-level tokenizer over its 256 ids; the adapters are
``posenc-tune/tests/fixtures/peft-llama31`` edited one way each.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import shutil
import struct
import subprocess
import sys
import textwrap

import pytest

import posenc

ROOT = pathlib.Path(__file__).resolve().parents[3]
TINY = ROOT / "crates" / "posenc-models" / "tests" / "fixtures" / "tiny-llama31"
PEFT = ROOT / "crates" / "posenc-tune" / "tests" / "fixtures" / "peft-llama31"
Q0 = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
CLEAR = "\x1b[2J"


def word_tokenizer() -> dict:
    vocab = {f"w{i}": i for i in range(255)}
    vocab["[UNK]"] = 255
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
        "normalizer": None, "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": None, "decoder": None,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"},
    }


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("hostile")
    tk = d / "tokenizer.json"
    tk.write_text(json.dumps(word_tokenizer()))
    text = d / "text.txt"
    text.write_text(" ".join(f"w{((i % 97) * 89 + 13) % 255}" for i in range(3000)))
    return d, tk, text


@pytest.fixture(scope="module")
def model(files):
    _, tk, _ = files
    return posenc.Model.load(TINY, tokenizer=tk)


def one_line(e: pytest.ExceptionInfo, *words: str) -> str:
    msg = str(e.value)
    assert "\n" not in msg and not any(ord(c) < 32 or 0x7F <= ord(c) < 0xA0 for c in msg), repr(msg)
    for w in words:
        assert w in msg, (w, msg)
    return msg


def read_st(path: pathlib.Path):
    b = path.read_bytes()
    n = struct.unpack("<Q", b[:8])[0]
    return json.loads(b[8 : 8 + n]), b[8 + n :]


def write_st(path: pathlib.Path, header: dict, tensors: dict) -> None:
    """``tensors``: name -> bytes, written packed in ``header``'s order."""
    out, data = {}, b""
    for name, entry in header.items():
        if name == "__metadata__" or name not in tensors:
            continue
        e = dict(entry)
        e["data_offsets"] = [len(data), len(data) + len(tensors[name])]
        out[name] = e
        data += tensors[name]
    head = json.dumps(out).encode()
    head += b" " * (-len(head) % 8)
    path.write_bytes(struct.pack("<Q", len(head)) + head + data)


def checkpoint(tmp_path, name, config=None, weights=None) -> pathlib.Path:
    """The tiny Llama 3.1 with its config.json text or weights replaced."""
    d = tmp_path / name
    shutil.copytree(TINY, d)
    if config is not None:
        (d / "config.json").write_text(config)
    if weights is not None:
        (d / "model.safetensors").write_bytes(weights)
    return d


def adapter(tmp_path, name, config=lambda c: None, tensors=lambda h, t: None) -> pathlib.Path:
    d = tmp_path / name
    d.mkdir()
    c = json.loads((PEFT / "adapter_config.json").read_text())
    config(c)
    (d / "adapter_config.json").write_text(json.dumps(c))
    header, data = read_st(PEFT / "adapter_model.safetensors")
    t = {
        k: data[v["data_offsets"][0] : v["data_offsets"][1]]
        for k, v in header.items()
        if k != "__metadata__"
    }
    tensors(header, t)
    write_st(d / "adapter_model.safetensors", header, t)
    return d


def test_hostile_checkpoints_raise_one_line_naming_the_key(tmp_path, files):
    _, tk, _ = files
    config = json.loads((TINY / "config.json").read_text())

    def with_(key, value):
        c = dict(config)
        c[key] = value
        return json.dumps(c)

    yarn = {"rope_type": "yarn", "factor": 1e308, "original_max_position_embeddings": 64}
    header, data = read_st(TINY / "model.safetensors")
    st = bytearray((TINY / "model.safetensors").read_bytes())
    n = struct.unpack("<Q", st[:8])[0]
    at = 8 + n + header["model.norm.weight"]["data_offsets"][0]
    st[at : at + 4] = struct.pack("<f", 1e30)
    cases = [
        (dict(config="[]"), ["config.json: not a JSON object but an array"]),
        (
            dict(config=(TINY / "config.json").read_text().replace("{", '{"rope_theta": 1e400, ', 1)),
            ['config.json: not valid JSON at key "rope_theta"', "64-bit float"],
        ),
        (dict(config=with_("rope_scaling", yarn)), ["rope_scaling.factor", "outside [0.0009765625, 1024]"]),
        (dict(config=with_("num_hidden_layers", 100000)), ["num_hidden_layers = 100000 is outside 1..=1024"]),
        (dict(config=with_("model_type", "llama" + CLEAR)), ["llama\\u{1b}[2J"]),
        (dict(weights=bytes(st)), ["model.norm.weight (norm weight) holds 1e30", "±1e4"]),
    ]
    for i, (edit, words) in enumerate(cases):
        d = checkpoint(tmp_path, f"ckpt-{i}", **edit)
        with pytest.raises(posenc.PosencError) as e:
            posenc.Model.load(d, tokenizer=tk)
        one_line(e, *words)


def test_hostile_adapters_raise_one_line(tmp_path, model, files):
    _, _, text = files

    def i32(h, t):
        h[Q0]["dtype"] = "I32"

    def huge(h, t):
        t[Q0] = struct.pack("<f", 1e30) * (len(t[Q0]) // 4)

    cases = [
        (adapter(tmp_path, "i32", tensors=i32), [Q0, "dtype I32", "F32, F16 or BF16"]),
        (
            adapter(tmp_path, "layers", config=lambda c: c.update(layers_to_transform=[100])),
            ["layers_to_transform holds layer 100", "the model has 2 layers (0..=1)"],
        ),
        (
            adapter(tmp_path, "alpha", config=lambda c: c.update(lora_alpha=1e38)),
            ["lora_alpha/r = 2.5e37 is outside [0.0009765625, 256]"],
        ),
        (adapter(tmp_path, "big", tensors=huge), [Q0, "holds 1e30 at index 0"]),
        (
            adapter(tmp_path, "escape", config=lambda c: c.update(target_modules=["q_proj" + CLEAR])),
            ["q_proj\\u{1b}[2J"],
        ),
    ]
    fifo = adapter(tmp_path, "fifo")
    (fifo / "adapter_config.json").unlink()
    os.mkfifo(fifo / "adapter_config.json")
    cases.append((fifo, ["adapter_config.json is a FIFO"]))
    for a, words in cases:
        with pytest.raises(posenc.PosencError) as e:
            model.perplexity(text=text, length=16, band=8, adapter=a)
        one_line(e, *words)
    # The loaded weights are unchanged by the refused adapters.
    plain = model.perplexity(text=text, length=16, band=8)["scalings"]["none"]["mean_inside"]
    assert math.isfinite(plain) and plain < math.log(256)


@pytest.mark.parametrize(
    "call,words",
    [
        (lambda m, t: m.perplexity(text=t, length=16, scalings="yarn:1e-30"), ['"yarn:1e-30"', "[0.0009765625, 1024]"]),
        (lambda m, t: m.perplexity(text=t, length=16, scalings="linear:1e-300"), ["[0.0009765625, 1024]"]),
        (lambda m, t: m.generate("w1", scaling="linear:2,yarn:2"), ["is a list", "generate and finetune take one scaling"]),
        (lambda m, t: m.generate("w1", temperature=-1.0), ["temperature -1", "0 (the default)"]),
        (lambda m, t: m.passkey([2048], [0.5], trials=2**63 - 1), ["trials must be in 1..=10000"]),
        (lambda m, t: m.passkey([2048], [0.5], scalings="self-extend:1e9:512"), ["out of range (1..=16777216)"]),
        (lambda m, t: m.passkey([2048], [0.5], seed=-1), ["seed must be at least 0, not -1"]),
        (lambda m, t: m.generate("w1", seed=-3), ["seed must be at least 0, not -3"]),
        (lambda m, t: m.perplexity(text=t, length=16, progress=3), ["progress: give a callable", "not int"]),
    ],
)
def test_bad_arguments_raise_the_commands_line(model, files, call, words):
    with pytest.raises(posenc.PosencError) as e:
        call(model, files[2])
    one_line(e, *words)


@pytest.mark.parametrize("text", ["", "{", '{"model": 3}', "[1, 2]", "\x1b[2J{"])
def test_a_bad_tokenizer_json_text_raises_one_line_and_writes_no_file(text):
    """``posenc.hf.passkey`` hands the model's ``tokenizer.json`` over as
    text; a bad one is refused in one line naming it, and nothing is
    written to the temp dir on the way."""
    import tempfile

    before = set(os.listdir(tempfile.gettempdir()))
    with pytest.raises(posenc.PosencError) as e:
        posenc._posenc.PasskeyProbe(text, [256], [0.5], 1, ["none"])
    one_line(e, "tokenizer: the tokenizer's tokenizer.json: ")
    # (It was once read through a file named so, with a name others could guess.)
    after = {n for n in os.listdir(tempfile.gettempdir()) if n.startswith("posenc-hf-tokenizer")}
    assert after <= before


def test_finetune_checks_out_and_its_record(tmp_path, files):
    _, tk, text = files
    f = tmp_path / "a-file"
    f.write_text("x")
    for out, words in [(f, "exists and is not a directory"), (pathlib.Path("/proc/posenc-out"), "is under /proc")]:
        with pytest.raises(posenc.PosencError) as e:
            posenc.finetune(TINY, out, length=16, steps=1, text=text, tokenizer=tk)
        one_line(e, f"--out {out}: {words}")
    out = tmp_path / "ft"
    r = posenc.finetune(TINY, out, length=16, steps=2, lora=4, text=text, tokenizer=tk)
    assert r["steps"] == 2 and math.isfinite(r["final_loss"])
    rec = json.loads((out / "finetune.json").read_text())
    rec["config"]["steps"] = 0
    (out / "finetune.json").write_text(json.dumps(rec))
    with pytest.raises(posenc.PosencError) as e:
        posenc.finetune(None, out, resume=True)
    one_line(e, "finetune.json holds settings", "--steps must be in 1..=")


CHILD = textwrap.dedent(
    """
    import json, re, resource, sys, time
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
    import posenc
    tiny, tk, text, out = sys.argv[1:5]
    m = posenc.Model.load(tiny, tokenizer=tk)
    res = {}
    for name, call in [
        ("perplexity", lambda: m.perplexity(text=text, length=1 << 20, max_memory="40M")),
        ("generate", lambda: m.generate("w1", max_new_tokens=1 << 20, max_memory="40M")),
        ("passkey", lambda: m.passkey([1 << 20], [0.5], max_memory="40M")),
        ("finetune", lambda: posenc.finetune(tiny, out, length=1 << 20, steps=1, text=text,
                                             tokenizer=tk, max_memory="40M")),
    ]:
        t = time.perf_counter()
        try:
            call()
            res[name] = ["ran", 0.0]
        except posenc.PosencError as e:
            res[name] = [str(e), time.perf_counter() - t]
    # finetune's edge: the largest --length named runs, one more is refused.
    n = int(re.search(r"--length (\\d+) is the largest", res["finetune"][0]).group(1))
    ft = lambda length, out: posenc.finetune(tiny, out, length=length, steps=1, lora=4, text=text,
                                             tokenizer=tk, max_memory="40M")
    res["edge"] = [n, ft(n, out + "-edge")["steps"]]
    try:
        ft(n + 1, out + "-past")
    except posenc.PosencError as e:
        res["past"] = [str(e), 0.0]
    print(json.dumps(res))
    """
)


def test_max_memory_refuses_before_allocating_in_1_gib(tmp_path, files):
    """Each entry point over ``max_memory`` raises the plan's one line at
    once in a process limited to 1 GiB (no abort, nothing written); the
    fine-tune at the largest length the line names runs there, one more is
    refused."""
    _, tk, text = files
    out = tmp_path / "ft"
    env = dict(os.environ, MALLOC_ARENA_MAX="2")
    p = subprocess.run(
        [sys.executable, "-c", CHILD, str(TINY), str(tk), str(text), str(out)],
        capture_output=True, text=True, timeout=120, env=env,
    )
    assert p.returncode == 0, p.stderr
    res = json.loads(p.stdout)
    n, steps = res.pop("edge")
    assert steps == 1 and (tmp_path / "ft-edge" / "adapter_model.safetensors").is_file()
    assert f"--length {n} is the largest that fits" in res["past"][0], res["past"]
    assert not (tmp_path / "ft-past" / "finetune.json").exists()
    for name, (msg, secs) in res.items():
        assert "needs about" in msg and "limit" in msg and "largest that fits" in msg, (name, msg)
        assert "\n" not in msg and secs < 10, (name, msg, secs)
    assert not (out / "finetune.json").exists()
