//! LoRA adapters in PEFT's layout, and merging them into a model.
//!
//! A directory as PEFT's `save_pretrained` writes it (PEFT 0.21):
//!
//! - `adapter_config.json`: PEFT's `LoraConfig` with every key PEFT writes
//!   (sorted, two-space indent): `peft_type: "LORA"`, `r`, `lora_alpha`,
//!   `lora_dropout`, `target_modules` (module names, `q_proj`, ...),
//!   `modules_to_save` (`embed_tokens`, `norm`, `input_layernorm`,
//!   `post_attention_layernorm` when those were trained, as LongLoRA
//!   trains them; Chen et al. 2024, §3.3), `task_type: "CAUSAL_LM"`,
//!   `base_model_name_or_path`, and PEFT's defaults for the rest;
//! - `adapter_model.safetensors`: `f32` tensors named
//!   `base_model.model.model.layers.{i}.{self_attn|mlp}.{target}.lora_A.weight`
//!   `(r, in)` and `...lora_B.weight` `(out, r)`, and each saved module's
//!   weight as `base_model.model.{Hugging Face name}`
//!   (`base_model.model.model.norm.weight`); metadata `{"format": "pt"}`
//!   (what transformers and PEFT write), and `posenc.step` when posenc
//!   wrote it as a checkpoint.
//!
//! `PeftModel.from_pretrained(model, dir)` loads it onto the transformers
//! model (`scripts/finetune/peft_check.py`, `tests/peft.rs`).
//!
//! **Row order.** Tensors are stored in Hugging Face's row order. A Llama
//! or Mistral GGUF model runs with the q and k rows of each head permuted
//! for interleaved RoPE pairs (llama.cpp's converter; see
//! [`posenc_models::gguf::permute_for_interleaved`]); the B factors of its
//! `q_proj` and `k_proj` adapters are permuted back on writing and forward
//! on reading, so one adapter fits both the GGUF and the Hugging Face
//! checkpoint of a model.
//!
//! **Merging** ([`Adapter::merge_into`]) is PEFT's `merge_and_unload`:
//! `W ← W + s·B·A` with `s = lora_alpha / r` (`lora_alpha / √r` with
//! `use_rslora`), and each saved module's weight replacing the model's.
//!
//! What is refused when read (one line each): a config that is not LoRA,
//! DoRA, per-module ranks or alphas (`rank_pattern`, `alpha_pattern`),
//! `fan_in_fan_out`, trained biases (`bias` other than `none`, `lora_bias`),
//! `target_modules` given as a pattern, `exclude_modules`,
//! `layer_replication`, a `layers_pattern` other than `layers`, a
//! `layers_to_transform` index past the model's layers (the list is
//! honoured: a factor of a layer it leaves out is refused), a scale
//! `alpha/r` outside [[`crate::lora::MIN_SCALE`],
//! [`crate::lora::MAX_SCALE`]], tensors with other names or a dtype other
//! than F32, F16 or BF16, values above [`posenc_models::weights::MAX_WEIGHT`]
//! in magnitude, and any shape that does not fit the model. Names and
//! values from the files are shown escaped ([`posenc_models::safe`]).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};
use posenc::rope::PairLayout;
use posenc_models::safe::{escape as esc, quote};
use posenc_models::{Decoder, DecoderConfig, ModelError};
use serde_json::{json, Value};

use crate::error::{Result, TuneError};
use crate::lora::{adapter_name, Factor, LoraConfig, Target};
use crate::model::{Trainable, TrainableDecoder};

/// The safetensors file at `path`, of at most `copies` times the weights of
/// `cfg` (plus 16 MiB), its header, and the step its metadata records under
/// [`STEP_KEY`] (`None` without one); `bad` words a header that does not
/// parse.
pub(crate) fn read_stepped(
    path: &Path,
    cfg: &DecoderConfig,
    copies: u64,
    bad: impl Fn(String) -> TuneError,
) -> Result<(Vec<u8>, safetensors::tensor::Metadata, Option<usize>)> {
    let max = posenc_models::llama::weight_bytes(cfg)
        .saturating_mul(copies)
        .saturating_add(16 << 20);
    let bytes = posenc_models::input::read_bounded(path, max)?;
    let (_, meta) =
        safetensors::SafeTensors::read_metadata(&bytes).map_err(|e| bad(e.to_string()))?;
    let step = meta
        .metadata()
        .as_ref()
        .and_then(|m| m.get(STEP_KEY))
        .and_then(|s| s.parse::<usize>().ok());
    Ok((bytes, meta, step))
}

/// PEFT's adapter configuration file.
pub const CONFIG_FILE: &str = "adapter_config.json";
/// PEFT's adapter weights file.
pub const WEIGHTS_FILE: &str = "adapter_model.safetensors";
/// Largest `adapter_config.json` read.
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;
/// The safetensors metadata key holding the step of a posenc checkpoint.
pub const STEP_KEY: &str = "posenc.step";
/// The PEFT version whose `adapter_config.json` keys are written.
pub const PEFT_VERSION: &str = "0.21.2";

