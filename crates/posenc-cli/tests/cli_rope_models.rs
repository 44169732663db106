//! `posenc rope inspect` / `rope table` on per-layer, multimodal and hostile
//! configs: the JSON interface scripts depend on (issue 12), checked
//! against the transformers 5.23 fixtures of `posenc/tests/fixtures/models`.

use std::path::PathBuf;

use crate::common;

use common::{argv, f64s, ok_json, posenc, read_json};

use serde_json::Value;

fn fixture(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../posenc/tests/fixtures/models")
        .join(rel)
}

fn fails(args: &[&str]) -> String {
    common::one_line_error(posenc(args), args)
}

fn close_freqs(ctx: &str, got: &Value, want: &Value) {
    let (g, w) = (f64s(got), f64s(want));
    assert_eq!(g.len(), w.len(), "{ctx}");
    for (a, b) in g.iter().zip(&w) {
        assert!((a - b).abs() <= 1e-6 * b.abs(), "{ctx}: {a} vs {b}");
    }
}

const MODELS: &[&str] = &[
    "gemma-3-1b-it",
    "gemma-3-4b-it",
    "gemma-4-e2b-it",
    "llama-4-scout-17b-16e-instruct",
    "smollm3-3b",
    "qwen2-vl-7b-instruct",
    "qwen2.5-vl-7b-instruct",
    "qwen3-vl-8b-instruct",
    "hunyuan-dense-ntk-alpha",
];

#[test]
fn inspect_json_lists_every_layer_type() {
    for name in MODELS {
        let cfg = fixture(&format!("{name}.config.json"));
        let exp = read_json(&fixture(&format!("{name}.expected.json")));
        let got = ok_json(&[
            "rope",
            "inspect",
            "--config",
            cfg.to_str().unwrap(),
            "--json",
        ]);
        let types = exp["layer_types"].as_object().unwrap();
        let layers = exp["layers"].as_array().unwrap();
        let differs = types.len() > 1 || layers.iter().any(|l| l == "nope");
        if differs {
            // "layer_types": {NAME: {rope_type, rotary_dim, inv_freq, attention_factor}}, "layers"
            assert_eq!(&got["layers"], &exp["layers"], "{name}: layers");
            let lt = got["layer_types"].as_object().unwrap();
            assert_eq!(lt.len(), types.len(), "{name}");
            for (k, e) in types {
                let g = &lt[k];
                for key in ["rope_type", "rotary_dim", "attention_factor"] {
                    assert_eq!(g[key], e[key], "{name} / {k}: {key}");
                }
                close_freqs(&format!("{name} / {k}"), &g["inv_freq"], &e["inv_freq"]);
            }
        } else {
            assert!(
                got.get("layers").is_none(),
                "{name}: layers listed for a uniform model"
            );
        }
        if types.len() == 1 {
            // one RoPE: today's keys, and the layout
            let (_, e) = types.iter().next().unwrap();
            for key in ["rope_type", "rotary_dim", "attention_factor"] {
                assert_eq!(got[key], e[key], "{name}: {key}");
            }
            close_freqs(name, &got["inv_freq"], &e["inv_freq"]);
            assert!(got["layout"].is_string(), "{name}: layout");
        } else {
            assert!(
                got.get("inv_freq").is_none(),
                "{name}: one table for several layer types"
            );
        }
        match exp.get("mrope") {
            Some(m) => {
                assert_eq!(got["mrope_section"], m["section"], "{name}");
                assert_eq!(got["mrope_interleaved"], m["interleaved"], "{name}");
            }
            None => assert!(got.get("mrope_section").is_none(), "{name}"),
        }
    }
    let got = ok_json(&[
        "rope",
        "inspect",
        "--config",
        fixture("llama-4-scout-17b-16e-instruct.config.json")
            .to_str()
            .unwrap(),
        "--json",
    ]);
    assert_eq!(got["layers"].as_array().unwrap().len(), 48);
    assert_eq!(got["layout"], "interleaved");
    assert_eq!(got["attention_chunk_size"], 8192);
    assert_eq!(got["nope_attn_temperature"]["floor_scale"], 8192.0);
    assert_eq!(got["vision"]["kind"], "llama4");
}

