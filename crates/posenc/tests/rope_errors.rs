//! Bad RoPE input gives a typed error, never a panic.

use std::path::Path;

use posenc::rope::scaling::named::FactorScaling;
use posenc::rope::{PairLayout, RopeConfig, RopeScaling, KNOWN_ROPE_TYPES};
use posenc::Error;

fn hf(s: &str) -> Error {
    RopeConfig::from_hf_json_str(s).expect_err("config should be rejected")
}

#[test]
fn odd_or_zero_dimensions() {
    assert!(matches!(
        RopeConfig::new(10000.0, 63),
        Err(Error::InvalidDimension {
            what: "rotary_dim",
            value: 63,
            ..
        })
    ));
    assert!(matches!(
        RopeConfig::new(10000.0, 0),
        Err(Error::InvalidDimension {
            what: "rotary_dim",
            value: 0,
            ..
        })
    ));
    // hidden 504 / 8 heads = 63: odd head, fully rotated
    assert!(matches!(
        hf(r#"{"hidden_size": 504, "num_attention_heads": 8}"#),
        Error::InvalidDimension {
            what: "rotary_dim",
            value: 63,
            ..
        }
    ));
    // int(64 * 0.3) = 19: odd rotary dimension
    assert!(matches!(
        hf(r#"{"head_dim": 64, "partial_rotary_factor": 0.3}"#),
        Error::InvalidDimension {
            what: "rotary_dim",
            value: 19,
            ..
        }
    ));
    // head narrower than the rotary part
    let c = RopeConfig::new(10000.0, 64).unwrap().with_head_dim(32);
    assert!(matches!(
        c.frequencies(None),
        Err(Error::InvalidDimension {
            what: "head_dim",
            ..
        })
    ));
    // dynamic / ntk with rotary_dim 2: exponent d/(d-2) undefined
    let c = RopeConfig::new(10000.0, 2).unwrap();
    assert!(matches!(
        c.clone().with_scaling(RopeScaling::Dynamic {
            factor: 2.0,
            max_position_embeddings: 128
        }),
        Err(Error::InvalidDimension {
            what: "rotary_dim",
            value: 2,
            ..
        })
    ));
    assert!(matches!(
        c.with_scaling(RopeScaling::Ntk { alpha: 2.0 }),
        Err(Error::InvalidDimension {
            what: "rotary_dim",
            value: 2,
            ..
        })
    ));
}

#[test]
fn bad_theta() {
    assert!(matches!(RopeConfig::new(f64::NAN, 64), Err(Error::InvalidTheta(t)) if t.is_nan()));
    assert!(matches!(
        RopeConfig::new(f64::INFINITY, 64),
        Err(Error::InvalidTheta(_))
    ));
    assert!(matches!(
        RopeConfig::new(0.0, 64),
        Err(Error::InvalidTheta(_))
    ));
    assert!(matches!(
        RopeConfig::new(-1.0, 64),
        Err(Error::InvalidTheta(_))
    ));
    assert!(matches!(
        hf(r#"{"head_dim": 64, "rope_theta": -5.0}"#),
        Error::InvalidTheta(_)
    ));
}

#[test]
fn bad_factors() {
    let c = RopeConfig::new(10000.0, 64).unwrap();
    for bad in [0.0, -2.0, f64::NAN, f64::INFINITY] {
        for s in [
            RopeScaling::Linear { factor: bad },
            RopeScaling::Ntk { alpha: bad },
            RopeScaling::Dynamic {
                factor: bad,
                max_position_embeddings: 2048,
            },
            RopeScaling::Proportional {
                factor: bad,
                partial_rotary_factor: 0.5,
            },
            RopeScaling::Llama3 {
                factor: bad,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position_embeddings: 8192,
            },
            // YaRN with transformers' defaults (β_fast 32, β_slow 1, truncated).
            FactorScaling::Yarn.rope_scaling(bad, 4096),
        ] {
            let name = s.rope_type();
            match c.clone().with_scaling(s) {
                Err(Error::InvalidFactor {
                    name: "factor",
                    value,
                }) => {
                    assert!(value.is_nan() || value == bad, "{name}")
                }
                other => panic!("{name} with factor {bad}: {other:?}"),
            }
        }
    }
    assert!(matches!(
        hf(r#"{"head_dim": 64, "rope_scaling": {"rope_type": "linear", "factor": 0}}"#),
        Error::InvalidFactor { name: "factor", .. }
    ));
    assert!(matches!(
        hf(
            r#"{"head_dim": 64, "max_position_embeddings": 2048, "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "attention_factor": -1.0}}"#
        ),
        Error::InvalidFactor {
            name: "attention_factor",
            ..
        }
    ));
}

#[test]
fn llama3_band_order() {
    // Equal factors load (Llama 4 Scout: both 1): no smoothing band, every
    // frequency is kept or divided by the factor, as transformers computes it.
    let cfg = RopeConfig::from_hf_json_str(
        r#"{"head_dim": 128, "rope_theta": 500000.0, "max_position_embeddings": 131072,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192}}"#,
    )
    .unwrap();
    let f = cfg.frequencies(None).unwrap();
    let plain = posenc::rope::scaling::default_inv_freq_f32(500000.0, 128);
    let edge = 8192.0 / 4.0;
    for (i, (&s, &p)) in f.inv_freq.iter().zip(&plain).enumerate() {
        let wavelen = 2.0 * std::f64::consts::PI / p as f64;
        let want = if wavelen > edge { p / 8.0 } else { p };
        assert_eq!(s, want, "pair {i}");
    }
    let e = hf(
        r#"{"head_dim": 128, "rope_theta": 500000.0, "max_position_embeddings": 131072,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 2.0,
                         "original_max_position_embeddings": 8192}}"#,
    );
    assert!(matches!(e, Error::FreqFactorOrder { low, high } if low == 4.0 && high == 2.0));
    let e = RopeConfig::new(500000.0, 128)
        .unwrap()
        .with_scaling(RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 5.0,
            high_freq_factor: 1.0,
            original_max_position_embeddings: 8192,
        });
    assert!(matches!(e, Err(Error::FreqFactorOrder { .. })));
}

#[test]
fn longrope_list_lengths() {
    let short: Vec<f64> = vec![1.0; 32];
    let e = RopeConfig::new(10000.0, 64)
        .unwrap()
        .with_scaling(RopeScaling::LongRope {
            short_factor: short.clone(),
            long_factor: vec![2.0; 31],
            original_max_position_embeddings: 2048,
            factor: 8.0,
            attention_factor: None,
        });
    assert!(matches!(
        e,
        Err(Error::FactorListLength {
            which: "long_factor",
            expected: 32,
            got: 31
        })
    ));
    let e = hf(
        r#"{"head_dim": 8, "max_position_embeddings": 8192, "original_max_position_embeddings": 2048,
        "rope_scaling": {"type": "longrope", "short_factor": [1, 1, 1], "long_factor": [1, 2, 3, 4]}}"#,
    );
    assert!(matches!(
        e,
        Error::FactorListLength {
            which: "short_factor",
            expected: 4,
            got: 3
        }
    ));
    // a non-positive entry
    let e = hf(
        r#"{"head_dim": 4, "max_position_embeddings": 8192, "original_max_position_embeddings": 2048,
        "rope_scaling": {"type": "longrope", "short_factor": [1, 0], "long_factor": [1, 2]}}"#,
    );
    assert!(matches!(
        e,
        Error::InvalidFactor {
            name: "short_factor",
            ..
        }
    ));
}

