//! Where a position enters a transformer, as types.
//!
//! Attention by itself is blind to order: permuting the tokens permutes its
//! outputs. A positional encoding breaks that symmetry at one (or more) of
//! three places, and each encoding in posenc implements the hook of the place
//! it uses:
//!
//! | place | hook | trait | encodings |
//! |---|---|---|---|
//! | the **input**: a vector added to each token embedding | [`Hook::Input`] | [`AbsoluteEncoding`] | sinusoidal, learned, FLOATER |
//! | the **queries and keys**: rotated by their positions in every layer | [`Hook::QueryKey`] | [`RotaryEncoding`] | RoPE (every scaling), xPos |
//! | the **attention logits** (and **values**): a term that depends on i − j | [`Hook::Logits`], [`Hook::Values`] | [`AttentionBias`] | ALiBi, T5 buckets, Shaw et al. |
//!
//! NoPE implements none of them ([`Hooks::NONE`]).

use crate::error::Result;

/// One place where a positional encoding can act.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Hook {
    /// Added to the input embeddings before the first block.
    Input,
    /// Applied to queries and keys (before their dot product) in every layer.
    QueryKey,
    /// Added to the attention logits q·k / √d before the softmax.
    Logits,
    /// Added to the values that attention averages (Shaw et al.'s a^V).
    Values,
}

/// The set of hooks an encoding uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Hooks {
    /// Uses [`Hook::Input`].
    pub input: bool,
    /// Uses [`Hook::QueryKey`].
    pub query_key: bool,
    /// Uses [`Hook::Logits`].
    pub logits: bool,
    /// Uses [`Hook::Values`].
    pub values: bool,
}

impl Hooks {
    /// No hook at all: NoPE.
    pub const NONE: Hooks = Hooks {
        input: false,
        query_key: false,
        logits: false,
        values: false,
    };
    /// Absolute encodings.
    pub const INPUT: Hooks = Hooks {
        input: true,
        ..Hooks::NONE
    };
    /// Rotary encodings.
    pub const QUERY_KEY: Hooks = Hooks {
        query_key: true,
        ..Hooks::NONE
    };
    /// Additive attention biases (ALiBi, T5).
    pub const LOGITS: Hooks = Hooks {
        logits: true,
        ..Hooks::NONE
    };
    /// Shaw et al.: relative keys in the logits and relative values.
    pub const LOGITS_AND_VALUES: Hooks = Hooks {
        logits: true,
        values: true,
        ..Hooks::NONE
    };

    /// Whether `hook` is in the set.
    pub fn contains(&self, hook: Hook) -> bool {
        match hook {
            Hook::Input => self.input,
            Hook::QueryKey => self.query_key,
            Hook::Logits => self.logits,
            Hook::Values => self.values,
        }
    }

    /// The hooks in the set, in the order input, queries/keys, logits, values.
    pub fn list(&self) -> Vec<Hook> {
        [Hook::Input, Hook::QueryKey, Hook::Logits, Hook::Values]
            .into_iter()
            .filter(|h| self.contains(*h))
            .collect()
    }
}

/// What every positional encoding says about itself.
pub trait PositionalEncoding {
    /// A short human-readable name, for example `sinusoidal (interleaved)`.
    fn name(&self) -> String;
    /// The places where this encoding acts.
    fn hooks(&self) -> Hooks;
}

/// Implements [`PositionalEncoding`] for a type from its hooks and its name:
/// `positional_encoding!(Type, Hooks::INPUT, "name")`, or with a name
/// computed from the value, `positional_encoding!(Type, Hooks::LOGITS, |s|
/// format!("... {}", s.heads))` (a `&str` or a `String`).
macro_rules! positional_encoding {
    ($ty:ty, $hooks:expr, $name:literal) => {
        $crate::encoding::positional_encoding!($ty, $hooks, |_this| $name);
    };
    ($ty:ty, $hooks:expr, |$this:ident| $name:expr) => {
        impl $crate::encoding::PositionalEncoding for $ty {
            fn name(&self) -> String {
                let $this = self;
                String::from($name)
            }
            fn hooks(&self) -> $crate::encoding::Hooks {
                $hooks
            }
        }
    };
}
pub(crate) use positional_encoding;

/// The input hook: a vector per position, added to the token embeddings.
pub trait AbsoluteEncoding: PositionalEncoding {
    /// Width of each position vector (the model dimension).
    fn dim(&self) -> usize;

    /// Writes the encoding of `position` into `out` (length [`dim`](Self::dim)).
    ///
    /// # Errors
    /// [`Error::Shape`](crate::Error::Shape) if `out` has the wrong length;
    /// [`Error::PositionOutOfRange`](crate::Error::PositionOutOfRange) for a
    /// position the encoding cannot represent.
    fn encode_into(&self, position: u64, out: &mut [f64]) -> Result<()>;

    /// The encoding of `position` as a new vector.
    fn encode(&self, position: u64) -> Result<Vec<f64>> {
        let mut v = vec![0.0; self.dim()];
        self.encode_into(position, &mut v)?;
        Ok(v)
    }

    /// One row per position.
    fn table(&self, positions: &[u64]) -> Result<Vec<Vec<f64>>> {
        positions.iter().map(|&p| self.encode(p)).collect()
    }
}

/// The query/key hook: queries and keys are transformed by their positions
/// so that their dot product depends on the positions' difference.
pub trait RotaryEncoding: PositionalEncoding {
    /// The head dimension this encoding applies to.
    fn head_dim(&self) -> usize;

    /// Transforms a query at `position` in place (length [`head_dim`](Self::head_dim)).
    fn apply_query(&self, q: &mut [f64], position: u64) -> Result<()>;

    /// Transforms a key at `position` in place. For plain RoPE this equals
    /// [`apply_query`](Self::apply_query); xPos scales keys by the inverse
    /// of the query scale.
    fn apply_key(&self, k: &mut [f64], position: u64) -> Result<()>;
}

/// The logits hook: an additive bias b_h(i, j) for query position i and key
/// position j, per head.
pub trait AttentionBias: PositionalEncoding {
    /// Number of heads the bias is defined for.
    fn num_heads(&self) -> usize;

    /// The bias added to head `head`'s logit for query position `query` and
    /// key position `key`. Positions a causal mask hides still get their
    /// formula's value; masking is attention's job.
    fn bias(&self, head: usize, query: u64, key: u64) -> Result<f64>;

    /// The (queries × keys) bias matrix of one head.
    fn bias_matrix(&self, head: usize, queries: &[u64], keys: &[u64]) -> Result<Vec<Vec<f64>>> {
        queries
            .iter()
            .map(|&q| keys.iter().map(|&k| self.bias(head, q, k)).collect())
            .collect()
    }
}
