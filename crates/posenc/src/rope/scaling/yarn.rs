//! YaRN: NTK-by-parts interpolation with an attention temperature.
//!
//! Peng, Quesnelle, Fan, Shippole 2023, *YaRN: Efficient Context Window
//! Extension of Large Language Models* (arXiv:2309.00071). With the extension
//! factor `s`, the pre-training length `L` and `d` rotary dimensions:
//!
//! ```text
//! dim(r)   = d · ln(L / (2π r)) / (2 ln base)      dimension that makes r turns over L
//! low      = max(⌊dim(β_fast)⌋, 0),  high = min(⌈dim(β_slow)⌉, d − 1)
//!            (no ⌊ ⌋ / ⌈ ⌉ when truncate = false)
//! ramp_i   = clamp((i − low) / (high − low), 0, 1)   for i in 0..d/2
//! e_i      = 1 − ramp_i                               (1: extrapolate, 0: interpolate)
//! θ_i      = base^(−2i/d)
//! θ_i'     = θ_i / s · (1 − e_i) + θ_i · e_i
//! ```
//!
//! High-frequency pairs (many turns over `L`) keep their frequency, low ones
//! are interpolated like PI, the band in between is blended. The logits are
//! sharpened by multiplying cos and sin by the attention factor
//!
//! ```text
//! mscale(s, m) = 1                   if s ≤ 1
//!              = 0.1 · m · ln s + 1  otherwise
//! attention_factor = given value, or mscale(s, mscale) / mscale(s, mscale_all_dim)
//!                    when both are given and non-zero (DeepSeek), else mscale(s, 1)
//! ```
//!
//! Defaults: `β_fast = 32`, `β_slow = 1` (a 0 counts as absent, like Python's
//! `or`), `truncate = true`. transformers: `_compute_yarn_parameters`,
//! `get_mscale`; the ramp and the blend are `f32` tensor operations, the
//! correction range Python floats — reproduced here in the same precision.

use super::{pos_freqs_f32, RopeScaling};
use crate::error::{check_dim, check_finite, check_positive, Error, Result};

/// `get_mscale(scale, mscale)`: `0.1 · mscale · ln(scale) + 1`, or 1 when `scale ≤ 1`.
pub fn get_mscale(scale: f64, mscale: f64) -> f64 {
    if scale <= 1.0 {
        1.0
    } else {
        0.1 * mscale * scale.ln() + 1.0
    }
}

/// The attention factor YaRN applies when none is given explicitly.
///
/// ```
/// use posenc::rope::scaling::yarn::default_attention_factor;
/// assert!((default_attention_factor(8.0, None, None) - (0.1 * 8f64.ln() + 1.0)).abs() < 1e-15);
/// // DeepSeek-V3: mscale = mscale_all_dim = 1 cancel out
/// assert_eq!(default_attention_factor(40.0, Some(1.0), Some(1.0)), 1.0);
/// ```
pub fn default_attention_factor(
    factor: f64,
    mscale: Option<f64>,
    mscale_all_dim: Option<f64>,
) -> f64 {
    match (mscale, mscale_all_dim) {
        (Some(m), Some(a)) if m != 0.0 && a != 0.0 => get_mscale(factor, m) / get_mscale(factor, a),
        _ => get_mscale(factor, 1.0),
    }
}

/// DeepSeek's softmax-scale correction: the factor by which DeepSeek-V2/V3
/// multiply the attention scale `1/√d_qk` when YaRN (or any non-default
/// scaling) has a non-zero `mscale_all_dim` — `mscale(factor,
/// mscale_all_dim)²` (DeepSeek-AI 2024, *DeepSeek-V2*, arXiv:2405.04434;
/// transformers' `yarn_apply_mscale`). 1 otherwise.
///
/// ```
/// use posenc::rope::scaling::yarn::{get_mscale, softmax_scale_factor};
/// // DeepSeek-V3: factor 40, mscale_all_dim 1
/// let m = 0.1 * 40f64.ln() + 1.0;
/// assert!((softmax_scale_factor(40.0, Some(1.0)) - m * m).abs() < 1e-15);
/// assert_eq!(softmax_scale_factor(40.0, None), 1.0);
/// assert_eq!(softmax_scale_factor(40.0, Some(0.0)), 1.0);
/// # let _ = get_mscale;
/// ```
pub fn softmax_scale_factor(factor: f64, mscale_all_dim: Option<f64>) -> f64 {
    match mscale_all_dim {
        Some(m) if m != 0.0 => {
            let s = get_mscale(factor, m);
            s * s
        }
        _ => 1.0,
    }
}

/// `find_correction_dim`: the (fractional) dimension index whose frequency
/// makes `num_rotations` turns over `max_position_embeddings` positions.
pub fn find_correction_dim(
    num_rotations: f64,
    dim: usize,
    base: f64,
    max_position_embeddings: usize,
) -> f64 {
    (dim as f64
        * (max_position_embeddings as f64 / (num_rotations * 2.0 * std::f64::consts::PI)).ln())
        / (2.0 * base.ln())
}

/// `find_correction_range`: `(low, high)`, clamped to `[0, dim − 1]`, rounded
/// outwards when `truncate`.
pub fn find_correction_range(
    beta_fast: f64,
    beta_slow: f64,
    dim: usize,
    base: f64,
    max_position_embeddings: usize,
    truncate: bool,
) -> (f64, f64) {
    let mut low = find_correction_dim(beta_fast, dim, base, max_position_embeddings);
    let mut high = find_correction_dim(beta_slow, dim, base, max_position_embeddings);
    if truncate {
        low = low.floor();
        high = high.ceil();
    }
    (low.max(0.0), high.min(dim as f64 - 1.0))
}

