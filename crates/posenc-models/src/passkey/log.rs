//! A trial log: one JSON line per finished trial, so that a grid of hours
//! can be stopped and resumed, or split over several runs, without running
//! a trial twice.
//!
//! The first line is a [`LogHeader`] (model, tokenizer, prompt format,
//! haystack fingerprint, seed, products, tokens generated); every further
//! line a [`LogRecord`]: the method's name as given, the trial's place in the
//! grid and its [`TrialResult`]. A log is read back only under the header
//! it was written with (a caller should also refuse a record whose key is
//! not the one the seed draws: the log is then from another version of the
//! probe). A last line cut off by a killed run is dropped and overwritten.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::TrialResult;
use crate::error::{ModelError, Result};

/// Largest trial log read back (bytes).
pub const MAX_LOG_BYTES: u64 = 256 << 20;

/// This log format's version.
pub const LOG_VERSION: u32 = 1;

/// The first line of a trial log: what the trials depend on besides their
/// place in the grid.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LogHeader {
    /// [`LOG_VERSION`].
    pub posenc_passkey_log: u32,
    /// The model (format, architecture, tensor types).
    pub model: String,
    /// The tokenizer's source.
    pub tokenizer: String,
    /// The prompt format ([`super::Haystack::name`]).
    pub format: String,
    /// [`super::Haystack::fingerprint`].
    pub haystack: u64,
    /// Seed of the keys.
    pub seed: u64,
    /// Precision of the attention's products.
    pub products: String,
    /// Tokens generated per trial.
    pub max_new_tokens: usize,
}

impl LogHeader {
    /// The header of a probe of the model at `model` (named by its file
    /// name and `source`, the loader's one line), with `tokenizer`,
    /// `haystack`, `seed` and the attention's `products` (`f32` or `bf16`):
    /// what `posenc passkey --log` and the report write, so that either can
    /// read the other's log.
    pub fn for_run(
        model: &Path,
        source: &str,
        tokenizer: &crate::tokenizer::TextTokenizer,
        haystack: &super::Haystack,
        seed: u64,
        products: &str,
    ) -> LogHeader {
        let file = model
            .file_name()
            .map_or(String::new(), |n| n.to_string_lossy().into_owned());
        LogHeader {
            posenc_passkey_log: LOG_VERSION,
            model: format!("{file} ({source})"),
            tokenizer: tokenizer.source().to_string(),
            format: haystack.name().to_string(),
            haystack: haystack.fingerprint(),
            seed,
            products: products.to_string(),
            max_new_tokens: super::MAX_NEW_TOKENS,
        }
    }
}

/// One finished trial.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LogRecord {
    /// The scaling or method, as given.
    pub method: String,
    /// The trial's index within its (length, depth) cell.
    pub trial: usize,
    /// Its result.
    #[serde(flatten)]
    pub result: TrialResult,
}

type Slot = (String, usize, u64, usize);

fn slot(method: &str, length: usize, depth: f64, trial: usize) -> Slot {
    (method.to_string(), length, depth.to_bits(), trial)
}

/// An open trial log: the records read back, and the file to append to.
#[derive(Debug)]
pub struct TrialLog {
    path: PathBuf,
    file: File,
    done: HashMap<Slot, TrialResult>,
}

impl TrialLog {
    /// Opens (or creates) the log at `path` for `header`, reading back its
    /// records.
    ///
    /// # Errors
    /// [`ModelError::Io`] if it cannot be read or written;
    /// [`ModelError::BadFile`] over [`MAX_LOG_BYTES`], for a line that is
    /// not a record, or for a header other than `header`.
    pub fn open(path: &Path, header: &LogHeader) -> Result<TrialLog> {
        let exists = std::fs::symlink_metadata(path).is_ok();
        let (done, keep) = if exists {
            let bytes = crate::fsio::read_bounded(path, MAX_LOG_BYTES)?;
            Self::parse(path, &bytes, header)?
        } else {
            (HashMap::new(), 0)
        };
        let mut file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| ModelError::io(path, e))?;
        if keep == 0 {
            file.set_len(0).map_err(|e| ModelError::io(path, e))?;
            let mut line = serde_json::to_string(header)
                .map_err(|e| ModelError::bad_file(path, e.to_string()))?;
            line.push('\n');
            file.write_all(line.as_bytes())
                .map_err(|e| ModelError::io(path, e))?;
        } else {
            // Drops a last line cut off by a killed run.
            file.set_len(keep as u64)
                .map_err(|e| ModelError::io(path, e))?;
        }
        Ok(TrialLog {
            path: path.to_path_buf(),
            file,
            done,
        })
    }

    /// The records of `bytes` and the length of its complete lines.
    fn parse(
        path: &Path,
        bytes: &[u8],
        header: &LogHeader,
    ) -> Result<(HashMap<Slot, TrialResult>, usize)> {
        let keep = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        let text = std::str::from_utf8(&bytes[..keep]).map_err(|e| {
            ModelError::bad_file(path, format!("not UTF-8 (byte {})", e.valid_up_to()))
        })?;
        let mut done = HashMap::new();
        let mut lines = text.lines().enumerate();
        match lines.next() {
            None => return Ok((done, 0)),
            Some((_, first)) => {
                let got: LogHeader = serde_json::from_str(first).map_err(|e| {
                    ModelError::bad_file(path, format!("line 1 is not a passkey log header: {e}"))
                })?;
                if &got != header {
                    return Err(ModelError::bad_file(
                        path,
                        format!(
                            "this log was written for other settings ({}); give another --log",
                            differences(&got, header)
                        ),
                    ));
                }
            }
        }
        for (i, line) in lines {
            if line.trim().is_empty() {
                continue;
            }
            let r: LogRecord = serde_json::from_str(line).map_err(|e| {
                ModelError::bad_file(path, format!("line {}: not a trial record: {e}", i + 1))
            })?;
            done.insert(
                slot(&r.method, r.result.length, r.result.depth, r.trial),
                r.result,
            );
        }
        Ok((done, keep))
    }

    /// The logged result of one trial, if any.
    pub fn get(
        &self,
        method: &str,
        length: usize,
        depth: f64,
        trial: usize,
    ) -> Option<&TrialResult> {
        self.done.get(&slot(method, length, depth, trial))
    }

    /// Trials read back or appended.
    pub fn len(&self) -> usize {
        self.done.len()
    }

    /// Whether the log holds no trial.
    pub fn is_empty(&self) -> bool {
        self.done.is_empty()
    }

    /// Appends one trial (one line, written and flushed at once).
    ///
    /// # Errors
    /// [`ModelError::Io`] if the line cannot be written.
    pub fn append(&mut self, method: &str, trial: usize, result: &TrialResult) -> Result<()> {
        let rec = LogRecord {
            method: method.to_string(),
            trial,
            result: result.clone(),
        };
        let mut line = serde_json::to_string(&rec)
            .map_err(|e| ModelError::bad_file(&self.path, e.to_string()))?;
        line.push('\n');
        self.file
            .write_all(line.as_bytes())
            .and_then(|()| self.file.flush())
            .map_err(|e| ModelError::io(&self.path, e))?;
        self.done.insert(
            slot(method, result.length, result.depth, trial),
            result.clone(),
        );
        Ok(())
    }
}

