//! Per-layer, multimodal and vision RoPE against transformers 5.23.0.
//!
//! `fixtures/models/NAME.config.json` holds the RoPE keys of a published
//! config (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Gemma 3 1B/4B, Gemma 4 E2B,
//! Llama 4 Scout, SmolLM3, Pixtral, and Hunyuan's NTK-alpha keys);
//! `NAME.expected.json` is what transformers itself computes for it
//! (`scripts/rope/gen_model_fixtures.py`): each layer's type or NoPE, each
//! layer type's frequencies and f64 table, M-RoPE's axis layout (from the
//! model's own `recomposition_frequencies`), the M-RoPE position ids of
//! `get_rope_index` for text-image-text and video prompts, the vision
//! encoders' 2-D RoPE, Llama 4's NoPE temperature and DeepSeek's softmax
//! scale.
//!
//! Tolerances as in `rope_hf_parity.rs`: inv_freq within 1e-6 relative,
//! attention factor 1e-9 relative, tables within 2e-7 (built from
//! transformers' own f32 frequencies; the table from posenc's frequencies is
//! checked against the bound its one-ulp frequency differences imply),
//! position ids and layer maps exactly.

use crate::rope_common;

use std::path::PathBuf;

use posenc::rope::axial::AxialFrequencies;
use posenc::rope::layers::{LayerRope, ModelRope};
use posenc::rope::mrope::{mrope_axes, rope_index, MropeLayout, Segment};
use posenc::rope::vision::{
    grid_positions, llama4_vision_positions, qwen_vl_vision_positions, VisionRopeKind,
};
use serde_json::Value;

const INV_FREQ_REL: f64 = 1e-6;
const ATTN_REL: f64 = 1e-9;
const TABLE_ABS: f64 = 2e-7;

fn dir() -> PathBuf {
    rope_common::fixture_dir("models")
}

fn rel(a: f64, b: f64) -> f64 {
    if b == 0.0 {
        a.abs()
    } else {
        ((a - b) / b).abs()
    }
}

fn load(name: &str) -> (ModelRope, Value) {
    let d = dir();
    let m = ModelRope::from_hf_file(&d.join(format!("{name}.config.json")))
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    let text = std::fs::read_to_string(d.join(format!("{name}.expected.json"))).unwrap();
    let exp: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(exp["transformers"], "5.23.0");
    (m, exp)
}

/// A JSON array as a vector of `T` (numbers, or arrays of numbers).
fn list<T: serde::de::DeserializeOwned>(v: &Value) -> Vec<T> {
    serde_json::from_value(v.clone()).unwrap()
}

fn f64s(v: &Value) -> Vec<f64> {
    list(v)
}

fn u64s(v: &Value) -> Vec<u64> {
    list(v)
}

/// Checks the tables of `theirs` (transformers' frequencies and axes) and
/// `ours` at `positions` (row-major, `axes` values per row) against the f64
/// reference rows `expected["cos_f64"]` and `expected["sin_f64"]`. Returns
/// the largest error of `theirs`.
fn check_tables(
    ctx: &str,
    theirs: &AxialFrequencies,
    ours: &AxialFrequencies,
    positions: &[u64],
    expected: &Value,
) -> f64 {
    let cos_ref: Vec<Vec<f64>> = list(&expected["cos_f64"]);
    let sin_ref: Vec<Vec<f64>> = list(&expected["sin_f64"]);
    let n = theirs.num_freqs();
    let na = theirs.num_axes();
    let (c, s) = theirs.cos_sin_table(positions).unwrap();
    let (oc, os) = ours.cos_sin_table(positions).unwrap();
    let mut worst = 0.0f64;
    assert_eq!(cos_ref.len() * na, positions.len(), "{ctx}: rows");
    for (r, (cr, sr)) in cos_ref.iter().zip(&sin_ref).enumerate() {
        assert_eq!(cr.len(), n, "{ctx}: table width");
        let pos = &positions[r * na..(r + 1) * na];
        for j in 0..n {
            let dc = (c[r * n + j] as f64 - cr[j]).abs();
            let ds = (s[r * n + j] as f64 - sr[j]).abs();
            assert!(
                dc <= TABLE_ABS && ds <= TABLE_ABS,
                "{ctx}: position {pos:?}, pair {j}: cos err {dc:e}, sin err {ds:e}"
            );
            worst = worst.max(dc).max(ds);
            let theta = theirs.inv_freq()[j] as f64;
            let p = pos[theirs.axes()[j]] as f64;
            let bound = TABLE_ABS
                + theirs.attention_factor()
                    * p
                    * theta
                    * rel(ours.inv_freq()[j] as f64, theta)
                    * 1.0001;
            let oe = (oc[r * n + j] as f64 - cr[j])
                .abs()
                .max((os[r * n + j] as f64 - sr[j]).abs());
            assert!(
                oe <= bound,
                "{ctx}: own table at {pos:?}, pair {j}: {oe:e} > {bound:e}"
            );
        }
    }
    worst
}

