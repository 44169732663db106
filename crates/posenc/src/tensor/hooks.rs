//! The four places a position enters a transformer, as traits on tensors.
//!
//! | trait | where | implemented by |
//! |---|---|---|
//! | [`InputHook`] | added to the token embeddings | [`SinusoidalEmbedding`], [`LearnedEmbedding`], [`FloaterEmbedding`] |
//! | [`QueryKeyHook`] | applied to queries and keys in every layer | [`Rope`] (every scaling, xPos) |
//! | [`LogitsHook`] | added to the attention logits | [`Alibi`], [`T5RelativeBias`], [`ShawRelative`] (relative keys), [`DenseBias`], [`CumulativeBias`] |
//! | [`ValuesHook`] | added to the values attention averages | [`ShawRelative`] (relative values) |
//!
//! A model holds at most one hook per place and hands the last three to
//! [`Attention`](super::attention::Attention), which runs them inside its
//! fused kernel (or composes them in its reference path). Each hook
//! *describes* what it adds ([`Rotation`], [`LogitsBias`], [`ValueTerms`]);
//! the tensors inside a description (a T5 table, Shaw's tables, a dense
//! bias) keep their autograd identity, so gradients reach them through
//! either path. NoPE uses no hook.
//!
//! [`SinusoidalEmbedding`]: super::absolute::SinusoidalEmbedding
//! [`LearnedEmbedding`]: super::absolute::LearnedEmbedding
//! [`FloaterEmbedding`]: super::absolute::FloaterEmbedding
//! [`Rope`]: super::rope::Rope
//! [`Alibi`]: crate::relative::Alibi
//! [`T5RelativeBias`]: super::bias::T5RelativeBias
//! [`ShawRelative`]: super::bias::ShawRelative

use std::sync::Arc;

use candle_core::Tensor;

use super::absolute::{FloaterEmbedding, LearnedEmbedding, SinusoidalEmbedding};
use super::bias::{ShawRelative, T5RelativeBias};
use super::rope::{Rope, RotationTables};
use super::Positions;
use crate::error::Result;
use crate::kernels::attention::RelIndex;
use crate::relative::{Alibi, AlibiMode};

/// The input hook: a position vector added to each token embedding.
pub trait InputHook: Send + Sync {
    /// `x + PE(positions)` for `x` of shape `(B, T, D)`.
    ///
    /// # Errors
    /// The encoding's own (a position past a learned table, a shape
    /// mismatch).
    fn add_positions(&self, x: &Tensor, positions: Positions<'_>) -> Result<Tensor>;
}

impl InputHook for SinusoidalEmbedding {
    fn add_positions(&self, x: &Tensor, positions: Positions<'_>) -> Result<Tensor> {
        self.forward(x, positions)
    }
}

impl InputHook for LearnedEmbedding {
    fn add_positions(&self, x: &Tensor, positions: Positions<'_>) -> Result<Tensor> {
        self.forward(x, positions)
    }
}

impl InputHook for FloaterEmbedding {
    fn add_positions(&self, x: &Tensor, positions: Positions<'_>) -> Result<Tensor> {
        self.forward(x, positions)
    }
}

/// Where one attention call's queries and keys are.
#[derive(Debug, Clone, Copy)]
pub struct CallPositions<'a> {
    /// Batch size.
    pub batch: usize,
    /// Query steps.
    pub q_len: usize,
    /// Key steps.
    pub k_len: usize,
    /// Positions of the queries.
    pub q: Positions<'a>,
    /// Positions of the keys.
    pub k: Positions<'a>,
}

/// The query/key hook: rotates queries and keys by their positions.
pub trait QueryKeyHook: Send + Sync {
    /// The rotation tables for this call (the fused kernel rotates with
    /// them).
    ///
    /// # Errors
    /// The encoding's own (positions, frequency schedule).
    fn rotation(&self, at: &CallPositions<'_>) -> Result<Rotation>;

    /// The composed reference: rotated `q` `(B, H_q, T_q, D)` and `k`
    /// `(B, H_k, T_k, D)`.
    ///
    /// # Errors
    /// As [`rotation`](Self::rotation).
    fn rotate_reference(
        &self,
        q: &Tensor,
        k: &Tensor,
        at: &CallPositions<'_>,
    ) -> Result<(Tensor, Tensor)>;
}

/// What a [`QueryKeyHook`] does in one call: rotation tables and rows.
#[derive(Debug, Clone)]
pub struct Rotation {
    /// Tables and rows.
    pub tables: RotationTables,
}

impl QueryKeyHook for Rope {
    fn rotation(&self, at: &CallPositions<'_>) -> Result<Rotation> {
        Ok(Rotation {
            tables: self.attention_tables(at.q, at.k, at.batch, at.q_len, at.k_len)?,
        })
    }

