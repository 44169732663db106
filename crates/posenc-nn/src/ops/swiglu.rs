//! The gated unit of a SwiGLU feed-forward block ([`swiglu`]):
//! `silu(gate) ⊙ up` (Shazeer 2020, "GLU variants improve transformer").

use candle_core::{Shape, Tensor};
use posenc::kernels::{tile, SimdLevel};

use super::fused::{apply, take, use_fused, Grad, In, Kernel};
use super::rows::{for_chunk_pairs, for_rows};
use crate::NnError;

/// Elements per task of the row-parallel loops.
const WIDTH: usize = 4096;

/// `silu(g) ⊙ u` (inputs `[g, u]` of one shape).
struct SwigluOp;

impl Kernel for SwigluOp {
    fn name(&self) -> &'static str {
        "lab-swiglu"
    }
    fn forward(&self, inputs: &[In]) -> candle_core::Result<(Vec<f32>, Shape)> {
        let [(g, gs), (u, us)] = take(self.name(), inputs)?;
        if gs != us {
            candle_core::bail!("swiglu: gate {gs:?}, up {us:?}");
        }
        // SAFETY: every element is written below.
        let mut y = unsafe { tile::vec_for_overwrite(g.len()) };
        let level = SimdLevel::detect();
        for_rows(&mut y, WIDTH, |r, yr| {
            let n = yr.len();
            swiglu_fwd(level, &g[r * WIDTH..][..n], &u[r * WIDTH..][..n], yr)
        });
        Ok((y, gs.clone()))
    }
    fn backward(&self, inputs: &[In], dy: &[f32]) -> candle_core::Result<Vec<Grad>> {
        let [(g, _), (u, _)] = take(self.name(), inputs)?;
        // SAFETY: every element of both is written below.
        let mut dg = unsafe { tile::vec_for_overwrite(g.len()) };
        let mut du = unsafe { tile::vec_for_overwrite(g.len()) };
        let level = SimdLevel::detect();
        for_chunk_pairs((&mut dg, WIDTH), (&mut du, WIDTH), |r, a, b| {
            let n = a.len();
            let base = r * WIDTH;
            swiglu_bwd(
                level,
                &g[base..][..n],
                &u[base..][..n],
                &dy[base..][..n],
                a,
                b,
            )
        });
        Ok(vec![Grad::Data(dg), Grad::Data(du)])
    }
}

#[inline(always)]
fn swiglu_fwd_body(g: &[f32], u: &[f32], y: &mut [f32]) {
    for ((o, &a), &b) in y.iter_mut().zip(g).zip(u) {
        *o = a / (1.0 + tile::exp(-a)) * b;
    }
}
posenc::multiversion!(fn swiglu_fwd => swiglu_fwd_body(g: &[f32], u: &[f32], y: &mut [f32]) -> ());

/// `dg = dy·u·σ(g)·(1 + g·(1 − σ(g)))`, `du = dy·silu(g)`.
#[inline(always)]
fn swiglu_bwd_body(g: &[f32], u: &[f32], dy: &[f32], dg: &mut [f32], du: &mut [f32]) {
    for ((((a, b), &x), &v), &d) in dg.iter_mut().zip(du.iter_mut()).zip(g).zip(u).zip(dy) {
        let s = 1.0 / (1.0 + tile::exp(-x));
        *a = d * v * s * (1.0 + x * (1.0 - s));
        *b = d * x * s;
    }
}
posenc::multiversion!(fn swiglu_bwd => swiglu_bwd_body(
    g: &[f32], u: &[f32], dy: &[f32], dg: &mut [f32], du: &mut [f32]) -> ());

/// `silu(gate) ⊙ up` for two tensors of one shape: fused (one pass
/// forward, one backward giving both gradients), or candle's `silu` and a
/// product.
///
/// # Errors
/// Shapes that differ; candle errors.
pub fn swiglu(gate: &Tensor, up: &Tensor, fused: bool) -> Result<Tensor, NnError> {
    if gate.dims() != up.dims() {
        return Err(NnError::Invalid(format!(
            "swiglu: gate {:?}, up {:?}",
            gate.dims(),
            up.dims()
        )));
    }
    if use_fused(fused, &[gate, up]) {
        return apply(SwigluOp, &[gate, up]);
    }
    Ok((gate.silu()? * up)?)
}
