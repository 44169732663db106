//! The lab's one error type, below every other module of the crate.

/// Errors of the lab: bad arguments, corrupt checkpoints, candle failures.
#[derive(Debug, thiserror::Error)]
pub enum LabError {
    /// An invalid argument or configuration, with the reason.
    #[error("{0}")]
    Invalid(String),
    /// An error of the shared ops and the optimiser (posenc-nn), and of
    /// posenc and candle beneath them (one [`posenc_nn::NnError`]).
    #[error(transparent)]
    Nn(#[from] posenc_nn::NnError),
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: std::path::PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The training loss became NaN or infinite.
    #[error("training diverged at step {step} (loss {loss}); lower --lr")]
    Diverged {
        /// The step whose loss was not finite.
        step: usize,
        /// That loss.
        loss: f64,
    },
    /// A text too short for the BPE vocabulary asked for: its training
    /// part has too few pairs that occur twice to merge.
    #[error(
        "the text is too short for a BPE vocabulary of {vocab}: its training part ({chars} characters) gives only {learned} tokens; ask for a smaller bpe:N or a longer text"
    )]
    TextTooShort {
        /// The vocabulary asked for.
        vocab: usize,
        /// Tokens the training text supports.
        learned: usize,
        /// Characters of the training text.
        chars: usize,
    },
    /// A length whose forward pass would not fit the memory budget even for
    /// one sequence, refused before anything is allocated.
    #[error(
        "length {len} needs about {need_mb} MB for one sequence, over the {budget_mb} MB evaluation budget ({why})"
    )]
    TooLong {
        /// The length asked for.
        len: usize,
        /// Estimated peak memory of one sequence, in MB.
        need_mb: u64,
        /// The budget, in MB.
        budget_mb: u64,
        /// What grows with the length.
        why: &'static str,
    },
    /// A length past the rows of a learned absolute position table: the
    /// model has no encoding for those positions, so it can be neither
    /// fine-tuned nor run there.
    #[error(
        "cannot {action} at length {len}: the learned position table has {rows} rows (train with a larger --max-len)"
    )]
    LengthBeyondTable {
        /// What was asked (e.g. `fine-tune`).
        action: &'static str,
        /// The length asked for.
        len: usize,
        /// Rows of the table (the longest length the model can run at).
        rows: usize,
    },
}

impl From<posenc::Error> for LabError {
    fn from(e: posenc::Error) -> Self {
        LabError::Nn(e.into())
    }
}

impl From<candle_core::Error> for LabError {
    fn from(e: candle_core::Error) -> Self {
        LabError::Nn(e.into())
    }
}
