//! `posenc train`, `eval`, `probe`, `shuffle`, `show --checkpoint` and
//! `bench train` end to end, on tiny models.

use std::path::{Path, PathBuf};

use crate::common;

use common::{argv, fails_mentioning, posenc, words};

use serde_json::Value;

fn ok(args: &[&str]) -> String {
    common::stdout_ok(posenc(args), args)
}

/// A new scratch directory for one test, removed when dropped.
fn scratch() -> tempfile::TempDir {
    common::tempdir("lab-cli")
}

/// The tiny model of every run here.
const TINY: &str = "--layers 1 --d-model 16 --heads 2 --batch 8";

fn train(dir: &str, task: &str, pe: &str, steps: &str) -> String {
    let mut args = argv(
        "train --task {} --pe {} --train-len 12 --steps {} --out {} --quiet",
        &[task, pe, steps, dir],
    );
    args.extend(words(TINY));
    ok(&args)
}

/// A fresh directory `name` in `scratch` with a tiny model trained in it.
fn trained(scratch: &Path, name: &str, task: &str, pe: &str, steps: &str) -> PathBuf {
    let d = scratch.join(name);
    train(d.to_str().unwrap(), task, pe, steps);
    d
}

/// A tiny RoPE model trained 2 steps in `ft-{name}-base`, and the directory
/// `ft-{name}-out` (not created) for its fine-tune.
fn finetune_dirs(scratch: &Path, name: &str) -> (PathBuf, PathBuf) {
    let base = trained(scratch, &format!("ft-{name}-base"), "copy", "rope", "2");
    (base, scratch.join(format!("ft-{name}-out")))
}

#[test]
fn train_eval_probe_shuffle_and_show_a_checkpoint() {
    let tmp = scratch();
    let d = tmp.path().join("learned");
    let ds = d.to_str().unwrap();
    let out = train(ds, "lm", "learned", "6");
    assert!(out.contains("step 6/6"), "{out}");
    let metrics = common::run_log(
        &d,
        &["config.json", "model.safetensors", "optimizer.safetensors"],
    );
    for line in metrics.lines() {
        let m: Value = serde_json::from_str(line).unwrap();
        for k in ["step", "loss", "accuracy", "lr", "tokens_per_s"] {
            assert!(m.get(k).is_some(), "{k} missing in {line}");
        }
    }
    let e: Value = serde_json::from_str(&ok(&argv(
        "eval --checkpoint {} --lengths 8,12 --batches 1 --json",
        &[ds],
    )))
    .unwrap();
    assert_eq!(e["lengths"], serde_json::json!([8, 12]));
    assert_eq!(e["loss"].as_array().unwrap().len(), 2);
    assert_eq!(e["accuracy"].as_array().unwrap().len(), 2);
    // Past the learned table (8 × 12 = 96 rows): a clear error.
    fails_mentioning(
        &["eval", "--checkpoint", ds, "--lengths", "200"],
        "learned position table",
    );
    let p: Value = serde_json::from_str(&ok(&["probe", "--checkpoint", ds, "--json"])).unwrap();
    assert_eq!(p["mae"].as_array().unwrap().len(), 2, "{p}");
    assert!(p["baseline_mae"].as_f64().unwrap() > 0.0);
    let s: Value = serde_json::from_str(&ok(&["shuffle", "--checkpoint", ds, "--json"])).unwrap();
    assert!(s["in_order"].as_f64().unwrap().is_finite());
    assert!(s["unigram"].as_f64().unwrap() > 0.0);
    // The trained table as a picture and in the terminal.
    let text = ok(&argv(
        "show learned --checkpoint {} --positions 8 --color plain",
        &[ds],
    ));
    assert!(text.contains("trained 6 steps"), "{text}");
    let png = d.join("learned.png");
    ok(&argv(
        "show learned --checkpoint {} -o {}",
        &[ds, png.to_str().unwrap()],
    ));
    assert!(std::fs::metadata(&png).unwrap().len() > 1000);
    fails_mentioning(
        &["show", "floater", "--checkpoint", ds],
        "trained with learned",
    );
}

