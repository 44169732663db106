//! Issue 37 through the binary: each of its eight kinds of failure and
//! each of its confusing messages, as a table of `posenc` command lines
//! run two at a time, every run limited to 1 GiB of address space
//! (RLIMIT_AS) and 20 seconds. A refusal exits 2 with one line starting
//! `posenc: error: `, free of control characters (no terminal escape from
//! a file reaches the terminal), without a panic or an abort, holding the
//! words that name the file, key or flag and what is accepted. The cases
//! that must run succeed with a loss below ln(V).
//!
//! The models are the generator's (`posenc-models/tests/common/hostile.rs`:
//! the tiny Qwen2.5 as GGUF, the tiny Llama 3.1 checkpoint); the adapters
//! are the fixture `posenc-tune/tests/fixtures/peft-llama31` edited one way
//! each; the resumed fine-tunes are the tiny Llama 3.1's. The memory plan's
//! edges (the largest length that fits runs, one more is refused) are in
//! `memory_plan.rs`.

use crate::common;
use crate::hostile;
use crate::model;

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use posenc_tune::peft::safetensors_head;
use serde_json::{json, Map, Value};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../posenc-models/tests/fixtures")
}

fn tiny_llama() -> String {
    fixtures()
        .join("tiny-llama31")
        .to_str()
        .unwrap()
        .to_string()
}

fn real_model(test: &str) -> Option<String> {
    model::model_path(test).map(|p| p.to_str().unwrap().to_string())
}

/// A new scratch directory `posenc-cli-files-…` in the temp dir for one
/// test, removed when dropped.
fn scratch() -> tempfile::TempDir {
    common::tempdir("cli-files")
}

/// A directory `name` in `scratch` holding the tiny Llama 3.1's
/// `config.json` only.
fn with_tiny_config(scratch: &Path, name: &str) -> PathBuf {
    let dir = scratch.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(
        fixtures().join("tiny-llama31/config.json"),
        dir.join("config.json"),
    )
    .unwrap();
    dir
}

fn s(p: &Path) -> String {
    p.to_str().unwrap().to_string()
}

/// The word-level tokenizer over the tiny models' 256 ids and a text of
/// 3,000 of its words (each written once for the whole test binary).
fn inputs() -> (String, String) {
    (
        s(&common::word_tokenizer_file()),
        s(&common::word_text_file(3000)),
    )
}

/// Runs `posenc args` under RLIMIT_AS 1 GiB, killed (and failed) after
/// 20 s; its output and how long it took.
fn limited(args: &[String]) -> (Output, Duration) {
    limited_for(args, 20)
}

/// [`limited`], killed after `secs` seconds.
fn limited_for(args: &[String], secs: u64) -> (Output, Duration) {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut cmd = common::command(&args);
    hostile::limit_memory(&mut cmd);
    common::output_within(cmd, Duration::from_secs(secs), &args)
}

/// One command line that must be refused, and the words its line holds.
struct Case {
    name: String,
    args: Vec<String>,
    words: Vec<String>,
}

/// A case: `line`'s words (each `{}` the next of `vars`), refused with a
/// line holding each of `words`.
fn case(name: &str, line: &str, vars: &[&str], words: &[&str]) -> Case {
    Case {
        name: name.into(),
        args: common::argv(line, vars)
            .into_iter()
            .map(String::from)
            .collect(),
        words: words.iter().map(|w| w.to_string()).collect(),
    }
}

/// What is wrong with the refusal of `c` (`None`: refused as it must be).
fn check(c: &Case, out: &Output) -> Option<String> {
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    let line = err.strip_suffix('\n').unwrap_or(&err);
    let mut wrong = Vec::new();
    if out.status.code() != Some(2) {
        wrong.push(format!("status {:?}", out.status));
    }
    if err.contains("panicked") || err.lines().count() != 1 || !err.ends_with('\n') {
        wrong.push("not one line".into());
    }
    if !line.starts_with("posenc: error: ") {
        wrong.push("no `posenc: error: `".into());
    }
    if line.chars().any(char::is_control) {
        wrong.push("control characters".into());
    }
    for w in &c.words {
        if !line.contains(w.as_str()) {
            wrong.push(format!("no {w:?}"));
        }
    }
    (!wrong.is_empty()).then(|| format!("{}: {}: {err:?}", c.name, wrong.join(", ")))
}

