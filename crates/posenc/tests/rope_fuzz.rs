//! Hostile configs: thousands of random mutations of the real-model configs
//! of the test suite (fixed seed), read in process. Every mutant must give a
//! typed error (one line) or RoPE tables that are finite at every position
//! asked — never a panic, an abort, an allocation of the size a config
//! claims, or a hang.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

use posenc::rope::layers::ModelRope;
use posenc::rope::mrope::{rope_index, Segment};
use posenc::rope::vision::VisionRopeKind;
use posenc::rope::{HfRopeConfig, RopeConfig};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::Value;

use crate::config_fuzz;
use config_fuzz::mutate;

const MUTANTS: usize = 3000;

fn seeds() -> Vec<(String, Value)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let mut out = Vec::new();
    for sub in ["checkpoints", "hf-rope", "models"] {
        let mut files: Vec<_> = std::fs::read_dir(root.join(sub))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.to_string_lossy().ends_with(".config.json"))
            .collect();
        files.sort();
        for f in files {
            let v: Value = serde_json::from_str(&std::fs::read_to_string(&f).unwrap()).unwrap();
            out.push((f.file_name().unwrap().to_string_lossy().to_string(), v));
        }
    }
    assert!(out.len() >= 25, "{} seed configs", out.len());
    out
}

fn check_table(f: &posenc::rope::AxialFrequencies, rng: &mut StdRng) {
    let na = f.num_axes();
    let mut pos = Vec::new();
    for p in [0u64, 1, rng.random_range(0..10_000_000)] {
        pos.extend(std::iter::repeat_n(p, na));
    }
    let (c, s) = f
        .cos_sin_table(&pos)
        .expect("a table of 3 rows is within the bounds");
    assert!(
        c.iter().chain(&s).all(|v| v.is_finite()),
        "non-finite table"
    );
}

/// What posenc does with one mutant; panics (the failure) on anything but
/// typed errors and finite tables. Returns whether it loaded.
fn exercise(text: &str, rng: &mut StdRng, kinds: &mut BTreeMap<String, usize>) -> bool {
    let mut one_line = |e: posenc::Error| {
        let m = e.to_string();
        assert!(
            !m.contains('\n') && !m.is_empty(),
            "error message not one line: {m:?}"
        );
        let d = format!("{e:?}");
        let kind = d.split([' ', '(', '{']).next().unwrap_or("").to_string();
        *kinds.entry(kind).or_default() += 1;
    };
    match RopeConfig::from_hf_json_str(text) {
        Ok(c) => {
            for len in [None, Some(rng.random_range(1..1usize << 40))] {
                match c.frequencies(len) {
                    Ok(f) => {
                        let (cos, sin) = f.cos_sin_table(&[0, 1, 12345, 10_000_000]);
                        assert!(cos.iter().chain(&sin).all(|v| v.is_finite()));
                    }
                    Err(e) => one_line(e),
                }
            }
        }
        Err(e) => one_line(e),
    }
    if let Ok(hf) = HfRopeConfig::from_json_str(text) {
        if let Some(vc) = hf.text().vision_config.as_deref() {
            let mt = hf.model_type.clone().unwrap_or_default();
            if let Some(kind) = VisionRopeKind::for_model(&mt, vc.model_type.as_deref()) {
                match (vc.theta(10000.0), vc.head_dim()) {
                    (Ok(t), Ok(d)) => match kind.frequencies(t, d) {
                        Ok(f) => check_table(&f, rng),
                        Err(e) => one_line(e),
                    },
                    (Err(e), _) | (_, Err(e)) => one_line(e),
                }
            }
        }
    }
    match ModelRope::from_hf_json_str(text) {
        Ok(m) => {
            for t in m.layer_types() {
                for len in [None, Some(rng.random_range(1..1usize << 30))] {
                    match m.axial_frequencies(&t.name, len) {
                        Ok(f) => check_table(&f, rng),
                        Err(e) => one_line(e),
                    }
                }
            }
            if let (Some(rules), Some(merge)) = (m.index_rules(), m.spatial_merge_size()) {
                let segs = [
                    Segment::Text(rng.random_range(0..20)),
                    Segment::Image {
                        t: 1,
                        h: rng.random_range(0..40),
                        w: rng.random_range(0..40),
                    },
                    Segment::Video {
                        t: rng.random_range(0..5),
                        h: rng.random_range(0..20),
                        w: rng.random_range(0..20),
                        seconds_per_grid: Some(rng.random_range(-1.0..3.0)),
                    },
                ];
                if let Err(e) = rope_index(&segs, rules, merge) {
                    one_line(e);
                }
            }
            if let Some(t) = m.attn_temperature() {
                assert!(t.scale(rng.random()).is_finite() || t.attn_scale.abs() > 1e300);
            }
            true
        }
        Err(e) => {
            one_line(e);
            false
        }
    }
}

