//! End-to-end tests of the `posenc` binary: outputs against the reference
//! fixtures (copied from the reference implementations into
//! `crates/posenc/tests/fixtures/`), JSON keys, and bad input (one line on
//! stderr, exit status 2, never a panic).

use std::path::PathBuf;

use serde_json::Value;

use crate::common;

use common::{argv, f64s as as_f64s, ok_json, posenc, read_json, words};

fn fixture(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../posenc/tests/fixtures")
        .join(rel)
}

/// Runs a command that must fail on user input: exit 2, one line starting
/// with `posenc: error:` (or clap's `error:`), no panic.
fn fails(args: &[&str]) -> String {
    common::refused(args)
}

#[test]
fn sinusoidal_table_equals_the_seeds_code() {
    let fx = read_json(&fixture("sinusoidal.json"));
    for case in fx["cases"].as_array().unwrap() {
        let t = case["positions"].as_u64().unwrap().to_string();
        let d = case["dim"].as_u64().unwrap().to_string();
        let got = ok_json(&argv(
            "table sinusoidal --positions {} --dim {} --json",
            &[&t, &d],
        ));
        let want = case["table"].as_array().unwrap();
        let got_rows = got["table"].as_array().unwrap();
        assert_eq!(got_rows.len(), want.len());
        for (g, w) in got_rows.iter().zip(want) {
            for (a, b) in as_f64s(g).iter().zip(as_f64s(w)) {
                assert!((a - b).abs() <= 1e-6, "T={t} D={d}: {a} vs {b}");
            }
        }
    }
}

#[test]
fn sinusoidal_offset_shifts_rows() {
    let a = ok_json(&words("table sinusoidal --positions 8 --dim 6 --json"));
    let b = ok_json(&words(
        "table sinusoidal --positions 5 --dim 6 --offset 3 --json",
    ));
    assert_eq!(a["table"][3], b["table"][0]);
    assert_eq!(a["table"][7], b["table"][4]);
    let c = ok_json(&words(
        "table sinusoidal --positions 3 --dim 4 --layout concatenated --json",
    ));
    assert_eq!(c["table"].as_array().unwrap().len(), 3);
}

#[test]
fn alibi_slopes_equal_the_reference() {
    let fx = read_json(&fixture("alibi.json"));
    for case in fx["cases"].as_array().unwrap() {
        let h = case["heads"].as_u64().unwrap().to_string();
        let got = as_f64s(&ok_json(&["bias", "alibi", "--heads", &h, "--json"])["slopes"]);
        let want = as_f64s(&case["slopes"]);
        assert_eq!(got.len(), want.len(), "heads {h}");
        for (a, b) in got.iter().zip(&want) {
            assert!((a - b).abs() <= 1e-12 * b.abs(), "heads {h}: {a} vs {b}");
        }
    }
}

#[test]
fn t5_buckets_equal_transformers() {
    let fx = read_json(&fixture("t5.json"));
    for case in fx["cases"].as_array().unwrap() {
        let rel = as_f64s(&case["relative"]);
        let (lo, hi) = (rel[0] as i64, rel[rel.len() - 1] as i64);
        let mode = if case["bidirectional"].as_bool().unwrap() {
            "--bidirectional"
        } else {
            "--causal"
        };
        let range = format!("{lo}:{hi}");
        let got = ok_json(&[
            "bias",
            "t5",
            "--buckets",
            &case["num_buckets"].to_string(),
            "--max-distance",
            &case["max_distance"].to_string(),
            mode,
            "--relative",
            &range,
            "--json",
        ]);
        assert_eq!(got["bucket"], case["bucket"], "case {case:?}");
    }
}

