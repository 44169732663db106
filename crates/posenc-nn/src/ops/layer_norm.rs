//! LayerNorm over the last axis ([`layer_norm`]) and a pre-LayerNorm
//! branch's LayerNorm with its first linear layer ([`ln_linear`]).

use candle_core::{Shape, Tensor, D};
use posenc::kernels::{tile, SimdLevel};

use super::fused::{apply, pack, take, unpack, use_fused, Grad, In, Kernel, Saved};
use super::linear::{add_bias, linear, linear_bwd, linear_product};
use super::rows::{column_sums, for_chunk_pairs, norm_backward, CHUNK};
use crate::NnError;

/// LayerNorm over the last axis (inputs `[x, γ, β]`), saving each row's
/// mean and 1/σ.
struct LayerNormOp {
    eps: f32,
    stats: Saved<Vec<(f32, f32)>>,
}

impl Kernel for LayerNormOp {
    fn name(&self) -> &'static str {
        "lab-layer-norm"
    }
    fn forward(&self, inputs: &[In]) -> candle_core::Result<(Vec<f32>, Shape)> {
        let [(x, xs), (w, _), (b, _)] = take(self.name(), inputs)?;
        let d = w.len();
        if d == 0 || xs.dims().last() != Some(&d) || b.len() != d {
            candle_core::bail!("layer norm: shapes {xs:?}, {d}, {}", b.len());
        }
        let (y, stats) = layer_norm_fwd(x, w, b, self.eps);
        self.stats.keep(stats);
        Ok((y, xs.clone()))
    }
    fn backward(&self, inputs: &[In], dy: &[f32]) -> candle_core::Result<Vec<Grad>> {
        let [(x, _), (w, _), _] = take(self.name(), inputs)?;
        let (dx, dw, db) = self.stats.with(self.name(), |stats| {
            layer_norm_bwd(x, w, dy, stats, w.len(), None)
        })?;
        Ok(vec![Grad::Data(dx), Grad::Data(dw), Grad::Data(db)])
    }
}

/// LayerNorm's forward pass on row-major buffers (`w.len()` columns, checked
/// by the caller): `y`, and `(mean, 1/σ)` per row.
pub(super) fn layer_norm_fwd(
    x: &[f32],
    w: &[f32],
    b: &[f32],
    eps: f32,
) -> (Vec<f32>, Vec<(f32, f32)>) {
    let d = w.len();
    let rows = x.len() / d;
    // SAFETY: every row of y is written below.
    let mut y = unsafe { tile::vec_for_overwrite(x.len()) };
    let mut stats = vec![(0f32, 0f32); rows];
    let level = SimdLevel::detect();
    // Blocks of CHUNK rows.
    let block = CHUNK * d;
    for_chunk_pairs((&mut y, block), (&mut stats, CHUNK), |bi, yr, st| {
        ln_fwd(level, &x[bi * block..][..yr.len()], w, b, yr, st, eps)
    });
    (y, stats)
}

/// LayerNorm forward over whole rows of `x`: `y`, and `(mean, 1/σ)` per row.
#[inline(always)]
fn ln_fwd_body(x: &[f32], w: &[f32], b: &[f32], y: &mut [f32], stats: &mut [(f32, f32)], eps: f32) {
    let d = w.len();
    for ((xr, yr), st) in x.chunks_exact(d).zip(y.chunks_exact_mut(d)).zip(stats) {
        let mean = tile::sum(xr) / d as f32;
        let mut var_acc = [0f32; 8];
        let mut i = 0;
        while i + 8 <= d {
            for l in 0..8 {
                let c = xr[i + l] - mean;
                var_acc[l] += c * c;
            }
            i += 8;
        }
        for (l, v) in xr[i..].iter().enumerate() {
            let c = v - mean;
            var_acc[l] += c * c;
        }
        let var = var_acc.iter().sum::<f32>() / d as f32;
        let rstd = 1.0 / (var + eps).sqrt();
        for i in 0..d {
            yr[i] = (xr[i] - mean) * rstd * w[i] + b[i];
        }
        *st = (mean, rstd);
    }
}
posenc::multiversion!(fn ln_fwd => ln_fwd_body(
    x: &[f32], w: &[f32], b: &[f32], y: &mut [f32], stats: &mut [(f32, f32)], eps: f32) -> ());