#[test]
fn resume_and_refusals() {
    let tmp = scratch();
    let d = trained(tmp.path(), "resume", "copy", "rope", "4");
    let ds = d.to_str().unwrap();
    // The same --out again without --resume is refused.
    let mut args = vec![
        "train", "--task", "copy", "--pe", "rope", "--steps", "4", "--out", ds, "--quiet",
    ];
    args.extend(words(TINY));
    fails_mentioning(&args, "--resume");
    // --resume on a finished run is a no-op that keeps the step count.
    args.push("--resume");
    let out = ok(&args);
    assert!(out.contains("step 4/4"), "{out}");
    // A corrupt checkpoint is an error, not a fresh start.
    std::fs::write(d.join("model.safetensors"), b"garbage").unwrap();
    fails_mentioning(&args, "corrupt");
    fails_mentioning(&["eval", "--checkpoint", ds], "corrupt");
}

#[test]
fn bad_lab_arguments_are_one_line_errors() {
    let tmp = scratch();
    let d = tmp.path().join("bad");
    let ds = d.to_str().unwrap();
    let e = fails_mentioning(
        &argv("train --task juggling --pe rope --out {}", &[ds]),
        "juggling",
    );
    assert!(e.contains("copy"), "{e}");
    let e = fails_mentioning(
        &argv("train --task copy --pe wavelet --out {}", &[ds]),
        "wavelet",
    );
    assert!(e.contains("alibi"), "{e}");
    fails_mentioning(
        &[
            "train", "--task", "copy", "--pe", "rope", "--heads", "3", "--out", ds,
        ],
        "divisible",
    );
    fails_mentioning(
        &[
            "train", "--task", "copy", "--pe", "rope", "--lr", "-1", "--out", ds,
        ],
        "learning rate",
    );
    fails_mentioning(
        &argv(
            "train --task copy --pe rope --train-len 2 --steps 1 --out {}",
            &[ds],
        ),
        "too short",
    );
    fails_mentioning(&["eval", "--checkpoint", "/nonexistent/run"], "config.json");
    fails_mentioning(
        &argv(
            "train --task lm --pe rope --corpus /nonexistent.txt --out {}",
            &[ds],
        ),
        "nonexistent",
    );
    fails_mentioning(&["bench", "train", "--steps", "0"], "steps");
}

#[test]
fn eval_time_scaling_needs_a_rope_model() {
    let tmp = scratch();
    let d = trained(tmp.path(), "scaling", "copy", "alibi", "2");
    let ds = d.to_str().unwrap();
    fails_mentioning(
        &argv("eval --checkpoint {} --lengths 24 --scaling yarn", &[ds]),
        "RoPE",
    );
    let r = trained(tmp.path(), "scaling-rope", "copy", "rope", "2");
    let rs = r.to_str().unwrap();
    for s in ["none", "linear", "ntk", "dynamic", "yarn"] {
        let v: Value = serde_json::from_str(&ok(&argv(
            "eval --checkpoint {} --lengths 12,24 --scaling {} --batches 1 --json",
            &[rs, s],
        )))
        .unwrap();
        assert!(v["loss"][1].as_f64().unwrap().is_finite(), "{s}");
    }
    fails_mentioning(&["eval", "--checkpoint", rs, "--scaling", "magic"], "magic");
    // A length no evaluation budget holds is refused before any
    // allocation, in one line, whatever the scaling.
    for len in ["100000000", "18446744073709551615"] {
        fails_mentioning(&["eval", "--checkpoint", rs, "--lengths", len], "budget");
        fails_mentioning(
            &argv(
                "eval --checkpoint {} --lengths {} --scaling yarn",
                &[rs, len],
            ),
            "budget",
        );
    }
}

fn finetune(base: &str, out: &str, extra: &[&str]) -> Value {
    let mut args = argv(
        "finetune --checkpoint {} --len 24 --steps 3 --out {} --quiet --json",
        &[base, out],
    );
    args.extend(extra);
    serde_json::from_str(&ok(&args)).unwrap()
}

fn eval_json(dir: &str, extra: &[&str]) -> Value {
    let mut args = argv(
        "eval --checkpoint {} --lengths 12,24,48 --batches 1 --json",
        &[dir],
    );
    args.extend(extra);
    serde_json::from_str(&ok(&args)).unwrap()
}

