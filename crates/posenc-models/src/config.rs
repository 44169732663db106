//! A decoder's configuration: the Hugging Face `config.json` as written
//! ([`HfDecoderConfig`], a serde mirror with transformers' defaults per
//! `model_type`) validated into the runtime [`DecoderConfig`] (candle's
//! `LlamaConfig` → `Config` pattern). A GGUF file's metadata is mapped onto
//! the same mirror key by key as transformers' `integrations/ggml.py` maps
//! it ([`crate::gguf`]).
//!
//! Every size is bounded here, before any weight is read or allocated.

use std::path::Path;

use posenc::rope::{PairLayout, RopeConfig};
use serde::Deserialize;

use crate::error::{ModelError, Result, SUPPORTED};
use crate::safe::{escape as esc, quote};

/// Largest vocabulary accepted (Gemma's is 262,144; four times that).
pub const MAX_VOCAB: usize = 1 << 20;
/// Largest hidden size accepted.
pub const MAX_HIDDEN: usize = 1 << 16;
/// Largest feed-forward width accepted.
pub const MAX_INTERMEDIATE: usize = 1 << 18;
/// Largest number of layers accepted.
pub const MAX_LAYERS: usize = 1024;
/// Largest number of attention heads accepted.
pub const MAX_HEADS: usize = 1024;
/// Largest head dimension accepted.
pub const MAX_HEAD_DIM: usize = 1024;
/// Largest `max_position_embeddings` (and original context length)
/// accepted: 2^24 tokens.
pub const MAX_POSITIONS: usize = 1 << 24;
/// Smallest RoPE base accepted (excluded): a base of 1 gives every pair
/// the same frequency, below 1 the frequencies grow along the head.
pub const MIN_ROPE_THETA: f64 = 1.0;
/// Largest RoPE base accepted: 10^12. Published models use 10^4 (Llama 2)
/// to 10^6 (Qwen2.5) and, stretched for million-token contexts, a few
/// 10^9; past 10^12 every frequency but the first few is below f32's
/// resolution of one turn over 2^24 positions.
pub const MAX_ROPE_THETA: f64 = 1e12;
/// Largest RMSNorm ε accepted: 0.1 (models use 10^-6 to 10^-5; an ε near
/// the activations' mean square erases the normalisation).
pub const MAX_RMS_NORM_EPS: f64 = 0.1;

/// A serde_json error on `text` (the file `file`) in words: what is wrong,
/// at which key, line and column; a number out of range says what fits.
pub(crate) fn json_error(file: &str, text: &str, e: &serde_json::Error) -> ModelError {
    let (line, col) = (e.line(), e.column());
    let full = e.to_string();
    let what = full
        .strip_suffix(&format!(" at line {line} column {col}"))
        .unwrap_or(&full);
    let key = posenc::rope::json_key_at(text, line, col)
        .map(|k| format!(" at key {}", quote(k)))
        .unwrap_or_default();
    let hint = if what.contains("number out of range") {
        " (a JSON number must fit a 64-bit float: |x| < 1.8e308)"
    } else {
        ""
    };
    let kind = match e.classify() {
        serde_json::error::Category::Data => "a value of the wrong type",
        serde_json::error::Category::Eof => "truncated JSON",
        _ => "not valid JSON",
    };
    ModelError::Config(format!(
        "{file}: {kind}{key} (line {line}, column {col}): {}{hint}",
        esc(what)
    ))
}

/// A posenc error on the RoPE keys of the config `file` (whose JSON is
/// `value`), with the key's section named (`rope_scaling.factor`).
fn rope_error(file: &str, text: &str, value: &serde_json::Value, e: posenc::Error) -> ModelError {
    let key: Option<&str> = match &e {
        posenc::Error::Json { source, .. } => return json_error(file, text, source),
        posenc::Error::InvalidFactor { name, .. } | posenc::Error::NotFinite { name, .. } => {
            Some(name)
        }
        posenc::Error::InvalidValue { key, .. } => Some(key.as_str()),
        posenc::Error::InvalidTheta(_) => Some("rope_theta"),
        _ => None,
    };
    let section = key.and_then(|k| {
        ["rope_scaling", "rope_parameters"]
            .into_iter()
            .find(|s| value.get(s).and_then(|v| v.get(k)).is_some())
            .map(|s| format!("{s}.{k}"))
    });
    match section {
        Some(path) => ModelError::Config(format!("{file}: key {path}: {e}")),
        None => ModelError::Config(format!("{file}: {e}")),
    }
}

