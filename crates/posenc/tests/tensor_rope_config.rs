//! The tensor `Rope` built straight from Hugging Face configs: plain,
//! YaRN (attention factor), dynamic NTK (frequencies grow past the original
//! context and reset below it) and LongRoPE (short/long factors switch with
//! the length), each against the f64 reference of the same frequencies.

use candle_core::{Device, Tensor};
use posenc::rope::RopeConfig;
use posenc::tensor::rope::Rope;

use crate::learned_common;
use learned_common::flat;

/// A seeded `(1, heads, t, d)` tensor.
fn input(heads: usize, t: usize, d: usize, seed: u64) -> Tensor {
    let mut r = posenc::analysis::SplitMix64::new(seed);
    let v: Vec<f32> = (0..heads * t * d).map(|_| r.normal() as f32).collect();
    Tensor::from_vec(v, (1, heads, t, d), &Device::Cpu).unwrap()
}

/// The f64 rotation of every head vector by `cfg.frequencies(seq_len)`.
fn reference(x: &Tensor, cfg: &RopeConfig, seq_len: Option<usize>, offset: u64) -> Vec<f64> {
    let f = cfg.frequencies(seq_len).unwrap();
    let (_, h, t, d) = x.dims4().unwrap();
    let mut out = flat(x);
    for hh in 0..h {
        for tt in 0..t {
            let s = (hh * t + tt) * d;
            f.rotate(&mut out[s..s + d], offset + tt as u64).unwrap();
        }
    }
    out
}

fn max_err(a: &Tensor, b: &[f64]) -> f64 {
    flat(a)
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}

/// Applies the config's `Rope` at each length `T` (offset 0) and compares
/// with the f64 rotation by `cfg.frequencies(seq_len)` for the `seq_len`
/// transformers would use at that length.
fn check(cfg_json: &str, cases: &[(usize, Option<usize>)]) {
    let cfg = RopeConfig::from_hf_json_str(cfg_json).unwrap();
    let d = cfg.head_dim();
    let rope = Rope::new(cfg.clone()).unwrap();
    for &(t, seq) in cases {
        let q = input(2, t, d, t as u64);
        let k = input(2, t, d, t as u64 + 1);
        let (qr, kr) = rope.apply(&q, &k, 0).unwrap();
        let eq = max_err(&qr, &reference(&q, &cfg, seq, 0));
        let ek = max_err(&kr, &reference(&k, &cfg, seq, 0));
        assert!(
            eq <= 1e-5 && ek <= 1e-5,
            "{} at T = {t}: {eq} {ek}",
            cfg.rope_type()
        );
    }
}

#[test]
fn plain_and_yarn_configs_match_their_frequencies() {
    let base = r#""hidden_size": 128, "num_attention_heads": 4, "max_position_embeddings": 256, "rope_theta": 10000.0"#;
    check(&format!("{{{base}}}"), &[(1, None), (3, None), (129, None)]);
    check(
        &format!(
            r#"{{{base}, "rope_scaling": {{"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}}}}"#
        ),
        &[(5, None), (200, None)],
    );
}

#[test]
fn dynamic_ntk_grows_past_the_original_context_and_resets_below_it() {
    let cfg = r#"{"hidden_size": 128, "num_attention_heads": 4, "max_position_embeddings": 64,
                  "rope_theta": 10000.0, "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}"#;
    // 32 ≤ 64: the load-time table; 150 > 64: frequencies for 150; back to
    // 20: reset to the load-time table, as transformers does.
    check(cfg, &[(32, None), (150, Some(150)), (20, None)]);
    let c = RopeConfig::from_hf_json_str(cfg).unwrap();
    assert_ne!(
        c.frequencies(None).unwrap().inv_freq,
        c.frequencies(Some(150)).unwrap().inv_freq
    );
}

#[test]
fn longrope_switches_from_short_to_long_factors() {
    let short: Vec<String> = (0..16)
        .map(|i| format!("{}", 1.0 + 0.01 * i as f64))
        .collect();
    let long: Vec<String> = (0..16)
        .map(|i| format!("{}", 1.0 + 0.5 * i as f64))
        .collect();
    let cfg = format!(
        r#"{{"hidden_size": 128, "num_attention_heads": 4, "max_position_embeddings": 512,
             "original_max_position_embeddings": 64, "rope_theta": 10000.0,
             "rope_scaling": {{"type": "longrope", "short_factor": [{}], "long_factor": [{}]}}}}"#,
        short.join(","),
        long.join(",")
    );
    check(&cfg, &[(40, None), (100, Some(100))]);
    let c = RopeConfig::from_hf_json_str(&cfg).unwrap();
    assert_ne!(
        c.frequencies(Some(40)).unwrap().inv_freq,
        c.frequencies(Some(100)).unwrap().inv_freq
    );
}

/// `RopeScaling::from_factor` gives what transformers reads from a config
/// that states only `rope_type` and `factor` (plus the pre-training length
/// and, for Llama 3, its two band factors): same frequencies and attention
/// factor at lengths inside and beyond the pre-training context.
#[test]
fn from_factor_matches_a_config_stating_only_the_factor() {
    use posenc::rope::RopeScaling;
    let (theta, dim, original, factor) = (10000.0, 64usize, 512usize, 4.0);
    let cases = [
        (
            "linear",
            serde_json::json!({"rope_type": "linear", "factor": factor}),
        ),
        (
            "dynamic",
            serde_json::json!({"rope_type": "dynamic", "factor": factor}),
        ),
        (
            "yarn",
            serde_json::json!({"rope_type": "yarn", "factor": factor,
                "original_max_position_embeddings": original}),
        ),
        (
            "llama3",
            serde_json::json!({"rope_type": "llama3", "factor": factor,
                "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": original}),
        ),
    ];
    for (name, rope_scaling) in cases {
        let config = serde_json::json!({
            "hidden_size": dim * 4,
            "num_attention_heads": 4,
            "rope_theta": theta,
            "max_position_embeddings": original,
            "rope_scaling": rope_scaling,
        });
        let from_config = RopeConfig::from_hf_json_str(&config.to_string()).unwrap();
        let built = RopeConfig::new(theta, dim)
            .unwrap()
            .with_max_position_embeddings(original)
            .with_scaling(RopeScaling::from_factor(name, factor, original).unwrap())
            .unwrap();
        assert_eq!(built.scaling(), from_config.scaling(), "{name}");
        for len in [original / 2, original * 3] {
            let (a, b) = (
                built.frequencies(Some(len)).unwrap(),
                from_config.frequencies(Some(len)).unwrap(),
            );
            assert_eq!(a.inv_freq, b.inv_freq, "{name} at {len}");
            assert_eq!(a.attention_factor, b.attention_factor, "{name} at {len}");
        }
    }
    assert_eq!(
        RopeScaling::from_factor("none", factor, original).unwrap(),
        RopeScaling::Default
    );
    assert_eq!(
        RopeScaling::from_factor("ntk", factor, original).unwrap(),
        RopeScaling::Ntk { alpha: factor }
    );
    assert!(matches!(
        RopeScaling::from_factor("longrope", factor, original),
        Err(posenc::Error::UnknownRopeType { .. })
    ));
}
