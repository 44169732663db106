//! A model's RoPE layer by layer: per-layer-type RoPE, NoPE layers, M-RoPE
//! axes and the attention-scale corrections that go with them.
//!
//! Many models no longer use one RoPE in every layer:
//!
//! - **per-layer-type RoPE** — Gemma 3 (Gemma Team 2025, *Gemma 3
//!   Technical Report*, arXiv:2503.19786): five sliding-window layers in six
//!   use base 10^4, the full-attention layers base 10^6 with linear ×8;
//!   Gemma 4: full-attention layers with a wider head (`global_head_dim`)
//!   and proportional RoPE on a quarter of it. transformers 5 writes this as
//!   `rope_parameters` keyed by layer type, with `layer_types` naming each
//!   layer's type; Gemma 3's own checkpoints use the legacy keys
//!   `rope_local_base_freq` and `sliding_window_pattern` (both read here).
//! - **NoPE layers (iRoPE)** — Llama 4 (Meta 2025, *The Llama 4 herd*):
//!   three layers in four use RoPE with chunked attention, every fourth uses
//!   no positional encoding at all and attends globally (`no_rope_layers`,
//!   1 = RoPE, or `no_rope_layer_interval`); SmolLM3 (Hugging Face 2025)
//!   the same with its own `no_rope_layers`. NoPE layers follow Kazemnejad
//!   et al. 2023, *The Impact of Positional Encoding on Length
//!   Generalization in Transformers*.
//! - Llama 4 scales the queries of its NoPE layers with the position
//!   (attention-temperature tuning, after Nakanishi 2025, *Scalable-Softmax
//!   Is Superior for Attention*, arXiv:2501.19399): [`AttnTemperature`].
//! - Multimodal models rotate by three axes ([`super::mrope`]).
//! - DeepSeek-V2/V3 multiply the attention scale by YaRN's `mscale²`
//!   ([`super::scaling::yarn::softmax_scale_factor`]).
//!
//! [`ModelRope::from_hf`] reads all of it from a `config.json` as
//! transformers 5.23 does, and keeps every layer type: nothing is dropped.
//! The layer types without RoPE (a `null` entry in `rope_parameters`, a
//! zero in `no_rope_layers`, Qwen3.5's `linear_attention` layers) are NoPE
//! layers.

use std::collections::BTreeMap;
use std::path::Path;

use super::axial::AxialFrequencies;
use super::config::{
    base_model_type, HfOverrides, HfRopeConfig, HfRopeParameters, HfRopeParametersField, RopeConfig,
};
use super::limits::{MAX_LAYERS, MAX_LAYER_TYPES};
use super::mrope::{IndexRules, Mrope, MropeLayout};
use super::scaling::yarn::softmax_scale_factor;
use crate::error::{check_size, Error, Result};

/// What one layer does with positions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LayerRope {
    /// RoPE of the named layer type ([`ModelRope::layer_type`]).
    Rope(String),
    /// No positional encoding in this layer.
    NoPe,
}

impl LayerRope {
    /// The layer type's name, or `nope`.
    pub fn name(&self) -> &str {
        match self {
            LayerRope::Rope(n) => n,
            LayerRope::NoPe => "nope",
        }
    }
}

/// Llama 4's attention-temperature tuning of NoPE layers: queries at
/// position `p` are multiplied by
///
/// ```text
/// scale(p) = log1p(⌊(p + 1) / floor_scale⌋) · attn_scale + 1
/// ```
///
/// (1 for the first `floor_scale − 1` positions, then growing like `ln p`),
/// which keeps the attention of a NoPE layer from flattening as the context
/// grows (Nakanishi 2025).
///
/// ```
/// use posenc::rope::layers::AttnTemperature;
/// let t = AttnTemperature::LLAMA4;
/// assert_eq!(t.scale(0), 1.0);
/// assert_eq!(t.scale(8190), 1.0);
/// assert!((t.scale(8191) - (1.0 + 0.1 * 2f64.ln())).abs() < 1e-15);
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttnTemperature {
    /// Positions per step of the floor (8192 in Llama 4).
    pub floor_scale: f64,
    /// Strength (0.1 in Llama 4).
    pub attn_scale: f64,
}

