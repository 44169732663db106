//! Issue 29 through the binary: every hostile model variant of the
//! generator (`posenc-models/tests/common/hostile.rs`), every special file
//! as `--model`, `--text`, `--tokenizer` and `--prompt-file`, an oversized
//! prompt and unwritable `--out` targets, each run of `posenc` limited to
//! 1 GiB of address space (RLIMIT_AS) and 20 seconds: exit status 2, one
//! line starting with `posenc: error: `, no panic, no abort, no hang. A
//! 6 MB text with `--length 16` runs within the same limits. Issue 37's
//! eight kinds and confusing messages continue this suite in
//! `hostile_files.rs`, the memory plan's edges in `memory_plan.rs`.

use crate::common;

use crate::hostile;
use common::argv;

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../posenc-models/tests/fixtures")
}

/// A new scratch directory for one test, removed when dropped.
fn scratch() -> tempfile::TempDir {
    common::tempdir("cli-hostile")
}

/// Runs `posenc args` under the memory limit, killed after 20 s.
fn limited(args: &[&str]) -> (Output, Duration) {
    let mut cmd = common::command(args);
    hostile::limit_memory(&mut cmd);
    common::output_within(cmd, Duration::from_secs(20), args)
}

/// `posenc args` must be refused with one line (see
/// [`common::one_line_error`]) under the limits; the line.
fn refused(args: &[&str]) -> String {
    let (out, _) = limited(args);
    common::one_line_error(out, args)
}

/// A text of `bytes` bytes of words as the file `name` in `scratch`.
fn words_text(scratch: &Path, name: &str, bytes: usize) -> PathBuf {
    let mut t = String::with_capacity(bytes + 8);
    let mut i = 0usize;
    while t.len() < bytes {
        t.push_str(&format!("w{} ", (i * 37 + 11) % 255));
        i += 1;
    }
    let p = scratch.join(name);
    std::fs::write(&p, t).unwrap();
    p
}

