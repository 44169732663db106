//! `posenc perplexity` and `posenc generate` end to end on the tiny
//! checkpoints of `crates/posenc-models/tests/fixtures` (the real-model
//! check is `crates/posenc-models/tests/smollm2.rs`), and every kind of bad
//! input the issue lists: one line on stderr, exit status 2, before the
//! weights are read.

use std::path::Path;
use std::process::Output;

use serde_json::Value;

use crate::common;

use common::argv;

fn posenc(args: &[&str]) -> Output {
    common::run(args, &[])
}

fn fixture(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../posenc-models/tests/fixtures")
        .join(name)
        .to_string_lossy()
        .into_owned()
}

/// A new scratch directory for one test, removed when dropped.
fn scratch() -> tempfile::TempDir {
    common::tempdir("models-cli")
}

/// A word-level `tokenizer.json` over the 256 ids of the tiny models: words
/// `w0`..`w254`, `[UNK]` last (written once for the whole test binary).
fn tokenizer() -> String {
    common::word_tokenizer_file().to_string_lossy().into_owned()
}

/// A text of `words` words as a file in `scratch`.
fn text(scratch: &Path, words: usize) -> String {
    let t: Vec<String> = (0..words)
        .map(|i| format!("w{}", (i * 37 + 11) % 255))
        .collect();
    let p = scratch.join(format!("text-{words}.txt"));
    std::fs::write(&p, t.join(" ")).unwrap();
    p.to_string_lossy().into_owned()
}

fn fails(args: &[&str], needle: &str) {
    common::fails_mentioning(args, needle);
}

#[test]
fn perplexity_json_bands_means_and_figure() {
    let tk = tokenizer();
    let tmp = scratch();
    let txt = text(tmp.path(), 200);
    let svg = tmp.path().join("loss.svg");
    let out = posenc(&[
        "perplexity",
        "--model",
        &fixture("tiny-qwen25"),
        "--tokenizer",
        &tk,
        "--text",
        &txt,
        "--length",
        "64",
        "--band",
        "16",
        "--scaling",
        "none,yarn:2,linear:2",
        "--json",
        "--out",
        svg.to_str().unwrap(),
    ]);
    common::ok(&out);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["trained_length"], 32);
    assert_eq!(v["length"], 64);
    let s = v["scalings"].as_object().unwrap();
    assert_eq!(s.len(), 3);
    for name in ["none", "yarn:2", "linear:2"] {
        let bands = s[name]["bands"].as_object().unwrap();
        // 63 losses in bands of 16: 0-16, 16-32, 32-48, 48-64 (15 terms).
        assert_eq!(bands.len(), 4, "{name}");
        for k in ["0-16", "16-32", "32-48", "48-64"] {
            let l = bands[k].as_f64().unwrap();
            assert!(l.is_finite() && l > 0.0, "{name} {k}: {l}");
        }
        // The means inside and beyond L = 32 weigh the bands' terms.
        let b = |k: &str| bands[k].as_f64().unwrap();
        let inside = (b("0-16") + b("16-32")) / 2.0;
        let beyond = (16.0 * b("32-48") + 15.0 * b("48-64")) / 31.0;
        assert!((s[name]["mean_inside"].as_f64().unwrap() - inside).abs() < 1e-9);
        assert!((s[name]["mean_beyond"].as_f64().unwrap() - beyond).abs() < 1e-9);
    }
    assert_ne!(s["none"]["bands"]["48-64"], s["yarn:2"]["bands"]["48-64"]);
    assert!(v["tokens_per_second"].as_f64().unwrap() > 0.0);
    let fig = std::fs::read_to_string(&svg).unwrap();
    assert!(fig.contains("yarn:2") && fig.contains("trained length L = 32"));
}

