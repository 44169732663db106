//! The numbers behind the explorer's teaching views: the sinusoidal table
//! with its similarity curve and linear map, plain RoPE's rotations,
//! wavelengths and decay bound, and the relative biases (ALiBi, T5, Shaw).
//! Each function bounds its sizes before it computes anything.

use std::f64::consts::PI;

use posenc::absolute::sinusoidal::SinusoidalLayout;
use posenc::analysis::{mat_vec, rope_decay_bound, similarity_curve, wavelengths};
use posenc::relative::alibi::{Alibi, AlibiMode};
use posenc::relative::shaw::Shaw;
use posenc::relative::t5::T5Buckets;
use posenc::rope::default_inv_freq;
use posenc::{AbsoluteEncoding, Error, Result};
use serde_json::{json, Value};

use crate::json::{alibi_json, sinusoidal_table_json, t5_json, SinusoidalParams};

/// The most positions the sinusoidal view draws.
pub const MAX_SIN_POSITIONS: usize = 2048;
/// The largest `d_model` of the sinusoidal view and head dimension of the
/// RoPE view.
pub const MAX_VIEW_DIM: usize = 1024;
/// The most sinusoidal table values (positions × d_model) one request gets.
pub const MAX_SIN_VALUES: usize = 1 << 18;
/// The most points of a curve against distance.
pub const MAX_CURVE_POINTS: usize = 4096;
/// The most ALiBi heads.
pub const MAX_HEADS: usize = 4096;
/// The most ALiBi bias values (heads × distances) one request gets: every
/// head count up to [`MAX_HEADS`] at the page's 65 distances, about 10 MB of
/// JSON at most (4096 heads at 4096 distances would be 325 MB).
pub const MAX_BIAS_VALUES: usize = 1 << 19;
/// The largest Shaw clipping distance.
pub const MAX_SHAW_K: usize = 1 << 16;
/// The largest distance or position of the teaching views.
pub const MAX_DISTANCE: u64 = 1 << 40;

fn too_large(what: &'static str, value: u64, max: u64) -> Error {
    Error::TooLarge { what, value, max }
}

/// Checks `value ≤ max`.
fn bound(what: &'static str, value: u64, max: u64) -> Result<()> {
    if value > max {
        return Err(too_large(what, value, max));
    }
    Ok(())
}

/// The sinusoidal view: `table` (exactly `posenc table sinusoidal --json`),
/// `frequencies`, `wavelengths`, `similarity` (`PE(ref) · PE(ref + k)` and
/// the cosine for `k = 0..=max_k`), and `linear_map`: the 2 × 2 rotation
/// block of `M_k` for every frequency (`PE(p + k) = M_k · PE(p)`, Vaswani et
/// al. 2017 §3.5) with the largest residual `|M_k·PE(p) − PE(p + k)|` over
/// the table's rows; `linear_map.error` instead when none exists (odd
/// interleaved `d_model`).
///
/// # Errors
/// [`Error::TooLarge`] past the view's bounds; the library's errors.
pub fn sinusoidal_view(
    p: &SinusoidalParams,
    reference: u64,
    max_k: usize,
    k: i64,
) -> Result<Value> {
    bound("positions", p.positions as u64, MAX_SIN_POSITIONS as u64)?;
    bound("d_model", p.dim as u64, MAX_VIEW_DIM as u64)?;
    bound(
        "table size (positions × d_model)",
        (p.positions as u64).saturating_mul(p.dim as u64),
        MAX_SIN_VALUES as u64,
    )?;
    bound("max_k", max_k as u64, MAX_CURVE_POINTS as u64)?;
    bound("reference position", reference, MAX_DISTANCE)?;
    bound("k", k.unsigned_abs(), MAX_DISTANCE)?;
    let table = sinusoidal_table_json(p)?;
    let enc = p.encoding()?;
    let offsets: Vec<u64> = (0..=max_k as u64).collect();
    let sim = similarity_curve(&enc, reference, &offsets)?;
    let freqs = enc.frequencies().to_vec();
    let lm = match enc.linear_map(k) {
        Ok(m) => {
            let n = freqs.len();
            let blocks: Vec<Value> = (0..n)
                .map(|i| {
                    let (s, c) = match p.layout {
                        SinusoidalLayout::Concatenated => (i, n + i),
                        _ => (2 * i, 2 * i + 1),
                    };
                    json!({
                        "pair": i,
                        "columns": [s, c],
                        "omega": freqs[i],
                        "block": [[m[s][s], m[s][c]], [m[c][s], m[c][c]]],
                    })
                })
                .collect();
            // M_k · PE(p) against PE(p + k) over the table's rows (k ≥ 0:
            // p + k must be a position the encoding has).
            let mut residual = 0.0f64;
            let rows = p.positions.min(64) as u64;
            for pos in 0..rows {
                let Some(target) = pos.checked_add_signed(k) else {
                    continue;
                };
                let a = enc.encode(pos)?;
                let b = enc.encode(target)?;
                for (x, y) in mat_vec(&m, &a).iter().zip(&b) {
                    residual = residual.max((x - y).abs());
                }
            }
            json!({"k": k, "blocks": blocks, "max_residual": residual, "rows_checked": rows})
        }
        Err(e) => json!({"k": k, "error": e.to_string()}),
    };
    Ok(json!({
        "table": table,
        "frequencies": freqs,
        "wavelengths": enc.wavelengths(),
        "similarity": {
            "reference": reference,
            "offsets": sim.offsets,
            "dot": sim.dot,
            "cosine": sim.cosine,
        },
        "linear_map": lm,
    }))
}