/// The prefix PEFT puts before a Hugging Face parameter name.
const PREFIX: &str = "base_model.model.";

/// A LoRA adapter (factors in Hugging Face row order) with the base
/// parameters trained beside it.
#[derive(Debug, Clone, PartialEq)]
pub struct Adapter {
    /// Rank, alpha, dropout and targets.
    pub lora: LoraConfig,
    /// PEFT's `use_rslora`: the scaling is `alpha/√r` instead of `alpha/r`.
    pub rslora: bool,
    /// `base_model_name_or_path`.
    pub base_model: Option<String>,
    /// `(A (r, in), B (out, r))` of each adapted projection, row-major.
    pub factors: BTreeMap<(usize, Target), (Vec<f32>, Vec<f32>)>,
    /// Whole parameters saved beside (PEFT's `modules_to_save`), by Hugging
    /// Face name: shape and values, row-major.
    pub saved: BTreeMap<String, (Vec<usize>, Vec<f32>)>,
    /// The step of the posenc checkpoint it was written as, if any.
    pub step: Option<usize>,
    /// PEFT's `layers_to_transform`: the only layers adapted (`None`:
    /// every layer holding factors).
    pub layers: Option<Vec<usize>>,
}

/// Rows of each head's half-split pairs moved to interleaved pairs (`to =
/// true`, llama.cpp's permutation) or back, for a `(rows, cols)` row-major
/// matrix of `heads` heads.
pub(crate) fn permute_rows(
    m: &[f32],
    rows: usize,
    heads: usize,
    to_interleaved: bool,
) -> Result<Vec<f32>> {
    let cols = m.len() / rows.max(1);
    let t = Tensor::from_slice(m, (rows, cols), &Device::Cpu)?;
    let half = rows / heads / 2;
    let t = if to_interleaved {
        t.reshape((heads, 2, half, cols))?
    } else {
        t.reshape((heads, half, 2, cols))?
    };
    Ok(t.transpose(1, 2)?.flatten_all()?.to_vec1::<f32>()?)
}

/// The heads whose rows a GGUF file permutes for `target`, if the model's
/// q and k rows are interleaved.
fn permuted_heads(cfg: &DecoderConfig, target: Target) -> Option<usize> {
    if cfg.pair_layout() != PairLayout::Interleaved {
        return None;
    }
    match target {
        Target::QProj => Some(cfg.num_heads),
        Target::KProj => Some(cfg.num_kv_heads),
        _ => None,
    }
}

/// The module names of [`Trainable`]'s parameters in `modules_to_save`.
fn modules_to_save(t: Trainable) -> Vec<&'static str> {
    let mut m = Vec::new();
    if t.embed {
        m.push("embed_tokens");
    }
    if t.norm {
        m.extend(["norm", "input_layernorm", "post_attention_layernorm"]);
    }
    m
}

/// `(shape)` of a saved module's parameter `hf` in `cfg`'s model, if it is
/// one PEFT can save beside a LoRA adapter here.
fn saved_shape(cfg: &DecoderConfig, hf: &str) -> Option<Vec<usize>> {
    let d = cfg.hidden_size;
    match hf {
        "model.embed_tokens.weight" => Some(vec![cfg.vocab_size, d]),
        "model.norm.weight" => Some(vec![d]),
        "lm_head.weight" if !cfg.tie_word_embeddings => Some(vec![cfg.vocab_size, d]),
        _ => {
            let rest = hf.strip_prefix("model.layers.")?;
            let (l, field) = rest.split_once('.')?;
            let l: usize = l.parse().ok()?;
            (l < cfg.num_layers
                && (field == "input_layernorm.weight"
                    || field == "post_attention_layernorm.weight"))
                .then(|| vec![d])
        }
    }
}

/// Parses a PEFT LoRA factor name into its layer, target and factor.
fn parse_factor_name(name: &str) -> Option<(usize, Target, Factor)> {
    let rest = name.strip_prefix("base_model.model.model.layers.")?;
    let (l, rest) = rest.split_once('.')?;
    let l: usize = l.parse().ok()?;
    let (block, rest) = rest.split_once('.')?;
    let (module, rest) = rest.split_once('.')?;
    let factor = match rest {
        "lora_A.weight" => Factor::A,
        "lora_B.weight" => Factor::B,
        _ => return None,
    };
    let target: Target = module.parse().ok()?;
    (target.block() == block).then_some((l, target, factor))
}

