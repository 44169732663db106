//! A model's RoPE pair by pair: what its scaling does to each frequency, and
//! which pairs see angles at a target context length that they never saw in
//! pre-training.
//!
//! Every frequency comes from the library ([`RopeConfig::frequencies`],
//! transformers' `ROPE_INIT_FUNCTIONS` reproduced in `f32`); this module
//! only compares them with the unscaled frequencies of the same base and
//! rotary dimension and labels each pair.

use std::f64::consts::PI;

use posenc::rope::layers::{LayerRope, ModelRope};
use posenc::rope::{HfRopeConfig, RopeConfig, RopeScaling};
use posenc::Result;
use serde_json::{json, Map, Value};

use crate::json::inspect_json;

/// The longest sequence length a request may name (`seq_len`,
/// `target_len`): 2^40 positions, far past any model's context.
pub const MAX_LENGTH: usize = 1 << 40;

/// The most frequency pairs, over all layer types, that one answer lists
/// (real models have 16 to 256; a hostile config may claim 64 layer types of
/// 32,768 pairs each).
pub const MAX_PAIRS: usize = 1 << 14;

/// Relative tolerance when comparing an `f32` frequency with the unscaled
/// one (kept) or with the unscaled one over the factor (interpolated).
const REL_TOL: f64 = 1e-5;

/// What a scaling does to one pair.
fn role(scaled: f64, base: f64, factor: Option<f64>) -> &'static str {
    if scaled == 0.0 {
        return "not rotated";
    }
    let close = |a: f64, b: f64| (a - b).abs() <= REL_TOL * b.abs().max(f64::MIN_POSITIVE);
    if close(scaled, base) {
        "kept"
    } else if factor.is_some_and(|f| close(scaled, base / f)) {
        "interpolated"
    } else if factor.is_some_and(|f| f > 1.0 && scaled < base && scaled > base / f) {
        "ramp"
    } else {
        "rescaled"
    }
}

/// The scaling's parameters and the boundaries it draws (YaRN's β
/// correction range, Llama 3's wavelength bands, LongRoPE's factor lists).
fn scaling_json(cfg: &RopeConfig, seq_len: Option<usize>) -> (Value, Option<f64>) {
    let theta = cfg.theta();
    let d = cfg.rotary_dim();
    match cfg.scaling() {
        RopeScaling::Linear { factor } => (json!({"factor": factor}), Some(*factor)),
        RopeScaling::Dynamic {
            factor,
            max_position_embeddings,
        } => (
            json!({"factor": factor, "max_position_embeddings": max_position_embeddings}),
            None,
        ),
        RopeScaling::Yarn(y) => {
            let (low, high) = y.correction_range(d, theta);
            (
                json!({
                    "factor": y.factor,
                    "original_max_position_embeddings": y.original_max_position_embeddings,
                    "attention_factor": y.attention_factor,
                    "beta_fast": y.beta_fast,
                    "beta_slow": y.beta_slow,
                    "mscale": y.mscale,
                    "mscale_all_dim": y.mscale_all_dim,
                    "truncate": y.truncate,
                    // pairs below `low` keep their frequency (more than
                    // beta_fast turns over the original length), pairs above
                    // `high` are interpolated (fewer than beta_slow turns);
                    // the ramp lies between.
                    "correction_range": [low, high],
                }),
                Some(y.factor),
            )
        }
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        } => {
            let l = *original_max_position_embeddings as f64;
            (
                json!({
                    "factor": factor,
                    "low_freq_factor": low_freq_factor,
                    "high_freq_factor": high_freq_factor,
                    "original_max_position_embeddings": original_max_position_embeddings,
                    // wavelengths below this are kept, above `low_freq_wavelen` interpolated
                    "high_freq_wavelen": l / high_freq_factor,
                    "low_freq_wavelen": l / low_freq_factor,
                }),
                Some(*factor),
            )
        }
        RopeScaling::LongRope {
            short_factor,
            long_factor,
            original_max_position_embeddings,
            factor,
            attention_factor,
        } => (
            json!({
                "factor": factor,
                "original_max_position_embeddings": original_max_position_embeddings,
                "attention_factor": attention_factor,
                "short_factor": short_factor,
                "long_factor": long_factor,
                "uses_long_factor": posenc::rope::scaling::longrope::uses_long_factor(
                    seq_len, *original_max_position_embeddings),
            }),
            None,
        ),
        RopeScaling::Proportional {
            factor,
            partial_rotary_factor,
        } => (
            json!({"factor": factor, "partial_rotary_factor": partial_rotary_factor}),
            Some(*factor),
        ),
        RopeScaling::Ntk { alpha } | RopeScaling::NtkAlpha { alpha } => {
            (json!({"alpha": alpha}), None)
        }
        RopeScaling::MixedNtk { factor, mixed_b } => {
            (json!({"factor": factor, "mixed_b": mixed_b}), Some(*factor))
        }
        _ => (json!({}), None),
    }
}

