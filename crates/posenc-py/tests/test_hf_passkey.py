"""posenc.hf.passkey and ``python -m posenc.hf`` on a tiny random model (no
download): a byte-level tokenizer written here, a seeded 2-layer Llama of 64
trained positions, prompts of 400+ tokens so that every method is active.

Each trial of ``passkey`` (prompts, keys and answer reading from the Rust
library, the KV cache of the previous prompt reused where the command reuses
it) is checked against a reference computed here from scratch: the prompt
built again by ``PasskeyProbe``, the method applied, the answer's
log-probability from one forward over prompt + answer without a cache, the
greedy tokens from ``model.generate``."""

import _thread
import json
import os
import subprocess
import sys
import threading
import time
import warnings

import pytest

torch = pytest.importorskip("torch")
tf = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

import posenc  # noqa: E402
import posenc.hf as ph  # noqa: E402
from posenc._posenc import PasskeyProbe  # noqa: E402

warnings.filterwarnings("ignore")
tf.logging.set_verbosity_error()

LENGTHS = [400, 480]
DEPTHS = [0.0, 0.5, 1.0]
METHODS = ["none", "self-extend:2:16", "rerope:32", "dca:64:16", "sinks:4:64"]
TOP_KEYS = {
    "model", "format", "trained_length", "lengths", "depths", "trials_per_cell", "seed", "max_new_tokens",
    "seconds", "seconds_this_run", "tokens_per_second", "methods",
}
METHOD_KEYS = {
    "accuracy", "logprob", "accuracy_by_length", "trials", "trials_per_cell", "seconds", "seconds_this_run",
    "prompt_tokens", "tokens_prefilled", "reuses_cache", "results",
}
RESULT_KEYS = {
    "length", "depth", "key", "prompt_tokens", "read", "correct", "logprob", "answer_tokens", "generated",
    "prefilled", "seconds",
}


def byte_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tk = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    return tf.PreTrainedTokenizerFast(tokenizer_object=tk)


def tiny_model():
    cfg = tf.LlamaConfig(
        hidden_size=64, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2, intermediate_size=128,
        vocab_size=256, max_position_embeddings=64, eos_token_id=10, bos_token_id=None, pad_token_id=None,
    )
    torch.manual_seed(0)
    return tf.LlamaForCausalLM(cfg).eval()


@pytest.fixture(scope="module")
def tok():
    return byte_tokenizer()


@pytest.fixture(scope="module")
def model():
    return tiny_model()


@pytest.fixture(scope="module")
def run(model, tok):
    return ph.passkey(model, tok, LENGTHS, DEPTHS, 2, METHODS, seed=3, progress=False)


@torch.no_grad()
def reference(model, probe, method, length, depth, trial):
    ids, answer, key = probe.prompt(length, depth, trial)
    ph.apply(model, method)
    try:
        x = torch.tensor([ids + answer[:-1]])
        lg = torch.log_softmax(model(x).logits[0].double(), -1)
        logprob = float(sum(lg[len(ids) - 1 + r, t] for r, t in enumerate(answer)))
        gen = model.generate(
            torch.tensor([ids]), max_new_tokens=probe.max_new_tokens, do_sample=False,
            eos_token_id=model.config.eos_token_id, pad_token_id=0,
        )[0, len(ids):].tolist()
    finally:
        ph.remove(model)
    return ids, answer, key, logprob, gen


def test_passkey_document_has_the_command_shape(run):
    assert set(run) == TOP_KEYS
    assert run["format"] == "passkey (landmark)"
    assert run["lengths"] == LENGTHS and run["depths"] == DEPTHS and run["seed"] == 3
    assert run["trained_length"] == 64 and run["max_new_tokens"] == 10
    assert sorted(run["methods"]) == sorted(METHODS)  # the command's JSON object: sorted keys
    for name, m in run["methods"].items():
        assert set(m) == METHOD_KEYS, name
        assert m["trials"] == len(LENGTHS) * len(DEPTHS) * 2
        assert sorted(m["accuracy"]) == sorted(str(x) for x in LENGTHS)
        assert m["reuses_cache"] == (not name.startswith("dca")), name
        for r in m["results"]:
            assert set(r) == RESULT_KEYS
            assert r["prompt_tokens"] <= r["length"]
        # cells are the means of their trials (computed by the Rust library)
        for length in LENGTHS:
            for d in DEPTHS:
                of = [r for r in m["results"] if r["length"] == length and r["depth"] == d]
                acc = m["accuracy"][str(length)][next(k for k in m["accuracy"][str(length)] if float(k) == d)]
                assert acc == sum(r["correct"] for r in of) / len(of)
        prefilled = sum(r["prefilled"] for r in m["results"])
        assert m["tokens_prefilled"] == prefilled
        if m["reuses_cache"]:
            assert prefilled < m["prompt_tokens"], name  # the shared start came from the cache
        else:
            assert prefilled == m["prompt_tokens"], name