/// LayerNorm backward over whole rows: `dx` and the per-row products
/// `dy·x̂` (summed into `dw` by the caller).
#[inline(always)]
fn ln_bwd_body(
    x: &[f32],
    w: &[f32],
    dy: &[f32],
    stats: &[(f32, f32)],
    res: &[f32],
    dx: &mut [f32],
    prod: &mut [f32],
) {
    let d = w.len();
    for (r, ((((xr, gr), st), dxr), pr)) in x
        .chunks_exact(d)
        .zip(dy.chunks_exact(d))
        .zip(stats)
        .zip(dx.chunks_exact_mut(d))
        .zip(prod.chunks_exact_mut(d))
        .enumerate()
    {
        let (mean, rstd) = *st;
        // g = dy·w; dx = rstd·(g − mean(g) − x̂·mean(g·x̂))
        // Element i goes to lane i % 8: whole groups of 8 (which the
        // compiler vectorises), then the rest.
        let mut sg = [0f32; 8];
        let mut sgx = [0f32; 8];
        let full = d / 8 * 8;
        for (((xc, gc), wc), pc) in xr[..full]
            .chunks_exact(8)
            .zip(gr[..full].chunks_exact(8))
            .zip(w[..full].chunks_exact(8))
            .zip(pr[..full].chunks_exact_mut(8))
        {
            for l in 0..8 {
                let g = gc[l] * wc[l];
                let xh = (xc[l] - mean) * rstd;
                sg[l] += g;
                sgx[l] += g * xh;
                pc[l] = gc[l] * xh;
            }
        }
        for i in full..d {
            let g = gr[i] * w[i];
            let xh = (xr[i] - mean) * rstd;
            sg[i - full] += g;
            sgx[i - full] += g * xh;
            pr[i] = gr[i] * xh;
        }
        let mg = sg.iter().sum::<f32>() / d as f32;
        let mgx = sgx.iter().sum::<f32>() / d as f32;
        if res.is_empty() {
            for i in 0..d {
                let g = gr[i] * w[i];
                let xh = (xr[i] - mean) * rstd;
                dxr[i] = rstd * (g - mg - xh * mgx);
            }
        } else {
            // A residual path's gradient, added as candle's backward pass
            // adds the two: to the finished LayerNorm gradient.
            let rr = &res[r * d..][..d];
            for i in 0..d {
                let g = gr[i] * w[i];
                let xh = (xr[i] - mean) * rstd;
                let v = rstd * (g - mg - xh * mgx);
                dxr[i] = v + rr[i];
            }
        }
    }
}
posenc::multiversion!(fn ln_bwd => ln_bwd_body(
    x: &[f32], w: &[f32], dy: &[f32], stats: &[(f32, f32)], res: &[f32], dx: &mut [f32],
    prod: &mut [f32]) -> ());

/// LayerNorm's backward pass on row-major buffers: `(dx, dw, db)`, with a
/// residual path's gradient `res` (same shape as `x`) added to `dx` when
/// given.
pub(super) fn layer_norm_bwd(
    xv: &[f32],
    wv: &[f32],
    dyv: &[f32],
    stats: &[(f32, f32)],
    d: usize,
    res: Option<&[f32]>,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let level = SimdLevel::detect();
    let block = CHUNK * d;
    let (dx, dw) = norm_backward(xv, dyv, d, |bi, x, dy, dxr, pr| {
        let n = x.len();
        let res = res.map_or(&[][..], |r| &r[bi * block..][..n]);
        ln_bwd(
            level,
            x,
            wv,
            dy,
            &stats[bi * CHUNK..][..n / d],
            res,
            dxr,
            pr,
        )
    });
    let db = column_sums(dyv, xv.len() / d, d);
    (dx, dw, db)
}

/// LayerNorm over the last axis with `weight` and `bias` `(D,)`: fused, or
/// composed from candle ops (mean, variance, normalise, scale, shift).
///
/// # Errors
/// Shape mismatches; candle errors.
pub fn layer_norm(
    x: &Tensor,
    weight: &Tensor,
    bias: &Tensor,
    eps: f64,
    fused: bool,
) -> Result<Tensor, NnError> {
    if use_fused(fused, &[x, weight, bias]) {
        let op = LayerNormOp {
            eps: eps as f32,
            stats: Saved::default(),
        };
        return apply(op, &[x, weight, bias]);
    }
    let d = x.dim(D::Minus1)? as f64;
    let mean = (x.sum_keepdim(D::Minus1)? / d)?;
    let xc = x.broadcast_sub(&mean)?;
    let var = (xc.sqr()?.sum_keepdim(D::Minus1)? / d)?;
    let xn = xc.broadcast_div(&(var + eps)?.sqrt()?)?;
    Ok(xn.broadcast_mul(weight)?.broadcast_add(bias)?)
}

/// `y = LN(x)·Wᵀ + b`, a pre-LayerNorm branch's LayerNorm and first linear
/// layer (the attention's query, key and value projection), in one op on
/// `x` and the packed `[γ, β, W, b]` (flattened; candle's custom ops take
/// at most three tensors). As [`layer_norm`] then [`linear`], the
/// normalised input was a node of candle's graph: a zero-filled gradient
/// and an addition with nothing to add in every backward pass. Same
/// arithmetic as the two ops, so the same bits.
struct LnLinear {
    d: usize,
    d_out: usize,
    eps: f32,
    level: SimdLevel,
    saved: Saved<LnSaved>,
}

