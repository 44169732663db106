//! NoPE: no positional encoding at all.
//!
//! Kazemnejad et al. (2023), *The Impact of Positional Encoding on Length
//! Generalization in Transformers*, and Haviv et al. (2022), *Transformer
//! Language Models without Positional Encodings Still Learn Positional
//! Information*: a causal decoder can infer positions from its attention
//! mask alone (the number of visible tokens changes with position), while a
//! bidirectional encoder without positions is permutation-equivariant and
//! cannot tell "the mother loves the daughter" from "the daughter loves the
//! mother".
//!
//! NoPE uses no hook: attention calls nothing.
//!
//! ```
//! use posenc::{nope::NoPe, PositionalEncoding, Hooks};
//! assert_eq!(NoPe.hooks(), Hooks::NONE);
//! ```

use crate::encoding::{positional_encoding, Hooks};

/// The absence of a positional encoding.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NoPe;

positional_encoding!(NoPe, Hooks::NONE, "NoPE");
