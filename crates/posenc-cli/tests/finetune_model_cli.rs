//! `posenc finetune --model` end to end on the tiny Llama 3.1 of
//! posenc-models' fixtures (a word-level tokenizer over its 256 ids), its
//! adapter on `posenc perplexity`, `generate` and `passkey --adapter`, and
//! every refusal the issue lists: one line, exit 2, before the model's
//! weights (or the model at all) are read.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Output;

use common::{fails_mentioning, posenc, words};
use serde_json::Value;

fn tiny() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../posenc-models/tests/fixtures/tiny-llama31")
        .to_string_lossy()
        .into_owned()
}

/// A fresh scratch directory for one test, removed when dropped.
fn scratch(name: &str) -> tempfile::TempDir {
    common::tempdir(&format!("ftm-{name}"))
}

/// A word-level tokenizer (`w0`..`w254`, `[UNK]`) and a text of `words`
/// words of period 97 (written once for the whole test binary).
fn inputs(words: usize) -> (String, String) {
    (
        common::word_tokenizer_file().to_string_lossy().into_owned(),
        common::word_text_file(words).to_string_lossy().into_owned(),
    )
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// `posenc <cmd> --model <model> --tokenizer <tk>`, then `rest`.
fn on<'a>(cmd: &'a str, model: &'a str, tk: &'a str, rest: &[&'a str]) -> Vec<&'a str> {
    [&[cmd, "--model", model, "--tokenizer", tk], rest].concat()
}

/// The tiny model's config beside weights that are not safetensors: a run
/// refused with this model was refused before any weight was read.
fn config_only_model(dir: &Path, layers: Option<usize>) -> PathBuf {
    let m = dir.join("config-only");
    std::fs::create_dir_all(&m).unwrap();
    let mut cfg: Value = serde_json::from_str(
        &std::fs::read_to_string(Path::new(&tiny()).join("config.json")).unwrap(),
    )
    .unwrap();
    if let Some(l) = layers {
        cfg["num_hidden_layers"] = Value::from(l);
    }
    std::fs::write(m.join("config.json"), cfg.to_string()).unwrap();
    std::fs::write(m.join("model.safetensors"), b"not safetensors").unwrap();
    m
}

fn mean_loss(out: Output, name: &str) -> f64 {
    let v: Value = serde_json::from_str(&common::ok(&out)).unwrap();
    let bands = v["scalings"][name]["bands"].as_object().unwrap();
    bands.values().map(|b| b.as_f64().unwrap()).sum::<f64>() / bands.len() as f64
}

#[test]
fn finetune_writes_a_peft_adapter_and_a_merged_checkpoint() {
    let tmp = scratch("run");
    let d = tmp.path();
    let (tk, text) = inputs(3000);
    let out = d.join("out");
    let m = tiny();
    let mut args = on("finetune", &m, &tk, &["--text", &text]);
    args.extend(words(
        "--length 64 --pose 16 --scaling yarn:2 --steps 12 --lora 4 \
         --targets q_proj,k_proj,v_proj,o_proj --train norm --lr 1e-2 \
         --checkpoint-every 5 --merge",
    ));
    args.extend(["--out", s(&out), "--quiet", "--json"]);
    let v: Value = serde_json::from_str(&common::ok(&posenc(&args))).unwrap();
    assert_eq!(v["steps"], 12);
    assert_eq!(v["interrupted"], false);
    assert_eq!(v["finetune"]["config"]["plan"]["kind"], "pose");
    assert_eq!(v["finetune"]["train_tokens"], 2700);
    assert_eq!(v["finetune"]["held_out_tokens"], 300);
    let metrics = common::run_log(
        &out,
        &[
            "adapter_config.json",
            "adapter_model.safetensors",
            "optimizer.safetensors",
            "finetune.json",
            "merged/config.json",
            "merged/model.safetensors",
            "merged/tokenizer.json",
        ],
    );
    assert_eq!(metrics.lines().count(), 12);
    let ac: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("adapter_config.json")).unwrap())
            .unwrap();
    assert_eq!(
        (ac["peft_type"].as_str(), ac["r"].as_u64()),
        (Some("LORA"), Some(4))
    );
    assert_eq!(
        ac["modules_to_save"],
        serde_json::json!(["norm", "input_layernorm", "post_attention_layernorm"])
    );
    let mc: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("merged/config.json")).unwrap())
            .unwrap();
    assert_eq!(mc["rope_scaling"]["rope_type"], "yarn");
    assert_eq!(mc["rope_scaling"]["factor"], 2.0);
    assert_eq!(mc["rope_scaling"]["original_max_position_embeddings"], 32);

    // The same --out again is refused; --resume of the finished run keeps it.
    fails_mentioning(&args, "--resume");
    let again = common::ok(&posenc(&[
        "finetune",
        "--resume",
        "--out",
        s(&out),
        "--quiet",
    ]));
    assert!(again.contains("step 12/12"), "{again}");

    // --adapter on perplexity: the merged checkpoint's losses, not the base's.
    let ppl = |model: &str, extra: &[&str], scaling: &str| {
        let mut a = vec!["perplexity", "--model", model, "--text", &text];
        a.extend(words("--length 64 --band 16 --scaling"));
        a.extend([scaling, "--json", "--quiet"]);
        a.extend_from_slice(extra);
        mean_loss(posenc(&a), scaling)
    };
    let adapted = ppl(&m, &["--tokenizer", &tk, "--adapter", s(&out)], "yarn:2");
    let merged = ppl(s(&out.join("merged")), &[], "model");
    let plain = ppl(&m, &["--tokenizer", &tk], "yarn:2");
    println!("perplexity bands: with the adapter {adapted}, merged {merged}, base {plain}");
    assert!(
        (adapted - merged).abs() < 1e-5 * merged,
        "{adapted} vs {merged}"
    );
    // Trained on this text: its loss is lower with the adapter.
    assert!(plain - adapted > 1e-3, "{plain} -> {adapted}");

    // generate --adapter runs.
    let g = common::ok(&posenc(&on(
        "generate",
        &m,
        &tk,
        &[
            "--prompt",
            "w1 w2 w3",
            "--max-tokens",
            "4",
            "--adapter",
            s(&out),
            "--json",
        ],
    )));
    let g: Value = serde_json::from_str(&g).unwrap();
    assert_eq!(g["new_ids"].as_array().unwrap().len(), 4);
    assert!(g["model"].as_str().unwrap().contains("LoRA adapter"));
}

