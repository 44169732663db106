//! A fine-tuned model as a Hugging Face checkpoint: the adapter merged into
//! the weights ([`crate::peft::Adapter::merge_into`]), `model.safetensors`
//! in `f32` with Hugging Face's names and row order, a `config.json` whose
//! RoPE is the one the model was trained through, and the tokenizer — so
//! that `AutoModelForCausalLM.from_pretrained(dir)` runs the model as
//! posenc trained it (`scripts/finetune/peft_check.py`).
//!
//! **The RoPE in `config.json`.** transformers 5 reads the legacy
//! `rope_scaling` dictionary with a top-level `rope_theta` (and converts it
//! to its `rope_parameters`), so the config carries, as transformers' docs
//! spell them:
//!
//! | trained with | `rope_scaling` | `max_position_embeddings` |
//! |---|---|---|
//! | `none` | `null` | the base's |
//! | `linear:F` | `{"rope_type": "linear", "factor": F}` | `⌈F·L⌉` (at least the base's) |
//! | `dynamic:F` | `{"rope_type": "dynamic", "factor": F}` | `L`: transformers' dynamic NTK grows the base past `max_position_embeddings`, posenc's past `L` |
//! | `yarn:F` | `{"rope_type": "yarn", "factor": F, "original_max_position_embeddings": L, "beta_fast": 32.0, "beta_slow": 1.0}` | `⌈F·L⌉` (at least the base's) |
//! | `model` | the base's own scaling (`llama3`, `yarn`, `linear`, `dynamic`) | the base's |
//!
//! with `L` the model's trained length
//! ([`DecoderConfig::trained_length`]). Any `rope_parameters` or
//! `rope_scaling` of the base config is replaced; its other keys are kept.
//! A GGUF base has no `config.json`: one is written from its metadata
//! ([`hf_config`]), and its own tokenizer as `tokenizer.json`.

use std::path::{Path, PathBuf};

use posenc::rope::{HfRopeParameters, RopeConfig, RopeScaling};
use posenc_models::{Arch, Decoder, DecoderConfig, Scaling};
use serde_json::{json, Value};

use crate::error::{Result, TuneError};
use crate::peft::{write_atomic, write_safetensors};

/// Files a Hugging Face tokenizer may consist of, copied from a base
/// checkpoint when present.
pub const TOKENIZER_FILES: [&str; 7] = [
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "generation_config.json",
];

/// Largest tokenizer file copied.
pub const MAX_TOKENIZER_FILE: u64 = 256 << 20;

/// The tokenizer written beside a merged checkpoint.
#[derive(Debug, Clone)]
pub enum TokenizerFiles {
    /// Files to copy: `(source, name in the checkpoint)`.
    Copy(Vec<(PathBuf, String)>),
    /// A `tokenizer.json`'s text (a GGUF's own tokenizer).
    Json(String),
}

impl TokenizerFiles {
    /// The tokenizer files of a checkpoint directory (those of
    /// [`TOKENIZER_FILES`] present), or one `tokenizer.json` given
    /// explicitly.
    pub fn from_dir(dir: &Path, explicit: Option<&Path>) -> TokenizerFiles {
        if let Some(p) = explicit {
            return TokenizerFiles::Copy(vec![(p.to_path_buf(), "tokenizer.json".into())]);
        }
        TokenizerFiles::Copy(
            TOKENIZER_FILES
                .iter()
                .map(|n| (dir.join(n), n.to_string()))
                .filter(|(p, _)| p.is_file())
                .collect(),
        )
    }
}

/// `rope_scaling`, `rope_theta` and `max_position_embeddings` for a model
/// of config `cfg` run with `rope` (see the [module docs](self)).
fn rope_keys(cfg: &DecoderConfig, rope: &RopeConfig, base_max: usize) -> Result<(Value, usize)> {
    let l = cfg.trained_length();
    let stretched = |f: f64| ((f * l as f64).ceil() as usize).max(base_max);
    let params = |rope_type: &str| HfRopeParameters {
        rope_type: Some(rope_type.to_string()),
        ..HfRopeParameters::default()
    };
    let (params, max) = match rope.scaling() {
        RopeScaling::Default => return Ok((Value::Null, base_max)),
        RopeScaling::Linear { factor } => (
            HfRopeParameters {
                factor: Some(*factor),
                ..params("linear")
            },
            stretched(*factor),
        ),
        RopeScaling::Dynamic {
            factor,
            max_position_embeddings,
        } => (
            HfRopeParameters {
                factor: Some(*factor),
                ..params("dynamic")
            },
            *max_position_embeddings,
        ),
        RopeScaling::Yarn(y) => {
            let max = if y.original_max_position_embeddings == l {
                stretched(y.factor)
            } else {
                base_max
            };
            (
                HfRopeParameters {
                    factor: Some(y.factor),
                    original_max_position_embeddings: Some(y.original_max_position_embeddings),
                    beta_fast: Some(y.beta_fast),
                    beta_slow: Some(y.beta_slow),
                    attention_factor: y.attention_factor,
                    mscale: y.mscale,
                    mscale_all_dim: y.mscale_all_dim,
                    // Written only when it is not transformers' default.
                    truncate: (!y.truncate).then_some(false),
                    ..params("yarn")
                },
                max,
            )
        }
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        } => (
            HfRopeParameters {
                factor: Some(*factor),
                low_freq_factor: Some(*low_freq_factor),
                high_freq_factor: Some(*high_freq_factor),
                original_max_position_embeddings: Some(*original_max_position_embeddings),
                ..params("llama3")
            },
            base_max,
        ),
        other => {
            return Err(TuneError::Scaling(format!(
                "{} (no merged config.json is written for it)",
                other.rope_type()
            )))
        }
    };
    let value =
        serde_json::to_value(params).map_err(|e| TuneError::Input(format!("rope_scaling: {e}")))?;
    Ok((value, max))
}

