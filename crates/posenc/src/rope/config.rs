//! RoPE configuration: a serde mirror of Hugging Face's `config.json`
//! ([`HfRopeConfig`]) and the validated runtime configuration it converts to
//! ([`RopeConfig`]).
//!
//! # How a `config.json` is read
//!
//! transformers 5.x rules, as in `RotaryEmbeddingConfigMixin`
//! (`convert_rope_params_to_dict`, `standardize_rope_params`) and the model
//! configs:
//!
//! - **scaling parameters**: `rope_scaling` if present and non-empty, else
//!   `rope_parameters` (transformers 5 name). The type is `rope_type`, or the
//!   legacy `type`, default `"default"`. A `rope_parameters` nested by layer
//!   type (`{"full_attention": {...}, "sliding_attention": {...}}`) uses its
//!   `full_attention` entry ([`ModelRope`](super::layers::ModelRope) reads
//!   every entry). The multimodal `"mrope"` type is `default` (the M-RoPE
//!   axes are read by [`ModelRope`](super::layers::ModelRope)); `dynamic`
//!   with a non-zero `alpha` is `ntk_alpha` (Hunyuan) and `ntk` with
//!   `mixed_b` is mixed NTK (vLLM). Phi-3's legacy names are mapped as
//!   `Phi3Config._rope_scaling_adjustment` (transformers 4.43+) does: type
//!   `"su"` is `longrope`, and so is `"yarn"` in a `phi3` config that carries
//!   `long_factor`/`short_factor` (early Phi-3 checkpoints called their
//!   LongRoPE factors by those names).
//! - **base**: `rope_theta` inside the parameters, else the top-level
//!   `rope_theta`, else GPT-NeoX's `rotary_emb_base`, else the model's
//!   `default_theta` in transformers (10^6 for Qwen2-VL, Qwen2.5-VL and
//!   Gemma 3's full-attention layers, 5·10^5 for Qwen3-VL and Llama 4,
//!   2·10^6 for SmolLM3), else 10000.
//! - **head dimension**: DeepSeek's `qk_rope_head_dim` (the rotated part of
//!   MLA heads; transformers sets `head_dim` to it), else `head_dim` (when
//!   non-zero), else the config class's default (256 for Gemma 2/3/4, 128
//!   for Llama 4), else `hidden_size / num_attention_heads` (floor, as
//!   Python's `//`). Gemma 4's full-attention layers use `global_head_dim`.
//! - **rotary dimension**: GPT-J/CodeGen `rotary_dim` if given, else
//!   `int(head_dim · partial_rotary_factor)` with `partial_rotary_factor` from
//!   the parameters, the top level, or GPT-NeoX `rotary_pct`; its default is 1,
//!   except 0.25 for `gpt_neox` and 0.5 for `phi` (their config classes'
//!   defaults). `proportional` always rotates over the whole head.
//! - **`original_max_position_embeddings`** (llama3, yarn, longrope): the
//!   top-level key first (the Phi-3 exception transformers honours), then the
//!   parameters' own, then `max_position_embeddings`.
//! - **layout**: `rope_interleave` if present; else interleaved for
//!   `model_type` in [`INTERLEAVED_MODEL_TYPES`] (GPT-J and CodeGen rotate
//!   `rotate_every_two`; DeepSeek-V2 uses complex pairs and DeepSeek-V3's
//!   `rope_interleave` defaults to true); half-split (`rotate_half`) for
//!   everything else.
//!
//! - **multimodal configs**: when the file has a `text_config` (Qwen3-VL,
//!   Gemma 3, Llama 4), the language model's keys are read from it (its
//!   `model_type` defaults to the outer one), as transformers builds the
//!   text config from it; otherwise from the top level.
//!
//! Every size is bounded ([`limits`](super::limits)) before anything is
//! allocated. Every other key of the file is ignored.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::frequencies::{PairLayout, RopeFrequencies};
use super::limits::{MAX_CONFIG_BYTES, MAX_HEAD_DIM};
use super::scaling::{RopeScaling, YarnParams, KNOWN_ROPE_TYPES};
use crate::error::{check_dim, check_size, Error, Result};

/// `model_type`s whose rotary pairs are interleaved `(x[2i], x[2i+1])`
/// unless the config says `rope_interleave: false`.
/// Llama 4 multiplies complex pairs (`view_as_complex`). A `_text` suffix is
/// ignored.
pub const INTERLEAVED_MODEL_TYPES: &[&str] =
    &["gptj", "codegen", "deepseek_v2", "deepseek_v3", "llama4"];

