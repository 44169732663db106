//! Where a model's parameters come from: a GGUF file ([`crate::gguf`]) or a
//! Hugging Face checkpoint (`config.json` beside one or more safetensors
//! files), both asked by Hugging Face parameter name and expected shape, and
//! both returning `f32` tensors.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use candle_core::safetensors::MmapedSafetensors;
use candle_core::{DType, Device, Tensor};
use serde::Deserialize;

use crate::config::DecoderConfig;
use crate::error::{ModelError, Result};
use crate::safe::{escape as esc, quote};

/// Largest magnitude accepted in a weight, bias, norm weight or embedding
/// read from a model file. Trained decoders' weights stay within a few
/// hundred (their largest outliers, the "super weights" of Yu et al. 2024,
/// and Qwen2's q/k biases, are tens to a few hundred; fp16 checkpoints
/// cannot exceed 65,504); a value above 10^4 is a damaged or hostile file,
/// whose finite but absurd values would give finite but meaningless losses.
pub const MAX_WEIGHT: f32 = 1e4;

/// What a parameter is, by its GGUF or Hugging Face name, and the largest
/// magnitude accepted in it.
pub fn weight_kind(name: &str) -> (&'static str, f32) {
    if name == "rope_freqs.weight" {
        // Frequency divisors: the bound of every RoPE scaling factor.
        (
            "RoPE frequency factor",
            posenc::rope::scaling::named::MAX_FACTOR as f32,
        )
    } else if name.contains("norm") {
        ("norm weight", MAX_WEIGHT)
    } else if name.ends_with(".bias") {
        ("bias", MAX_WEIGHT)
    } else if name.contains("embd") || name.contains("embed_tokens") {
        ("embedding", MAX_WEIGHT)
    } else {
        ("weight", MAX_WEIGHT)
    }
}

/// `layer N ` of a per-layer parameter name (`blk.N.` or
/// `model.layers.N.`), for messages.
fn layer_of(name: &str) -> Option<usize> {
    let rest = name
        .strip_prefix("blk.")
        .or_else(|| name.strip_prefix("model.layers."))?;
    rest.split('.').next()?.parse().ok()
}

/// The message and the path of a candle error, without the repetitions
/// candle adds: the path it wraps an error with (`path: "x" ...`), a
/// backtrace, context lines (joined with `: `).
pub fn candle_reason(e: &candle_core::Error) -> (Option<PathBuf>, String) {
    use candle_core::Error as E;
    match e {
        E::WithPath { inner, path } => {
            let (_, reason) = candle_reason(inner);
            (Some(path.clone()), reason)
        }
        E::WithBacktrace { inner, .. } => candle_reason(inner),
        E::Context { inner, context } => {
            let (p, reason) = candle_reason(inner);
            (p, format!("{context}: {reason}"))
        }
        other => (None, other.to_string()),
    }
}

/// A store of named parameters.
pub trait WeightSource {
    /// Whether the store has the parameter `hf_name`.
    fn contains(&self, hf_name: &str) -> bool;
    /// The parameter `hf_name` as an `f32` tensor of shape `shape`
    /// (Hugging Face order: a linear layer's weight is `(out, in)`).
    ///
    /// # Errors
    /// [`ModelError::BadFile`] if it is missing, of another shape, or of a
    /// type that cannot be read.
    fn load(&mut self, hf_name: &str, shape: &[usize]) -> Result<Tensor>;
    /// One line saying what the store is (format, tensor types).
    fn describe(&self) -> String;
}

