//! How a fused kernel becomes a candle op: a [`Kernel`] computes an op's
//! forward and backward passes on `f32` buffers, and [`apply`] runs it as a
//! custom op of candle (one, two or three inputs; candle's custom ops take
//! at most three tensors, so the multi-parameter ops pack theirs into one
//! vector, [`unpack`] and [`pack`]); [`use_fused`] picks it or the composed
//! reference.

use std::sync::Mutex;

use candle_core::{CpuStorage, DType, Device, Layout, Shape, Tensor};
use posenc::tensor::custom::{apply_slice_op, CpuOutput, SliceGrads, SliceOp};

use crate::NnError;

/// An input of a [`Kernel`]: its elements in row-major order, and its
/// shape.
pub(super) type In<'a> = (&'a [f32], &'a Shape);

/// The gradient a [`Kernel`] gives one of its inputs.
pub(super) enum Grad {
    /// Its elements, in the input's shape.
    Data(Vec<f32>),
    /// The output's gradient itself (an input added to the output).
    Dy,
}

/// A fused op on `f32` CPU buffers: the forward and backward passes that
/// [`apply`] wraps into a candle custom op.
pub(super) trait Kernel: Send + Sync + 'static {
    /// The op's name in candle's graph and errors.
    fn name(&self) -> &'static str;

    /// The output and its shape, from the inputs.
    fn forward(&self, inputs: &[In]) -> candle_core::Result<(Vec<f32>, Shape)>;

    /// The gradient of each input, in order, from the inputs and the
    /// output's gradient `dy` (row-major, the output's shape). Candle runs
    /// [`forward`](Self::forward) when the op is applied, before any
    /// backward pass can reach it: what the forward pass keeps
    /// ([`Saved`]) is there.
    fn backward(&self, inputs: &[In], dy: &[f32]) -> candle_core::Result<Vec<Grad>>;
}

/// Whether to run an op's fused kernel: asked for, and every tensor it
/// reads an `f32` CPU tensor (others take the reference).
pub(super) fn use_fused(fused: bool, tensors: &[&Tensor]) -> bool {
    fused
        && tensors
            .iter()
            .all(|t| matches!(t.device(), Device::Cpu) && t.dtype() == DType::F32)
}

/// `kernel` applied to `inputs` (made contiguous) as one candle op with
/// its backward pass.
///
/// # Errors
/// Those of the kernel; more than three inputs.
pub(super) fn apply<K: Kernel>(kernel: K, inputs: &[&Tensor]) -> Result<Tensor, NnError> {
    let x = inputs
        .iter()
        .map(|t| t.contiguous())
        .collect::<candle_core::Result<Vec<_>>>()?;
    if !(1..=3).contains(&x.len()) {
        return Err(NnError::Invalid(format!(
            "{}: a candle op takes 1 to 3 tensors, not {}",
            kernel.name(),
            x.len()
        )));
    }
    let refs: Vec<&Tensor> = x.iter().collect();
    Ok(apply_slice_op(Op(kernel), &refs)?)
}

/// What a kernel's forward pass keeps for its backward pass.
pub(super) struct Saved<T>(Mutex<Option<T>>);

impl<T> Default for Saved<T> {
    fn default() -> Self {
        Saved(Mutex::new(None))
    }
}

impl<T> Saved<T> {
    /// Keeps `value` (the forward pass).
    pub(super) fn keep(&self, value: T) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(value);
    }

    /// `f` of what was kept; an error before any forward pass.
    pub(super) fn with<R>(&self, op: &str, f: impl FnOnce(&T) -> R) -> candle_core::Result<R> {
        let kept = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match kept.as_ref() {
            Some(v) => Ok(f(v)),
            None => candle_core::bail!("{op}: backward pass before the forward pass"),
        }
    }
}

/// A kernel's `N` inputs as an array.
///
/// # Errors
/// Another number of inputs.
pub(super) fn take<'a, const N: usize>(
    op: &str,
    inputs: &[In<'a>],
) -> candle_core::Result<[In<'a>; N]> {
    inputs.try_into().map_err(|_| {
        candle_core::Error::Msg(format!("{op}: {} inputs, expected {N}", inputs.len()))
    })
}

