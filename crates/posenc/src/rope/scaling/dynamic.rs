//! Dynamic NTK scaling.
//!
//! bloc97 and emozilla 2023, *Dynamically Scaled RoPE further increases
//! performance of long context LLaMA with zero fine-tuning* (Reddit
//! r/LocalLLaMA). NTK-aware base scaling ([`super::ntk`]) whose strength grows
//! with the current sequence length `n` past the trained length `L =
//! max_position_embeddings`:
//!
//! ```text
//! n' = max(n, L)           (n = L when no length is given: the table at load time)
//! base' = base · (s · n'/L − (s − 1))^(d / (d − 2))
//! θ_i = base'^(−2i/d)
//! ```
//!
//! so sequences up to `L` use the unscaled frequencies. transformers:
//! `_compute_dynamic_ntk_parameters`; the base is a Python float (f64), the
//! frequencies `f32`. The attention factor is 1.

use super::default_inv_freq_f32;
use crate::error::{check_dim, check_positive, Result};

/// The base at sequence length `seq_len`, exactly as transformers computes it
/// in Python floats: `base * ((factor * seq_len / mpe) - (factor - 1)) ** (dim / (dim - 2))`.
pub fn scaled_base(
    base: f64,
    rotary_dim: usize,
    factor: f64,
    max_position_embeddings: usize,
    seq_len: Option<usize>,
) -> f64 {
    let mpe = max_position_embeddings as f64;
    let n = seq_len.map_or(max_position_embeddings, |s| s.max(max_position_embeddings)) as f64;
    let d = rotary_dim as f64;
    base * ((factor * n / mpe) - (factor - 1.0)).powf(d / (d - 2.0))
}

/// The `f32` frequencies at `seq_len` (`None`: `max_position_embeddings`).
///
/// ```
/// use posenc::rope::scaling::{default_inv_freq_f32, dynamic};
/// // up to max_position_embeddings nothing changes
/// assert_eq!(dynamic::inv_freq(1e4, 64, 2.0, 2048, Some(100)), default_inv_freq_f32(1e4, 64));
/// // beyond, the low frequencies shrink
/// let long = dynamic::inv_freq(1e4, 64, 2.0, 2048, Some(8192));
/// assert!(long[31] < default_inv_freq_f32(1e4, 64)[31]);
/// ```
pub fn inv_freq(
    base: f64,
    rotary_dim: usize,
    factor: f64,
    max_position_embeddings: usize,
    seq_len: Option<usize>,
) -> Vec<f32> {
    default_inv_freq_f32(
        scaled_base(base, rotary_dim, factor, max_position_embeddings, seq_len),
        rotary_dim,
    )
}

pub(crate) fn validate(
    factor: f64,
    max_position_embeddings: usize,
    rotary_dim: usize,
) -> Result<()> {
    check_positive("factor", factor)?;
    check_dim("max_position_embeddings", max_position_embeddings, false)?;
    super::ntk::check_exponent_dim(
        rotary_dim,
        "dynamic NTK scaling needs rotary_dim > 2 (its exponent is d/(d-2))",
    )
}