/// Checks the tensors a file has (`present`: the file's names and shapes)
/// against those `cfg` reads ([`DecoderConfig::expected_tensors`], named
/// in the file by `file_name`), before any is read: every missing tensor
/// and every tensor the config does not use (unless `allowed_extra`) is
/// named (the first few of each), and every shape is checked. A config
/// saying 1 layer on a 2-layer checkpoint, or 3 on it, is refused here.
///
/// # Errors
/// [`ModelError::BadFile`] naming the tensors.
pub fn check_tensor_set(
    cfg: &DecoderConfig,
    present: &HashMap<String, Vec<usize>>,
    file_name: &dyn Fn(&str) -> Option<String>,
    allowed_extra: &dyn Fn(&str) -> bool,
    path: &Path,
) -> Result<()> {
    let list = |names: &[String]| -> String {
        let shown: Vec<String> = names.iter().take(4).map(|n| esc(n)).collect();
        let more = names.len().saturating_sub(4);
        if more > 0 {
            format!("{} and {more} more", shown.join(", "))
        } else {
            shown.join(", ")
        }
    };
    let mut expected = HashSet::new();
    let mut missing = Vec::new();
    for (hf, shape) in cfg.expected_tensors() {
        let name = file_name(&hf).unwrap_or_else(|| hf.clone());
        match present.get(&name) {
            Some(dims) if dims != &shape => {
                return Err(ModelError::bad_file(
                    path,
                    format!(
                        "tensor {} has shape {dims:?}, the config expects {shape:?}",
                        esc(&name)
                    ),
                ))
            }
            Some(_) => {}
            None if hf == "lm_head.weight" && cfg.tie_word_embeddings => {}
            None => missing.push(name.clone()),
        }
        expected.insert(name);
    }
    if !missing.is_empty() {
        return Err(ModelError::bad_file(
            path,
            format!(
                "missing tensors for the config's {} layers: {}",
                cfg.num_layers,
                list(&missing)
            ),
        ));
    }
    let mut unexpected: Vec<String> = present
        .keys()
        .filter(|n| !expected.contains(*n) && !allowed_extra(n))
        .cloned()
        .collect();
    if !unexpected.is_empty() {
        unexpected.sort();
        return Err(ModelError::bad_file(
            path,
            format!(
                "tensors the config ({} layers) does not use: {}; the config does not match the weights",
                cfg.num_layers,
                list(&unexpected)
            ),
        ));
    }
    Ok(())
}

/// Checks that every value of a parameter just read is finite, naming the
/// tensor (and so its layer) and the first bad index otherwise. A sum
/// screens the tensor; only a non-finite sum is searched element by
/// element.
///
/// # Errors
/// [`ModelError::BadFile`] for a NaN or an infinity.
pub fn check_finite(t: &Tensor, name: &str, path: &Path) -> Result<()> {
    let sum = t.sum_all()?.to_dtype(DType::F32)?.to_scalar::<f32>()?;
    if sum.is_finite() {
        return Ok(());
    }
    let values = t.flatten_all()?.to_dtype(DType::F32)?.to_vec1::<f32>()?;
    if let Some((i, v)) = values.iter().enumerate().find(|(_, v)| !v.is_finite()) {
        return Err(ModelError::bad_file(
            path,
            format!(
                "tensor {} has the non-finite value {v} at index {i}",
                esc(name)
            ),
        ));
    }
    Ok(())
}

/// [`check_finite`], then the magnitude: every value at most the bound of
/// the parameter's kind ([`weight_kind`]: [`MAX_WEIGHT`] for weights,
/// biases, norms and embeddings), naming the tensor, its layer, the first
/// value over the bound and the bound.
///
/// # Errors
/// [`ModelError::BadFile`].
pub fn check_values(t: &Tensor, name: &str, path: &Path) -> Result<()> {
    check_finite(t, name, path)?;
    let (kind, bound) = weight_kind(name);
    let max = t
        .abs()?
        .max_all()?
        .to_dtype(DType::F32)?
        .to_scalar::<f32>()?;
    if max <= bound {
        return Ok(());
    }
    let values = t.flatten_all()?.to_dtype(DType::F32)?.to_vec1::<f32>()?;
    let (i, v) = values
        .iter()
        .enumerate()
        .find(|(_, v)| v.abs() > bound)
        .map_or((0, max), |(i, v)| (i, *v));
    let layer = layer_of(name)
        .map(|l| format!(" in layer {l} of the model"))
        .unwrap_or_default();
    Err(ModelError::bad_file(
        path,
        format!(
            "tensor {} ({kind}{layer}) holds {v:e} at index {i}, beyond the ±{bound:e} accepted for a {kind} (trained models stay far below it): a damaged file",
            esc(name)
        ),
    ))
}

/// A Hugging Face checkpoint's safetensors files, memory-mapped.
pub struct Safetensors {
    files: Vec<PathBuf>,
    st: MmapedSafetensors,
}

debug_summary!(Safetensors {
    "files": |s| &s.files,
});

#[derive(Deserialize)]
struct Index {
    weight_map: std::collections::BTreeMap<String, String>,
}

/// Largest `model.safetensors.index.json` read (its weight map only).
const MAX_INDEX_BYTES: u64 = 64 << 20;