    fn rotate_reference(
        &self,
        q: &Tensor,
        k: &Tensor,
        at: &CallPositions<'_>,
    ) -> Result<(Tensor, Tensor)> {
        use super::rope::Role;
        Ok((
            self.rotate_reference(q, at.q, Role::Query)?,
            self.rotate_reference(k, at.k, Role::Key)?,
        ))
    }
}

/// One additive term of the attention logits, as the fused kernel and the
/// reference path compute it. `r = pos_k − pos_q`.
#[derive(Debug, Clone)]
pub enum LogitsBias {
    /// ALiBi: `m_h·r` (causal) or `−m_h·|r|` (symmetric); no parameters.
    Alibi {
        /// One slope per query head.
        slopes: Vec<f64>,
        /// `−m·|r|`.
        symmetric: bool,
    },
    /// `table[idx(r), h]`: a learned scalar per bucket and head (T5).
    Bucketed {
        /// Bucket of each distance (saturating).
        index: Arc<RelIndex>,
        /// `(buckets, H_q)`, trainable.
        table: Tensor,
    },
    /// `q̃_i · a^K[idx(r)]` with the scaled, rotated query (Shaw et al.'s
    /// relative keys), shared by all heads.
    RelativeKeys {
        /// Row of each distance (saturating).
        index: Arc<RelIndex>,
        /// `(rows, D)`, trainable.
        keys: Tensor,
    },
    /// Any bias `(B or 1, H_q or 1, T_q, T_k)`.
    Dense(Tensor),
    /// `c_q[b, h, i] − c_k[b, h, j]` from `(B, H_q, T_q)` and `(B, H_q,
    /// T_k)` tensors (forgetting attention).
    Cumulative {
        /// `c` at the queries.
        q: Tensor,
        /// `c` at the keys.
        k: Tensor,
    },
}

/// What a call's geometry is, for hooks that build their terms for it.
#[derive(Debug, Clone, Copy)]
pub struct BiasContext<'a> {
    /// Positions.
    pub at: CallPositions<'a>,
    /// Query heads.
    pub q_heads: usize,
    /// Head dimension.
    pub head_dim: usize,
    /// The largest `|pos_k − pos_q|` of the call (tables indexed by distance
    /// need no rows past it).
    pub max_distance: usize,
    /// Whether the attention is causal.
    pub causal: bool,
}

/// The logits hook.
pub trait LogitsHook: Send + Sync {
    /// The term this hook adds in this call.
    ///
    /// # Errors
    /// The encoding's own (heads, positions).
    fn logits_bias(&self, ctx: &BiasContext<'_>) -> Result<LogitsBias>;
}

/// The values hook: `o_i += Σ_j p_ij·a^V[idx(r)]`.
#[derive(Debug, Clone)]
pub struct ValueTerms {
    /// Row of each distance (saturating).
    pub index: Arc<RelIndex>,
    /// `(rows, D)`, trainable.
    pub values: Tensor,
}

/// The values hook.
pub trait ValuesHook: Send + Sync {
    /// The value terms of this call.
    ///
    /// # Errors
    /// The encoding's own.
    fn value_terms(&self, ctx: &BiasContext<'_>) -> Result<ValueTerms>;
}

impl LogitsHook for Alibi {
    fn logits_bias(&self, ctx: &BiasContext<'_>) -> Result<LogitsBias> {
        if self.slopes().len() != ctx.q_heads {
            return Err(crate::Error::Shape {
                what: "ALiBi slopes (one per query head)",
                expected: format!("{}", ctx.q_heads),
                got: format!("{}", self.slopes().len()),
            });
        }
        Ok(LogitsBias::Alibi {
            slopes: self.slopes().to_vec(),
            symmetric: self.mode() == AlibiMode::Bidirectional,
        })
    }
}

impl LogitsHook for T5RelativeBias {
    fn logits_bias(&self, ctx: &BiasContext<'_>) -> Result<LogitsBias> {
        if self.table().dims()[1] != ctx.q_heads {
            return Err(crate::Error::Shape {
                what: "T5 table (buckets, heads)",
                expected: format!("(…, {})", ctx.q_heads),
                got: format!("{:?}", self.table().dims()),
            });
        }
        let b = *self.buckets();
        let r_max = b.max_distance().min(ctx.max_distance);
        Ok(LogitsBias::Bucketed {
            index: Arc::new(RelIndex::new(r_max, b.num_buckets(), |r| b.bucket(r))),
            table: self.table().clone(),
        })
    }
}

/// Shaw et al.'s `clip(r, −k, k) + k`.
fn shaw_index(shaw: &ShawRelative, ctx: &BiasContext<'_>) -> Arc<RelIndex> {
    let k = shaw.max_relative();
    let r_max = k.min(ctx.max_distance);
    let ki = k.min(i64::MAX as usize / 2) as i64;
    Arc::new(RelIndex::new(r_max, 2 * k + 1, move |r| {
        (r.clamp(-ki, ki) + ki) as usize
    }))
}

impl LogitsHook for ShawRelative {
    fn logits_bias(&self, ctx: &BiasContext<'_>) -> Result<LogitsBias> {
        Ok(LogitsBias::RelativeKeys {
            index: shaw_index(self, ctx),
            keys: self.key_table().clone(),
        })
    }
}

impl ValuesHook for ShawRelative {
    fn value_terms(&self, ctx: &BiasContext<'_>) -> Result<ValueTerms> {
        Ok(ValueTerms {
            index: shaw_index(self, ctx),
            values: self.value_table().clone(),
        })
    }
}

/// A fixed dense bias `(B or 1, H_q or 1, T_q, T_k)` as a logits hook (for
/// encodings that compute their bias with tensor ops, e.g. FIRE or CoPE;
/// gradients reach the tensor).
#[derive(Debug, Clone)]
pub struct DenseBias(pub Tensor);

impl LogitsHook for DenseBias {
    fn logits_bias(&self, _ctx: &BiasContext<'_>) -> Result<LogitsBias> {
        Ok(LogitsBias::Dense(self.0.clone()))
    }
}

/// `c_q[b, h, i] − c_k[b, h, j]` as a logits hook (forgetting attention's
/// cumulative log forget gates, Lin et al. 2025); gradients reach both.
#[derive(Debug, Clone)]
pub struct CumulativeBias {
    /// `(B, H_q, T_q)`.
    pub q: Tensor,
    /// `(B, H_q, T_k)`.
    pub k: Tensor,
}

impl LogitsHook for CumulativeBias {
    fn logits_bias(&self, _ctx: &BiasContext<'_>) -> Result<LogitsBias> {
        Ok(LogitsBias::Cumulative {
            q: self.q.clone(),
            k: self.k.clone(),
        })
    }
}