/// The architectures of [`SUPPORTED`], as a type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// Llama 2, Llama 3/3.1/3.2, SmolLM2, TinyLlama (`model_type` llama).
    Llama,
    /// Mistral (`model_type` mistral): Llama's layers, optional sliding window.
    Mistral,
    /// Qwen2 and Qwen2.5 (`model_type` qwen2): biases on q, k and v.
    Qwen2,
}

impl Arch {
    /// From a `model_type` / `general.architecture` string.
    ///
    /// # Errors
    /// [`ModelError::Unsupported`] for any other name.
    pub fn parse(name: &str) -> Result<Arch> {
        match name {
            "llama" => Ok(Arch::Llama),
            "mistral" => Ok(Arch::Mistral),
            "qwen2" => Ok(Arch::Qwen2),
            _ => Err(ModelError::Unsupported {
                name: name.to_string(),
            }),
        }
    }

    /// The `model_type` string.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Mistral => "mistral",
            Arch::Qwen2 => "qwen2",
        }
    }
}

/// A token id or a list of them (`eos_token_id` is either in real configs).
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(untagged)]
pub enum TokenIds {
    /// One id.
    One(u32),
    /// Several ids.
    Many(Vec<u32>),
}

impl TokenIds {
    /// The ids as a list.
    pub fn to_vec(&self) -> Vec<u32> {
        match self {
            TokenIds::One(i) => vec![*i],
            TokenIds::Many(v) => v.clone(),
        }
    }
}

/// The keys of a Hugging Face `config.json` this crate reads, as written
/// (every one optional: the defaults of transformers' `LlamaConfig`,
/// `MistralConfig` and `Qwen2Config` fill the gaps in
/// [`DecoderConfig::from_hf`]). RoPE keys are read by posenc's own reader
/// ([`RopeConfig::from_hf_json_str`]).
#[derive(Debug, Clone, Default, Deserialize)]
#[allow(missing_docs)]
pub struct HfDecoderConfig {
    #[serde(default)]
    pub model_type: Option<String>,
    #[serde(default)]
    pub architectures: Option<Vec<String>>,
    #[serde(default)]
    pub vocab_size: Option<usize>,
    #[serde(default)]
    pub hidden_size: Option<usize>,
    #[serde(default)]
    pub intermediate_size: Option<usize>,
    #[serde(default)]
    pub num_hidden_layers: Option<usize>,
    #[serde(default)]
    pub num_attention_heads: Option<usize>,
    #[serde(default)]
    pub num_key_value_heads: Option<usize>,
    #[serde(default)]
    pub head_dim: Option<usize>,
    #[serde(default)]
    pub rms_norm_eps: Option<f64>,
    #[serde(default)]
    pub max_position_embeddings: Option<usize>,
    #[serde(default)]
    pub tie_word_embeddings: Option<bool>,
    #[serde(default)]
    pub attention_bias: Option<bool>,
    #[serde(default)]
    pub mlp_bias: Option<bool>,
    #[serde(default)]
    pub hidden_act: Option<String>,
    #[serde(default)]
    pub sliding_window: Option<usize>,
    #[serde(default)]
    pub use_sliding_window: Option<bool>,
    #[serde(default)]
    pub bos_token_id: Option<TokenIds>,
    #[serde(default)]
    pub eos_token_id: Option<TokenIds>,
}

/// A validated decoder configuration: what the model file builds.
#[derive(Debug, Clone, PartialEq)]
pub struct DecoderConfig {
    /// The architecture.
    pub arch: Arch,
    /// Vocabulary size (rows of the embedding).
    pub vocab_size: usize,
    /// Width of the residual stream.
    pub hidden_size: usize,
    /// Width of the SwiGLU feed-forward layer.
    pub intermediate_size: usize,
    /// Number of decoder layers.
    pub num_layers: usize,
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads (grouped-query attention: divides `num_heads`).
    pub num_kv_heads: usize,
    /// Dimension of one head.
    pub head_dim: usize,
    /// RMSNorm's ε.
    pub rms_norm_eps: f64,
    /// `max_position_embeddings` of the config.
    pub max_position_embeddings: usize,
    /// Whether the output projection is the embedding matrix.
    pub tie_word_embeddings: bool,
    /// Biases on the q, k and v projections (Qwen2; Llama's `attention_bias`).
    pub qkv_bias: bool,
    /// A bias on the output projection (Llama's `attention_bias`).
    pub o_bias: bool,
    /// Biases on the feed-forward projections (Llama's `mlp_bias`).
    pub mlp_bias: bool,
    /// Sliding-window attention width, where the model uses one.
    pub sliding_window: Option<usize>,
    /// The model's own RoPE (its scaling, pair layout, partial rotary).
    pub rope: RopeConfig,
    /// Beginning-of-sequence token, if known.
    pub bos_token_id: Option<u32>,
    /// End-of-sequence tokens, if known.
    pub eos_token_ids: Vec<u32>,
}