#[test]
fn bad_arguments_are_refused_before_the_model_is_read() {
    let tmp = scratch("args");
    let d = tmp.path();
    let not_a_model = d.join("not-a-model.gguf");
    std::fs::write(&not_a_model, b"this is not a GGUF file").unwrap();
    let m = s(&not_a_model);
    let out = d.join("out");
    let cases: [(&[&str], &str); 16] = [
        (&["--lora", "0"], "rank 0"),
        (&["--lora", "-1"], "--lora"),
        (&["--pose", "64"], "PoSE window 64"),
        (&["--pose", "100"], "PoSE window 100"),
        (&["--pose", "1"], "PoSE window 1"),
        (&["--length", "1"], "--length"),
        (&["--scaling", "ntk:2"], "ntk:2"),
        (&["--scaling", "self-extend:4:512"], "inference only"),
        (&["--scaling", "magic:2"], "unknown scaling"),
        (&["--train", "embed,bias"], "--train"),
        (&["--targets", "q_proj,lm_head"], "lm_head"),
        (&["--lr", "0"], "--lr"),
        (&["--warmup", "9"], "--warmup"),
        (&["--steps", "0"], "--steps"),
        (&["--schedule", "step"], "schedule"),
        (&["--dropout", "1"], "dropout"),
    ];
    for (extra, needle) in cases {
        let mut args = vec!["finetune", "--model", m];
        args.extend(words("--length 64 --steps 8"));
        args.extend(["--out", s(&out)]);
        // A later flag overrides an earlier one of the same name.
        for pair in extra.chunks(2) {
            if let Some(i) = args.iter().position(|a| *a == pair[0]) {
                args[i + 1] = pair[1];
            } else {
                args.extend_from_slice(pair);
            }
        }
        fails_mentioning(&args, needle);
    }
    fails_mentioning(
        &["finetune", "--model", m, "--steps", "8", "--out", s(&out)],
        "--length",
    );
    // Flags of the other mode.
    fails_mentioning(
        &[
            ["finetune", "--checkpoint", s(d)].as_slice(),
            &words("--len 8 --steps 1"),
            &["--model", m, "--out", s(&out)],
        ]
        .concat(),
        "--model",
    );
    fails_mentioning(
        &["finetune", "--resume", "--out", s(&out), "--pose", "16"],
        "--pose",
    );
    assert!(!out.exists(), "nothing written");
}