fn check_freqs(ctx: &str, ours: &[f32], theirs: &[f64]) {
    assert_eq!(ours.len(), theirs.len(), "{ctx}: number of frequencies");
    for (j, (&o, &t)) in ours.iter().zip(theirs).enumerate() {
        let e = rel(o as f64, t);
        assert!(
            e <= INV_FREQ_REL,
            "{ctx}: inv_freq[{j}] = {o:e}, transformers {t:e}"
        );
    }
}

/// Layer map and every layer type: frequencies and 1-D tables.
fn check_layers(name: &str, m: &ModelRope, exp: &Value) {
    let want: Vec<&str> = exp["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    let got: Vec<&str> = m.layers().iter().map(LayerRope::name).collect();
    assert_eq!(got, want, "{name}: layers");
    let types = exp["layer_types"].as_object().unwrap();
    let got_names: Vec<&str> = m.layer_types().iter().map(|t| t.name.as_str()).collect();
    let want_names: Vec<&str> = types.keys().map(String::as_str).collect();
    assert_eq!(got_names, want_names, "{name}: layer types");
    for (lt, e) in types {
        let ctx = format!("{name} / {lt}");
        let cfg = m.layer_type(lt).unwrap();
        let f = cfg.frequencies(None).unwrap();
        assert_eq!(
            f.rope_type,
            e["rope_type"].as_str().unwrap(),
            "{ctx}: rope_type"
        );
        assert_eq!(
            f.rotary_dim as u64,
            e["rotary_dim"].as_u64().unwrap(),
            "{ctx}: rotary_dim"
        );
        assert_eq!(
            cfg.head_dim() as u64,
            e["head_dim"].as_u64().unwrap(),
            "{ctx}: head_dim"
        );
        let inv = f64s(&e["inv_freq"]);
        check_freqs(&ctx, &f.inv_freq, &inv);
        let af = e["attention_factor"].as_f64().unwrap();
        assert!(
            rel(f.attention_factor, af) <= ATTN_REL,
            "{ctx}: attention factor"
        );
        let n = inv.len();
        let theirs = AxialFrequencies::new(
            "t",
            inv.iter().map(|&v| v as f32).collect(),
            vec![0; n],
            1,
            af,
            f.layout,
        )
        .unwrap();
        let ours = AxialFrequencies::from_frequencies(&f, vec![0; n], 1).unwrap();
        check_tables(&ctx, &theirs, &ours, &u64s(&e["positions"]), e);
    }
}

fn segment(v: &Value) -> Segment {
    let a = v.as_array().unwrap();
    let n = |i: usize| a[i].as_u64().unwrap() as usize;
    match a[0].as_str().unwrap() {
        "text" => Segment::Text(n(1)),
        "image" => Segment::Image {
            t: n(1),
            h: n(2),
            w: n(3),
        },
        "video" => Segment::Video {
            t: n(1),
            h: n(2),
            w: n(3),
            seconds_per_grid: a[4].as_f64(),
        },
        other => panic!("segment {other}"),
    }
}

fn check_mrope(name: &str, m: &ModelRope, exp: &Value) {
    let e = &exp["mrope"];
    let (section, layout) = m.mrope_section().expect("an M-RoPE model");
    assert_eq!(
        section,
        u64s(&e["section"])
            .iter()
            .map(|&v| v as usize)
            .collect::<Vec<_>>()
            .as_slice(),
        "{name}: section"
    );
    assert_eq!(
        layout == MropeLayout::Interleaved,
        e["interleaved"].as_bool().unwrap(),
        "{name}: interleaved"
    );
    let want_axes: Vec<usize> = u64s(&e["axes"]).iter().map(|&v| v as usize).collect();
    assert_eq!(
        mrope_axes(section, want_axes.len(), layout).unwrap(),
        want_axes,
        "{name}: axes (transformers' recomposition)"
    );
    // position ids of get_rope_index, exactly
    let rules = m.index_rules().unwrap();
    let merge = m.spatial_merge_size().unwrap();
    for s in e["sequences"].as_array().unwrap() {
        let ctx = format!("{name} / {}", s["name"].as_str().unwrap());
        let segs: Vec<Segment> = s["segments"]
            .as_array()
            .unwrap()
            .iter()
            .map(segment)
            .collect();
        let ids = rope_index(&segs, rules, merge).unwrap();
        let want = s["position_ids"].as_array().unwrap();
        let got = ids.by_axis();
        for a in 0..3 {
            assert_eq!(got[a], u64s(&want[a]), "{ctx}: axis {a}");
        }
        assert_eq!(
            ids.delta(),
            s["rope_delta"].as_i64().unwrap() as i128,
            "{ctx}: rope_delta"
        );
    }
    // tables at 3-axis positions
    let lt = &m.layer_types()[0].name;
    let ours = m.axial_frequencies(lt, None).unwrap();
    let inv = f64s(&exp["layer_types"][lt]["inv_freq"]);
    let theirs = AxialFrequencies::new(
        "t",
        inv.iter().map(|&v| v as f32).collect(),
        want_axes,
        3,
        ours.attention_factor(),
        ours.layout(),
    )
    .unwrap();
    let pos: Vec<u64> = e["positions_thw"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(u64s)
        .collect();
    let w = check_tables(&format!("{name} M-RoPE"), &theirs, &ours, &pos, e);
    println!("{name}: M-RoPE table worst {w:.2e}");
}

fn check_vision(name: &str, exp: &Value) {
    let v = &exp["vision"];
    let kind = match v["kind"].as_str().unwrap() {
        "pixtral" => VisionRopeKind::Pixtral,
        "qwen-vl" => VisionRopeKind::QwenVl,
        "llama4" => VisionRopeKind::Llama4,
        k => panic!("{k}"),
    };
    // the kind posenc reads from the config itself
    let cfg =
        posenc::rope::HfRopeConfig::from_file(&dir().join(format!("{name}.config.json"))).unwrap();
    let vc = cfg.vision_config.as_deref().unwrap();
    assert_eq!(
        VisionRopeKind::for_model(cfg.model_type.as_deref().unwrap(), vc.model_type.as_deref()),
        Some(kind),
        "{name}: vision kind"
    );
    let head_dim = vc.head_dim().unwrap();
    assert_eq!(
        head_dim as u64,
        v["head_dim"].as_u64().unwrap(),
        "{name}: vision head_dim"
    );
    let theta = vc.theta(10000.0).unwrap();
    assert_eq!(theta, v["rope_theta"].as_f64().unwrap());
    let ours = kind.frequencies(theta, head_dim).unwrap();
    let inv = f64s(&v["inv_freq"]);
    check_freqs(&format!("{name} vision"), ours.inv_freq(), &inv);
    let axes: Vec<usize> = u64s(&v["axes"]).iter().map(|&a| a as usize).collect();
    assert_eq!(ours.axes(), axes.as_slice(), "{name}: vision axes");
    let want_pos: Vec<[u64; 2]> = v["positions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let p = u64s(p);
            [p[0], p[1]]
        })
        .collect();
    let got_pos = match kind {
        VisionRopeKind::QwenVl => {
            let g = u64s(&v["grid_thw"]);
            let mm = v["spatial_merge_size"].as_u64().unwrap() as usize;
            qwen_vl_vision_positions(g[0] as usize, g[1] as usize, g[2] as usize, mm).unwrap()
        }
        VisionRopeKind::Pixtral => {
            let g = u64s(&v["grid_hw"]);
            grid_positions(g[0] as usize, g[1] as usize).unwrap()
        }
        VisionRopeKind::Llama4 => {
            assert_eq!(
                vc.patches_per_side().unwrap() as u64,
                v["patches_per_side"].as_u64().unwrap()
            );
            let all =
                llama4_vision_positions(v["patches_per_side"].as_u64().unwrap() as usize).unwrap();
            u64s(&v["token_indices"])
                .iter()
                .map(|&i| all[i as usize])
                .collect()
        }
    };
    assert_eq!(got_pos, want_pos, "{name}: vision positions");
    let theirs = AxialFrequencies::new(
        "t",
        inv.iter().map(|&x| x as f32).collect(),
        axes,
        2,
        1.0,
        ours.layout(),
    )
    .unwrap();
    let flat: Vec<u64> = want_pos.iter().flat_map(|p| p.iter().copied()).collect();
    let w = check_tables(&format!("{name} vision"), &theirs, &ours, &flat, v);
    println!("{name}: vision ({}) table worst {w:.2e}", kind.as_str());
}

#[test]
fn fixture_set_is_complete() {
    let mut names: Vec<String> = std::fs::read_dir(dir())
        .unwrap()
        .filter_map(|e| {
            let f = e.unwrap().file_name().to_string_lossy().to_string();
            f.strip_suffix(".expected.json").map(str::to_string)
        })
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "gemma-3-1b-it",
            "gemma-3-4b-it",
            "gemma-4-e2b-it",
            "hunyuan-dense-ntk-alpha",
            "llama-4-scout-17b-16e-instruct",
            "pixtral-12b",
            "qwen2-vl-7b-instruct",
            "qwen2.5-vl-7b-instruct",
            "qwen3-vl-8b-instruct",
            "smollm3-3b",
        ]
    );
}

