//! Typed configuration of a lab model and of its training run, saved beside
//! every checkpoint as JSON. The run names its task by kind ([`TaskKind`];
//! the generators are in `tasks`).

use serde::{Deserialize, Serialize};

use crate::error::LabError;

/// Which positional encoding the model uses, and at which hook it enters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum PeConfig {
    /// No positional encoding.
    Nope,
    /// Sinusoidal, added at the input.
    Sinusoidal {
        /// `true`: [sin | cos] halves; `false`: interleaved (the introductory articles').
        concatenated: bool,
    },
    /// Learned absolute table of `max_positions` rows, added at the input.
    Learned {
        /// Table size (positions past it are an error).
        max_positions: usize,
    },
    /// FLOATER: positions from a learned ODE, added at the input.
    Floater,
    /// RoPE on queries and keys.
    Rope {
        /// Base θ.
        theta: f64,
        /// Fraction of each head that is rotated (1.0 = all).
        partial: f64,
        /// Interleaved pairs (GPT-J) instead of half-split (NeoX/Llama).
        interleaved: bool,
    },
    /// xPos: RoPE with a per-pair decay on queries and keys.
    Xpos {
        /// Base θ.
        theta: f64,
        /// xPos scale base (512 in the paper).
        scale_base: f64,
    },
    /// ALiBi linear biases on the logits.
    Alibi,
    /// T5 bucketed relative bias on the logits (table shared by all layers).
    T5 {
        /// Number of buckets.
        buckets: usize,
        /// Distance where the last bucket starts.
        max_distance: usize,
    },
    /// Shaw et al. relative keys and values, per layer.
    Shaw {
        /// Clipping distance k.
        k: usize,
    },
    /// RoPE in most layers and none in every `interval`-th (Llama 4's iRoPE:
    /// `interval` 4, RoPE in three layers of four).
    Irope {
        /// Base θ.
        theta: f64,
        /// Every `interval`-th layer has no positional encoding.
        interval: usize,
    },
    /// FIRE (Li et al. 2024): an MLP of the log-transformed relative distance
    /// with progressive interpolation, one module shared by all layers (as
    /// T5's table), added to the logits.
    Fire,
    /// CoPE (Golovneva et al. 2024): positions counted by gates on the
    /// context, per layer, added to the logits.
    Cope {
        /// Position embeddings (counts are clamped below it).
        npos_max: usize,
    },
    /// Forgetting attention (Lin et al. 2025): cumulative log-sigmoid forget
    /// gates of each layer's input, `c_i − c_j`, added to the logits
    /// (decoders only).
    Fox,
}

impl PeConfig {
    /// The names accepted by [`PeConfig::parse`].
    pub const NAMES: [&'static str; 15] = [
        "nope",
        "sinusoidal",
        "sinusoidal-concat",
        "learned",
        "floater",
        "rope",
        "rope-interleaved",
        "xpos",
        "alibi",
        "t5",
        "shaw",
        "irope",
        "fire",
        "cope",
        "fox",
    ];

    /// Parses a command-line name, with the model's maximum length for the
    /// learned table and `shaw_k` for Shaw's clipping distance.
    pub fn parse(name: &str, max_len: usize, shaw_k: usize) -> Result<Self, LabError> {
        Ok(match name {
            "nope" => PeConfig::Nope,
            "sinusoidal" => PeConfig::Sinusoidal {
                concatenated: false,
            },
            "sinusoidal-concat" => PeConfig::Sinusoidal { concatenated: true },
            "learned" => PeConfig::Learned {
                max_positions: max_len,
            },
            "floater" => PeConfig::Floater,
            "rope" => PeConfig::Rope {
                theta: 10000.0,
                partial: 1.0,
                interleaved: false,
            },
            "rope-interleaved" => PeConfig::Rope {
                theta: 10000.0,
                partial: 1.0,
                interleaved: true,
            },
            "xpos" => PeConfig::Xpos {
                theta: 10000.0,
                scale_base: 512.0,
            },
            "alibi" => PeConfig::Alibi,
            "t5" => PeConfig::T5 {
                buckets: 32,
                max_distance: 128,
            },
            "shaw" => PeConfig::Shaw { k: shaw_k },
            "irope" => PeConfig::Irope {
                theta: 10000.0,
                interval: 4,
            },
            "fire" => PeConfig::Fire,
            "cope" => PeConfig::Cope {
                npos_max: max_len.max(2),
            },
            "fox" => PeConfig::Fox,
            _ => {
                return Err(LabError::Invalid(format!(
                    "unknown positional encoding {name:?}; known: {}",
                    Self::NAMES.join(", ")
                )))
            }
        })
    }

