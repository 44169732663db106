//! M-RoPE sections and position ids, vision positions, per-layer model
//! reading, the new scalings and Llama 4's temperature: rules and errors
//! beyond the transformers fixtures of `rope_models.rs`.

use posenc::rope::axial::{AxialFrequencies, AxisSplit};
use posenc::rope::layers::{AttnTemperature, LayerRope, ModelRope};
use posenc::rope::mrope::{mrope_axes, rope_index, IndexRules, MropeLayout, Segment};
use posenc::rope::scaling::{default_inv_freq_f32, mixed_ntk, ntk};
use posenc::rope::vision::{llama4_vision_positions, pixtral, qwen_vl_vision_positions};
use posenc::rope::{PairLayout, RopeConfig, RopeScaling};
use posenc::Error;

#[test]
fn mrope_sections() {
    // chunked, more than three sections cycle through t, h, w
    assert_eq!(
        mrope_axes(&[1, 1, 1, 2], 5, MropeLayout::Chunked).unwrap(),
        vec![0, 1, 2, 0, 0]
    );
    // Qwen3-VL: [24, 20, 20] over 64 frequencies: h at j ≡ 1 (mod 3), w at
    // j ≡ 2 (mod 3), both below 60; t elsewhere
    let a = mrope_axes(&[24, 20, 20], 64, MropeLayout::Interleaved).unwrap();
    for (j, &ax) in a.iter().enumerate() {
        let want = if j % 3 == 1 && j < 60 {
            1
        } else if j % 3 == 2 && j < 60 {
            2
        } else {
            0
        };
        assert_eq!(ax, want, "frequency {j}");
    }
    // the sum is checked
    let e = mrope_axes(&[16, 24, 24], 32, MropeLayout::Chunked).unwrap_err();
    assert!(e.to_string().contains("adds up to 64"), "{e}");
    // interleaved sections that cannot fit their count
    let e = mrope_axes(&[1, 20, 20], 41, MropeLayout::Interleaved).unwrap_err();
    assert!(matches!(e, Error::InvalidValue { .. }), "{e}");
    assert!(mrope_axes(&[8, 8], 16, MropeLayout::Interleaved).is_err());
    assert!(mrope_axes(&[], 0, MropeLayout::Chunked).is_err());
}

#[test]
fn position_ids_rules() {
    // Qwen3-VL / GLM-4V: a video of T frames is T one-frame grids
    let split = rope_index(
        &[Segment::Video {
            t: 2,
            h: 4,
            w: 4,
            seconds_per_grid: None,
        }],
        IndexRules::FrameSplit,
        2,
    )
    .unwrap();
    let frames = rope_index(
        &[
            Segment::Video {
                t: 1,
                h: 4,
                w: 4,
                seconds_per_grid: None,
            },
            Segment::Video {
                t: 1,
                h: 4,
                w: 4,
                seconds_per_grid: None,
            },
        ],
        IndexRules::Qwen2Vl,
        2,
    )
    .unwrap();
    assert_eq!(split, frames);
    assert_eq!(split.ids[4], [2, 2, 2]);
    // Qwen2.5-VL: temporal index ⌊k · tokens_per_second · seconds⌋ in float32
    let ids = rope_index(
        &[Segment::Video {
            t: 7,
            h: 2,
            w: 2,
            seconds_per_grid: Some(1.0 / 3.0),
        }],
        IndexRules::Qwen25Vl {
            tokens_per_second: 2.0,
        },
        2,
    )
    .unwrap();
    let t: Vec<u64> = ids.ids.iter().map(|p| p[0]).collect();
    let interval = 2.0f32 * (1.0f64 / 3.0) as f32;
    let want: Vec<u64> = (0..7)
        .map(|k| ((k as f32) * interval).trunc() as u64)
        .collect();
    assert_eq!(t, want);
    assert_eq!(t, vec![0, 0, 1, 2, 2, 3, 4]);
    // decoding continues after the largest coordinate
    let ids = rope_index(
        &[Segment::Text(2), Segment::Image { t: 1, h: 8, w: 2 }],
        IndexRules::Qwen2Vl,
        2,
    )
    .unwrap();
    assert_eq!(ids.next_position(), 2 + 4);
    assert_eq!(ids.decode_position(3).unwrap(), [9, 9, 9]);
    assert_eq!(ids.delta(), 6 - 6);
    // errors, before anything is allocated
    let seg = |t, h, w| [Segment::Image { t, h, w }];
    assert!(matches!(
        rope_index(&seg(1, 4, 4), IndexRules::Qwen2Vl, 0).unwrap_err(),
        Error::InvalidDimension { .. }
    ));
    assert!(rope_index(&seg(1, 1, 4), IndexRules::Qwen2Vl, 2).is_err());
    assert!(rope_index(&seg(0, 4, 4), IndexRules::Qwen2Vl, 2).is_err());
    assert!(matches!(
        rope_index(&seg(1 << 20, 1 << 20, 1 << 20), IndexRules::Qwen2Vl, 1).unwrap_err(),
        Error::TooLarge { .. }
    ));
    assert!(matches!(
        rope_index(&[Segment::Text(usize::MAX)], IndexRules::Qwen2Vl, 2).unwrap_err(),
        Error::TooLarge { .. }
    ));
    for bad in [-1.0, f64::NAN, f64::INFINITY] {
        let e = rope_index(
            &[Segment::Video {
                t: 2,
                h: 2,
                w: 2,
                seconds_per_grid: Some(bad),
            }],
            IndexRules::Qwen25Vl {
                tokens_per_second: 2.0,
            },
            2,
        )
        .unwrap_err();
        assert!(matches!(e, Error::InvalidValue { .. }), "{bad}: {e}");
    }
    let e = rope_index(
        &[Segment::Video {
            t: 3,
            h: 2,
            w: 2,
            seconds_per_grid: Some(1e30),
        }],
        IndexRules::Qwen25Vl {
            tokens_per_second: 1e10,
        },
        2,
    )
    .unwrap_err();
    assert!(
        matches!(e, Error::InvalidValue { .. } | Error::TooLarge { .. }),
        "{e}"
    );
}

