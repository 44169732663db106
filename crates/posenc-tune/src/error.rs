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
    #[error("{}", rank_message(*rank, *max, target))]
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
    /// A LoRA scale (`alpha/r`, `alpha/√r` with rsLoRA) outside
    /// [[`crate::lora::MIN_SCALE`], [`crate::lora::MAX_SCALE`]].
    #[error(
        "LoRA scale {} = {scale:e} is outside [{}, {}] (published adapters use 1/4 to a few; lora_alpha or r is implausible)",
        if *rslora { "lora_alpha/√r" } else { "lora_alpha/r" },
        crate::lora::MIN_SCALE,
        crate::lora::MAX_SCALE
    )]
    Scale {
        /// The scale.
        scale: f64,
        /// Whether it is rsLoRA's `alpha/√r`.
        rslora: bool,
    },
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
    #[error("unknown LoRA target {}: use q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj or down_proj", posenc_models::safe::quote(.0))]
    UnknownTarget(String),
    /// A parameter name that is not one of the model's trainable
    /// parameters.
    #[error("no trainable parameter named {}", posenc_models::safe::quote(.0))]
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
    /// A PoSE window that cannot cover its target length: below 2 tokens,
    /// or not shorter than the target (PoSE trains positions beyond the
    /// window; a window as long as the target is plain fine-tuning).
    #[error("PoSE window {window} must be in 2..{target} (below the target length {target})")]
    PoseWindow {
        /// Tokens per window.
        window: usize,
        /// The length the position ids cover.
        target: usize,
    },
    /// A text whose training part (its first 90%) is shorter than one
    /// training window.
    #[error("the text's training part (its first 90%) has {have} tokens, fewer than the {need} of one training window")]
    TextTooShort {
        /// Tokens one window reads.
        need: usize,
        /// Tokens of the training part.
        have: usize,
    },
    /// A training option out of range (steps, learning rate, warm-up,
    /// batch, clipping, weight decay, checkpoint interval).
    #[error("{0}")]
    Config(String),
    /// An adapter (PEFT layout) whose configuration, tensor names or shapes
    /// do not fit the model, or that cannot be read.
    #[error("adapter {}: {reason}", posenc_models::safe::path(path))]
    Adapter {
        /// The adapter's directory or file.
        path: std::path::PathBuf,
        /// What does not fit.
        reason: String,
    },
    /// A training checkpoint that is corrupt, torn, or of another run.
    #[error("checkpoint {}: {reason}", posenc_models::safe::path(path))]
    Checkpoint {
        /// The checkpoint directory.
        path: std::path::PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The training loss became NaN or infinite.
    #[error("training diverged at step {step} (loss {loss}); lower --lr")]
    Diverged {
        /// The step whose loss was not finite.
        step: usize,
        /// That loss.
        loss: f64,
    },
    /// A file could not be read or written.
    #[error("{}: {source}", posenc_models::safe::path(path))]
    Io {
        /// The file.
        path: std::path::PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// An error from the shared ops and optimiser (posenc-nn).
    #[error(transparent)]
    Nn(#[from] posenc_nn::NnError),
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

impl TuneError {
    /// An I/O error on `path`.
    pub fn io(path: &std::path::Path, source: std::io::Error) -> TuneError {
        TuneError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

fn rank_message(rank: usize, max: usize, target: &str) -> String {
    if rank == 0 {
        "LoRA rank 0: the rank must be at least 1".into()
    } else {
        format!("LoRA rank {rank} is outside 1..={max} (the smaller dimension of {target})")
    }
}