    /// A short name for tables and file names.
    pub fn label(&self) -> String {
        match self {
            PeConfig::Nope => "nope".into(),
            PeConfig::Sinusoidal { concatenated } => {
                with_suffix("sinusoidal", *concatenated, "-concat")
            }
            PeConfig::Learned { .. } => "learned".into(),
            PeConfig::Floater => "floater".into(),
            PeConfig::Rope { interleaved, .. } => with_suffix("rope", *interleaved, "-interleaved"),
            PeConfig::Xpos { .. } => "xpos".into(),
            PeConfig::Alibi => "alibi".into(),
            PeConfig::T5 { .. } => "t5".into(),
            PeConfig::Shaw { k } => format!("shaw-k{k}"),
            PeConfig::Irope { .. } => "irope".into(),
            PeConfig::Fire => "fire".into(),
            PeConfig::Cope { .. } => "cope".into(),
            PeConfig::Fox => "fox".into(),
        }
    }
}

/// Encoder (bidirectional, classification head), decoder (causal,
/// next-token head) or token encoder (bidirectional, per-token head).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Bidirectional attention, mean-pooled classification head.
    Encoder,
    /// Causal attention, next-token head.
    Decoder,
    /// Bidirectional attention, per-token head over the vocabulary (masked
    /// language modelling, BERT).
    #[serde(rename = "token-encoder")]
    TokenEncoder,
}

/// The shape of a lab transformer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelConfig {
    /// Encoder or decoder.
    pub mode: Mode,
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Number of outputs (classes, or vocabulary size).
    pub num_outputs: usize,
    /// Model width (default 128).
    pub d_model: usize,
    /// Number of blocks (default 4).
    pub n_layers: usize,
    /// Number of attention heads (default 4).
    pub n_heads: usize,
    /// MLP hidden width (default 4 × d_model).
    pub d_ff: usize,
    /// Tie the output head to the token embedding (decoder only).
    pub tied: bool,
    /// The positional encoding.
    pub pe: PeConfig,
}

impl ModelConfig {
    /// Checks the shape.
    pub fn validate(&self) -> Result<(), LabError> {
        let bad = |m: String| Err(LabError::Invalid(m));
        if self.d_model == 0 || self.n_layers == 0 || self.n_heads == 0 || self.d_ff == 0 {
            return bad("d_model, layers, heads and d_ff must all be at least 1".into());
        }
        if !self.d_model.is_multiple_of(self.n_heads) {
            return bad(format!(
                "d_model = {} is not divisible by heads = {}",
                self.d_model, self.n_heads
            ));
        }
        let hd = self.d_model / self.n_heads;
        if matches!(
            self.pe,
            PeConfig::Rope { .. } | PeConfig::Xpos { .. } | PeConfig::Irope { .. }
        ) && !hd.is_multiple_of(2)
        {
            return bad(format!(
                "head dimension {hd} must be even for rotary encodings"
            ));
        }
        if let PeConfig::Rope { partial, .. } = self.pe {
            let rd = (hd as f64 * partial) as usize;
            if !(partial > 0.0 && partial <= 1.0) || rd == 0 || !rd.is_multiple_of(2) {
                return bad(format!(
                    "partial rotary fraction {partial} gives an invalid rotary dimension {rd} (head dimension {hd})"
                ));
            }
        }
        if matches!(self.pe, PeConfig::Sinusoidal { .. }) && !self.d_model.is_multiple_of(2) {
            return bad(format!(
                "d_model = {} must be even for sinusoidal",
                self.d_model
            ));
        }
        if self.vocab_size == 0 || self.num_outputs == 0 {
            return bad("empty vocabulary".into());
        }
        if let PeConfig::Irope { interval, .. } = self.pe {
            if interval == 0 {
                return bad("irope interval must be at least 1".into());
            }
        }
        if let PeConfig::Cope { npos_max } = self.pe {
            if !(2..=1 << 16).contains(&npos_max) {
                return bad(format!("CoPE npos_max {npos_max} must be in 2..=65536"));
            }
        }
        if self.pe == PeConfig::Fox && self.mode != Mode::Decoder {
            return bad(
                "forgetting attention (fox) is causal: it needs a decoder (a bidirectional model would see c_i − c_j grow for keys after the query)"
                    .into(),
            );
        }
        Ok(())
    }