fn bounded(name: &str, v: usize, max: usize) -> Result<usize> {
    if v == 0 || v > max {
        return Err(ModelError::Config(format!(
            "{name} = {v} is outside 1..={max}"
        )));
    }
    Ok(v)
}

impl DecoderConfig {
    /// Reads a Hugging Face `config.json`'s text: the decoder keys through
    /// [`HfDecoderConfig`], the RoPE keys through posenc's reader.
    ///
    /// # Errors
    /// [`ModelError::Config`] for JSON of the wrong shape or values out of
    /// range, [`ModelError::Unsupported`] for another architecture, and
    /// posenc's RoPE errors.
    pub fn from_hf_json_str(text: &str) -> Result<DecoderConfig> {
        Self::from_hf_json_named("config.json", text)
    }

    /// [`from_hf_json_str`](Self::from_hf_json_str) for the text of the
    /// file `path`, which its messages name.
    ///
    /// # Errors
    /// As [`from_hf_json_str`](Self::from_hf_json_str).
    pub fn from_hf_json_file(path: &Path, text: &str) -> Result<DecoderConfig> {
        Self::from_hf_json_named(&crate::safe::path(path), text)
    }

    fn from_hf_json_named(file: &str, text: &str) -> Result<DecoderConfig> {
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(|e| json_error(file, text, &e))?;
        if !value.is_object() {
            return Err(ModelError::Config(format!(
                "{file}: not a JSON object but {} (a config.json is an object of keys: {{\"model_type\": ..., \"hidden_size\": ...}})",
                posenc::rope::json_kind(&value)
            )));
        }
        let hf: HfDecoderConfig =
            serde_json::from_str(text).map_err(|e| json_error(file, text, &e))?;
        // The architecture first: another model's config fails on what it
        // is, not on a key it does not need.
        if let Some(name) = hf.model_type.as_deref() {
            Arch::parse(name)?;
        }
        let rope =
            RopeConfig::from_hf_json_str(text).map_err(|e| rope_error(file, text, &value, e))?;
        DecoderConfig::from_hf(&hf, rope).map_err(|e| match e {
            ModelError::Config(m) => ModelError::Config(format!("{file}: {m}")),
            other => other,
        })
    }