#[test]
fn finetune_at_a_new_length_and_evaluate_the_result() {
    let tmp = scratch();
    let base = trained(tmp.path(), "ft-base", "copy", "rope", "4");
    let bs = base.to_str().unwrap();
    let base_config = std::fs::read(base.join("config.json")).unwrap();
    // Plain fine-tuning at 24.
    let plain = tmp.path().join("ft-plain");
    let ps = plain.to_str().unwrap();
    let s = finetune(bs, ps, &[]);
    assert_eq!(s["steps"], 3);
    assert_eq!(s["interrupted"], false);
    assert!(s["final_loss"].as_f64().unwrap().is_finite(), "{s}");
    assert_eq!(s["finetune"]["len"], 24);
    assert_eq!(s["finetune"]["base_train"]["train_len"], 12);
    assert_eq!(s["finetune"]["scaling"], Value::Null);
    let e = eval_json(ps, &[]);
    assert_eq!(e["scaling"], serde_json::json!(["none", "none", "none"]));
    // An explicit scaling on a plain fine-tune stretches from the new length.
    let e = eval_json(ps, &["--scaling", "linear"]);
    assert_eq!(e["scaling"][2], "linear ×2 (from 24)");
    // Position Interpolation: linear ×2 in training, and by default after.
    let pi = tmp.path().join("ft-pi");
    let pis = pi.to_str().unwrap();
    let s = finetune(
        bs,
        pis,
        &words("--scaling linear --lr 2e-3 --batch 4 --seed 7"),
    );
    let r = &s["finetune"];
    assert_eq!(r["scaling"]["kind"], "linear");
    assert_eq!(r["scaling"]["factor"], 2.0);
    assert_eq!(r["scaling"]["original_len"], 12);
    assert_eq!(
        (r["lr"].as_f64(), &r["batch"], &r["seed"]),
        (Some(2e-3), &serde_json::json!(4), &serde_json::json!(7))
    );
    assert!(
        r["base"]
            .as_str()
            .unwrap()
            .ends_with(base.file_name().unwrap().to_str().unwrap()),
        "{r}"
    );
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(pi.join("config.json")).unwrap()).unwrap();
    assert_eq!(&config["finetune"], r);
    assert_eq!(config["train"]["train_len"], 24);
    let by_default = eval_json(pis, &[]);
    assert_eq!(
        by_default["scaling"],
        serde_json::json!([
            "linear ×2 (from 12)",
            "linear ×2 (from 12)",
            "linear ×4 (from 12)"
        ])
    );
    assert_eq!(by_default, eval_json(pis, &["--scaling", "linear"]));
    let bare = eval_json(pis, &["--scaling", "none"]);
    assert_ne!(by_default["loss"], bare["loss"]);
    // A fixed factor (posenc's named form) is not stretched.
    let fixed = eval_json(pis, &["--scaling", "pi:2"]);
    assert_eq!(
        fixed["scaling"],
        serde_json::json!([
            "linear ×2 (from 12)",
            "linear ×2 (from 12)",
            "linear ×2 (from 12)"
        ])
    );
    assert_eq!(fixed["loss"][0], by_default["loss"][0]);
    // The text form says the scaling is the fine-tune's.
    let text = ok(&argv(
        "eval --checkpoint {} --lengths 24 --batches 1",
        &[pis],
    ));
    assert!(
        text.contains("fine-tuned at 24") && text.contains("as fine-tuned"),
        "{text}"
    );
    assert!(text.contains("linear ×2 (from 12)"), "{text}");
    // The base is never written.
    assert_eq!(
        std::fs::read(base.join("config.json")).unwrap(),
        base_config
    );
    // --resume of a finished fine-tune keeps its step count; the same --out
    // without --resume is refused.
    let out = ok(&["finetune", "--resume", "--out", pis, "--quiet"]);
    assert!(
        out.contains("step 3/3") && out.contains("linear ×2"),
        "{out}"
    );
    fails_mentioning(
        &argv(
            "finetune --checkpoint {} --len 24 --steps 1 --out {}",
            &[bs, pis],
        ),
        "--resume",
    );
    // A fine-tune is resumed by finetune, not train.
    let mut args = vec![
        "train", "--task", "copy", "--pe", "rope", "--out", pis, "--resume",
    ];
    args.extend(words(TINY));
    fails_mentioning(&args, "posenc finetune --resume");
}

