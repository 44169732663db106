//! `posenc analyze` and `posenc compare`: measurements against the papers'
//! numbers and reference data, plots written, bad input.

use std::path::PathBuf;
use std::process::Output;

use serde_json::Value;

use crate::common;

use common::{argv, f64s, ok, words};

fn posenc(args: &[&str]) -> Output {
    common::run(args, &[])
}

fn json(args: &[&str]) -> Value {
    serde_json::from_str(&ok(&posenc(args))).expect("JSON on stdout")
}

fn measurement<'a>(v: &'a Value, id: &str) -> &'a Value {
    v["measurements"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["id"] == id)
        .unwrap_or_else(|| panic!("no measurement {id}"))
}

/// The path `name` (not created) in a new scratch directory, and the
/// guard that removes that directory when dropped.
fn tmpdir(name: &str) -> (tempfile::TempDir, PathBuf) {
    common::scratch(&format!("viz-an-{name}"), name)
}

fn fails(args: &[&str], needle: &str) {
    common::fails_mentioning(args, needle);
}

#[test]
fn rope_decay_bound_matches_roformer() {
    let v = json(&["analyze", "rope", "--json"]);
    let m = measurement(&v, "decay-bound");
    let r = &m["value"]["reference_d128_base10000"];
    // RoFormer §3.4.3, Fig. 2: 32.5 at distance 0, about 10.2 at 100.
    assert!((r["at_0"].as_f64().unwrap() - 32.5).abs() < 1e-9);
    assert!((r["at_100"].as_f64().unwrap() - 10.2).abs() < 0.1);
    assert_eq!(r["curve"].as_array().unwrap().len(), 257);
    assert_eq!(m["claim"]["verdict"], "reproduced");
    // The default encoding is d = 128, base 10000: its own curve is the same.
    let own = m["value"]["this_encoding"]["curve"].as_array().unwrap();
    for (a, b) in own.iter().zip(r["curve"].as_array().unwrap()) {
        assert!((a.as_f64().unwrap() - b.as_f64().unwrap()).abs() < 1e-3);
    }
    assert_eq!(
        measurement(&v, "relative-invariance")["claim"]["verdict"],
        "reproduced"
    );
    assert!(
        measurement(&v, "relative-invariance")["value"]
            .as_f64()
            .unwrap()
            <= 1e-9
    );
    assert_eq!(
        measurement(&v, "norm-change")["claim"]["verdict"],
        "reproduced"
    );
}

#[test]
fn rope_wavelengths_span_two_pi_to_base_two_pi() {
    let v = json(&[
        "analyze", "rope", "--dim", "64", "--theta", "500000", "--json",
    ]);
    let m = measurement(&v, "wavelengths");
    let wl = f64s(&m["value"]["wavelengths"]);
    assert_eq!(wl.len(), 32);
    let two_pi = 2.0 * std::f64::consts::PI;
    assert!((wl[0] - two_pi).abs() < 1e-9);
    // θ_31 = 500000^(−62/64), rounded to f32.
    let expect = two_pi / (500000f64.powf(-62.0 / 64.0) as f32 as f64);
    assert!(
        (wl[31] / expect - 1.0).abs() < 1e-12,
        "{} vs {expect}",
        wl[31]
    );
    assert_eq!(m["claim"]["verdict"], "reproduced");
}

#[test]
fn yarn_from_an_hf_config_matches_transformers() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/viz-fixtures");
    let cfg = format!("{dir}/yarn-8.config.json");
    let expected: Value = serde_json::from_str(
        &std::fs::read_to_string(format!("{dir}/yarn-8.expected.json")).unwrap(),
    )
    .unwrap();
    let case = &expected["cases"][0];
    let v = json(&["analyze", "rope", "--config", &cfg, "--json"]);
    let got = &measurement(&v, "wavelengths")["value"]["inv_freq"];
    let (got, want) = (
        got.as_array().unwrap(),
        case["inv_freq"].as_array().unwrap(),
    );
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(want) {
        // Both are the same f32 values (transformers 5.23 reference).
        assert_eq!(g.as_f64().unwrap() as f32, w.as_f64().unwrap() as f32);
    }
    let af = measurement(&v, "norm-change")["value"]["attention_factor"]
        .as_f64()
        .unwrap();
    assert!((af - case["attention_factor"].as_f64().unwrap()).abs() < 1e-12);
    // A scaled RoPE keeps its relative invariance.
    assert!(
        measurement(&v, "relative-invariance")["value"]
            .as_f64()
            .unwrap()
            <= 1e-9
    );
}

