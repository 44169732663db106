//! `y = x·Wᵀ + b` ([`linear`], [`linear_at`]), with a GELU after it
//! ([`linear_gelu`]) or a residual added ([`linear_residual`]) in the same
//! op, and the products and gradients of a linear layer the other fused ops
//! share.

use candle_core::{Shape, Tensor, D};
use posenc::kernels::{tile, SimdLevel};

use super::fused::{apply, pack, take, unpack, use_fused, Grad, In, Kernel, Saved};
use super::gelu::{gelu_after_bias, gelu_bwd};
use super::matmul::{matmul, on_tiles, GEMM_ONE_PASS_K};
use super::rows::{add_into, column_sums, for_rows};
use crate::NnError;

/// `y = x·Wᵀ (+ b)` for `x` `(…, in)`, `W` `(out, in)`, `b` `(out,)` (the
/// inputs `[x, W]` or `[x, W, b]`), its products at `level`; with `gelu`,
/// `y = GELU(x·Wᵀ + b)` in the same op, which keeps the pre-activation for
/// its backward pass. As two ops, the pre-activation is a node of candle's
/// graph, and candle's backward pass allocates a zero gradient for every
/// node and adds each incoming gradient to it: for the lab's
/// `(B·T, 4·d_model)` MLP activations that is a zero-fill and a full-size
/// addition per layer and step, with nothing to add. Same arithmetic as the
/// two ops, so the same bits.
struct Linear {
    level: SimdLevel,
    bias: bool,
    /// With a GELU: the pre-activation, kept by the forward pass.
    gelu: Option<Saved<Vec<f32>>>,
}

impl Kernel for Linear {
    fn name(&self) -> &'static str {
        match (self.gelu.is_some(), self.bias) {
            (false, true) => "lab-linear",
            (false, false) => "lab-linear-nobias",
            (true, true) => "lab-linear-gelu",
            (true, false) => "lab-linear-gelu-nobias",
        }
    }
    fn forward(&self, inputs: &[In]) -> candle_core::Result<(Vec<f32>, Shape)> {
        let [(x, xs), (w, ws), bias @ ..] = inputs else {
            candle_core::bail!("{}: {} inputs", self.name(), inputs.len());
        };
        let (n, d_in, d_out, shape) = linear_dims(xs, ws)?;
        let b = bias.first().map(|b| b.0);
        let (mut y, pending) = linear_product(x, w, b, n, d_in, d_out, self.level);
        let Some(pre) = &self.gelu else {
            if let Some(b) = pending {
                add_bias(&mut y, b, None);
            }
            return Ok((y, shape));
        };
        let h = gelu_after_bias(&mut y, pending);
        pre.keep(y);
        Ok((h, shape))
    }
    fn backward(&self, inputs: &[In], dy: &[f32]) -> candle_core::Result<Vec<Grad>> {
        let [(x, _), (w, ws), ..] = inputs else {
            candle_core::bail!("{}: {} inputs", self.name(), inputs.len());
        };
        let (d_out, d_in) = ws.dims2()?;
        let n = x.len() / d_in.max(1);
        // With a GELU: the pre-activation's gradient, from the one kept.
        let d_pre = match &self.gelu {
            Some(pre) => Some(pre.with(self.name(), |pre| gelu_bwd(pre, dy))?),
            None => None,
        };
        let dy = d_pre.as_deref().unwrap_or(dy);
        let bias = inputs.len() == 3;
        let (dx, dw, db) = linear_bwd(x, w, dy, n, d_in, d_out, bias, self.level);
        Ok([Some(dx), Some(dw), db]
            .into_iter()
            .flatten()
            .map(Grad::Data)
            .collect())
    }
}

/// `x·Wᵀ (+ b)`, with the bias either added already (`None` returned) or
/// left for the caller to add to the finished product (`Some(b)`), in the
/// same pass as its next element-wise step.
///
/// Candle's reference adds `b` to the finished product; the fused ops have
/// always started the product from `b` (posenc's tiles accumulate into
/// `C`). Both orders give the same bits when the product is one sum per
/// element before it meets `C`: the `gemm` crate's products with
/// `k ≤` [`GEMM_ONE_PASS_K`]. Those defer the bias, which saves the pass
/// that copies `b` into every row and the product's read of it; the tile
/// products and longer sums keep the bias first, so no result changes.
pub(super) fn linear_product<'b>(
    x: &[f32],
    w: &[f32],
    bias: Option<&'b [f32]>,
    n: usize,
    d_in: usize,
    d_out: usize,
    level: SimdLevel,
) -> (Vec<f32>, Option<&'b [f32]>) {
    let defer = bias.is_some() && d_in <= GEMM_ONE_PASS_K && !on_tiles(level, n, d_out, d_in);
    let first = if defer { None } else { bias };
    let mut y = match first {
        Some(b) => {
            let mut y = Vec::with_capacity(n * d_out);
            for _ in 0..n {
                y.extend_from_slice(b);
            }
            y
        }
        // SAFETY: the product below overwrites every element.
        None => unsafe { tile::vec_for_overwrite(n * d_out) },
    };
    // y (n × out) (+)= x (n × in) · Wᵀ (in × out): Wᵀ has row stride 1, column stride in.
    matmul(
        level,
        n,
        d_out,
        d_in,
        &mut y,
        (d_out as isize, 1),
        first.is_some(),
        x,
        (d_in as isize, 1),
        w,
        (1, d_in as isize),
    );
    (y, if defer { bias } else { None })
}

