//! Issue 29 through the library: every hostile model variant the generator
//! writes (`common/hostile.rs`: truncations at every header field, absurd
//! counts of every metadata type, bad alignments, offsets, overlaps,
//! duplicates, dimensions, NaN/Inf weights, activations that overflow,
//! mismatched tokenizers and configs, damaged checkpoints) is refused with
//! one line, in a child process limited to 1 GiB of address space; special
//! files are refused without blocking; texts are tokenized only as far as
//! the window needs, with the same tokens as the whole text gives.
//!
//! Issue 37's variants join them ([`issue_37_variants`]): names, keys and
//! values carrying terminal escapes (every message is checked free of
//! control characters), scaling factors, bases, counts and attention
//! factors no model has, weights of absurd magnitude, and the files whose
//! messages were confusing, each with the words its refusal must hold
//! (written by the generator, `common/hostile.rs`, which the CLI's suite
//! shares).

mod common;
#[path = "common/hostile.rs"]
mod hostile;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::fixture;
use posenc_models::input::{self, Prompt, MAX_PROMPT_TOKENS};
use posenc_models::perplexity::{loss_per_position, rope_of};
use posenc_models::{Decoder, ModelError, ModelFiles, Scaling, TextTokenizer};

/// A new scratch directory for one test, removed when dropped.
fn scratch() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("posenc-hostile-")
        .tempdir()
        .unwrap()
}

fn first_layers(path: &Path, k: usize) -> posenc_models::Result<Decoder> {
    let mut files = ModelFiles::open(path)?;
    let mut cfg = files.config()?;
    cfg.num_layers = k;
    Ok(files.load(cfg)?.0)
}

/// What a run does with a model: the checks and the load, the tokenizer
/// for a GGUF (a checkpoint here has none), the first forward pass checked,
/// then the losses of 16 tokens.
fn pipeline(path: &Path) -> posenc_models::Result<Vec<f64>> {
    input::check_model_path(path)?;
    let mut files = ModelFiles::open(path)?;
    let cfg = files.config()?;
    if !path.is_dir() {
        files.tokenizer(None)?.check_model_vocab(cfg.vocab_size)?;
    }
    let (model, _) = files.load(cfg)?;
    let tokens: Vec<u32> = (0..16).map(|i| (i * 37 + 5) % 256).collect();
    let rope = rope_of("none".parse::<Scaling>()?.rope_config(model.config())?)?;
    input::check_first_forward(&model, &tokens, &rope, &mut |k| first_layers(path, k))?;
    loss_per_position(&model, &tokens, &rope)
}

/// Run by `every_hostile_model_is_refused_in_1_gib` in a child process
/// limited to 1 GiB of address space; the variants' list is in
/// `POSENC_HOSTILE_LIST`.
#[test]
#[ignore = "run by every_hostile_model_is_refused_in_1_gib in a child process"]
fn hostile_child() {
    let list = std::env::var("POSENC_HOSTILE_LIST").expect("POSENC_HOSTILE_LIST");
    let text = std::fs::read_to_string(list).unwrap();
    // libtest has printed "test hostile_child ... " without a newline.
    println!();
    let mut lines = text.lines();
    let base = PathBuf::from(lines.next().unwrap());
    let losses = pipeline(&base).unwrap_or_else(|e| panic!("the base model fails: {e}"));
    assert!(losses.iter().all(|l| l.is_finite() && *l > 0.0));
    let mut tried = 0;
    for line in lines {
        let (name, path) = line.split_once('\t').unwrap();
        match pipeline(Path::new(path)) {
            Ok(l) => panic!("{name} ({path}) was accepted, losses {:?}", &l[..3]),
            Err(e) => {
                let msg = e.to_string();
                assert!(!msg.is_empty() && !msg.contains('\n'), "{name}: {msg:?}");
                // Nothing a terminal would act on: no ESC, NUL, CR, ...
                assert!(!msg.chars().any(char::is_control), "{name}: {msg:?}");
                println!("refused {name}: {msg}");
            }
        }
        tried += 1;
    }
    println!("hostile variants tried: {tried}");
}