impl Adapter {
    /// The adapter of a trainable model: its LoRA factors (B rows of q and
    /// k put back in Hugging Face order for an interleaved model) and its
    /// trained embedding and norms.
    ///
    /// # Errors
    /// Candle's.
    pub fn from_model(model: &TrainableDecoder, base_model: Option<String>) -> Result<Adapter> {
        let cfg = model.config();
        let mut factors: BTreeMap<(usize, Target), (Vec<f32>, Vec<f32>)> = BTreeMap::new();
        let mut saved = BTreeMap::new();
        for (name, var) in model.parameters() {
            let values = var.as_tensor().flatten_all()?.to_vec1::<f32>()?;
            match parse_factor_name(name) {
                Some((l, t, f)) => {
                    let e = factors.entry((l, t)).or_default();
                    match f {
                        Factor::A => e.0 = values,
                        Factor::B => {
                            e.1 = match permuted_heads(cfg, t) {
                                Some(h) => permute_rows(&values, var.dims()[0], h, false)?,
                                None => values,
                            }
                        }
                    }
                }
                None => {
                    saved.insert(name.clone(), (var.dims().to_vec(), values));
                }
            }
        }
        Ok(Adapter {
            lora: model.lora().clone(),
            rslora: false,
            base_model,
            factors,
            saved,
            step: None,
            layers: None,
        })
    }

    /// Which base parameters the adapter carries, as [`Trainable`] (the
    /// embedding, or every norm).
    pub fn trainable(&self) -> Trainable {
        Trainable {
            embed: self.saved.contains_key("model.embed_tokens.weight"),
            norm: self.saved.contains_key("model.norm.weight"),
        }
    }

    /// The factor multiplying `B·A`: `alpha/r`, or `alpha/√r` with rsLoRA.
    pub fn scaling(&self) -> f64 {
        if self.rslora {
            self.lora.alpha / (self.lora.rank as f64).sqrt()
        } else {
            self.lora.scaling()
        }
    }

    /// `adapter_config.json` as PEFT 0.21 writes it (every key, PEFT's
    /// defaults for what posenc does not use).
    pub fn config_json(&self) -> Value {
        let mut targets: Vec<&str> = self.lora.targets.iter().map(|t| t.name()).collect();
        targets.sort_unstable();
        let mts = modules_to_save(self.trainable());
        json!({
            "alora_invocation_tokens": null,
            "alpha_pattern": {},
            "arrow_config": null,
            "auto_mapping": null,
            "base_model_name_or_path": self.base_model,
            "bias": "none",
            "corda_config": null,
            "ensure_weight_tying": false,
            "eva_config": null,
            "exclude_modules": null,
            "fan_in_fan_out": false,
            "inference_mode": true,
            "init_lora_weights": true,
            "kasa_config": null,
            "layer_replication": null,
            "layers_pattern": if self.layers.is_some() { json!("layers") } else { Value::Null },
            "layers_to_transform": self.layers,
            "loftq_config": {},
            // An integer alpha as PEFT writes one given as an int.
            "lora_alpha": if self.lora.alpha.fract() == 0.0 && self.lora.alpha.abs() < 1e15 {
                json!(self.lora.alpha as i64)
            } else {
                json!(self.lora.alpha)
            },
            "lora_bias": false,
            "lora_dropout": self.lora.dropout,
            "lora_ga_config": null,
            "megatron_config": null,
            "megatron_core": "megatron.core",
            "modules_to_save": if mts.is_empty() { Value::Null } else { json!(mts) },
            "monteclora_config": null,
            "peft_type": "LORA",
            "peft_version": PEFT_VERSION,
            "qalora_group_size": 16,
            "r": self.lora.rank,
            "rank_pattern": {},
            "revision": null,
            "target_modules": targets,
            "target_parameters": null,
            "task_type": "CAUSAL_LM",
            "trainable_token_indices": null,
            "use_bdlora": null,
            "use_dora": false,
            "use_qalora": false,
            "use_rslora": self.rslora,
            "velora_config": null
        })
    }

    /// Writes `adapter_config.json` and `adapter_model.safetensors` into
    /// `dir` (created if needed), each through a temporary file and a
    /// rename; the weights file first.
    ///
    /// # Errors
    /// [`TuneError::Io`]; safetensors' serialisation errors as
    /// [`TuneError::Adapter`].
    pub fn write(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(|e| TuneError::io(dir, e))?;
        let mut tensors: Vec<(String, Vec<usize>, &[f32])> = Vec::new();
        for (&(l, t), (a, b)) in &self.factors {
            let r = self.lora.rank;
            tensors.push((adapter_name(l, t, Factor::A), vec![r, a.len() / r], a));
            tensors.push((adapter_name(l, t, Factor::B), vec![b.len() / r, r], b));
        }
        for (name, (shape, v)) in &self.saved {
            tensors.push((format!("{PREFIX}{name}"), shape.clone(), v));
        }
        let mut meta = HashMap::from([("format".to_string(), "pt".to_string())]);
        if let Some(s) = self.step {
            meta.insert(STEP_KEY.to_string(), s.to_string());
        }
        write_safetensors(&dir.join(WEIGHTS_FILE), &tensors, meta)?;
        let text = serde_json::to_string_pretty(&self.config_json()).expect("serialisable");
        write_atomic(&dir.join(CONFIG_FILE), text.as_bytes())
    }