/// `y[i, c] = (y[i, c] + b[c]) (+ r[i, c])` for row-major `y` with rows of
/// `b.len()`: a deferred bias, and a residual when given, in one pass.
pub(super) fn add_bias(y: &mut [f32], b: &[f32], r: Option<&[f32]>) {
    let d = b.len();
    let rows = (4096 / d).max(1);
    for_rows(y, rows * d, |ci, yc| {
        let base = ci * rows * d;
        match r {
            Some(r) => {
                for (yr, rr) in yc.chunks_mut(d).zip(r[base..].chunks(d)) {
                    for ((o, bv), rv) in yr.iter_mut().zip(b).zip(rr) {
                        *o = (*o + bv) + rv;
                    }
                }
            }
            None => {
                for yr in yc.chunks_mut(d) {
                    for (o, bv) in yr.iter_mut().zip(b) {
                        *o += bv;
                    }
                }
            }
        }
    });
}

/// `dx = dy·W`, `dW = dyᵀ·x`, `db = Σ dy`.
#[allow(clippy::too_many_arguments)]
pub(super) fn linear_bwd(
    x: &[f32],
    w: &[f32],
    dy: &[f32],
    n: usize,
    d_in: usize,
    d_out: usize,
    want_bias: bool,
    level: SimdLevel,
) -> (Vec<f32>, Vec<f32>, Option<Vec<f32>>) {
    // SAFETY: both products overwrite every element (accumulate = false).
    let mut dx = unsafe { tile::vec_for_overwrite(n * d_in) };
    matmul(
        level,
        n,
        d_in,
        d_out,
        &mut dx,
        (d_in as isize, 1),
        false,
        dy,
        (d_out as isize, 1),
        w,
        (d_in as isize, 1),
    );
    let mut dw = unsafe { tile::vec_for_overwrite(d_out * d_in) };
    matmul(
        level,
        d_out,
        d_in,
        n,
        &mut dw,
        (d_in as isize, 1),
        false,
        dy,
        (1, d_out as isize),
        x,
        (d_in as isize, 1),
    );
    let db = want_bias.then(|| column_sums(dy, n, d_out));
    (dx, dw, db)
}

/// `(rows, in, out, output shape)` of `x·Wᵀ` for `x` `(…, in)` and `W`
/// `(out, in)`.
fn linear_dims(x: &Shape, w: &Shape) -> candle_core::Result<(usize, usize, usize, Shape)> {
    let (d_out, d_in) = w.dims2()?;
    let xd = x.dims();
    if xd.last() != Some(&d_in) {
        candle_core::bail!("linear: input {:?} does not end in {d_in}", xd);
    }
    let n = x.elem_count() / d_in.max(1);
    let mut out = xd.to_vec();
    *out.last_mut().expect("non-empty") = d_out;
    Ok((n, d_in, d_out, Shape::from(out)))
}

/// `x·Wᵀ (+ b)` for `x` `(…, in)`, `W` `(out, in)`: fused, or candle-nn's
/// `Linear` (the reference).
///
/// # Errors
/// Shape mismatches; candle errors.
pub fn linear(x: &Tensor, w: &Tensor, b: Option<&Tensor>, fused: bool) -> Result<Tensor, NnError> {
    linear_inner(x, w, b, fused.then(SimdLevel::detect), false)
}

/// The fused [`linear`] with its products at `level` (for tests comparing
/// the levels; [`linear`] takes [`SimdLevel::detect`]).
///
/// # Errors
/// A level this CPU lacks; as [`linear`].
pub fn linear_at(
    x: &Tensor,
    w: &Tensor,
    b: Option<&Tensor>,
    level: SimdLevel,
) -> Result<Tensor, NnError> {
    if !level.is_supported() {
        return Err(candle_core::Error::Msg(format!(
            "linear: SIMD level {level} is not supported by this CPU"
        ))
        .into());
    }
    linear_inner(x, w, b, Some(level), false)
}