#[test]
fn every_hostile_model_is_refused_in_1_gib() {
    let tmp = scratch();
    let dir = tmp.path().join("variants");
    let (base, mut variants) = hostile::model_variants(&fixture(""), &dir);
    assert!(variants.len() > 300, "{} variants", variants.len());
    let issue_37 = hostile::issue_37_variants(&fixture(""), &dir.join("issue-37"));
    for (name, model, _) in &issue_37 {
        variants.push(hostile::Variant {
            name: name.clone(),
            model: model.clone(),
        });
    }
    let mut list = format!("{}\n", base.display());
    for v in &variants {
        list.push_str(&format!("{}\t{}\n", v.name, v.model.display()));
    }
    let list_path = dir.join("list.tsv");
    std::fs::write(&list_path, list).unwrap();
    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "hostile_child",
        "--exact",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ])
    .env("POSENC_HOSTILE_LIST", &list_path);
    hostile::limit_memory(&mut cmd);
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let refused = stdout.lines().filter(|l| l.starts_with("refused ")).count();
    assert_eq!(refused, variants.len(), "{stdout}");
    // The layer is named where finite weights overflow.
    let overflow = stdout
        .lines()
        .find(|l| l.starts_with("refused activations overflowing in layer 1"))
        .unwrap();
    assert!(overflow.contains("layer 1 "), "{overflow}");
    for (what, needle) in [
        ("general.alignment 0", "non-zero multiple of 8"),
        ("general.alignment 3", "non-zero multiple of 8"),
        ("block_count 1", "does not use: blk.1."),
        ("block_count 3", "missing tensors"),
        ("tokenizer model llama", "spelled for the other model"),
        ("300-token tokenizer", "300 tokens for a model of 256"),
        (
            "checkpoint config with 1 layer",
            "does not use: model.layers.1.",
        ),
        ("NaN in token_embd.weight", "non-finite value"),
    ] {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(&format!("refused {what}")))
            .unwrap_or_else(|| panic!("no variant {what}"));
        assert!(line.contains(needle), "{line}");
    }
    // Issue 37: each refusal says what is wrong, naming the key or tensor.
    let line_of = |name: &str| {
        stdout
            .lines()
            .find(|l| {
                l.strip_prefix("refused ")
                    .and_then(|l| l.strip_prefix(name))
                    .is_some_and(|r| r.starts_with(": "))
            })
            .unwrap_or_else(|| panic!("no variant {name}"))
    };
    for (name, _, needles) in &issue_37 {
        let line = line_of(name);
        println!("{line}");
        for needle in needles.split(" && ") {
            assert!(line.contains(needle), "{name}: {needle:?} not in {line}");
        }
    }
    // The safetensors path is said once, not again by candle.
    for name in [
        "safetensors header of garbage",
        "safetensors header length 2^62",
    ] {
        let line = line_of(name);
        assert_eq!(line.matches("model.safetensors").count(), 1, "{line}");
        assert!(!line.contains("path: "), "{line}");
    }
    println!("hostile model variants tried through the library: {refused}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs `f` on another thread and fails if it has not returned within 10
/// seconds (a blocking open would hang forever).
fn within_10_s<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(10))
        .unwrap_or_else(|_| panic!("{what} blocked"))
}

