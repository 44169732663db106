//! The candle tensor API: encodings applied to activations inside a model.
//!
//! - [`absolute`]: modules that add absolute encodings to embeddings;
//! - [`bias`]: attention biases and relative terms as tensors;
//! - [`rope`]: rotary embeddings on queries and keys, fused and
//!   differentiable;
//! - [`axial`]: multi-axis rotary embeddings (M-RoPE, 2-D vision RoPE) with
//!   per-axis position ids, on the same kernels;
//! - [`fire`], [`cope`], [`forgetting`]: the learned biases FIRE, CoPE and
//!   forgetting attention, each an additive `(B or 1, H, Tq, Tk)` logits
//!   bias (forgetting attention also as its compact `(B, H, T)` cumulative
//!   form), with [`scan`]'s differentiable `O(T)` cumulative sums;
//! - [`hooks`]: the input, query/key, logits and values hooks as traits,
//!   implemented by every encoding;
//! - [`attention`]: differentiable attention with those hooks inside, fused
//!   on the CPU (streaming, no `T × T` matrix), beside its composed
//!   reference.

pub mod absolute;
pub mod attention;
pub mod axial;
pub mod bias;
pub mod cope;
pub mod extend;
pub mod fire;
pub mod forgetting;
pub mod hooks;
mod host;
pub mod rope;
pub mod scan;

use candle_core::Tensor;

/// Which positions the `T` time steps of a call are at. Positions are
/// always explicit, so a sequence split across devices (or continued from a
/// KV cache) computes its own slice with no communication.
#[derive(Debug, Clone, Copy)]
pub enum Positions<'a> {
    /// Step `t` of every batch entry is at position `offset + t` (tokens
    /// already in the KV cache, or the start of this device's slice).
    Offset(usize),
    /// A `(B, T)` tensor of non-negative integer position ids, each row its
    /// own positions (`u32` or `i64`; absolute encodings also take `u8`).
    Ids(&'a Tensor),
}

impl From<usize> for Positions<'_> {
    fn from(o: usize) -> Self {
        Positions::Offset(o)
    }
}

impl<'a> From<&'a Tensor> for Positions<'a> {
    fn from(t: &'a Tensor) -> Self {
        Positions::Ids(t)
    }
}