#[test]
fn misfits_are_refused_before_the_weights_are_read() {
    let tmp = scratch("misfit");
    let d = tmp.path();
    let (tk, text) = inputs(100);
    let model = config_only_model(d, None);
    let m = s(&model);
    let out = d.join("out");
    let base = on(
        "finetune",
        m,
        &tk,
        &["--text", &text, "--steps", "2", "--out", s(&out)],
    );
    let run = |extra: &[&str], needle: &str| {
        let mut a = base.to_vec();
        a.extend_from_slice(extra);
        fails_mentioning(&a, needle);
    };
    // Above a layer's width: v_proj maps 64 to 32.
    run(
        &["--length", "48", "--lora", "33"],
        "outside 1..=32 (the smaller dimension of v_proj)",
    );
    run(
        &["--length", "48", "--lora", "65", "--targets", "q_proj"],
        "outside 1..=64",
    );
    // 100 words: 90 for training.
    run(&["--length", "91"], "has 90 tokens, fewer than the 91");
    run(&["--length", "200", "--pose", "91"], "fewer than the 91");
    assert!(!out.exists());

    // An adapter that does not fit the model, on perplexity, generate and
    // passkey: refused with one line before the weights.
    let good = d.join("adapter");
    let t = tiny();
    let mut args = on("finetune", &t, &tk, &["--text", &text]);
    args.extend(words("--length 32 --steps 2 --lora 4"));
    args.extend(["--out", s(&good), "--quiet"]);
    common::ok(&posenc(&args));
    let one_layer_dir = scratch("one-layer");
    let one_layer = config_only_model(one_layer_dir.path(), Some(1));
    let ol = s(&one_layer);
    let needle = "layer 1, the model has 1";
    // `cmd` on `model` with `adapter`, refused with a line holding `needle`.
    let adapter_refused = |model: &str, cmd: &[&str], adapter: &Path, needle: &str| {
        let mut a = on(cmd[0], model, &tk, &cmd[1..]);
        a.extend(["--adapter", s(adapter)]);
        fails_mentioning(&a, needle);
    };
    let ppl = ["perplexity", "--text", &text, "--length", "16"];
    adapter_refused(ol, &ppl, &good, needle);
    adapter_refused(ol, &["generate", "--prompt", "w1"], &good, needle);
    adapter_refused(ol, &["passkey", "--lengths", "2048"], &good, needle);
    // A rank in the config that the tensors do not have.
    let bad = d.join("bad-adapter");
    std::fs::create_dir_all(&bad).unwrap();
    let cfg = std::fs::read_to_string(good.join("adapter_config.json")).unwrap();
    std::fs::write(
        bad.join("adapter_config.json"),
        cfg.replace("\"r\": 4", "\"r\": 8"),
    )
    .unwrap();
    std::fs::copy(
        good.join("adapter_model.safetensors"),
        bad.join("adapter_model.safetensors"),
    )
    .unwrap();
    adapter_refused(m, &ppl, &bad, "the model needs [8, 64] (r = 8)");
    adapter_refused(m, &ppl, d, "no adapter_config.json");
}

