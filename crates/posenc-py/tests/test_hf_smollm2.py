"""posenc.hf on the real model: SmolLM2-135M-Instruct from the project's GGUF
(``scripts/get-model.sh``), loaded by transformers (``gguf_file=``, float32),
against the ``posenc`` command on the same file. Opt-in: they run only with
``POSENC_SMOLLM2=1`` and the model file present (seven methods at 4,096
tokens on two paths, each beside the command, take far longer than CI's
budget on two cores):

    POSENC_SMOLLM2=1 python -m pytest -s crates/posenc-py/tests/test_hf_smollm2.py

- the token ids: transformers' tokenizer of the GGUF gives the command's ids
  (the whole text as one string, no BOS);
- ``posenc.hf.perplexity``: the loss per 1,024-token band at 4,096 tokens of
  Pride and Prejudice equals ``posenc perplexity --json`` within 0.005 nats
  for every method, and the authors' code (the fixture of
  ``scripts/methods/hf_methods.py``, 3 decimals) where it ports the method;
- greedy ``model.generate`` after a passkey prompt equals ``posenc
  generate`` token for token, with each method;
- ``posenc.hf.passkey`` equals ``posenc passkey --json`` on a small grid.

Each on posenc's fused path and on the forced PyTorch path. The numbers are
printed (``pytest -s``) and recorded in docs/transformers.md."""

import json
import os
import subprocess
import warnings

import pytest

from conftest import METHOD_FIXTURES, REPO, load

torch = pytest.importorskip("torch")
tf = pytest.importorskip("transformers")
pytest.importorskip("gguf")

import posenc.hf as ph  # noqa: E402
from posenc._posenc import PasskeyProbe  # noqa: E402

warnings.filterwarnings("ignore")
tf.logging.set_verbosity_error()

GGUF = REPO / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
TEXT = REPO / "assets" / "corpus" / "pride-and-prejudice.txt"
pytestmark = [
    pytest.mark.skipif(os.environ.get("POSENC_SMOLLM2") != "1", reason="opt-in: POSENC_SMOLLM2=1"),
    pytest.mark.skipif(not GGUF.exists(), reason="no models/SmolLM2-135M-Instruct.Q4_1.gguf (bash scripts/get-model.sh)"),
]

LENGTH = 4096
METHODS = [
    "none", "self-extend:4:512", "self-extend:8:1024", "rerope:512", "leaky-rerope:512:16", "dca:2048:256",
    "sinks:4:1024",
]
# the fixture's names for the methods hf_methods.py ports
FIXTURE_NAMES = {
    "none": "none", "self-extend:4:512": "selfextend:512:4", "self-extend:8:1024": "selfextend:1024:8",
    "rerope:512": "rerope:512", "leaky-rerope:512:16": "leaky:512:16",
}
BACKENDS = ["fused", "torch"]


def run(cmd):
    p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


@pytest.fixture(scope="module")
def hf():
    tok = tf.AutoTokenizer.from_pretrained(GGUF.parent, gguf_file=GGUF.name)
    model = tf.AutoModelForCausalLM.from_pretrained(GGUF.parent, gguf_file=GGUF.name, dtype=torch.float32).eval()
    return model, tok


@pytest.fixture(scope="module")
def cli_perplexity(cli):
    return run([cli, "perplexity", "--model", GGUF, "--text", TEXT, "--length", LENGTH, "--scaling",
                ",".join(METHODS), "--json", "--quiet"])


def test_the_token_ids_are_the_commands(hf, cli, tmp_path):
    model, tok = hf
    text = TEXT.read_text(encoding="utf-8")
    ids = tok(text)["input_ids"]
    assert ids[:4] == [6886, 24662, 7485, 33460]  # the fixture's first ids: no BOS
    # the command's ids of a prefix long enough for the window (its prompt_ids)
    prefix = tmp_path / "prefix.txt"
    prefix.write_text(text[:20000], encoding="utf-8")
    got = run([cli, "generate", "--model", GGUF, "--prompt-file", prefix, "--max-tokens", "1", "--json"])
    assert len(got["prompt_ids"]) > LENGTH
    assert got["prompt_ids"][:LENGTH] == ids[:LENGTH] == tok(text[:20000])["input_ids"][:LENGTH]