/// The RoPE-related keys of a Hugging Face `config.json`. Every field is
/// optional; unknown keys are ignored. Defaults are applied by
/// [`RopeConfig::from_hf`], as documented in [the module](self).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct HfRopeConfig {
    /// `model_type` (`llama`, `gpt_neox`, `deepseek_v3`, ...): selects the
    /// layout and a few defaults.
    pub model_type: Option<String>,
    /// `hidden_size` (GPT-J: `n_embd`).
    #[serde(alias = "n_embd")]
    pub hidden_size: Option<usize>,
    /// `num_attention_heads` (GPT-J: `n_head`).
    #[serde(alias = "n_head")]
    pub num_attention_heads: Option<usize>,
    /// `head_dim`; default `hidden_size / num_attention_heads`.
    pub head_dim: Option<usize>,
    /// DeepSeek MLA: the rotated part of each head, used as the head dimension.
    pub qk_rope_head_dim: Option<usize>,
    /// GPT-J / CodeGen: number of rotated dimensions.
    pub rotary_dim: Option<usize>,
    /// `rope_theta`, the RoPE base; default 10000.
    pub rope_theta: Option<f64>,
    /// GPT-NeoX name of the base.
    pub rotary_emb_base: Option<f64>,
    /// Fraction of the head that rotates, in (0, 1]; default 1.
    pub partial_rotary_factor: Option<f64>,
    /// GPT-NeoX name of `partial_rotary_factor` (default 0.25 for `gpt_neox`).
    pub rotary_pct: Option<f64>,
    /// Context length the model is configured for.
    #[serde(alias = "n_positions")]
    pub max_position_embeddings: Option<usize>,
    /// Pre-training context length at the top level (Phi-3); takes priority
    /// over the one in `rope_scaling`.
    pub original_max_position_embeddings: Option<usize>,
    /// Legacy (transformers ≤ 4) scaling parameters.
    pub rope_scaling: Option<HfRopeParametersField>,
    /// transformers 5 parameters (may hold `rope_theta` and the scaling keys).
    pub rope_parameters: Option<HfRopeParametersField>,
    /// DeepSeek: whether the rotary pairs are interleaved.
    pub rope_interleave: Option<bool>,
    /// DeepSeek MLA: the non-rotated part of each query/key head
    /// (`qk_head_dim = qk_nope_head_dim + qk_rope_head_dim`).
    pub qk_nope_head_dim: Option<usize>,
    /// Number of decoder layers.
    pub num_hidden_layers: Option<usize>,
    /// The attention type of each layer (`full_attention`,
    /// `sliding_attention`, `chunked_attention`, `linear_attention`, ...).
    pub layer_types: Option<Vec<String>>,
    /// Gemma 3 (legacy): one full-attention layer every this many (default 6).
    pub sliding_window_pattern: Option<usize>,
    /// Gemma 3 (legacy): the base of the sliding-window layers (default 10000).
    pub rope_local_base_freq: Option<f64>,
    /// Gemma 4: the head dimension of the full-attention layers (default 512).
    pub global_head_dim: Option<usize>,
    /// Llama 4, SmolLM3: per layer, non-zero (or `true`) where the layer
    /// uses RoPE, zero where it is a NoPE layer.
    pub no_rope_layers: Option<Vec<Flag>>,
    /// Llama 4, SmolLM3: without `no_rope_layers`, every this-many-th layer
    /// is NoPE (default 4).
    pub no_rope_layer_interval: Option<usize>,
    /// Llama 4: the RoPE layers attend within chunks of this many tokens.
    pub attention_chunk_size: Option<usize>,
    /// Llama 4: scale the queries of NoPE layers with the position
    /// (default true).
    pub attn_temperature_tuning: Option<Flag>,
    /// Llama 4: temperature tuning's `floor_scale` (default 8192).
    pub floor_scale: Option<f64>,
    /// Llama 4: temperature tuning's `attn_scale` (default 0.1).
    pub attn_scale: Option<f64>,
    /// Multimodal models: the language model's config.
    pub text_config: Option<Box<HfRopeConfig>>,
    /// Multimodal models: the vision encoder's config.
    pub vision_config: Option<Box<super::vision::HfVisionConfig>>,
}

/// A config value that is a boolean or a number (`no_rope_layers` entries,
/// Llama 4's `attn_temperature_tuning`, stored as `4` in its checkpoints):
/// true when `true` or non-zero, as Python's truthiness.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Flag {
    /// `true` / `false`.
    Bool(bool),
    /// A number; non-zero is true.
    Number(f64),
}

impl Flag {
    /// Python's truthiness of the value.
    pub fn is_set(self) -> bool {
        match self {
            Flag::Bool(b) => b,
            Flag::Number(v) => v != 0.0,
        }
    }
}

/// The model types whose `default_theta` in transformers is not 10000, with
/// that base (see [the module](self)). Names are matched without a `_text`
/// suffix.
const MODEL_DEFAULT_THETA: &[(&str, f64)] = &[
    ("qwen2_vl", 1e6),
    ("qwen2_5_vl", 1e6),
    ("qwen2_5_omni", 1e6),
    ("qwen3_vl", 5e5),
    ("qwen3_vl_moe", 5e5),
    ("llama4", 5e5),
    ("smollm3", 2e6),
    ("gemma3", 1e6),
    ("gemma3n", 1e6),
    // transformers 5.24's `default_theta` of other decoders
    // (scripts/rope/gen_class_default_theta.py)
    ("apertus", 1.2e7),
    ("bitnet", 5e5),
    ("cohere", 5e5),
    ("csm", 5e5),
    ("cwm", 1e6),
    ("ernie4_5", 5e5),
    ("ernie4_5_moe", 5e5),
    ("exaone", 5e5),
    ("flex_olmo", 5e5),
    ("gpt_oss", 1.5e5),
    ("helium", 1e5),
    ("lfm2", 1e6),
    ("lfm2_moe", 1e6),
    ("longcat_flash", 1e7),
    ("minimax", 1e6),
    ("minimax_m2", 5e6),
    ("mixtral", 1e6),
    ("olmo3", 5e5),
    ("phimoe", 1e6),
    ("sarvam_moe", 8e6),
    ("solar_open", 1e6),
];