    /// Head dimension.
    pub fn head_dim(&self) -> usize {
        self.d_model / self.n_heads
    }
}

/// The built-in tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TaskKind {
    /// Copy the content after the separator.
    Copy,
    /// Reverse it.
    Reverse,
    /// Sort it.
    Sort,
    /// Count occurrences of a queried token.
    Count,
    /// Multi-digit addition.
    Addition,
    /// Order-sensitive classification (encoder).
    Order,
    /// Character-level language modelling.
    Lm,
    /// Character-level masked language modelling (encoder, per-token head).
    Mlm,
}

impl TaskKind {
    /// Every task, in a fixed order.
    pub const ALL: [TaskKind; 8] = [
        TaskKind::Copy,
        TaskKind::Reverse,
        TaskKind::Sort,
        TaskKind::Count,
        TaskKind::Addition,
        TaskKind::Order,
        TaskKind::Lm,
        TaskKind::Mlm,
    ];

    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            TaskKind::Copy => "copy",
            TaskKind::Reverse => "reverse",
            TaskKind::Sort => "sort",
            TaskKind::Count => "count",
            TaskKind::Addition => "addition",
            TaskKind::Order => "order",
            TaskKind::Lm => "lm",
            TaskKind::Mlm => "mlm",
        }
    }

    /// Parses a name.
    pub fn parse(s: &str) -> Result<Self, LabError> {
        Self::ALL
            .into_iter()
            .find(|t| t.name() == s)
            .ok_or_else(|| {
                LabError::Invalid(format!(
                    "unknown task {s:?}; known tasks: {}",
                    Self::ALL.map(|t| t.name()).join(", ")
                ))
            })
    }

    /// Whether the task is a sequence classification (encoder) task.
    pub fn is_classification(self) -> bool {
        matches!(self, TaskKind::Order)
    }

    /// Whether the task reads a character corpus (`lm`, `mlm`).
    pub fn uses_corpus(self) -> bool {
        matches!(self, TaskKind::Lm | TaskKind::Mlm)
    }

    /// The model mode the task trains: [`Mode::Encoder`] for
    /// classification, [`Mode::TokenEncoder`] for masked language
    /// modelling, [`Mode::Decoder`] for the rest.
    pub fn mode(self) -> Mode {
        match self {
            TaskKind::Order => Mode::Encoder,
            TaskKind::Mlm => Mode::TokenEncoder,
            _ => Mode::Decoder,
        }
    }
}

/// A training run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainConfig {
    /// The task.
    pub task: TaskKind,
    /// Number of content symbols of synthetic tasks.
    pub n_symbols: u32,
    /// Training sequence length.
    pub train_len: usize,
    /// Optimiser steps.
    pub steps: usize,
    /// Sequences per step.
    pub batch: usize,
    /// Peak learning rate.
    pub lr: f64,
    /// Linear warm-up steps.
    pub warmup: usize,
    /// Final learning rate, as a fraction of the peak (cosine decay).
    pub min_lr_frac: f64,
    /// AdamW weight decay.
    pub weight_decay: f64,
    /// Global gradient-norm clip (0 disables it).
    pub grad_clip: f64,
    /// Seed of the weights and the data.
    pub seed: u64,
    /// Log every this many steps.
    pub log_every: usize,
    /// Corpus file for `lm` and `mlm` (None: the built-in grammar).
    pub corpus: Option<std::path::PathBuf>,
}