/// Ctrl-C during a fine-tune: a checkpoint, exit status 130, and `--resume`
/// finishes it with the same adapter as an uninterrupted run.
#[cfg(unix)]
#[test]
fn an_interrupted_finetune_checkpoints_and_resumes_exactly() {
    let tmp = scratch("ctrl-c");
    let d = tmp.path();
    let (tk, text) = inputs(3000);
    let m = tiny();
    let (cut, whole) = (d.join("cut"), d.join("whole"));
    let args = |out: &Path| -> Vec<String> {
        let mut a = on("finetune", &m, &tk, &["--text", &text]);
        a.extend(words("--length 32 --steps 600 --lora 4 --lr 1e-3"));
        a.extend(["--out", s(out)]);
        a.iter().map(|a| a.to_string()).collect()
    };
    let cut_args = args(&cut);
    let cut_args: Vec<&str> = cut_args.iter().map(String::as_str).collect();
    // The first progress line: training has started, the handler is set.
    let status = common::interrupted(&cut_args, |stderr| {
        let mut line = String::new();
        while !line.contains("step") {
            line.clear();
            assert!(stderr.read_line(&mut line).unwrap() > 0, "no progress line");
        }
    });
    assert_eq!(status.code(), Some(130));
    let record = common::read_json(&cut.join("finetune.json"));
    let step = record["step"].as_u64().unwrap();
    assert!((1..600).contains(&step), "{step}");
    let out = posenc(&["finetune", "--resume", "--out", s(&cut)]);
    let text_out = common::ok(&out);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("at step {step}")), "{err}");
    assert!(text_out.contains("step 600/600"), "{text_out}");
    let a: Vec<String> = args(&whole);
    let a: Vec<&str> = a.iter().map(String::as_str).collect();
    let mut a = a.clone();
    a.push("--quiet");
    common::ok(&posenc(&a));
    for f in ["adapter_model.safetensors", "optimizer.safetensors"] {
        assert!(
            std::fs::read(cut.join(f)).unwrap() == std::fs::read(whole.join(f)).unwrap(),
            "{f}: the resumed run differs from the uninterrupted one"
        );
    }
}

/// `--checkpoint-layers` trains the same adapter: on the untied tiny
/// Llama 3.1 the checkpointed gradients are the plain pass's to the bit,
/// so the adapter files are equal byte for byte; the record says it ran
/// checkpointed; without `--model` the flag is refused.
#[test]
fn checkpointed_layers_train_the_same_adapter() {
    let tmp = scratch("ckpt-layers");
    let d = tmp.path();
    let (tk, text) = inputs(3000);
    let m = tiny();
    let run = |out: &Path, extra: &[&str]| {
        let mut args = on("finetune", &m, &tk, &["--text", &text]);
        args.extend(words(
            "--length 48 --steps 3 --lora 4 --dropout 0.1 --train norm --lr 1e-2",
        ));
        args.extend(["--out", s(out), "--quiet"]);
        args.extend_from_slice(extra);
        common::ok(&posenc(&args));
    };
    let (plain, ck) = (d.join("plain"), d.join("ck"));
    run(&plain, &[]);
    run(&ck, &["--checkpoint-layers"]);
    let bytes = |dir: &Path| std::fs::read(dir.join("adapter_model.safetensors")).unwrap();
    assert_eq!(bytes(&plain), bytes(&ck), "the adapters differ");
    let record: Value =
        serde_json::from_str(&std::fs::read_to_string(ck.join("finetune.json")).unwrap()).unwrap();
    assert_eq!(record["config"]["checkpoint_layers"], true, "{record}");
    let err = common::refused(&["finetune", "--checkpoint-layers", "--out", s(&d.join("x"))]);
    assert!(err.contains("--model"), "{err}");
}

/// `perplexity --held-out` scores the window that starts at the text's
/// last 10% of tokens (what `finetune` never reads): with a word-level
/// tokenizer, the same losses as that tail written alone; a tail shorter
/// than the window is refused in one line.
#[test]
fn perplexity_scores_the_held_out_tail() {
    let tmp = scratch("held-out");
    let d = tmp.path();
    let (tk, text) = inputs(3000);
    let all: Vec<String> = std::fs::read_to_string(&text)
        .unwrap()
        .split_whitespace()
        .map(str::to_string)
        .collect();
    let tail = d.join("tail.txt");
    std::fs::write(&tail, all[2700..].join(" ")).unwrap();
    let m = tiny();
    let bands = |file: &str, held_out: bool| -> Value {
        let mut args = on("perplexity", &m, &tk, &["--text", file]);
        args.extend(words("--length 64 --band 16 --scaling none --json --quiet"));
        if held_out {
            args.push("--held-out");
        }
        let v: Value = serde_json::from_str(&common::ok(&posenc(&args))).unwrap();
        v["scalings"]["none"]["bands"].clone()
    };
    let (held, alone, start) = (
        bands(&text, true),
        bands(s(&tail), false),
        bands(&text, false),
    );
    assert_eq!(held, alone);
    assert_ne!(held, start);
    let args = on("perplexity", &m, &tk, &["--text", &text, "--length", "400"]);
    let err = common::fails_mentioning(&[&args[..], &["--held-out"]].concat(), "--held-out");
    assert!(err.contains("300 tokens"), "{err}");
}
