//! The JSON documents that `posenc rope inspect --json`, `posenc table
//! sinusoidal --json` and `posenc bias ... --json` print. The CLI and the
//! explorer's API build them with these functions, so the numbers a page
//! shows are the numbers the CLI prints.

use posenc::absolute::sinusoidal::{Sinusoidal, SinusoidalLayout};
use posenc::relative::alibi::alibi_slopes;
use posenc::relative::t5::T5Buckets;
use posenc::rope::layers::{LayerRope, ModelRope};
use posenc::rope::vision::VisionRope;
use posenc::rope::{HfRopeConfig, MropeLayout, RopeConfig, RopeFrequencies};
use posenc::{AbsoluteEncoding, Error, Result};
use serde_json::{json, Map, Value};

/// The keys of one RoPE in `inspect --json`: `rope_type`, `rotary_dim`,
/// `head_dim`, `layout`, `rope_theta`, `inv_freq`, `attention_factor`.
pub fn rope_json(cfg: &RopeConfig, f: &RopeFrequencies) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("rope_type".into(), json!(f.rope_type));
    m.insert("rotary_dim".into(), json!(f.rotary_dim));
    m.insert("head_dim".into(), json!(cfg.head_dim()));
    m.insert("layout".into(), json!(f.layout.as_str()));
    m.insert("rope_theta".into(), json!(cfg.theta()));
    m.insert("inv_freq".into(), json!(f.inv_freq));
    m.insert("attention_factor".into(), json!(f.attention_factor));
    m
}

/// The vision encoder's 2-D RoPE (`kind`, `head_dim`, `rope_theta`,
/// `layout`, `inv_freq`, `axes`), when the config has a known one.
///
/// # Errors
/// The library's errors for the vision config's theta or head dimension.
pub fn vision_json(hf: &HfRopeConfig) -> Result<Option<Value>> {
    Ok(VisionRope::from_hf(hf)?.map(|v| {
        json!({
            "kind": v.kind.as_str(),
            "head_dim": v.head_dim,
            "rope_theta": v.rope_theta,
            "layout": v.frequencies.layout().as_str(),
            "inv_freq": v.frequencies.inv_freq(),
            "axes": v.frequencies.axes(),
        })
    }))
}

/// Adds `mrope_section` and `mrope_interleaved` (whether the sections
/// interleave) to `v` for a model with M-RoPE, as `posenc rope inspect
/// --json` and `posenc rope table --json` print them; nothing otherwise.
pub fn insert_mrope(v: &mut Map<String, Value>, model: &ModelRope) {
    if let Some((section, layout)) = model.mrope_section() {
        v.insert("mrope_section".into(), json!(section));
        v.insert(
            "mrope_interleaved".into(),
            json!(layout == MropeLayout::Interleaved),
        );
    }
}

/// `posenc rope inspect --json` of a parsed config at `seq_len`: the keys of
/// [`rope_json`] for a model with one RoPE, `seq_len`, `layer_types` and
/// `layers` when the layers differ, `mrope_section` and `mrope_interleaved`
/// for M-RoPE, Llama 4's `nope_attn_temperature` and
/// `attention_chunk_size`, DeepSeek's `softmax_scale_factor` and
/// `softmax_scale`, and `vision`.
///
/// # Errors
/// The library's error for a config it cannot read or a RoPE it cannot build.
pub fn inspect_json(hf: &HfRopeConfig, seq_len: Option<usize>) -> Result<Value> {
    let model = ModelRope::from_hf(hf)?;
    let mut types = Vec::new();
    for t in model.layer_types() {
        types.push((t.name.clone(), &t.config, t.config.frequencies(seq_len)?));
    }
    let vision = vision_json(hf)?;
    let mut v = Map::new();
    if let Some((_, cfg, f)) = types.first().filter(|_| model.single().is_some()) {
        v.extend(rope_json(cfg, f));
    }
    v.insert("seq_len".into(), json!(seq_len));
    if model.is_per_layer() {
        let mut lt = Map::new();
        for (name, cfg, f) in &types {
            lt.insert(name.clone(), Value::Object(rope_json(cfg, f)));
        }
        v.insert("layer_types".into(), Value::Object(lt));
        let layers: Vec<&str> = model.layers().iter().map(LayerRope::name).collect();
        v.insert("layers".into(), json!(layers));
    }
    insert_mrope(&mut v, &model);
    if let Some(t) = model.attn_temperature() {
        v.insert(
            "nope_attn_temperature".into(),
            json!({"floor_scale": t.floor_scale, "attn_scale": t.attn_scale}),
        );
    }
    if let Some(c) = model.attention_chunk_size() {
        v.insert("attention_chunk_size".into(), json!(c));
    }
    if let Some(f) = model.softmax_scale_factor() {
        v.insert("softmax_scale_factor".into(), json!(f));
        if let Some(s) = model.softmax_scale() {
            v.insert("softmax_scale".into(), json!(s));
        }
    }
    if let Some(vis) = vision {
        v.insert("vision".into(), vis);
    }
    Ok(Value::Object(v))
}