impl AttnTemperature {
    /// Llama 4's defaults: `floor_scale` 8192, `attn_scale` 0.1.
    pub const LLAMA4: AttnTemperature = AttnTemperature {
        floor_scale: 8192.0,
        attn_scale: 0.1,
    };

    /// Checks the parameters.
    ///
    /// # Errors
    /// [`Error::InvalidFactor`] for a `floor_scale` that is not finite and
    /// `> 0`; [`Error::NotFinite`] for a non-finite `attn_scale`.
    pub fn new(floor_scale: f64, attn_scale: f64) -> Result<Self> {
        crate::error::check_positive("floor_scale", floor_scale)?;
        crate::error::check_finite("attn_scale", attn_scale)?;
        Ok(AttnTemperature {
            floor_scale,
            attn_scale,
        })
    }

    /// The query scale at position `position`, in `f64` (transformers
    /// evaluates it in `float32`; the two agree below position 2^24, where
    /// `float32` still holds `p + 1` exactly).
    pub fn scale(&self, position: u64) -> f64 {
        (((position as f64) + 1.0) / self.floor_scale)
            .floor()
            .ln_1p()
            * self.attn_scale
            + 1.0
    }

    /// The scales of positions `offset .. offset + len`, as `f32` (one per
    /// query time step).
    pub fn scales(&self, offset: u64, len: usize) -> Vec<f32> {
        (0..len as u64)
            .map(|t| self.scale(offset.saturating_add(t)) as f32)
            .collect()
    }

    /// The scales of positions `offset .. offset + len` as a `(1, 1, len, 1)`
    /// `f32` tensor: multiply `(B, H, T, D)` queries by it (transformers
    /// scales the queries of NoPE layers after the projection, before the
    /// attention).
    ///
    /// ```
    /// use candle_core::{Device, Tensor};
    /// use posenc::rope::layers::AttnTemperature;
    /// let s = AttnTemperature::LLAMA4.scales_tensor(8190, 3, &Device::Cpu)?;
    /// let q = Tensor::ones((2, 4, 3, 8), candle_core::DType::F32, &Device::Cpu)?;
    /// let q = q.broadcast_mul(&s)?;
    /// assert_eq!(q.dims(), &[2, 4, 3, 8]);
    /// # Ok::<(), posenc::Error>(())
    /// ```
    ///
    /// # Errors
    /// Those of candle.
    pub fn scales_tensor(
        &self,
        offset: u64,
        len: usize,
        device: &candle_core::Device,
    ) -> Result<candle_core::Tensor> {
        Ok(candle_core::Tensor::from_vec(
            self.scales(offset, len),
            (1, 1, len, 1),
            device,
        )?)
    }
}

/// Which of `n_layers` layers use RoPE when every `interval`-th layer is a
/// NoPE layer (Llama 4's and SmolLM3's default, `no_rope_layer_interval`,
/// 4: RoPE in layers 0–2, NoPE in layer 3, ...): `true` where layer `i`
/// uses RoPE, `(i + 1) mod interval ≠ 0`.
///
/// ```
/// use posenc::rope::layers::irope_layers;
/// assert_eq!(irope_layers(8, 4)?, [true, true, true, false, true, true, true, false]);
/// # Ok::<(), posenc::Error>(())
/// ```
///
/// # Errors
/// [`Error::InvalidValue`] for `interval = 0`; [`Error::TooLarge`] for more
/// than [`MAX_LAYERS`] layers.
pub fn irope_layers(n_layers: usize, interval: usize) -> Result<Vec<bool>> {
    check_size("number of layers", n_layers, MAX_LAYERS)?;
    if interval == 0 {
        return Err(Error::invalid(
            "no_rope_layer_interval",
            "must be at least 1 (every k-th layer is NoPE)",
        ));
    }
    Ok((0..n_layers).map(|i| (i + 1) % interval != 0).collect())
}

/// One layer type with RoPE and its configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerTypeRope {
    /// The type's name (`full_attention`, `sliding_attention`,
    /// `chunked_attention`, ...).
    pub name: String,
    /// Its RoPE.
    pub config: RopeConfig,
}

