//! Mean cross-entropy from logits ([`cross_entropy`]): the log-sum-exp of
//! each row; the gradient is `softmax − onehot`.

use candle_core::{DType, Shape, Tensor, D};
use posenc::kernels::{tile, SimdLevel};

use super::fused::{apply, take, use_fused, Grad, In, Kernel, Saved};
use crate::NnError;

/// Mean cross-entropy of `(N, V)` logits against `N` targets (`ignore`
/// rows are not scored), saving the log-sum-exp of each row.
struct CrossEntropy {
    targets: Vec<i64>,
    ignore: i64,
    lse: Saved<Vec<f32>>,
}

impl CrossEntropy {
    fn count(&self) -> usize {
        self.targets.iter().filter(|&&t| t != self.ignore).count()
    }
}

impl Kernel for CrossEntropy {
    fn name(&self) -> &'static str {
        "lab-cross-entropy"
    }
    fn forward(&self, inputs: &[In]) -> candle_core::Result<(Vec<f32>, Shape)> {
        let [(x, xs)] = take(self.name(), inputs)?;
        let (n, v) = xs.dims2()?;
        if self.targets.len() != n {
            candle_core::bail!("cross-entropy: {n} rows, {} targets", self.targets.len());
        }
        let mut lse = vec![0f32; n];
        let mut loss = vec![0f32; n];
        if let Some(&t) = self
            .targets
            .iter()
            .find(|&&t| t != self.ignore && (t < 0 || t as usize >= v))
        {
            candle_core::bail!("cross-entropy: target {t} outside 0..{v}");
        }
        xent_rows(SimdLevel::detect(), x, v, &mut lse);
        for r in 0..n {
            let t = self.targets[r];
            if t != self.ignore {
                loss[r] = lse[r] - x[r * v + t as usize];
            }
        }
        let total = loss.iter().map(|&l| l as f64).sum::<f64>() / self.count().max(1) as f64;
        self.lse.keep(lse);
        Ok((vec![total as f32], Shape::from(())))
    }
    fn backward(&self, inputs: &[In], dy: &[f32]) -> candle_core::Result<Vec<Grad>> {
        let [(x, xs)] = take(self.name(), inputs)?;
        let (n, v) = xs.dims2()?;
        let Some(&g) = dy.first() else {
            candle_core::bail!("cross-entropy: no output gradient");
        };
        let g = g / self.count().max(1) as f32;
        let dx = self
            .lse
            .with(self.name(), |lse| self.grad(x, lse, g, n, v))?;
        Ok(vec![Grad::Data(dx)])
    }
}

/// The log-sum-exp of every row of `x` (rows of `v`).
#[inline(always)]
fn xent_rows_body(x: &[f32], v: usize, lse: &mut [f32]) {
    // The exponentials go through a buffer as a plain map (which the
    // compiler vectorises; accumulating them in place kept `exp` scalar),
    // then a lane-ordered sum, so the result does not depend on the level.
    let mut buf = [0f32; 512];
    for (row, l) in x.chunks_exact(v).zip(lse) {
        let m = tile::max(row);
        let mut total = 0f32;
        for chunk in row.chunks(buf.len()) {
            let b = &mut buf[..chunk.len()];
            for (o, z) in b.iter_mut().zip(chunk) {
                *o = tile::exp(z - m);
            }
            total += tile::sum(b);
        }
        *l = m + total.ln();
    }
}
posenc::multiversion!(fn xent_rows => xent_rows_body(x: &[f32], v: usize, lse: &mut [f32]) -> ());

/// `g·softmax(x)` per row.
#[inline(always)]
fn softmax_rows_body(x: &[f32], lse: &[f32], g: f32, out: &mut [f32]) {
    let v = x.len() / lse.len().max(1);
    for ((row, l), o) in x.chunks_exact(v).zip(lse).zip(out.chunks_exact_mut(v)) {
        for (ov, z) in o.iter_mut().zip(row) {
            *ov = tile::exp(z - l) * g;
        }
    }
}
posenc::multiversion!(fn softmax_rows => softmax_rows_body(x: &[f32], lse: &[f32], g: f32, out: &mut [f32]) -> ());

impl CrossEntropy {
    fn grad(&self, xv: &[f32], lse: &[f32], g: f32, n: usize, v: usize) -> Vec<f32> {
        // SAFETY: softmax_rows writes every element.
        let mut dx = unsafe { tile::vec_for_overwrite(n * v) };
        softmax_rows(SimdLevel::detect(), xv, lse, g, &mut dx);
        for r in 0..n {
            let t = self.targets[r];
            if t == self.ignore {
                dx[r * v..][..v].fill(0.0);
            } else {
                dx[r * v + t as usize] -= g;
            }
        }
        dx
    }
}

/// Mean cross-entropy of logits `(N, V)` against `N` targets, skipping
/// rows whose target is `ignore`: fused, or composed (`log_softmax`,
/// `gather`, mask, mean).
///
/// # Errors
/// Shape mismatches, targets outside the vocabulary; candle errors.
pub fn cross_entropy(
    logits: &Tensor,
    targets: &Tensor,
    ignore: i64,
    fused: bool,
) -> Result<Tensor, NnError> {
    let (n, _) = logits.dims2()?;
    if targets.dims() != [n] {
        return Err(NnError::Invalid(format!(
            "cross-entropy: {n} rows of logits, targets {:?}",
            targets.dims()
        )));
    }
    if use_fused(fused, &[logits]) {
        let op = CrossEntropy {
            targets: targets.to_dtype(DType::I64)?.to_vec1::<i64>()?,
            ignore,
            lse: Saved::default(),
        };
        return apply(op, &[logits]);
    }
    let tgt = targets.to_dtype(DType::I64)?;
    let mask = tgt.ne(ignore)?;
    let safe = mask.where_cond(&tgt, &tgt.zeros_like()?)?;
    let logp = candle_nn::ops::log_softmax(logits, D::Minus1)?;
    let picked = logp.gather(&safe.unsqueeze(1)?, 1)?.squeeze(1)?;
    let maskf = mask.to_dtype(DType::F32)?;
    let count = maskf.sum_all()?;
    Ok((picked.mul(&maskf)?.sum_all()?.neg()? / count.maximum(1f32)?)?)
}