#[test]
fn inspect_text_shows_every_layer_type() {
    let cfg = fixture("gemma-3-4b-it.config.json");
    let out = posenc(&["rope", "inspect", "--config", cfg.to_str().unwrap()]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("full_attention (layers 5, 11, 17, 23, 29)"),
        "{text}"
    );
    assert!(
        text.contains("sliding_attention (layers 0-4, 6-10"),
        "{text}"
    );
    assert!(
        text.contains("linear") && text.contains("rope_theta        10000"),
        "{text}"
    );
    let cfg = fixture("smollm3-3b.config.json");
    let text =
        String::from_utf8(posenc(&["rope", "inspect", "--config", cfg.to_str().unwrap()]).stdout)
            .unwrap();
    assert!(text.contains("NoPE layers       3, 7, 11"), "{text}");
}

/// `rope table --positions-thw ... --json`: cos and sin per position, width
/// rotary_dim / 2, within 2e-7 of transformers' f64 tables (where posenc's
/// f32 frequency has transformers' bits) and of the f64 evaluation of the
/// printed frequencies everywhere.
#[test]
fn table_positions_thw_matches_transformers() {
    let mut compared = 0;
    for name in [
        "qwen2-vl-7b-instruct",
        "qwen2.5-vl-7b-instruct",
        "qwen3-vl-8b-instruct",
    ] {
        let cfg = fixture(&format!("{name}.config.json"));
        let cfg = cfg.to_str().unwrap();
        let exp = read_json(&fixture(&format!("{name}.expected.json")));
        let m = &exp["mrope"];
        let rows: Vec<Vec<u64>> = m["positions_thw"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                r.as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_u64().unwrap())
                    .collect()
            })
            .collect();
        let arg: Vec<String> = rows
            .iter()
            .map(|r| format!("{},{},{}", r[0], r[1], r[2]))
            .collect();
        let got = ok_json(&[
            "rope",
            "table",
            "--config",
            cfg,
            "--positions-thw",
            &arg.join(";"),
            "--json",
        ]);
        assert_eq!(got["positions_thw"].as_array().unwrap().len(), rows.len());
        let insp = ok_json(&["rope", "inspect", "--config", cfg, "--json"]);
        let inv = f64s(&insp["inv_freq"]);
        let hf_inv = f64s(&exp["layer_types"]["full_attention"]["inv_freq"]);
        let axes: Vec<usize> = m["axes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as usize)
            .collect();
        for (key, f) in [("cos", f64::cos as fn(f64) -> f64), ("sin", f64::sin)] {
            for (k, row) in got[key].as_array().unwrap().iter().enumerate() {
                let row = f64s(row);
                assert_eq!(row.len(), inv.len(), "{name}: width rotary_dim / 2");
                for (j, a) in row.iter().enumerate() {
                    let p = rows[k][axes[j]] as f64;
                    let exact = f(p * inv[j]);
                    assert!(
                        (a - exact).abs() <= 2e-7,
                        "{name} {key} {:?} pair {j}",
                        rows[k]
                    );
                    if inv[j] as f32 == hf_inv[j] as f32 {
                        let want = m[format!("{key}_f64")][k][j].as_f64().unwrap();
                        assert!(
                            (a - want).abs() <= 2e-7,
                            "{name} {key} {:?} pair {j}: {a} vs {want}",
                            rows[k]
                        );
                        compared += 1;
                    }
                }
            }
        }
    }
    assert!(compared > 10000, "{compared}");
}