/// `points` distances from 0 to `max` (evenly spaced, whole numbers when
/// they fit).
fn distances(max: u64, points: usize) -> Vec<f64> {
    let points = points.max(2);
    if max < points as u64 {
        return (0..=max).map(|d| d as f64).collect();
    }
    (0..points)
        .map(|i| (max as f64 * i as f64 / (points - 1) as f64).round())
        .collect()
}

/// The plain RoPE view (Su et al. 2021) for head dimension `dim` and base
/// `base`: `inv_freq` (`base^(−2i/d)`, f64), the angle, cos and sin of
/// every pair at `position`, `wavelengths`, `turns_in_context` (how many
/// full turns each pair makes over `context` positions), and RoFormer's
/// long-term decay bound (§3.4.3) at `points` distances up to
/// `max_distance`.
///
/// # Errors
/// [`Error::TooLarge`] past the view's bounds; the library's errors for the
/// dimension and base.
pub fn rope_view(
    dim: usize,
    base: f64,
    position: u64,
    context: u64,
    max_distance: u64,
    points: usize,
) -> Result<Value> {
    bound("head_dim", dim as u64, MAX_VIEW_DIM as u64)?;
    bound("position", position, MAX_DISTANCE)?;
    bound("context", context, MAX_DISTANCE)?;
    bound("max_distance", max_distance, MAX_DISTANCE)?;
    bound("points", points as u64, MAX_CURVE_POINTS as u64)?;
    let inv = default_inv_freq(base, dim)?;
    let angles: Vec<f64> = inv
        .iter()
        .map(|w| (position as f64 * w).rem_euclid(2.0 * PI))
        .collect();
    let d = distances(max_distance, points);
    let bound_curve = rope_decay_bound(dim, base, &d)?;
    Ok(json!({
        "head_dim": dim,
        "base": base,
        "position": position,
        "context": context,
        "inv_freq": inv,
        "angle": angles,
        "cos": angles.iter().map(|a| a.cos()).collect::<Vec<_>>(),
        "sin": angles.iter().map(|a| a.sin()).collect::<Vec<_>>(),
        "wavelengths": wavelengths(&inv),
        "turns_in_context": inv.iter().map(|w| context as f64 * w / (2.0 * PI)).collect::<Vec<_>>(),
        "decay": {"distances": d, "bound": bound_curve},
    }))
}