/// A model's RoPE, layer by layer. See [the module](self).
///
/// ```
/// use posenc::rope::layers::{LayerRope, ModelRope};
/// // Gemma 3's legacy keys: local base on the sliding-window layers,
/// // linear ×8 and base 10^6 on every sixth layer
/// let m = ModelRope::from_hf_json_str(r#"{
///   "model_type": "gemma3_text", "head_dim": 256, "num_hidden_layers": 12,
///   "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0, "sliding_window_pattern": 6,
///   "rope_scaling": {"rope_type": "linear", "factor": 8.0}}"#)?;
/// let names: Vec<&str> = m.layer_types().iter().map(|t| t.name.as_str()).collect();
/// assert_eq!(names, ["full_attention", "sliding_attention"]);
/// assert_eq!(m.layers()[5], LayerRope::Rope("full_attention".into()));
/// assert_eq!(m.layer_type("sliding_attention").unwrap().theta(), 10000.0);
/// assert_eq!(m.layer_type("full_attention").unwrap().rope_type(), "linear");
/// # Ok::<(), posenc::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct ModelRope {
    model_type: Option<String>,
    types: Vec<LayerTypeRope>,
    layers: Vec<LayerRope>,
    mrope: Option<(Vec<usize>, MropeLayout)>,
    index_rules: Option<IndexRules>,
    spatial_merge_size: Option<usize>,
    temperature: Option<AttnTemperature>,
    attention_chunk_size: Option<usize>,
    softmax_scale_factor: Option<f64>,
    qk_head_dim: Option<usize>,
}

/// The M-RoPE model types of transformers 5.23: default `mrope_section`,
/// section layout and pair layout (interleaved pairs: GLM-4V's
/// `repeat_interleave`).
const MROPE_MODELS: &[(&str, [usize; 3], MropeLayout, bool)] = &[
    ("qwen2_vl", [16, 24, 24], MropeLayout::Chunked, false),
    ("qwen2_5_vl", [16, 24, 24], MropeLayout::Chunked, false),
    ("qwen2_5_omni", [16, 24, 24], MropeLayout::Chunked, false),
    ("qwen3_vl", [24, 20, 20], MropeLayout::Interleaved, false),
    (
        "qwen3_vl_moe",
        [24, 20, 20],
        MropeLayout::Interleaved,
        false,
    ),
    ("qwen3_5", [11, 11, 10], MropeLayout::Interleaved, false),
    ("qwen3_5_moe", [11, 11, 10], MropeLayout::Interleaved, false),
    ("glm4v", [8, 12, 12], MropeLayout::Chunked, true),
    ("glm4v_moe", [8, 12, 12], MropeLayout::Chunked, false),
];

/// Model types whose attention multiplies its scale by YaRN's `mscale²`
/// (`yarn_apply_mscale` in transformers).
const SOFTMAX_SCALE_MODELS: &[&str] = &["deepseek_v2", "deepseek_v3", "deepseek_v32"];

/// Layer types that never apply RoPE (Qwen3.5 / Qwen3-Next's Gated DeltaNet
/// layers).
const NO_ROPE_LAYER_TYPES: &[&str] = &["linear_attention"];

fn is_gemma_pattern(m: &str) -> bool {
    matches!(m, "gemma3" | "gemma3n" | "gemma4")
}

impl ModelRope {
    /// Reads a `config.json` file.
    ///
    /// # Errors
    /// Those of [`HfRopeConfig::from_file`] and [`from_hf`](Self::from_hf).
    pub fn from_hf_file(path: &Path) -> Result<Self> {
        Self::from_hf(&HfRopeConfig::from_file(path)?)
    }

    /// Reads the text of a `config.json`.
    ///
    /// # Errors
    /// [`Error::Json`], then those of [`from_hf`](Self::from_hf).
    pub fn from_hf_json_str(s: &str) -> Result<Self> {
        Self::from_hf(&HfRopeConfig::from_json_str(s)?)
    }