#[test]
fn table_needs_a_layer_type_when_they_differ() {
    let cfg = fixture("gemma-3-1b-it.config.json");
    let cfg = cfg.to_str().unwrap();
    let e = fails(&["rope", "table", "--config", cfg, "--positions", "1"]);
    assert!(
        e.contains("--layer-type") && e.contains("sliding_attention"),
        "{e}"
    );
    let got = ok_json(&argv(
        "rope table --config {} --positions 1 --layer-type sliding_attention --json",
        &[cfg],
    ));
    assert_eq!(got["layer_type"], "sliding_attention");
    assert!((got["cos"][0][0].as_f64().unwrap() - 1f64.cos()).abs() < 1e-7);
    let e = fails(&argv(
        "rope table --config {} --positions 1 --layer-type bogus",
        &[cfg],
    ));
    assert!(e.contains("bogus"), "{e}");
    let e = fails(&["rope", "table", "--config", cfg, "--positions-thw", "1,2,3"]);
    assert!(e.contains("M-RoPE"), "{e}");
    let q = fixture("qwen2-vl-7b-instruct.config.json");
    let q = q.to_str().unwrap();
    for bad in ["1,2", "1,2,3;4", "a,b,c", "-1,0,0", ""] {
        fails(&["rope", "table", "--config", q, "--positions-thw", bad]);
    }
}

#[test]
fn hostile_configs_exit_2_with_one_line() {
    let dir = common::tempdir("cli-hostile");
    let cases = [
        // head_dim 2^31 aborted ("memory allocation of 34359738368 bytes failed")
        (
            r#"{"head_dim": 2147483648, "rope_theta": 10000.0}"#,
            "head_dim",
        ),
        // 2^63 panicked with "capacity overflow"
        (
            r#"{"head_dim": 9223372036854775808, "rope_theta": 10000.0}"#,
            "head_dim",
        ),
        (
            r#"{"hidden_size": 9223372036854775807, "num_attention_heads": 1}"#,
            "head_dim",
        ),
        (
            r#"{"head_dim": 64, "num_hidden_layers": 1099511627776}"#,
            "num_hidden_layers",
        ),
        (
            r#"{"head_dim": 64, "rope_scaling": {"rope_type": "linear", "factor": 1e-300}}"#,
            "`factor`: 1e-300 is outside [0.0009765625, 1024]",
        ),
        (
            r#"{"model_type": "qwen2_vl", "head_dim": 64, "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}}"#,
            "mrope_section",
        ),
        (r#"{"head_dim": 64, "text_config": 3}"#, "JSON"),
    ];
    for (i, (text, word)) in cases.iter().enumerate() {
        let p = dir.path().join(format!("hostile-{i}.json"));
        std::fs::write(&p, text).unwrap();
        for cmd in ["inspect", "table"] {
            let e = fails(&["rope", cmd, "--config", p.to_str().unwrap()]);
            assert!(e.contains(word), "{text}: {e}");
        }
    }
}

#[test]
fn show_rope2d_draws_and_rejects_bad_grids() {
    let dir = common::tempdir("cli-rope2d");
    let png = dir.path().join("sim.png");
    let out = posenc(&argv(
        "show rope2d:variant=pixtral --grid 12x20 --dim 32 -o {}",
        &[png.to_str().unwrap()],
    ));
    common::ok(&out);
    assert!(std::fs::metadata(&png).unwrap().len() > 1000);
    let out = posenc(&[
        "show", "rope2d", "--grid", "5x7", "--patch", "0,0", "--color", "plain",
    ]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("patch (0, 0)") && text.contains("5×7"),
        "{text}"
    );
    for bad in [
        vec!["show", "rope2d", "--grid", "0x7"],
        vec!["show", "rope2d", "--grid", "100000x2"],
        vec!["show", "rope2d", "--grid", "4x4", "--patch", "9,9"],
        vec!["show", "rope2d:variant=bogus"],
        vec!["show", "rope2d", "--dim", "18"],
        vec!["show", "rope", "--grid", "4x4"],
    ] {
        fails(&bad);
    }
}