/// Runs every case, two at a time, and fails listing each case that was
/// not refused as it must be. Prints each refusal.
fn all_refused(cases: &[Case]) {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let failures = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|sc| {
        for _ in 0..2 {
            sc.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(c) = cases.get(i) else { break };
                let (out, _) = limited(&c.args);
                match check(c, &out) {
                    Some(f) => failures.lock().unwrap().push(f),
                    None => println!(
                        "{}: {}",
                        c.name,
                        String::from_utf8_lossy(&out.stderr).trim()
                    ),
                }
            });
        }
    });
    let failures = failures.into_inner().unwrap();
    assert!(
        failures.is_empty(),
        "{} of {} cases not refused in one clear line:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

/// The mean loss of a `perplexity --json` run that must succeed, checked
/// finite and below ln(V) of the tiny models (V = 256): no damaged file
/// passes as a model that predicts nothing.
fn mean_loss(out: &Output) -> f64 {
    let v: Value = serde_json::from_str(&common::ok(out)).unwrap();
    let scalings = v["scalings"].as_object().unwrap();
    let (_, first) = scalings.iter().next().unwrap();
    let loss = first["mean_inside"].as_f64().unwrap();
    assert!(loss.is_finite() && loss < 256f64.ln(), "{loss}");
    loss
}

/// Kinds 3 (terminal escapes), 4 (scaling factors, bases and counts from
/// files) and 5 (weights of absurd magnitude), and the messages on a
/// `config.json` holding `[]`, `rope_theta: 1e400` and the safetensors
/// path said twice: every issue-37 model of the generator on `perplexity`,
/// the YaRN factor 1e308 on `generate` and `passkey --scaling model` too.
#[test]
fn hostile_models_are_refused_naming_the_key_in_1_gib() {
    let tmp = scratch();
    let dir = tmp.path().join("models");
    let (tk, text) = inputs();
    let variants = hostile::issue_37_variants(&fixtures(), &dir.join("issue-37"));
    let mut cases = Vec::new();
    let ppl = "perplexity --model {} --text {} --length 16 --band 8 --scaling none --quiet --json";
    let with_tk = |mut c: Case, model: &Path| {
        if model.is_dir() {
            c.args.extend(["--tokenizer".into(), tk.clone()]);
        }
        c
    };
    for (name, model, words) in &variants {
        let words: Vec<&str> = words.split(" && ").filter(|w| !w.is_empty()).collect();
        let m = s(model);
        cases.push(with_tk(case(name, ppl, &[&m, &text], &words), model));
        if name == "config.json yarn factor 1e308" {
            for (cmd, line) in [
                ("generate", "generate --model {} --prompt w1 --max-tokens 2"),
                ("passkey", "passkey --model {} --scaling model --lengths 64"),
            ] {
                let c = case(&format!("{name} on {cmd}"), line, &[&m], &words);
                cases.push(with_tk(c, model));
            }
        }
    }
    // The safetensors path once, not again in candle's words.
    let (_, older) = hostile::model_variants(&fixtures(), &dir.join("issue-29"));
    for v in older
        .iter()
        .filter(|v| v.name.starts_with("safetensors header"))
    {
        let m = s(&v.model);
        let c = case(&v.name, ppl, &[&m, &text], &["model.safetensors"]);
        cases.push(with_tk(c, &v.model));
    }
    all_refused(&cases);
    for c in &cases[cases.len() - 2..] {
        let (out, _) = limited(&c.args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.matches("model.safetensors").count(), 1, "{err}");
        assert!(!err.contains("path: "), "{err}");
    }
    println!("hostile models tried through the CLI: {}", cases.len());
}

/// The fixture adapter's safetensors as (name, header entry, data) in file
/// order.
type Tensors = Vec<(String, Value, Vec<u8>)>;

fn adapter_fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../posenc-tune/tests/fixtures/peft-llama31")
}

fn adapter_tensors() -> Tensors {
    let b = std::fs::read(adapter_fixture().join("adapter_model.safetensors")).unwrap();
    let n = u64::from_le_bytes(b[..8].try_into().unwrap()) as usize;
    let header: Map<String, Value> = serde_json::from_slice(&b[8..8 + n]).unwrap();
    let data = &b[8 + n..];
    let mut t: Tensors = header
        .into_iter()
        .filter(|(k, _)| k != "__metadata__")
        .map(|(k, v)| {
            let (a, z) = (
                v["data_offsets"][0].as_u64().unwrap() as usize,
                v["data_offsets"][1].as_u64().unwrap() as usize,
            );
            (k, v, data[a..z].to_vec())
        })
        .collect();
    t.sort_by_key(|(_, v, _)| v["data_offsets"][0].as_u64());
    t
}