/// The parameters of `posenc table sinusoidal`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SinusoidalParams {
    /// Number of positions (rows).
    pub positions: usize,
    /// Model dimension (columns).
    pub dim: usize,
    /// Column layout.
    pub layout: SinusoidalLayout,
    /// Base of the geometric frequency progression.
    pub base: f64,
    /// First position.
    pub offset: i64,
}

impl SinusoidalParams {
    /// The layout's name in JSON: `interleaved` or `concatenated`.
    pub fn layout_name(&self) -> &'static str {
        match self.layout {
            SinusoidalLayout::Concatenated => "concatenated",
            _ => "interleaved",
        }
    }

    /// The encoding these parameters describe (Vaswani et al. 2017).
    ///
    /// # Errors
    /// [`Error::NegativePosition`] for a negative offset; the library's
    /// errors for the dimension and base.
    pub fn encoding(&self) -> Result<Sinusoidal> {
        if self.offset < 0 {
            return Err(Error::NegativePosition(self.offset));
        }
        Ok(Sinusoidal::new(self.dim)?
            .with_base(self.base)?
            .with_layout(self.layout)
            .with_offset(self.offset as u64))
    }
}

/// The rows of `posenc table sinusoidal`: one per position
/// `offset, offset + 1, ...`.
///
/// # Errors
/// [`Error::InvalidDimension`] for zero positions; those of
/// [`SinusoidalParams::encoding`].
pub fn sinusoidal_rows(p: &SinusoidalParams) -> Result<Vec<Vec<f64>>> {
    if p.positions == 0 {
        return Err(Error::InvalidDimension {
            what: "positions",
            value: 0,
            reason: "must be at least 1",
        });
    }
    let enc = p.encoding()?;
    let positions: Vec<u64> = (0..p.positions as u64).collect();
    enc.table(&positions)
}

/// `posenc table sinusoidal --json`: `encoding`, `layout`, `base`,
/// `offset`, `positions`, `dim` and `table` (one row per position).
///
/// # Errors
/// Those of [`sinusoidal_rows`].
pub fn sinusoidal_table_json(p: &SinusoidalParams) -> Result<Value> {
    let rows = sinusoidal_rows(p)?;
    Ok(json!({
        "encoding": "sinusoidal",
        "layout": p.layout_name(),
        "base": p.base,
        "offset": p.offset,
        "positions": p.positions,
        "dim": p.dim,
        "table": rows,
    }))
}

/// `posenc bias alibi --json`: `heads` and `slopes` (Press et al. 2022).
///
/// # Errors
/// [`Error::ZeroHeads`] for no heads.
pub fn alibi_json(heads: usize) -> Result<Value> {
    let slopes = alibi_slopes(heads)?;
    Ok(json!({"heads": heads, "slopes": slopes}))
}

/// `posenc bias t5 --json`: the bucket of every relative position
/// `lo..=hi` (key − query), as transformers' `_relative_position_bucket`
/// (Raffel et al. 2020).
pub fn t5_json(b: &T5Buckets, lo: i64, hi: i64) -> Value {
    let rel: Vec<i64> = (lo..=hi).collect();
    let bucket: Vec<usize> = rel.iter().map(|&r| b.bucket(r)).collect();
    json!({
        "bidirectional": b.bidirectional(),
        "num_buckets": b.num_buckets(),
        "max_distance": b.max_distance(),
        "relative_position": "key_position - query_position",
        "relative": rel,
        "bucket": bucket,
    })
}
