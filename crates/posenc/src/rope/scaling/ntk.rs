//! Fixed NTK-aware scaling.
//!
//! bloc97 2023, *NTK-Aware Scaled RoPE allows LLaMA models to have extended
//! (8k+) context size without any fine-tuning* (Reddit r/LocalLLaMA). Instead
//! of interpolating positions, the base is enlarged so that the lowest
//! frequency is interpolated by `α` while the highest is almost untouched:
//!
//! ```text
//! base' = base · α^(d / (d − 2)),   θ_i = base'^(−2i/d)
//! ```
//!
//! (`d / (d − 2)` makes `θ_{d/2−1}' = θ_{d/2−1} / α` exactly.) transformers
//! 5.x has no `ntk` entry in `ROPE_INIT_FUNCTIONS`; an earlier revision had
//! `_compute_ntk_parameters` with this formula (`base * factor ** (dim /
//! (dim - 2))`), and the dynamic variant ([`super::dynamic`]) is the same
//! formula with a length-dependent `α`. In a `config.json`, `rope_type:
//! "ntk"` takes `α` from `factor`. The attention factor is 1.

use super::default_inv_freq_f32;
use crate::error::{check_positive, Error, Result};

/// The enlarged base `base · α^(d/(d−2))`, in f64 (Python float arithmetic).
pub fn scaled_base(base: f64, rotary_dim: usize, alpha: f64) -> f64 {
    let d = rotary_dim as f64;
    base * alpha.powf(d / (d - 2.0))
}

/// `1 / base'^(2i/d)` in `f32`, `base' = base · α^(d/(d−2))`.
///
/// ```
/// use posenc::rope::scaling::ntk;
/// let f = ntk::inv_freq(10000.0, 64, 4.0);
/// // the lowest frequency is interpolated by exactly α
/// let plain = posenc::rope::scaling::default_inv_freq_f32(10000.0, 64);
/// assert!(((plain[31] / f[31]) - 4.0).abs() < 1e-5);
/// assert_eq!(f[0], 1.0);
/// ```
pub fn inv_freq(base: f64, rotary_dim: usize, alpha: f64) -> Vec<f32> {
    default_inv_freq_f32(scaled_base(base, rotary_dim, alpha), rotary_dim)
}

pub(crate) fn validate(alpha: f64, rotary_dim: usize) -> Result<()> {
    check_positive("factor", alpha)?;
    check_exponent_dim(
        rotary_dim,
        "NTK scaling needs rotary_dim > 2 (its exponent is d/(d-2))",
    )
}

/// `rotary_dim > 2`, which the NTK base exponent `d/(d−2)` needs (NTK and
/// dynamic NTK scaling); `reason` says which scaling asks.
pub(crate) fn check_exponent_dim(rotary_dim: usize, reason: &'static str) -> Result<()> {
    if rotary_dim <= 2 {
        return Err(Error::InvalidDimension {
            what: "rotary_dim",
            value: rotary_dim,
            reason,
        });
    }
    Ok(())
}
