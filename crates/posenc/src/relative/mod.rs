//! Relative encodings: terms inside attention that depend on the distance
//! between query and key ([`Hook::Logits`](crate::Hook::Logits),
//! [`Hook::Values`](crate::Hook::Values)).
//!
//! - [`alibi`]: ALiBi (Press et al. 2022), a fixed linear penalty per head;
//! - [`t5`]: T5's bucketed relative attention bias (Raffel et al. 2020);
//! - [`shaw`]: Shaw et al. (2018), learned relative key and value vectors;
//! - [`fire`]: FIRE (Li et al. 2024), an MLP of the log-transformed,
//!   progressively interpolated distance;
//! - [`cope`]: CoPE (Golovneva et al. 2024), positions counted by gates on
//!   the context;
//! - [`forgetting`]: forgetting attention (Lin et al. 2025), cumulative
//!   log-sigmoid forget gates as a data-dependent ALiBi.
//!
//! The tensor versions live in [`tensor::bias`](crate::tensor::bias) (ALiBi,
//! T5, Shaw), [`tensor::fire`](crate::tensor::fire),
//! [`tensor::cope`](crate::tensor::cope) and
//! [`tensor::forgetting`](crate::tensor::forgetting).

pub mod alibi;
pub mod cope;
pub mod fire;
pub mod forgetting;
pub mod shaw;
pub mod t5;

pub use alibi::{alibi_slopes, Alibi, AlibiMode};
pub use cope::{Cope, CopeConfig};
pub use fire::{Fire, FireConfig, FireMlp, FireMode};
pub use forgetting::{ForgetBiasInit, ForgetGate, ForgetGateConfig};
pub use shaw::Shaw;
pub use t5::{relative_position_bucket, T5Bias, T5Buckets};

use crate::error::{Error, Result};

/// `key − query` as an `i64`.
///
/// # Errors
/// [`Error::PositionOutOfRange`] if a position exceeds `i64::MAX`.
pub(crate) fn signed_distance(query: u64, key: u64) -> Result<i64> {
    check_signed(
        [query, key],
        "relative encodings (positions are subtracted as i64)",
    )?;
    Ok(key as i64 - query as i64)
}

/// Checks that both positions fit an `i64` (they are subtracted as signed
/// numbers).
///
/// # Errors
/// [`Error::PositionOutOfRange`] about `what` for one above `i64::MAX`.
#[inline]
pub(crate) fn check_signed(positions: [u64; 2], what: &'static str) -> Result<()> {
    let limit = i64::MAX as u64;
    for p in positions {
        if p > limit {
            return Err(Error::PositionOutOfRange {
                position: p,
                limit,
                what,
            });
        }
    }
    Ok(())
}

/// The `Tq × Tk` matrix `f(query, key)` for queries at
/// `q_offset..q_offset + q_len` and keys at `k_offset..k_offset + k_len`
/// (positions saturate at `u64::MAX`); the first error stops it.
pub(crate) fn position_grid<T>(
    q_len: usize,
    k_len: usize,
    q_offset: u64,
    k_offset: u64,
    f: impl Fn(u64, u64) -> Result<T>,
) -> Result<Vec<Vec<T>>> {
    (0..q_len as u64)
        .map(|i| {
            (0..k_len as u64)
                .map(|j| f(q_offset.saturating_add(i), k_offset.saturating_add(j)))
                .collect()
        })
        .collect()
}

/// Checks `head < num_heads`.
pub(crate) fn check_head(head: usize, num_heads: usize) -> Result<()> {
    crate::error::ensure(head < num_heads, "head", || {
        format!("head {head} is out of range for {num_heads} heads")
    })
}
