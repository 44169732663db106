//! Typed errors of the fine-tuning crate. Configurations are checked when a
//! [`crate::TrainableDecoder`] is built, inputs before any tensor is
//! computed; each failure is one of these variants, in one line.

/// Result alias of this crate.
pub type Result<T, E = TuneError> = std::result::Result<T, E>;

/// Everything that can go wrong while building or running a trainable
/// decoder.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TuneError {
    /// A LoRA rank of 0, or larger than a targeted layer's smaller
    /// dimension (the update `B·A` could not have that rank).
    #[error("LoRA rank {rank} is outside 1..={max} (the smaller dimension of {target})")]
    Rank {
        /// The rank asked for.
        rank: usize,
        /// The largest rank allowed.
        max: usize,
        /// The layer that bounds it (`q_proj`, ...; `any layer` for rank 0).
        target: &'static str,
    },
    /// A LoRA alpha that is not a finite number above 0.
    #[error("LoRA alpha {0} must be a finite number above 0")]
    Alpha(f64),
    /// A LoRA dropout probability outside `[0, 1)`.
    #[error("LoRA dropout {0} must be in [0, 1)")]
    Dropout(f64),
    /// No LoRA target.
    #[error("LoRA needs at least one target module (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj)")]
    NoTargets,
    /// A LoRA target given twice.
    #[error("LoRA target {0} is given twice")]
    DuplicateTarget(&'static str),
    /// A LoRA target name that is not a projection of these decoders.
    #[error("unknown LoRA target {0:?}: use q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj or down_proj")]
    UnknownTarget(String),
    /// A parameter name that is not one of the model's trainable
    /// parameters.
    #[error("no trainable parameter named {0:?}")]
    UnknownParameter(String),
    /// Values of the wrong size for a parameter.
    #[error("parameter {name} holds {expected} values ({shape:?}), {got} given")]
    ParameterSize {
        /// The parameter.
        name: String,
        /// Its shape.
        shape: Vec<usize>,
        /// Its number of values.
        expected: usize,
        /// The number given.
        got: usize,
    },
    /// Tokens or position ids that cannot be run (empty, of different
    /// lengths, a token outside the vocabulary, too short for a loss).
    #[error("{0}")]
    Input(String),
    /// A RoPE scaling this crate does not train through (a training-free
    /// attention method such as Self-Extend).
    #[error(
        "scaling {0:?}: training runs plain attention; attention methods are for inference only"
    )]
    Scaling(String),
    /// An error from posenc-models (loading, config, scaling).
    #[error(transparent)]
    Model(#[from] posenc_models::ModelError),
    /// An error from posenc (RoPE, attention).
    #[error(transparent)]
    Posenc(#[from] posenc::Error),
    /// An error from candle.
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}