/// `x·Wᵀ (+ b)`, with a GELU after it when `gelu`: fused at `level`, or
/// the reference for `None`.
fn linear_inner(
    x: &Tensor,
    w: &Tensor,
    b: Option<&Tensor>,
    level: Option<SimdLevel>,
    gelu: bool,
) -> Result<Tensor, NnError> {
    let mut all = vec![x, w];
    all.extend(b);
    if let (Some(level), true) = (level, use_fused(true, &all)) {
        let op = Linear {
            level,
            bias: b.is_some(),
            gelu: gelu.then(Saved::default),
        };
        return apply(op, &all);
    }
    let lin = candle_nn::Linear::new(w.clone(), b.cloned());
    let y = candle_core::Module::forward(&lin, x)?;
    if gelu {
        return super::gelu::gelu(&y, level.is_some());
    }
    Ok(y)
}

/// `GELU(x·Wᵀ (+ b))`: fused in one op (the same values and gradients as
/// the fused [`linear`] then the fused [`gelu`](fn@super::gelu), bit for
/// bit), or candle-nn's `Linear` then candle's `gelu` (the reference).
///
/// # Errors
/// Shape mismatches; candle errors.
pub fn linear_gelu(
    x: &Tensor,
    w: &Tensor,
    b: Option<&Tensor>,
    fused: bool,
) -> Result<Tensor, NnError> {
    linear_inner(x, w, b, fused.then(SimdLevel::detect), true)
}

/// `y = r + (x·Wᵀ + b)`: a residual branch's last linear layer and the
/// addition, in one op on `x`, the packed `[W, b]` (flattened; candle's
/// custom ops take at most three tensors) and `r`. As [`linear`] and an
/// addition, the branch's output was a node of candle's graph: a zero-filled
/// gradient and an addition with nothing to add in every backward pass, and
/// a forward pass over the sum. Same arithmetic as the two ops, so the same
/// bits.
struct LinearResidual {
    d_in: usize,
    d_out: usize,
    level: SimdLevel,
}

impl Kernel for LinearResidual {
    fn name(&self) -> &'static str {
        "lab-linear-residual"
    }
    fn forward(&self, inputs: &[In]) -> candle_core::Result<(Vec<f32>, Shape)> {
        let [(x, xs), (p, _), (r, rs)] = take(self.name(), inputs)?;
        let (d_in, d_out) = (self.d_in, self.d_out);
        let [w, b] = unpack(self.name(), (xs, d_in), p, [d_out * d_in, d_out])?;
        let n = x.len() / d_in;
        if r.len() != n * d_out {
            candle_core::bail!("linear: residual {rs:?} for {n} rows of {d_out}");
        }
        let (mut y, pending) = linear_product(x, w, Some(b), n, d_in, d_out, self.level);
        // r + (x·Wᵀ + b).
        match pending {
            Some(b) => add_bias(&mut y, b, Some(r)),
            None => add_into(&mut y, r),
        }
        Ok((y, rs.clone()))
    }
    fn backward(&self, inputs: &[In], dy: &[f32]) -> candle_core::Result<Vec<Grad>> {
        let [(x, xs), (p, _), _] = take(self.name(), inputs)?;
        let (d_in, d_out) = (self.d_in, self.d_out);
        let [w, _] = unpack(self.name(), (xs, d_in), p, [d_out * d_in, d_out])?;
        let n = x.len() / d_in;
        let (dx, dw, db) = linear_bwd(x, w, dy, n, d_in, d_out, true, self.level);
        Ok(vec![
            Grad::Data(dx),
            pack([dw, db.unwrap_or_default()]),
            Grad::Dy,
        ])
    }
}

/// `r + (x·Wᵀ + b)` for `x` `(…, in)`, `W` `(out, in)`, `r` `(…, out)`:
/// fused in one op (the same values and gradients as the fused [`linear`]
/// then an addition, bit for bit), or composed from those (`fused = false`:
/// candle-nn's `Linear`, the reference).
///
/// # Errors
/// Shape mismatches; candle errors.
pub fn linear_residual(
    x: &Tensor,
    w: &Tensor,
    b: &Tensor,
    r: &Tensor,
    fused: bool,
) -> Result<Tensor, NnError> {
    let (d_out, d_in) = w.dims2()?;
    // r: x's shape with d_out in place of d_in.
    let lead = x.rank().saturating_sub(1);
    let shapes_fit = x.dim(D::Minus1)? == d_in
        && b.dims1()? == d_out
        && r.rank() == x.rank()
        && r.dims()[..lead] == x.dims()[..lead]
        && r.dim(D::Minus1)? == d_out;
    if !(use_fused(fused, &[x, w, b, r]) && shapes_fit) {
        return Ok((r + linear(x, w, Some(b), fused)?)?);
    }
    let packed = Tensor::cat(&[&w.flatten_all()?, b], 0)?;
    let op = LinearResidual {
        d_in,
        d_out,
        level: SimdLevel::detect(),
    };
    apply(op, &[x, &packed, r])
}