#[test]
fn bad_finetune_arguments_are_one_line_errors() {
    let tmp = scratch();
    let (base, out) = finetune_dirs(tmp.path(), "bad");
    let (bs, os) = (base.to_str().unwrap(), out.to_str().unwrap());
    let ft = |extra: &[&str], needle: &str| {
        let mut args = vec!["finetune", "--steps", "1", "--out", os];
        args.extend(extra);
        fails_mentioning(&args, needle)
    };
    // Missing checkpoint: not given, or not there.
    ft(&["--len", "24"], "--checkpoint");
    ft(
        &["--checkpoint", "/nonexistent/run", "--len", "24"],
        "config.json",
    );
    // --out is the checkpoint (in any spelling).
    for same in [bs.to_string(), format!("{bs}/"), format!("{bs}/.")] {
        fails_mentioning(
            &argv(
                "finetune --checkpoint {} --len 24 --steps 1 --out {}",
                &[bs, &same],
            ),
            "base checkpoint",
        );
    }
    // Unknown scaling, and a scaling on a model without RoPE.
    let e = ft(
        &["--checkpoint", bs, "--len", "24", "--scaling", "magic"],
        "magic",
    );
    assert!(e.contains("yarn"), "{e}");
    ft(
        &["--checkpoint", bs, "--len", "24", "--scaling", "yarn:0"],
        "factor must be in",
    );
    ft(
        &["--checkpoint", bs, "--len", "24", "--scaling", "yarn:0.5"],
        ">= 1",
    );
    // Lengths: 0, below the task's minimum, not a number.
    ft(&["--checkpoint", bs, "--len", "0"], "too short");
    ft(&["--checkpoint", bs, "--len", "2"], "too short");
    ft(&["--checkpoint", bs, "--len", "-3"], "--len");
    ft(
        &["--checkpoint", bs, "--len", "24", "--lr", "0"],
        "learning rate",
    );
    // --resume with fine-tune settings, or of a directory that is not one.
    fails_mentioning(
        &["finetune", "--resume", "--len", "24", "--out", os],
        "--resume",
    );
    fails_mentioning(&["finetune", "--resume", "--out", bs], "not a fine-tune");
    // A learned table past its rows (12 × 8 = 96), and a scaling without RoPE.
    let learned = trained(tmp.path(), "ft-bad-learned", "copy", "learned", "1");
    let ls = learned.to_str().unwrap();
    ft(
        &["--checkpoint", ls, "--len", "97"],
        "learned position table has 96 rows",
    );
    let alibi = trained(tmp.path(), "ft-bad-alibi", "copy", "alibi", "1");
    let als = alibi.to_str().unwrap();
    ft(
        &["--checkpoint", als, "--len", "24", "--scaling", "linear"],
        "RoPE",
    );
    assert!(!out.join("config.json").exists());
}

/// Ctrl-C during a fine-tune: a checkpoint, exit status 130, and `--resume`
/// finishes it.
#[cfg(unix)]
#[test]
fn an_interrupted_finetune_checkpoints_and_resumes() {
    let tmp = scratch();
    let (base, out) = finetune_dirs(tmp.path(), "int");
    let (bs, os) = (base.to_str().unwrap(), out.to_str().unwrap());
    let args = argv(
        "finetune --checkpoint {} --len 24 --steps 1000 --batch 2 --out {}",
        &[bs, os],
    );
    // The first progress line: training has started, the handler is set.
    let status = common::interrupted(&args, |stderr| {
        let mut line = String::new();
        stderr.read_line(&mut line).unwrap();
        assert!(line.contains("step"), "{line}");
    });
    assert_eq!(status.code(), Some(130));
    let config = common::read_json(&out.join("config.json"));
    let step = config["step"].as_u64().unwrap();
    assert!((1..1000).contains(&step), "{step}");
    assert_eq!(config["finetune"]["len"], 24);
    let out = posenc(&["finetune", "--resume", "--out", os]);
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("at step {step}")), "{err}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("step 1000/1000"), "{text}");
}
