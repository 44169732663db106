//! End-to-end tests of `posenc report` with the smoke preset: every file is
//! written, results.json has the documented schema with computed verdicts,
//! a second run reads every experiment from the cache, `--only N` runs one
//! experiment, and bad arguments are one-line errors with exit status 2.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn posenc(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_posenc"))
        .args(args)
        .output()
        .expect("run posenc")
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("posenc-report-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
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

const VERDICTS: [&str; 3] = ["reproduced", "partly", "not reproduced"];

#[test]
fn smoke_run_writes_every_file_then_hits_the_cache() {
    let out = tmp("smoke");
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
    // The walk-through's figures come on top: the seeds' heatmap and the
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
    // The built-in corpus: ~30 characters, unigram entropy between 1.5 and ln 40.
    assert!(uni > 1.5 && uni < 40f64.ln(), "{uni}");
    let frac = (uni > pos).then(|| (nope - pos) / (uni - pos));
    match (frac, v["fraction_to_unigram"].as_f64()) {
        (Some(f), Some(g)) => assert!((f - g).abs() < 1e-4, "{f} vs {g}"),
        (None, None) => {}
        other => panic!("fraction {other:?} in {v}"),
    }
    assert!((num("nope_perplexity") - nope.exp()).abs() < 1e-3 * nope.exp());
    let all_beat = num("positional_worst_loss") < nope;
    let f = frac.unwrap_or(f64::NAN);
    let expected = if all_beat && f >= 0.5 {
        "reproduced"
    } else if all_beat && f >= 0.25 {
        "partly"
    } else {
        "not reproduced"
    };
    assert_eq!(mlm["verdict"], expected, "{mlm}");
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
fn only_runs_one_experiment() {
    let out = tmp("only");
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
    let out = tmp("bad");
    for args in [
        vec![
            "report",
            "--preset",
            "bogus",
            "--out",
            out.to_str().unwrap(),
        ],
        vec![
            "report",
            "--preset",
            "smoke",
            "--only",
            "9",
            "--out",
            out.to_str().unwrap(),
        ],
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
    let o = posenc(&[
        "report",
        "--preset",
        "bogus",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(String::from_utf8_lossy(&o.stderr).lines().count(), 1);
    let _ = std::fs::remove_dir_all(&out);
}
