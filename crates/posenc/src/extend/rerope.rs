//! ReRoPE and leaky ReRoPE (Su 2023, "Rectified Rotary Position
//! Embeddings", kexue.fm/archives/9708), as bojone/rerope's
//! `forward_with_rerope` and `forward_with_leaky_rerope` compute them:
//!
//! ```text
//! ReRoPE:        a − j < w:  q at a, k at j;   a − j ≥ w:  q at w, k at 0
//!                (the relative distance min(a − j, w))
//! leaky ReRoPE:  a − j ≥ w:  q at a + w(k − 1), k at j, every frequency / k
//!                (the distance w + (a − j − w)/k: bojone's
//!                LlamaLinearScalingRotaryEmbedding(scaling_factor=k) table)
//! ```
//!
//! Both scale every query by `max(1, ln(a + 1)/ln(L))` before rotation,
//! `L` the training length (log-n scaling; inert up to `L`). The mask is
//! `|a − j| < w` with causal masking on top, as in the authors' code.

use super::{KeyRange, PosMap, View};
use crate::error::{Error, Result};

pub(super) fn validate_leaky(window: usize, k: f64) -> Result<()> {
    if !(k.is_finite() && k > 0.0) {
        return Err(Error::invalid(
            "leaky ReRoPE",
            format!("k = {k} must be a finite number above 0"),
        ));
    }
    let shift = window as f64 * (k - 1.0);
    if shift < 0.0 || (shift - shift.round()).abs() > 1e-9 || shift > super::MAX_PARAM as f64 {
        return Err(Error::invalid(
            "leaky ReRoPE",
            format!(
                "k = {k}: the query shift w·(k − 1) = {shift} must be a whole, \
                 non-negative number of positions"
            ),
        ));
    }
    Ok(())
}

pub(super) fn views(window: usize) -> Vec<View> {
    vec![
        near(window),
        View {
            keys: KeyRange::Far(window),
            query: PosMap::Const(window),
            key: PosMap::Const(0),
            freq_divisor: 1.0,
        },
    ]
}

pub(super) fn views_leaky(window: usize, k: f64) -> Vec<View> {
    vec![
        near(window),
        View {
            keys: KeyRange::Far(window),
            query: PosMap::Add((window as f64 * (k - 1.0)).round() as usize),
            key: PosMap::Identity,
            freq_divisor: k,
        },
    ]
}

fn near(window: usize) -> View {
    View {
        keys: KeyRange::Near(window),
        query: PosMap::Identity,
        key: PosMap::Identity,
        freq_divisor: 1.0,
    }
}

/// `max(1, ln(p + 1)/ln(l))` in `f32`, as bojone's
/// `((position_ids + 1).log() / np.log(training_length)).clip(1)`.
pub(super) fn logn(p: usize, l: usize) -> f32 {
    if l < 2 || p < l {
        return 1.0;
    }
    let r = ((p + 1) as f32).ln() / (l as f64).ln() as f32;
    r.max(1.0)
}
