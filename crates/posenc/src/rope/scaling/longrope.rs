//! LongRoPE: per-frequency rescaling found by search.
//!
//! Ding, Zhang, Zhang, Xu, Shang, Xu, Yang, Yang 2024, *LongRoPE: Extending
//! LLM Context Window Beyond 2 Million Tokens* (arXiv:2402.13753), used by
//! Phi-3. Each frequency has its own factor `λ_i`; one list (`short_factor`)
//! serves sequences up to the pre-training length `L`, another
//! (`long_factor`) longer ones:
//!
//! ```text
//! λ = long_factor   if seq_len > L   (seq_len given)
//!   = short_factor  otherwise        (including the table built at load time)
//! θ_i' = 1 / (λ_i · base^(2i/d))
//! attention_factor = given value, or 1 if s ≤ 1, else √(1 + ln s / ln L)
//! ```
//!
//! with `s = factor` (transformers 5.x takes `rope_parameters.factor`, and
//! falls back to `max_position_embeddings / original_max_position_embeddings`,
//! the Phi-3 convention). transformers: `_compute_longrope_parameters`; the
//! factors are cast to `f32` and the product and reciprocal are `f32`.

use super::{exponents_f32, pow_f32, RopeScaling};
use crate::error::{check_dim, check_positive, Error, Result};

/// `√(1 + ln s / ln L)` (1 when `s ≤ 1`): LongRoPE's default attention factor.
///
/// ```
/// use posenc::rope::scaling::longrope::default_attention_factor;
/// let a = default_attention_factor(32.0, 4096);
/// assert!((a - (1.0 + 32f64.ln() / 4096f64.ln()).sqrt()).abs() < 1e-15);
/// assert_eq!(default_attention_factor(1.0, 4096), 1.0);
/// ```
pub fn default_attention_factor(factor: f64, original_max_position_embeddings: usize) -> f64 {
    if factor <= 1.0 {
        1.0
    } else {
        (1.0 + factor.ln() / (original_max_position_embeddings as f64).ln()).sqrt()
    }
}

/// Whether transformers uses the long factors at `seq_len`:
/// `seq_len and seq_len > original_max_position_embeddings`.
pub fn uses_long_factor(seq_len: Option<usize>, original_max_position_embeddings: usize) -> bool {
    matches!(seq_len, Some(n) if n > original_max_position_embeddings)
}

/// The fields of a [`RopeScaling::LongRope`], which the caller matched.
struct Fields<'a> {
    short_factor: &'a [f64],
    long_factor: &'a [f64],
    original_max_position_embeddings: usize,
    factor: f64,
    attention_factor: Option<f64>,
}

impl<'a> Fields<'a> {
    fn of(s: &'a RopeScaling, caller: &str) -> Self {
        let RopeScaling::LongRope {
            short_factor,
            long_factor,
            original_max_position_embeddings,
            factor,
            attention_factor,
        } = s
        else {
            unreachable!("longrope::{caller} called on another scaling")
        };
        Fields {
            short_factor,
            long_factor,
            original_max_position_embeddings: *original_max_position_embeddings,
            factor: *factor,
            attention_factor: *attention_factor,
        }
    }
}

pub(crate) fn validate(s: &RopeScaling, rotary_dim: usize) -> Result<()> {
    let f = Fields::of(s, "validate");
    let expected = rotary_dim / 2;
    for (which, list) in [
        ("short_factor", f.short_factor),
        ("long_factor", f.long_factor),
    ] {
        if list.len() != expected {
            return Err(Error::FactorListLength {
                which,
                expected,
                got: list.len(),
            });
        }
        for &v in list.iter() {
            check_positive(which, v)?;
        }
    }
    check_dim(
        "original_max_position_embeddings",
        f.original_max_position_embeddings,
        false,
    )?;
    check_positive("factor", f.factor)?;
    if let Some(a) = f.attention_factor {
        check_positive("attention_factor", a)?;
    }
    Ok(())
}

/// The `f32` frequencies and the attention factor of a validated
/// [`RopeScaling::LongRope`] at `seq_len`.
pub(crate) fn inv_freq(
    s: &RopeScaling,
    base: f64,
    dim: usize,
    seq_len: Option<usize>,
) -> (Vec<f32>, f64) {
    let f = Fields::of(s, "inv_freq");
    let af = f
        .attention_factor
        .unwrap_or_else(|| default_attention_factor(f.factor, f.original_max_position_embeddings));
    let ext = if uses_long_factor(seq_len, f.original_max_position_embeddings) {
        f.long_factor
    } else {
        f.short_factor
    };
    let inv = exponents_f32(dim)
        .into_iter()
        .zip(ext.iter())
        .map(|(e, &l)| 1.0f32 / ((l as f32) * pow_f32(base, e)))
        .collect();
    (inv, af)
}
