//! Files written whole or not at all (a temporary file beside the target,
//! then a rename), and safetensors files read with errors that name them.
//! A leaf: the tokenizer cache ([`crate::bpe`]) and the checkpoints use it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};

use crate::error::LabError;

/// `path` with `.tmp` appended: where a file is written before its rename.
fn tmp_path(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(".tmp");
    PathBuf::from(s)
}

/// Renames the finished temporary file `tmp` onto `path`.
fn commit(tmp: &Path, path: &Path) -> Result<(), LabError> {
    std::fs::rename(tmp, path).map_err(|e| LabError::Io {
        path: path.to_path_buf(),
        source: e,
    })
}

/// Writes a file through a temporary file and a rename.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), LabError> {
    let tmp = tmp_path(path);
    std::fs::write(&tmp, bytes).map_err(|e| LabError::Io {
        path: tmp.clone(),
        source: e,
    })?;
    commit(&tmp, path)
}

/// Writes tensors as a safetensors file, through a temporary file and a
/// rename.
pub(crate) fn write_safetensors(
    path: &Path,
    tensors: &HashMap<String, Tensor>,
) -> Result<(), LabError> {
    let tmp = tmp_path(path);
    candle_core::safetensors::save(tensors, &tmp)?;
    commit(&tmp, path)
}

/// Reads a safetensors file onto the CPU: [`LabError::Io`] when it is
/// missing, [`LabError::Invalid`] when it is not a safetensors file.
pub(crate) fn read_safetensors(path: &Path) -> Result<HashMap<String, Tensor>, LabError> {
    if !path.exists() {
        return Err(LabError::Io {
            path: path.to_path_buf(),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "file not found"),
        });
    }
    candle_core::safetensors::load(path, &Device::Cpu).map_err(|e| {
        LabError::Invalid(format!(
            "{} is corrupt or not a safetensors file: {e}",
            path.display()
        ))
    })
}