/// The header fields that differ, as `field: logged → now`.
fn differences(a: &LogHeader, b: &LogHeader) -> String {
    let (Ok(serde_json::Value::Object(x)), Ok(serde_json::Value::Object(y))) =
        (serde_json::to_value(a), serde_json::to_value(b))
    else {
        return "unreadable header".into();
    };
    x.iter()
        .filter(|(k, v)| y.get(*k) != Some(*v))
        .map(|(k, v)| format!("{k}: {v} → {}", y.get(k).cloned().unwrap_or_default()))
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> LogHeader {
        LogHeader {
            posenc_passkey_log: LOG_VERSION,
            model: "GGUF test".into(),
            tokenizer: "test".into(),
            format: "passkey (landmark)".into(),
            haystack: 0,
            seed: 7,
            products: "f32".into(),
            max_new_tokens: 10,
        }
    }

    fn result(length: usize, depth: f64) -> TrialResult {
        TrialResult {
            length,
            depth,
            key: 4242,
            prompt_tokens: length - 3,
            read: Some(4242),
            correct: true,
            logprob: -0.25,
            answer_tokens: 2,
            generated: " 4242. Remember it.".into(),
            prefilled: 100,
            seconds: 1.5,
        }
    }

    /// The path `name` (not created) in a fresh directory, and the guard
    /// that removes the directory when dropped.
    fn temp(name: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::Builder::new()
            .prefix("posenc-log-")
            .tempdir()
            .unwrap();
        let p = dir.path().join(name);
        (dir, p)
    }

    #[test]
    fn round_trip_and_resume() {
        let (_dir, p) = temp("rt");
        let mut log = TrialLog::open(&p, &header()).unwrap();
        assert!(log.is_empty());
        log.append("none", 0, &result(2048, 0.25)).unwrap();
        log.append("yarn:2", 1, &result(4096, 1.0)).unwrap();
        drop(log);
        // A run killed mid-line leaves a partial record: dropped.
        let mut f = OpenOptions::new().append(true).open(&p).unwrap();
        f.write_all(b"{\"method\":\"none\",\"tri").unwrap();
        drop(f);
        let mut log = TrialLog::open(&p, &header()).unwrap();
        assert_eq!(log.len(), 2);
        assert_eq!(log.get("none", 2048, 0.25, 0), Some(&result(2048, 0.25)));
        assert_eq!(log.get("yarn:2", 4096, 1.0, 1), Some(&result(4096, 1.0)));
        assert_eq!(log.get("none", 2048, 0.25, 1), None);
        log.append("none", 1, &result(2048, 0.25)).unwrap();
        drop(log);
        let text = std::fs::read_to_string(&p).unwrap();
        assert_eq!(text.lines().count(), 4);
        assert!(text.ends_with('\n'));
        assert_eq!(TrialLog::open(&p, &header()).unwrap().len(), 3);
    }

    #[test]
    fn refuses_other_settings_and_garbage() {
        let (_dir, p) = temp("other");
        TrialLog::open(&p, &header()).unwrap();
        let other = LogHeader {
            seed: 8,
            ..header()
        };
        let e = TrialLog::open(&p, &other).unwrap_err().to_string();
        assert!(e.contains("seed: 7 → 8"), "{e}");
        std::fs::write(&p, "not json\n").unwrap();
        let e = TrialLog::open(&p, &header()).unwrap_err().to_string();
        assert!(e.contains("line 1"), "{e}");
        let mut text = serde_json::to_string(&header()).unwrap();
        text.push_str("\n{\"method\": 3}\n");
        std::fs::write(&p, text).unwrap();
        let e = TrialLog::open(&p, &header()).unwrap_err().to_string();
        assert!(e.contains("line 2"), "{e}");
    }
}