#[test]
fn rope_inspect_matches_every_hf_fixture() {
    let dir = fixture("hf-rope");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let Some(stem) = name.strip_suffix(".config.json") else {
            continue;
        };
        let expected = read_json(&dir.join(format!("{stem}.expected.json")));
        for case in expected["cases"].as_array().unwrap() {
            let cfg = path.to_str().unwrap();
            let mut args = vec!["rope", "inspect", "--config", cfg, "--json"];
            let seq = case["seq_len"].as_u64().map(|s| s.to_string());
            if let Some(s) = &seq {
                args.extend(["--seq-len", s.as_str()]);
            }
            let got = ok_json(&args);
            for key in ["rope_type", "rotary_dim", "inv_freq", "attention_factor"] {
                assert!(got.get(key).is_some(), "{stem}: missing key {key}");
            }
            assert_eq!(got["rope_type"], case["rope_type"], "{stem}");
            assert_eq!(got["rotary_dim"], case["rotary_dim"], "{stem}");
            let (g, w) = (as_f64s(&got["inv_freq"]), as_f64s(&case["inv_freq"]));
            assert_eq!(g.len(), w.len(), "{stem}");
            for (a, b) in g.iter().zip(&w) {
                assert!(
                    (a - b).abs() <= 1e-6 * b.abs(),
                    "{stem} seq {seq:?}: {a} vs {b}"
                );
            }
            let (a, b) = (
                got["attention_factor"].as_f64().unwrap(),
                case["attention_factor"].as_f64().unwrap(),
            );
            assert!((a - b).abs() <= 1e-9 * b.abs(), "{stem}: {a} vs {b}");
            n += 1;
        }
    }
    assert!(n >= 8, "only {n} fixture cases found");
}

/// The printed cos/sin tables are within 2e-7 of cos/sin(position × inv_freq)
/// evaluated in f64 from the printed f32 frequencies, at every position up to
/// 10^7; and, for every frequency whose f32 bits equal transformers' (about
/// 49 in 50: torch's f32 `powf` is not correctly rounded), within 2e-7 of the
/// fixtures' f64 tables computed from transformers' own frequencies.
#[test]
fn rope_table_is_exact_up_to_ten_million() {
    let dir = fixture("hf-rope");
    let mut compared_with_fixture = 0;
    for stem in [
        "llama3-4",
        "yarn-8",
        "default-64",
        "longrope-small",
        "linear-2",
        "partial-half",
    ] {
        let cfg = dir.join(format!("{stem}.config.json"));
        let cfg = cfg.to_str().unwrap();
        let expected = read_json(&dir.join(format!("{stem}.expected.json")));
        let case = &expected["cases"][0];
        let insp = ok_json(&["rope", "inspect", "--config", cfg, "--json"]);
        let inv = as_f64s(&insp["inv_freq"]);
        let af = insp["attention_factor"].as_f64().unwrap();
        let hf_inv = as_f64s(&case["inv_freq"]);
        let fixture_positions: Vec<u64> = as_f64s(&case["positions"])
            .iter()
            .map(|p| *p as u64)
            .collect();
        let mut positions = fixture_positions.clone();
        positions.extend([4095, 1_000_000, 10_000_000]);
        let list: Vec<String> = positions.iter().map(u64::to_string).collect();
        let got = ok_json(&[
            "rope",
            "table",
            "--config",
            cfg,
            "--positions",
            &list.join(","),
            "--json",
        ]);
        for (key, f) in [("cos", f64::cos as fn(f64) -> f64), ("sin", f64::sin)] {
            let rows = got[key].as_array().unwrap();
            assert_eq!(rows.len(), positions.len());
            for (k, (row, &p)) in rows.iter().zip(&positions).enumerate() {
                let row = as_f64s(row);
                assert_eq!(row.len(), case["rotary_dim"].as_u64().unwrap() as usize / 2);
                for (i, (a, w)) in row.iter().zip(&inv).enumerate() {
                    let exact = f(p as f64 * *w) * af;
                    assert!(
                        (a - exact).abs() <= 2e-7,
                        "{stem} {key} pos {p} pair {i}: {a} vs {exact}"
                    );
                    if k < fixture_positions.len() && (*w as f32) == (hf_inv[i] as f32) {
                        let want = case[&format!("{key}_f64")][k][i].as_f64().unwrap();
                        assert!(
                            (a - want).abs() <= 2e-7,
                            "{stem} {key} pos {p} pair {i}: {a} vs {want}"
                        );
                        compared_with_fixture += 1;
                    }
                }
            }
        }
    }
    assert!(compared_with_fixture > 1000, "{compared_with_fixture}");
}