@pytest.mark.parametrize("backend", BACKENDS)
def test_perplexity_bands_equal_the_command_and_the_authors_code(hf, cli_perplexity, backend):
    model, tok = hf
    fixture = load(METHOD_FIXTURES / "smollm2-pride-4k.json")["results"]
    r = ph.perplexity(model, tok, TEXT, LENGTH, METHODS, band=1024, backend=backend)
    worst_cli, worst_fix = 0.0, 0.0
    for name in METHODS:
        ours = r["scalings"][name]["bands"]
        theirs = cli_perplexity["scalings"][name]["bands"]
        assert list(ours) == list(theirs) == ["0-1024", "1024-2048", "2048-3072", "3072-4096"]
        line = []
        for band, v in ours.items():
            d = abs(v - theirs[band])
            worst_cli = max(worst_cli, d)
            assert d < 0.005, (name, band, v, theirs[band])
            line.append(f"{v:.4f}/{theirs[band]:.4f}")
            if name in FIXTURE_NAMES:
                f = fixture[FIXTURE_NAMES[name]]["bands"][band]
                worst_fix = max(worst_fix, abs(v - f))
                assert abs(v - f) < 0.005, (name, band, v, f)
                line[-1] += f"/{f:.3f}"
        print(f"[{backend}] {name}: " + "  ".join(line))
    print(f"[{backend}] largest |hf - posenc| {worst_cli:.5f} nats; largest |hf - authors' code| {worst_fix:.5f}")


@pytest.fixture(scope="module")
def passkey_prompt(hf):
    model, tok = hf
    probe = PasskeyProbe(tok.backend_tokenizer.to_str(), [2048], [0.5], 1, METHODS)
    ids, answer, key = probe.prompt(2048, 0.5, 0)
    return ids, tok.decode(ids), key


@pytest.fixture(scope="module")
def cli_generations(cli, passkey_prompt, tmp_path_factory):
    ids, text, _ = passkey_prompt
    f = tmp_path_factory.mktemp("prompt") / "prompt.txt"
    f.write_text(text, encoding="utf-8")
    out = {}
    for name in METHODS:
        g = run([cli, "generate", "--model", GGUF, "--prompt-file", f, "--max-tokens", "10", "--scaling", name,
                 "--json"])
        assert g["prompt_ids"] == ids, name  # the command reads the same prompt
        out[name] = g["new_ids"]
    return out


@pytest.mark.parametrize("backend", BACKENDS)
def test_generate_after_a_passkey_prompt_equals_the_command(hf, passkey_prompt, cli_generations, backend):
    model, tok = hf
    ids, _, key = passkey_prompt
    x = torch.tensor([ids])
    for name in METHODS:
        ph.apply(model, name, backend=backend)
        try:
            with torch.no_grad():
                out = model.generate(x, max_new_tokens=10, do_sample=False, pad_token_id=0)[0, len(ids):].tolist()
        finally:
            ph.remove(model)
        print(f"[{backend}] {name}: {tok.decode(out)!r} (key {key})")
        assert out == cli_generations[name], (name, out, cli_generations[name])


@pytest.fixture(scope="module")
def cli_passkey(cli):
    return run([cli, "passkey", "--model", GGUF, "--lengths", "1024,2048", "--depths", "0,1", "--trials", "1",
                "--scaling", "none,self-extend:4:512,dca:2048:256", "--json", "--quiet"])


def shape(v):
    if isinstance(v, dict):
        return {k: shape(x) for k, x in v.items() if k not in ("model",)}
    if isinstance(v, list):
        return [shape(x) for x in v]
    return type(v).__name__ if not isinstance(v, (int, float)) or isinstance(v, bool) else "number"


@pytest.mark.parametrize("backend", BACKENDS)
def test_passkey_equals_the_command(hf, cli_passkey, backend):
    model, tok = hf
    r = ph.passkey(model, tok, [1024, 2048], [0.0, 1.0], 1, ["none", "self-extend:4:512", "dca:2048:256"],
                   backend=backend, progress=False)
    assert shape(r) == shape(cli_passkey)
    for k in ("format", "trained_length", "lengths", "depths", "trials_per_cell", "seed", "max_new_tokens"):
        assert r[k] == cli_passkey[k], k
    for name, m in r["methods"].items():
        c = cli_passkey["methods"][name]
        for k in ("accuracy", "accuracy_by_length", "trials", "prompt_tokens", "tokens_prefilled", "reuses_cache"):
            assert m[k] == c[k], (name, k)
        for a, b in zip(m["results"], c["results"]):
            for k in ("length", "depth", "key", "prompt_tokens", "answer_tokens", "prefilled", "generated", "read",
                      "correct"):
                assert a[k] == b[k], (name, k, a[k], b[k])
            assert abs(a["logprob"] - b["logprob"]) < 0.01, (name, a["logprob"], b["logprob"])
        print(f"[{backend}] {name}: accuracy {m['accuracy_by_length']}, logprob "
              + " ".join(f"{a['logprob']:.4f}/{b['logprob']:.4f}" for a, b in zip(m["results"], c["results"])))
