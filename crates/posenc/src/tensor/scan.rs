//! Differentiable cumulative sums along the last dimension, forward
//! (`y_t = Σ_{s ≤ t} x_s`) and reverse (`y_t = Σ_{s ≥ t} x_s`), in `O(n)`.
//!
//! candle's `Tensor::cumsum` multiplies by an `n × n` triangular matrix
//! (`O(n²)` per row, and an `n × n` matrix allocated); CoPE's contextual
//! positions (a reverse sum over the keys of every query) and forgetting
//! attention's cumulative log gates use these instead. On the CPU they are
//! one sequential pass per row (accumulated in `f64`); the backward pass of
//! a forward sum is the reverse sum of the gradient and vice versa. On other
//! devices, and as the reference they are tested against,
//! [`cumsum_last_matmul`] computes the same with a triangular matmul.
//!
//! ```
//! use candle_core::{Device, Tensor};
//! use posenc::tensor::scan::{cumsum_last, reverse_cumsum_last};
//!
//! let x = Tensor::new(&[[1f32, 2., 3.], [4., 5., 6.]], &Device::Cpu)?;
//! assert_eq!(cumsum_last(&x)?.to_vec2::<f32>()?, [[1., 3., 6.], [4., 9., 15.]]);
//! assert_eq!(reverse_cumsum_last(&x)?.to_vec2::<f32>()?, [[6., 5., 3.], [15., 11., 6.]]);
//! # Ok::<(), posenc::Error>(())
//! ```

use candle_core::{CpuStorage, DType, Layout, Shape, Tensor};

use super::custom::{AsCustomOp, CpuOutput, SliceGrads, SliceOp};

use crate::error::Result;

#[derive(Debug, Clone, Copy)]
struct Scan {
    reverse: bool,
}

fn scan_rows<T: Copy>(
    src: &[T],
    n: usize,
    reverse: bool,
    to: impl Fn(T) -> f64,
    from: impl Fn(f64) -> T,
) -> Vec<T> {
    let mut out = src.to_vec();
    for row in out.chunks_mut(n.max(1)) {
        let mut acc = 0.0f64;
        let mut step = |v: &mut T| {
            acc += to(*v);
            *v = from(acc);
        };
        if reverse {
            row.iter_mut().rev().for_each(&mut step);
        } else {
            row.iter_mut().for_each(&mut step);
        }
    }
    out
}

/// The forward pass of a CPU op `posenc {what}` on a contiguous `f32` or
/// `f64` input: `on_f32` or `on_f64` of its elements, in the input's shape.
pub(crate) fn float_op(
    what: &str,
    s: &CpuStorage,
    l: &Layout,
    on_f32: impl FnOnce(&[f32]) -> Vec<f32>,
    on_f64: impl FnOnce(&[f64]) -> Vec<f64>,
) -> candle_core::Result<(CpuStorage, Shape)> {
    use candle_core::backend::BackendStorage;
    let (o1, o2) = l
        .contiguous_offsets()
        .ok_or_else(|| candle_core::Error::Msg(format!("posenc {what}: input not contiguous")))?;
    let out = match s {
        CpuStorage::F32(v) => CpuStorage::F32(on_f32(&v[o1..o2])),
        CpuStorage::F64(v) => CpuStorage::F64(on_f64(&v[o1..o2])),
        other => {
            return Err(candle_core::Error::Msg(format!(
                "posenc {what}: unsupported dtype {:?}",
                other.dtype()
            )))
        }
    };
    Ok((out, l.shape().clone()))
}

impl SliceOp for Scan {
    fn name(&self) -> &'static str {
        if self.reverse {
            "posenc-reverse-cumsum"
        } else {
            "posenc-cumsum"
        }
    }

    fn cpu_fwd(&self, args: &[(&CpuStorage, &Layout)]) -> CpuOutput {
        let (s, l) = args[0];
        let n = l.dims().last().copied().unwrap_or(1);
        float_op(
            "cumsum",
            s,
            l,
            |v| scan_rows(v, n, self.reverse, f64::from, |x| x as f32),
            |v| scan_rows(v, n, self.reverse, |x| x, |x| x),
        )
    }

    fn bwd(&self, _args: &[&Tensor], _res: &Tensor, grad_res: &Tensor) -> SliceGrads {
        let op = AsCustomOp(Scan {
            reverse: !self.reverse,
        });
        Ok(vec![Some(grad_res.contiguous()?.apply_op1(op)?)])
    }
}

fn scan(x: &Tensor, reverse: bool) -> Result<Tensor> {
    if x.rank() == 0 || x.elem_count() == 0 {
        return Ok(x.clone());
    }
    if !x.device().is_cpu() {
        return cumsum_last_matmul(x, reverse);
    }
    match x.dtype() {
        DType::F32 | DType::F64 => Ok(x.contiguous()?.apply_op1(AsCustomOp(Scan { reverse }))?),
        other => Ok(x
            .to_dtype(DType::F32)?
            .contiguous()?
            .apply_op1(AsCustomOp(Scan { reverse }))?
            .to_dtype(other)?),
    }
}

/// `y[…, t] = Σ_{s ≤ t} x[…, s]`, differentiable (see the [module docs](self)).
/// `f32` and `f64` are summed in `f64`; other float dtypes go through `f32`.
///
/// # Errors
/// Candle errors (for example an integer dtype).
pub fn cumsum_last(x: &Tensor) -> Result<Tensor> {
    scan(x, false)
}

/// `y[…, t] = Σ_{s ≥ t} x[…, s]`, differentiable (see the [module docs](self)).
///
/// # Errors
/// Candle errors (for example an integer dtype).
pub fn reverse_cumsum_last(x: &Tensor) -> Result<Tensor> {
    scan(x, true)
}

/// The same sums as a matmul with an `n × n` triangular 0/1 matrix
/// (`O(n²)` per row): the reference, and the path on non-CPU devices.
///
/// # Errors
/// Candle errors.
pub fn cumsum_last_matmul(x: &Tensor, reverse: bool) -> Result<Tensor> {
    if x.rank() == 0 || x.elem_count() == 0 {
        return Ok(x.clone());
    }
    let n = x.dim(x.rank() - 1)?;
    // forward: y_t = Σ_s x_s·U[s, t] with U[s, t] = 1 for s ≤ t (upper
    // triangle); reverse: the lower triangle.
    let tri: Vec<f32> = (0..n)
        .flat_map(|s| {
            (0..n).map(move |t| {
                let keep = if reverse { s >= t } else { s <= t };
                f32::from(u8::from(keep))
            })
        })
        .collect();
    let tri = Tensor::from_vec(tri, (n, n), x.device())?.to_dtype(x.dtype())?;
    Ok(x.contiguous()?.broadcast_matmul(&tri)?)
}
