//! Typed errors of the pretrained-model crate. Every check on a model file,
//! a config, a text or a length happens before anything large is
//! allocated, and reports one of these variants in one line.

use std::path::PathBuf;

/// Result alias of this crate.
pub type Result<T, E = ModelError> = std::result::Result<T, E>;

/// Everything that can go wrong while loading or running a pretrained model.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    /// A file could not be opened or read.
    #[error("cannot read {}: {source}", crate::safe::path(path))]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A model file is not what it claims to be (truncated, foreign, a
    /// tensor with the wrong shape or type).
    #[error("{}: {reason}", crate::safe::path(path))]
    BadFile {
        /// The file.
        path: PathBuf,
        /// What is wrong with it (strings from the file escaped with
        /// [`crate::safe`]).
        reason: String,
    },
    /// The architecture is not one this crate runs.
    #[error("unsupported architecture {}: posenc runs {}", crate::safe::quote(name), SUPPORTED.join(", "))]
    Unsupported {
        /// The architecture as the file names it.
        name: String,
    },
    /// A path that is not a regular file (a FIFO, a character or block
    /// device, a socket, a directory where a file is expected), refused by
    /// its type before it is opened for reading.
    #[error(
        "{}: a {kind}, not a regular file (refused without reading it)",
        crate::safe::path(path)
    )]
    NotAFile {
        /// The path.
        path: PathBuf,
        /// What it is instead.
        kind: &'static str,
    },
    /// A forward pass produced a non-finite value (NaN or infinity).
    #[error("{0}")]
    NonFinite(String),
    /// A config value is missing or out of range.
    #[error("invalid model config: {0}")]
    Config(String),
    /// No tokenizer could be found or built.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// An argument is invalid (a scaling name, a length, a text).
    #[error("{0}")]
    Invalid(String),
    /// A length whose forward pass would not fit in memory, refused before
    /// anything is allocated.
    #[error("a window of {len} tokens needs about {need_mb} MB, over the {budget_mb} MB available ({why})")]
    TooLong {
        /// The length asked for.
        len: usize,
        /// Estimated peak memory, MB.
        need_mb: u64,
        /// The budget, MB.
        budget_mb: u64,
        /// Where the budget comes from.
        why: String,
    },
    /// An error from posenc (RoPE configuration, attention).
    #[error(transparent)]
    Posenc(#[from] posenc::Error),
    /// An error from candle.
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}

/// The architectures this crate runs (Hugging Face `model_type` / GGUF
/// `general.architecture`).
pub const SUPPORTED: &[&str] = &["llama", "mistral", "qwen2"];

/// The shared ops' errors (posenc-nn: RMSNorm, SwiGLU, cross-entropy on
/// candle tensors) as this crate's own variants.
impl From<posenc_nn::NnError> for ModelError {
    fn from(e: posenc_nn::NnError) -> Self {
        match e {
            posenc_nn::NnError::Invalid(m) => ModelError::Invalid(m),
            posenc_nn::NnError::Posenc(e) => ModelError::Posenc(e),
            posenc_nn::NnError::Candle(e) => ModelError::Candle(e),
        }
    }
}

impl ModelError {
    pub(crate) fn bad_file(path: &std::path::Path, reason: impl Into<String>) -> Self {
        ModelError::BadFile {
            path: path.to_path_buf(),
            reason: reason.into(),
        }
    }

    pub(crate) fn io(path: &std::path::Path, source: std::io::Error) -> Self {
        ModelError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}