/// ALiBi (Press et al. 2022): `posenc bias alibi --json` plus `bias[h][r]`,
/// the causal bias of head `h` for a key `r` positions before the query,
/// `r = distances[i]`.
///
/// # Errors
/// [`Error::TooLarge`] past the bounds (heads × points included:
/// [`MAX_BIAS_VALUES`]); [`Error::ZeroHeads`].
pub fn alibi_view(heads: usize, max_distance: u64, points: usize) -> Result<Value> {
    bound("heads", heads as u64, MAX_HEADS as u64)?;
    bound("max_distance", max_distance, MAX_DISTANCE)?;
    bound("points", points as u64, MAX_CURVE_POINTS as u64)?;
    let d = distances(max_distance, points);
    bound(
        "bias values (heads × points)",
        (heads as u64).saturating_mul(d.len() as u64),
        MAX_BIAS_VALUES as u64,
    )?;
    let mut v = alibi_json(heads)?;
    let alibi = Alibi::new(heads, AlibiMode::Causal)?;
    let bias: Vec<Vec<f64>> = alibi
        .slopes()
        .iter()
        .map(|&m| {
            d.iter()
                .map(|&r| alibi.bias_for_distance(m, -(r as i64)))
                .collect()
        })
        .collect();
    v["distances"] = json!(d);
    v["bias"] = json!(bias);
    Ok(v)
}

/// Refuses a relative range `lo..=hi` that starts after its end.
fn relative_order(lo: i64, hi: i64) -> Result<()> {
    if lo > hi {
        return Err(Error::invalid(
            "relative range",
            format!("{lo}:{hi}: start is after end"),
        ));
    }
    Ok(())
}

/// Refuses a relative range `lo..=hi` longer than [`MAX_CURVE_POINTS`] · 16.
fn relative_length(lo: i64, hi: i64) -> Result<()> {
    bound(
        "relative range length",
        hi.abs_diff(lo),
        (MAX_CURVE_POINTS * 16) as u64,
    )
}

/// T5's buckets (Raffel et al. 2020): `posenc bias t5 --json` for the
/// relative positions `lo..=hi`.
///
/// # Errors
/// [`Error::TooLarge`] for a range of more than [`MAX_CURVE_POINTS`] · 16
/// positions; [`Error::InvalidValue`] for a start after the end; the
/// library's errors for the bucket parameters.
pub fn t5_view(
    buckets: usize,
    max_distance: usize,
    bidirectional: bool,
    lo: i64,
    hi: i64,
) -> Result<Value> {
    relative_order(lo, hi)?;
    relative_length(lo, hi)?;
    bound("num_buckets", buckets as u64, 1 << 20)?;
    let b = T5Buckets::new(buckets, max_distance, bidirectional)?;
    Ok(t5_json(&b, lo, hi))
}

/// Shaw et al. (2018): the clipped distance `clip(key − query, −k, k)` and
/// the table row it selects, for every relative position `lo..=hi`.
///
/// # Errors
/// [`Error::TooLarge`] past the bounds.
pub fn shaw_view(max_relative: usize, lo: i64, hi: i64) -> Result<Value> {
    relative_order(lo, hi)?;
    bound("max_relative", max_relative as u64, MAX_SHAW_K as u64)?;
    relative_length(lo, hi)?;
    bound(
        "relative position",
        lo.unsigned_abs().max(hi.unsigned_abs()),
        MAX_DISTANCE,
    )?;
    let shaw = Shaw::new(max_relative, 1, 0)?;
    let query = lo.unsigned_abs();
    let mut rel = Vec::new();
    let mut clipped = Vec::new();
    let mut index = Vec::new();
    for r in lo..=hi {
        let key = query
            .checked_add_signed(r)
            .ok_or(Error::NegativePosition(r))?;
        rel.push(r);
        clipped.push(shaw.clipped_distance(query, key)?);
        index.push(shaw.relative_index(query, key)?);
    }
    Ok(json!({
        "max_relative": max_relative,
        "relative_position": "key_position - query_position",
        "relative": rel,
        "clipped": clipped,
        "index": index,
    }))
}
