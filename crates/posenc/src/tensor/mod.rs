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
pub mod custom;
pub mod extend;
pub mod fire;
pub mod forgetting;
pub mod hooks;
mod host;
pub mod rope;
pub mod scan;

use candle_core::{DType, Tensor};

use crate::error::{Error, Result};

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

/// A tensor of position ids as non-negative `u64`s, row-major: `u32` or
/// `i64` ids, and `u8` ones too when `with_u8` (the absolute encodings).
///
/// # Errors
/// [`Error::DType`] for another dtype; [`Error::NegativePosition`].
pub(crate) fn ids_to_u64(ids: &Tensor, with_u8: bool) -> Result<Vec<u64>> {
    let flat = ids.flatten_all()?;
    match ids.dtype() {
        DType::U8 if with_u8 => Ok(flat.to_vec1::<u8>()?.into_iter().map(u64::from).collect()),
        DType::U32 => Ok(flat.to_vec1::<u32>()?.into_iter().map(u64::from).collect()),
        DType::I64 => flat
            .to_vec1::<i64>()?
            .into_iter()
            .map(|p| u64::try_from(p).map_err(|_| Error::NegativePosition(p)))
            .collect(),
        other => Err(Error::DType {
            what: if with_u8 {
                "position ids (need u8, u32 or i64)"
            } else {
                "position ids (u32 or i64)"
            },
            dtype: format!("{other:?}"),
        }),
    }
}

/// Reads and checks a `(B, T)` tensor of position ids (as
/// [`ids_to_u64`]); returns the ids, row-major.
///
/// # Errors
/// [`Error::Shape`] for another shape; as [`ids_to_u64`].
pub(crate) fn batch_ids(ids: &Tensor, b: usize, t: usize, with_u8: bool) -> Result<Vec<u64>> {
    if ids.dims() != [b, t] {
        return Err(Error::Shape {
            what: "position ids",
            expected: format!("({b}, {t}) = (batch, seq_len)"),
            got: format!("{:?}", ids.dims()),
        });
    }
    ids_to_u64(ids, with_u8)
}
