//! # posenc-nn — the training ops below the lab and the pretrained decoders
//!
//! What the lab's tiny transformers (posenc-lab), the pretrained decoders
//! (posenc-models) and the fine-tuner (posenc-tune) share, so that none of
//! them depends on another for it:
//!
//! - [`ops`]: fused CPU ops (linear layers, LayerNorm, RMSNorm, GELU,
//!   SwiGLU, cross-entropy), each a candle op with its backward pass, beside
//!   the composed candle reference it is tested against;
//! - [`loss`]: loss per position on plain logits (`nll_rows`, `log_sum_exp`);
//! - [`optim`]: AdamW with named, saveable state, and gradient clipping;
//! - [`data`]: the seeds of training batches and the validation split of a
//!   text;
//! - [`train`]: what the two training loops share (the metrics line, the
//!   run's clock and progress line, the output directory check).
//!
//! Its errors are one [`NnError`].
#![warn(missing_docs)]

pub mod data;
mod error;
pub mod loss;
pub mod ops;
pub mod optim;
pub mod train;

pub use error::NnError;