#[test]
fn readable_outputs_without_json() {
    for args in [
        vec!["table", "sinusoidal", "--positions", "4", "--dim", "4"],
        vec!["bias", "alibi", "--heads", "6"],
        vec!["bias", "t5", "--causal", "--relative", "-3:3"],
    ] {
        let out = posenc(&args);
        assert!(out.status.success(), "{args:?}");
        let text = String::from_utf8(out.stdout).unwrap();
        assert!(text.lines().count() >= 4, "{args:?}: {text}");
        assert!(
            serde_json::from_str::<Value>(&text).is_err(),
            "not JSON by default"
        );
    }
    let cfg = fixture("hf-rope/yarn-8.config.json");
    let out = posenc(&["rope", "inspect", "--config", cfg.to_str().unwrap()]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("rope_type") && text.contains("yarn"),
        "{text}"
    );
}

/// `posenc rope inspect --config` on `json` as the file `name` (in a
/// scratch directory removed afterwards), which must fail: the error line.
fn inspect_fails(name: &str, json: &str) -> String {
    let dir = common::tempdir("cli-test");
    let p = dir.path().join(name);
    std::fs::write(&p, json).unwrap();
    fails(&["rope", "inspect", "--config", p.to_str().unwrap()])
}

#[test]
fn bad_rope_configs_are_one_line_errors() {
    // A 512-wide, 8-head model trained at 2048 with `extra`'s keys added.
    let with = |extra: serde_json::Value| {
        let mut cfg = serde_json::json!({
            "hidden_size": 512, "num_attention_heads": 8, "max_position_embeddings": 2048,
        });
        for (k, v) in extra.as_object().expect("an object") {
            cfg[k] = v.clone();
        }
        cfg.to_string()
    };
    let e = inspect_fails(
        "odd.json",
        r#"{"head_dim": 63, "num_attention_heads": 8, "rope_theta": 10000.0}"#,
    );
    assert!(e.contains("63"), "{e}");
    let e = inspect_fails(
        "factor0.json",
        &with(serde_json::json!({"rope_scaling": {"rope_type": "linear", "factor": 0.0}})),
    );
    assert!(e.contains("factor"), "{e}");
    let e = inspect_fails(
        "factor-neg.json",
        &with(serde_json::json!({"rope_scaling": {"rope_type": "yarn", "factor": -2.0}})),
    );
    assert!(e.contains("factor"), "{e}");
    let e = inspect_fails(
        "llama3.json",
        &with(serde_json::json!({"rope_scaling": {
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0,
            "high_freq_factor": 1.0, "original_max_position_embeddings": 1024,
        }})),
    );
    assert!(e.contains("low_freq_factor"), "{e}");
    let e = inspect_fails(
        "longrope.json",
        &with(serde_json::json!({
            "original_max_position_embeddings": 1024,
            "rope_scaling": {"type": "longrope", "short_factor": [1.0, 1.0], "long_factor": [1.0, 1.0]},
        })),
    );
    assert!(
        e.contains("short_factor") || e.contains("long_factor"),
        "{e}"
    );
    let e = inspect_fails(
        "unknown.json",
        &with(serde_json::json!({"rope_scaling": {"rope_type": "bogus", "factor": 2.0}})),
    );
    assert!(
        e.contains("bogus") && e.contains("yarn") && e.contains("llama3"),
        "{e}"
    );
    let e = inspect_fails(
        "missing.json",
        &with(serde_json::json!({"rope_scaling": {"rope_type": "yarn"}})),
    );
    assert!(e.contains("factor"), "{e}");
    let e = inspect_fails("nohead.json", r#"{"rope_theta": 10000.0}"#);
    assert!(e.contains("hidden_size") || e.contains("head_dim"), "{e}");
    let e = inspect_fails(
        "partial.json",
        &with(serde_json::json!({"partial_rotary_factor": 1.5})),
    );
    assert!(e.contains("partial_rotary_factor"), "{e}");
    let e = inspect_fails(
        "zeroheads.json",
        r#"{"hidden_size": 512, "num_attention_heads": 0}"#,
    );
    assert!(e.contains("heads"), "{e}");
    let e = inspect_fails("notjson.json", "this is not json {");
    assert!(e.contains("JSON"), "{e}");
    let e = fails(&["rope", "inspect", "--config", "/nonexistent/config.json"]);
    assert!(e.contains("/nonexistent/config.json"), "{e}");
}

#[test]
fn nan_theta_is_rejected() {
    // JSON has no NaN literal; a huge exponent overflows to infinity, which
    // must be rejected the same way.
    let e = inspect_fails(
        "inftheta.json",
        r#"{"hidden_size": 512, "num_attention_heads": 8, "rope_theta": 1e400}"#,
    );
    assert!(e.contains("theta") || e.contains("JSON"), "{e}");
}

#[test]
fn bad_table_and_bias_arguments_are_one_line_errors() {
    let e = fails(&["bias", "alibi", "--heads", "0"]);
    assert!(e.contains("heads"), "{e}");
    let e = fails(&words("bias t5 --buckets 1 --causal --relative -2:2"));
    assert!(e.contains("buckets"), "{e}");
    let e = fails(&["table", "sinusoidal", "--positions", "4", "--dim", "0"]);
    assert!(e.contains("dim"), "{e}");
    let e = fails(&words("table sinusoidal --positions 4 --dim 8 --offset -3"));
    assert!(e.contains("negative"), "{e}");
    let cfg = fixture("hf-rope/default-64.config.json");
    let e = fails(&argv(
        "rope table --config {} --positions 0,-1",
        &[cfg.to_str().unwrap()],
    ));
    assert!(e.contains("negative"), "{e}");
    let e = fails(&["bias", "t5", "--causal", "--relative", "5:-5"]);
    assert!(e.contains("range"), "{e}");
    // clap usage errors also exit 2.
    fails(&["bias", "t5", "--relative", "-2:2"]);
    fails(&["table", "nosuch"]);
}

#[test]
fn report_writes_markdown_and_json_with_computed_verdicts() {
    let (_tmp, dir) = common::scratch("report-test", "report");
    let out = posenc(&argv(
        "report --preset smoke --out {}",
        &[dir.to_str().unwrap()],
    ));
    common::ok(&out);
    let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
    let results = read_json(&dir.join("results.json"));
    let fams = results["families"].as_array().unwrap();
    for id in [
        "nope",
        "sinusoidal",
        "learned",
        "floater",
        "shaw",
        "alibi",
        "t5",
        "rope",
        "rope-scalings",
    ] {
        assert!(fams.iter().any(|f| f["id"] == id), "family {id} missing");
        assert!(
            md.contains(&format!("<a id=\"{id}\">")),
            "section {id} missing"
        );
    }
    for f in fams {
        for p in f["properties"].as_array().unwrap() {
            for key in [
                "id", "claim", "source", "metric", "value", "rule", "verdict",
            ] {
                assert!(p.get(key).is_some(), "{key} missing in {p}");
            }
            let v = p["verdict"].as_str().unwrap();
            assert!(["reproduced", "partly", "not reproduced"].contains(&v));
        }
    }
    // The RoFormer decay numbers are measured, and land near the paper's.
    let rope = fams.iter().find(|f| f["id"] == "rope").unwrap();
    let decay = rope["properties"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["id"] == "rope.decay")
        .unwrap();
    let v = as_f64s(&decay["value"]);
    assert!(
        (v[0] - 32.5).abs() < 1e-9 && (v[1] - 10.2).abs() < 0.15,
        "{v:?}"
    );
}