/// `model_type` without a `_text` suffix (`qwen3_vl_text` is `qwen3_vl`).
pub(crate) fn base_model_type(model_type: &str) -> &str {
    model_type.strip_suffix("_text").unwrap_or(model_type)
}

/// The model types whose config class has a default `head_dim` (used when
/// the file gives none, before `hidden_size / num_attention_heads`).
const MODEL_DEFAULT_HEAD_DIM: &[(&str, usize)] = &[
    ("gemma2", 256),
    ("gemma3", 256),
    ("gemma3n", 256),
    ("gemma4", 256),
    ("llama4", 128),
];

/// The value `table` gives the base model of `model_type`, if any.
fn model_default<T: Copy>(table: &[(&str, T)], model_type: &str) -> Option<T> {
    let m = base_model_type(model_type);
    table.iter().find(|(n, _)| *n == m).map(|&(_, v)| v)
}

pub(crate) fn model_default_head_dim(model_type: &str) -> Option<usize> {
    model_default(MODEL_DEFAULT_HEAD_DIM, model_type)
}

pub(crate) fn model_default_theta(model_type: &str) -> Option<f64> {
    model_default(MODEL_DEFAULT_THETA, model_type)
}

impl HfRopeConfig {
    /// The keys of the language model: `text_config` when the file has one
    /// (its `model_type` defaulting to the outer one), else the file itself.
    pub fn text(&self) -> HfRopeConfig {
        match &self.text_config {
            Some(t) => {
                let mut t = (**t).clone();
                if t.model_type.is_none() {
                    t.model_type = self.model_type.clone();
                }
                if t.vision_config.is_none() {
                    t.vision_config = self.vision_config.clone();
                }
                t.text_config = None;
                t
            }
            None => self.clone(),
        }
    }

    /// The `vision_config` (the file's, or its `text_config`'s) with the
    /// defaults of transformers' vision config class for this model
    /// applied ([`HfVisionConfig::with_class_defaults`](super::vision::HfVisionConfig::with_class_defaults)).
    pub fn vision(&self) -> Option<super::vision::HfVisionConfig> {
        let vc = self.vision_config.as_deref().or_else(|| {
            self.text_config
                .as_deref()
                .and_then(|t| t.vision_config.as_deref())
        })?;
        Some(vc.with_class_defaults(self.model_type.as_deref().unwrap_or("")))
    }

    /// Reads a `config.json` file (at most
    /// [`MAX_CONFIG_BYTES`](super::limits::MAX_CONFIG_BYTES)).
    ///
    /// # Errors
    /// [`Error::Io`], [`Error::TooLarge`] for a larger file, [`Error::Json`].
    pub fn from_file(path: &Path) -> Result<Self> {
        let io = |source| Error::Io {
            path: path.to_path_buf(),
            source,
        };
        let len = std::fs::metadata(path).map_err(io)?.len();
        if len > MAX_CONFIG_BYTES {
            return Err(Error::TooLarge {
                what: "config file size in bytes",
                value: len,
                max: MAX_CONFIG_BYTES,
            });
        }
        let text = std::fs::read_to_string(path).map_err(io)?;
        Self::parse(&text, Some(path))
    }

    /// Parses the text of a `config.json`.
    ///
    /// # Errors
    /// [`Error::Json`] (without a path), [`Error::InvalidValue`] for JSON
    /// that is not an object.
    pub fn from_json_str(s: &str) -> Result<Self> {
        Self::parse(s, None)
    }

    /// Parses `text` (of the file `path`): a syntax or type error says the
    /// key it was read at ([`json_key_at`]); valid JSON that is not an
    /// object (`[]`, a number) is said to be so, rather than read as a
    /// config with every key missing.
    fn parse(text: &str, path: Option<&Path>) -> Result<Self> {
        let json = |source: serde_json::Error| {
            let (line, col) = (source.line(), source.column());
            let source = match json_key_at(text, line, col) {
                Some(key) => {
                    let full = source.to_string();
                    let what = full
                        .strip_suffix(&format!(" at line {line} column {col}"))
                        .unwrap_or(&full);
                    let hint = if what.contains("number out of range") {
                        " (a JSON number must fit a 64-bit float: |x| < 1.8e308)"
                    } else {
                        ""
                    };
                    <serde_json::Error as serde::de::Error>::custom(format!(
                        "at key {key:?} (line {line}, column {col}): {what}{hint}"
                    ))
                }
                None => source,
            };
            Error::Json {
                path: path.map(Path::to_path_buf),
                source,
            }
        };
        let trimmed = text.trim_start();
        if !trimmed.is_empty() && !trimmed.starts_with('{') {
            // Valid JSON of another kind, or not JSON at all.
            let v: serde_json::Value = serde_json::from_str(text).map_err(json)?;
            let kind = json_kind(&v);
            return Err(Error::invalid(
                path.map_or("config".to_string(), |p| p.display().to_string()),
                format!("not a JSON object but {kind} (a config.json is an object of keys)"),
            ));
        }
        serde_json::from_str(text).map_err(json)
    }
}

