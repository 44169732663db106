//! transformers 5.x "proportional" RoPE.
//!
//! `_compute_proportional_rope_parameters` in transformers 5.x
//! `modeling_rope_utils.py` (used by the Gemma family's partial-rotary
//! layers). Unlike the usual partial RoPE, which builds `d_r/2` frequencies
//! with exponents over `d_r = ⌊p · d⌋`, it keeps one entry per pair of the
//! **whole** head, spaces the rotating ones with exponents over the full head
//! dimension `d`, and gives the remaining pairs frequency 0 (they pass
//! through unrotated):
//!
//! ```text
//! k = ⌊p · d / 2⌋                                  (rotating pairs)
//! θ_i = base^(−2i/d) / s   for i < k
//! θ_i = 0                  for k ≤ i < d/2
//! ```
//!
//! with `p = partial_rotary_factor` and `s = factor` (default 1). The rotary
//! dimension is therefore the head dimension. The attention factor is 1.

use super::pow_f32;
use crate::error::{check_positive, Error, Result};

/// Number of rotating pairs, `int(p * head_dim // 2)` in Python.
pub fn rotating_pairs(head_dim: usize, partial_rotary_factor: f64) -> usize {
    ((partial_rotary_factor * head_dim as f64) / 2.0).floor() as usize
}

/// The `f32` frequencies (`head_dim / 2` of them, trailing zeros for the
/// pairs that do not rotate).
///
/// ```
/// use posenc::rope::scaling::proportional::inv_freq;
/// let f = inv_freq(10000.0, 8, 1.0, 0.5);
/// assert_eq!(f.len(), 4);
/// assert_eq!(f[0], 1.0);
/// assert_eq!(f[1], 0.1); // 10000^(-2/8)
/// assert_eq!(&f[2..], &[0.0, 0.0]);
/// ```
pub fn inv_freq(base: f64, head_dim: usize, factor: f64, partial_rotary_factor: f64) -> Vec<f32> {
    let k = rotating_pairs(head_dim, partial_rotary_factor).min(head_dim / 2);
    let f = factor as f32;
    (0..head_dim / 2)
        .map(|i| {
            if i < k {
                (1.0f32 / pow_f32(base, (2 * i) as f32 / head_dim as f32)) / f
            } else {
                0.0
            }
        })
        .collect()
}

pub(crate) fn validate(factor: f64, partial_rotary_factor: f64) -> Result<()> {
    check_positive("factor", factor)?;
    if !(partial_rotary_factor > 0.0 && partial_rotary_factor <= 1.0) {
        return Err(Error::PartialRotaryFactor(partial_rotary_factor));
    }
    Ok(())
}