#[test]
fn sinusoidal_measurements_and_verdicts() {
    let v = json(&words("analyze sinusoidal --dim 16 --n 500 --json"));
    let sim = measurement(&v, "similarity");
    let cos = f64s(&sim["value"]["cosine"]);
    // cos(PE(0), PE(k)) = (1/(D/2)) Σ_i cos(k ω_i) for the sinusoidal table.
    for (k, c) in cos.iter().enumerate() {
        let want: f64 = (0..8)
            .map(|i| (k as f64 * 10000f64.powf(-(2 * i) as f64 / 16.0)).cos())
            .sum::<f64>()
            / 8.0;
        assert!((c - want).abs() < 1e-12, "k = {k}");
    }
    // The verdict follows the stated rule from the measured fraction.
    let frac = sim["value"]["monotone_fraction"].as_f64().unwrap();
    let want = if frac >= 1.0 {
        "reproduced"
    } else if frac >= 0.9 {
        "partly"
    } else {
        "not reproduced"
    };
    assert_eq!(sim["claim"]["verdict"], want);
    assert!(sim["claim"]["rule"].as_str().unwrap().contains("0.9"));
    assert_eq!(
        measurement(&v, "linear-map")["claim"]["verdict"],
        "reproduced"
    );
    assert!(
        measurement(&v, "linear-map")["value"]["max"]
            .as_f64()
            .unwrap()
            <= 1e-9
    );
    assert!(
        measurement(&v, "linear-map-fitted")["value"]
            .as_f64()
            .unwrap()
            <= 1e-6
    );
    assert_eq!(measurement(&v, "distinct")["value"]["n"], 500);
    assert!(
        measurement(&v, "distinct")["value"]["min_distance"]
            .as_f64()
            .unwrap()
            > 1e-6
    );
    let wl = measurement(&v, "wavelengths");
    assert!((wl["value"]["min_over_2pi"].as_f64().unwrap() - 1.0).abs() < 1e-12);
    assert_eq!(wl["claim"]["verdict"], "reproduced");
    // Learned tables have no claims to judge: measured, no verdict.
    let v = json(&["analyze", "learned", "--dim", "8", "--json"]);
    assert!(measurement(&v, "similarity").get("claim").is_none());
}

#[test]
fn bias_families_are_relative() {
    for fam in ["alibi", "t5", "shaw"] {
        let v = json(&["analyze", fam, "--positions", "40", "--json"]);
        let m = measurement(&v, "relative");
        assert_eq!(m["value"].as_f64().unwrap(), 0.0, "{fam}");
        assert_eq!(m["claim"]["verdict"], "reproduced", "{fam}");
    }
    let v = json(&["analyze", "alibi", "--heads", "8", "--json"]);
    let slopes = &measurement(&v, "slopes")["value"]["slopes"];
    for h in 0..8 {
        let want = 2f64.powi(-(h as i32 + 1));
        assert!((slopes[h].as_f64().unwrap() - want).abs() < 1e-15);
    }
    let v = json(&["analyze", "shaw", "--k", "3", "--positions", "10", "--json"]);
    assert_eq!(measurement(&v, "clipping")["value"]["distinct_rows"], 7);
}

