//! Linear scaling, a.k.a. position interpolation (PI).
//!
//! Chen, Wong, Chen, Tian 2023, *Extending Context Window of Large Language
//! Models via Positional Interpolation* (arXiv:2306.15595); first proposed by
//! kaiokendev. Positions are squeezed by the factor `s` so that a context of
//! `s · L` maps into the trained range `[0, L)`:
//!
//! ```text
//! θ_i' = θ_i / s,   θ_i = base^(−2i/d)
//! ```
//!
//! which is the same as rotating by `(m / s) · θ_i`. transformers:
//! `_compute_linear_scaling_rope_parameters` (`inv_freq /= factor`, in `f32`).
//! The attention factor is 1.

use super::default_inv_freq_f32;

/// `base^(−2i/d) / factor`, as transformers computes it in `f32`.
///
/// ```
/// let f = posenc::rope::scaling::linear::inv_freq(10000.0, 4, 2.0);
/// assert_eq!(f, vec![0.5, 0.005]);
/// ```
pub fn inv_freq(base: f64, rotary_dim: usize, factor: f64) -> Vec<f32> {
    let f = factor as f32;
    default_inv_freq_f32(base, rotary_dim)
        .into_iter()
        .map(|v| v / f)
        .collect()
}