    /// Reads the adapter in `dir` and checks it against `cfg`'s model
    /// before converting any tensor: the config's keys, every tensor's
    /// name and shape, and that each adapted projection has both factors.
    /// Files are size-checked before they are read (the weights at most
    /// twice the model's `f32` size, plus 16 MiB).
    ///
    /// # Errors
    /// [`TuneError::Adapter`] naming what does not fit; [`TuneError::Io`].
    pub fn read(dir: &Path, cfg: &DecoderConfig) -> Result<Adapter> {
        let bad = |reason: String| TuneError::Adapter {
            path: dir.to_path_buf(),
            reason,
        };
        let holds = format!(
            "an adapter directory holds {CONFIG_FILE} and {WEIGHTS_FILE}, as PEFT's save_pretrained writes them"
        );
        match std::fs::metadata(dir) {
            Ok(m) if !m.is_dir() => return Err(bad(format!("not a directory ({holds})"))),
            _ => {}
        }
        let config_path = dir.join(CONFIG_FILE);
        let weights_path = dir.join(WEIGHTS_FILE);
        for (p, file) in [(&config_path, CONFIG_FILE), (&weights_path, WEIGHTS_FILE)] {
            // Said for what it is: missing, or a directory, FIFO or device
            // (refused by type, never opened).
            match posenc_models::input::check_regular(p) {
                Ok(_) => {}
                Err(ModelError::NotAFile { kind, .. }) => {
                    return Err(bad(format!(
                    "{file} is a {kind}, not a regular file (refused without reading it; {holds})"
                )))
                }
                Err(ModelError::Io { source, .. })
                    if source.kind() == std::io::ErrorKind::NotFound =>
                {
                    return Err(bad(format!("no {file} ({holds})")))
                }
                Err(e) => return Err(e.into()),
            }
        }
        let text = posenc_models::input::read_bounded(&config_path, MAX_CONFIG_BYTES)?;
        let c: Value = serde_json::from_slice(&text).map_err(|e| {
            bad(format!(
                "{CONFIG_FILE} is not JSON: {}",
                esc(&e.to_string())
            ))
        })?;
        if !c.is_object() {
            return Err(bad(format!(
                "{CONFIG_FILE} is not a JSON object but {} (PEFT writes an object of LoraConfig's keys)",
                json_kind(&c)
            )));
        }
        let (lora, rslora, base_model) = parse_config(&c).map_err(bad)?;
        lora.validate_for(cfg).map_err(|e| bad(e.to_string()))?;
        let layers = parse_layers(&c, cfg.num_layers).map_err(bad)?;
        let scale = if rslora {
            lora.alpha / (lora.rank as f64).sqrt()
        } else {
            lora.scaling()
        };
        crate::lora::check_scale(scale, rslora).map_err(|e| bad(e.to_string()))?;
        let (bytes, meta, step) = read_stepped(&weights_path, cfg, 2, |e| {
            bad(format!("{WEIGHTS_FILE}: {e}"))
        })?;
        // Names and shapes first.
        let infos = meta.tensors();
        let mut names: Vec<&String> = infos.keys().collect();
        names.sort();
        let r = lora.rank;
        let mut seen: BTreeMap<(usize, Target), [bool; 2]> = BTreeMap::new();
        for name in &names {
            let shape = &infos[*name].shape;
            let dtype = infos[*name].dtype;
            if !matches!(
                dtype,
                safetensors::Dtype::F32 | safetensors::Dtype::F16 | safetensors::Dtype::BF16
            ) {
                return Err(bad(format!(
                    "tensor {} has dtype {dtype:?}; an adapter's tensors are F32, F16 or BF16",
                    esc(name)
                )));
            }
            let name_shown = esc(name);
            if let Some((l, t, f)) = parse_factor_name(name) {
                if l >= cfg.num_layers {
                    return Err(bad(format!(
                        "{name_shown}: layer {l}, the model has {} (layers 0..={})",
                        cfg.num_layers,
                        cfg.num_layers - 1
                    )));
                }
                if let Some(list) = layers.as_ref().filter(|list| !list.contains(&l)) {
                    return Err(bad(format!(
                        "{name_shown}: layer {l}, which layers_to_transform {list:?} leaves out"
                    )));
                }
                if !lora.targets(t) {
                    return Err(bad(format!("{name_shown}: {t} is not in target_modules")));
                }
                let (d_in, d_out) = t.dims(cfg);
                let want = match f {
                    Factor::A => vec![r, d_in],
                    Factor::B => vec![d_out, r],
                };
                if *shape != want {
                    return Err(bad(format!(
                        "{name_shown} has shape {shape:?}, the model needs {want:?} (r = {r})"
                    )));
                }
                seen.entry((l, t)).or_default()[matches!(f, Factor::B) as usize] = true;
            } else if let Some(hf) = name.strip_prefix(PREFIX) {
                let want = saved_shape(cfg, hf).ok_or_else(|| {
                    bad(format!(
                        "tensor {name_shown} is neither a LoRA factor nor a parameter this model can take"
                    ))
                })?;
                if *shape != want {
                    return Err(bad(format!(
                        "{name_shown} has shape {shape:?}, the model needs {want:?}"
                    )));
                }
            } else {
                return Err(bad(format!(
                    "tensor {name_shown} is not named as PEFT names them"
                )));
            }
        }
        if let Some(((l, t), _)) = seen.iter().find(|(_, s)| !(s[0] && s[1])) {
            return Err(bad(format!(
                "layer {l}'s {t} has only one of lora_A and lora_B"
            )));
        }
        if seen.is_empty() {
            return Err(bad("no LoRA factors".into()));
        }
        // Then the values.
        let st = safetensors::SafeTensors::deserialize(&bytes)
            .map_err(|e| bad(format!("{WEIGHTS_FILE}: {}", esc(&e.to_string()))))?;
        let load = |name: &str| -> Result<Vec<f32>> {
            use candle_core::safetensors::Load;
            let view = st
                .tensor(name)
                .map_err(|e| bad(format!("{}: {}", esc(name), esc(&e.to_string()))))?;
            let t = view.load(&Device::Cpu)?.to_dtype(candle_core::DType::F32)?;
            let v = t.flatten_all()?.to_vec1::<f32>()?;
            if let Some((i, x)) = v.iter().enumerate().find(|(_, x)| !x.is_finite()) {
                return Err(bad(format!(
                    "{} holds the non-finite value {x} at index {i}",
                    esc(name)
                )));
            }
            // LoRA factors and saved norms or embeddings alike: the bound
            // of a model file's weights.
            let (kind, bound) = match name.strip_prefix(PREFIX) {
                Some(hf) if parse_factor_name(name).is_none() => {
                    posenc_models::weights::weight_kind(hf)
                }
                _ => ("LoRA factor", posenc_models::weights::MAX_WEIGHT),
            };
            if let Some((i, x)) = v.iter().enumerate().find(|(_, x)| x.abs() > bound) {
                return Err(bad(format!(
                    "{} holds {x:e} at index {i}, beyond the ±{bound:e} accepted for a {kind} (trained adapters stay far below it)",
                    esc(name)
                )));
            }
            Ok(v)
        };
        let mut factors = BTreeMap::new();
        for &(l, t) in seen.keys() {
            let a = load(&adapter_name(l, t, Factor::A))?;
            let b = load(&adapter_name(l, t, Factor::B))?;
            factors.insert((l, t), (a, b));
        }
        let mut saved = BTreeMap::new();
        for name in names {
            if parse_factor_name(name).is_none() {
                let hf = name.strip_prefix(PREFIX).expect("checked above");
                saved.insert(hf.to_string(), (infos[name].shape.clone(), load(name)?));
            }
        }
        Ok(Adapter {
            lora,
            rslora,
            base_model,
            factors,
            saved,
            step,
            layers,
        })
    }