@pytest.mark.parametrize("method", METHODS)
def test_passkey_trials_equal_an_uncached_reference(model, tok, run, method):
    probe = PasskeyProbe(tok.backend_tokenizer.to_str(), LENGTHS, DEPTHS, 2, METHODS, None, 3)
    results = run["methods"][method]["results"]
    assert len(results) == 12
    for r in results[::3]:  # a third of the trials, every cell's shape
        trial = [x for x in results if x["length"] == r["length"] and x["depth"] == r["depth"]].index(r)
        ids, answer, key, logprob, gen = reference(model, probe, method, r["length"], r["depth"], trial)
        assert r["key"] == key and 1 <= key <= 50000
        assert r["prompt_tokens"] == len(ids) and r["answer_tokens"] == len(answer)
        assert abs(r["logprob"] - logprob) < 1e-4, (method, r["logprob"], logprob)
        text, read = probe.read(gen)
        assert r["generated"] == text and r["read"] == read and r["correct"] == (read == key)


def test_the_prompt_is_the_landmark_format(tok):
    probe = PasskeyProbe(tok.backend_tokenizer.to_str(), [400], [0.5], 1, ["none"], None, 0)
    ids, answer, key = probe.prompt(400, 0.5, 0)
    text = tok.decode(ids)
    lines = text.split("\n")
    assert len(lines) == 5 and lines[4] == "What is the pass key? The pass key is"
    assert lines[2] == f"The pass key is {key}. Remember it. {key} is the pass key."
    assert tok.decode(answer) == f" {key}"
    assert 380 <= len(ids) <= 400  # calibrated to the length, on this tokenizer
    # another seed, other keys; the same seed, the same keys
    assert PasskeyProbe(tok.backend_tokenizer.to_str(), [400], [0.5], 1, ["none"], None, 0).prompt(400, 0.5, 0) == (
        ids, answer, key)
    other = [PasskeyProbe(tok.backend_tokenizer.to_str(), [400], [0.5], 1, ["none"], None, s).prompt(400, 0.5, 0)[2]
             for s in (1, 2, 3)]
    assert any(k != key for k in other)


def test_ruler_needle_from_a_haystack(model, tok):
    hay = " ".join(f"Sentence number {i} is here." for i in range(400))
    r = ph.passkey(model, tok, [400], [0.5], 1, ["none"], haystack=hay, progress=False)
    assert r["format"] == "needle (RULER niah_single)"
    (res,) = r["methods"]["none"]["results"]
    assert 1_000_000 <= res["key"] <= 9_999_999


def test_passkey_restores_the_model_and_reports_progress(model, tok):
    ids = torch.randint(0, 256, (1, 100), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before = model(ids).logits
    ticks = []
    ph.passkey(model, tok, [400], [0.0, 1.0], 1, "self-extend:2:16,none", progress=lambda *a: ticks.append(a))
    with torch.no_grad():
        assert torch.equal(model(ids).logits, before)
    assert getattr(model, "_posenc_hf", None) is None
    assert ticks[0][0] == 0 and ticks[0][1] == 4 and "4 trials" in ticks[0][2]
    assert [t[0] for t in ticks] == [0, 1, 2, 3, 4]
    assert ticks[1][2] == "self-extend:2:16 @ 400" and ticks[-1][2] == "none @ 400"


def test_ctrl_c_raises_keyboard_interrupt_promptly_and_restores(model, tok):
    ids = torch.randint(0, 256, (1, 50), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before = model(ids).logits
    timer = threading.Timer(1.0, _thread.interrupt_main)
    t0 = time.perf_counter()
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        ph.passkey(model, tok, [400, 480, 560, 640] * 1, DEPTHS, 50, ["self-extend:2:16"], progress=False)
    took = time.perf_counter() - t0
    timer.cancel()
    assert took < 5.0, took  # the grid takes minutes; the stop comes within a forward pass
    assert getattr(model, "_posenc_hf", None) is None
    with torch.no_grad():
        assert torch.equal(model(ids).logits, before)


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(depths=[1.5]), "depth 1.5 is outside [0, 1]"),
        (dict(lengths=[10]), "length 10: too short"),
        (dict(trials=0), "--trials must be in 1..="),
        (dict(methods=["warp:3"]), "warp"),
    ],
)
def test_refusals_are_one_line_posenc_errors(model, tok, kwargs, words):
    args = dict(lengths=[400], depths=[0.5], trials=1, methods=["none"])
    args.update(kwargs)
    with pytest.raises(posenc.PosencError) as e:
        ph.passkey(model, tok, args["lengths"], args["depths"], args["trials"], args["methods"], progress=False)
    assert words in str(e.value) and "\n" not in str(e.value)
    assert getattr(model, "_posenc_hf", None) is None