#[test]
fn special_files_are_refused_by_type_without_blocking() {
    let tmp = scratch();
    let fifo = tmp.path().join("fifo");
    let _ = std::fs::remove_file(&fifo);
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid C string; mkfifo only creates the node.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let tk = hostile_tokenizer(tmp.path());
    for path in [fifo.clone(), "/dev/zero".into(), "/dev/urandom".into()] {
        let p = path.clone();
        let e = within_10_s("ModelFiles::open", move || {
            input::check_model_path(&p).and_then(|_| ModelFiles::open(&p).map(|_| ()))
        })
        .unwrap_err();
        assert!(matches!(e, ModelError::NotAFile { .. }), "{e}");
        let p = path.clone();
        let e = within_10_s("TextTokenizer::from_file", move || {
            TextTokenizer::from_file(&p).map(|_| ())
        })
        .unwrap_err();
        assert!(matches!(e, ModelError::NotAFile { .. }), "{e}");
        let (p, t) = (path.clone(), tk.clone());
        let e = within_10_s("text_tokens", move || {
            input::text_tokens(&p, &load_tokenizer(&t), 64).map(|_| ())
        })
        .unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
        let (p, t) = (path.clone(), tk.clone());
        let e = within_10_s("prompt_tokens", move || {
            input::prompt_tokens(&load_tokenizer(&t), Prompt::File(&p), None).map(|_| ())
        })
        .unwrap_err();
        assert!(e.to_string().contains(path.to_str().unwrap()), "{e}");
    }
    // A directory where a file is expected.
    let e = input::text_tokens(&tmp.path().join(""), &load_tokenizer(&tk), 8).unwrap_err();
    assert!(e.to_string().contains("directory"), "{e}");
    let _ = std::fs::remove_file(&fifo);
}

/// A word-level `tokenizer.json` over `w0`..`w254` and `[UNK]`, written
/// in `scratch`; its path.
fn hostile_tokenizer(scratch: &Path) -> PathBuf {
    let mut vocab = serde_json::Map::new();
    for i in 0..255 {
        vocab.insert(format!("w{i}"), serde_json::Value::from(i));
    }
    vocab.insert("[UNK]".into(), 255.into());
    let tk = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": null, "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": null, "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"}
    });
    let p = scratch.join("words-tokenizer.json");
    std::fs::write(&p, tk.to_string()).unwrap();
    p
}

fn load_tokenizer(p: &Path) -> TextTokenizer {
    TextTokenizer::from_file(p).unwrap()
}

/// The real model's tokenizer when `models/` has it (byte-level BPE with
/// merges and a split regex: the hard case for cutting a prefix), else the
/// tiny GGUF's byte-level one (written in `scratch`).
fn bpe_tokenizer(scratch: &Path) -> (TextTokenizer, &'static str) {
    let real =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if real.is_file() {
        let files = ModelFiles::open(&real).unwrap();
        return (files.tokenizer(None).unwrap(), "SmolLM2's");
    }
    let dir = scratch.join("bpe");
    let (base, _) = hostile::model_variants(&fixture(""), &dir);
    let files = ModelFiles::open(&base).unwrap();
    (files.tokenizer(None).unwrap(), "the tiny byte-level")
}

#[test]
fn texts_are_tokenized_only_as_far_as_the_window_needs() {
    // A text of words, spaces, newlines, punctuation and runs of blanks.
    let mut text = String::new();
    let mut i = 0u64;
    while text.len() < 6 << 20 {
        i = i
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let w = (i >> 33) % 255;
        let sep = match (i >> 20) % 17 {
            0 => "\n",
            1 => ".\n\n",
            2 => "  ",
            3 => ", ",
            _ => " ",
        };
        text.push_str(&format!("w{w}{sep}"));
    }
    let tmp = scratch();
    let path = tmp.path().join("long.txt");
    std::fs::write(&path, &text).unwrap();
    let words = load_tokenizer(&hostile_tokenizer(tmp.path()));
    let (bpe, which) = bpe_tokenizer(tmp.path());
    let head: String = text.chars().take(400_000).collect();
    for (tk, name) in [(&words, "word-level"), (&bpe, which)] {
        let whole = tk.encode(&head).unwrap();
        for need in [2usize, 64, 1000, 20_000] {
            let start = Instant::now();
            let ids = input::text_tokens(&path, tk, need).unwrap();
            let secs = start.elapsed().as_secs_f64();
            assert_eq!(ids.len(), need, "{name}");
            assert_eq!(ids[..], whole[..need], "{name}: {need} tokens");
            if need == 64 {
                // A few kilobytes of the 6 MB are read (the whole text
                // takes seconds in a debug build).
                assert!(secs < 1.0, "{name}: {secs} s for 64 tokens");
            }
        }
    }
    // A short text gives all its tokens; bad UTF-8 is named by offset.
    let short = tmp.path().join("short.txt");
    std::fs::write(&short, "w1 w2 w3").unwrap();
    assert_eq!(input::text_tokens(&short, &words, 64).unwrap(), [1, 2, 3]);
    std::fs::write(&short, b"w1 w2 caf\xe9 w3").unwrap();
    let e = input::text_tokens(&short, &words, 64).unwrap_err();
    assert!(
        e.to_string()
            .contains("not UTF-8 text (invalid byte at offset 9)"),
        "{e}"
    );
}

