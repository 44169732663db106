//! The error of the shared ops and the optimiser.

/// Errors of the ops, the optimiser and the losses: arguments that do not
/// fit (shapes, dtypes, an optimiser state of another model), candle and
/// posenc failures.
#[derive(Debug, thiserror::Error)]
pub enum NnError {
    /// An invalid argument, with the reason.
    #[error("{0}")]
    Invalid(String),
    /// An error from posenc.
    #[error(transparent)]
    Posenc(#[from] posenc::Error),
    /// An error from candle.
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}