#[test]
fn vision_positions_and_frequencies() {
    // merge blocks of 2 × 2, block-major, repeated per temporal patch
    let p = qwen_vl_vision_positions(2, 2, 2, 2).unwrap();
    assert_eq!(p.len(), 8);
    assert_eq!(&p[..4], &p[4..]);
    assert!(qwen_vl_vision_positions(1, 3, 4, 2).is_err());
    let l = llama4_vision_positions(3).unwrap();
    assert_eq!(l.len(), 10);
    assert_eq!(l[0], [1, 1]);
    assert_eq!(l[5], [3, 2]);
    assert_eq!(l[9], [0, 0]);
    assert!(pixtral(1e4, 18).is_err());
    assert!(pixtral(f64::NAN, 16).is_err());
    // two axes with the same position on both are not plain RoPE for
    // Pixtral (its pairs use the even and odd frequencies), but the angle
    // of every pair is position × its frequency
    let f = pixtral(1e4, 16).unwrap();
    let (c, _) = f.cos_sin_f64(&[3, 5]).unwrap();
    assert_eq!(c.len(), 8);
    for (j, (&cj, &fj)) in c.iter().zip(f.inv_freq()).enumerate() {
        let p = if j < 4 { 3.0 } else { 5.0 };
        assert_eq!(cj, (p * fj as f64).cos());
    }
    // generic axial RoPE
    let f =
        AxialFrequencies::axial(100.0, 12, 3, AxisSplit::Chunked, PairLayout::HalfSplit).unwrap();
    assert_eq!(f.axis_counts(), vec![2, 2, 2]);
    assert_eq!(f.inv_freq()[..2], default_inv_freq_f32(100.0, 4)[..]);
    assert!(
        AxialFrequencies::axial(100.0, 12, 4, AxisSplit::Chunked, PairLayout::HalfSplit).is_err()
    );
    assert!(matches!(
        AxialFrequencies::axial(100.0, 1 << 20, 2, AxisSplit::Chunked, PairLayout::HalfSplit)
            .unwrap_err(),
        Error::TooLarge { .. }
    ));
    // the relative property on every axis: ⟨R(p)q, R(p')k⟩ depends on p − p'
    let dot = |p: [u64; 3], k: [u64; 3]| {
        let f = AxialFrequencies::axial(50.0, 12, 3, AxisSplit::Interleaved, PairLayout::HalfSplit)
            .unwrap();
        let (mut a, mut b) = (
            vec![
                0.3, -1.0, 2.0, 0.5, 1.0, -0.7, 0.2, 0.9, -1.3, 0.4, 0.8, -0.1,
            ],
            vec![1.0; 12],
        );
        f.rotate(&mut a, &p).unwrap();
        f.rotate(&mut b, &k).unwrap();
        a.iter().zip(&b).map(|(x, y)| x * y).sum::<f64>()
    };
    assert!((dot([5, 7, 9], [2, 3, 4]) - dot([105, 17, 29], [102, 13, 24])).abs() < 1e-9);
}