    /// Validates `hf` with transformers' defaults for its `model_type`;
    /// `rope` is the model's RoPE as posenc read it.
    ///
    /// # Errors
    /// As [`from_hf_json_str`](Self::from_hf_json_str).
    pub fn from_hf(hf: &HfDecoderConfig, rope: RopeConfig) -> Result<DecoderConfig> {
        let name = hf.model_type.as_deref().ok_or_else(|| {
            ModelError::Config(format!(
                "no model_type (posenc runs {})",
                SUPPORTED.join(", ")
            ))
        })?;
        let arch = Arch::parse(name)?;
        // transformers' config class defaults (configuration_llama.py,
        // configuration_mistral.py, configuration_qwen2.py).
        let (vocab, hidden, inter, layers, heads, eps, max_pos) = match arch {
            Arch::Llama => (32000, 4096, 11008, 32, 32, 1e-6, 2048),
            Arch::Mistral => (32000, 4096, 14336, 32, 32, 1e-6, 4096 * 32),
            Arch::Qwen2 => (151936, 4096, 22016, 32, 32, 1e-6, 32768),
        };
        let vocab_size = bounded("vocab_size", hf.vocab_size.unwrap_or(vocab), MAX_VOCAB)?;
        let hidden_size = bounded("hidden_size", hf.hidden_size.unwrap_or(hidden), MAX_HIDDEN)?;
        let intermediate_size = bounded(
            "intermediate_size",
            hf.intermediate_size.unwrap_or(inter),
            MAX_INTERMEDIATE,
        )?;
        let num_layers = bounded(
            "num_hidden_layers",
            hf.num_hidden_layers.unwrap_or(layers),
            MAX_LAYERS,
        )?;
        let num_heads = bounded(
            "num_attention_heads",
            hf.num_attention_heads.unwrap_or(heads),
            MAX_HEADS,
        )?;
        let kv_default = if arch == Arch::Mistral { 8 } else { num_heads };
        let num_kv_heads = bounded(
            "num_key_value_heads",
            hf.num_key_value_heads.unwrap_or(kv_default),
            MAX_HEADS,
        )?;
        if !num_heads.is_multiple_of(num_kv_heads) {
            return Err(ModelError::Config(format!(
                "num_attention_heads = {num_heads} is not a multiple of num_key_value_heads = {num_kv_heads}"
            )));
        }
        let head_dim = match hf.head_dim {
            Some(d) => d,
            None => {
                if !hidden_size.is_multiple_of(num_heads) {
                    return Err(ModelError::Config(format!(
                        "hidden_size = {hidden_size} is not a multiple of num_attention_heads = {num_heads} and no head_dim is given"
                    )));
                }
                hidden_size / num_heads
            }
        };
        let head_dim = bounded("head_dim", head_dim, MAX_HEAD_DIM)?;
        if head_dim % 2 != 0 {
            return Err(ModelError::Config(format!("head_dim = {head_dim} is odd")));
        }
        let rms_norm_eps = hf.rms_norm_eps.unwrap_or(eps);
        if !(rms_norm_eps.is_finite() && rms_norm_eps > 0.0 && rms_norm_eps <= MAX_RMS_NORM_EPS) {
            return Err(ModelError::Config(format!(
                "rms_norm_eps = {rms_norm_eps:e} is outside (0, {MAX_RMS_NORM_EPS}] (models use 1e-6 to 1e-5)"
            )));
        }
        let max_position_embeddings = bounded(
            "max_position_embeddings",
            hf.max_position_embeddings.unwrap_or(max_pos),
            MAX_POSITIONS,
        )?;
        let theta = rope.theta();
        if !(theta > MIN_ROPE_THETA && theta <= MAX_ROPE_THETA) {
            return Err(ModelError::Config(format!(
                "rope_theta = {theta:e} is outside ({MIN_ROPE_THETA}, {MAX_ROPE_THETA:e}] (published models use 1e4 to a few 1e9)"
            )));
        }
        if let Some(o) = rope.original_max_position_embeddings() {
            bounded("original_max_position_embeddings", o, MAX_POSITIONS)?;
        }
        if let Some(act) = hf.hidden_act.as_deref() {
            if act != "silu" && act != "swish" {
                return Err(ModelError::Config(format!(
                    "hidden_act = {act:?}: posenc runs SwiGLU (silu)"
                )));
            }
        }
        let attention_bias = hf.attention_bias.unwrap_or(false);
        let (qkv_bias, o_bias) = match arch {
            Arch::Qwen2 => (true, false),
            _ => (attention_bias, attention_bias),
        };
        let sliding_window = match arch {
            Arch::Mistral => hf.sliding_window,
            Arch::Qwen2 if hf.use_sliding_window.unwrap_or(false) => hf.sliding_window,
            _ => None,
        };
        if rope.head_dim() != head_dim && rope.head_dim() != hidden_size / num_heads {
            return Err(ModelError::Config(format!(
                "RoPE head dimension {} differs from the model's {head_dim}",
                rope.head_dim()
            )));
        }
        let rope = rope.with_head_dim(head_dim);
        rope.validate()?;
        // The tables themselves: every frequency finite, the attention
        // factor in posenc's range (a scaling whose parameters pass one by
        // one can still make them degenerate).
        rope.frequencies(None)?;
        Ok(DecoderConfig {
            arch,
            vocab_size,
            hidden_size,
            intermediate_size,
            num_layers,
            num_heads,
            num_kv_heads,
            head_dim,
            rms_norm_eps,
            max_position_embeddings,
            tie_word_embeddings: hf.tie_word_embeddings.unwrap_or(false),
            qkv_bias,
            o_bias,
            mlp_bias: hf.mlp_bias.unwrap_or(false),
            sliding_window,
            rope,
            bos_token_id: hf
                .bos_token_id
                .as_ref()
                .and_then(|t| t.to_vec().first().copied()),
            eos_token_ids: hf
                .eos_token_id
                .as_ref()
                .map(TokenIds::to_vec)
                .unwrap_or_default(),
        })
    }

