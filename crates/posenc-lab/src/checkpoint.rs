//! What a checkpoint records: its model and run ([`CheckpointMeta`]), what
//! fine-tuning made it from another one ([`FinetuneRecord`]) with the RoPE
//! scaling kept in its forward pass ([`ScalingSpec`]), and the seed of each
//! step's batch ([`batch_seed`]). Plain data, read by both
//! [`train`](crate::train) and [`finetune`](mod@crate::finetune) (neither depends
//! on the other for it).

use serde::{Deserialize, Serialize};

use crate::bpe::Tokenization;
use crate::config::{ModelConfig, TrainConfig};
use crate::error::LabError;
use crate::model::EvalScaling;

pub use posenc::rope::FactorScaling;
pub use posenc_nn::data::batch_seed;

/// What a checkpoint's `config.json` holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckpointMeta {
    /// The model's shape and encoding.
    pub model: ModelConfig,
    /// The run.
    pub train: TrainConfig,
    /// Steps completed.
    pub step: usize,
    /// posenc-lab version that wrote it.
    pub version: String,
    /// What fine-tuning made this checkpoint from another one (`None` for a
    /// model trained from scratch). When it is set, [`train`](Self::train)
    /// describes the fine-tuning run (its length, steps, learning rate and
    /// batch; the seed stays the base's, which also seeds evaluation), and
    /// training continues with the fine-tune's scaling and data stream.
    /// Absent from checkpoints written before fine-tuning existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finetune: Option<FinetuneRecord>,
    /// How the corpus of `lm` and `mlm` is tokenised (absent: characters,
    /// as every checkpoint written before subword tokens). A BPE
    /// checkpoint keeps its tokenizer beside it as `tokenizer.json`.
    #[serde(default, skip_serializing_if = "Tokenization::is_chars")]
    pub tokens: Tokenization,
}

/// Stream of [`batch_seed`] the fine-tuning batches come from.
pub const FINETUNE_STREAM: u64 = 5;

/// Mixed into the seed of the fine-tuning batches.
pub(crate) const FINETUNE_SALT: u64 = 0xF1AE;

/// A RoPE scaling that can be saved in a checkpoint and rebuilt:
/// `kind` with `factor` for a model whose positions were trained up to
/// `original_len` (built by [`EvalScaling::new`]). The kind is saved by
/// name (`"linear"`, `"ntk"`, `"dynamic"`, `"yarn"`), the factor apart: it
/// is stretched with the evaluation length ([`ScalingSpec::stretched`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScalingSpec {
    /// The scaling's family (posenc's [`FactorScaling`]).
    pub kind: FactorScaling,
    /// Its factor (≥ 1).
    pub factor: f64,
    /// The length the unscaled model was trained at.
    pub original_len: usize,
}

impl ScalingSpec {
    /// A scaling `kind` with `factor` over a model trained at
    /// `original_len`.
    ///
    /// # Errors
    /// [`LabError::Invalid`] if `factor` is not finite and ≥ 1 or
    /// `original_len` is 0.
    pub fn new(kind: FactorScaling, factor: f64, original_len: usize) -> Result<Self, LabError> {
        if !(factor.is_finite() && factor >= 1.0) {
            return Err(LabError::Invalid(format!(
                "scaling factor must be finite and >= 1, got {factor}"
            )));
        }
        if original_len == 0 {
            return Err(LabError::Invalid(
                "the original length of a scaling must be at least 1".into(),
            ));
        }
        Ok(ScalingSpec {
            kind,
            factor,
            original_len,
        })
    }

    /// The scaling that stretches a model trained at `original_len` to
    /// `len`: factor `max(1, len / original_len)`, the rule of
    /// `posenc eval --scaling`.
    pub fn for_length(
        kind: FactorScaling,
        len: usize,
        original_len: usize,
    ) -> Result<Self, LabError> {
        if original_len == 0 {
            return Self::new(kind, 1.0, 0);
        }
        Self::new(
            kind,
            (len as f64 / original_len as f64).max(1.0),
            original_len,
        )
    }

    /// The same scaling at evaluation length `len`: its factor, grown to
    /// `len / original_len` when `len` is past what it covers.
    pub fn stretched(&self, len: usize) -> Self {
        ScalingSpec {
            factor: self
                .factor
                .max(len as f64 / self.original_len.max(1) as f64),
            ..self.clone()
        }
    }

    /// Builds the RoPE of this scaling for `model`.
    ///
    /// # Errors
    /// [`LabError::Invalid`] if the model does not use RoPE.
    pub fn build(&self, model: &ModelConfig) -> Result<EvalScaling, LabError> {
        EvalScaling::new(model, self.kind.with_factor(self.factor), self.original_len)
    }

    /// `linear ×2 (from 32)`.
    pub fn label(&self) -> String {
        format!(
            "{} ×{} (from {})",
            self.kind.name(),
            self.factor,
            self.original_len
        )
    }
}

/// What a fine-tune did, saved in the checkpoint's `config.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FinetuneRecord {
    /// The base checkpoint's directory, when it was loaded from one.
    pub base: Option<String>,
    /// Steps the base model had been trained for.
    pub base_step: usize,
    /// The base model's run (its training length, steps, schedule, seed).
    pub base_train: TrainConfig,
    /// The base's own fine-tune, when a fine-tuned model was fine-tuned
    /// again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_finetune: Option<Box<FinetuneRecord>>,
    /// The new training length.
    pub len: usize,
    /// Fine-tuning steps.
    pub steps: usize,
    /// Learning rate (constant after the warm-up).
    pub lr: f64,
    /// Linear warm-up steps.
    pub warmup: usize,
    /// Sequences per step.
    pub batch: usize,
    /// Seed of the fine-tuning batches.
    pub seed: u64,
    /// The RoPE scaling in the forward pass during fine-tuning, and by
    /// default afterwards (`None`: the model's own RoPE, or no RoPE).
    pub scaling: Option<ScalingSpec>,
}

impl FinetuneRecord {
    /// The seed of fine-tuning step `step`'s batch.
    pub fn batch_seed(&self, step: usize) -> u64 {
        batch_seed(self.seed ^ FINETUNE_SALT, step as u64, FINETUNE_STREAM)
    }
}
