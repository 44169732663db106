//! Special-file-safe, bounded reading of one file: refused by its type
//! before it is opened, opened without blocking, read only up to a size.
//! A leaf: the GGUF and safetensors readers, the tokenizer and the run's
//! inputs ([`crate::input`], which re-exports these) read through it.

use std::fs::File;
use std::io::Read;
use std::path::Path;

use crate::error::{ModelError, Result};

/// What a path is when it is not a regular file, or `None`.
fn special_kind(ft: &std::fs::FileType) -> Option<&'static str> {
    if ft.is_file() {
        return None;
    }
    if ft.is_dir() {
        return Some("directory");
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if ft.is_fifo() {
            return Some("FIFO (named pipe)");
        }
        if ft.is_char_device() {
            return Some("character device");
        }
        if ft.is_block_device() {
            return Some("block device");
        }
        if ft.is_socket() {
            return Some("socket");
        }
    }
    Some("special file")
}

/// The size of `path` if it is a regular file (symbolic links followed);
/// nothing is opened.
///
/// # Errors
/// [`ModelError::Io`] if it cannot be stat'ed, [`ModelError::NotAFile`]
/// for a directory, FIFO, device or socket.
pub fn check_regular(path: &Path) -> Result<u64> {
    let meta = std::fs::metadata(path).map_err(|e| ModelError::io(path, e))?;
    match special_kind(&meta.file_type()) {
        None => Ok(meta.len()),
        Some(kind) => Err(ModelError::NotAFile {
            path: path.to_path_buf(),
            kind,
        }),
    }
}

/// Opens a regular file for reading without ever blocking on it: refused
/// by type from `stat` first ([`check_regular`]), opened with `O_NONBLOCK`
/// (which does not change reads of a regular file), and checked again on
/// the descriptor. Returns the file and its size.
///
/// # Errors
/// As [`check_regular`].
pub fn open_regular(path: &Path) -> Result<(File, u64)> {
    check_regular(path)?;
    let mut opts = std::fs::OpenOptions::new();
    opts.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.custom_flags(libc::O_NONBLOCK);
    }
    let file = opts.open(path).map_err(|e| ModelError::io(path, e))?;
    let meta = file.metadata().map_err(|e| ModelError::io(path, e))?;
    if let Some(kind) = special_kind(&meta.file_type()) {
        return Err(ModelError::NotAFile {
            path: path.to_path_buf(),
            kind,
        });
    }
    Ok((file, meta.len()))
}

/// Reads a whole regular file of at most `max` bytes (refused by its size
/// before it is read, and never read past `max` should it grow).
///
/// # Errors
/// As [`open_regular`]; [`ModelError::BadFile`] over `max`.
pub fn read_bounded(path: &Path, max: u64) -> Result<Vec<u8>> {
    let (file, len) = open_regular(path)?;
    let too_large =
        |n: u64| ModelError::bad_file(path, format!("{n} bytes is over the {max}-byte limit"));
    if len > max {
        return Err(too_large(len));
    }
    let mut bytes = Vec::with_capacity(len as usize);
    file.take(max + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| ModelError::io(path, e))?;
    if bytes.len() as u64 > max {
        return Err(too_large(bytes.len() as u64));
    }
    Ok(bytes)
}

/// Checks a model path before anything opens it: a regular file (a GGUF,
/// or a `config.json`), or a directory whose `config.json`,
/// `tokenizer.json`, `tokenizer_config.json`, `model.safetensors` and
/// `model.safetensors.index.json`, where present, are regular files.
///
/// # Errors
/// [`ModelError::Io`] for a missing path, [`ModelError::NotAFile`] for a
/// special file in either place.
pub fn check_model_path(path: &Path) -> Result<()> {
    let meta = std::fs::metadata(path).map_err(|e| ModelError::io(path, e))?;
    if !meta.is_dir() {
        check_regular(path)?;
        return Ok(());
    }
    for name in [
        "config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "model.safetensors",
        "model.safetensors.index.json",
    ] {
        let p = path.join(name);
        if std::fs::symlink_metadata(&p).is_ok() {
            check_regular(&p)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn special_files_are_refused_by_type() {
        let e = check_regular(Path::new("/dev/null")).unwrap_err();
        assert!(e.to_string().contains("character device"), "{e}");
        let e = check_regular(Path::new("/")).unwrap_err();
        assert!(e.to_string().contains("directory"), "{e}");
    }
}
