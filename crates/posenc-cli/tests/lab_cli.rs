//! `posenc train`, `eval`, `probe`, `shuffle`, `show --checkpoint` and
//! `bench train` end to end, on tiny models.

use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::Value;

fn posenc(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_posenc"))
        .args(args)
        .output()
        .expect("run posenc")
}

fn ok(args: &[&str]) -> String {
    let out = posenc(args);
    assert!(
        out.status.success(),
        "posenc {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn fails(args: &[&str]) -> String {
    let out = posenc(args);
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(2), "posenc {args:?}: {err}");
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    assert!(err.starts_with("posenc: error:"), "{err}");
    err
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("posenc-lab-cli-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

const TINY: [&str; 8] = [
    "--layers",
    "1",
    "--d-model",
    "16",
    "--heads",
    "2",
    "--batch",
    "8",
];

fn train(dir: &str, task: &str, pe: &str, steps: &str) -> String {
    let mut args = vec![
        "train",
        "--task",
        task,
        "--pe",
        pe,
        "--train-len",
        "12",
        "--steps",
        steps,
        "--out",
        dir,
        "--quiet",
    ];
    args.extend(TINY);
    ok(&args)
}

#[test]
fn train_eval_probe_shuffle_and_show_a_checkpoint() {
    let d = tmp("learned");
    let ds = d.to_str().unwrap();
    let out = train(ds, "lm", "learned", "6");
    assert!(out.contains("step 6/6"), "{out}");
    for f in [
        "config.json",
        "model.safetensors",
        "optimizer.safetensors",
        "metrics.jsonl",
    ] {
        assert!(d.join(f).exists(), "{f} missing");
    }
    let metrics = std::fs::read_to_string(d.join("metrics.jsonl")).unwrap();
    for line in metrics.lines() {
        let m: Value = serde_json::from_str(line).unwrap();
        for k in ["step", "loss", "accuracy", "lr", "tokens_per_s"] {
            assert!(m.get(k).is_some(), "{k} missing in {line}");
        }
    }
    let e: Value = serde_json::from_str(&ok(&[
        "eval",
        "--checkpoint",
        ds,
        "--lengths",
        "8,12",
        "--batches",
        "1",
        "--json",
    ]))
    .unwrap();
    assert_eq!(e["lengths"], serde_json::json!([8, 12]));
    assert_eq!(e["loss"].as_array().unwrap().len(), 2);
    assert_eq!(e["accuracy"].as_array().unwrap().len(), 2);
    // Past the learned table (8 × 12 = 96 rows): a clear error.
    let err = fails(&["eval", "--checkpoint", ds, "--lengths", "200"]);
    assert!(err.contains("learned position table"), "{err}");
    let p: Value = serde_json::from_str(&ok(&["probe", "--checkpoint", ds, "--json"])).unwrap();
    assert_eq!(p["mae"].as_array().unwrap().len(), 2, "{p}");
    assert!(p["baseline_mae"].as_f64().unwrap() > 0.0);
    let s: Value = serde_json::from_str(&ok(&["shuffle", "--checkpoint", ds, "--json"])).unwrap();
    assert!(s["in_order"].as_f64().unwrap().is_finite());
    assert!(s["unigram"].as_f64().unwrap() > 0.0);
    // The trained table as a picture and in the terminal.
    let text = ok(&[
        "show",
        "learned",
        "--checkpoint",
        ds,
        "--positions",
        "8",
        "--color",
        "plain",
    ]);
    assert!(text.contains("trained 6 steps"), "{text}");
    let png = d.join("learned.png");
    ok(&[
        "show",
        "learned",
        "--checkpoint",
        ds,
        "-o",
        png.to_str().unwrap(),
    ]);
    assert!(std::fs::metadata(&png).unwrap().len() > 1000);
    let err = fails(&["show", "floater", "--checkpoint", ds]);
    assert!(err.contains("trained with learned"), "{err}");
}

#[test]
fn resume_and_refusals() {
    let d = tmp("resume");
    let ds = d.to_str().unwrap();
    train(ds, "copy", "rope", "4");
    // The same --out again without --resume is refused.
    let mut args = vec![
        "train", "--task", "copy", "--pe", "rope", "--steps", "4", "--out", ds, "--quiet",
    ];
    args.extend(TINY);
    let err = fails(&args);
    assert!(err.contains("--resume"), "{err}");
    // --resume on a finished run is a no-op that keeps the step count.
    args.push("--resume");
    let out = ok(&args);
    assert!(out.contains("step 4/4"), "{out}");
    // A corrupt checkpoint is an error, not a fresh start.
    std::fs::write(d.join("model.safetensors"), b"garbage").unwrap();
    let err = fails(&args);
    assert!(err.contains("corrupt"), "{err}");
    let err = fails(&["eval", "--checkpoint", ds]);
    assert!(err.contains("corrupt"), "{err}");
}

#[test]
fn bad_lab_arguments_are_one_line_errors() {
    let d = tmp("bad");
    let ds = d.to_str().unwrap();
    let e = fails(&["train", "--task", "juggling", "--pe", "rope", "--out", ds]);
    assert!(e.contains("juggling") && e.contains("copy"), "{e}");
    let e = fails(&["train", "--task", "copy", "--pe", "wavelet", "--out", ds]);
    assert!(e.contains("wavelet") && e.contains("alibi"), "{e}");
    let e = fails(&[
        "train", "--task", "copy", "--pe", "rope", "--heads", "3", "--out", ds,
    ]);
    assert!(e.contains("divisible"), "{e}");
    let e = fails(&[
        "train", "--task", "copy", "--pe", "rope", "--lr", "-1", "--out", ds,
    ]);
    assert!(e.contains("learning rate"), "{e}");
    let e = fails(&[
        "train",
        "--task",
        "copy",
        "--pe",
        "rope",
        "--train-len",
        "2",
        "--steps",
        "1",
        "--out",
        ds,
    ]);
    assert!(e.contains("too short"), "{e}");
    let e = fails(&["eval", "--checkpoint", "/nonexistent/run"]);
    assert!(e.contains("config.json"), "{e}");
    let e = fails(&[
        "train",
        "--task",
        "lm",
        "--pe",
        "rope",
        "--corpus",
        "/nonexistent.txt",
        "--out",
        ds,
    ]);
    assert!(e.contains("nonexistent"), "{e}");
    let e = fails(&["bench", "train", "--steps", "0"]);
    assert!(e.contains("steps"), "{e}");
}

#[test]
fn eval_time_scaling_needs_a_rope_model() {
    let d = tmp("scaling");
    let ds = d.to_str().unwrap();
    train(ds, "copy", "alibi", "2");
    let e = fails(&[
        "eval",
        "--checkpoint",
        ds,
        "--lengths",
        "24",
        "--scaling",
        "yarn",
    ]);
    assert!(e.contains("RoPE"), "{e}");
    let r = tmp("scaling-rope");
    let rs = r.to_str().unwrap();
    train(rs, "copy", "rope", "2");
    for s in ["none", "linear", "ntk", "dynamic", "yarn"] {
        let v: Value = serde_json::from_str(&ok(&[
            "eval",
            "--checkpoint",
            rs,
            "--lengths",
            "12,24",
            "--scaling",
            s,
            "--batches",
            "1",
            "--json",
        ]))
        .unwrap();
        assert!(v["loss"][1].as_f64().unwrap().is_finite(), "{s}");
    }
    let e = fails(&["eval", "--checkpoint", rs, "--scaling", "magic"]);
    assert!(e.contains("magic"), "{e}");
}