    /// Every layer's RoPE from a parsed `config.json` (its `text_config`
    /// for a multimodal model), with the rules of transformers 5.23:
    ///
    /// 1. **layers**: `num_hidden_layers` (or the length of `layer_types` /
    ///    `no_rope_layers`); their types are `layer_types`, else derived as
    ///    the model's config class does (Gemma 3/4: full attention every
    ///    `sliding_window_pattern`-th layer, default 6, and Gemma 4's last
    ///    layer; Llama 4: `chunked_attention` for RoPE layers and
    ///    `full_attention` for NoPE ones), else all `full_attention`.
    /// 2. **RoPE of each type**: `rope_parameters` (or `rope_scaling`)
    ///    nested by layer type gives each type its own entry (`null`: no
    ///    RoPE); Gemma 3 applies a legacy `rope_scaling` to
    ///    `full_attention`, base `rope_theta` (default 10^6), and gives
    ///    `sliding_attention` plain RoPE with base `rope_local_base_freq`
    ///    (default 10^4); Gemma 4 without `rope_parameters` uses its
    ///    defaults (sliding: base 10^4; full: proportional ¼, base 10^6) and
    ///    `global_head_dim` (default 512) for its full-attention layers; a
    ///    flat dict applies to every type.
    /// 3. **NoPE layers**: a zero in `no_rope_layers` (Llama 4: an empty
    ///    list means the default), else for Llama 4 and SmolLM3 every
    ///    `no_rope_layer_interval`-th layer (default 4); layer types with a
    ///    `null` entry or without RoPE (`linear_attention`).
    /// 4. **M-RoPE**: `mrope_section` (or the model's default for
    ///    Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3.5, GLM-4V) and
    ///    `mrope_interleaved` (or the model's layout; the key wins, as in
    ///    vLLM).
    /// 5. **Llama 4**: attention-temperature tuning of NoPE layers
    ///    (`attn_temperature_tuning`, default on, `floor_scale`,
    ///    `attn_scale`) and `attention_chunk_size` (default 8192).
    /// 6. **DeepSeek-V2/V3**: the softmax-scale factor `mscale²`.
    ///
    /// # Errors
    /// Those of [`RopeConfig::from_hf`] for each layer type;
    /// [`Error::TooLarge`] for more than [`MAX_LAYERS`] layers or
    /// [`MAX_LAYER_TYPES`] types; [`Error::InvalidValue`] for
    /// `layer_types` or `no_rope_layers` of the wrong length, a zero
    /// `no_rope_layer_interval`, a layer type without parameters in a
    /// nested `rope_parameters`, or an invalid `mrope_section`.
    pub fn from_hf(hf: &HfRopeConfig) -> Result<Self> {
        let t = hf.text();
        let model_type = t.model_type.clone().unwrap_or_default();
        let m = base_model_type(&model_type);

        // --- number of layers and their types -------------------------------
        if let Some(n) = t.num_hidden_layers {
            check_size("num_hidden_layers", n, MAX_LAYERS)?;
        }
        if let Some(l) = &t.layer_types {
            check_size("number of layer_types", l.len(), MAX_LAYERS)?;
        }
        if let Some(l) = &t.no_rope_layers {
            check_size("number of no_rope_layers", l.len(), MAX_LAYERS)?;
        }
        let n_layers = t
            .num_hidden_layers
            .or_else(|| t.layer_types.as_ref().map(Vec::len))
            .or_else(|| t.no_rope_layers.as_ref().map(Vec::len).filter(|&n| n > 0));

        // RoPE (true) or NoPE (false) per layer, from no_rope_layers
        let uses_interval = matches!(m, "llama4" | "smollm3");
        let rope_flags: Option<Vec<bool>> = match (&t.no_rope_layers, n_layers) {
            // Llama 4: `no_rope_layers if no_rope_layers else default`
            (Some(l), _) if !l.is_empty() || m != "llama4" => {
                let n = n_layers.unwrap_or(l.len());
                if l.len() < n {
                    return Err(Error::invalid(
                        "no_rope_layers",
                        format!(
                            "has {} entries for {n} layers (one per layer is needed)",
                            l.len()
                        ),
                    ));
                }
                Some(l[..n].iter().map(|f| f.is_set()).collect())
            }
            (_, Some(n)) if uses_interval => {
                Some(irope_layers(n, t.no_rope_layer_interval.unwrap_or(4))?)
            }
            _ => None,
        };

        let layer_types: Option<Vec<String>> = match (&t.layer_types, n_layers) {
            (Some(l), _) => {
                if let Some(n) = n_layers {
                    if l.len() != n {
                        return Err(Error::invalid(
                            "layer_types",
                            format!("has {} entries for {n} layers (num_hidden_layers)", l.len()),
                        ));
                    }
                }
                Some(l.clone())
            }
            (None, Some(n)) if is_gemma_pattern(m) => {
                let k = t.sliding_window_pattern.unwrap_or(6);
                if k == 0 {
                    return Err(Error::invalid(
                        "sliding_window_pattern",
                        "must be at least 1 (every k-th layer is full attention)",
                    ));
                }
                let mut v: Vec<String> = (0..n)
                    .map(|i| {
                        if (i + 1) % k != 0 {
                            "sliding_attention".to_string()
                        } else {
                            "full_attention".to_string()
                        }
                    })
                    .collect();
                if m == "gemma4" {
                    if let Some(last) = v.last_mut() {
                        *last = "full_attention".into();
                    }
                }
                Some(v)
            }
            (None, Some(_)) if m == "llama4" => rope_flags.as_ref().map(|f| {
                f.iter()
                    .map(|&r| {
                        if r {
                            "chunked_attention"
                        } else {
                            "full_attention"
                        }
                        .to_string()
                    })
                    .collect()
            }),
            _ => None,
        };
        // the names of the types, in order of first use
        let mut type_names: Vec<String> = Vec::new();
        match &layer_types {
            Some(l) => {
                for n in l {
                    if !type_names.contains(n) {
                        check_size(
                            "number of distinct layer types",
                            type_names.len() + 1,
                            MAX_LAYER_TYPES,
                        )?;
                        type_names.push(n.clone());
                    }
                }
            }
            None => type_names.push("full_attention".into()),
        }

        // --- parameters of each type ----------------------------------------
        let nested =
            |f: &HfRopeParametersField| -> Option<BTreeMap<String, Option<HfRopeParameters>>> {
                match f {
                    HfRopeParametersField::PerLayerType(map) if !map.is_empty() => {
                        Some(map.clone())
                    }
                    _ => None,
                }
            };
        let scaling_flat = match &t.rope_scaling {
            Some(HfRopeParametersField::Flat(p)) if **p != HfRopeParameters::default() => {
                Some((**p).clone())
            }
            _ => None,
        };
        let nested_params = t
            .rope_parameters
            .as_ref()
            .and_then(nested)
            .or_else(|| t.rope_scaling.as_ref().and_then(nested));
        let flat_params = scaling_flat.clone().or_else(|| match &t.rope_parameters {
            Some(HfRopeParametersField::Flat(p)) => Some((**p).clone()),
            _ => None,
        });

        let gemma3 = matches!(m, "gemma3" | "gemma3n");
        let gemma4 = m == "gemma4";
        let params_for = |name: &str| -> Result<Option<(HfRopeParameters, HfOverrides)>> {
            if NO_ROPE_LAYER_TYPES.contains(&name) {
                return Ok(None);
            }
            let mut ov = HfOverrides::default();
            if gemma4 && name == "full_attention" {
                ov.head_dim = Some(t.global_head_dim.unwrap_or(512));
            }
            if let Some(map) = &nested_params {
                let entry = match map.get(name) {
                    Some(e) => e.clone(),
                    None if gemma3 => Some(HfRopeParameters::default()),
                    None => {
                        return Err(Error::invalid(
                            "rope_parameters",
                            format!(
                            "nested by layer type ({}) without an entry for layer type {name:?}",
                            map.keys().cloned().collect::<Vec<_>>().join(", ")
                        ),
                        ))
                    }
                };
                // Gemma 3 replaces a missing or null entry by plain RoPE
                let entry = if gemma3 {
                    Some(entry.unwrap_or_default())
                } else {
                    entry
                };
                let Some(mut p) = entry else { return Ok(None) };
                if gemma3 {
                    // Gemma3TextConfig.convert_rope_params_to_dict
                    if name == "full_attention" {
                        if let Some(s) = &scaling_flat {
                            merge(&mut p, s);
                        }
                    } else if name == "sliding_attention" {
                        ov.theta = Some(t.rope_local_base_freq.unwrap_or(10000.0));
                    }
                }
                return Ok(Some((p, ov)));
            }
            if gemma3 && name == "sliding_attention" {
                ov.theta = Some(t.rope_local_base_freq.unwrap_or(10000.0));
                return Ok(Some((HfRopeParameters::default(), ov)));
            }
            if gemma4 && flat_params.is_none() {
                // Gemma4TextConfig's default rope_parameters
                let p = if name == "full_attention" {
                    HfRopeParameters {
                        rope_type: Some("proportional".into()),
                        partial_rotary_factor: Some(0.25),
                        rope_theta: Some(1e6),
                        ..Default::default()
                    }
                } else {
                    HfRopeParameters {
                        rope_theta: Some(1e4),
                        ..Default::default()
                    }
                };
                return Ok(Some((p, ov)));
            }
            Ok(Some((flat_params.clone().unwrap_or_default(), ov)))
        };

        let mut types: Vec<LayerTypeRope> = Vec::new();
        let mut nope_types: Vec<String> = Vec::new();
        for name in &type_names {
            match params_for(name)? {
                Some((p, ov)) => types.push(LayerTypeRope {
                    name: name.clone(),
                    config: RopeConfig::from_hf_params(&t, &p, &ov)?,
                }),
                None => nope_types.push(name.clone()),
            }
        }

        let layers: Vec<LayerRope> = match n_layers {
            Some(n) => (0..n)
                .map(|i| {
                    let name = layer_types
                        .as_ref()
                        .map_or("full_attention", |l| l[i].as_str());
                    let rope = rope_flags.as_ref().is_none_or(|f| f[i])
                        && !nope_types.iter().any(|x| x == name);
                    if rope {
                        LayerRope::Rope(name.to_string())
                    } else {
                        LayerRope::NoPe
                    }
                })
                .collect(),
            None => Vec::new(),
        };
        // keep only the types some layer uses (all of them when the layers are unknown)
        if !layers.is_empty() {
            types.retain(|ty| {
                layers
                    .iter()
                    .any(|l| matches!(l, LayerRope::Rope(n) if *n == ty.name))
            });
        }
        types.sort_by(|a, b| a.name.cmp(&b.name));

        // --- M-RoPE ------------------------------------------------------------
        let model_mrope = MROPE_MODELS.iter().find(|(n, ..)| *n == m);
        let any_params = nested_params
            .as_ref()
            .and_then(|map| {
                map.values()
                    .flatten()
                    .find(|p| p.mrope_section.is_some())
                    .cloned()
            })
            .or_else(|| flat_params.clone());
        let section = any_params.as_ref().and_then(|p| p.mrope_section.clone());
        let mrope = match (section, model_mrope) {
            (Some(s), _) => {
                let layout = match any_params.as_ref().and_then(|p| p.mrope_interleaved) {
                    Some(true) => MropeLayout::Interleaved,
                    Some(false) => MropeLayout::Chunked,
                    None => model_mrope.map_or(MropeLayout::Chunked, |x| x.2),
                };
                Some((s, layout))
            }
            (None, Some(&(_, s, layout, _))) => {
                let layout = match any_params.as_ref().and_then(|p| p.mrope_interleaved) {
                    Some(true) => MropeLayout::Interleaved,
                    Some(false) => MropeLayout::Chunked,
                    None => layout,
                };
                Some((s.to_vec(), layout))
            }
            (None, None) => None,
        };
        if let Some((s, layout)) = &mrope {
            check_size(
                "number of mrope sections",
                s.len(),
                super::limits::MAX_HEAD_DIM / 2,
            )?;
            for ty in &mut types {
                // GLM-4V interleaves its pairs (repeat_interleave) unless the config says otherwise
                if model_mrope.is_some_and(|x| x.3) && t.rope_interleave.is_none() {
                    ty.config = ty
                        .config
                        .clone()
                        .with_layout(super::PairLayout::Interleaved);
                }
                Mrope::new(ty.config.clone(), s.clone(), *layout)?;
            }
        }
        let vision = t.vision();
        let vision = vision.as_ref();
        let index_rules = mrope
            .as_ref()
            .and_then(|_| {
                IndexRules::for_model(&model_type, vision.and_then(|v| v.tokens_per_second))
            })
            .or_else(|| mrope.as_ref().map(|_| IndexRules::Qwen2Vl));
        let spatial_merge_size = mrope
            .as_ref()
            .map(|_| vision.and_then(|v| v.spatial_merge_size).unwrap_or(2));

        // --- Llama 4 temperature tuning, chunked attention ----------------------
        let has_nope = layers.contains(&LayerRope::NoPe);
        let tuning = t
            .attn_temperature_tuning
            .map(|f| f.is_set())
            .unwrap_or(m == "llama4");
        let temperature = if has_nope && tuning {
            Some(AttnTemperature::new(
                t.floor_scale.unwrap_or(8192.0),
                t.attn_scale.unwrap_or(0.1),
            )?)
        } else {
            None
        };
        let attention_chunk_size =
            t.attention_chunk_size
                .or(if m == "llama4" { Some(8192) } else { None });

        // --- DeepSeek softmax scale -----------------------------------------
        let (softmax_scale_factor, qk_head_dim) = if SOFTMAX_SCALE_MODELS.contains(&m) {
            let p = flat_params.clone().unwrap_or_default();
            let rt = p
                .rope_type
                .clone()
                .or(p.legacy_type.clone())
                .unwrap_or_else(|| "default".into());
            let f = if rt != "default" {
                softmax_scale_factor(p.factor.unwrap_or(1.0), p.mscale_all_dim)
            } else {
                1.0
            };
            if !f.is_finite() {
                return Err(Error::NotFinite {
                    name: "softmax scale factor (mscale(factor, mscale_all_dim)^2)",
                    value: f,
                });
            }
            let qk = match (t.qk_nope_head_dim, t.qk_rope_head_dim) {
                (Some(a), Some(b)) => a.checked_add(b),
                _ => None,
            };
            (Some(f), qk)
        } else {
            (None, None)
        };

        if types.is_empty() && !layers.iter().all(|l| *l == LayerRope::NoPe) {
            return Err(Error::invalid("rope_parameters", "no layer type has RoPE"));
        }

        Ok(ModelRope {
            model_type: t.model_type.clone(),
            types,
            layers,
            mrope,
            index_rules,
            spatial_merge_size,
            temperature,
            attention_chunk_size,
            softmax_scale_factor,
            qk_head_dim,
        })
    }