#[test]
fn qwen_vl_mrope_matches_transformers() {
    for name in [
        "qwen2-vl-7b-instruct",
        "qwen2.5-vl-7b-instruct",
        "qwen3-vl-8b-instruct",
    ] {
        let (m, exp) = load(name);
        check_layers(name, &m, &exp);
        check_mrope(name, &m, &exp);
        check_vision(name, &exp);
    }
}

#[test]
fn gemma_layer_types_match_transformers() {
    for name in ["gemma-3-1b-it", "gemma-3-4b-it", "gemma-4-e2b-it"] {
        let (m, exp) = load(name);
        check_layers(name, &m, &exp);
        assert!(m.is_per_layer(), "{name}");
        assert!(!m.has_nope_layers(), "{name}");
    }
    // Gemma 3 4B: linear ×8 on the full layers only, 10^4 on the sliding ones
    let (m, _) = load("gemma-3-4b-it");
    assert_eq!(
        m.layer_type("full_attention").unwrap().rope_type(),
        "linear"
    );
    assert_eq!(m.layer_type("full_attention").unwrap().theta(), 1e6);
    assert_eq!(m.layer_type("sliding_attention").unwrap().theta(), 1e4);
    // Gemma 4: the full layers rotate a quarter of a 512-wide head
    let (m, _) = load("gemma-4-e2b-it");
    let full = m.layer_type("full_attention").unwrap();
    assert_eq!((full.head_dim(), full.rotary_dim()), (512, 512));
    let f = full.frequencies(None).unwrap();
    assert_eq!(f.inv_freq.iter().filter(|&&v| v > 0.0).count(), 64);
}