#[test]
fn every_hostile_model_is_refused_with_one_line_in_1_gib() {
    let tmp = scratch();
    let dir = tmp.path().join("variants");
    let (base, variants) = hostile::model_variants(&fixtures(), &dir);
    let text = words_text(tmp.path(), "text.txt", 4096);
    let tk = common::word_tokenizer_file();
    let args_for = |model: &Path| -> Vec<String> {
        let mut a: Vec<String> = argv(
            "perplexity --model {} --text {} --length 16 --band 8 --scaling none --quiet --json",
            &[model.to_str().unwrap(), text.to_str().unwrap()],
        )
        .iter()
        .map(|s| s.to_string())
        .collect();
        if model.is_dir() {
            a.extend(["--tokenizer".into(), tk.to_str().unwrap().into()]);
        }
        a
    };
    // The undamaged base runs (the generator writes a valid model).
    let a = args_for(&base);
    let a: Vec<&str> = a.iter().map(String::as_str).collect();
    let (out, _) = limited(&a);
    let v: serde_json::Value = serde_json::from_str(&common::ok(&out)).unwrap();
    assert!(v["scalings"]["none"]["mean_inside"]
        .as_f64()
        .unwrap()
        .is_finite());
    // Every variant is refused: two at a time.
    let next = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(v) = variants.get(i) else { break };
                let a = args_for(&v.model);
                let a: Vec<&str> = a.iter().map(String::as_str).collect();
                let (out, _) = limited(&a);
                let err = String::from_utf8_lossy(&out.stderr).to_string();
                assert!(
                    out.status.code() == Some(2)
                        && err.lines().count() == 1
                        && err.starts_with("posenc: error: ")
                        && !err.contains("panicked"),
                    "{}: status {:?}, stderr {err:?}",
                    v.name,
                    out.status
                );
            });
        }
    });
    println!(
        "hostile model variants tried through the CLI: {}, all refused with one line",
        variants.len()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn special_files_huge_prompts_and_unwritable_outputs_are_refused_first() {
    let tmp = scratch();
    let model_dir = tmp.path().join("model");
    let (model, _) = {
        // Only the base model is needed here.
        let (base, v) = hostile::model_variants(&fixtures(), &model_dir);
        (base, v.len())
    };
    let model = model.to_str().unwrap().to_string();
    let tk = common::word_tokenizer_file();
    let tk = tk.to_str().unwrap();
    let text = words_text(tmp.path(), "ok.txt", 2048);
    let text = text.to_str().unwrap();
    let fifo = tmp.path().join("fifo");
    let _ = std::fs::remove_file(&fifo);
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid C string; mkfifo only creates the node.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let dir = tmp.path().join("a-directory");
    std::fs::create_dir_all(&dir).unwrap();
    let mut tried = 0;
    for special in [
        fifo.to_str().unwrap(),
        "/dev/zero",
        "/dev/urandom",
        dir.to_str().unwrap(),
    ] {
        let cases: [Vec<&str>; 4] = [
            vec!["perplexity", "--model", special, "--text", text],
            argv(
                "perplexity --model {} --text {} --length 16",
                &[&model, special],
            ),
            argv(
                "perplexity --model {} --text {} --tokenizer {}",
                &[&model, text, special],
            ),
            vec!["generate", "--model", &model, "--prompt-file", special],
        ];
        for args in cases {
            if special == dir.to_str().unwrap() && args[2] == special {
                // A directory is a checkpoint: refused for its missing config.
                refused(&args);
            } else {
                let err = refused(&args);
                assert!(err.contains(special), "{err}");
            }
            tried += 1;
        }
    }
    // A 1 MiB prompt: refused before any prefill, naming the cap.
    let prompt = words_text(tmp.path(), "prompt.txt", 1 << 20);
    let (out, took) = limited(&argv(
        "generate --model {} --tokenizer {} --prompt-file {}",
        &[&model, tk, prompt.to_str().unwrap()],
    ));
    let err = common::one_line_error(out, &[]);
    assert!(
        err.contains("131072") && err.contains("--prompt-tokens"),
        "{err}"
    );
    assert!(took < Duration::from_secs(10), "{took:?}");
    // Its last tokens can be kept.
    let (out, _) = limited(&argv(
        "generate --model {} --tokenizer {} --prompt-file {} \
         --prompt-tokens 8 --max-tokens 2 --json",
        &[&model, tk, prompt.to_str().unwrap()],
    ));
    let v: serde_json::Value = serde_json::from_str(&common::ok(&out)).unwrap();
    assert_eq!(v["prompt_ids"].as_array().unwrap().len(), 8);
    // --out into a missing directory or /proc: refused before the model is
    // read, naming the path.
    for out in ["/nonexistent-posenc-dir/loss.svg", "/proc/loss.svg"] {
        let err = refused(&argv(
            "perplexity --model {} --text {} --out {}",
            &[&model, text, out],
        ));
        assert!(err.contains(out), "{err}");
        tried += 1;
    }
    // A 6 MB text with a window of 16 tokens: read only as far as needed.
    let big = words_text(tmp.path(), "big.txt", 6 << 20);
    let (out, took) = limited(&[
        "perplexity",
        "--model",
        &model,
        "--tokenizer",
        tk,
        "--text",
        big.to_str().unwrap(),
        "--length",
        "16",
        "--band",
        "8",
        "--scaling",
        "none",
        "--json",
        "--out",
        tmp.path().join("loss.svg").to_str().unwrap(),
    ]);
    common::ok(&out);
    assert!(took < Duration::from_secs(10), "{took:?}");
    assert!(std::fs::read_to_string(tmp.path().join("loss.svg"))
        .unwrap()
        .contains("<svg"));
    println!("special-file, prompt and output cases tried through the CLI: {tried}");
    let _ = std::fs::remove_file(&fifo);
}
