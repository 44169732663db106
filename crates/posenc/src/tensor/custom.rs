//! One adapter from an op over a slice of arguments to candle's custom-op
//! traits of one, two and three arguments (`CustomOp1`, `CustomOp2`,
//! `CustomOp3`), so that an op writes its forward and backward passes once
//! for every arity.

use candle_core::{CpuStorage, CustomOp1, CustomOp2, CustomOp3, Layout, Shape, Tensor};

/// What a [`SliceOp`]'s forward pass gives: the output's storage and shape.
pub type CpuOutput = candle_core::Result<(CpuStorage, Shape)>;

/// What a [`SliceOp`]'s backward pass gives: each argument's gradient.
pub type SliceGrads = candle_core::Result<Vec<Option<Tensor>>>;

/// An op on one to three tensors, written once for every arity; candle
/// runs it through [`AsCustomOp`] (or [`apply_slice_op`]).
pub trait SliceOp: Send + Sync {
    /// The op's name in candle's graph and errors.
    fn name(&self) -> &'static str;

    /// The forward pass on the CPU: the output's storage and shape from the
    /// arguments' storages and layouts, in order.
    ///
    /// # Errors
    /// The op's own, as candle errors.
    fn cpu_fwd(&self, args: &[(&CpuStorage, &Layout)]) -> candle_core::Result<(CpuStorage, Shape)>;

    /// The gradient of each argument, in order (`None` for one without),
    /// from the arguments, the op's output `res` and the output's gradient
    /// `dy`.
    ///
    /// # Errors
    /// The op's own, as candle errors.
    fn bwd(&self, args: &[&Tensor], res: &Tensor, dy: &Tensor) -> SliceGrads;
}

/// A [`SliceOp`] as candle's `CustomOp1`, `CustomOp2` and `CustomOp3`.
pub struct AsCustomOp<T>(pub T);

/// The gradient of the next argument: the next one [`SliceOp::bwd`] gave.
fn next_grad(grads: &mut std::vec::IntoIter<Option<Tensor>>, _arg: &Tensor) -> Option<Tensor> {
    grads.next().flatten()
}

/// Implements candle's custom-op trait of one arity for [`AsCustomOp`],
/// naming each argument's storage, layout and tensor.
macro_rules! custom_op {
    ($trait:ident, $out:ty, $(($s:ident, $l:ident, $x:ident)),+) => {
        impl<T: SliceOp> $trait for AsCustomOp<T> {
            fn name(&self) -> &'static str {
                self.0.name()
            }
            fn cpu_fwd(
                &self,
                $($s: &CpuStorage, $l: &Layout),+
            ) -> candle_core::Result<(CpuStorage, Shape)> {
                self.0.cpu_fwd(&[$(($s, $l)),+])
            }
            fn bwd(
                &self,
                $($x: &Tensor,)+
                res: &Tensor,
                dy: &Tensor,
            ) -> candle_core::Result<$out> {
                let mut g = self.0.bwd(&[$($x),+], res, dy)?.into_iter();
                Ok(($(next_grad(&mut g, $x)),+))
            }
        }
    };
}

custom_op!(CustomOp1, Option<Tensor>, (s1, l1, x1));
custom_op!(
    CustomOp2,
    (Option<Tensor>, Option<Tensor>),
    (s1, l1, x1),
    (s2, l2, x2)
);
custom_op!(
    CustomOp3,
    (Option<Tensor>, Option<Tensor>, Option<Tensor>),
    (s1, l1, x1),
    (s2, l2, x2),
    (s3, l3, x3)
);

/// `op` applied to `args` (one to three tensors) as one candle custom op.
///
/// # Errors
/// The op's own; no argument or more than three (candle's custom ops take
/// at most three tensors).
pub fn apply_slice_op<T: SliceOp + 'static>(
    op: T,
    args: &[&Tensor],
) -> candle_core::Result<Tensor> {
    let op = AsCustomOp(op);
    match args {
        [a] => a.apply_op1(op),
        [a, b] => a.apply_op2(b, op),
        [a, b, c] => a.apply_op3(b, c, op),
        _ => candle_core::bail!(
            "{}: a candle op takes 1 to 3 tensors, not {}",
            op.0.name(),
            args.len()
        ),
    }
}