/// What a JSON value is, in words ("null", "a number", "an array", ...),
/// for messages about a file holding the wrong kind of value.
pub fn json_kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

/// The key whose value a JSON parser was reading at `line`, `column`
/// (serde_json's, 1-based) of `text`: the last `"key":` before that point
/// — a heuristic for error messages (a `":` inside a string value can
/// mislead it).
///
/// ```
/// let text = "{\"a\": 1,\n \"rope_theta\": 1e400}";
/// assert_eq!(posenc::rope::json_key_at(text, 2, 20), Some("rope_theta"));
/// assert_eq!(posenc::rope::json_key_at("[1, 2]", 1, 3), None);
/// ```
pub fn json_key_at(text: &str, line: usize, column: usize) -> Option<&str> {
    let at: usize = text
        .split_inclusive('\n')
        .take(line.saturating_sub(1))
        .map(str::len)
        .sum::<usize>()
        + column;
    let mut end = at.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let head = &text[..end];
    let mut search = head.len();
    while let Some(i) = head[..search].rfind(':') {
        search = i;
        let before = head[..i].trim_end();
        if let Some(inner) = before.strip_suffix('"') {
            if let Some(start) = inner.rfind('"') {
                return Some(&inner[start + 1..]);
            }
        }
    }
    None
}

/// `rope_scaling` / `rope_parameters`: one dict, or one per layer type.
///
/// A dict with at least one dict-valued entry is nested by layer type (its
/// dict or `null` entries are the layer types; other keys, such as a stray
/// top-level `rope_theta`, are ignored, as transformers only reads the keys
/// that are layer types); otherwise it is one flat dict.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum HfRopeParametersField {
    /// `{"full_attention": {...}, "sliding_attention": {...}}` (Gemma 3 style).
    /// A `null` entry is a layer type without RoPE.
    PerLayerType(BTreeMap<String, Option<HfRopeParameters>>),
    /// A single dict for every layer.
    Flat(Box<HfRopeParameters>),
}

/// The keys of `rope_scaling` / `rope_parameters` (transformers'
/// `RopeParameters`). Serialised, the keys that are `None` are left out, so
/// that a written `rope_scaling` holds only the keys given.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct HfRopeParameters {
    /// `rope_type`: one of [`KNOWN_ROPE_TYPES`]; default `default`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rope_type: Option<String>,
    /// Legacy name of `rope_type`.
    #[serde(rename = "type")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub legacy_type: Option<String>,
    /// Base, transformers 5 location.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rope_theta: Option<f64>,
    /// Partial rotary fraction, transformers 5 location.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub partial_rotary_factor: Option<f64>,
    /// Scaling factor (all scalings but `default`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub factor: Option<f64>,
    /// Pre-training context length (llama3, yarn, longrope).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub original_max_position_embeddings: Option<usize>,
    /// Explicit attention factor (yarn, longrope).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attention_factor: Option<f64>,
    /// YaRN `beta_fast` (default 32).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub beta_fast: Option<f64>,
    /// YaRN `beta_slow` (default 1).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub beta_slow: Option<f64>,
    /// YaRN/DeepSeek `mscale`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mscale: Option<f64>,
    /// YaRN/DeepSeek `mscale_all_dim`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mscale_all_dim: Option<f64>,
    /// YaRN: round the correction range (default true).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub truncate: Option<bool>,
    /// LongRoPE short factors (`rotary_dim / 2` of them).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub short_factor: Option<Vec<f64>>,
    /// LongRoPE long factors (`rotary_dim / 2` of them).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub long_factor: Option<Vec<f64>>,
    /// Llama 3 `low_freq_factor`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub low_freq_factor: Option<f64>,
    /// Llama 3 `high_freq_factor`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub high_freq_factor: Option<f64>,
    /// Multimodal RoPE: frequencies per axis (t, h, w).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mrope_section: Option<Vec<usize>>,
    /// Multimodal RoPE: axes interleaved (Qwen3-VL) rather than chunked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mrope_interleaved: Option<bool>,
    /// vLLM mixed NTK: the exponent `b` (with `rope_type: "ntk"`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mixed_b: Option<f64>,
    /// Hunyuan NTK-alpha: the scale `α` (with `type: "dynamic"`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alpha: Option<f64>,
}

impl HfRopeParameters {
    fn is_empty(&self) -> bool {
        *self == HfRopeParameters::default()
    }
}

/// Keys of a flat parameter dict (a `null` value under one of them is not a
/// layer type without RoPE).
const FLAT_KEYS: &[&str] = &[
    "rope_type",
    "type",
    "rope_theta",
    "partial_rotary_factor",
    "factor",
    "original_max_position_embeddings",
    "attention_factor",
    "beta_fast",
    "beta_slow",
    "mscale",
    "mscale_all_dim",
    "truncate",
    "short_factor",
    "long_factor",
    "low_freq_factor",
    "high_freq_factor",
    "mrope_section",
    "mrope_interleaved",
    "mixed_b",
    "alpha",
];