    /// Merges the adapter into `decoder` (PEFT's `merge_and_unload`): `W ←
    /// W + s·B·A` for each adapted projection (B's q and k rows permuted
    /// for an interleaved model), and each saved parameter replacing the
    /// model's, through [`Decoder::set_weight`].
    ///
    /// # Errors
    /// [`TuneError::Adapter`] for a tensor that does not fit (an adapter
    /// from [`read`](Self::read) against the same config always fits).
    pub fn merge_into(&self, decoder: &mut Decoder, path: &Path) -> Result<()> {
        let cfg = decoder.config().clone();
        let bad = |reason: String| TuneError::Adapter {
            path: path.to_path_buf(),
            reason,
        };
        let s = self.scaling();
        let mut updates: Vec<(String, Vec<f32>)> = Vec::new();
        {
            let weights = decoder.named_weights();
            for (&(l, t), (a, b)) in &self.factors {
                let name = format!("model.layers.{l}.{}.{}.weight", t.block(), t.name());
                let w = weights
                    .iter()
                    .find(|w| w.name == name)
                    .ok_or_else(|| bad(format!("the model has no {name}")))?;
                let (out, inp) = (w.shape[0], w.shape[1]);
                let r = self.lora.rank;
                if a.len() != r * inp || b.len() != out * r {
                    return Err(bad(format!(
                        "the factors of {name} do not fit {:?}",
                        w.shape
                    )));
                }
                let b = match permuted_heads(&cfg, t) {
                    Some(h) => permute_rows(b, out, h, true)?,
                    None => b.clone(),
                };
                let a = Tensor::from_slice(a, (r, inp), &Device::Cpu)?;
                let b = Tensor::from_slice(&b, (out, r), &Device::Cpu)?;
                let delta = b.matmul(&a)?.affine(s, 0.0)?; // (out, in)
                let merged = (Tensor::from_slice(w.data, (out, inp), &Device::Cpu)? + delta)?;
                let merged = merged.flatten_all()?.to_vec1::<f32>()?;
                // The product itself can overflow, or reach magnitudes no
                // model has, though each factor and the scale pass.
                let bound = posenc_models::weights::MAX_WEIGHT;
                if let Some((i, v)) = merged
                    .iter()
                    .enumerate()
                    .find(|(_, v)| !(v.is_finite() && v.abs() <= bound))
                {
                    return Err(bad(format!(
                        "merging layer {l}'s {t} (W + {s}·B·A) gives {v:e} at index {i} of {name}, beyond the ±{bound:e} a model's weights stay within: the factors or lora_alpha are implausible"
                    )));
                }
                updates.push((name, merged));
            }
        }
        for (name, (_, v)) in &self.saved {
            updates.push((name.clone(), v.clone()));
        }
        for (name, v) in updates {
            decoder
                .set_weight(&name, &v)
                .map_err(|e| bad(e.to_string()))?;
        }
        Ok(())
    }

