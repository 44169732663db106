//! GELU, tanh approximation ([`gelu`]), and its passes on buffers that the
//! linear layer with a GELU after it shares.

use candle_core::{Shape, Tensor};
use posenc::kernels::{tile, SimdLevel};
use rayon::prelude::*;

use super::fused::{apply, take, use_fused, Grad, In, Kernel};
use super::rows::{add_parts, add_rows, for_chunk_pairs, for_rows, parallel, CHUNK};
use crate::NnError;

const SQRT_2_OVER_PI: f32 = 0.797_884_6;

/// GELU, tanh approximation (Hendrycks & Gimpel 2016), as candle's `gelu`.
struct Gelu;

impl Kernel for Gelu {
    fn name(&self) -> &'static str {
        "lab-gelu"
    }
    fn forward(&self, inputs: &[In]) -> candle_core::Result<(Vec<f32>, Shape)> {
        let [(x, xs)] = take(self.name(), inputs)?;
        Ok((gelu_rows(x), xs.clone()))
    }
    fn backward(&self, inputs: &[In], dy: &[f32]) -> candle_core::Result<Vec<Grad>> {
        let [(x, _)] = take(self.name(), inputs)?;
        Ok(vec![Grad::Data(gelu_bwd(x, dy))])
    }
}

#[inline(always)]
fn gelu_fwd_body(x: &[f32], y: &mut [f32]) {
    for (o, &v) in y.iter_mut().zip(x) {
        let t = tile::tanh(SQRT_2_OVER_PI * v * (1.0 + 0.044715 * v * v));
        *o = 0.5 * v * (1.0 + t);
    }
}
posenc::multiversion!(fn gelu_fwd => gelu_fwd_body(x: &[f32], y: &mut [f32]) -> ());

#[inline(always)]
fn gelu_bwd_body(x: &[f32], dy: &[f32], dx: &mut [f32]) {
    for ((o, &v), &g) in dx.iter_mut().zip(x).zip(dy) {
        let u = SQRT_2_OVER_PI * v * (1.0 + 0.044715 * v * v);
        let t = tile::tanh(u);
        let du = SQRT_2_OVER_PI * (1.0 + 3.0 * 0.044715 * v * v);
        *o = g * (0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * du);
    }
}
posenc::multiversion!(fn gelu_bwd_rows => gelu_bwd_body(x: &[f32], dy: &[f32], dx: &mut [f32]) -> ());

/// GELU of every element of `x`, in rows of 4096 over the threads.
fn gelu_rows(x: &[f32]) -> Vec<f32> {
    // SAFETY: every element is written below.
    let mut y = unsafe { tile::vec_for_overwrite(x.len()) };
    let level = SimdLevel::detect();
    for_rows(&mut y, 4096, |r, yr| {
        gelu_fwd(level, &x[r * 4096..][..yr.len()], yr)
    });
    y
}

pub(super) fn gelu_bwd(xv: &[f32], dyv: &[f32]) -> Vec<f32> {
    // SAFETY: every element is written below.
    let mut dx = unsafe { tile::vec_for_overwrite(xv.len()) };
    let level = SimdLevel::detect();
    for_rows(&mut dx, 4096, |r, dr| {
        let base = r * 4096;
        gelu_bwd_rows(level, &xv[base..][..dr.len()], &dyv[base..][..dr.len()], dr)
    });
    dx
}

#[inline(always)]
fn gelu_bias_body(pre: &mut [f32], bias: &[f32], h: &mut [f32]) {
    let d = bias.len();
    for (pr, hr) in pre.chunks_mut(d).zip(h.chunks_mut(d)) {
        for ((v, o), b) in pr.iter_mut().zip(hr.iter_mut()).zip(bias) {
            let x = *v + b;
            *v = x;
            let t = tile::tanh(SQRT_2_OVER_PI * x * (1.0 + 0.044715 * x * x));
            *o = 0.5 * x * (1.0 + t);
        }
    }
}
posenc::multiversion!(fn gelu_bias_rows => gelu_bias_body(
    pre: &mut [f32], bias: &[f32], h: &mut [f32]) -> ());

/// GELU of `pre` after adding a deferred bias to each row (`b` of `d`
/// elements, added to `pre` in place, so that it holds the pre-activation
/// the backward pass needs), in one pass: the values of adding the bias and
/// then [`gelu_rows`], bit for bit. Without a bias, [`gelu_rows`].
pub(super) fn gelu_after_bias(pre: &mut [f32], b: Option<&[f32]>) -> Vec<f32> {
    let Some(bias) = b.filter(|b| !b.is_empty()) else {
        return gelu_rows(pre);
    };
    let d = bias.len();
    // SAFETY: every element is written below.
    let mut h = unsafe { tile::vec_for_overwrite(pre.len()) };
    let level = SimdLevel::detect();
    let width = (4096 / d).max(1) * d;
    for_chunk_pairs((pre, width), (&mut h, width), |_, p, hh| {
        gelu_bias_rows(level, p, bias, hh)
    });
    h
}

/// [`gelu_bwd`] and the column sums of its result (the bias gradient of
/// the layer before it), each block of [`CHUNK`] rows summed while it is in
/// cache: the bits of [`gelu_bwd`] then [`column_sums`](super::rows::column_sums).
pub(super) fn gelu_bwd_sums(pre: &[f32], dy: &[f32], cols: usize) -> (Vec<f32>, Vec<f32>) {
    if cols == 0 || pre.is_empty() {
        return (gelu_bwd(pre, dy), vec![0f32; cols]);
    }
    // SAFETY: every element is written below.
    let mut dx = unsafe { tile::vec_for_overwrite(pre.len()) };
    let level = SimdLevel::detect();
    let block = CHUNK * cols;
    let run = |(ci, dc): (usize, &mut [f32])| {
        let (base, m) = (ci * block, dc.len());
        gelu_bwd_rows(level, &pre[base..][..m], &dy[base..][..m], dc);
        let mut acc = vec![0f32; cols];
        add_rows(level, dc, &mut acc);
        acc
    };
    let parts: Vec<Vec<f32>> = if parallel(pre.len()) {
        dx.par_chunks_mut(block).enumerate().map(run).collect()
    } else {
        dx.chunks_mut(block).enumerate().map(run).collect()
    };
    (dx, add_parts(parts, cols))
}

/// GELU (tanh approximation): fused, or candle's `gelu`.
///
/// # Errors
/// Candle errors.
pub fn gelu(x: &Tensor, fused: bool) -> Result<Tensor, NnError> {
    if use_fused(fused, &[x]) {
        return apply(Gelu, &[x]);
    }
    Ok(x.gelu()?)
}