impl Safetensors {
    /// The safetensors files of the checkpoint in `dir`: `model.safetensors`,
    /// or the shards listed by `model.safetensors.index.json`.
    ///
    /// # Errors
    /// [`ModelError::Io`] / [`ModelError::BadFile`] if neither is there or a
    /// header is not valid safetensors (the header's own bounds are checked
    /// by the `safetensors` crate before any tensor is read).
    pub fn open_dir(dir: &Path) -> Result<Safetensors> {
        let single = dir.join("model.safetensors");
        let index = dir.join("model.safetensors.index.json");
        let files = if single.is_file() {
            vec![single]
        } else if index.is_file() {
            let bytes = crate::fsio::read_bounded(&index, MAX_INDEX_BYTES)?;
            let text = String::from_utf8(bytes)
                .map_err(|_| ModelError::bad_file(&index, "not UTF-8 text"))?;
            let idx: Index = serde_json::from_str(&text)
                .map_err(|e| ModelError::bad_file(&index, e.to_string()))?;
            let mut shards: Vec<String> = idx.weight_map.into_values().collect();
            shards.sort();
            shards.dedup();
            let mut files = Vec::new();
            for s in shards {
                if s.contains('/') || s.contains('\\') || s.starts_with('.') {
                    return Err(ModelError::bad_file(
                        &index,
                        format!(
                            "shard name {}: a file name beside the index is expected",
                            quote(&s)
                        ),
                    ));
                }
                files.push(dir.join(s));
            }
            files
        } else {
            return Err(ModelError::Invalid(format!(
                "{}: no model.safetensors or model.safetensors.index.json",
                crate::safe::path(dir)
            )));
        };
        for f in &files {
            if !f.is_file() {
                return Err(ModelError::Invalid(format!(
                    "{}: missing shard (listed in model.safetensors.index.json)",
                    crate::safe::path(f)
                )));
            }
        }
        for f in &files {
            crate::fsio::check_regular(f)?;
        }
        // SAFETY: the files are mapped read-only; posenc does not modify
        // them, and a checkpoint changed by another process while it is
        // read is outside what any loader can guard against.
        let st = unsafe { MmapedSafetensors::multi(&files) }.map_err(|e| {
            // candle wraps the error with the path; the message names it once.
            let (p, reason) = candle_reason(&e);
            ModelError::bad_file(
                p.as_deref().unwrap_or(&files[0]),
                format!("not a valid safetensors file: {}", esc(&reason)),
            )
        })?;
        let st = Safetensors { files, st };
        // The checkpoint's own config.json, when it parses, must describe
        // these tensors (a bad config is reported by whoever reads it).
        let cfg_path = dir.join("config.json");
        if let Ok(bytes) = crate::fsio::read_bounded(&cfg_path, crate::MAX_CONFIG_BYTES) {
            if let Ok(cfg) = std::str::from_utf8(&bytes)
                .map_err(|_| ())
                .and_then(|t| DecoderConfig::from_hf_json_str(t).map_err(|_| ()))
            {
                st.check_config(&cfg)?;
            }
        }
        Ok(st)
    }

    /// Checks the checkpoint's tensors against `cfg`
    /// ([`check_tensor_set`]; rotary `inv_freq` buffers of older
    /// checkpoints are allowed).
    ///
    /// # Errors
    /// [`ModelError::BadFile`] naming missing, unexpected or misshapen
    /// tensors.
    pub fn check_config(&self, cfg: &DecoderConfig) -> Result<()> {
        let present: HashMap<String, Vec<usize>> = self
            .st
            .tensors()
            .into_iter()
            .map(|(n, v)| (n, v.shape().to_vec()))
            .collect();
        check_tensor_set(
            cfg,
            &present,
            &|hf| Some(hf.to_string()),
            &|n| n.ends_with("rotary_emb.inv_freq"),
            &self.files[0],
        )
    }
}

impl WeightSource for Safetensors {
    fn contains(&self, hf_name: &str) -> bool {
        self.st.get(hf_name).is_ok()
    }

    fn load(&mut self, hf_name: &str, shape: &[usize]) -> Result<Tensor> {
        let view = self.st.get(hf_name).map_err(|_| {
            ModelError::bad_file(&self.files[0], format!("missing tensor {}", esc(hf_name)))
        })?;
        if view.shape() != shape {
            return Err(ModelError::bad_file(
                &self.files[0],
                format!(
                    "tensor {} has shape {:?}, the config expects {shape:?}",
                    esc(hf_name),
                    view.shape()
                ),
            ));
        }
        let t = self.st.load(hf_name, &Device::Cpu).map_err(|e| {
            let (p, reason) = candle_reason(&e);
            ModelError::bad_file(
                p.as_deref().unwrap_or(&self.files[0]),
                format!("{}: {}", esc(hf_name), esc(&reason)),
            )
        })?;
        let t = t.to_dtype(DType::F32)?;
        check_values(&t, hf_name, &self.files[0])?;
        Ok(t)
    }

    fn describe(&self) -> String {
        format!("safetensors, {} file(s)", self.files.len())
    }
}