    /// Sets a trainable model's parameters to this adapter's (to resume a
    /// run): each factor by its PEFT name (B's q and k rows permuted for an
    /// interleaved model), each saved parameter by its name.
    ///
    /// # Errors
    /// [`TuneError::Adapter`] when the adapter's factors or saved
    /// parameters are not exactly the model's trained parameters.
    pub fn load_into(&self, model: &TrainableDecoder, path: &Path) -> Result<()> {
        let bad = |reason: String| TuneError::Adapter {
            path: path.to_path_buf(),
            reason,
        };
        let cfg = model.config().clone();
        let mut expected: Vec<&str> = model.parameters().iter().map(|(n, _)| n.as_str()).collect();
        let mut given: Vec<String> = Vec::new();
        for (&(l, t), (a, b)) in &self.factors {
            let an = adapter_name(l, t, Factor::A);
            let bn = adapter_name(l, t, Factor::B);
            let rows = b.len() / self.lora.rank.max(1);
            let b = match permuted_heads(&cfg, t) {
                Some(h) => permute_rows(b, rows, h, true)?,
                None => b.clone(),
            };
            model
                .set_parameter(&an, a)
                .map_err(|e| bad(e.to_string()))?;
            model
                .set_parameter(&bn, &b)
                .map_err(|e| bad(e.to_string()))?;
            given.extend([an, bn]);
        }
        for (name, (_, v)) in &self.saved {
            model
                .set_parameter(name, v)
                .map_err(|e| bad(e.to_string()))?;
            given.push(name.clone());
        }
        expected.sort_unstable();
        given.sort_unstable();
        if expected != given {
            return Err(bad(format!(
                "it holds {} trained tensors, the run trains {}",
                given.len(),
                expected.len()
            )));
        }
        Ok(())
    }
}