#[test]
fn model_rope_rules() {
    // Gemma 3: the transformers-5 nested form gives what the legacy keys give
    let legacy = ModelRope::from_hf_json_str(
        r#"{"model_type": "gemma3_text", "head_dim": 256, "num_hidden_layers": 12,
            "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
            "rope_scaling": {"rope_type": "linear", "factor": 8.0}}"#,
    )
    .unwrap();
    let nested = ModelRope::from_hf_json_str(
        r#"{"model_type": "gemma3_text", "head_dim": 256, "num_hidden_layers": 12,
            "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention", "sliding_attention",
                            "sliding_attention", "full_attention", "sliding_attention", "sliding_attention",
                            "sliding_attention", "sliding_attention", "sliding_attention", "full_attention"],
            "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
                                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}}"#,
    )
    .unwrap();
    assert_eq!(legacy.layer_types(), nested.layer_types());
    assert_eq!(legacy.layers(), nested.layers());
    // the old single-RoPE reader keeps the full-attention one
    let full = RopeConfig::from_hf_json_str(
        r#"{"model_type": "gemma3_text", "head_dim": 256, "rope_scaling": {"rope_type": "linear", "factor": 8.0}}"#,
    )
    .unwrap();
    assert_eq!((full.rope_type(), full.theta()), ("linear", 1e6));

    // Gemma 4 without rope_parameters: its defaults
    let g4 =
        ModelRope::from_hf_json_str(r#"{"model_type": "gemma4_text", "num_hidden_layers": 7}"#)
            .unwrap();
    let names: Vec<&str> = g4.layers().iter().map(LayerRope::name).collect();
    assert_eq!(names[5], "full_attention");
    assert_eq!(
        names[6], "full_attention",
        "Gemma 4's last layer is full attention"
    );
    let full = g4.layer_type("full_attention").unwrap();
    assert_eq!((full.rope_type(), full.head_dim()), ("proportional", 512));

    // a null entry is a layer type without RoPE; linear attention has none
    let m = ModelRope::from_hf_json_str(
        r#"{"head_dim": 64, "layer_types": ["full_attention", "sliding_attention", "linear_attention"],
            "rope_parameters": {"full_attention": {"rope_theta": 10000.0}, "sliding_attention": null}}"#,
    )
    .unwrap();
    let names: Vec<&str> = m.layers().iter().map(LayerRope::name).collect();
    assert_eq!(names, ["full_attention", "nope", "nope"]);
    // an entry missing for a layer type is an error, not a silent default
    let e = ModelRope::from_hf_json_str(
        r#"{"head_dim": 64, "layer_types": ["full_attention", "sliding_attention"],
            "rope_parameters": {"full_attention": {"rope_theta": 10000.0}}}"#,
    )
    .unwrap_err();
    assert!(e.to_string().contains("sliding_attention"), "{e}");
    // lengths are checked
    let e = ModelRope::from_hf_json_str(
        r#"{"head_dim": 64, "num_hidden_layers": 3, "layer_types": ["full_attention"]}"#,
    )
    .unwrap_err();
    assert!(e.to_string().contains("layer_types"), "{e}");
    let e = ModelRope::from_hf_json_str(
        r#"{"model_type": "smollm3", "head_dim": 64, "num_hidden_layers": 8, "no_rope_layers": [1, 1, 0]}"#,
    )
    .unwrap_err();
    assert!(e.to_string().contains("no_rope_layers"), "{e}");
    // Llama 4: an explicit list; `true`/`false` and numbers both work
    let m = ModelRope::from_hf_json_str(
        r#"{"model_type": "llama4_text", "head_dim": 64, "num_hidden_layers": 4,
            "no_rope_layers": [1, false, true, 0], "attn_temperature_tuning": 4}"#,
    )
    .unwrap();
    let names: Vec<&str> = m.layers().iter().map(LayerRope::name).collect();
    assert_eq!(
        names,
        ["chunked_attention", "nope", "chunked_attention", "nope"]
    );
    assert_eq!(m.attn_temperature(), Some(AttnTemperature::LLAMA4));
    assert_eq!(m.attention_chunk_size(), Some(8192));
    assert_eq!(m.single().unwrap().theta(), 5e5, "Llama 4's default base");

    // M-RoPE: the config's key wins over the model's layout
    let m = ModelRope::from_hf_json_str(
        r#"{"model_type": "qwen2_vl", "hidden_size": 256, "num_attention_heads": 4,
            "rope_scaling": {"type": "mrope", "mrope_section": [12, 10, 10], "mrope_interleaved": true}}"#,
    )
    .unwrap();
    assert_eq!(
        m.mrope_section().unwrap(),
        (&[12usize, 10, 10][..], MropeLayout::Interleaved)
    );
    // [8, 12, 12] cannot be interleaved over 32 frequencies (h would get 11, w 10)
    let e = ModelRope::from_hf_json_str(
        r#"{"model_type": "qwen2_vl", "hidden_size": 256, "num_attention_heads": 4,
            "rope_scaling": {"type": "mrope", "mrope_section": [8, 12, 12], "mrope_interleaved": true}}"#,
    )
    .unwrap_err();
    assert!(e.to_string().contains("mrope_section"), "{e}");
    assert_eq!(m.single().unwrap().rope_type(), "default");
    assert_eq!(m.single().unwrap().theta(), 1e6, "Qwen2-VL's default base");
    // a model default when the key is absent; a bad section is an error
    let m =
        ModelRope::from_hf_json_str(r#"{"model_type": "qwen3_vl_text", "head_dim": 128}"#).unwrap();
    assert_eq!(
        m.mrope_section().unwrap(),
        (&[24usize, 20, 20][..], MropeLayout::Interleaved)
    );
    let e = ModelRope::from_hf_json_str(
        r#"{"model_type": "qwen2_vl", "head_dim": 128, "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 20]}}"#,
    )
    .unwrap_err();
    assert!(e.to_string().contains("mrope_section"), "{e}");
    // YaRN with M-RoPE, as transformers allows
    let m = ModelRope::from_hf_json_str(
        r#"{"model_type": "qwen2_5_vl", "head_dim": 128, "max_position_embeddings": 128000,
            "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768,
                             "mrope_section": [16, 24, 24]}}"#,
    )
    .unwrap();
    let f = m.axial_frequencies("full_attention", None).unwrap();
    assert_eq!(f.rope_type(), "yarn");
    assert!(f.attention_factor() > 1.0);
    assert_eq!(f.axis_counts(), vec![16, 24, 24]);
}

