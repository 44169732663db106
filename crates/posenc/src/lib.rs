//! # posenc — positional encodings for transformers
//!
//! Attention is permutation-equivariant: without position information a
//! transformer sees a bag of tokens. posenc implements every way of putting
//! positions back, exactly and fast:
//!
//! - **absolute** encodings added to the input embeddings ([`absolute`]):
//!   sinusoidal (Vaswani et al. 2017, both layouts), learned, FLOATER
//!   (Liu et al. 2020);
//! - **relative** encodings inside attention ([`relative`]): Shaw et al.
//!   (2018), T5 buckets (Raffel et al. 2020), ALiBi (Press et al. 2022),
//!   and the learned biases FIRE (Li et al. 2024), CoPE (Golovneva et al.
//!   2024) and forgetting attention (Lin et al. 2025);
//! - **rotary** encodings on queries and keys ([`rope`]): RoPE (Su et al.
//!   2021) with every Hugging Face scaling (linear, dynamic NTK, YaRN,
//!   LongRoPE, Llama 3, ...), read straight from a model's `config.json`,
//!   and xPos;
//! - **NoPE** ([`nope`]): none at all.
//!
//! The place where each one acts is part of its type: see [`encoding`].
//!
//! Formulas are plain Rust, in `f64` where precision matters; the candle
//! tensor API sits on top of them ([`tensor`]).
#![warn(missing_docs)]

pub mod absolute;
pub mod analysis;
pub mod buffers;
pub mod encoding;
pub mod error;
pub mod extend;
pub mod kernels;
pub mod nope;
pub mod relative;
pub mod rope;
pub mod tensor;

/// `Display` for a type with an `as_str(self) -> &'static str`: the
/// name it gives.
macro_rules! display_as_str {
    ($ty:ty) => {
        impl std::fmt::Display for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}
pub(crate) use display_as_str;

pub use encoding::{
    AbsoluteEncoding, AttentionBias, Hook, Hooks, PositionalEncoding, RotaryEncoding,
};
pub use error::{Error, Result};

/// The README's examples, compiled and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;

/// The pages of `docs/`, compiled as doc tests: any Rust block in them runs
/// (`crates/posenc-cli/tests/docs_commands.rs` checks that every page is
/// listed here, and the `posenc` command lines of their shell blocks).
#[cfg(doctest)]
pub mod docs_doctests {
    #[doc = include_str!("../../../docs/exactness.md")]
    pub struct Exactness;
    #[doc = include_str!("../../../docs/explorer.md")]
    pub struct Explorer;
    #[doc = include_str!("../../../docs/kernels.md")]
    pub struct Kernels;
    #[doc = include_str!("../../../docs/lab.md")]
    pub struct Lab;
    #[doc = include_str!("../../../docs/finetune.md")]
    pub struct Finetune;
    #[doc = include_str!("../../../docs/layout.md")]
    pub struct Layout;
    #[doc = include_str!("../../../docs/long-context.md")]
    pub struct LongContext;
    #[doc = include_str!("../../../docs/models.md")]
    pub struct Models;
    #[doc = include_str!("../../../docs/python.md")]
    pub struct Python;
    #[doc = include_str!("../../../docs/report.md")]
    pub struct Report;
    #[doc = include_str!("../../../docs/speed.md")]
    pub struct Speed;
    #[doc = include_str!("../../../docs/transformers.md")]
    pub struct Transformers;
    #[doc = include_str!("../../../docs/verdicts.md")]
    pub struct Verdicts;
}