/// The LoRA configuration, rsLoRA flag and base model of a PEFT
/// `adapter_config.json`, refusing what posenc does not apply.
fn parse_config(c: &Value) -> std::result::Result<(LoraConfig, bool, Option<String>), String> {
    let peft_type = c.get("peft_type").and_then(Value::as_str);
    if peft_type != Some("LORA") {
        return Err(format!(
            "peft_type is {}, posenc applies LORA adapters only",
            esc(&c.get("peft_type").unwrap_or(&Value::Null).to_string())
        ));
    }
    let flag = |k: &str| c.get(k).and_then(Value::as_bool).unwrap_or(false);
    let empty = |k: &str| match c.get(k) {
        None | Some(Value::Null) => true,
        Some(Value::Object(m)) => m.is_empty(),
        Some(_) => false,
    };
    for k in ["use_dora", "fan_in_fan_out", "lora_bias"] {
        if flag(k) {
            return Err(format!("{k} is set; posenc applies plain LoRA only"));
        }
    }
    for k in ["rank_pattern", "alpha_pattern"] {
        if !empty(k) {
            return Err(format!(
                "{k} gives modules their own rank or alpha; posenc applies one r and one lora_alpha"
            ));
        }
    }
    if let Some(b) = c.get("bias").and_then(Value::as_str) {
        if b != "none" {
            return Err(format!(
                "bias is {}; posenc applies adapters without biases",
                quote(b)
            ));
        }
    }
    let r = c.get("r").and_then(Value::as_u64).ok_or("no integer r")?;
    let alpha = c
        .get("lora_alpha")
        .and_then(Value::as_f64)
        .ok_or("no number lora_alpha")?;
    let dropout = c.get("lora_dropout").and_then(Value::as_f64).unwrap_or(0.0);
    let targets = match c.get("target_modules") {
        Some(Value::Array(a)) => {
            let mut ts = Vec::new();
            for v in a {
                let s = v.as_str().ok_or("target_modules holds a non-string")?;
                let t: Target = s.parse().map_err(|e: TuneError| e.to_string())?;
                if !ts.contains(&t) {
                    ts.push(t);
                }
            }
            ts.sort_unstable();
            ts
        }
        Some(Value::String(s)) => {
            return Err(format!(
                "target_modules is the pattern {}; posenc reads a list of module names",
                quote(s)
            ))
        }
        _ => return Err("no target_modules list".into()),
    };
    if let Some(Value::Array(m)) = c.get("modules_to_save") {
        for v in m {
            let s = v.as_str().unwrap_or("");
            if ![
                "embed_tokens",
                "norm",
                "input_layernorm",
                "post_attention_layernorm",
                "lm_head",
            ]
            .contains(&s)
            {
                return Err(format!(
                    "modules_to_save names {}; posenc takes embed_tokens, norm, input_layernorm, post_attention_layernorm, lm_head",
                    quote(s)
                ));
            }
        }
    }
    let lora = LoraConfig {
        rank: usize::try_from(r).map_err(|_| "r is too large")?,
        alpha,
        dropout,
        targets,
    };
    lora.validate().map_err(|e| e.to_string())?;
    let base = c
        .get("base_model_name_or_path")
        .and_then(Value::as_str)
        .map(str::to_string);
    Ok((lora, flag("use_rslora"), base))
}

/// What a JSON value is, in words.
fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// PEFT's `layers_to_transform` (an index or a list; `None`: every layer),
/// each index below `num_layers`, with `layers_pattern` absent or
/// `layers` (the name of these decoders' layer list), and no
/// `layer_replication` or `exclude_modules`.
fn parse_layers(c: &Value, num_layers: usize) -> std::result::Result<Option<Vec<usize>>, String> {
    let set = |k: &str| match c.get(k) {
        None | Some(Value::Null) => false,
        Some(Value::Array(a)) => !a.is_empty(),
        Some(Value::String(s)) => !s.is_empty(),
        Some(_) => true,
    };
    for k in ["layer_replication", "exclude_modules"] {
        if set(k) {
            return Err(format!(
                "{k} is set; posenc applies target_modules in every layer of layers_to_transform"
            ));
        }
    }
    let index = |v: &Value| -> std::result::Result<usize, String> {
        let i = v.as_u64().ok_or_else(|| {
            format!(
                "layers_to_transform holds {}, not a layer index",
                esc(&v.to_string())
            )
        })?;
        if i >= num_layers as u64 {
            return Err(format!(
                "layers_to_transform holds layer {i}; the model has {num_layers} layers (0..={})",
                num_layers.saturating_sub(1)
            ));
        }
        Ok(i as usize)
    };
    let layers = match c.get("layers_to_transform") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Array(a)) => {
            let mut l = a
                .iter()
                .map(index)
                .collect::<std::result::Result<Vec<_>, _>>()?;
            l.sort_unstable();
            l.dedup();
            if l.is_empty() {
                return Err(
                    "layers_to_transform is an empty list: no layer would be adapted".into(),
                );
            }
            l
        }
        Some(v) => vec![index(v)?],
    };
    let pattern_ok = match c.get("layers_pattern") {
        None | Some(Value::Null) => true,
        Some(Value::String(s)) => s == "layers",
        Some(Value::Array(a)) => a.iter().all(|v| v.as_str() == Some("layers")) && !a.is_empty(),
        Some(_) => false,
    };
    if !pattern_ok {
        return Err(format!(
            "layers_pattern is {}; these decoders' layers are model.layers.N (pattern \"layers\")",
            esc(&c["layers_pattern"].to_string())
        ));
    }
    Ok(Some(layers))
}

/// Writes `f32` tensors as a safetensors file with `meta`, through a
/// temporary file and a rename. The file is a function of its contents
/// alone (the `safetensors` crate writes its metadata map in hash order):
/// the header lists the metadata and the tensors by name, in sorted order,
/// the data follows in that order, and the header is padded with spaces
/// to a multiple of 8 bytes, as the format allows.
/// The start of a safetensors file: the length of `header`'s JSON (u64,
/// little-endian), then that JSON padded with spaces to a multiple of 8
/// bytes. The tensors' bytes follow it, at the header's `data_offsets`.
pub fn safetensors_head(header: serde_json::Map<String, Value>) -> Vec<u8> {
    let mut head = Value::Object(header).to_string();
    while !head.len().is_multiple_of(8) {
        head.push(' ');
    }
    let mut bytes = Vec::with_capacity(8 + head.len());
    bytes.extend_from_slice(&(head.len() as u64).to_le_bytes());
    bytes.extend_from_slice(head.as_bytes());
    bytes
}