    /// The (text) model's `model_type`.
    pub fn model_type(&self) -> Option<&str> {
        self.model_type.as_deref()
    }
    /// Every layer type with RoPE, sorted by name.
    pub fn layer_types(&self) -> &[LayerTypeRope] {
        &self.types
    }
    /// The RoPE of one layer type.
    pub fn layer_type(&self, name: &str) -> Option<&RopeConfig> {
        self.types
            .iter()
            .find(|t| t.name == name)
            .map(|t| &t.config)
    }
    /// One entry per layer (empty when the config gives no number of layers).
    pub fn layers(&self) -> &[LayerRope] {
        &self.layers
    }
    /// The RoPE of layer `i` (`None` for a NoPE layer or an index past the
    /// layers; with no layer list, the only layer type).
    pub fn layer(&self, i: usize) -> Option<&RopeConfig> {
        if self.layers.is_empty() {
            return self.types.first().map(|t| &t.config);
        }
        match self.layers.get(i)? {
            LayerRope::Rope(n) => self.layer_type(n),
            LayerRope::NoPe => None,
        }
    }
    /// Whether layer `i` uses RoPE.
    pub fn uses_rope(&self, i: usize) -> bool {
        self.layer(i).is_some()
    }
    /// Whether some layer is a NoPE layer.
    pub fn has_nope_layers(&self) -> bool {
        self.layers.contains(&LayerRope::NoPe)
    }
    /// The only RoPE, when every layer type with RoPE has the same
    /// configuration (Gemma 2's sliding and full layers, a plain Llama).
    pub fn single(&self) -> Option<&RopeConfig> {
        let first = &self.types.first()?.config;
        self.types
            .iter()
            .all(|t| t.config == *first)
            .then_some(first)
    }
    /// Whether the layers differ: several distinct RoPEs, or NoPE layers
    /// (then `inspect` lists every layer).
    pub fn is_per_layer(&self) -> bool {
        self.single().is_none() || self.has_nope_layers()
    }
    /// `mrope_section` and layout, for an M-RoPE model.
    pub fn mrope_section(&self) -> Option<(&[usize], MropeLayout)> {
        self.mrope.as_ref().map(|(s, l)| (s.as_slice(), *l))
    }
    /// The M-RoPE of one layer type.
    ///
    /// # Errors
    /// Those of [`Mrope::new`].
    pub fn mrope(&self, name: &str) -> Result<Option<Mrope>> {
        match (&self.mrope, self.layer_type(name)) {
            (Some((s, l)), Some(c)) => Ok(Some(Mrope::new(c.clone(), s.clone(), *l)?)),
            _ => Ok(None),
        }
    }
    /// The multi-axis frequencies of one layer type at `seq_len`: three axes
    /// for M-RoPE, one otherwise.
    ///
    /// # Errors
    /// [`Error::InvalidValue`] for an unknown layer type, then those of
    /// [`RopeConfig::frequencies`].
    pub fn axial_frequencies(
        &self,
        name: &str,
        seq_len: Option<usize>,
    ) -> Result<AxialFrequencies> {
        let c = self.layer_type(name).ok_or_else(|| {
            Error::invalid("layer type", format!("{name:?} has no RoPE in this model"))
        })?;
        match self.mrope(name)? {
            Some(m) => m.frequencies(seq_len),
            None => {
                let f = c.frequencies(seq_len)?;
                let n = f.inv_freq.len();
                AxialFrequencies::from_frequencies(&f, vec![0; n], 1)
            }
        }
    }
    /// The `get_rope_index` rules of an M-RoPE model.
    pub fn index_rules(&self) -> Option<IndexRules> {
        self.index_rules
    }
    /// `vision_config.spatial_merge_size` of an M-RoPE model (default 2).
    pub fn spatial_merge_size(&self) -> Option<usize> {
        self.spatial_merge_size
    }
    /// Llama 4's attention-temperature tuning of the NoPE layers, when on.
    pub fn attn_temperature(&self) -> Option<AttnTemperature> {
        self.temperature
    }
    /// Llama 4's `attention_chunk_size` (the chunk of its RoPE layers).
    pub fn attention_chunk_size(&self) -> Option<usize> {
        self.attention_chunk_size
    }
    /// DeepSeek's softmax-scale factor (`mscale²`, 1 without it), for the
    /// models that apply it.
    pub fn softmax_scale_factor(&self) -> Option<f64> {
        self.softmax_scale_factor
    }
    /// DeepSeek's attention scale `(qk_nope_head_dim + qk_rope_head_dim)^−½ ·
    /// mscale²`, when both head dimensions are known.
    pub fn softmax_scale(&self) -> Option<f64> {
        match (self.softmax_scale_factor, self.qk_head_dim) {
            (Some(f), Some(d)) if d > 0 => Some((d as f64).powf(-0.5) * f),
            _ => None,
        }
    }
}

/// `dict.update`: the keys set in `s` override `p`'s.
fn merge(p: &mut HfRopeParameters, s: &HfRopeParameters) {
    macro_rules! take {
        ($($f:ident),*) => { $( if s.$f.is_some() { p.$f = s.$f.clone(); } )* };
    }
    take!(
        rope_type,
        legacy_type,
        rope_theta,
        partial_rotary_factor,
        factor,
        original_max_position_embeddings,
        attention_factor,
        beta_fast,
        beta_slow,
        mscale,
        mscale_all_dim,
        truncate,
        short_factor,
        long_factor,
        low_freq_factor,
        high_freq_factor,
        mrope_section,
        mrope_interleaved,
        mixed_b,
        alpha
    );
}