/// What [`LnLinear`]'s forward pass keeps: LayerNorm's `(mean, 1/σ)` per
/// row and its output `(n, d)`.
type LnSaved = (Vec<(f32, f32)>, Vec<f32>);

impl LnLinear {
    /// `[γ, β, W, b]`, the parts of the packed vector `p`, for an input of
    /// shape `x`.
    fn parts<'p>(&self, x: &Shape, p: &'p [f32]) -> candle_core::Result<[&'p [f32]; 4]> {
        let (d, o) = (self.d, self.d_out);
        unpack(self.name(), (x, d), p, [d, d, o * d, o])
    }
}

impl Kernel for LnLinear {
    fn name(&self) -> &'static str {
        "lab-ln-linear"
    }
    fn forward(&self, inputs: &[In]) -> candle_core::Result<(Vec<f32>, Shape)> {
        let [(x, xs), (p, _)] = take(self.name(), inputs)?;
        let params = self.parts(xs, p)?;
        let (ln, stats, mut y, pending) = ln_product(x, params, self.eps, self.level);
        if let Some(bias) = pending {
            add_bias(&mut y, bias, None);
        }
        self.saved.keep((stats, ln));
        let mut dims = xs.dims().to_vec();
        *dims.last_mut().expect("rank ≥ 1") = self.d_out;
        Ok((y, Shape::from(dims)))
    }
    fn backward(&self, inputs: &[In], dy: &[f32]) -> candle_core::Result<Vec<Grad>> {
        let [(x, xs), (p, _)] = take(self.name(), inputs)?;
        let [g, _, w, _] = self.parts(xs, p)?;
        let (d, o) = (self.d, self.d_out);
        let n = x.len() / d;
        self.saved.with(self.name(), |(stats, ln)| {
            let (dln, dw, db) = linear_bwd(ln, w, dy, n, d, o, true, self.level);
            let (dx, dg, dbe) = layer_norm_bwd(x, g, &dln, stats, d, None);
            vec![Grad::Data(dx), pack([dg, dbe, dw, db.unwrap_or_default()])]
        })
    }
}

/// LayerNorm of `x` with `[γ, β, W, b]` (`γ`, `β` of `d`, `W` `(d_out, d)`),
/// then its product with `W` and `b`, the bias possibly left for the caller
/// ([`linear_product`]): `(LN(x), (mean, 1/σ) per row, product, pending
/// bias)`.
#[allow(clippy::type_complexity)]
pub(super) fn ln_product<'p>(
    x: &[f32],
    [g, be, w, b]: [&'p [f32]; 4],
    eps: f32,
    level: SimdLevel,
) -> (Vec<f32>, Vec<(f32, f32)>, Vec<f32>, Option<&'p [f32]>) {
    let (d, d_out) = (g.len(), b.len());
    let n = x.len() / d.max(1);
    let (ln, stats) = layer_norm_fwd(x, g, be, eps);
    let (y, pending) = linear_product(&ln, w, Some(b), n, d, d_out, level);
    (ln, stats, y, pending)
}

/// `LN(x)·Wᵀ + b` (LayerNorm with `ln_w`, `ln_b` and `eps`; `W` `(out, d)`):
/// fused in one op (the same values and gradients as the fused
/// [`layer_norm`] then [`linear`], bit for bit), or composed from those
/// (`fused = false`: their references).
///
/// # Errors
/// Shape mismatches; candle errors.
pub fn ln_linear(
    x: &Tensor,
    ln_w: &Tensor,
    ln_b: &Tensor,
    eps: f64,
    (w, b): (&Tensor, &Tensor),
    fused: bool,
) -> Result<Tensor, NnError> {
    let d = x.dim(D::Minus1)?;
    let (d_out, d_in) = w.dims2()?;
    let shapes_fit = d_in == d && ln_w.dims1()? == d && ln_b.dims1()? == d && b.dims1()? == d_out;
    if !(use_fused(fused, &[x, ln_w, ln_b, w, b]) && shapes_fit) {
        return linear(&layer_norm(x, ln_w, ln_b, eps, fused)?, w, Some(b), fused);
    }
    let packed = Tensor::cat(&[ln_w, ln_b, &w.flatten_all()?, b], 0)?;
    let op = LnLinear {
        d,
        d_out,
        eps: eps as f32,
        level: SimdLevel::detect(),
        saved: Saved::default(),
    };
    apply(op, &[x, &packed])
}
