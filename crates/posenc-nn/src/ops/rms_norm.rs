//! RMSNorm over the last axis ([`rms_norm`]), as transformers'
//! `LlamaRMSNorm` computes it in `f32` (Zhang & Sennrich 2019).

use candle_core::{Shape, Tensor, D};
use posenc::kernels::{tile, SimdLevel};

use super::fused::{apply, take, use_fused, Grad, In, Kernel, Saved};
use super::rows::{for_chunk_pairs, norm_backward, CHUNK};
use crate::NnError;

/// RMSNorm over the last axis (inputs `[x, w]`), saving each row's
/// `1/√(mean(x²) + ε)`.
struct RmsNormOp {
    eps: f32,
    inv: Saved<Vec<f32>>,
}

impl Kernel for RmsNormOp {
    fn name(&self) -> &'static str {
        "lab-rms-norm"
    }
    fn forward(&self, inputs: &[In]) -> candle_core::Result<(Vec<f32>, Shape)> {
        let [(x, xs), (w, _)] = take(self.name(), inputs)?;
        let d = w.len();
        if d == 0 || xs.dims().last() != Some(&d) {
            candle_core::bail!("rms norm: shapes {xs:?}, {d}");
        }
        let rows = x.len() / d;
        // SAFETY: every row of y is written below.
        let mut y = unsafe { tile::vec_for_overwrite(x.len()) };
        let mut inv = vec![0f32; rows];
        let level = SimdLevel::detect();
        let block = CHUNK * d;
        for_chunk_pairs((&mut y, block), (&mut inv, CHUNK), |bi, yr, ir| {
            rms_fwd(level, &x[bi * block..][..yr.len()], w, yr, ir, self.eps)
        });
        self.inv.keep(inv);
        Ok((y, xs.clone()))
    }
    fn backward(&self, inputs: &[In], dy: &[f32]) -> candle_core::Result<Vec<Grad>> {
        let [(x, _), (w, _)] = take(self.name(), inputs)?;
        let (dx, dw) = self
            .inv
            .with(self.name(), |inv| rms_norm_bwd(x, w, dy, inv))?;
        Ok(vec![Grad::Data(dx), Grad::Data(dw)])
    }
}

/// The sum of squares of `x`, element `i` in lane `i % 8`, the lanes added
/// in order (the same value at every SIMD level).
#[inline(always)]
fn sum_sq(x: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let full = x.len() / 8 * 8;
    for c in x[..full].chunks_exact(8) {
        for l in 0..8 {
            acc[l] += c[l] * c[l];
        }
    }
    for (l, v) in x[full..].iter().enumerate() {
        acc[l] += v * v;
    }
    acc.iter().sum()
}

/// RMSNorm forward over whole rows of `x`: `y = (x·inv)·w`, and `inv` per row.
#[inline(always)]
fn rms_fwd_body(x: &[f32], w: &[f32], y: &mut [f32], inv: &mut [f32], eps: f32) {
    let d = w.len();
    for ((xr, yr), iv) in x.chunks_exact(d).zip(y.chunks_exact_mut(d)).zip(inv) {
        let r = 1.0 / (sum_sq(xr) / d as f32 + eps).sqrt();
        for i in 0..d {
            yr[i] = xr[i] * r * w[i];
        }
        *iv = r;
    }
}
posenc::multiversion!(fn rms_fwd => rms_fwd_body(
    x: &[f32], w: &[f32], y: &mut [f32], inv: &mut [f32], eps: f32) -> ());

/// RMSNorm backward over whole rows: `dx = inv·(g − x̂·mean(g·x̂))` with
/// `g = dy·w`, `x̂ = x·inv`, and the products `dy·x̂` (summed into `dw` by
/// the caller).
#[inline(always)]
fn rms_bwd_body(x: &[f32], w: &[f32], dy: &[f32], inv: &[f32], dx: &mut [f32], prod: &mut [f32]) {
    let d = w.len();
    for ((((xr, gr), &r), dxr), pr) in x
        .chunks_exact(d)
        .zip(dy.chunks_exact(d))
        .zip(inv)
        .zip(dx.chunks_exact_mut(d))
        .zip(prod.chunks_exact_mut(d))
    {
        let mut s = [0f32; 8];
        let full = d / 8 * 8;
        for i in 0..full {
            let xh = xr[i] * r;
            s[i % 8] += gr[i] * w[i] * xh;
            pr[i] = gr[i] * xh;
        }
        for i in full..d {
            let xh = xr[i] * r;
            s[i - full] += gr[i] * w[i] * xh;
            pr[i] = gr[i] * xh;
        }
        let m = s.iter().sum::<f32>() / d as f32;
        for i in 0..d {
            let xh = xr[i] * r;
            dxr[i] = r * (gr[i] * w[i] - xh * m);
        }
    }
}
posenc::multiversion!(fn rms_bwd => rms_bwd_body(
    x: &[f32], w: &[f32], dy: &[f32], inv: &[f32], dx: &mut [f32], prod: &mut [f32]) -> ());

/// RMSNorm's backward pass on row-major buffers: `(dx, dw)`.
fn rms_norm_bwd(xv: &[f32], wv: &[f32], dyv: &[f32], inv: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let d = wv.len();
    let level = SimdLevel::detect();
    norm_backward(xv, dyv, d, |bi, x, dy, dxr, pr| {
        rms_bwd(level, x, wv, dy, &inv[bi * CHUNK..][..x.len() / d], dxr, pr)
    })
}

/// RMSNorm over the last axis with `weight` `(D,)`: `x / √(mean(x²) + ε) ·
/// weight`, as transformers' `LlamaRMSNorm` in `f32`. Fused (one pass per
/// row forward and backward, the row's `1/√(mean(x²) + ε)` saved), or
/// composed from candle ops.
///
/// # Errors
/// Shape mismatches; candle errors.
pub fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64, fused: bool) -> Result<Tensor, NnError> {
    if use_fused(fused, &[x, weight]) {
        let op = RmsNormOp {
            eps: eps as f32,
            inv: Saved::default(),
        };
        return apply(op, &[x, weight]);
    }
    let inv = (x.sqr()?.mean_keepdim(D::Minus1)? + eps)?.sqrt()?.recip()?;
    Ok(x.broadcast_mul(&inv)?.broadcast_mul(weight)?)
}