/// `0-4, 6-10, 12`: the indices of the layers where `pred` holds.
pub fn layer_ranges(layers: &[LayerRope], pred: impl Fn(&LayerRope) -> bool) -> String {
    let idx: Vec<usize> = layers
        .iter()
        .enumerate()
        .filter(|(_, l)| pred(l))
        .map(|(i, _)| i)
        .collect();
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < idx.len() {
        let mut j = i;
        while j + 1 < idx.len() && idx[j + 1] == idx[j] + 1 {
            j += 1;
        }
        out.push(if i == j {
            idx[i].to_string()
        } else {
            format!("{}-{}", idx[i], idx[j])
        });
        i = j + 1;
    }
    out.join(", ")
}

/// One layer type pair by pair.
///
/// For pair `i` with scaled frequency `θ'_i` (at `seq_len`) and unscaled
/// frequency `θ_i = base^(−2i/d)` (transformers' default, `f32`):
/// `role` is `kept` (θ' = θ), `interpolated` (θ' = θ / factor), `ramp`
/// (between), `rescaled` (any other change: dynamic and NTK bases, LongRoPE
/// factors) or `not rotated` (θ' = 0). With a target length `N` and the
/// pre-training length `L` (`original_max_position_embeddings`, else
/// `max_position_embeddings`): the largest angle seen in pre-training is
/// `(L − 1)·θ_i`; the pair meets an unseen angle at `N` when that stayed
/// below a full turn and `(N − 1)·θ'_i(N)` exceeds it, `θ'(N)` being the
/// frequencies the model uses at length `N`.
fn layer_type_json(
    name: &str,
    cfg: &RopeConfig,
    axes: &[usize],
    seq_len: Option<usize>,
    target_len: Option<usize>,
) -> Result<Value> {
    let f = cfg.frequencies(seq_len)?;
    let unscaled = RopeConfig::new(cfg.theta(), cfg.rotary_dim())?
        .with_layout(cfg.layout())
        .frequencies(None)?;
    let at_target = match target_len {
        Some(n) => Some(cfg.frequencies(Some(n))?),
        None => None,
    };
    let (mut scaling, factor) = scaling_json(cfg, seq_len);
    // LongRoPE picks its factor set by length: the columns at `seq_len` and
    // at `N` may use different ones, and the page names each
    if let (
        RopeScaling::LongRope {
            original_max_position_embeddings,
            ..
        },
        Some(_),
    ) = (cfg.scaling(), target_len)
    {
        scaling["target_uses_long_factor"] =
            json!(posenc::rope::scaling::longrope::uses_long_factor(
                target_len,
                *original_max_position_embeddings
            ));
    }
    let train_len = cfg
        .original_max_position_embeddings()
        .or(cfg.max_position_embeddings());
    let mut pairs = Vec::with_capacity(f.inv_freq.len());
    let mut unseen = 0usize;
    for (i, (&w, &w0)) in f.inv_freq.iter().zip(&unscaled.inv_freq).enumerate() {
        let (w, w0) = (w as f64, w0 as f64);
        let mut p = Map::new();
        p.insert("pair".into(), json!(i));
        p.insert("inv_freq".into(), json!(w));
        p.insert("unscaled_inv_freq".into(), json!(w0));
        p.insert("ratio".into(), json!(if w0 > 0.0 { w / w0 } else { 1.0 }));
        p.insert(
            "wavelength".into(),
            json!(if w > 0.0 { Some(2.0 * PI / w) } else { None }),
        );
        p.insert(
            "unscaled_wavelength".into(),
            json!(if w0 > 0.0 { Some(2.0 * PI / w0) } else { None }),
        );
        p.insert("role".into(), json!(role(w, w0, factor)));
        if let Some(a) = axes.get(i) {
            p.insert("axis".into(), json!(a));
        }
        if let (Some(l), Some(n), Some(ft)) = (train_len, target_len, &at_target) {
            let seen = (l.saturating_sub(1)) as f64 * w0;
            let wt = ft.inv_freq.get(i).copied().unwrap_or(0.0) as f64;
            let reach = (n.saturating_sub(1)) as f64 * wt;
            let is_unseen = seen < 2.0 * PI && reach > seen * (1.0 + REL_TOL);
            unseen += is_unseen as usize;
            p.insert("train_max_angle".into(), json!(seen));
            p.insert("target_inv_freq".into(), json!(wt));
            p.insert("target_max_angle".into(), json!(reach));
            p.insert("unseen".into(), json!(is_unseen));
        }
        pairs.push(Value::Object(p));
    }
    Ok(json!({
        "name": name,
        "rope_type": f.rope_type,
        "rope_theta": cfg.theta(),
        "head_dim": cfg.head_dim(),
        "rotary_dim": f.rotary_dim,
        "layout": f.layout.as_str(),
        "attention_factor": f.attention_factor,
        "target_attention_factor": at_target.as_ref().map(|t| t.attention_factor),
        "max_position_embeddings": cfg.max_position_embeddings(),
        "original_max_position_embeddings": cfg.original_max_position_embeddings(),
        "train_len": train_len,
        "scaling": scaling,
        "unseen_pairs": target_len.and(train_len).map(|_| unseen),
        "pairs": pairs,
    }))
}