#[test]
fn generate_is_greedy_by_default_and_seeded_when_sampling() {
    let tk = tokenizer();
    let model = fixture("tiny-llama31");
    let run = |extra: &[&str]| -> Value {
        let mut args = vec![
            "generate",
            "--model",
            &model,
            "--tokenizer",
            &tk,
            "--prompt",
            "w1 w2 w3 w4",
            "--max-tokens",
            "12",
            "--json",
        ];
        args.extend_from_slice(extra);
        let out = posenc(&args);
        common::ok(&out);
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let g = run(&[]);
    assert_eq!(g["prompt_ids"], serde_json::json!([1, 2, 3, 4]));
    assert_eq!(g["new_ids"].as_array().unwrap().len(), 12);
    assert_eq!(run(&[])["new_ids"], g["new_ids"]);
    let a = run(&["--temperature", "1.0", "--seed", "3"]);
    assert_eq!(
        a["new_ids"],
        run(&["--temperature", "1.0", "--seed", "3"])["new_ids"]
    );
    let y = run(&["--scaling", "yarn:4"]);
    assert_eq!(y["scaling"], "yarn:4");
}

#[test]
fn bad_input_gets_one_line_and_exit_2() {
    let tk = tokenizer();
    let tmp = scratch();
    let model = fixture("tiny-qwen25");
    // A precision the attention does not have.
    for cmd in ["perplexity", "generate"] {
        let err = common::refused(&[cmd, "--model", &model, "--products", "fp8"]);
        assert!(err.contains("products"), "{err}");
    }
    // Below AVX-512 with AVX512_BF16 (here: kernels forced to the portable
    // level), bfloat16 products are refused before the model is read.
    let args = ["perplexity", "--model", &model, "--products", "bf16"];
    let out = common::run(&args, &[("POSENC_SIMD", std::ffi::OsStr::new("scalar"))]);
    let err = common::one_line_error(out, &args);
    assert!(err.contains("bfloat16"), "{err}");
    // A missing tokenizer (the checkpoint has no tokenizer.json).
    fails(
        &argv(
            "perplexity --model {} --text {} --length 16",
            &[&model, &text(tmp.path(), 100)],
        ),
        "tokenizer",
    );
    // A window longer than the text.
    fails(
        &argv(
            "perplexity --model {} --tokenizer {} --text {} --length 64",
            &[&model, &tk, &text(tmp.path(), 10)],
        ),
        "fewer than the window",
    );
    // A non-UTF-8 text.
    let bad = tmp.path().join("latin1.txt");
    std::fs::write(&bad, b"w1 w2 caf\xe9 w3").unwrap();
    fails(
        &argv(
            "perplexity --model {} --tokenizer {} --text {}",
            &[&model, &tk, bad.to_str().unwrap()],
        ),
        "not UTF-8",
    );
    // A length beyond what fits in memory: a config of a model far larger
    // than the machine (no weights needed: refused from the config).
    let big = tmp.path().join("huge-model");
    std::fs::create_dir_all(&big).unwrap();
    std::fs::write(
        big.join("config.json"),
        r#"{"model_type": "llama", "hidden_size": 16384, "intermediate_size": 53248, "num_hidden_layers": 126,
            "num_attention_heads": 128, "num_key_value_heads": 8, "vocab_size": 128256,
            "max_position_embeddings": 131072, "rope_theta": 500000.0}"#,
    )
    .unwrap();
    fails(
        &[
            "perplexity",
            "--model",
            big.to_str().unwrap(),
            "--length",
            "1000000",
        ],
        "MiB limit",
    );
    // An architecture posenc does not run.
    let gpt2 = tmp.path().join("gpt2");
    std::fs::create_dir_all(&gpt2).unwrap();
    std::fs::write(gpt2.join("config.json"), r#"{"model_type": "gpt2"}"#).unwrap();
    fails(
        &["perplexity", "--model", gpt2.to_str().unwrap()],
        "unsupported architecture",
    );
    // A foreign file and a truncated GGUF.
    let foreign = tmp.path().join("foreign.gguf");
    std::fs::write(&foreign, b"\x7fELF not a model").unwrap();
    fails(
        &["perplexity", "--model", foreign.to_str().unwrap()],
        "not a GGUF",
    );
    let mut magic_only = b"GGUF".to_vec();
    magic_only.extend_from_slice(&3u32.to_le_bytes());
    magic_only.extend_from_slice(&u64::MAX.to_le_bytes());
    let cut = tmp.path().join("cut.gguf");
    std::fs::write(&cut, &magic_only).unwrap();
    fails(
        &[
            "generate",
            "--model",
            cut.to_str().unwrap(),
            "--prompt",
            "w1",
        ],
        "cut.gguf",
    );
    // Bad options.
    fails(
        &["perplexity", "--model", &model, "--scaling", "rope:2"],
        "unknown scaling",
    );
    fails(
        &["perplexity", "--model", &model, "--scaling", "yarn:0"],
        "factor",
    );
    fails(
        &["perplexity", "--model", &model, "--out", "x.jpg"],
        ".png or .svg",
    );
    fails(
        &argv(
            "generate --model {} --tokenizer {} --prompt w1 --temperature -1",
            &[&model, &tk],
        ),
        "temperature",
    );
}
