//! `posenc train --tokens bpe:N` end to end: the checkpoint keeps its
//! tokenizer, `eval`, `probe`, `shuffle` and `finetune` read it, any script
//! trains, and a text too short for the vocabulary is one line and exit 2.

use std::path::PathBuf;
use std::process::Output;

use crate::common;

use common::argv;

use serde_json::Value;

fn posenc(args: &[&str]) -> Output {
    // The tokenizer cache of these runs stays in their scratch space: Cargo's
    // directory for integration tests' files, under target/.
    let cache = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("posenc-subword-cli-cache");
    common::run(args, &[("POSENC_CACHE", cache.as_os_str())])
}

fn ok(args: &[&str]) -> String {
    common::stdout_ok(posenc(args), args)
}

fn fails(args: &[&str]) -> String {
    common::one_line_error(posenc(args), args)
}

/// A fresh directory `name` in a new scratch directory, and the guard that
/// removes the latter when dropped.
fn tmp(name: &str) -> (tempfile::TempDir, PathBuf) {
    common::fresh_dir(&format!("subword-cli-{name}"), name)
}

const PRIDE: &str = include_str!("../../../assets/corpus/pride-and-prejudice.txt");

fn train_args<'a>(corpus: &'a str, tokens: &'a str, out: &'a str, task: &'a str) -> Vec<&'a str> {
    argv(
        "train --task {} --pe rope --tokens {} --corpus {} --train-len 16 --steps 4 \
         --layers 1 --d-model 16 --heads 2 --batch 4 --out {} --quiet",
        &[task, tokens, corpus, out],
    )
}

#[test]
fn a_bpe_checkpoint_keeps_its_tokenizer_for_every_command() {
    let (_tmp, d) = tmp("bpe");
    let corpus = d.join("pride.txt");
    let end = PRIDE.char_indices().nth(80_000).unwrap().0;
    std::fs::write(&corpus, &PRIDE[..end]).unwrap();
    let ck = d.join("ck");
    let (c, k) = (corpus.to_str().unwrap(), ck.to_str().unwrap());
    let out = ok(&train_args(c, "bpe:384", k, "lm"));
    assert!(out.contains("step 4/4"), "{out}");
    let tok: Value =
        serde_json::from_str(&std::fs::read_to_string(ck.join("tokenizer.json")).unwrap()).unwrap();
    assert_eq!(tok["model"]["type"], "BPE");
    assert_eq!(tok["model"]["vocab"].as_object().unwrap().len(), 384);
    let cfg: Value =
        serde_json::from_str(&std::fs::read_to_string(ck.join("config.json")).unwrap()).unwrap();
    assert_eq!(
        cfg["tokens"],
        serde_json::json!({"kind": "bpe", "vocab": 384})
    );
    assert_eq!(cfg["model"]["vocab_size"], 384);
    let e: Value = serde_json::from_str(&ok(&argv(
        "eval --checkpoint {} --lengths 16 --batches 1 --json",
        &[k],
    )))
    .unwrap();
    let (loss, bpc) = (
        e["loss"][0].as_f64().unwrap(),
        e["bits_per_char"][0].as_f64().unwrap(),
    );
    // Several characters per token: fewer bits per character than nats per
    // token.
    assert!(bpc > 0.0 && bpc < loss, "{e}");
    let text = ok(&argv("eval --checkpoint {} --lengths 16 --batches 1", &[k]));
    assert!(
        text.contains("tokens bpe:384") && text.contains("bits/char"),
        "{text}"
    );
    let s: Value = serde_json::from_str(&ok(&["shuffle", "--checkpoint", k, "--json"])).unwrap();
    assert!(s["in_order"].as_f64().unwrap().is_finite());
    let p: Value = serde_json::from_str(&ok(&["probe", "--checkpoint", k, "--json"])).unwrap();
    assert_eq!(p["mae"].as_array().unwrap().len(), 2);
    let ft = d.join("ft");
    ok(&argv(
        "finetune --checkpoint {} --len 32 --steps 2 --out {} --quiet",
        &[k, ft.to_str().unwrap()],
    ));
    assert_eq!(
        std::fs::read_to_string(ft.join("tokenizer.json")).unwrap(),
        std::fs::read_to_string(ck.join("tokenizer.json")).unwrap()
    );
    // A checkpoint whose tokenizer.json was swapped for another size's is
    // refused in one line.
    let other = d.join("other");
    ok(&train_args(c, "bpe:300", other.to_str().unwrap(), "mlm"));
    std::fs::copy(other.join("tokenizer.json"), ck.join("tokenizer.json")).unwrap();
    let err = fails(&["eval", "--checkpoint", k, "--lengths", "16"]);
    assert!(err.contains("bpe:384"), "{err}");
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn russian_and_chinese_texts_train_on_subwords() {
    let (_tmp, d) = tmp("scripts");
    let ru = "Все этапы в блоке кодировщика модели трансформера работают независимо для \
              каждого токена. Позиционное кодирование сообщает модели порядок слов. "
        .repeat(60);
    let zh = "位置编码使模型能够理解序列顺序。注意力机制本身不知道词语的先后。".repeat(150);
    for (name, text) in [("ru", ru), ("zh", zh)] {
        let f = d.join(format!("{name}.txt"));
        std::fs::write(&f, &text).unwrap();
        let out = d.join(name);
        let o = ok(&train_args(
            f.to_str().unwrap(),
            "bpe:320",
            out.to_str().unwrap(),
            "lm",
        ));
        assert!(o.contains("step 4/4"), "{name}: {o}");
    }
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_text_too_short_for_the_vocabulary_is_one_line_and_exit_2() {
    let (_tmp, d) = tmp("short");
    let f = d.join("short.txt");
    std::fs::write(
        &f,
        "A short text. A short text. Far too short for it.\n".repeat(3),
    )
    .unwrap();
    let out = d.join("ck");
    let err = fails(&train_args(
        f.to_str().unwrap(),
        "bpe:4096",
        out.to_str().unwrap(),
        "lm",
    ));
    assert!(
        err.contains("too short for a BPE vocabulary of 4096"),
        "{err}"
    );
    assert!(!out.join("config.json").exists());
    for bad in ["bpe:10", "bpe:x", "words"] {
        let err = fails(&train_args(
            f.to_str().unwrap(),
            bad,
            out.to_str().unwrap(),
            "lm",
        ));
        assert!(err.contains("bpe:N"), "{err}");
    }
    // Tokens apply to the corpus tasks only.
    let err = fails(&argv(
        "train --task copy --pe rope --tokens bpe:300 --out {} --quiet",
        &[out.to_str().unwrap()],
    ));
    assert!(err.contains("lm and mlm"), "{err}");
    let _ = std::fs::remove_dir_all(&d);
}
