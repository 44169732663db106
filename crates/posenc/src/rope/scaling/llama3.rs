//! Llama 3.1 frequency scaling.
//!
//! Meta 2024, *The Llama 3 Herd of Models* (arXiv:2407.21783) and the
//! reference code of Llama 3.1 (`apply_scaling` in meta-llama/llama-models).
//! With the wavelength `λ_i = 2π / θ_i`, the pre-training length `L`
//! (`original_max_position_embeddings`, 8192), the factor `s` (8) and the
//! band edges `L / low_freq_factor` and `L / high_freq_factor`:
//!
//! ```text
//! λ_i < L / high_freq_factor          θ_i' = θ_i                 (high frequencies kept)
//! λ_i > L / low_freq_factor           θ_i' = θ_i / s             (low frequencies interpolated)
//! otherwise, with  t = (L / λ_i − low_freq_factor) / (high_freq_factor − low_freq_factor):
//!                                     θ_i' = (1 − t) · θ_i / s + t · θ_i
//! ```
//!
//! With `low_freq_factor = high_freq_factor` (Llama 4 Scout: both 1) the two
//! band edges coincide and there is no smoothing band: every frequency is
//! either kept or divided by `s`. transformers only logs a warning for such a
//! config and computes this table; its smoothing factor is then `0/0` but is
//! never selected (a wavelength exactly on the edge, where it would be, keeps
//! its frequency here). Strictly inverted factors (`low > high`) are an
//! error.
//!
//! transformers: `_compute_llama3_parameters`, entirely in `f32` tensors
//! (`2π / inv_freq` is a reciprocal then a product, band edges are compared
//! in `f32`); reproduced operation by operation so that every pair lands in
//! the same band. The attention factor is 1.

use super::{default_inv_freq_f32, RopeScaling};
use crate::error::{check_dim, check_positive, Error, Result};

/// The fields of a [`RopeScaling::Llama3`], which the caller matched:
/// `(factor, low_freq_factor, high_freq_factor,
/// original_max_position_embeddings)`.
fn fields(s: &RopeScaling, caller: &str) -> (f64, f64, f64, usize) {
    let RopeScaling::Llama3 {
        factor,
        low_freq_factor,
        high_freq_factor,
        original_max_position_embeddings,
    } = *s
    else {
        unreachable!("llama3::{caller} called on another scaling")
    };
    (
        factor,
        low_freq_factor,
        high_freq_factor,
        original_max_position_embeddings,
    )
}

pub(crate) fn validate(s: &RopeScaling) -> Result<()> {
    let (factor, low_freq_factor, high_freq_factor, original_max_position_embeddings) =
        fields(s, "validate");
    check_positive("factor", factor)?;
    check_positive("low_freq_factor", low_freq_factor)?;
    check_positive("high_freq_factor", high_freq_factor)?;
    if low_freq_factor > high_freq_factor {
        return Err(Error::FreqFactorOrder {
            low: low_freq_factor,
            high: high_freq_factor,
        });
    }
    check_dim(
        "original_max_position_embeddings",
        original_max_position_embeddings,
        false,
    )?;
    Ok(())
}

/// The `f32` frequencies of a validated [`RopeScaling::Llama3`].
pub(crate) fn inv_freq(s: &RopeScaling, base: f64, dim: usize) -> Vec<f32> {
    let (factor, low_freq_factor, high_freq_factor, original_max_position_embeddings) =
        fields(s, "inv_freq");
    let old_context_len = original_max_position_embeddings as f64;
    // Python floats
    let low_freq_wavelen = (old_context_len / low_freq_factor) as f32;
    let high_freq_wavelen = (old_context_len / high_freq_factor) as f32;
    let two_pi = (2.0 * std::f64::consts::PI) as f32;
    let fac = factor as f32;
    let low = low_freq_factor as f32;
    let span = (high_freq_factor - low_freq_factor) as f32;
    let ocl = old_context_len as f32;
    default_inv_freq_f32(base, dim)
        .into_iter()
        .map(|inv| {
            // wavelen = 2 * math.pi / inv_freq  ==  inv_freq.reciprocal() * (2π)
            let wavelen = (1.0f32 / inv) * two_pi;
            let inv_llama = if wavelen > low_freq_wavelen {
                inv / fac
            } else {
                inv
            };
            // smooth = (old_context_len / wavelen - low) / (high - low)
            let smooth = ((1.0f32 / wavelen) * ocl - low) / span;
            let smoothed = (1.0f32 - smooth) * inv_llama / fac + smooth * inv_llama;
            // ~(wavelen < high) * ~(wavelen > low); frequencies are finite, never NaN
            // (empty when the band edges coincide: the smoothing factor would be 0/0)
            let medium = span != 0.0 && wavelen >= high_freq_wavelen && wavelen <= low_freq_wavelen;
            if medium {
                smoothed
            } else {
                inv_llama
            }
        })
        .collect()
}