#[test]
fn mutated_real_configs_never_panic() {
    let seeds = seeds();
    let mut rng = StdRng::seed_from_u64(0x0051_2e17_0000_0012);
    let start = Instant::now();
    let (mut loaded, mut slowest) = (0usize, 0f64);
    let mut kinds = BTreeMap::new();
    for i in 0..MUTANTS {
        let (name, base) = &seeds[i % seeds.len()];
        let mut v = base.clone();
        for _ in 0..rng.random_range(1..5) {
            mutate(&mut rng, &mut v);
        }
        let text = v.to_string();
        let t0 = Instant::now();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            exercise(&text, &mut rng, &mut kinds)
        }));
        let dt = t0.elapsed().as_secs_f64();
        slowest = slowest.max(dt);
        match r {
            Ok(ok) => loaded += ok as usize,
            Err(_) => panic!("mutant {i} of {name} panicked:\n{text}"),
        }
        assert!(dt < 5.0, "mutant {i} of {name} took {dt:.1} s:\n{text}");
    }
    let total = start.elapsed().as_secs_f64();
    println!(
        "{MUTANTS} mutants of {} configs: {loaded} loaded, the rest typed errors; {total:.2} s in all, slowest {slowest:.3} s",
        seeds.len()
    );
    println!("typed errors by kind: {kinds:?}");
    assert!(
        kinds.len() >= 6,
        "the mutations reach few error kinds: {kinds:?}"
    );
    // the mutations must not all be rejected (a test that only sees errors checks nothing)
    assert!(loaded > MUTANTS / 10, "only {loaded} mutants loaded");
    assert!(
        loaded < MUTANTS,
        "every mutant loaded: the mutations are too gentle"
    );
}

#[test]
fn the_issue_s_hostile_sizes_are_typed_errors() {
    // head_dim 2^31 used to abort ("memory allocation of 34359738368 bytes
    // failed"), 2^63 to panic with "capacity overflow"
    for hd in [1u64 << 31, 1 << 63, 1 << 17, u64::MAX] {
        let text = serde_json::json!({"head_dim": hd, "rope_theta": 10000.0}).to_string();
        let e = RopeConfig::from_hf_json_str(&text).unwrap_err();
        assert!(
            matches!(
                e,
                posenc::Error::TooLarge {
                    what: "head_dim",
                    ..
                }
            ),
            "{hd}: {e}"
        );
        assert!(ModelRope::from_hf_json_str(&text).is_err());
    }
    let e = RopeConfig::from_hf_json_str(
        r#"{"hidden_size": 9223372036854775807, "num_attention_heads": 1}"#,
    )
    .unwrap_err();
    assert!(matches!(e, posenc::Error::TooLarge { .. }), "{e}");
    let e = ModelRope::from_hf_json_str(r#"{"head_dim": 64, "num_hidden_layers": 4294967296}"#)
        .unwrap_err();
    assert!(
        matches!(
            e,
            posenc::Error::TooLarge {
                what: "num_hidden_layers",
                ..
            }
        ),
        "{e}"
    );
    let e = ModelRope::from_hf_json_str(
        r#"{"model_type": "llama4_text", "head_dim": 64, "num_hidden_layers": 8, "no_rope_layer_interval": 0}"#,
    )
    .unwrap_err();
    assert!(e.to_string().contains("no_rope_layer_interval"), "{e}");
    // a factor so small that θ / factor overflows is an error, not an
    // infinite table: refused when read, outside [1/1024, 1024]
    let e = RopeConfig::from_hf_json_str(
        r#"{"head_dim": 64, "rope_scaling": {"rope_type": "linear", "factor": 1e-300}}"#,
    )
    .unwrap_err();
    assert!(
        matches!(&e, posenc::Error::InvalidValue { key, .. } if key == "factor"),
        "{e}"
    );
    assert!(
        e.to_string().contains("outside [0.0009765625, 1024]"),
        "{e}"
    );
    // an mscale that makes YaRN's attention factor infinite
    let e = RopeConfig::from_hf_json_str(
        r#"{"head_dim": 64, "max_position_embeddings": 4096, "rope_scaling": {"rope_type": "yarn", "factor": 2.0,
            "mscale": 1.0, "mscale_all_dim": -100.0}}"#,
    )
    .unwrap()
    .frequencies(None)
    .unwrap_err();
    assert!(matches!(e, posenc::Error::InvalidFactor { .. }), "{e}");
}