/// A transformers `config.json` for `cfg` (what a GGUF's metadata holds):
/// architecture, widths, heads, norms, vocabulary, tying, biases, token
/// ids and RoPE base, `float32`.
pub fn hf_config(cfg: &DecoderConfig) -> Value {
    let (model_type, class) = match cfg.arch {
        Arch::Llama => ("llama", "LlamaForCausalLM"),
        Arch::Mistral => ("mistral", "MistralForCausalLM"),
        Arch::Qwen2 => ("qwen2", "Qwen2ForCausalLM"),
    };
    let mut v = json!({
        "architectures": [class],
        "model_type": model_type,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "rms_norm_eps": cfg.rms_norm_eps,
        "max_position_embeddings": cfg.max_position_embeddings,
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "hidden_act": "silu",
        "bos_token_id": cfg.bos_token_id,
        "eos_token_id": match cfg.eos_token_ids.as_slice() {
            [] => Value::Null,
            [one] => json!(one),
            many => json!(many),
        },
    });
    match cfg.arch {
        Arch::Qwen2 => {}
        _ => {
            v["attention_bias"] = json!(cfg.qkv_bias);
            v["mlp_bias"] = json!(cfg.mlp_bias);
        }
    }
    if let Some(w) = cfg.sliding_window {
        v["sliding_window"] = json!(w);
        if cfg.arch == Arch::Qwen2 {
            v["use_sliding_window"] = json!(true);
        }
    }
    v
}

/// The merged checkpoint's `config.json`: the base's (`base_config`, its
/// text; `None` for a GGUF: [`hf_config`]) with the RoPE of `scaling`.
///
/// # Errors
/// [`TuneError::Config`] for a base config that is not a JSON object;
/// [`TuneError::Scaling`] for a RoPE no `rope_type` of transformers'
/// carries; the scaling's errors.
pub fn merged_config(
    cfg: &DecoderConfig,
    base_config: Option<&str>,
    scaling: &Scaling,
) -> Result<Value> {
    let mut v = match base_config {
        Some(text) => serde_json::from_str::<Value>(text)
            .map_err(|e| TuneError::Config(format!("the base config.json: {e}")))?,
        None => hf_config(cfg),
    };
    let obj = v
        .as_object_mut()
        .ok_or_else(|| TuneError::Config("the base config.json is not an object".into()))?;
    let rope = scaling.rope_config(cfg)?;
    let base_max = obj
        .get("max_position_embeddings")
        .and_then(Value::as_u64)
        .map_or(cfg.max_position_embeddings, |m| m as usize);
    let (rope_scaling, max_pos) = rope_keys(cfg, &rope, base_max)?;
    obj.remove("rope_parameters");
    obj.insert("rope_scaling".into(), rope_scaling);
    obj.insert("rope_theta".into(), json!(rope.theta()));
    obj.insert("max_position_embeddings".into(), json!(max_pos));
    obj.remove("torch_dtype");
    obj.insert("dtype".into(), json!("float32"));
    Ok(v)
}

