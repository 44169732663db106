//! Where a model's parameters come from: a GGUF file ([`crate::gguf`]) or a
//! Hugging Face checkpoint (`config.json` beside one or more safetensors
//! files), both asked by Hugging Face parameter name and expected shape, and
//! both returning `f32` tensors.

use std::path::{Path, PathBuf};

use candle_core::safetensors::MmapedSafetensors;
use candle_core::{DType, Device, Tensor};
use serde::Deserialize;

use crate::error::{ModelError, Result};

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

/// A Hugging Face checkpoint's safetensors files, memory-mapped.
pub struct Safetensors {
    files: Vec<PathBuf>,
    st: MmapedSafetensors,
}

impl std::fmt::Debug for Safetensors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Safetensors")
            .field("files", &self.files)
            .finish()
    }
}

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
            let len = std::fs::metadata(&index)
                .map_err(|e| ModelError::io(&index, e))?
                .len();
            if len > MAX_INDEX_BYTES {
                return Err(ModelError::bad_file(
                    &index,
                    format!("{len} bytes is too large"),
                ));
            }
            let text = std::fs::read_to_string(&index).map_err(|e| ModelError::io(&index, e))?;
            let idx: Index = serde_json::from_str(&text)
                .map_err(|e| ModelError::bad_file(&index, e.to_string()))?;
            let mut shards: Vec<String> = idx.weight_map.into_values().collect();
            shards.sort();
            shards.dedup();
            let mut files = Vec::new();
            for s in shards {
                if s.contains('/') || s.contains('\\') || s.starts_with('.') {
                    return Err(ModelError::bad_file(&index, format!("shard name {s:?}")));
                }
                files.push(dir.join(s));
            }
            files
        } else {
            return Err(ModelError::Invalid(format!(
                "{}: no model.safetensors or model.safetensors.index.json",
                dir.display()
            )));
        };
        for f in &files {
            if !f.is_file() {
                return Err(ModelError::Invalid(format!(
                    "{}: missing shard",
                    f.display()
                )));
            }
        }
        // SAFETY: the files are mapped read-only; posenc does not modify
        // them, and a checkpoint changed by another process while it is
        // read is outside what any loader can guard against.
        let st = unsafe { MmapedSafetensors::multi(&files) }
            .map_err(|e| ModelError::bad_file(&files[0], e.to_string()))?;
        Ok(Safetensors { files, st })
    }
}

impl WeightSource for Safetensors {
    fn contains(&self, hf_name: &str) -> bool {
        self.st.get(hf_name).is_ok()
    }

    fn load(&mut self, hf_name: &str, shape: &[usize]) -> Result<Tensor> {
        let view = self.st.get(hf_name).map_err(|_| {
            ModelError::bad_file(&self.files[0], format!("missing tensor {hf_name}"))
        })?;
        if view.shape() != shape {
            return Err(ModelError::bad_file(
                &self.files[0],
                format!(
                    "tensor {hf_name} has shape {:?}, the config expects {shape:?}",
                    view.shape()
                ),
            ));
        }
        let t = self
            .st
            .load(hf_name, &Device::Cpu)
            .map_err(|e| ModelError::bad_file(&self.files[0], format!("{hf_name}: {e}")))?;
        Ok(t.to_dtype(DType::F32)?)
    }

    fn describe(&self) -> String {
        format!("safetensors, {} file(s)", self.files.len())
    }
}
