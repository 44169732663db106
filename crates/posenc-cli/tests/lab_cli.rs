//! `posenc train`, `eval`, `probe`, `shuffle`, `show --checkpoint` and
//! `bench train` end to end, on tiny models.

use std::path::PathBuf;

mod common;

use common::{argv, posenc, words};

use serde_json::Value;

fn ok(args: &[&str]) -> String {
    common::stdout_ok(posenc(args), args)
}

fn fails(args: &[&str]) -> String {
    common::one_line_error(posenc(args), args)
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("posenc-lab-cli-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
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
    let e: Value = serde_json::from_str(&ok(&argv(
        "eval --checkpoint {} --lengths 8,12 --batches 1 --json",
        &[ds],
    )))
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
    args.extend(words(TINY));
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
    let e = fails(&argv(
        "train --task copy --pe rope --train-len 2 --steps 1 --out {}",
        &[ds],
    ));
    assert!(e.contains("too short"), "{e}");
    let e = fails(&["eval", "--checkpoint", "/nonexistent/run"]);
    assert!(e.contains("config.json"), "{e}");
    let e = fails(&argv(
        "train --task lm --pe rope --corpus /nonexistent.txt --out {}",
        &[ds],
    ));
    assert!(e.contains("nonexistent"), "{e}");
    let e = fails(&["bench", "train", "--steps", "0"]);
    assert!(e.contains("steps"), "{e}");
}

#[test]
fn eval_time_scaling_needs_a_rope_model() {
    let d = tmp("scaling");
    let ds = d.to_str().unwrap();
    train(ds, "copy", "alibi", "2");
    let e = fails(&argv(
        "eval --checkpoint {} --lengths 24 --scaling yarn",
        &[ds],
    ));
    assert!(e.contains("RoPE"), "{e}");
    let r = tmp("scaling-rope");
    let rs = r.to_str().unwrap();
    train(rs, "copy", "rope", "2");
    for s in ["none", "linear", "ntk", "dynamic", "yarn"] {
        let v: Value = serde_json::from_str(&ok(&argv(
            "eval --checkpoint {} --lengths 12,24 --scaling {} --batches 1 --json",
            &[rs, s],
        )))
        .unwrap();
        assert!(v["loss"][1].as_f64().unwrap().is_finite(), "{s}");
    }
    let e = fails(&["eval", "--checkpoint", rs, "--scaling", "magic"]);
    assert!(e.contains("magic"), "{e}");
    // A length no evaluation budget holds is refused before any
    // allocation, in one line, whatever the scaling.
    for len in ["100000000", "18446744073709551615"] {
        let e = fails(&["eval", "--checkpoint", rs, "--lengths", len]);
        assert!(e.contains("budget"), "{e}");
        let e = fails(&argv(
            "eval --checkpoint {} --lengths {} --scaling yarn",
            &[rs, len],
        ));
        assert!(e.contains("budget"), "{e}");
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
    let base = tmp("ft-base");
    let bs = base.to_str().unwrap();
    train(bs, "copy", "rope", "4");
    let base_config = std::fs::read(base.join("config.json")).unwrap();
    // Plain fine-tuning at 24.
    let plain = tmp("ft-plain");
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
    let pi = tmp("ft-pi");
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
    let e = fails(&argv(
        "finetune --checkpoint {} --len 24 --steps 1 --out {}",
        &[bs, pis],
    ));
    assert!(e.contains("--resume"), "{e}");
    // A fine-tune is resumed by finetune, not train.
    let mut args = vec![
        "train", "--task", "copy", "--pe", "rope", "--out", pis, "--resume",
    ];
    args.extend(words(TINY));
    let e = fails(&args);
    assert!(e.contains("posenc finetune --resume"), "{e}");
}

#[test]
fn bad_finetune_arguments_are_one_line_errors() {
    let base = tmp("ft-bad-base");
    let bs = base.to_str().unwrap();
    train(bs, "copy", "rope", "2");
    let out = tmp("ft-bad-out");
    let os = out.to_str().unwrap();
    let ft = |extra: &[&str]| {
        let mut args = vec!["finetune", "--steps", "1", "--out", os];
        args.extend(extra);
        fails(&args)
    };
    // Missing checkpoint: not given, or not there.
    let e = ft(&["--len", "24"]);
    assert!(e.contains("--checkpoint"), "{e}");
    let e = ft(&["--checkpoint", "/nonexistent/run", "--len", "24"]);
    assert!(e.contains("config.json"), "{e}");
    // --out is the checkpoint (in any spelling).
    for same in [bs.to_string(), format!("{bs}/"), format!("{bs}/.")] {
        let e = fails(&argv(
            "finetune --checkpoint {} --len 24 --steps 1 --out {}",
            &[bs, &same],
        ));
        assert!(e.contains("base checkpoint"), "{e}");
    }
    // Unknown scaling, and a scaling on a model without RoPE.
    let e = ft(&["--checkpoint", bs, "--len", "24", "--scaling", "magic"]);
    assert!(e.contains("magic") && e.contains("yarn"), "{e}");
    let e = ft(&["--checkpoint", bs, "--len", "24", "--scaling", "yarn:0"]);
    assert!(e.contains("factor must be in"), "{e}");
    let e = ft(&["--checkpoint", bs, "--len", "24", "--scaling", "yarn:0.5"]);
    assert!(e.contains(">= 1"), "{e}");
    // Lengths: 0, below the task's minimum, not a number.
    let e = ft(&["--checkpoint", bs, "--len", "0"]);
    assert!(e.contains("too short"), "{e}");
    let e = ft(&["--checkpoint", bs, "--len", "2"]);
    assert!(e.contains("too short"), "{e}");
    let e = ft(&["--checkpoint", bs, "--len", "-3"]);
    assert!(e.contains("--len"), "{e}");
    let e = ft(&["--checkpoint", bs, "--len", "24", "--lr", "0"]);
    assert!(e.contains("learning rate"), "{e}");
    // --resume with fine-tune settings, or of a directory that is not one.
    let e = fails(&["finetune", "--resume", "--len", "24", "--out", os]);
    assert!(e.contains("--resume"), "{e}");
    let e = fails(&["finetune", "--resume", "--out", bs]);
    assert!(e.contains("not a fine-tune"), "{e}");
    // A learned table past its rows (12 × 8 = 96), and a scaling without RoPE.
    let learned = tmp("ft-bad-learned");
    let ls = learned.to_str().unwrap();
    train(ls, "copy", "learned", "1");
    let e = ft(&["--checkpoint", ls, "--len", "97"]);
    assert!(e.contains("learned position table has 96 rows"), "{e}");
    let alibi = tmp("ft-bad-alibi");
    let als = alibi.to_str().unwrap();
    train(als, "copy", "alibi", "1");
    let e = ft(&["--checkpoint", als, "--len", "24", "--scaling", "linear"]);
    assert!(e.contains("RoPE"), "{e}");
    assert!(!out.join("config.json").exists());
}

/// Ctrl-C during a fine-tune: a checkpoint, exit status 130, and `--resume`
/// finishes it.
#[cfg(unix)]
#[test]
fn an_interrupted_finetune_checkpoints_and_resumes() {
    let base = tmp("ft-int-base");
    let bs = base.to_str().unwrap();
    train(bs, "copy", "rope", "2");
    let out = tmp("ft-int-out");
    let os = out.to_str().unwrap();
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