#[test]
fn mixed_ntk_and_ntk_alpha() {
    // vLLM's mixed NTK against the formula in f64
    let (d, s, b) = (64usize, 8.0f64, 1.5f64);
    let f = mixed_ntk::inv_freq(10000.0, d, s, b);
    let a = s.ln() / ((d / 2) as f64).powf(b);
    for (i, &v) in f.iter().enumerate() {
        let want =
            10000f64.powf(-((2 * i) as f64) / d as f64) / (a * ((i + 1) as f64).powf(b)).exp();
        assert!(
            ((v as f64) - want).abs() <= 2e-6 * want,
            "pair {i}: {v} vs {want}"
        );
    }
    // b = 1 is vLLM's fixed NTK: base^(−2(i−1)/d) · s^(−2i/d)
    let f = mixed_ntk::inv_freq(10000.0, d, s, 1.0);
    for (i, &v) in f.iter().enumerate() {
        let want = 10000f64.powf(-((2 * i) as f64) / d as f64)
            * s.powf(-((2 * (i + 1)) as f64) / d as f64);
        assert!(((v as f64) - want).abs() <= 2e-6 * want, "pair {i}");
    }
    let cfg = RopeConfig::from_hf_json_str(
        r#"{"head_dim": 64, "rope_scaling": {"rope_type": "ntk", "factor": 8.0, "mixed_b": 1.5}}"#,
    )
    .unwrap();
    assert_eq!(
        cfg.scaling(),
        &RopeScaling::MixedNtk {
            factor: 8.0,
            mixed_b: 1.5
        }
    );
    assert_eq!(
        cfg.frequencies(None).unwrap().inv_freq,
        mixed_ntk::inv_freq(10000.0, 64, 8.0, 1.5)
    );
    // Hunyuan: "dynamic" with alpha is the fixed NTK-aware base, not dynamic
    let cfg = RopeConfig::from_hf_json_str(
        r#"{"head_dim": 128, "max_position_embeddings": 32768,
            "rope_scaling": {"type": "dynamic", "alpha": 1000.0, "factor": 1.0}}"#,
    )
    .unwrap();
    assert_eq!(cfg.rope_type(), "ntk_alpha");
    assert_eq!(
        cfg.frequencies(Some(1 << 20)).unwrap().inv_freq,
        ntk::inv_freq(10000.0, 128, 1000.0)
    );
    let e = RopeConfig::from_hf_json_str(
        r#"{"head_dim": 64, "rope_scaling": {"rope_type": "ntk", "factor": 8.0, "mixed_b": 1e400}}"#,
    );
    assert!(e.is_err());
}

#[test]
fn llama4_temperature() {
    let t = AttnTemperature::LLAMA4;
    assert_eq!(t.scale(8190), 1.0);
    assert!((t.scale(8191) - (1.0 + 0.1 * 2f64.ln())).abs() < 1e-15);
    assert!((t.scale(16383) - (1.0 + 0.1 * 3f64.ln())).abs() < 1e-15);
    let s = t.scales(8190, 3);
    assert_eq!(s[0], 1.0);
    assert_eq!(s[1], (1.0 + 0.1 * 2f64.ln()) as f32);
    assert!(AttnTemperature::new(0.0, 0.1).is_err());
    assert!(AttnTemperature::new(8192.0, f64::NAN).is_err());
}