/// Writes `decoder` (the adapter merged in) into `dir` as a Hugging Face
/// checkpoint: `model.safetensors` (`f32`; an interleaved GGUF model's q
/// and k rows, weights and biases, put back in Hugging Face order), then
/// the tokenizer files, then `config.json`, each through a temporary file
/// and a rename.
///
/// # Errors
/// [`TuneError::Io`]; the tokenizer's copy is size-checked
/// ([`MAX_TOKENIZER_FILE`]).
pub fn write_merged(
    dir: &Path,
    decoder: &Decoder,
    config: &Value,
    tokenizer: &TokenizerFiles,
) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| TuneError::io(dir, e))?;
    let cfg = decoder.config();
    let interleaved = cfg.pair_layout() == posenc::rope::PairLayout::Interleaved;
    let weights = decoder.named_weights();
    let mut owned: Vec<(String, Vec<usize>, Vec<f32>)> = Vec::new();
    let mut borrowed: Vec<(String, Vec<usize>, &[f32])> = Vec::new();
    for w in &weights {
        let heads = if w.name.contains("self_attn.q_proj.") {
            Some(cfg.num_heads)
        } else if w.name.contains("self_attn.k_proj.") {
            Some(cfg.num_kv_heads)
        } else {
            None
        };
        match heads {
            Some(h) if interleaved => {
                let rows = w.shape[0];
                let v = crate::peft::permute_rows(w.data, rows, h, false)?;
                owned.push((w.name.clone(), w.shape.clone(), v));
            }
            _ => borrowed.push((w.name.clone(), w.shape.clone(), w.data)),
        }
    }
    borrowed.extend(
        owned
            .iter()
            .map(|(n, s, v)| (n.clone(), s.clone(), v.as_slice())),
    );
    let meta = std::collections::HashMap::from([("format".to_string(), "pt".to_string())]);
    write_safetensors(&dir.join("model.safetensors"), &borrowed, meta)?;
    match tokenizer {
        TokenizerFiles::Copy(files) => {
            for (src, name) in files {
                let bytes = posenc_models::input::read_bounded(src, MAX_TOKENIZER_FILE)?;
                write_atomic(&dir.join(name), &bytes)?;
            }
        }
        TokenizerFiles::Json(text) => write_atomic(&dir.join("tokenizer.json"), text.as_bytes())?,
    }
    let text = serde_json::to_string_pretty(config).expect("serialisable");
    write_atomic(&dir.join("config.json"), text.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny_config() -> (DecoderConfig, String) {
        let p = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../posenc-models/tests/fixtures/tiny-llama31/config.json");
        let text = std::fs::read_to_string(p).unwrap();
        (DecoderConfig::from_hf_json_str(&text).unwrap(), text)
    }

    /// Each scaling's keys, and the config read back by posenc giving the
    /// very RoPE trained through.
    #[test]
    fn the_config_carries_the_trained_rope() {
        let (cfg, text) = tiny_config();
        assert_eq!(cfg.trained_length(), 32);
        for (name, want, max) in [
            ("none", Value::Null, 128),
            (
                "linear:2",
                json!({"rope_type": "linear", "factor": 2.0}),
                128,
            ),
            (
                "linear:8",
                json!({"rope_type": "linear", "factor": 8.0}),
                256,
            ),
            (
                "dynamic:2",
                json!({"rope_type": "dynamic", "factor": 2.0}),
                32,
            ),
            (
                "yarn:2",
                json!({"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 32,
                       "beta_fast": 32.0, "beta_slow": 1.0}),
                128,
            ),
        ] {
            let sc: Scaling = name.parse().unwrap();
            let v = merged_config(&cfg, Some(&text), &sc).unwrap();
            assert_eq!(v["rope_scaling"], want, "{name}");
            assert_eq!(v["max_position_embeddings"], max, "{name}");
            assert_eq!(v["rope_theta"], 500000.0);
            assert!(v.get("rope_parameters").is_none());
            assert_eq!(v["hidden_size"], 64, "other keys kept");
            let back = DecoderConfig::from_hf_json_str(&v.to_string()).unwrap();
            let trained = sc.rope_config(&cfg).unwrap();
            let (a, b) = (
                back.rope.frequencies(Some(64)).unwrap(),
                trained.frequencies(Some(64)).unwrap(),
            );
            assert_eq!(a.inv_freq, b.inv_freq, "{name}");
            assert_eq!(a.attention_factor, b.attention_factor, "{name}");
        }
        // The model's own llama3 scaling, kept.
        let v = merged_config(&cfg, Some(&text), &"model".parse().unwrap()).unwrap();
        assert_eq!(v["rope_scaling"]["rope_type"], "llama3");
        assert_eq!(v["rope_scaling"]["original_max_position_embeddings"], 32);
    }

    #[test]
    fn a_gguf_gets_a_config_from_its_metadata() {
        let (cfg, _) = tiny_config();
        let v = merged_config(&cfg, None, &"yarn:2".parse().unwrap()).unwrap();
        assert_eq!(v["model_type"], "llama");
        assert_eq!(v["architectures"], json!(["LlamaForCausalLM"]));
        assert_eq!(v["num_key_value_heads"], 2);
        assert_eq!(v["tie_word_embeddings"], false);
        let back = DecoderConfig::from_hf_json_str(&v.to_string()).unwrap();
        assert_eq!(back.hidden_size, cfg.hidden_size);
        assert_eq!(back.num_layers, cfg.num_layers);
        assert_eq!(back.trained_length(), 32);
    }
}