/// Whether `v` has a key named one of `names` at any depth (a config's
/// `text_config`, `rope_parameters` per layer type, ...).
fn has_key(v: &Value, names: &[&str]) -> bool {
    match v {
        Value::Object(m) => m
            .iter()
            .any(|(k, x)| names.contains(&k.as_str()) || has_key(x, names)),
        Value::Array(a) => a.iter().any(|x| has_key(x, names)),
        _ => false,
    }
}

/// What the view shows that the config does not say: `defaulted` (the keys
/// whose values are defaults) and `warnings` (one line each).
fn defaults_json(
    text: &str,
    types: &[Value],
    target_len: Option<usize>,
) -> (Vec<&'static str>, Vec<String>) {
    let v: Value = serde_json::from_str(text).unwrap_or(Value::Null);
    let mut defaulted = Vec::new();
    let mut warnings = Vec::new();
    if !has_key(&v, &["rope_theta", "rotary_emb_base"]) {
        defaulted.push("rope_theta");
        let thetas: Vec<String> = types
            .iter()
            .map(|t| format!("{}", t["rope_theta"]))
            .collect();
        warnings.push(format!(
            "the config names no rope_theta: the base shown ({}) is a default (the model type's in transformers, else 10000), not the config's",
            thetas.join(", ")
        ));
    }
    if types.iter().any(|t| t["train_len"].is_null()) {
        defaulted.push("max_position_embeddings");
        warnings.push(if target_len.is_some() {
            "the config names no max_position_embeddings: the training length is unknown, so no pair is judged seen or unseen at N".to_string()
        } else {
            "the config names no max_position_embeddings: the training length is unknown".to_string()
        });
    }
    (defaulted, warnings)
}

