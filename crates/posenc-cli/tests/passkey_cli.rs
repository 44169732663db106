//! `posenc passkey` refuses bad input with one line and exit 2 before the
//! model is read: the model given here is not a model at all, so any error
//! about the arguments proves they were checked first.

use crate::common;
use crate::model;

use std::path::PathBuf;

use common::{argv, fails_mentioning};
use tempfile::TempDir;

/// A fresh scratch directory for one test, removed when dropped.
fn scratch(name: &str) -> TempDir {
    common::tempdir(&format!("passkey-{name}"))
}

/// A fresh scratch directory for one test, and a file in it that is not a
/// model.
fn with_a_non_model(name: &str) -> (TempDir, PathBuf) {
    let dir = scratch(name);
    let p = dir.path().join("not-a-model.gguf");
    std::fs::write(&p, b"this is not a GGUF file").unwrap();
    (dir, p)
}

#[test]
fn bad_methods_and_grids_are_refused_before_the_model() {
    let (_dir, model) = with_a_non_model("grid");
    let m = model.to_str().unwrap();
    let cases = [
        ("--scaling foo:2", "unknown scaling"),
        ("--scaling self-extend:0:512", "out of range"),
        ("--scaling self-extend:4:0", "out of range"),
        ("--scaling self-extend:3:512", "must divide"),
        ("--scaling rerope:0", "out of range"),
        ("--scaling leaky-rerope:512:0", "above 0"),
        ("--scaling leaky-rerope:512:-2", "above 0"),
        ("--scaling sinks:8:4", "no recent keys"),
        ("--scaling dca:512:512", "below the chunk size"),
        ("--scaling self-extend:4:512+dynamic:2", "dynamic"),
        ("--depths 0,1.5", "outside [0, 1]"),
        ("--depths -0.1", "outside [0, 1]"),
        ("--lengths 2048,10", "too short"),
    ];
    for (extra, needle) in cases {
        let mut args = vec!["passkey", "--model", m];
        args.extend(common::words(extra));
        fails_mentioning(&args, needle);
    }
    fails_mentioning(&["passkey", "--model", m, "--trials", "0"], "trials");
    // Every count is capped (issue 37): no grid runs on without end.
    fails_mentioning(
        &["passkey", "--model", m, "--trials", "18446744073709551615"],
        "1..=10000",
    );
    fails_mentioning(
        &["passkey", "--model", m, "--lengths", "abc"],
        "not a number",
    );
}

#[test]
fn bad_haystacks_are_refused_before_the_model() {
    let (tmp, model) = with_a_non_model("haystack");
    let dir = tmp.path();
    let m = model.to_str().unwrap();
    let short = dir.join("short.txt");
    std::fs::write(&short, "Too few words here.").unwrap();
    fails_mentioning(
        &[
            "passkey",
            "--model",
            m,
            "--haystack",
            short.to_str().unwrap(),
        ],
        "at least 64 are needed",
    );
    let binary = dir.join("binary.txt");
    let mut bytes = b"words ".repeat(100);
    bytes.extend_from_slice(&[0xff, 0xfe, 0x00]);
    std::fs::write(&binary, &bytes).unwrap();
    fails_mentioning(
        &[
            "passkey",
            "--model",
            m,
            "--haystack",
            binary.to_str().unwrap(),
        ],
        "not UTF-8",
    );
    fails_mentioning(
        &["passkey", "--model", m, "--haystack", dir.to_str().unwrap()],
        "directory",
    );
    fails_mentioning(
        &[
            "passkey",
            "--model",
            m,
            "--out",
            "/nonexistent-dir/heat.svg",
        ],
        "/nonexistent-dir",
    );
    fails_mentioning(
        &["passkey", "--model", m, "--out", "heat.txt"],
        ".png or .svg",
    );
}

/// A haystack too short for the length is refused once the tokenizer has
/// measured it, before the weights are read (needs the real model).
#[test]
fn a_haystack_shorter_than_the_length_is_refused() {
    let Some(model) = model::model_path("a_haystack_shorter_than_the_length_is_refused") else {
        return;
    };
    let dir = scratch("short");
    let hay = dir.path().join("hay.txt");
    std::fs::write(&hay, "The cat sat on the mat. ".repeat(40)).unwrap();
    fails_mentioning(
        &argv(
            "passkey --model {} --haystack {} --lengths 4096",
            &[model.to_str().unwrap(), hay.to_str().unwrap()],
        ),
        "too short",
    );
}

#[test]
fn bad_logs_are_refused_before_the_model() {
    let (tmp, model) = with_a_non_model("log");
    let dir = tmp.path();
    let m = model.to_str().unwrap();
    let d = dir.to_str().unwrap();
    fails_mentioning(&["passkey", "--model", m, "--log", d], "not a regular file");
    let missing = dir.join("no-such-dir").join("grid.jsonl");
    fails_mentioning(
        &["passkey", "--model", m, "--log", missing.to_str().unwrap()],
        "--log",
    );
}
