//! A pre-LayerNorm block's MLP half with its residual, in one op
//! ([`mlp_residual`]).

use candle_core::{Shape, Tensor, D};
use posenc::kernels::SimdLevel;

use super::fused::{apply, pack, take, unpack, use_fused, Grad, In, Kernel, Saved};
use super::gelu::{gelu_after_bias, gelu_bwd_sums};
use super::layer_norm::{layer_norm, layer_norm_bwd, ln_product};
use super::linear::{add_bias, linear, linear_bwd, linear_gelu, linear_product};
use super::rows::add_into;
use crate::NnError;

/// What [`MlpResidual`]'s forward pass keeps for its backward pass.
struct MlpSaved {
    /// LayerNorm's `(mean, 1/σ)` per row.
    stats: Vec<(f32, f32)>,
    /// LayerNorm's output `(n, d)`.
    ln: Vec<f32>,
    /// The first layer's pre-activation `(n, d_ff)`.
    pre: Vec<f32>,
    /// Its GELU `(n, d_ff)`.
    h: Vec<f32>,
}

/// `y = x + W₂·GELU(W₁·LN(x) + b₁) + b₂`, a pre-LayerNorm block's MLP half
/// with its residual, in one op on `x` and one packed parameter vector
/// (`[γ, β, W₁, b₁, W₂, b₂]`, flattened; candle's custom ops take at most
/// three tensors, the concatenation routes each part's gradient back to its
/// parameter). As [`layer_norm`], [`linear_gelu`], [`linear`] and an
/// addition, candle's graph had four nodes here, and its backward pass
/// allocates a zero gradient for each node's input and adds each incoming
/// gradient to it: `(B·T, d)` and `(B·T, 4·d)` zero-fills and additions
/// with nothing to add, and a forward pass over the sum. Same arithmetic as
/// those four ops, kernel for kernel, so the same bits.
struct MlpResidual {
    d: usize,
    d_ff: usize,
    eps: f32,
    level: SimdLevel,
    saved: Saved<MlpSaved>,
}

impl MlpResidual {
    /// `[γ, β, W₁, b₁, W₂, b₂]`, the parts of the packed vector `p`, for
    /// an input of shape `x`.
    fn parts<'p>(&self, x: &Shape, p: &'p [f32]) -> candle_core::Result<[&'p [f32]; 6]> {
        let (d, f) = (self.d, self.d_ff);
        unpack(self.name(), (x, d), p, [d, d, f * d, f, d * f, d])
    }
}

impl Kernel for MlpResidual {
    fn name(&self) -> &'static str {
        "lab-mlp-residual"
    }
    fn forward(&self, inputs: &[In]) -> candle_core::Result<(Vec<f32>, Shape)> {
        let [(x, xs), (p, _)] = take(self.name(), inputs)?;
        let [g, be, w1, b1, w2, b2] = self.parts(xs, p)?;
        let (d, f) = (self.d, self.d_ff);
        let n = x.len() / d;
        let (ln, stats, mut pre, pending) = ln_product(x, [g, be, w1, b1], self.eps, self.level);
        let h = gelu_after_bias(&mut pre, pending);
        let (mut y, pending) = linear_product(&h, w2, Some(b2), n, f, d, self.level);
        // The residual: x + MLP(x).
        match pending {
            Some(b) => add_bias(&mut y, b, Some(x)),
            None => add_into(&mut y, x),
        }
        self.saved.keep(MlpSaved { stats, ln, pre, h });
        Ok((y, xs.clone()))
    }
    fn backward(&self, inputs: &[In], dy: &[f32]) -> candle_core::Result<Vec<Grad>> {
        let [(x, xs), (p, _)] = take(self.name(), inputs)?;
        let [g, _, w1, _, w2, _] = self.parts(xs, p)?;
        let (d, f) = (self.d, self.d_ff);
        let n = x.len() / d;
        self.saved.with(self.name(), |s| {
            // The second layer, then GELU, then the first, then LayerNorm.
            let (dh, dw2, db2) = linear_bwd(&s.h, w2, dy, n, f, d, true, self.level);
            let (dpre, db1) = gelu_bwd_sums(&s.pre, &dh, f);
            drop(dh);
            let (dln, dw1, _) = linear_bwd(&s.ln, w1, &dpre, n, d, f, false, self.level);
            drop(dpre);
            // LayerNorm's gradient plus the residual's, as candle's backward
            // pass adds them.
            let (dx, dg, dbe) = layer_norm_bwd(x, g, &dln, &s.stats, d, Some(dy));
            vec![
                Grad::Data(dx),
                pack([dg, dbe, dw1, db1, dw2, db2.unwrap_or_default()]),
            ]
        })
    }
}

/// `x + W₂·GELU(W₁·LN(x) + b₁) + b₂` (LayerNorm with `ln_w`, `ln_b` and
/// `eps`; `W₁` `(d_ff, d)`, `W₂` `(d, d_ff)`): fused in one op (the same
/// values and gradients as the fused [`layer_norm`], [`linear_gelu`],
/// [`linear`] and an addition, bit for bit), or composed from those
/// (`fused = false`: their references).
///
/// # Errors
/// Shape mismatches; candle errors.
#[allow(clippy::too_many_arguments)]
pub fn mlp_residual(
    x: &Tensor,
    ln_w: &Tensor,
    ln_b: &Tensor,
    eps: f64,
    (w1, b1): (&Tensor, &Tensor),
    (w2, b2): (&Tensor, &Tensor),
    fused: bool,
) -> Result<Tensor, NnError> {
    let all = [x, ln_w, ln_b, w1, b1, w2, b2];
    let d = x.dim(D::Minus1)?;
    let (d_ff, d_in) = w1.dims2()?;
    let shapes_fit = d_in == d
        && w2.dims2()? == (d, d_ff)
        && ln_w.dims1()? == d
        && ln_b.dims1()? == d
        && b1.dims1()? == d_ff
        && b2.dims1()? == d;
    if !(use_fused(fused, &all) && shapes_fit) {
        let h = linear_gelu(&layer_norm(x, ln_w, ln_b, eps, fused)?, w1, Some(b1), fused)?;
        return Ok((x + linear(&h, w2, Some(b2), fused)?)?);
    }
    let packed = Tensor::cat(
        &[ln_w, ln_b, &w1.flatten_all()?, b1, &w2.flatten_all()?, b2],
        0,
    )?;
    let op = MlpResidual {
        d,
        d_ff,
        eps: eps as f32,
        level: SimdLevel::detect(),
        saved: Saved::default(),
    };
    apply(op, &[x, &packed])
}
