//! Mixed NTK scaling (vLLM's `ntk` with `mixed_b`).
//!
//! Su Jianlin 2023, *Transformer升级之路：10、RoPE是一种β进制编码* and the
//! follow-up on mixed-base scaling (kexue.fm/archives/9706), as implemented
//! by vLLM's `NTKScalingRotaryEmbedding` when `rope_scaling` has `mixed_b`.
//! Pair `i` (counted from 1) of a `d`-dimensional rotary block is slowed by
//! its own factor, from almost nothing for the fastest pair to the full
//! factor `s` for the slowest:
//!
//! ```text
//! a   = ln s / (d/2)^b
//! λ_i = exp(a · i^b),            i = 1 .. d/2        (λ_{d/2} = s)
//! θ_i = base^(−2(i−1)/d) / λ_i
//! ```
//!
//! `b = 1` is vLLM's fixed NTK (`θ_i = base^(−2(i−1)/d) · s^(−2i/d)`); larger
//! `b` keep more of the high frequencies unscaled. The arithmetic follows
//! vLLM's `float32` tensor operations (`torch.tensor(factor).log()`, the
//! power, the exponential and the division in `f32`). The attention factor
//! is 1.

use super::default_inv_freq_f32;
use crate::error::{check_finite, check_positive, Result};

/// `λ_i` for `i = 1 ..= rotary_dim / 2`, in `f32`.
pub fn lambdas(rotary_dim: usize, factor: f64, mixed_b: f64) -> Vec<f32> {
    let half = rotary_dim / 2;
    let ln_s = ((factor as f32) as f64).ln() as f32;
    let denom = (half as f64).powf(mixed_b) as f32;
    let a = ln_s / denom;
    let b = mixed_b as f32;
    (1..=half)
        .map(|i| {
            let p = ((i as f32) as f64).powf(b as f64) as f32;
            ((a * p) as f64).exp() as f32
        })
        .collect()
}

/// The `f32` frequencies: `base^(−2(i−1)/d) / λ_i`.
///
/// ```
/// use posenc::rope::scaling::{default_inv_freq_f32, mixed_ntk};
/// let f = mixed_ntk::inv_freq(10000.0, 64, 4.0, 2.0);
/// let plain = default_inv_freq_f32(10000.0, 64);
/// // the slowest pair is divided by the whole factor, the fastest barely moves
/// assert!((plain[31] / f[31] - 4.0).abs() < 1e-5);
/// assert!((plain[0] / f[0] - 1.0).abs() < 2e-3);
/// ```
pub fn inv_freq(base: f64, rotary_dim: usize, factor: f64, mixed_b: f64) -> Vec<f32> {
    default_inv_freq_f32(base, rotary_dim)
        .into_iter()
        .zip(lambdas(rotary_dim, factor, mixed_b))
        .map(|(v, l)| v / l)
        .collect()
}

pub(crate) fn validate(factor: f64, mixed_b: f64) -> Result<()> {
    check_positive("factor", factor)?;
    check_finite("mixed_b", mixed_b)?;
    Ok(())
}
