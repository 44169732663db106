//! NTK-alpha scaling (Hunyuan's "dynamic" with `alpha`).
//!
//! Tencent's Hunyuan checkpoints label their scaling `"type": "dynamic"` but
//! give a fixed `alpha`; transformers (`HunYuanDenseV1RotaryEmbedding`,
//! `rope_type` renamed `ntk_alpha`) and vLLM
//! (`DynamicNTKAlphaRotaryEmbedding`) both compute a fixed NTK-aware base
//! (bloc97 2023, see [`super::ntk`]) that does not depend on the sequence
//! length:
//!
//! ```text
//! base' = base · α^(d / (d − 2)),   θ_i = base'^(−2i/d)
//! ```
//!
//! When a `rope_scaling` of type `dynamic` has a non-zero `alpha`, posenc
//! reads it as this scaling (transformers' rule; `alpha` wins over `factor`,
//! as in vLLM). The attention factor is 1.

pub use super::ntk::{inv_freq, scaled_base};