#[test]
fn output_dir_gets_a_png_and_an_svg_per_plot_and_the_json() {
    for fam in [
        "sinusoidal",
        "rope",
        "xpos",
        "alibi",
        "t5",
        "shaw",
        "learned",
        "floater",
        "binary",
    ] {
        let (_tmp, dir) = tmpdir(fam);
        let out = ok(&posenc(&argv(
            "analyze {} --dim 16 -o {}",
            &[fam, dir.to_str().unwrap()],
        )));
        assert!(out.contains("wrote"), "{fam}: {out}");
        let a: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("analysis.json")).unwrap())
                .unwrap();
        let plots: Vec<&str> = a["measurements"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|m| m["plot"].as_str())
            .collect();
        assert!(!plots.is_empty(), "{fam}");
        for p in plots {
            let png = std::fs::read(dir.join(format!("{p}.png"))).unwrap();
            let dec = png::Decoder::new(png.as_slice()).read_info().expect("PNG");
            assert!(dec.info().width >= 120, "{fam}/{p}");
            let svg = std::fs::read_to_string(dir.join(format!("{p}.svg"))).unwrap();
            roxmltree::Document::parse(&svg).expect("SVG parses");
        }
        // Every verdict is one of the report's three words.
        for m in a["measurements"].as_array().unwrap() {
            if let Some(v) = m["claim"]["verdict"].as_str() {
                assert!(["reproduced", "partly", "not reproduced"].contains(&v));
            }
        }
    }
}

#[test]
fn compare_rope_with_and_without_yarn() {
    let out = ok(&posenc(&words(
        "compare rope rope:scaling=yarn,factor=8,original-max=2048 --dim 128 --color plain",
    )));
    assert!(out.contains("64 pairs"), "{out}");
    // YaRN (Peng et al. 2023): pairs with wavelength < L/β_fast = 64 are
    // kept, pairs with wavelength > L/β_slow = 2048 are divided by the factor.
    let two_pi = 2.0 * std::f64::consts::PI;
    let wl = |i: usize| two_pi * 10000f64.powf(2.0 * i as f64 / 128.0);
    let kept = (0..64).filter(|&i| wl(i) < 2048.0 / 32.0).count();
    assert!(kept >= 1);
    let unchanged = out.lines().find(|l| l.contains("unchanged")).unwrap();
    assert!(
        unchanged.contains(&format!("pairs 0–{}", kept - 2))
            || unchanged.contains(&format!("pairs 0–{}", kept - 1)),
        "{unchanged}"
    );
    assert!(out.contains("interpolated by the full factor 8"), "{out}");
    assert!(out.contains("attention factor"), "{out}");
    let (_tmp, dir) = tmpdir("compare");
    std::fs::create_dir_all(&dir).unwrap();
    for ext in ["png", "svg"] {
        let path = dir.join(format!("cmp.{ext}"));
        ok(&posenc(&[
            "compare",
            "rope",
            "rope:scaling=yarn",
            "-o",
            path.to_str().unwrap(),
        ]));
        if ext == "png" {
            let bytes = std::fs::read(&path).unwrap();
            let dec = png::Decoder::new(bytes.as_slice())
                .read_info()
                .expect("PNG");
            assert!(dec.info().width > 2 * 240 && dec.info().height > 400);
        } else {
            let svg = std::fs::read_to_string(&path).unwrap();
            let doc = roxmltree::Document::parse(&svg).expect("SVG parses");
            let text: String = doc.descendants().filter_map(|n| n.text()).collect();
            assert!(text.contains("Frequency ratio B / A per pair"));
            assert!(text.contains("RoPE yarn"));
        }
    }
    // Other families: bias against bias.
    let out = ok(&posenc(&words(
        "compare alibi alibi:bidirectional --positions 4 --color plain",
    )));
    assert!(out.contains("max |A − B|"), "{out}");
}

#[test]
fn analyze_and_compare_bad_input() {
    fails(&["analyze", "nope"], "unknown encoding");
    fails(&["analyze", "rope", "--dim", "7"], "rotary_dim = 7");
    fails(&["analyze", "sinusoidal", "--n", "1"], "n = 1");
    fails(
        &["analyze", "sinusoidal", "-o", "/proc/forbidden-dir"],
        "cannot create",
    );
    fails(&["compare", "rope", "t6"], "unknown encoding");
    fails(
        &["compare", "rope", "rope", "-o", "/tmp/x.gif"],
        "unknown extension",
    );
    fails(&["compare", "rope", "rope:dim=0"], "dim = 0");
}