#[test]
fn nope_layers_match_transformers() {
    for name in ["llama-4-scout-17b-16e-instruct", "smollm3-3b"] {
        let (m, exp) = load(name);
        check_layers(name, &m, &exp);
        assert!(m.has_nope_layers());
        for (i, l) in m.layers().iter().enumerate() {
            assert_eq!(m.uses_rope(i), *l != LayerRope::NoPe);
            assert_eq!(*l == LayerRope::NoPe, (i + 1) % 4 == 0, "{name}: layer {i}");
        }
    }
    let (m, exp) = load("llama-4-scout-17b-16e-instruct");
    assert_eq!(m.layers().len(), 48);
    let t = &exp["temperature"];
    let temp = m.attn_temperature().expect("Llama 4 tunes its NoPE layers");
    assert_eq!(temp.floor_scale, t["floor_scale"].as_f64().unwrap());
    assert_eq!(temp.attn_scale, t["attn_scale"].as_f64().unwrap());
    for (p, want) in u64s(&t["positions"]).iter().zip(f64s(&t["scales_f32"])) {
        let got = temp.scale(*p);
        // transformers evaluates in float32
        assert!(
            (got - want).abs() <= 2e-7 * want,
            "position {p}: {got} vs {want}"
        );
    }
    assert_eq!(
        m.attention_chunk_size(),
        t["attention_chunk_size"].as_u64().map(|v| v as usize)
    );
    // Llama 4's pairs are complex (interleaved), its llama3 factors equal
    let rope = m.single().unwrap();
    assert_eq!(rope.layout(), posenc::rope::PairLayout::Interleaved);
    check_vision("llama-4-scout-17b-16e-instruct", &exp);
    // SmolLM3: no temperature tuning
    let (m, _) = load("smollm3-3b");
    assert!(m.attn_temperature().is_none());
}

#[test]
fn pixtral_vision_matches_transformers() {
    let text = std::fs::read_to_string(dir().join("pixtral-12b.expected.json")).unwrap();
    let exp: Value = serde_json::from_str(&text).unwrap();
    check_vision("pixtral-12b", &exp);
}

#[test]
fn hunyuan_ntk_alpha_matches_transformers() {
    let (m, exp) = load("hunyuan-dense-ntk-alpha");
    check_layers("hunyuan-dense-ntk-alpha", &m, &exp);
}

#[test]
fn deepseek_softmax_scale_matches_transformers() {
    let text = std::fs::read_to_string(dir().join("deepseek-v3.softmax-scale.json")).unwrap();
    let exp: Value = serde_json::from_str(&text).unwrap();
    let m = ModelRope::from_hf_file(&dir().join(exp["config"].as_str().unwrap())).unwrap();
    let s = m.softmax_scale().unwrap();
    let want = exp["softmax_scale"].as_f64().unwrap();
    assert!(rel(s, want) < 1e-14, "{s} vs {want}");
    assert!(
        rel(
            m.softmax_scale_factor().unwrap(),
            exp["softmax_scale_factor"].as_f64().unwrap()
        ) < 1e-14
    );
}