impl<'de> Deserialize<'de> for HfRopeParametersField {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        use serde::de::Error as _;
        let v = serde_json::Value::deserialize(d)?;
        let serde_json::Value::Object(map) = v else {
            return Err(D::Error::custom(
                "rope parameters must be a dict (or a dict of dicts by layer type)",
            ));
        };
        if map.values().any(serde_json::Value::is_object) {
            let mut out = BTreeMap::new();
            for (k, v) in map {
                if v.is_object() || (v.is_null() && !FLAT_KEYS.contains(&k.as_str())) {
                    let p: Option<HfRopeParameters> =
                        serde_json::from_value(v).map_err(D::Error::custom)?;
                    out.insert(k, p);
                }
            }
            Ok(HfRopeParametersField::PerLayerType(out))
        } else {
            let p: HfRopeParameters =
                serde_json::from_value(serde_json::Value::Object(map)).map_err(D::Error::custom)?;
            Ok(HfRopeParametersField::Flat(Box::new(p)))
        }
    }
}

impl HfRopeParametersField {
    /// The parameters that apply to full-attention layers.
    pub(crate) fn resolve(&self, key: &str) -> Result<Option<HfRopeParameters>> {
        match self {
            HfRopeParametersField::Flat(p) => Ok(Some((**p).clone())),
            HfRopeParametersField::PerLayerType(m) if m.is_empty() => Ok(None),
            HfRopeParametersField::PerLayerType(m) => match m.get("full_attention") {
                Some(p) => Ok(p.clone()),
                None => Err(Error::invalid(
                    key,
                    format!(
                        "nested by layer type ({}) without a `full_attention` entry",
                        m.keys().cloned().collect::<Vec<_>>().join(", ")
                    ),
                )),
            },
        }
    }
}

/// A validated RoPE configuration: base, head and rotary dimensions, pair
/// layout and scaling.
///
/// Build it from a model's `config.json` ([`from_hf_file`](Self::from_hf_file),
/// [`from_hf_json_str`](Self::from_hf_json_str)) or by hand:
///
/// ```
/// use posenc::rope::{PairLayout, RopeConfig, RopeScaling};
/// let cfg = RopeConfig::new(500000.0, 128)?
///     .with_scaling(RopeScaling::Llama3 {
///         factor: 8.0,
///         low_freq_factor: 1.0,
///         high_freq_factor: 4.0,
///         original_max_position_embeddings: 8192,
///     })?
///     .with_max_position_embeddings(131072);
/// assert_eq!(cfg.rope_type(), "llama3");
/// let f = cfg.frequencies(None)?;
/// assert_eq!(f.inv_freq.len(), 64);
/// assert_eq!(f.inv_freq[0], 1.0);
/// // the lowest frequency is divided by the factor
/// assert!((f.inv_freq[63] as f64 / (500000f64.powf(-126.0 / 128.0) / 8.0) - 1.0).abs() < 1e-6);
///
/// let json = r#"{"hidden_size": 4096, "num_attention_heads": 32, "rope_theta": 10000.0,
///                "rope_scaling": {"type": "linear", "factor": 2.0}, "torch_dtype": "float16"}"#;
/// let cfg = RopeConfig::from_hf_json_str(json)?;
/// assert_eq!((cfg.head_dim(), cfg.rotary_dim(), cfg.layout()), (128, 128, PairLayout::HalfSplit));
/// assert_eq!(cfg.frequencies(None)?.inv_freq[0], 0.5);
/// # Ok::<(), posenc::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct RopeConfig {
    theta: f64,
    head_dim: usize,
    rotary_dim: usize,
    layout: PairLayout,
    scaling: RopeScaling,
    max_position_embeddings: Option<usize>,
    original_max_position_embeddings: Option<usize>,
    model_type: Option<String>,
}

impl RopeConfig {
    /// Plain RoPE with base `theta` over `rotary_dim` dimensions (head
    /// dimension = `rotary_dim`, half-split layout, no scaling).
    ///
    /// # Errors
    /// [`Error::InvalidTheta`] if `theta` is not finite and > 0;
    /// [`Error::InvalidDimension`] if `rotary_dim` is zero or odd.
    pub fn new(theta: f64, rotary_dim: usize) -> Result<Self> {
        if !(theta.is_finite() && theta > 0.0) {
            return Err(Error::InvalidTheta(theta));
        }
        check_dim("rotary_dim", rotary_dim, true)?;
        Ok(RopeConfig {
            theta,
            head_dim: rotary_dim,
            rotary_dim,
            layout: PairLayout::HalfSplit,
            scaling: RopeScaling::Default,
            max_position_embeddings: None,
            original_max_position_embeddings: None,
            model_type: None,
        })
    }

    /// Sets the pair layout.
    pub fn with_layout(mut self, layout: PairLayout) -> Self {
        self.layout = layout;
        self
    }

    /// Sets the scaling, after checking it against the base and the rotary
    /// dimension ([`RopeScaling::validate`]).
    ///
    /// # Errors
    /// Those of [`RopeScaling::validate`].
    pub fn with_scaling(mut self, scaling: RopeScaling) -> Result<Self> {
        scaling.validate(self.theta, self.rotary_dim)?;
        self.scaling = scaling;
        Ok(self)
    }

    /// Sets the head dimension (the rotary dimension is unchanged: the rest of
    /// the head passes through). A head narrower than the rotary dimension is
    /// reported by [`validate`](Self::validate), which
    /// [`frequencies`](Self::frequencies) and [`Rope::new`](super::Rope::new) call.
    pub fn with_head_dim(mut self, head_dim: usize) -> Self {
        self.head_dim = head_dim;
        self
    }