pub(crate) fn write_safetensors(
    path: &Path,
    tensors: &[(String, Vec<usize>, &[f32])],
    meta: HashMap<String, String>,
) -> Result<()> {
    let mut order: Vec<&(String, Vec<usize>, &[f32])> = tensors.iter().collect();
    order.sort_by(|a, b| a.0.cmp(&b.0));
    let mut header = serde_json::Map::new();
    let meta: BTreeMap<String, String> = meta.into_iter().collect();
    header.insert("__metadata__".into(), json!(meta));
    let mut offset = 0usize;
    for (name, shape, v) in &order {
        if shape.iter().product::<usize>() != v.len() {
            return Err(TuneError::Adapter {
                path: path.to_path_buf(),
                reason: format!("{name}: shape {shape:?} for {} values", v.len()),
            });
        }
        let end = offset + 4 * v.len();
        header.insert(
            name.clone(),
            json!({"dtype": "F32", "shape": shape, "data_offsets": [offset, end]}),
        );
        offset = end;
    }
    // serde_json's map is sorted, or in insertion order with its
    // `preserve_order` feature: either way "__metadata__" comes first and
    // the tensors follow by name.
    let mut bytes = safetensors_head(header);
    bytes.reserve_exact(offset);
    for (_, _, v) in &order {
        for x in v.iter() {
            bytes.extend_from_slice(&x.to_le_bytes());
        }
    }
    write_atomic(path, &bytes)
}

fn tmp_path(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(".tmp");
    PathBuf::from(s)
}

/// Writes a file through a temporary file and a rename.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = tmp_path(path);
    std::fs::write(&tmp, bytes).map_err(|e| TuneError::io(&tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| TuneError::io(path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn factor_names_parse_back() {
        for t in Target::ALL {
            for f in [Factor::A, Factor::B] {
                assert_eq!(parse_factor_name(&adapter_name(7, t, f)), Some((7, t, f)));
            }
        }
        assert_eq!(
            parse_factor_name("base_model.model.model.layers.0.mlp.q_proj.lora_A.weight"),
            None
        );
        assert_eq!(
            parse_factor_name("base_model.model.model.layers.0.self_attn.q_proj.lora_C.weight"),
            None
        );
    }

    #[test]
    fn row_permutations_are_inverse_and_llama_cpps() {
        // 2 heads of 4 rows (2 pairs), 1 column: rows 0..8.
        let m: Vec<f32> = (0..8).map(|x| x as f32).collect();
        let to = permute_rows(&m, 8, 2, true).unwrap();
        // Within each head, half-split rows (0, 1 | 2, 3) become interleaved
        // pairs (0, 2, 1, 3), as convert_hf_to_gguf.py's permute.
        assert_eq!(to, vec![0.0, 2.0, 1.0, 3.0, 4.0, 6.0, 5.0, 7.0]);
        let t = Tensor::from_slice(&m, (8, 1), &Device::Cpu).unwrap();
        let llama_cpp = posenc_models::gguf::permute_for_interleaved(&t, 2)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        assert_eq!(to, llama_cpp);
        assert_eq!(permute_rows(&to, 8, 2, false).unwrap(), m);
    }

    #[test]
    fn configs_posenc_cannot_apply_are_refused() {
        let base = json!({"peft_type": "LORA", "r": 4, "lora_alpha": 8,
                          "target_modules": ["q_proj", "v_proj"]});
        let (lora, rs, _) = parse_config(&base).unwrap();
        assert_eq!((lora.rank, lora.alpha, rs), (4, 8.0, false));
        assert_eq!(lora.targets, vec![Target::QProj, Target::VProj]);
        let with = |k: &str, v: Value| {
            let mut c = base.clone();
            c[k] = v;
            parse_config(&c).unwrap_err()
        };
        assert!(with("peft_type", json!("IA3")).contains("LORA"));
        assert!(with("use_dora", json!(true)).contains("use_dora"));
        assert!(with("rank_pattern", json!({"q_proj": 8})).contains("rank_pattern"));
        assert!(with("target_modules", json!(".*proj")).contains("pattern"));
        assert!(with("target_modules", json!(["lm_head"])).contains("lm_head"));
        assert!(with("bias", json!("all")).contains("bias"));
        assert!(with("r", json!(0)).contains("rank"));
        assert!(with("modules_to_save", json!(["classifier"])).contains("classifier"));
    }
}