def test_a_tokenizer_without_tokenizer_json_is_refused(model):
    class Slow:
        eos_token_id = 1

    with pytest.raises(posenc.PosencError, match="fast tokenizer"):
        ph.passkey(model, Slow(), [400], [0.5], 1, ["none"], progress=False)


# ------------------------------------------------------------ python -m posenc.hf


@pytest.fixture(scope="module")
def saved(tmp_path_factory, model, tok):
    d = tmp_path_factory.mktemp("tiny")
    model.save_pretrained(d)
    tok.save_pretrained(d)
    return d


def cli(*args):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
    return subprocess.run([sys.executable, "-m", "posenc.hf", *args], capture_output=True, text=True, env=env,
                          timeout=300)


def test_cli_passkey_json_equals_the_call(saved, model, tok, run):
    p = cli("passkey", "--model", str(saved), "--lengths", "400,480", "--depths", "0,0.5,1", "--trials", "2",
            "--methods", ",".join(METHODS), "--seed", "3", "--json")
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout)
    assert set(got) == TOP_KEYS and got["model"] == "LlamaForCausalLM"
    for name in METHODS:
        for a, b in zip(got["methods"][name]["results"], run["methods"][name]["results"]):
            for k in ("key", "prompt_tokens", "answer_tokens", "generated", "read", "correct", "prefilled"):
                assert a[k] == b[k], (name, k)
            assert abs(a["logprob"] - b["logprob"]) < 1e-4
        assert got["methods"][name]["accuracy"] == run["methods"][name]["accuracy"]


def test_cli_perplexity_json(saved, tmp_path, model, tok):
    text = tmp_path / "t.txt"
    text.write_text("It is a truth universally acknowledged. " * 20)
    p = cli("perplexity", "--model", str(saved), "--text", str(text), "--length", "200", "--methods",
            "none,self-extend:2:16", "--band", "64", "--json")
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout)
    want = ph.perplexity(model, tok, text, 200, ["none", "self-extend:2:16"], band=64)
    assert list(got["scalings"]) == ["none", "self-extend:2:16"]
    for name in got["scalings"]:
        for band, v in want["scalings"][name]["bands"].items():
            assert abs(got["scalings"][name]["bands"][band] - v) < 1e-5
    # the table form
    p = cli("perplexity", "--model", str(saved), "--text", str(text), "--length", "200", "--methods", "none")
    assert p.returncode == 0 and "0-1024" in p.stdout.splitlines()[0]


@pytest.mark.parametrize(
    "args, words",
    [
        (["passkey", "--model", "{saved}", "--depths", "0,2", "--lengths", "400"], "depth 2 is outside [0, 1]"),
        (["passkey", "--model", "{saved}", "--trials", "x"], "invalid int value"),
        (["passkey", "--model", "/nonexistent/dir/model.gguf"], "no such file"),
        (["passkey", "--model", "{saved}", "--lengths", "400", "--methods", "warp:2"], "warp"),
        (["perplexity", "--model", "{saved}"], "--text"),
        (["frobnicate"], "invalid choice"),
    ],
)
def test_cli_errors_are_one_line_exit_2(saved, args, words):
    p = cli(*[a.replace("{saved}", str(saved)) for a in args])
    assert p.returncode == 2, (p.stdout, p.stderr)
    err = p.stderr.strip()
    assert "\n" not in err and words in err and err.startswith("python -m posenc.hf"), err


@pytest.mark.parametrize(
    "args, words",
    [
        (["passkey", "--model", "{saved}", "--depths", "0,2", "--lengths", "400"], "depth 2 is outside [0, 1]"),
        (["passkey", "--model", "{saved}", "--lengths", "400", "--trials", "0"], "--trials"),
        (["passkey", "--model", "{saved}", "--lengths", "400", "--methods", "warp:2"], "warp"),
        (["passkey", "--model", "/nonexistent/dir/model.gguf"], "no such file"),
        (["perplexity", "--model", "/nonexistent/dir/model.gguf", "--text", "t.txt"], "no such file"),
    ],
)
def test_cli_refuses_a_bad_grid_before_importing_torch(saved, args, words):
    """A bad grid, name or model file is refused before torch and
    transformers are imported (seconds) or the model is read."""
    code = (
        "import sys; from posenc._hf_cli import main; rc = main(sys.argv[1:]); "
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, 'imported'; "
        "sys.exit(rc)"
    )
    p = subprocess.run([sys.executable, "-c", code, *[a.replace("{saved}", str(saved)) for a in args]],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, (p.stdout, p.stderr)
    err = p.stderr.strip()
    assert "\n" not in err and words in err, err