/// An adapter directory `name` in `scratch`: the fixture's config edited by
/// `config`, its tensors by `tensors` (written packed, offsets recomputed).
fn adapter(
    scratch: &Path,
    name: &str,
    config: impl Fn(&mut Value),
    tensors: impl Fn(&mut Tensors),
) -> String {
    let d = scratch.join(format!("adapter-{name}"));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    let mut c: Value = serde_json::from_str(
        &std::fs::read_to_string(adapter_fixture().join("adapter_config.json")).unwrap(),
    )
    .unwrap();
    config(&mut c);
    std::fs::write(d.join("adapter_config.json"), c.to_string()).unwrap();
    let mut t = adapter_tensors();
    tensors(&mut t);
    let mut header = Map::new();
    header.insert("__metadata__".into(), json!({"format": "pt"}));
    let mut data = Vec::new();
    for (name, entry, bytes) in &t {
        let mut e = entry.clone();
        e["data_offsets"] = json!([data.len(), data.len() + bytes.len()]);
        header.insert(name.clone(), e);
        data.extend_from_slice(bytes);
    }
    let mut b = safetensors_head(header);
    b.extend_from_slice(&data);
    std::fs::write(d.join("adapter_model.safetensors"), b).unwrap();
    s(&d)
}

const Q0: &str = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight";

/// Sets every f32 of the tensors named in `names` to `v`.
fn fill(names: &'static [&'static str], v: f32) -> impl Fn(&mut Tensors) {
    move |t| {
        for (n, _, bytes) in t.iter_mut() {
            if names.contains(&n.as_str()) {
                for c in bytes.chunks_mut(4) {
                    c.copy_from_slice(&v.to_le_bytes());
                }
            }
        }
    }
}

