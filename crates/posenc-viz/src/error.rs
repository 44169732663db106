//! Typed errors.

use std::path::PathBuf;

/// Everything that can go wrong while building, measuring or drawing an
/// encoding. Each variant's message is one line, fit to show a user.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VizError {
    /// An invalid spec, option or value, with the reason (`unknown encoding
    /// "x"; known: ...`, `invalid dim = 0: must be at least 1`, ...).
    #[error("{0}")]
    Invalid(String),
    /// The posenc library refused a value.
    #[error(transparent)]
    Posenc(#[from] posenc::Error),
    /// A figure could not be built or rendered.
    #[error(transparent)]
    Plot(#[from] posenc_plot::PlotError),
    /// A lab checkpoint could not be loaded.
    #[error(transparent)]
    Lab(#[from] posenc_lab::LabError),
    /// The measurements could not be serialised.
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    /// A file could not be written.
    #[error("cannot write {}: {source}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
}

/// Result of this crate.
pub type Result<T, E = VizError> = std::result::Result<T, E>;

/// An [`VizError::Invalid`] with this message.
pub(crate) fn invalid(msg: impl Into<String>) -> VizError {
    VizError::Invalid(msg.into())
}