    /// Records the model's `max_position_embeddings` (informational; the
    /// scalings that need a length carry their own).
    pub fn with_max_position_embeddings(mut self, max_position_embeddings: usize) -> Self {
        self.max_position_embeddings = Some(max_position_embeddings);
        self
    }

    /// Checks the whole configuration.
    ///
    /// # Errors
    /// [`Error::InvalidTheta`], [`Error::InvalidDimension`] (zero or odd
    /// dimensions, a head narrower than the rotary dimension) and those of
    /// [`RopeScaling::validate`].
    pub fn validate(&self) -> Result<()> {
        check_dim("head_dim", self.head_dim, false)?;
        if self.head_dim < self.rotary_dim {
            return Err(Error::InvalidDimension {
                what: "head_dim",
                value: self.head_dim,
                reason: "smaller than the rotary dimension",
            });
        }
        self.scaling.validate(self.theta, self.rotary_dim)
    }

    /// The RoPE base `rope_theta`.
    pub fn theta(&self) -> f64 {
        self.theta
    }
    /// The head dimension.
    pub fn head_dim(&self) -> usize {
        self.head_dim
    }
    /// The number of rotated dimensions (even, ≤ `head_dim`).
    pub fn rotary_dim(&self) -> usize {
        self.rotary_dim
    }
    /// The pair layout.
    pub fn layout(&self) -> PairLayout {
        self.layout
    }
    /// The scaling.
    pub fn scaling(&self) -> &RopeScaling {
        &self.scaling
    }
    /// The `rope_type` (one of [`KNOWN_ROPE_TYPES`]).
    pub fn rope_type(&self) -> &'static str {
        self.scaling.rope_type()
    }
    /// The model's `max_position_embeddings`, if known.
    pub fn max_position_embeddings(&self) -> Option<usize> {
        match &self.scaling {
            RopeScaling::Dynamic {
                max_position_embeddings,
                ..
            } => Some(*max_position_embeddings),
            _ => self.max_position_embeddings,
        }
    }
    /// The pre-training context length, if the scaling has one (llama3,
    /// yarn, longrope) or the config gave it.
    pub fn original_max_position_embeddings(&self) -> Option<usize> {
        match &self.scaling {
            RopeScaling::Yarn(YarnParams {
                original_max_position_embeddings,
                ..
            })
            | RopeScaling::LongRope {
                original_max_position_embeddings,
                ..
            }
            | RopeScaling::Llama3 {
                original_max_position_embeddings,
                ..
            } => Some(*original_max_position_embeddings),
            _ => self.original_max_position_embeddings,
        }
    }
    /// The `model_type` of the config it was read from, if any.
    pub fn model_type(&self) -> Option<&str> {
        self.model_type.as_deref()
    }

    /// The frequencies at sequence length `seq_len`, as transformers'
    /// `ROPE_INIT_FUNCTIONS[rope_type](config, device, seq_len)`; `None` is
    /// the table built at load time. Only `dynamic` (base grows past
    /// `max_position_embeddings`) and `longrope` (long factors past
    /// `original_max_position_embeddings`) depend on it.
    ///
    /// # Errors
    /// Those of [`validate`](Self::validate).
    pub fn frequencies(&self, seq_len: Option<usize>) -> Result<RopeFrequencies> {
        self.validate()?;
        let (inv_freq, attention_factor) =
            self.scaling
                .inv_freq(self.theta, self.rotary_dim, seq_len)?;
        Ok(RopeFrequencies {
            rope_type: self.rope_type().to_string(),
            rotary_dim: self.rotary_dim,
            layout: self.layout,
            inv_freq,
            attention_factor,
        })
    }

    /// Reads a Hugging Face `config.json` file.
    ///
    /// # Errors
    /// [`Error::Io`] if the file cannot be read; [`Error::Json`] (with the
    /// path) if it is not JSON of the expected shape; then those of
    /// [`from_hf`](Self::from_hf).
    pub fn from_hf_file(path: &Path) -> Result<Self> {
        Self::from_hf(&HfRopeConfig::from_file(path)?)
    }

    /// Reads the text of a Hugging Face `config.json`.
    ///
    /// # Errors
    /// [`Error::Json`] (without a path) if it is not JSON of the expected
    /// shape; then those of [`from_hf`](Self::from_hf).
    pub fn from_hf_json_str(s: &str) -> Result<Self> {
        Self::from_hf(&HfRopeConfig::from_json_str(s)?)
    }

    /// Validates a parsed `config.json` into a runtime configuration, with
    /// the rules of [the module docs](self).
    ///
    /// # Errors
    /// [`Error::UnknownRopeType`] (listing [`KNOWN_ROPE_TYPES`]);
    /// [`Error::MissingKey`] naming the key (`factor`, `short_factor`,
    /// `low_freq_factor`, `max_position_embeddings`, `head_dim`, ...);
    /// [`Error::ZeroHeads`]; [`Error::PartialRotaryFactor`] outside (0, 1];
    /// [`Error::InvalidValue`] for a per-layer `rope_parameters` without
    /// `full_attention`; and those of [`validate`](Self::validate).
    pub fn from_hf(hf: &HfRopeConfig) -> Result<Self> {
        let hf = hf.text();
        // rope_scaling wins over rope_parameters (convert_rope_params_to_dict)
        let mut params = None;
        if let Some(f) = &hf.rope_scaling {
            params = f.resolve("rope_scaling")?.filter(|p| !p.is_empty());
        }
        if params.is_none() {
            if let Some(f) = &hf.rope_parameters {
                params = f.resolve("rope_parameters")?;
            }
        }
        let p = params.unwrap_or_default();
        Self::from_hf_params(&hf, &p, &HfOverrides::default())
    }

    /// One RoPE from the (text) config `hf` and one set of parameters `p`
    /// (one entry of `rope_parameters`), with per-layer-type overrides.
    pub(crate) fn from_hf_params(
        hf: &HfRopeConfig,
        p: &HfRopeParameters,
        ov: &HfOverrides,
    ) -> Result<Self> {
        let model_type = hf.model_type.as_deref().unwrap_or("");

        let mut rope_type = p
            .rope_type
            .clone()
            .or_else(|| p.legacy_type.clone())
            .unwrap_or_else(|| "default".to_string());
        // Phi-3's legacy names (Phi3Config._rope_scaling_adjustment).
        let phi3_factors =
            model_type == "phi3" && (p.long_factor.is_some() || p.short_factor.is_some());
        if rope_type == "su" || (rope_type == "yarn" && phi3_factors) {
            rope_type = "longrope".to_string();
        }
        // Qwen2-VL's convert_rope_params_to_dict: the M-RoPE axes do not
        // change the frequencies.
        if rope_type == "mrope" {
            rope_type = "default".to_string();
        }
        // HunYuanDenseV1RotaryEmbedding: a fixed alpha is not dynamic.
        if rope_type == "dynamic" && p.alpha.is_some_and(|a| a != 0.0) {
            rope_type = "ntk_alpha".to_string();
        }
        if !KNOWN_ROPE_TYPES.contains(&rope_type.as_str()) {
            return Err(Error::UnknownRopeType {
                name: rope_type,
                known: KNOWN_ROPE_TYPES,
            });
        }

        let theta = p
            .rope_theta
            .or(ov.theta)
            .or(hf.rope_theta)
            .or(hf.rotary_emb_base)
            .or_else(|| model_default_theta(model_type))
            .unwrap_or(10000.0);
        if !(theta.is_finite() && theta > 0.0) {
            return Err(Error::InvalidTheta(theta));
        }

        let explicit = ov
            .head_dim
            .or(hf.qk_rope_head_dim)
            .or(hf.head_dim.filter(|&d| d > 0))
            .or_else(|| model_default_head_dim(model_type));
        let head_dim = match explicit {
            Some(d) => d,
            None => {
                let hidden = hf.hidden_size.ok_or_else(|| {
                    Error::missing(
                        "head_dim",
                        Some(
                            "or hidden_size and num_attention_heads, to derive the head dimension",
                        ),
                    )
                })?;
                let heads = hf.num_attention_heads.ok_or_else(|| {
                    Error::missing(
                        "num_attention_heads",
                        Some("needed with hidden_size to derive head_dim"),
                    )
                })?;
                if heads == 0 {
                    return Err(Error::ZeroHeads);
                }
                hidden / heads
            }
        };
        check_dim("head_dim", head_dim, false)?;
        check_size("head_dim", head_dim, MAX_HEAD_DIM)?;

        let default_prf = match base_model_type(model_type) {
            "gpt_neox" => 0.25,
            "phi" | "glm4v_moe" => 0.5,
            "qwen3_5" | "qwen3_5_moe" => 0.25,
            _ => 1.0,
        };
        let prf = p
            .partial_rotary_factor
            .or(hf.partial_rotary_factor)
            .or(hf.rotary_pct)
            .unwrap_or(default_prf);
        if !(prf > 0.0 && prf <= 1.0) {
            return Err(Error::PartialRotaryFactor(prf));
        }

        let rotary_dim = if rope_type == "proportional" {
            head_dim
        } else if let Some(r) = hf.rotary_dim {
            r
        } else {
            (head_dim as f64 * prf) as usize
        };
        check_size("rotary_dim", rotary_dim, MAX_HEAD_DIM)?;
        check_dim("rotary_dim", rotary_dim, true)?;
        if rotary_dim > head_dim {
            return Err(Error::InvalidDimension {
                what: "rotary_dim",
                value: rotary_dim,
                reason: "larger than head_dim",
            });
        }

        let ctx = format!("rope_scaling of type {rope_type}");
        let need_f = |v: Option<f64>, key: &str| v.ok_or_else(|| Error::missing(key, Some(&ctx)));
        let original = || {
            hf.original_max_position_embeddings
                .or(p.original_max_position_embeddings)
                .or(hf.max_position_embeddings)
                .ok_or_else(|| Error::missing("original_max_position_embeddings", Some(&ctx)))
        };
        let scaling = match rope_type.as_str() {
            "default" => RopeScaling::Default,
            "linear" => RopeScaling::Linear {
                factor: need_f(p.factor, "factor")?,
            },
            "ntk" => match p.mixed_b {
                Some(mixed_b) => RopeScaling::MixedNtk {
                    factor: need_f(p.factor, "factor")?,
                    mixed_b,
                },
                None => RopeScaling::Ntk {
                    alpha: need_f(p.factor, "factor")?,
                },
            },
            "ntk_alpha" => RopeScaling::NtkAlpha {
                alpha: need_f(p.alpha, "alpha")?,
            },
            "dynamic" => RopeScaling::Dynamic {
                factor: need_f(p.factor, "factor")?,
                max_position_embeddings: hf
                    .max_position_embeddings
                    .ok_or_else(|| Error::missing("max_position_embeddings", Some(&ctx)))?,
            },
            "yarn" => RopeScaling::Yarn(YarnParams {
                factor: need_f(p.factor, "factor")?,
                original_max_position_embeddings: original()?,
                attention_factor: p.attention_factor,
                beta_fast: p.beta_fast.filter(|&b| b != 0.0).unwrap_or(32.0),
                beta_slow: p.beta_slow.filter(|&b| b != 0.0).unwrap_or(1.0),
                mscale: p.mscale,
                mscale_all_dim: p.mscale_all_dim,
                truncate: p.truncate.unwrap_or(true),
            }),
            "longrope" => {
                let original = original()?;
                let factor = match p.factor {
                    Some(f) => f,
                    None => {
                        let mpe = hf.max_position_embeddings.ok_or_else(|| {
                            Error::missing(
                                "factor",
                                Some("or max_position_embeddings, for longrope"),
                            )
                        })?;
                        mpe as f64 / original as f64
                    }
                };
                RopeScaling::LongRope {
                    short_factor: p
                        .short_factor
                        .clone()
                        .ok_or_else(|| Error::missing("short_factor", Some(&ctx)))?,
                    long_factor: p
                        .long_factor
                        .clone()
                        .ok_or_else(|| Error::missing("long_factor", Some(&ctx)))?,
                    original_max_position_embeddings: original,
                    factor,
                    attention_factor: p.attention_factor,
                }
            }
            "llama3" => RopeScaling::Llama3 {
                factor: need_f(p.factor, "factor")?,
                low_freq_factor: need_f(p.low_freq_factor, "low_freq_factor")?,
                high_freq_factor: need_f(p.high_freq_factor, "high_freq_factor")?,
                original_max_position_embeddings: original()?,
            },
            "proportional" => RopeScaling::Proportional {
                factor: p.factor.unwrap_or(1.0),
                partial_rotary_factor: prf,
            },
            other => unreachable!("rope_type {other} checked against KNOWN_ROPE_TYPES"),
        };

        let layout = match hf.rope_interleave {
            Some(true) => PairLayout::Interleaved,
            Some(false) => PairLayout::HalfSplit,
            None if INTERLEAVED_MODEL_TYPES.contains(&base_model_type(model_type)) => {
                PairLayout::Interleaved
            }
            None => PairLayout::HalfSplit,
        };

        let cfg = RopeConfig {
            theta,
            head_dim,
            rotary_dim,
            layout,
            scaling,
            max_position_embeddings: hf.max_position_embeddings,
            original_max_position_embeddings: hf
                .original_max_position_embeddings
                .or(p.original_max_position_embeddings),
            model_type: hf.model_type.clone(),
        };
        cfg.validate()?;
        Ok(cfg)
    }
}