/// `linear_ramp_factor(min, max, n)` in `f32`: `clamp((i − min) / (max − min), 0, 1)`.
pub fn linear_ramp_factor(min: f64, mut max: f64, n: usize) -> Vec<f32> {
    if min == max {
        max += 0.001; // transformers: "Prevent singularity"
    }
    let (lo, span) = (min as f32, (max - min) as f32);
    (0..n)
        .map(|i| ((i as f32 - lo) / span).clamp(0.0, 1.0))
        .collect()
}

/// The parameters of a [`RopeScaling::Yarn`], as transformers'
/// `rope_parameters` name them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct YarnParams {
    /// The extension factor `s` (> 0).
    pub factor: f64,
    /// The pre-training context length `L`.
    pub original_max_position_embeddings: usize,
    /// The explicit attention factor; `None` derives it from `factor`,
    /// `mscale` and `mscale_all_dim`.
    pub attention_factor: Option<f64>,
    /// Number of rotations above which a dimension is extrapolated
    /// (`β_fast`, default 32).
    pub beta_fast: f64,
    /// Number of rotations below which a dimension is interpolated
    /// (`β_slow`, default 1).
    pub beta_slow: f64,
    /// DeepSeek's `mscale` (numerator of the attention factor).
    pub mscale: Option<f64>,
    /// DeepSeek's `mscale_all_dim` (denominator of the attention factor).
    pub mscale_all_dim: Option<f64>,
    /// Round the correction range outwards to whole dimensions (default
    /// `true`; gpt-oss uses `false`).
    pub truncate: bool,
}

impl YarnParams {
    /// YaRN ×`factor` over a pre-training length of `original` tokens with
    /// the defaults transformers gives a config that states only the
    /// factor: β_fast 32, β_slow 1, the attention factor derived from the
    /// factor (`0.1·ln s + 1`), no DeepSeek `mscale`, the correction range
    /// rounded outwards. Not validated yet:
    /// [`RopeConfig::with_scaling`](crate::rope::RopeConfig::with_scaling)
    /// checks it.
    pub fn new(factor: f64, original: usize) -> YarnParams {
        YarnParams {
            factor,
            original_max_position_embeddings: original,
            attention_factor: None,
            beta_fast: 32.0,
            beta_slow: 1.0,
            mscale: None,
            mscale_all_dim: None,
            truncate: true,
        }
    }

    /// The correction range `(low, high)` over `dim` rotary dimensions with
    /// base `base`: [`find_correction_range`] with these β, `L` and
    /// rounding.
    pub fn correction_range(&self, dim: usize, base: f64) -> (f64, f64) {
        find_correction_range(
            self.beta_fast,
            self.beta_slow,
            dim,
            base,
            self.original_max_position_embeddings,
            self.truncate,
        )
    }
}

impl RopeScaling {
    /// The parameters of a [`RopeScaling::Yarn`] (`None` for another
    /// scaling).
    pub fn yarn(&self) -> Option<YarnParams> {
        match self {
            RopeScaling::Yarn(y) => Some(*y),
            _ => None,
        }
    }
}

/// The YaRN parameters of `s`, which the caller matched as
/// [`RopeScaling::Yarn`].
fn params(s: &RopeScaling, caller: &str) -> YarnParams {
    s.yarn()
        .unwrap_or_else(|| unreachable!("yarn::{caller} called on another scaling"))
}

pub(crate) fn validate(s: &RopeScaling, theta: f64, rotary_dim: usize) -> Result<()> {
    let y = params(s, "validate");
    check_positive("factor", y.factor)?;
    check_dim(
        "original_max_position_embeddings",
        y.original_max_position_embeddings,
        false,
    )?;
    if let Some(a) = y.attention_factor {
        check_positive("attention_factor", a)?;
    }
    check_positive("beta_fast", y.beta_fast)?;
    check_positive("beta_slow", y.beta_slow)?;
    if let Some(m) = y.mscale {
        check_finite("mscale", m)?;
    }
    if let Some(m) = y.mscale_all_dim {
        check_finite("mscale_all_dim", m)?;
    }
    if theta == 1.0 {
        return Err(Error::InvalidTheta(theta));
    }
    let _ = rotary_dim;
    Ok(())
}

/// The `f32` frequencies and the attention factor of a validated
/// [`RopeScaling::Yarn`].
pub(crate) fn inv_freq(s: &RopeScaling, base: f64, dim: usize) -> (Vec<f32>, f64) {
    let y = params(s, "inv_freq");
    let factor = y.factor;
    let af = y
        .attention_factor
        .unwrap_or_else(|| default_attention_factor(factor, y.mscale, y.mscale_all_dim));
    let pos_freqs = pos_freqs_f32(base, dim);
    let fac32 = factor as f32;
    let (low, high) = y.correction_range(dim, base);
    let ramp = linear_ramp_factor(low, high, dim / 2);
    let inv = pos_freqs
        .iter()
        .zip(ramp)
        .map(|(&p, r)| {
            let extrapolation = 1.0f32 / p;
            let interpolation = 1.0f32 / (fac32 * p);
            let e = 1.0f32 - r; // inv_freq_extrapolation_factor
            interpolation * (1.0f32 - e) + extrapolation * e
        })
        .collect();
    (inv, af)
}