#[test]
fn unknown_rope_type_lists_known_ones() {
    // ("su" is Phi-3's legacy name of longrope, so not an example here.)
    let e = hf(r#"{"head_dim": 64, "rope_scaling": {"type": "sue", "factor": 2.0}}"#);
    match &e {
        Error::UnknownRopeType { name, known } => {
            assert_eq!(name, "sue");
            assert_eq!(*known, KNOWN_ROPE_TYPES);
        }
        other => panic!("{other:?}"),
    }
    let msg = e.to_string();
    for t in KNOWN_ROPE_TYPES {
        assert!(msg.contains(t), "{msg} should list {t}");
    }
}

#[test]
fn missing_keys_are_named() {
    let key = |e: Error| match e {
        Error::MissingKey { key, .. } => key,
        other => panic!("expected MissingKey, got {other:?}"),
    };
    assert_eq!(
        key(hf(
            r#"{"head_dim": 64, "rope_scaling": {"rope_type": "yarn"}}"#
        )),
        "factor"
    );
    assert_eq!(
        key(hf(
            r#"{"head_dim": 64, "rope_scaling": {"rope_type": "linear"}}"#
        )),
        "factor"
    );
    assert_eq!(
        key(hf(
            r#"{"head_dim": 64, "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}"#
        )),
        "max_position_embeddings"
    );
    assert_eq!(
        key(hf(
            r#"{"head_dim": 64, "max_position_embeddings": 8, "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "high_freq_factor": 4.0}}"#
        )),
        "low_freq_factor"
    );
    assert_eq!(
        key(hf(
            r#"{"head_dim": 4, "max_position_embeddings": 8, "rope_scaling": {"rope_type": "longrope", "long_factor": [1, 1]}}"#
        )),
        "short_factor"
    );
    // yarn without any context length anywhere
    assert_eq!(
        key(hf(
            r#"{"head_dim": 64, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}"#
        )),
        "original_max_position_embeddings"
    );
    // no head dimension derivable
    assert_eq!(key(hf(r#"{"rope_theta": 10000.0}"#)), "head_dim");
    assert_eq!(key(hf(r#"{"hidden_size": 512}"#)), "num_attention_heads");
    let msg = hf(r#"{"head_dim": 64, "rope_scaling": {"rope_type": "yarn"}}"#).to_string();
    assert!(msg.contains("factor") && msg.contains("yarn"), "{msg}");
}

#[test]
fn partial_rotary_factor_out_of_range() {
    for bad in ["0", "0.0", "-0.5", "1.5"] {
        let e = hf(&format!(
            r#"{{"head_dim": 64, "partial_rotary_factor": {bad}}}"#
        ));
        assert!(matches!(e, Error::PartialRotaryFactor(_)), "{bad}: {e:?}");
    }
    let e = hf(r#"{"head_dim": 64, "rotary_pct": 2.0}"#);
    assert!(matches!(e, Error::PartialRotaryFactor(v) if v == 2.0));
    let e = RopeConfig::new(10000.0, 64)
        .unwrap()
        .with_scaling(RopeScaling::Proportional {
            factor: 1.0,
            partial_rotary_factor: 0.0,
        });
    assert!(matches!(e, Err(Error::PartialRotaryFactor(_))));
}

#[test]
fn zero_heads() {
    assert!(matches!(
        hf(r#"{"hidden_size": 512, "num_attention_heads": 0}"#),
        Error::ZeroHeads
    ));
}

#[test]
fn files_missing_or_not_json() {
    let missing =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf-rope/no-such-config.json");
    match RopeConfig::from_hf_file(&missing) {
        Err(Error::Io { path, .. }) => assert_eq!(path, missing),
        other => panic!("{other:?}"),
    }
    // a file that exists but is not JSON: this test's own source
    let not_json = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/rope_errors.rs");
    match RopeConfig::from_hf_file(&not_json) {
        Err(Error::Json { path: Some(p), .. }) => assert_eq!(p, not_json),
        other => panic!("{other:?}"),
    }
    assert!(matches!(hf("{not json"), Error::Json { path: None, .. }));
    // JSON of the wrong shape (a number where a dimension goes)
    assert!(matches!(
        hf(r#"{"head_dim": "sixty-four"}"#),
        Error::Json { path: None, .. }
    ));
}

#[test]
fn per_layer_parameters_without_full_attention() {
    let e = hf(
        r#"{"head_dim": 64, "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}}"#,
    );
    assert!(
        matches!(e, Error::InvalidValue { ref key, .. } if key == "rope_parameters"),
        "{e:?}"
    );
}

#[test]
fn wrong_vector_length_is_a_shape_error() {
    use posenc::rope::{xpos::XPos, Rope};
    use posenc::RotaryEncoding;
    let rope = Rope::new(
        RopeConfig::new(10000.0, 8)
            .unwrap()
            .with_layout(PairLayout::Interleaved),
    )
    .unwrap();
    assert!(matches!(
        rope.apply_query(&mut [0.0; 7], 3),
        Err(Error::Shape { .. })
    ));
    assert!(matches!(
        rope.apply_key(&mut [0.0; 9], 3),
        Err(Error::Shape { .. })
    ));
    let x = XPos::new(8).unwrap();
    assert!(matches!(
        x.apply_query(&mut [0.0; 6], 3),
        Err(Error::Shape { .. })
    ));
    assert!(matches!(XPos::new(7), Err(Error::InvalidDimension { .. })));
    assert!(matches!(
        XPos::new(8).unwrap().with_scale_base(0.0),
        Err(Error::InvalidFactor { .. })
    ));
}