/// The explorer's model view: `inspect` (exactly `posenc rope inspect
/// --json`), `model_type`, `num_layers`, `nope_layers` (ranges),
/// `layer_types` (each with its layers and every pair as
/// [`layer_type_json`] describes), `mrope_section`, `seq_len`,
/// `target_len`, and what the config leaves to defaults: `defaulted` (key
/// names) with one line each in `warnings`. Where the training length is
/// unknown, pairs carry no `unseen` (the page says "unknown").
///
/// # Errors
/// The library's error (one line) for a config it cannot read or a RoPE it
/// cannot build; [`posenc::Error::TooLarge`] past [`MAX_PAIRS`].
pub fn model_json(text: &str, seq_len: Option<usize>, target_len: Option<usize>) -> Result<Value> {
    let hf = HfRopeConfig::from_json_str(text)?;
    let inspect = inspect_json(&hf, seq_len)?;
    let model = ModelRope::from_hf(&hf)?;
    let pairs: usize = model
        .layer_types()
        .iter()
        .map(|t| t.config.rotary_dim() / 2)
        .sum();
    if pairs > MAX_PAIRS {
        return Err(posenc::Error::TooLarge {
            what: "frequency pairs over all layer types",
            value: pairs as u64,
            max: MAX_PAIRS as u64,
        });
    }
    let mut types = Vec::new();
    for t in model.layer_types() {
        let axes = model.axial_frequencies(&t.name, seq_len)?;
        let mut v = layer_type_json(&t.name, &t.config, axes.axes(), seq_len, target_len)?;
        let used = layer_ranges(
            model.layers(),
            |l| matches!(l, LayerRope::Rope(n) if n == &t.name),
        );
        v["layers"] = json!(used);
        v["num_axes"] = json!(axes.num_axes());
        types.push(v);
    }
    let nope = layer_ranges(model.layers(), |l| *l == LayerRope::NoPe);
    let (defaulted, warnings) = defaults_json(text, &types, target_len);
    Ok(json!({
        "defaulted": defaulted,
        "warnings": warnings,
        "inspect": inspect,
        "model_type": model.model_type(),
        "num_layers": model.layers().len(),
        "nope_layers": nope,
        "layer_types": types,
        "mrope_section": model.mrope_section().map(|(s, _)| s.to_vec()),
        "seq_len": seq_len,
        "target_len": target_len,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_follow_the_ratio_to_the_unscaled_frequency() {
        assert_eq!(role(0.5, 0.5, Some(8.0)), "kept");
        assert_eq!(role(0.5 / 8.0, 0.5, Some(8.0)), "interpolated");
        assert_eq!(role(0.2, 0.5, Some(8.0)), "ramp");
        assert_eq!(role(0.2, 0.5, None), "rescaled");
        assert_eq!(role(0.7, 0.5, Some(8.0)), "rescaled");
        assert_eq!(role(0.0, 0.5, Some(8.0)), "not rotated");
    }

    #[test]
    fn layer_ranges_join_runs() {
        let l = |n: &str| LayerRope::Rope(n.into());
        let layers = vec![
            l("a"),
            l("a"),
            LayerRope::NoPe,
            l("a"),
            l("b"),
            l("a"),
            l("a"),
        ];
        assert_eq!(
            layer_ranges(&layers, |x| matches!(x, LayerRope::Rope(n) if n == "a")),
            "0-1, 3, 5-6"
        );
        assert_eq!(layer_ranges(&layers, |x| *x == LayerRope::NoPe), "2");
        assert_eq!(layer_ranges(&[], |_| true), "");
    }

    #[test]
    fn a_config_with_too_many_pairs_is_refused_before_any_table() {
        let mut params = serde_json::Map::new();
        for i in 0..8 {
            params.insert(
                format!("t{i}"),
                json!({"rope_type": "default", "rope_theta": 10000.0}),
            );
        }
        let names: Vec<String> = (0..8).map(|i| format!("t{i}")).collect();
        let cfg = json!({
            "hidden_size": 8192 * 8,
            "num_attention_heads": 1,
            "head_dim": 8192,
            "num_hidden_layers": 8,
            "layer_types": names,
            "rope_parameters": Value::Object(params),
        });
        match model_json(&cfg.to_string(), None, None) {
            Err(posenc::Error::TooLarge { value, .. }) => assert_eq!(value, 8 * 4096),
            other => panic!("expected TooLarge, got {other:?}"),
        }
    }
}