/// Kinds 5 (an adapter scale of 1e38), 6 (an adapter tensor relabelled
/// I32) and 7 (`layers_to_transform` past the model's layers; honoured
/// when it fits), the adapter overflow's message and an
/// `adapter_config.json` that is a FIFO, a device or a directory: on
/// `perplexity --adapter` (and `generate --adapter`).
#[test]
fn hostile_adapters_are_refused_by_name_in_1_gib() {
    let tmp = scratch();
    let (tk, text) = inputs();
    let m = tiny_llama();
    let keep = |_: &mut Value| {};
    let same = |_: &mut Tensors| {};
    let special = |name: &str, make: &dyn Fn(&Path)| {
        let d = adapter(tmp.path(), name, keep, same);
        let cfg = Path::new(&d).join("adapter_config.json");
        std::fs::remove_file(&cfg).unwrap();
        make(&cfg);
        d
    };
    let fifo = special("fifo", &|p| {
        let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
        // SAFETY: a valid C string; mkfifo only creates the node.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    });
    let device = special("device", &|p| {
        std::os::unix::fs::symlink("/dev/zero", p).unwrap()
    });
    let directory = special("dir", &|p| std::fs::create_dir(p).unwrap());
    let b0: &'static str = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight";
    let adapters: Vec<(&str, String, Vec<&str>)> = vec![
        (
            "a tensor relabelled I32",
            adapter(tmp.path(), "i32", keep, |t| {
                t.iter_mut().for_each(|(n, e, _)| {
                    if n == Q0 {
                        e["dtype"] = "I32".into();
                    }
                })
            }),
            vec![Q0, "dtype I32", "F32, F16 or BF16"],
        ),
        (
            "layers_to_transform [100]",
            adapter(
                tmp.path(),
                "layers-100",
                |c| c["layers_to_transform"] = json!([100]),
                same,
            ),
            vec![
                "layers_to_transform holds layer 100",
                "the model has 2 layers (0..=1)",
            ],
        ),
        (
            "lora_alpha 1e38",
            adapter(tmp.path(), "alpha", |c| c["lora_alpha"] = json!(1e38), same),
            vec!["lora_alpha/r = 2.5e37 is outside [0.0009765625, 256]"],
        ),
        (
            "a factor of 1e30",
            adapter(tmp.path(), "big", keep, fill(&[Q0], 1e30)),
            vec![Q0, "holds 1e30 at index 0"],
        ),
        (
            "factors whose product overflows",
            adapter(tmp.path(), "product", keep, move |t| {
                fill(&[Q0], 9e3)(t);
                for (n, _, bytes) in t.iter_mut() {
                    if n == b0 {
                        for c in bytes.chunks_mut(4) {
                            c.copy_from_slice(&9e3f32.to_le_bytes());
                        }
                    }
                }
            }),
            vec!["merging layer 0's q_proj", "implausible"],
        ),
        (
            "adapter_config.json a FIFO",
            fifo,
            vec!["adapter_config.json is a FIFO"],
        ),
        (
            "adapter_config.json a device",
            device,
            vec!["adapter_config.json is a character device"],
        ),
        (
            "adapter_config.json a directory",
            directory,
            vec!["adapter_config.json is a directory, not a regular file"],
        ),
        (
            "adapter_config.json holding []",
            adapter(tmp.path(), "array", |c| *c = json!([]), same),
            vec!["adapter_config.json is not a JSON object but an array"],
        ),
        (
            "an escape in target_modules",
            adapter(
                tmp.path(),
                "escape",
                |c| c["target_modules"] = json!(["q_proj\u{1b}[2J"]),
                same,
            ),
            vec!["q_proj\\u{1b}[2J"],
        ),
    ];
    let mut cases = Vec::new();
    for (name, dir, words) in &adapters {
        cases.push(case(
            name,
            "perplexity --model {} --tokenizer {} --text {} --length 16 --band 8 \
             --scaling none --adapter {} --quiet --json",
            &[&m, &tk, &text, dir],
            words,
        ));
    }
    let alpha = &adapters[2];
    cases.push(case(
        "lora_alpha 1e38 on generate",
        "generate --model {} --tokenizer {} --prompt w1 --max-tokens 2 --adapter {}",
        &[&m, &tk, &alpha.1],
        &alpha.2,
    ));
    all_refused(&cases);
    for c in &cases {
        let (out, _) = limited(&c.args);
        assert!(!String::from_utf8_lossy(&out.stderr).contains("not finite"));
    }
    // layers_to_transform [0] with layer 0's factors alone: honoured (the
    // losses differ from the base's and from the whole adapter's).
    let only_0 = adapter(
        tmp.path(),
        "only-0",
        |c| c["layers_to_transform"] = json!([0]),
        |t| t.retain(|(n, _, _)| !(n.contains(".layers.1.") && n.contains("lora_"))),
    );
    let ppl = |adapter: Option<&str>| {
        let mut a: Vec<String> = common::argv(
            "perplexity --model {} --tokenizer {} --text {} --length 16 --band 8 \
             --scaling none --quiet --json",
            &[&m, &tk, &text],
        )
        .into_iter()
        .map(String::from)
        .collect();
        if let Some(d) = adapter {
            a.extend(["--adapter".into(), d.into()]);
        }
        mean_loss(&limited(&a).0)
    };
    let whole = adapter(tmp.path(), "whole", keep, same);
    let (base, layer_0, all) = (ppl(None), ppl(Some(&only_0)), ppl(Some(&whole)));
    println!("losses: base {base}, layers_to_transform [0] {layer_0}, whole adapter {all}");
    assert!(layer_0 != base && layer_0 != all, "{base} {layer_0} {all}");
}

/// Kinds 2 (`finetune --out` checked before any work) and 8 (counts and
/// factors out of range), and the messages on `linear:1e-300`,
/// `generate --scaling linear:2,yarn:2`, `--temperature -1` and
/// `self-extend:1e9:…`.
#[test]
fn arguments_and_outputs_are_refused_naming_the_flag_in_1_gib() {
    let (tk, text) = inputs();
    let m = tiny_llama();
    // A config beside weights that are not safetensors: a case refused
    // naming --out was refused before any weight was read.
    let tmp = scratch();
    let config_only = with_tiny_config(tmp.path(), "config-only");
    std::fs::write(config_only.join("model.safetensors"), b"not safetensors").unwrap();
    let co = s(&config_only);
    let file = tmp.path().join("a-file");
    std::fs::write(&file, "x").unwrap();
    let file = s(&file);
    let merged_file = tmp.path().join("merge-into-a-file");
    std::fs::create_dir_all(&merged_file).unwrap();
    std::fs::write(merged_file.join("merged"), "x").unwrap();
    let merged_file = s(&merged_file);
    let gen = "generate --model {} --tokenizer {} --prompt w1 --max-tokens 2";
    let ppl = "perplexity --model {} --tokenizer {} --text {} --length 16";
    let range = "[0.0009765625, 1024]";
    let mut cases = vec![
        case(
            "passkey --trials 2^64-1",
            "passkey --model {} --tokenizer {} --trials 18446744073709551615",
            &[&m, &tk],
            &["--trials must be in 1..=10000"],
        ),
        case(
            "yarn:1e-30",
            &format!("{ppl} --scaling yarn:1e-30"),
            &[&m, &tk, &text],
            &["\"yarn:1e-30\"", range, "frequency tables degenerate"],
        ),
        case(
            "linear:1e-300",
            &format!("{ppl} --scaling linear:1e-300"),
            &[&m, &tk, &text],
            &["\"linear:1e-300\"", range],
        ),
        case(
            "generate with two scalings",
            &format!("{gen} --scaling linear:2,yarn:2"),
            &[&m, &tk],
            &[
                "scaling \"linear:2,yarn:2\" is a list",
                "generate and finetune take one scaling",
            ],
        ),
        case(
            "--temperature -1",
            &format!("{gen} --temperature -1"),
            &[&m, &tk],
            &["temperature -1", "0 (the default)", "above 0"],
        ),
        case(
            "--top-p 2",
            &format!("{gen} --temperature 1 --top-p 2"),
            &[&m, &tk],
            &["top_p 2 must be in (0, 1]"],
        ),
        case(
            "self-extend:1e9:512",
            "passkey --model {} --tokenizer {} --scaling self-extend:1e9:512",
            &[&m, &tk],
            &["\"1e9\" = 1000000000 is out of range (1..=16777216)"],
        ),
        case(
            "finetune --merge into a file",
            "finetune --model {} --tokenizer {} --text {} --length 16 --steps 1 --merge --out {}",
            &[&co, &tk, &text, &merged_file],
            &["--merge", "merged"],
        ),
        case(
            "perplexity --out under /proc",
            &format!("{ppl} --out /proc/posenc-loss.svg"),
            &[&m, &tk, &text],
            &["--out", "/proc/posenc-loss.svg"],
        ),
        case(
            "passkey --log under /sys",
            "passkey --model {} --tokenizer {} --log /sys/posenc-grid.jsonl",
            &[&m, &tk],
            &["--log", "/sys/posenc-grid.jsonl"],
        ),
    ];
    for (out, words) in [
        (file.as_str(), "exists and is not a directory"),
        ("/proc/posenc-out", "is under /proc"),
        ("/sys/posenc-out", "is under /sys"),
        ("/dev/null", "exists and is not a directory"),
    ] {
        cases.push(case(
            &format!("finetune --out {out}"),
            "finetune --model {} --tokenizer {} --text {} --length 16 --steps 1 --out {}",
            &[&co, &tk, &text, out],
            &[&format!("--out {out}: {words}")],
        ));
    }
    all_refused(&cases);
}

/// The messages of a resumed fine-tune: another model's weights name the
/// model given and the one recorded; the step of a torn checkpoint is a
/// number, not Rust's `Some(2)`; a bad value inside `finetune.json` is
/// said to come from that file.
#[test]
fn a_resumed_finetune_says_what_is_wrong_in_1_gib() {
    let (tk, text) = inputs();
    let m = tiny_llama();
    let tmp = scratch();
    let train = |name: &str, steps: &str| {
        let out = tmp.path().join(name);
        let _ = std::fs::remove_dir_all(&out);
        let args = common::argv(
            "finetune --model {} --tokenizer {} --text {} --length 16 --lora 4 --steps {} \
             --out {} --quiet",
            &[&m, &tk, &text, steps, out.to_str().unwrap()],
        );
        let a: Vec<String> = args.into_iter().map(String::from).collect();
        common::ok(&limited(&a).0);
        out
    };
    let (three, two) = (train("ft-3", "3"), train("ft-2", "2"));
    let copy = |name: &str, edit: &dyn Fn(&Path)| {
        let d = tmp.path().join(name);
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        for e in std::fs::read_dir(&three).unwrap() {
            let p = e.unwrap().path();
            std::fs::copy(&p, d.join(p.file_name().unwrap())).unwrap();
        }
        edit(&d);
        s(&d)
    };
    let record = |d: &Path, edit: &dyn Fn(&mut Value)| {
        let p = d.join("finetune.json");
        let mut r: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
        edit(&mut r);
        std::fs::write(&p, r.to_string()).unwrap();
    };
    // The tiny model with one weight changed.
    let other = with_tiny_config(tmp.path(), "other-model");
    let mut st = std::fs::read(fixtures().join("tiny-llama31/model.safetensors")).unwrap();
    let n = u64::from_le_bytes(st[..8].try_into().unwrap()) as usize;
    let header: Value = serde_json::from_slice(&st[8..8 + n]).unwrap();
    let at = 8
        + n
        + header["model.norm.weight"]["data_offsets"][0]
            .as_u64()
            .unwrap() as usize;
    st[at..at + 4].copy_from_slice(&1.5f32.to_le_bytes());
    std::fs::write(other.join("model.safetensors"), st).unwrap();
    let o = s(&other);
    let same = copy("resume-other", &|_| {});
    let torn_adapter = copy("resume-adapter", &|d| record(d, &|r| r["step"] = 1.into()));
    let torn_opt = copy("resume-optimizer", &|d| {
        std::fs::copy(
            two.join("optimizer.safetensors"),
            d.join("optimizer.safetensors"),
        )
        .unwrap();
    });
    let steps_0 = copy("resume-steps", &|d| {
        record(d, &|r| r["config"]["steps"] = 0.into())
    });
    let resume = "finetune --resume --out {} --quiet";
    let cases = vec![
        case(
            "resumed on other weights",
            "finetune --resume --model {} --tokenizer {} --out {} --quiet",
            &[&o, &tk, &same],
            &[
                &format!("the model {o} has other weights"),
                &format!("({m} when it started"),
                "--model",
            ],
        ),
        case(
            "an adapter of another step",
            resume,
            &[&torn_adapter],
            &["its adapter is from step 3, finetune.json from step 1"],
        ),
        case(
            "an optimizer state of another step",
            resume,
            &[&torn_opt],
            &["its optimizer state is from step 2, finetune.json from step 3"],
        ),
        case(
            "steps 0 in finetune.json",
            resume,
            &[&steps_0],
            &["finetune.json holds settings", "--steps must be in 1..="],
        ),
    ];
    all_refused(&cases);
    for c in &cases {
        let (out, _) = limited(&c.args);
        assert!(!String::from_utf8_lossy(&out.stderr).contains("Some("));
    }
}

/// Kind 1: the texts and prompts that aborted. A 48 MB training text is
/// tokenized in pieces (only its ids held) and the fine-tune runs in 1 GiB;
/// a 120 KB `--prompt` and 100,000 NUL bytes are refused by the memory
/// plan naming `--prompt-tokens` (on the real model, when present; the
/// other aborts of the issue are `memory_plan.rs`'s).
#[test]
fn large_texts_and_prompts_stay_within_1_gib() {
    let (tk, _) = inputs();
    let tmp = scratch();
    let big = tmp.path().join("big.txt");
    let piece: String = (0..100_000)
        .map(|i| format!("w{} ", ((i % 97) * 89 + 13) % 255))
        .collect();
    std::fs::write(&big, piece.repeat(48_000_000 / piece.len())).unwrap();
    let out = tmp.path().join("ft-big");
    let _ = std::fs::remove_dir_all(&out);
    let args: Vec<String> = common::argv(
        "finetune --model {} --tokenizer {} --text {} --length 32 --steps 1 --lora 4 \
         --out {} --quiet --json",
        &[&tiny_llama(), &tk, &s(&big), &s(&out)],
    )
    .into_iter()
    .map(String::from)
    .collect();
    // About 20 s on two busy cores (9.4 million tokens).
    let (o, took) = limited_for(&args, 90);
    let v: Value = serde_json::from_str(&common::ok(&o)).unwrap();
    assert_eq!(v["steps"], 1);
    let tokens = v["finetune"]["train_tokens"].as_u64().unwrap();
    assert!(tokens > 9_000_000, "{tokens}");
    println!("a fine-tune on a 48 MB text ({tokens} training tokens): {took:?}");
    let _ = std::fs::remove_file(&big);
    let Some(real) = real_model("large prompts") else {
        return;
    };
    let nul = tmp.path().join("nul.txt");
    std::fs::write(&nul, vec![0u8; 100_000]).unwrap();
    let prompt = "the cat sat on the mat and the dog ran. ".repeat(3000);
    let plan = ["needs about", "RLIMIT_AS", "--prompt-tokens"];
    all_refused(&[
        case(
            "a 120 KB --prompt",
            "generate --model {} --prompt {} --max-tokens 2",
            &[&real, &prompt],
            &plan,
        ),
        case(
            "100,000 NUL bytes",
            "generate --model {} --prompt-file {} --max-tokens 2",
            &[&real, &s(&nul)],
            &plan,
        ),
    ]);
}
