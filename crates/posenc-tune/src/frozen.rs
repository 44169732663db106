//! `x · Wᵀ` with a frozen `W`: the forward pass is candle's own matmul, and
//! the backward pass returns the input's gradient only.
//!
//! Candle's matmul backward computes the gradient of both operands, also of
//! a weight that no optimiser will read: one more matrix product per
//! projection (as costly as the forward) and a weight-sized buffer, thrown
//! away. LoRA freezes every base weight, so that product is a third of the
//! projections' training arithmetic. [`frozen_linear`] skips it; its values
//! and the input's gradient are candle's to the bit (the same calls on the
//! same operands), which `tests` checks.

use candle_core::{CpuStorage, CustomOp1, Device, Layout, Shape, Storage, Tensor};

use crate::error::Result;

/// `x · Wᵀ`, `x` `(T, in)`, `w` `(out, in)` → `(T, out)`; differentiable in
/// `x` only (`w` is a constant).
///
/// # Errors
/// Candle's (shapes that do not multiply).
pub fn frozen_linear(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    if !x.track_op() || !matches!(x.device(), Device::Cpu) || x.dtype() != candle_core::DType::F32 {
        return Ok(x.matmul(&w.t()?)?);
    }
    Ok(x.contiguous()?.apply_op1(FrozenLinear { w: w.clone() })?)
}

/// The custom op behind [`frozen_linear`].
struct FrozenLinear {
    /// `(out, in)`.
    w: Tensor,
}

impl CustomOp1 for FrozenLinear {
    fn name(&self) -> &'static str {
        "posenc-tune-frozen-linear"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let CpuStorage::F32(v) = s else {
            candle_core::bail!("frozen linear: f32 inputs only");
        };
        let Some((a, b)) = l.contiguous_offsets() else {
            candle_core::bail!("frozen linear: a contiguous input");
        };
        let x = Tensor::from_slice(&v[a..b], l.shape(), &Device::Cpu)?;
        let y = x.matmul(&self.w.t()?)?;
        let shape = y.shape().clone();
        let (st, yl) = y.storage_and_layout();
        let out = match (&*st, yl.contiguous_offsets()) {
            (Storage::Cpu(CpuStorage::F32(o)), Some((a, b))) => o[a..b].to_vec(),
            _ => candle_core::bail!("frozen linear: an unexpected product layout"),
        };
        Ok((CpuStorage::F32(out), shape))
    }

    fn bwd(&self, _x: &Tensor, _y: &Tensor, dy: &Tensor) -> candle_core::Result<Option<Tensor>> {
        // d(x·Wᵀ)/dx = dy · W, as candle's matmul backward computes it.
        Ok(Some(dy.matmul(&self.w.t()?.t()?)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Var;

    #[test]
    fn values_and_input_gradient_are_candles_to_the_bit() {
        let dev = Device::Cpu;
        let w = Tensor::randn(0f32, 1.0, (24, 40), &dev).unwrap();
        let x0 = Tensor::randn(0f32, 1.0, (33, 40), &dev).unwrap();
        let up = Tensor::randn(0f32, 1.0, (33, 24), &dev).unwrap();
        let wt = w.t().unwrap();
        let run = |frozen: bool| {
            let x = Var::from_tensor(&x0).unwrap();
            let y = if frozen {
                frozen_linear(x.as_tensor(), &w).unwrap()
            } else {
                x.as_tensor().matmul(&wt).unwrap()
            };
            let loss = (&y * &up).unwrap().sum_all().unwrap();
            let g = loss.backward().unwrap();
            let values = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            (
                values(&y),
                values(g.get(x.as_tensor()).unwrap()),
                g.get(&wt).is_some() || g.get(&w).is_some(),
            )
        };
        let (y_ref, gx_ref, w_grad_ref) = run(false);
        let (y, gx, w_grad) = run(true);
        assert_eq!(y, y_ref);
        assert_eq!(gx, gx_ref);
        // candle's matmul computes the frozen weight's gradient (stored under
        // the transposed operand); the op does not.
        assert!(w_grad_ref);
        assert!(!w_grad);
    }

    #[test]
    fn untracked_inputs_take_the_plain_product() {
        let dev = Device::Cpu;
        let w = Tensor::randn(0f32, 1.0, (3, 5), &dev).unwrap();
        let x = Tensor::randn(0f32, 1.0, (2, 5), &dev).unwrap();
        let y = frozen_linear(&x, &w).unwrap();
        let want = x.matmul(&w.t().unwrap()).unwrap();
        assert_eq!(
            y.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            want.flatten_all().unwrap().to_vec1::<f32>().unwrap()
        );
    }
}