impl TrainConfig {
    /// Checks the run's numbers.
    pub fn validate(&self) -> Result<(), LabError> {
        let bad = |m: &str| Err(LabError::Invalid(m.into()));
        if self.steps == 0 || self.batch == 0 || self.train_len == 0 {
            return bad("steps, batch and train_len must be at least 1");
        }
        if !(self.lr.is_finite() && self.lr > 0.0) {
            return bad("learning rate must be finite and > 0");
        }
        if !(0.0..=1.0).contains(&self.min_lr_frac) {
            return bad("min_lr_frac must be in [0, 1]");
        }
        if !(self.grad_clip.is_finite() && self.grad_clip >= 0.0) {
            return bad("grad_clip must be finite and >= 0");
        }
        if self.log_every == 0 {
            return bad("log_every must be at least 1");
        }
        Ok(())
    }

    /// Learning rate at `step` (0-based): linear warm-up, then cosine decay
    /// to `min_lr_frac × lr`.
    pub fn lr_at(&self, step: usize) -> f64 {
        if step < self.warmup {
            return self.lr * (step + 1) as f64 / self.warmup as f64;
        }
        let span = (self.steps.saturating_sub(self.warmup)).max(1) as f64;
        let t = ((step - self.warmup) as f64 / span).min(1.0);
        let min = self.lr * self.min_lr_frac;
        min + 0.5 * (self.lr - min) * (1.0 + (std::f64::consts::PI * t).cos())
    }
}

/// `name`, with `suffix` after it when `flag` is set.
fn with_suffix(name: &str, flag: bool, suffix: &str) -> String {
    if flag {
        format!("{name}{suffix}")
    } else {
        name.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run() -> TrainConfig {
        TrainConfig {
            task: TaskKind::Copy,
            n_symbols: 8,
            train_len: 32,
            steps: 100,
            batch: 8,
            lr: 1e-3,
            warmup: 10,
            min_lr_frac: 0.1,
            weight_decay: 0.01,
            grad_clip: 1.0,
            seed: 0,
            log_every: 10,
            corpus: None,
        }
    }

    #[test]
    fn schedule_warms_up_then_decays() {
        let r = run();
        assert!((r.lr_at(0) - 1e-4).abs() < 1e-15);
        assert!((r.lr_at(9) - 1e-3).abs() < 1e-15);
        assert!((r.lr_at(10) - 1e-3).abs() < 1e-15);
        assert!((r.lr_at(100) - 1e-4).abs() < 1e-15);
        for s in 10..99 {
            assert!(r.lr_at(s + 1) <= r.lr_at(s));
        }
    }

    #[test]
    fn configs_validate_and_round_trip() {
        let m = ModelConfig {
            mode: Mode::Decoder,
            vocab_size: 24,
            num_outputs: 24,
            d_model: 64,
            n_layers: 2,
            n_heads: 4,
            d_ff: 256,
            tied: true,
            pe: PeConfig::parse("rope", 64, 4).unwrap(),
        };
        m.validate().unwrap();
        let s = serde_json::to_string(&m).unwrap();
        assert_eq!(serde_json::from_str::<ModelConfig>(&s).unwrap(), m);
        let mut bad = m.clone();
        bad.n_heads = 3;
        assert!(bad.validate().is_err());
        assert!(PeConfig::parse("bogus", 64, 4).is_err());
        for n in PeConfig::NAMES {
            assert!(PeConfig::parse(n, 64, 4).is_ok(), "{n}");
        }
        let mut r = run();
        r.lr = f64::NAN;
        assert!(r.validate().is_err());
    }
}
