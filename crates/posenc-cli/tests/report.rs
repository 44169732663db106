//! End-to-end tests of `posenc report` with the smoke preset: every file is
//! written, results.json has the documented schema with computed verdicts,
//! a second run reads every experiment from the cache, `--only N` runs one
//! experiment, `--corpus FILE` reruns the text experiments on another text
//! (Russian here), and bad arguments are one-line errors with exit status 2.

use std::path::{Path, PathBuf};
use std::process::Output;

use crate::common;

use common::argv;

fn posenc(args: &[&str]) -> Output {
    common::run(args, &[])
}

/// The path `name` (not created) in a new scratch directory, and the
/// guard that removes that directory when dropped.
fn tmp(name: &str) -> (tempfile::TempDir, PathBuf) {
    common::scratch(&format!("report-{name}"), name)
}

fn report(out: &Path, extra: &[&str]) -> serde_json::Value {
    let mut args = vec![
        "report",
        "--preset",
        "smoke",
        "--out",
        out.to_str().unwrap(),
    ];
    args.extend(extra);
    let o = posenc(&args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap()
}

const VERDICTS: [&str; 6] = [
    "reproduced",
    "partly",
    "not reproduced",
    "tie",
    "NaN",
    "diverged",
];

#[test]
fn smoke_run_writes_every_file_then_hits_the_cache() {
    let (_tmp, out) = tmp("smoke");
    let r = report(&out, &[]);
    // Every experiment, each with its figures on disk.
    let exps = r["experiments"].as_array().unwrap();
    let ids: Vec<u64> = exps.iter().map(|e| e["id"].as_u64().unwrap()).collect();
    assert_eq!(ids, (1..=7).collect::<Vec<u64>>());
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    let html = std::fs::read_to_string(out.join("index.html")).unwrap();
    let mut n_figs = 0;
    for e in exps {
        assert_eq!(e["cached"], false);
        for f in e["figures"].as_array().unwrap() {
            let f = f.as_str().unwrap();
            let bytes = std::fs::read(out.join(f)).unwrap();
            assert_eq!(&bytes[1..4], b"PNG", "{f}");
            assert!(md.contains(&format!("]({f})")), "{f} not in report.md");
            n_figs += 1;
        }
    }
    // The walk-through's figures come on top: the introductory article's heatmap and the
    // binary analogy among them.
    for f in ["w2-sinusoidal-32x16.png", "w3-binary-analogy.png"] {
        assert!(out.join("figures").join(f).exists(), "{f}");
    }
    let pngs = std::fs::read_dir(out.join("figures")).unwrap().count();
    assert!(pngs > n_figs);
    // index.html is self-contained: one data-URI image per figure, no
    // external references, and the script that counts decoded figures.
    assert_eq!(html.matches("<img class=\"figure\"").count(), pngs);
    assert_eq!(html.matches("src=\"data:image/png;base64,").count(), pngs);
    assert!(
        !html.contains("src=\"figures/") && !html.contains("http://") && !html.contains("https://")
    );
    assert!(html.contains("data-figures-loaded"));
    // results.json: one entry per claim, with the schema and a computed verdict.
    let claims = r["claims"].as_array().unwrap();
    assert!(claims.len() >= 10, "{} claims", claims.len());
    for c in claims {
        for key in [
            "id", "claim", "source", "metric", "value", "paper", "rule", "verdict", "seeds",
            "preset",
        ] {
            assert!(c.get(key).is_some(), "{key} missing in {c}");
        }
        assert!(VERDICTS.contains(&c["verdict"].as_str().unwrap()), "{c}");
        assert!(c["rule"].as_str().unwrap().contains("reproduced if"), "{c}");
        assert_eq!(c["preset"], "smoke");
        let e = c["experiment"].as_u64().unwrap();
        assert!(c["id"].as_str().unwrap().starts_with(&format!("e{e}.")));
    }
    // Experiment 1's masked-language-model claim: its verdict follows from
    // its numbers by the rule it states.
    let mlm = claims
        .iter()
        .find(|c| c["id"] == "e1.mlm-nope-near-unigram")
        .expect("the MLM claim is in results.json");
    let v = &mlm["value"];
    let num = |k: &str| v[k].as_f64().unwrap_or_else(|| panic!("{k} in {v}"));
    let (nope, pos, uni) = (
        num("nope_loss"),
        num("positional_mean_loss"),
        num("unigram_loss"),
    );
    assert!(nope > 0.0 && pos > 0.0 && uni > 0.0, "{v}");
    // The default text, Pride and Prejudice: 75 distinct characters.
    assert!(uni > 2.0 && uni < 75f64.ln(), "{uni}");
    assert_eq!(r["corpus"]["name"], "pride-and-prejudice");
    assert_eq!(r["corpus"]["chars"], 684_768);
    assert_eq!(r["corpus"]["distinct"], 75);
    assert!((r["corpus"]["unigram_entropy"].as_f64().unwrap() - uni).abs() < 1e-5);
    let frac = (uni > pos).then(|| (nope - pos) / (uni - pos));
    match (frac, v["fraction_to_unigram"].as_f64()) {
        (Some(f), Some(g)) => assert!((f - g).abs() < 1e-4, "{f} vs {g}"),
        (None, None) => {}
        other => panic!("fraction {other:?} in {v}"),
    }
    assert!((num("nope_perplexity") - nope.exp()).abs() < 1e-3 * nope.exp());
    let worst = num("positional_worst_loss");
    let f = frac.unwrap_or(f64::NAN);
    let expected = if frac.is_none() {
        "NaN"
    } else if worst == nope {
        "tie"
    } else if worst < nope && f >= 0.5 {
        "reproduced"
    } else if worst < nope && f >= 0.25 {
        "partly"
    } else {
        "not reproduced"
    };
    assert_eq!(mlm["verdict"], expected, "{mlm}");
    // The seed quiz's three answers are claims, and the page shows them.
    for id in [
        "e1.quiz-encoder-fails",
        "e2.quiz-decoder-works",
        "e3.quiz-rope-needs-interpolation",
    ] {
        assert!(claims.iter().any(|c| c["id"] == id), "{id} missing");
    }
    assert!(md.contains("## The quiz on NoPE and RoPE"));
    // Past-L numbers are on positions L..nL, and the figure shows the loss
    // per position.
    let blow = claims
        .iter()
        .find(|c| c["id"] == "e3.no-scaling-blows-up")
        .unwrap();
    assert!(
        blow["metric"]
            .as_str()
            .unwrap()
            .contains("positions 16..32"),
        "{blow}"
    );
    for f in [
        "figures/e3-loss-per-position.png",
        "figures/e2-nope-gap.png",
        "figures/e4-sinusoidal-per-position.png",
    ] {
        assert!(out.join(f).exists(), "{f}");
    }
    // Encodings blind to the order by construction are listed apart.
    let solve = claims
        .iter()
        .find(|c| c["id"] == "e1.positional-solve")
        .unwrap();
    assert!(
        solve["value"]["excluded_by_construction"].is_object(),
        "{solve}"
    );
    assert!(mlm["source"].as_str().unwrap().contains("Haviv"));
    assert!(mlm["rule"].as_str().unwrap().contains("fraction"));
    let e1 = &exps[0];
    assert!(
        e1["figures"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f.as_str().unwrap().ends_with("e1-mlm-loss.png")),
        "{e1}"
    );
    for f in r["families"].as_array().unwrap() {
        for p in f["properties"].as_array().unwrap() {
            assert!(VERDICTS.contains(&p["verdict"].as_str().unwrap()));
        }
    }
    assert_eq!(r["preset"]["name"], "smoke");
    // Second run: every experiment from the cache, same claims.
    let r2 = report(&out, &[]);
    for e in r2["experiments"].as_array().unwrap() {
        assert_eq!(e["cached"], true, "{e}");
    }
    assert_eq!(r2["claims"], r["claims"]);
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn another_text_reruns_the_text_experiments() {
    let (_tmp, out) = tmp("corpus");
    std::fs::create_dir_all(&out).unwrap();
    // Russian text (the Russian introductory article's language): more distinct characters than the
    // default text's letters, every one kept.
    let text = "Все этапы в блоке кодировщика модели трансформера работают независимо \
                для каждого токена. Позиционное кодирование сопоставляет каждой позиции \
                свой вектор. "
        .repeat(6);
    let file = out.join("ru.txt");
    std::fs::write(&file, &text).unwrap();
    let f = file.to_str().unwrap();
    let r = report(&out, &["--only", "4", "--corpus", f]);
    assert_eq!(r["corpus"]["name"], "ru.txt");
    let mut distinct: Vec<char> = text.chars().collect();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(r["corpus"]["distinct"], distinct.len());
    assert_eq!(r["corpus"]["chars"], text.chars().count());
    assert_eq!(r["experiments"][0]["cached"], false);
    // Same text again: cached; the default text: a different cache key.
    let again = report(&out, &["--only", "4", "--corpus", f]);
    assert_eq!(again["experiments"][0]["cached"], true);
    let default = report(&out, &["--only", "4"]);
    assert_eq!(default["experiments"][0]["cached"], false);
    assert_eq!(default["corpus"]["name"], "pride-and-prejudice");
    // Bad texts are one-line errors.
    let latin1 = out.join("latin1.txt");
    std::fs::write(&latin1, [b'a', 0xE9, b'b']).unwrap();
    let short = out.join("short.txt");
    std::fs::write(
        &short,
        "a short text, too short for its windows. ".repeat(3),
    )
    .unwrap();
    for (bad, why) in [(&latin1, "not UTF-8"), (&short, "validation part")] {
        let o = posenc(&argv(
            "report --preset smoke --only 4 --corpus {} --out {}",
            &[bad.to_str().unwrap(), out.to_str().unwrap()],
        ));
        assert_eq!(o.status.code(), Some(2));
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains(why), "{err}");
    }
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn a_diverged_run_is_named_and_its_claims_say_so() {
    let (_tmp, out) = tmp("diverged");
    std::fs::create_dir_all(&out).unwrap();
    // The smoke preset with a learning rate no model survives.
    let smoke = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../presets/smoke.json"
    ))
    .unwrap();
    let mut p: serde_json::Value = serde_json::from_str(&smoke).unwrap();
    p["name"] = "diverging".into();
    p["lm"]["run"]["lr"] = 1e30.into();
    let preset = out.join("diverging.json");
    std::fs::write(&preset, p.to_string()).unwrap();
    let o = posenc(&argv(
        "report --preset {} --only 4 --out {}",
        &[preset.to_str().unwrap(), out.to_str().unwrap()],
    ));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap();
    let claims = r["claims"].as_array().unwrap();
    assert!(!claims.is_empty());
    for c in claims {
        assert_eq!(c["verdict"], "diverged", "{c}");
        let named = c["diverged"].as_array().unwrap();
        assert!(!named.is_empty(), "{c}");
        for n in named {
            let n = n.as_str().unwrap();
            assert!(
                n.starts_with("lm ") && n.contains("seed") && n.contains("diverged"),
                "{n}"
            );
        }
    }
    // Every seed of both encodings is named, none dropped.
    let ind = claims
        .iter()
        .find(|c| c["id"] == "e4.in-distribution")
        .unwrap();
    assert_eq!(ind["diverged"].as_array().unwrap().len(), 4, "{ind}");
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(
        md.contains("diverged: lm learned seed 0"),
        "report.md names the run"
    );
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn only_runs_one_experiment() {
    let (_tmp, out) = tmp("only");
    let r = report(&out, &["--only", "7"]);
    let exps = r["experiments"].as_array().unwrap();
    assert_eq!(exps.len(), 1);
    assert_eq!(exps[0]["id"], 7);
    let claims = r["claims"].as_array().unwrap();
    assert!(!claims.is_empty());
    assert!(claims.iter().all(|c| c["experiment"] == 7));
    // RoFormer's bound at distance 0 is exactly (d/2 + 1)/2 = 32.5.
    let decay = claims.iter().find(|c| c["id"] == "e7.rope-decay").unwrap();
    assert!((decay["value"]["r=0"].as_f64().unwrap() - 32.5).abs() < 1e-9);
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn bad_arguments_are_one_line_errors_with_status_2() {
    let (_tmp, out) = tmp("bad");
    for args in [
        vec![
            "report",
            "--preset",
            "bogus",
            "--out",
            out.to_str().unwrap(),
        ],
        argv(
            "report --preset smoke --only 9 --out {}",
            &[out.to_str().unwrap()],
        ),
        vec![
            "report",
            "--preset",
            "/nonexistent/preset.json",
            "--out",
            out.to_str().unwrap(),
        ],
    ] {
        let o = posenc(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        let lines: Vec<&str> = err
            .lines()
            .filter(|l| l.starts_with("posenc: error:"))
            .collect();
        assert_eq!(lines.len(), 1, "{err}");
    }
    let o = posenc(&argv(
        "report --preset bogus --out {}",
        &[out.to_str().unwrap()],
    ));
    assert_eq!(String::from_utf8_lossy(&o.stderr).lines().count(), 1);
    let _ = std::fs::remove_dir_all(&out);
}

/// Runs trained concurrently (one per core, each on one thread) give the
/// same records, bit for bit, as runs trained one after the other.
#[test]
fn concurrent_runs_equal_sequential_runs() {
    let records = |jobs: &str| -> Vec<(String, String)> {
        let (_tmp, out) = tmp(&format!("jobs{jobs}"));
        report(&out, &["--only", "2", "--jobs", jobs]);
        let mut v: Vec<(String, String)> = std::fs::read_dir(out.join("cache/runs"))
            .unwrap()
            .map(|e| {
                let dir = e.unwrap().path();
                let mut rec: serde_json::Value = serde_json::from_str(
                    &std::fs::read_to_string(dir.join("record.json")).unwrap(),
                )
                .unwrap();
                // Wall-clock time is the only field allowed to differ.
                rec["seconds"] = serde_json::Value::Null;
                let weights = std::fs::read(dir.join("model.safetensors")).unwrap();
                let name = dir.file_name().unwrap().to_string_lossy().to_string();
                (name, format!("{rec} {:?}", weights))
            })
            .collect();
        v.sort();
        let _ = std::fs::remove_dir_all(&out);
        v
    };
    let one = records("1");
    let two = records("2");
    assert!(one.len() >= 2, "experiment 2 trains several runs");
    assert_eq!(one, two);
}

/// Experiments 8 and 9 end to end on a tiny random Llama 3.1 (trained
/// length 32, the fixture of `posenc-models`) with a word-level tokenizer
/// (`scripts/models/word_tokenizer.py`): every claim gets a computed
/// verdict, the figures are written, and experiment 9 reads experiment 8's
/// passkey trials (no scaling, Self-Extend) from the cache's trial log
/// instead of running them again.
/// The line counts of the trial logs in `out`'s cache whose names start
/// with `prefix`.
fn log_line_counts(out: &Path, prefix: &str) -> Vec<usize> {
    std::fs::read_dir(out.join("cache"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with(prefix))
        .map(|p| std::fs::read_to_string(p).unwrap().lines().count())
        .collect()
}

/// The tiny random Llama 3.1 of posenc-models' fixtures with the
/// word-level tokenizer, copied into `out/tiny-llama31`.
fn tiny_model(out: &Path) -> PathBuf {
    let model = out.join("tiny-llama31");
    std::fs::create_dir_all(&model).unwrap();
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(
            fixtures
                .join("posenc-models/tests/fixtures/tiny-llama31")
                .join(f),
            model.join(f),
        )
        .unwrap();
    }
    std::fs::copy(
        fixtures.join("posenc-cli/tests/fixtures/word-tokenizer/tokenizer.json"),
        model.join("tokenizer.json"),
    )
    .unwrap();
    model
}

#[test]
fn experiments_8_and_9_run_on_a_tiny_pretrained_model_and_share_trials() {
    let (_tmp, out) = tmp("tiny-model");
    let model = tiny_model(&out);
    let m = model.to_str().unwrap();
    let log_lines = |out: &Path| -> usize {
        let logs = log_line_counts(out, "passkey-");
        assert_eq!(logs.len(), 1, "{logs:?}");
        logs[0]
    };
    // Lengths L/4 … 2L = 8 … 64: only 2L holds the prompt's 62 tokens
    // (the shorter are left out); depths 0, 0.5, 1; one key per cell.
    let r8 = report(&out, &["--only", "8", "--model", m]);
    let c8: Vec<&serde_json::Value> = r8["claims"].as_array().unwrap().iter().collect();
    assert_eq!(c8.len(), 5);
    // Header + 5 methods (none, linear:2, dynamic:2, yarn:2,
    // self-extend:4:4) × 3.
    assert_eq!(log_lines(&out), 1 + 5 * 3);
    let r9 = report(&out, &["--only", "9", "--model", m]);
    let c9: Vec<&serde_json::Value> = r9["claims"].as_array().unwrap().iter().collect();
    let ids: Vec<&str> = c9.iter().map(|c| c["id"].as_str().unwrap()).collect();
    assert_eq!(
        ids,
        [
            "e9.self-extend-retrieves",
            "e9.rerope-at-most-ntk",
            "e9.sinks-flat-no-retrieval",
            "e9.dca-flat"
        ]
    );
    for c in c8.iter().chain(&c9) {
        let v = c["verdict"].as_str().unwrap();
        assert!(VERDICTS.contains(&v), "{c}");
        assert!(!c["rule"].as_str().unwrap().is_empty(), "{c}");
    }
    // Retrieval in experiment 9: none, self-extend:4:4 (both read from the
    // log), rerope:8, leaky-rerope:8:16, dca:24:4, sinks:4:5 (run).
    assert_eq!(log_lines(&out), 1 + 5 * 3 + 4 * 3);
    let e9 = &r9["experiments"][0];
    assert_eq!(e9["id"], 9);
    for f in e9["figures"].as_array().unwrap() {
        let bytes = std::fs::read(out.join(f.as_str().unwrap())).unwrap();
        assert!(bytes.starts_with(b"\x89PNG"), "{f}");
    }
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(md.contains("training-free methods side by side"));
    assert!(md.contains("dca:24:4"));
    // A second run reads the experiment from the cache.
    let again = report(&out, &["--only", "9", "--model", m]);
    assert_eq!(again["experiments"][0]["cached"], true);
    // `posenc passkey --log` and the report share one log: the report's
    // cells that `passkey` ran (no scaling, trial 0 at 64 tokens) are read,
    // not run again.
    let log = out.join("grid.jsonl");
    let lg = log.to_str().unwrap();
    let o = posenc(&argv(
        "passkey --model {} --lengths 64 --depths 0,0.5,1 --trials 1 \
         --scaling none --log {} --quiet",
        &[m, lg],
    ));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let lines = |p: &Path| std::fs::read_to_string(p).unwrap().lines().count();
    assert_eq!(lines(&log), 1 + 3);
    let fresh = out.join("fresh");
    report(&fresh, &["--only", "8", "--model", m, "--passkey-log", lg]);
    assert_eq!(lines(&log), 1 + 5 * 3);
    let _ = std::fs::remove_dir_all(&out);
}

/// Experiment 8 with `--finetune-steps`: PI ×2 and YaRN ×2 fine-tuned on
/// the text's first 90% and scored on its last 10% (band losses and the
/// passkey grid, each fine-tune with its own trial log), two more claims
/// with computed verdicts, the whole experiment cached; bad values and a
/// held-out part shorter than 2L refused in one line before any run.
#[test]
fn experiment_8_fine_tunes_pi_and_yarn_and_scores_held_out_text() {
    let (_tmp, out) = tmp("tiny-finetune");
    let model = tiny_model(&out);
    let m = model.to_str().unwrap();
    let r = report(
        &out,
        &["--only", "8", "--model", m, "--finetune-steps", "3"],
    );
    let claims = r["claims"].as_array().unwrap();
    let ids: Vec<&str> = claims.iter().map(|c| c["id"].as_str().unwrap()).collect();
    assert_eq!(
        ids[5..],
        ["e8.pi-finetune-closes-gap", "e8.finetune-retrieves"],
        "{ids:?}"
    );
    for c in claims {
        assert!(VERDICTS.contains(&c["verdict"].as_str().unwrap()), "{c}");
    }
    // Held-out losses past L: each fine-tune moved its scaling's loss.
    let v = &claims[5]["value"];
    let at = |k: &str| v[k].as_f64().unwrap_or_else(|| panic!("{k}: {v}"));
    for s in ["linear:2", "yarn:2"] {
        let (zero, tuned) = (
            at(&format!("{s}, L..2L")),
            at(&format!("{s} + fine-tune, L..2L")),
        );
        assert!(
            zero.is_finite() && tuned.is_finite() && zero != tuned,
            "{s}: {v}"
        );
    }
    assert!(at("loss at L (held out, no scaling, positions 0..L)").is_finite());
    // Retrieval of each fine-tuned model: 2L only (64 tokens), 3 depths.
    assert_eq!(log_line_counts(&out, "passkey-finetuned-"), [4, 4]);
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(md.contains("Held-out loss") && md.contains("yarn:2 + fine-tune"));
    let again = report(
        &out,
        &["--only", "8", "--model", m, "--finetune-steps", "3"],
    );
    assert_eq!(again["experiments"][0]["cached"], true);
    // Refusals, one line and exit 2, before any experiment runs.
    let short = out.join("short.txt");
    // 400 words (tokens) of 10 characters: long enough for the lab's
    // corpus checks, a held-out part of 40 tokens < 2L = 64.
    std::fs::write(&short, vec!["abcdefghij"; 400].join(" ")).unwrap();
    let o = out.to_str().unwrap();
    for (args, needle) in [
        (
            argv(
                "report --only 8 --model {} --finetune-steps 0 --out {}",
                &[m, o],
            ),
            "--finetune-steps",
        ),
        (
            argv(
                "report --only 8 --model {} --finetune-steps 2 --corpus {} --out {}",
                &[m, short.to_str().unwrap(), o],
            ),
            "held-out",
        ),
    ] {
        let err = common::fails_mentioning(&args, needle);
        assert!(!err.contains("experiment 8:"), "{err}");
    }
    let err = common::refused(&argv("report --finetune-steps 2 --out {}", &[o]));
    assert!(err.contains("--model"), "{err}");
    let _ = std::fs::remove_dir_all(&out);
}