    /// The context length the model was trained at: the scaling's
    /// `original_max_position_embeddings` where the config has one (Llama
    /// 3.1's llama3, YaRN, LongRoPE), else `max_position_embeddings`.
    pub fn trained_length(&self) -> usize {
        self.rope
            .original_max_position_embeddings()
            .unwrap_or(self.max_position_embeddings)
    }

    /// The pair layout the weights are stored for (interleaved for GGUF
    /// Llama files, half-split for Hugging Face checkpoints and GGUF Qwen2).
    pub fn pair_layout(&self) -> PairLayout {
        self.rope.layout()
    }

    /// Width of the packed q, k, v projection: `(H_q + 2·H_k)·D`.
    pub fn qkv_width(&self) -> usize {
        (self.num_heads + 2 * self.num_kv_heads) * self.head_dim
    }

    /// The norms and projections of layer `l`, and its q, k, v biases
    /// where the config has them, by Hugging Face name, with their shapes
    /// (Hugging Face order).
    pub(crate) fn layer_tensors(&self, l: usize) -> Vec<(String, Vec<usize>)> {
        let (d, i) = (self.hidden_size, self.intermediate_size);
        let (hq, hk, dh) = (self.num_heads, self.num_kv_heads, self.head_dim);
        let p = |s: &str| format!("model.layers.{l}.{s}");
        let mut out = vec![
            (p("input_layernorm.weight"), vec![d]),
            (p("post_attention_layernorm.weight"), vec![d]),
            (p("self_attn.q_proj.weight"), vec![hq * dh, d]),
            (p("self_attn.k_proj.weight"), vec![hk * dh, d]),
            (p("self_attn.v_proj.weight"), vec![hk * dh, d]),
            (p("self_attn.o_proj.weight"), vec![d, hq * dh]),
            (p("mlp.gate_proj.weight"), vec![i, d]),
            (p("mlp.up_proj.weight"), vec![i, d]),
            (p("mlp.down_proj.weight"), vec![d, i]),
        ];
        if self.qkv_bias {
            out.extend([
                (p("self_attn.q_proj.bias"), vec![hq * dh]),
                (p("self_attn.k_proj.bias"), vec![hk * dh]),
                (p("self_attn.v_proj.bias"), vec![hk * dh]),
            ]);
        }
        out
    }

    /// Every parameter [`crate::Decoder::load`] reads for this config, by
    /// Hugging Face name, with its shape (Hugging Face order). The output
    /// projection `lm_head.weight` is last; with tied embeddings it is
    /// optional (used when present).
    pub fn expected_tensors(&self) -> Vec<(String, Vec<usize>)> {
        let (d, i, v) = (self.hidden_size, self.intermediate_size, self.vocab_size);
        let mut out: Vec<(String, Vec<usize>)> = vec![
            ("model.embed_tokens.weight".into(), vec![v, d]),
            ("model.norm.weight".into(), vec![d]),
        ];
        for l in 0..self.num_layers {
            let p = |s: &str| format!("model.layers.{l}.{s}");
            out.extend(self.layer_tensors(l));
            if self.o_bias {
                out.push((p("self_attn.o_proj.bias"), vec![d]));
            }
            if self.mlp_bias {
                out.extend([
                    (p("mlp.gate_proj.bias"), vec![i]),
                    (p("mlp.up_proj.bias"), vec![i]),
                    (p("mlp.down_proj.bias"), vec![d]),
                ]);
            }
        }
        out.push(("lm_head.weight".into(), vec![v, d]));
        out
    }

    /// Number of parameters (embeddings counted once when tied).
    pub fn parameters(&self) -> u64 {
        let d = self.hidden_size as u64;
        let qkv = self.qkv_width() as u64;
        let hq = (self.num_heads * self.head_dim) as u64;
        let i = self.intermediate_size as u64;
        let per_layer = d * qkv
            + hq * d
            + 3 * d * i
            + 2 * d
            + if self.qkv_bias { qkv } else { 0 }
            + if self.o_bias { d } else { 0 }
            + if self.mlp_bias { 2 * i + d } else { 0 };
        let emb = self.vocab_size as u64 * d;
        emb + if self.tie_word_embeddings { 0 } else { emb }
            + d
            + per_layer * self.num_layers as u64
    }
}