/// What a layer type changes in the config it shares with the others
/// (Gemma 3's `rope_local_base_freq`, Gemma 4's `global_head_dim`).
#[derive(Debug, Clone, Default)]
pub(crate) struct HfOverrides {
    /// Base used when the parameters have none (before the top-level one).
    pub theta: Option<f64>,
    /// Head dimension of this layer type.
    pub head_dim: Option<usize>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configs_that_are_not_objects_or_not_numbers_say_so() {
        // Valid JSON of another kind: said to be so, not read as a config
        // with every key missing.
        for (text, kind) in [("[]", "an array"), ("3", "a number"), ("null", "null")] {
            let e = HfRopeConfig::from_json_str(text).unwrap_err();
            assert!(matches!(e, Error::InvalidValue { .. }), "{e}");
            assert!(
                e.to_string()
                    .contains(&format!("not a JSON object but {kind}")),
                "{e}"
            );
        }
        // A number past f64: the key, line and column, and what fits.
        let e = RopeConfig::from_hf_json_str("{\"head_dim\": 64,\n \"rope_theta\": 1e400}")
            .unwrap_err();
        assert!(matches!(e, Error::Json { path: None, .. }), "{e}");
        let msg = e.to_string();
        assert!(
            msg.contains("at key \"rope_theta\" (line 2, column 20): number out of range"),
            "{msg}"
        );
        assert!(msg.contains("64-bit float"), "{msg}");
        // A value of the wrong type, its key named.
        let e = RopeConfig::from_hf_json_str(r#"{"head_dim": "sixty-four"}"#).unwrap_err();
        assert!(e.to_string().contains("at key \"head_dim\""), "{e}");
        // The file named.
        let dir = tempfile::Builder::new()
            .prefix("posenc-rope-config-")
            .tempdir()
            .unwrap();
        let p = dir.path().join("config.json");
        std::fs::write(&p, "[]").unwrap();
        let e = RopeConfig::from_hf_file(&p).unwrap_err().to_string();
        assert!(
            e.contains(&p.display().to_string()) && e.contains("an array"),
            "{e}"
        );
    }
}