#[test]
fn prompts_over_the_cap_are_refused_naming_it() {
    let tmp = scratch();
    let words = load_tokenizer(&hostile_tokenizer(tmp.path()));
    let prompt: String = (0..MAX_PROMPT_TOKENS + 10)
        .map(|i| format!("w{} ", i % 255))
        .collect();
    let path = tmp.path().join("prompt.txt");
    std::fs::write(&path, &prompt).unwrap();
    let start = Instant::now();
    let e = input::prompt_tokens(&words, Prompt::File(&path), None).unwrap_err();
    assert!(
        e.to_string().contains(&MAX_PROMPT_TOKENS.to_string()),
        "{e}"
    );
    assert!(start.elapsed() < Duration::from_secs(20));
    let e = input::prompt_tokens(&words, Prompt::Text(&prompt), None).unwrap_err();
    assert!(e.to_string().contains("cap on prompt tokens"), "{e}");
    // Its last tokens can be kept.
    let ids = input::prompt_tokens(&words, Prompt::File(&path), Some(5)).unwrap();
    assert_eq!(ids.len(), 5);
    let ids = input::prompt_tokens(&words, Prompt::Text("w7 w8"), None).unwrap();
    assert_eq!(ids, [7, 8]);
}

/// The fuzz targets' seed corpus (`fuzz/corpus`), replayed on stable with
/// the `gguf_header` target's check: whatever the scan accepts, candle's
/// reader reads to the same tensor count and data offset.
#[test]
fn the_fuzz_corpus_replays_on_stable() {
    use candle_core::quantized::gguf_file::Content;
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus");
    let mut accepted = Vec::new();
    let mut entries: Vec<_> = std::fs::read_dir(corpus.join("gguf_header"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for p in &entries {
        let data = std::fs::read(p).unwrap();
        let cursor = &mut std::io::Cursor::new(&data);
        if let Ok(scan) = posenc_models::gguf::scan_header(cursor, data.len() as u64) {
            let content = Content::read(&mut std::io::Cursor::new(&data))
                .unwrap_or_else(|e| panic!("{}: candle refuses: {e}", p.display()));
            assert_eq!(content.tensor_infos.len(), scan.tensors);
            assert_eq!(content.tensor_data_offset, scan.data_offset);
            accepted.push(p.file_name().unwrap().to_string_lossy().into_owned());
        }
    }
    assert_eq!(
        accepted,
        [
            "aligned-64.gguf",
            "every-type.gguf",
            "no-tensors.gguf",
            "v1.gguf"
        ]
    );
    let st = |name: &str| {
        let data = std::fs::read(corpus.join("safetensors_header").join(name)).unwrap();
        candle_core::safetensors::load_buffer(&data, &candle_core::Device::Cpu)
    };
    assert_eq!(st("two.safetensors").unwrap().len(), 2);
    assert!(st("empty.safetensors").unwrap().is_empty());
    assert!(st("bad-offsets.safetensors").is_err());
}