/// The parts of a packed parameter vector `p` (candle's custom ops take at
/// most three tensors: an op with more parameters takes them flattened and
/// concatenated), of the given sizes, for an input `x` whose rows have `d`
/// elements.
///
/// # Errors
/// `d` 0, rows of `x` of another size, `p` of another length than the parts.
pub(super) fn unpack<'p, const N: usize>(
    op: &str,
    (x, d): (&Shape, usize),
    p: &'p [f32],
    sizes: [usize; N],
) -> candle_core::Result<[&'p [f32]; N]> {
    let len = sizes.iter().sum::<usize>();
    if d == 0 || x.dims().last() != Some(&d) || p.len() != len {
        candle_core::bail!(
            "{op}: input {x:?}, {} parameters for parts {sizes:?}",
            p.len()
        );
    }
    let mut rest = p;
    Ok(sizes.map(|n| {
        let (part, tail) = rest.split_at(n);
        rest = tail;
        part
    }))
}

/// The gradient of a packed parameter vector: its parts' gradients, in
/// packing order, one after the other.
pub(super) fn pack<const N: usize>(parts: [Vec<f32>; N]) -> Grad {
    let mut out = Vec::with_capacity(parts.iter().map(Vec::len).sum());
    for part in parts {
        out.extend_from_slice(&part);
    }
    Grad::Data(out)
}

/// A [`Kernel`] as a candle custom op.
struct Op<K>(K);

impl<K: Kernel> SliceOp for Op<K> {
    fn name(&self) -> &'static str {
        self.0.name()
    }

    fn cpu_fwd(&self, inputs: &[(&CpuStorage, &Layout)]) -> CpuOutput {
        let name = self.0.name();
        let data = inputs
            .iter()
            .map(|&(s, l)| match (s, l.contiguous_offsets()) {
                (CpuStorage::F32(v), Some((a, b))) => Ok((&v[a..b], l.shape())),
                (CpuStorage::F32(_), None) => {
                    candle_core::bail!("{name}: fused op needs a contiguous tensor")
                }
                _ => candle_core::bail!("{name}: fused op needs f32"),
            })
            .collect::<candle_core::Result<Vec<_>>>()?;
        let (y, shape) = self.0.forward(&data)?;
        Ok((CpuStorage::F32(y), shape))
    }

    /// The gradients of `inputs`, as the kernel gives them.
    fn bwd(&self, inputs: &[&Tensor], _res: &Tensor, dy: &Tensor) -> SliceGrads {
        let mut all = inputs.to_vec();
        all.push(dy);
        let grads = with_f32s(&all, |v| {
            let x: Vec<In> = v.iter().zip(inputs).map(|(d, t)| (*d, t.shape())).collect();
            self.0.backward(&x[..inputs.len()], v[inputs.len()])
        })??;
        if grads.len() != inputs.len() {
            candle_core::bail!(
                "{}: {} gradients for {} inputs",
                self.0.name(),
                grads.len(),
                inputs.len()
            );
        }
        let out = grads
            .into_iter()
            .zip(inputs)
            .map(|(g, x)| {
                Ok(Some(match g {
                    Grad::Data(v) => Tensor::from_vec(v, x.shape(), x.device())?,
                    Grad::Dy => dy.clone(),
                }))
            })
            .collect::<candle_core::Result<Vec<_>>>()?;
        Ok(out)
    }
}

/// Runs `f` on the tensors' `f32` elements in row-major order, each read
/// in place when it is a contiguous `f32` CPU tensor, copied otherwise.
fn with_f32s<R>(ts: &[&Tensor], f: impl FnOnce(&[&[f32]]) -> R) -> candle_core::Result<R> {
    fn go(
        ts: &[&Tensor],
        done: &[&[f32]],
        f: &mut dyn FnMut(&[&[f32]]),
    ) -> candle_core::Result<()> {
        let Some((t, rest)) = ts.split_first() else {
            f(done);
            return Ok(());
        };
        let mut next = |v: &[f32]| {
            let mut all = done.to_vec();
            all.push(v);
            go(rest, &all, f)
        };
        if t.is_contiguous() && t.dtype() == DType::F32 {
            let (s, l) = t.storage_and_layout();
            if let (candle_core::Storage::Cpu(CpuStorage::F32(v)), Some((a, b))) =
                (&*s, l.contiguous_offsets())
            {
                return next(&v[a..b]);
            }
        }
        let v = t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
        next(&v)
    }
    let mut f = Some(f);
    let mut out = None;
    go(ts, &[], &mut |v| out = f.take().map(|f| f(v)))?;
    Ok(out.expect("every tensor read"))
}
