//! The lab's fused CPU ops, each a candle custom op with its backward pass,
//! beside the composed candle reference it is tested against:
//!
//! | op | fused | reference |
//! |---|---|---|
//! | `y = x·Wᵀ + b` | [`linear`] (one GEMM forward; dx, dW, db in one backward call) | `candle_nn::Linear` |
//! | LayerNorm | [`layer_norm`] (one pass per row, saved mean and 1/σ) | mean, variance, normalise, scale, shift |
//! | GELU (tanh approximation) | [`gelu`] | candle's `gelu` |
//! | `y = GELU(x·Wᵀ + b)` | [`linear_gelu`] (the pre-activation kept by the op, not a graph node: one gradient fewer for autograd to allocate and sum) | [`linear`] then [`gelu`] |
//! | `y = LN(x)·Wᵀ + b` | [`ln_linear`] (a branch's LayerNorm and first layer; `[γ, β, W, b]` packed into one input) | [`layer_norm`] then [`linear`] |
//! | `y = r + (x·Wᵀ + b)` | [`linear_residual`] (a residual branch's last layer and the addition; `[W, b]` packed into one input) | [`linear`] then an addition |
//! | `y = x + W₂·GELU(W₁·LN(x) + b₁) + b₂` | [`mlp_residual`] (a block's MLP half with its residual, its six parameters packed into one input) | [`layer_norm`], [`linear_gelu`], [`linear`], an addition |
//! | cross-entropy from logits | [`cross_entropy`] (log-sum-exp per row; the gradient is `softmax − onehot`) | `log_softmax`, `gather`, mask, mean |
//!
//! Every op takes `fused: bool`; `false` runs the reference. The fused ops
//! work on contiguous `f32` CPU tensors (others fall back to the reference).
//! Rows are split over rayon's threads only when the op is large enough;
//! every output element is computed in a fixed order and parameter
//! gradients are reduced over fixed chunks of rows added in order, so
//! results do not depend on the number of threads.

use std::sync::Mutex;

use candle_core::{
    CpuStorage, CustomOp1, CustomOp2, CustomOp3, DType, Device, Layout, Shape, Tensor, D,
};
use posenc::kernels::{tile, SimdLevel};
use rayon::prelude::*;

use crate::LabError;

/// Rows per chunk of the fixed-order parameter-gradient reductions.
const CHUNK: usize = 64;
/// Elements below which an op stays on the calling thread.
const PARALLEL_ELEMS: usize = 1 << 15;
/// Multiply-adds below which a product stays on one thread.
const PARALLEL_MACS: usize = 1 << 20;

fn f32s<'a>(s: &'a CpuStorage, l: &Layout, what: &str) -> candle_core::Result<&'a [f32]> {
    match s {
        CpuStorage::F32(v) => match l.contiguous_offsets() {
            Some((a, b)) => Ok(&v[a..b]),
            None => candle_core::bail!("{what}: fused op needs a contiguous tensor"),
        },
        _ => candle_core::bail!("{what}: fused op needs f32"),
    }
}

/// Runs `f` on a tensor's `f32` data in row-major order, without a copy when
/// it is contiguous.
fn view<R>(t: &Tensor, f: impl FnOnce(&[f32]) -> R) -> candle_core::Result<R> {
    if t.is_contiguous() && t.dtype() == DType::F32 {
        let (s, l) = t.storage_and_layout();
        if let candle_core::Storage::Cpu(CpuStorage::F32(v)) = &*s {
            if let Some((a, b)) = l.contiguous_offsets() {
                return Ok(f(&v[a..b]));
            }
        }
    }
    let v = t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
    Ok(f(&v))
}

fn fusable(ts: &[&Tensor]) -> bool {
    ts.iter()
        .all(|t| matches!(t.device(), Device::Cpu) && t.dtype() == DType::F32)
}

fn threads_for(work: usize) -> usize {
    if work >= PARALLEL_MACS {
        posenc::kernels::threads()
    } else {
        1
    }
}

/// The largest product (multiply-adds) the lab's linear layers compute on
/// posenc's AVX-512 tiles; larger ones go to the `gemm` crate, whose packed
/// kernels win there (`cargo run --release -p posenc --example gemm_time`:
/// on a Zen 4 EPYC, whose 512-bit FMAs have the throughput of two 256-bit
/// ones, the tiles are as fast or faster up to about 2^20 and slower on the
/// 2048-row products of a 4-layer d_model 128 step).
const TILE_MAX_MACS: usize = 1 << 20;

/// Whether [`matmul`] computes an `m × n × k` product on posenc's AVX-512
/// tiles (given row-major `C` and non-negative strides), rather than with
/// the `gemm` crate.
fn on_tiles(level: SimdLevel, m: usize, n: usize, k: usize) -> bool {
    level == SimdLevel::Avx512 && m * n * k <= TILE_MAX_MACS
}

/// The `gemm` crate (0.19) sums at least 512 terms of the inner dimension
/// in registers before it touches `C` (`gemm-common`'s `kernel_params`
/// takes `kc = max(512, …)`, capped at `k`): up to this `k`, `C = A·B`
/// followed by `C += bias` rounds exactly as `C = bias; C += A·B`.
const GEMM_ONE_PASS_K: usize = 512;

/// `C (m×n) = α·C + A·B` with row and column strides (any layout), on
/// the threads the size warrants: posenc's tile kernels at AVX-512 for
/// products up to [`TILE_MAX_MACS`], the `gemm` crate (AVX2 + FMA) otherwise.
#[allow(clippy::too_many_arguments)]
fn matmul(
    level: SimdLevel,
    m: usize,
    n: usize,
    k: usize,
    c: &mut [f32],
    (c_rs, c_cs): (isize, isize),
    accumulate: bool,
    a: &[f32],
    (a_rs, a_cs): (isize, isize),
    b: &[f32],
    (b_rs, b_cs): (isize, isize),
) {
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            c.fill(0.0);
        }
        return;
    }
    let threads = threads_for(m * n * k);
    if on_tiles(level, m, n, k) && c_cs == 1 && c_rs >= 0 && a_rs >= 0 && a_cs >= 0 {
        // posenc's own AVX-512 tiles (the gemm crate is built for AVX2 +
        // FMA here, and has no switch to follow POSENC_SIMD): B must have
        // contiguous rows, so a transposed view (the weights of `x·Wᵀ`, a
        // small matrix) is copied once.
        let packed;
        let (bp, ldb) = if b_cs == 1 && b_rs >= 0 {
            (b.as_ptr(), b_rs as usize)
        } else {
            packed = pack_rows(k, n, b, (b_rs, b_cs));
            (packed.as_ptr(), n)
        };
        // SAFETY: the callers pass slices holding every addressed element;
        // `packed` is k × n; the level is the one this CPU runs.
        unsafe {
            tile::gemm_blocked(
                SimdLevel::Avx512,
                m,
                n,
                k,
                a.as_ptr(),
                a_rs as usize,
                a_cs as usize,
                bp,
                ldb,
                c.as_mut_ptr(),
                c_rs as usize,
                accumulate,
                threads,
            )
        };
        return;
    }
    let par = if threads > 1 {
        gemm::Parallelism::Rayon(threads)
    } else {
        gemm::Parallelism::None
    };
    // SAFETY: the callers pass slices holding every addressed element.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c.as_mut_ptr(),
            c_cs,
            c_rs,
            accumulate,
            a.as_ptr(),
            a_cs,
            a_rs,
            b.as_ptr(),
            b_cs,
            b_rs,
            if accumulate { 1.0 } else { 0.0 },
            1.0,
            false,
            false,
            false,
            par,
        )
    }
}

/// The `k × n` matrix `B` (element `(p, j)` at `p·b_rs + j·b_cs`) copied
/// into a contiguous row-major buffer.
fn pack_rows(k: usize, n: usize, b: &[f32], (b_rs, b_cs): (isize, isize)) -> Vec<f32> {
    let mut out = Vec::with_capacity(k * n);
    for p in 0..k {
        let row = p as isize * b_rs;
        out.extend((0..n).map(|j| b[(row + j as isize * b_cs) as usize]));
    }
    out
}

/// `acc[c] += x[r, c]` for each row `r` of `x` in order (rows of
/// `acc.len()`), at the CPU's vector width: each column is its own sum, so
/// the width does not change the result.
#[inline(always)]
fn add_rows_body(x: &[f32], acc: &mut [f32]) {
    if acc.is_empty() {
        return;
    }
    for row in x.chunks_exact(acc.len()) {
        for (a, v) in acc.iter_mut().zip(row) {
            *a += v;
        }
    }
}
posenc::multiversion!(fn add_rows => add_rows_body(x: &[f32], acc: &mut [f32]) -> ());

/// `Σ_rows x[r, c]` for a row-major `(rows, cols)` buffer, over fixed chunks
/// of rows added in order.
fn column_sums(x: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let chunks = rows.div_ceil(CHUNK);
    let level = SimdLevel::detect();
    let part = |ci: usize| {
        let mut acc = vec![0f32; cols];
        let (r0, r1) = (ci * CHUNK, ((ci + 1) * CHUNK).min(rows));
        add_rows(level, &x[r0 * cols..r1 * cols], &mut acc);
        acc
    };
    let parts: Vec<Vec<f32>> =
        if rows * cols >= PARALLEL_ELEMS * 4 && posenc::kernels::threads() > 1 {
            (0..chunks).into_par_iter().map(part).collect()
        } else {
            (0..chunks).map(part).collect()
        };
    add_parts(parts, cols)
}

/// The element-wise sum of per-chunk partial sums of `cols` columns, added
/// in chunk order (the second half of [`column_sums`]' fixed order).
fn add_parts(parts: Vec<Vec<f32>>, cols: usize) -> Vec<f32> {
    let mut out = vec![0f32; cols];
    for p in parts {
        for (o, v) in out.iter_mut().zip(p) {
            *o += v;
        }
    }
    out
}

/// Splits `out` into rows of `width` and runs `f(row index, row)`, on several
/// threads when the buffer is large.
fn for_rows(out: &mut [f32], width: usize, f: impl Fn(usize, &mut [f32]) + Sync + Send) {
    if out.len() >= PARALLEL_ELEMS && posenc::kernels::threads() > 1 {
        out.par_chunks_mut(width)
            .enumerate()
            .for_each(|(r, row)| f(r, row));
    } else {
        out.chunks_mut(width)
            .enumerate()
            .for_each(|(r, row)| f(r, row));
    }
}

/// `y += x` element by element, on several threads when large (IEEE
/// addition commutes, so this is candle's `x + y` bit for bit).
fn add_into(y: &mut [f32], x: &[f32]) {
    for_rows(y, 4096, |r, yr| {
        for (o, v) in yr.iter_mut().zip(&x[r * 4096..]) {
            *o += v;
        }
    });
}

// ---------------------------------------------------------------- linear

/// `y = x·Wᵀ + b` for `x` `(…, in)`, `W` `(out, in)`, `b` `(out,)`, its
/// products at `level`.
struct Linear {
    level: SimdLevel,
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
fn linear_product<'b>(
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
fn add_bias(y: &mut [f32], b: &[f32], r: Option<&[f32]>) {
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
fn linear_bwd(
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

fn linear_dims(x: &Layout, w: &Layout) -> candle_core::Result<(usize, usize, usize, Shape)> {
    let (d_out, d_in) = w.shape().dims2()?;
    let xd = x.shape().dims();
    if xd.last() != Some(&d_in) {
        candle_core::bail!("linear: input {:?} does not end in {d_in}", xd);
    }
    let n = x.shape().elem_count() / d_in.max(1);
    let mut out = xd.to_vec();
    *out.last_mut().expect("non-empty") = d_out;
    Ok((n, d_in, d_out, Shape::from(out)))
}

/// [`linear_product`] on the op's storages: the product, the bias it left
/// for the caller to add, and the output shape.
#[allow(clippy::type_complexity)]
fn linear_storage_product<'b>(
    (sx, lx): (&CpuStorage, &Layout),
    (sw, lw): (&CpuStorage, &Layout),
    b: Option<(&'b CpuStorage, &Layout)>,
    level: SimdLevel,
) -> candle_core::Result<(Vec<f32>, Option<&'b [f32]>, Shape)> {
    let (n, d_in, d_out, shape) = linear_dims(lx, lw)?;
    let bias = match b {
        Some((sb, lb)) => Some(f32s(sb, lb, "linear b")?),
        None => None,
    };
    let x = f32s(sx, lx, "linear x")?;
    let w = f32s(sw, lw, "linear W")?;
    let (y, pending) = linear_product(x, w, bias, n, d_in, d_out, level);
    Ok((y, pending, shape))
}

/// `x·Wᵀ (+ b)` on the op's storages: the finished product and the output
/// shape.
fn linear_storage_fwd(
    x: (&CpuStorage, &Layout),
    w: (&CpuStorage, &Layout),
    b: Option<(&CpuStorage, &Layout)>,
    level: SimdLevel,
) -> candle_core::Result<(Vec<f32>, Shape)> {
    let (mut y, pending, shape) = linear_storage_product(x, w, b, level)?;
    if let Some(b) = pending {
        add_bias(&mut y, b, None);
    }
    Ok((y, shape))
}

impl CustomOp3 for Linear {
    fn name(&self) -> &'static str {
        "lab-linear"
    }
    fn cpu_fwd(
        &self,
        sx: &CpuStorage,
        lx: &Layout,
        sw: &CpuStorage,
        lw: &Layout,
        sb: &CpuStorage,
        lb: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (y, shape) = linear_storage_fwd((sx, lx), (sw, lw), Some((sb, lb)), self.level)?;
        Ok((CpuStorage::F32(y), shape))
    }
    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        b: &Tensor,
        _res: &Tensor,
        dy: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        linear_op_grads(x, w, b, dy, self.level)
    }
}

impl CustomOp2 for Linear {
    fn name(&self) -> &'static str {
        "lab-linear-nobias"
    }
    fn cpu_fwd(
        &self,
        sx: &CpuStorage,
        lx: &Layout,
        sw: &CpuStorage,
        lw: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (y, shape) = linear_storage_fwd((sx, lx), (sw, lw), None, self.level)?;
        Ok((CpuStorage::F32(y), shape))
    }
    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _res: &Tensor,
        dy: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        linear_op_grads_nobias(x, w, dy, self.level)
    }
}

/// The gradients of `x·Wᵀ + b` with respect to `x`, `W` and `b`, as a
/// three-input custom op returns them.
fn linear_op_grads(
    x: &Tensor,
    w: &Tensor,
    b: &Tensor,
    dy: &Tensor,
    level: SimdLevel,
) -> candle_core::Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
    let (dx, dw, db) = linear_grads(x, w, dy, true, level)?;
    Ok((
        Some(dx),
        Some(dw),
        db.map(|d| d.reshape(b.shape())).transpose()?,
    ))
}

/// The gradients of `x·Wᵀ` with respect to `x` and `W`, as a two-input
/// custom op returns them.
fn linear_op_grads_nobias(
    x: &Tensor,
    w: &Tensor,
    dy: &Tensor,
    level: SimdLevel,
) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
    let (dx, dw, _) = linear_grads(x, w, dy, false, level)?;
    Ok((Some(dx), Some(dw)))
}

fn linear_grads(
    x: &Tensor,
    w: &Tensor,
    dy: &Tensor,
    bias: bool,
    level: SimdLevel,
) -> candle_core::Result<(Tensor, Tensor, Option<Tensor>)> {
    let (d_out, d_in) = w.dims2()?;
    let n = x.elem_count() / d_in.max(1);
    let (dx, dw, db) = view(x, |xv| {
        view(w, |wv| {
            view(dy, |dyv| {
                linear_bwd(xv, wv, dyv, n, d_in, d_out, bias, level)
            })
        })
    })???;
    let dev = x.device();
    Ok((
        Tensor::from_vec(dx, x.shape(), dev)?,
        Tensor::from_vec(dw, (d_out, d_in), dev)?,
        db.map(|d| Tensor::from_vec(d, d_out, dev)).transpose()?,
    ))
}

/// `x·Wᵀ (+ b)` for `x` `(…, in)`, `W` `(out, in)`: fused, or candle-nn's
/// `Linear` (the reference).
///
/// # Errors
/// Shape mismatches; candle errors.
pub fn linear(x: &Tensor, w: &Tensor, b: Option<&Tensor>, fused: bool) -> Result<Tensor, LabError> {
    linear_inner(x, w, b, fused.then(SimdLevel::detect))
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
) -> Result<Tensor, LabError> {
    if !level.is_supported() {
        return Err(candle_core::Error::Msg(format!(
            "linear: SIMD level {level} is not supported by this CPU"
        ))
        .into());
    }
    linear_inner(x, w, b, Some(level))
}

/// Fused at `level`, or the reference for `None`.
fn linear_inner(
    x: &Tensor,
    w: &Tensor,
    b: Option<&Tensor>,
    level: Option<SimdLevel>,
) -> Result<Tensor, LabError> {
    let mut all = vec![x, w];
    all.extend(b);
    if let (Some(level), true) = (level, fusable(&all)) {
        let x = x.contiguous()?;
        let op = Linear { level };
        return Ok(match b {
            Some(b) => x.apply_op3(w, b, op)?,
            None => x.apply_op2(w, op)?,
        });
    }
    let lin = candle_nn::Linear::new(w.clone(), b.cloned());
    Ok(candle_core::Module::forward(&lin, x)?)
}

// ---------------------------------------------------------------- layer norm

/// LayerNorm over the last axis, saving each row's mean and 1/σ.
struct LayerNormOp {
    eps: f32,
    stats: Mutex<Vec<(f32, f32)>>,
}

impl CustomOp3 for LayerNormOp {
    fn name(&self) -> &'static str {
        "lab-layer-norm"
    }
    fn cpu_fwd(
        &self,
        sx: &CpuStorage,
        lx: &Layout,
        sw: &CpuStorage,
        lw: &Layout,
        sb: &CpuStorage,
        lb: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let x = f32s(sx, lx, "layer norm x")?;
        let w = f32s(sw, lw, "layer norm weight")?;
        let b = f32s(sb, lb, "layer norm bias")?;
        let d = w.len();
        if d == 0 || lx.shape().dims().last() != Some(&d) || b.len() != d {
            candle_core::bail!("layer norm: shapes {:?}, {d}, {}", lx.shape(), b.len());
        }
        let (y, stats) = layer_norm_fwd(x, w, b, self.eps);
        *self.stats.lock().expect("stats lock") = stats;
        Ok((CpuStorage::F32(y), lx.shape().clone()))
    }
    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _b: &Tensor,
        _res: &Tensor,
        dy: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let d = w.elem_count();
        let stats = self.stats.lock().expect("stats lock").clone();
        let (dx, dw, db) = view(x, |xv| {
            view(w, |wv| {
                view(dy, |dyv| layer_norm_bwd(xv, wv, dyv, &stats, d, None))
            })
        })???;
        let dev = x.device();
        Ok((
            Some(Tensor::from_vec(dx, x.shape(), dev)?),
            Some(Tensor::from_vec(dw, w.shape(), dev)?),
            Some(Tensor::from_vec(db, w.shape(), dev)?),
        ))
    }
}

/// LayerNorm's forward pass on row-major buffers (`w.len()` columns, checked
/// by the caller): `y`, and `(mean, 1/σ)` per row.
fn layer_norm_fwd(x: &[f32], w: &[f32], b: &[f32], eps: f32) -> (Vec<f32>, Vec<(f32, f32)>) {
    let d = w.len();
    let rows = x.len() / d;
    // SAFETY: every row of y is written below.
    let mut y = unsafe { tile::vec_for_overwrite(x.len()) };
    let mut stats = vec![(0f32, 0f32); rows];
    let level = SimdLevel::detect();
    // Blocks of CHUNK rows.
    let block = CHUNK * d;
    let run = |bi: usize, (yr, st): (&mut [f32], &mut [(f32, f32)])| {
        ln_fwd(level, &x[bi * block..][..yr.len()], w, b, yr, st, eps)
    };
    if x.len() >= PARALLEL_ELEMS && posenc::kernels::threads() > 1 {
        y.par_chunks_mut(block)
            .zip(stats.par_chunks_mut(CHUNK))
            .enumerate()
            .for_each(|(bi, p)| run(bi, p));
    } else {
        y.chunks_mut(block)
            .zip(stats.chunks_mut(CHUNK))
            .enumerate()
            .for_each(|(bi, p)| run(bi, p));
    }
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
fn layer_norm_bwd(
    xv: &[f32],
    wv: &[f32],
    dyv: &[f32],
    stats: &[(f32, f32)],
    d: usize,
    res: Option<&[f32]>,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    {
        let rows = xv.len() / d;
        // SAFETY: every row of dx and prod is written below.
        let mut dx = unsafe { tile::vec_for_overwrite(xv.len()) };
        let mut prod = unsafe { tile::vec_for_overwrite(xv.len()) };
        let level = SimdLevel::detect();
        let block = CHUNK * d;
        let run = |bi: usize, (dxr, pr): (&mut [f32], &mut [f32])| {
            let n = dxr.len();
            ln_bwd(
                level,
                &xv[bi * block..][..n],
                wv,
                &dyv[bi * block..][..n],
                &stats[bi * CHUNK..][..n / d],
                res.map_or(&[][..], |r| &r[bi * block..][..n]),
                dxr,
                pr,
            )
        };
        if xv.len() >= PARALLEL_ELEMS && posenc::kernels::threads() > 1 {
            dx.par_chunks_mut(block)
                .zip(prod.par_chunks_mut(block))
                .enumerate()
                .for_each(|(bi, p)| run(bi, p));
        } else {
            dx.chunks_mut(block)
                .zip(prod.chunks_mut(block))
                .enumerate()
                .for_each(|(bi, p)| run(bi, p));
        }
        let dw = column_sums(&prod, rows, d);
        let db = column_sums(dyv, rows, d);
        (dx, dw, db)
    }
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
) -> Result<Tensor, LabError> {
    if fused && fusable(&[x, weight, bias]) {
        return Ok(x.contiguous()?.apply_op3(
            weight,
            bias,
            LayerNormOp {
                eps: eps as f32,
                stats: Mutex::new(Vec::new()),
            },
        )?);
    }
    let d = x.dim(D::Minus1)? as f64;
    let mean = (x.sum_keepdim(D::Minus1)? / d)?;
    let xc = x.broadcast_sub(&mean)?;
    let var = (xc.sqr()?.sum_keepdim(D::Minus1)? / d)?;
    let xn = xc.broadcast_div(&(var + eps)?.sqrt()?)?;
    Ok(xn.broadcast_mul(weight)?.broadcast_add(bias)?)
}

// ---------------------------------------------------------------- GELU

const SQRT_2_OVER_PI: f32 = 0.797_884_6;

/// GELU, tanh approximation (Hendrycks & Gimpel 2016), as candle's `gelu`.
struct Gelu;

impl CustomOp1 for Gelu {
    fn name(&self) -> &'static str {
        "lab-gelu"
    }
    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let y = gelu_rows(f32s(s, l, "gelu")?);
        Ok((CpuStorage::F32(y), l.shape().clone()))
    }
    fn bwd(&self, x: &Tensor, _res: &Tensor, dy: &Tensor) -> candle_core::Result<Option<Tensor>> {
        let dx = view(x, |xv| view(dy, |dyv| gelu_bwd(xv, dyv)))??;
        Ok(Some(Tensor::from_vec(dx, x.shape(), x.device())?))
    }
}

#[inline(always)]
fn gelu_fwd_body(x: &[f32], y: &mut [f32]) {
    for (o, &v) in y.iter_mut().zip(x) {
        let t = tile::tanh(SQRT_2_OVER_PI * v * (1.0 + 0.044715 * v * v));
        *o = 0.5 * v * (1.0 + t);
    }
}
posenc::multiversion!(fn gelu_fwd => gelu_fwd_body(x: &[f32], y: &mut [f32]) -> ());

#[inline(always)]
fn gelu_bwd_body(x: &[f32], dy: &[f32], dx: &mut [f32]) {
    for ((o, &v), &g) in dx.iter_mut().zip(x).zip(dy) {
        let u = SQRT_2_OVER_PI * v * (1.0 + 0.044715 * v * v);
        let t = tile::tanh(u);
        let du = SQRT_2_OVER_PI * (1.0 + 3.0 * 0.044715 * v * v);
        *o = g * (0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * du);
    }
}
posenc::multiversion!(fn gelu_bwd_rows => gelu_bwd_body(x: &[f32], dy: &[f32], dx: &mut [f32]) -> ());

/// GELU of every element of `x`, in rows of 4096 over the threads.
fn gelu_rows(x: &[f32]) -> Vec<f32> {
    // SAFETY: every element is written below.
    let mut y = unsafe { tile::vec_for_overwrite(x.len()) };
    let level = SimdLevel::detect();
    for_rows(&mut y, 4096, |r, yr| {
        gelu_fwd(level, &x[r * 4096..][..yr.len()], yr)
    });
    y
}

fn gelu_bwd(xv: &[f32], dyv: &[f32]) -> Vec<f32> {
    // SAFETY: every element is written below.
    let mut dx = unsafe { tile::vec_for_overwrite(xv.len()) };
    let level = SimdLevel::detect();
    for_rows(&mut dx, 4096, |r, dr| {
        let base = r * 4096;
        gelu_bwd_rows(level, &xv[base..][..dr.len()], &dyv[base..][..dr.len()], dr)
    });
    dx
}

#[inline(always)]
fn gelu_bias_body(pre: &mut [f32], bias: &[f32], h: &mut [f32]) {
    let d = bias.len();
    for (pr, hr) in pre.chunks_mut(d).zip(h.chunks_mut(d)) {
        for ((v, o), b) in pr.iter_mut().zip(hr.iter_mut()).zip(bias) {
            let x = *v + b;
            *v = x;
            let t = tile::tanh(SQRT_2_OVER_PI * x * (1.0 + 0.044715 * x * x));
            *o = 0.5 * x * (1.0 + t);
        }
    }
}
posenc::multiversion!(fn gelu_bias_rows => gelu_bias_body(
    pre: &mut [f32], bias: &[f32], h: &mut [f32]) -> ());

/// GELU of `pre` after adding a deferred bias to each row (`b` of `d`
/// elements, added to `pre` in place, so that it holds the pre-activation
/// the backward pass needs), in one pass: the values of adding the bias and
/// then [`gelu_rows`], bit for bit. Without a bias, [`gelu_rows`].
fn gelu_after_bias(pre: &mut [f32], b: Option<&[f32]>) -> Vec<f32> {
    let Some(bias) = b.filter(|b| !b.is_empty()) else {
        return gelu_rows(pre);
    };
    let d = bias.len();
    // SAFETY: every element is written below.
    let mut h = unsafe { tile::vec_for_overwrite(pre.len()) };
    let level = SimdLevel::detect();
    let width = (4096 / d).max(1) * d;
    let run = |(p, hh): (&mut [f32], &mut [f32])| gelu_bias_rows(level, p, bias, hh);
    if pre.len() >= PARALLEL_ELEMS && posenc::kernels::threads() > 1 {
        pre.par_chunks_mut(width)
            .zip(h.par_chunks_mut(width))
            .for_each(run);
    } else {
        pre.chunks_mut(width).zip(h.chunks_mut(width)).for_each(run);
    }
    h
}

/// [`gelu_bwd`] and the column sums of its result (the bias gradient of
/// the layer before it), each block of [`CHUNK`] rows summed while it is in
/// cache: the bits of [`gelu_bwd`] then [`column_sums`].
fn gelu_bwd_sums(pre: &[f32], dy: &[f32], cols: usize) -> (Vec<f32>, Vec<f32>) {
    if cols == 0 || pre.is_empty() {
        return (gelu_bwd(pre, dy), vec![0f32; cols]);
    }
    // SAFETY: every element is written below.
    let mut dx = unsafe { tile::vec_for_overwrite(pre.len()) };
    let level = SimdLevel::detect();
    let block = CHUNK * cols;
    let run = |(ci, dc): (usize, &mut [f32])| {
        let (base, m) = (ci * block, dc.len());
        gelu_bwd_rows(level, &pre[base..][..m], &dy[base..][..m], dc);
        let mut acc = vec![0f32; cols];
        add_rows(level, dc, &mut acc);
        acc
    };
    let parts: Vec<Vec<f32>> = if pre.len() >= PARALLEL_ELEMS && posenc::kernels::threads() > 1 {
        dx.par_chunks_mut(block).enumerate().map(run).collect()
    } else {
        dx.chunks_mut(block).enumerate().map(run).collect()
    };
    (dx, add_parts(parts, cols))
}

/// GELU (tanh approximation): fused, or candle's `gelu`.
///
/// # Errors
/// Candle errors.
pub fn gelu(x: &Tensor, fused: bool) -> Result<Tensor, LabError> {
    if fused && fusable(&[x]) {
        return Ok(x.contiguous()?.apply_op1(Gelu)?);
    }
    Ok(x.gelu()?)
}

// ---------------------------------------------------------------- linear + GELU

/// `y = GELU(x·Wᵀ + b)`: [`Linear`]'s product, then [`Gelu`]'s rows, in
/// one op that keeps the pre-activation for its backward pass. As two ops,
/// the pre-activation is a node of candle's graph, and candle's backward
/// pass allocates a zero gradient for every node and adds each incoming
/// gradient to it: for the lab's `(B·T, 4·d_model)` MLP activations that is
/// a zero-fill and a full-size addition per layer and step, with nothing to
/// add. Same arithmetic as the two ops, so the same bits.
struct LinearGelu {
    level: SimdLevel,
    pre: Mutex<Option<Vec<f32>>>,
}

impl LinearGelu {
    fn fwd(
        &self,
        x: (&CpuStorage, &Layout),
        w: (&CpuStorage, &Layout),
        b: Option<(&CpuStorage, &Layout)>,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (mut pre, pending, shape) = linear_storage_product(x, w, b, self.level)?;
        let y = gelu_after_bias(&mut pre, pending);
        *self.pre.lock().unwrap_or_else(|e| e.into_inner()) = Some(pre);
        Ok((CpuStorage::F32(y), shape))
    }

    /// The gradient of the pre-activation, from the one the forward pass
    /// kept (candle runs `cpu_fwd` when the op is applied, before any
    /// backward pass can reach it).
    fn d_pre(&self, dy: &Tensor) -> candle_core::Result<Tensor> {
        let kept = self.pre.lock().unwrap_or_else(|e| e.into_inner());
        let Some(pre) = kept.as_ref() else {
            candle_core::bail!("linear_gelu: backward pass before the forward pass");
        };
        let d = view(dy, |dyv| gelu_bwd(pre, dyv))?;
        Tensor::from_vec(d, dy.shape(), dy.device())
    }
}

impl CustomOp3 for LinearGelu {
    fn name(&self) -> &'static str {
        "lab-linear-gelu"
    }
    fn cpu_fwd(
        &self,
        sx: &CpuStorage,
        lx: &Layout,
        sw: &CpuStorage,
        lw: &Layout,
        sb: &CpuStorage,
        lb: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        self.fwd((sx, lx), (sw, lw), Some((sb, lb)))
    }
    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        b: &Tensor,
        _res: &Tensor,
        dy: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        linear_op_grads(x, w, b, &self.d_pre(dy)?, self.level)
    }
}

impl CustomOp2 for LinearGelu {
    fn name(&self) -> &'static str {
        "lab-linear-gelu-nobias"
    }
    fn cpu_fwd(
        &self,
        sx: &CpuStorage,
        lx: &Layout,
        sw: &CpuStorage,
        lw: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        self.fwd((sx, lx), (sw, lw), None)
    }
    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _res: &Tensor,
        dy: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        linear_op_grads_nobias(x, w, &self.d_pre(dy)?, self.level)
    }
}

/// `GELU(x·Wᵀ (+ b))`: fused in one op (the same values and gradients as
/// the fused [`linear`] then the fused [`gelu`], bit for bit), or candle-nn's
/// `Linear` then candle's `gelu` (the reference).
///
/// # Errors
/// Shape mismatches; candle errors.
pub fn linear_gelu(
    x: &Tensor,
    w: &Tensor,
    b: Option<&Tensor>,
    fused: bool,
) -> Result<Tensor, LabError> {
    let mut all = vec![x, w];
    all.extend(b);
    if !(fused && fusable(&all)) {
        return gelu(&linear(x, w, b, fused)?, fused);
    }
    let x = x.contiguous()?;
    let op = LinearGelu {
        level: SimdLevel::detect(),
        pre: Mutex::new(None),
    };
    Ok(match b {
        Some(b) => x.apply_op3(w, b, op)?,
        None => x.apply_op2(w, op)?,
    })
}

// ---------------------------------------------------------------- packed parameters

/// Offsets of consecutive parts of the given sizes in a packed parameter
/// vector, and its length.
fn packed_offsets<const N: usize>(sizes: [usize; N]) -> ([usize; N], usize) {
    let mut at = [0; N];
    let mut o = 0;
    for (a, s) in at.iter_mut().zip(sizes) {
        *a = o;
        o += s;
    }
    (at, o)
}

/// The backward pass of an op on `x` and a packed parameter vector `p`
/// (read in place where contiguous): `f(x, p, dy)` returns `dx` and the
/// parameters' gradients part by part in packing order, which are packed
/// the same way. Returns the gradients of `x` and `p`.
fn packed_grads(
    x: &Tensor,
    p: &Tensor,
    dy: &Tensor,
    f: impl FnOnce(&[f32], &[f32], &[f32]) -> (Vec<f32>, Vec<Vec<f32>>),
) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
    let (dx, dp) = view(x, |xv| {
        view(p, |pv| {
            view(dy, |dyv| {
                let (dx, parts) = f(xv, pv, dyv);
                let mut dp = Vec::with_capacity(parts.iter().map(Vec::len).sum());
                for part in parts {
                    dp.extend_from_slice(&part);
                }
                (dx, dp)
            })
        })
    })???;
    let dev = x.device();
    Ok((
        Some(Tensor::from_vec(dx, x.shape(), dev)?),
        Some(Tensor::from_vec(dp, p.shape(), dev)?),
    ))
}

// ---------------------------------------------------------------- linear with a residual

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

impl CustomOp3 for LinearResidual {
    fn name(&self) -> &'static str {
        "lab-linear-residual"
    }
    fn cpu_fwd(
        &self,
        sx: &CpuStorage,
        lx: &Layout,
        sp: &CpuStorage,
        lp: &Layout,
        sr: &CpuStorage,
        lr: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let x = f32s(sx, lx, "linear x")?;
        let p = f32s(sp, lp, "linear W, b")?;
        let r = f32s(sr, lr, "residual")?;
        let (d_in, d_out) = (self.d_in, self.d_out);
        if d_in == 0 || lx.shape().dims().last() != Some(&d_in) || p.len() != d_out * (d_in + 1) {
            candle_core::bail!(
                "linear: input {:?}, {} parameters for {d_in} → {d_out}",
                lx.shape(),
                p.len()
            );
        }
        let n = x.len() / d_in;
        if r.len() != n * d_out {
            candle_core::bail!("linear: residual {:?} for {n} rows of {d_out}", lr.shape());
        }
        let (w, b) = p.split_at(d_out * d_in);
        let (mut y, pending) = linear_product(x, w, Some(b), n, d_in, d_out, self.level);
        // r + (x·Wᵀ + b).
        match pending {
            Some(b) => add_bias(&mut y, b, Some(r)),
            None => add_into(&mut y, r),
        }
        Ok((CpuStorage::F32(y), lr.shape().clone()))
    }
    fn bwd(
        &self,
        x: &Tensor,
        p: &Tensor,
        _r: &Tensor,
        _res: &Tensor,
        dy: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let (d_in, d_out) = (self.d_in, self.d_out);
        let n = x.elem_count() / d_in;
        let (dx, dp) = packed_grads(x, p, dy, |xv, pv, dyv| {
            let w = &pv[..d_out * d_in];
            let (dx, dw, db) = linear_bwd(xv, w, dyv, n, d_in, d_out, true, self.level);
            (dx, vec![dw, db.unwrap_or_default()])
        })?;
        Ok((dx, dp, Some(dy.clone())))
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
) -> Result<Tensor, LabError> {
    let (d_out, d_in) = w.dims2()?;
    // r: x's shape with d_out in place of d_in.
    let lead = x.rank().saturating_sub(1);
    let shapes_fit = x.dim(D::Minus1)? == d_in
        && b.dims1()? == d_out
        && r.rank() == x.rank()
        && r.dims()[..lead] == x.dims()[..lead]
        && r.dim(D::Minus1)? == d_out;
    if !(fused && fusable(&[x, w, b, r]) && shapes_fit) {
        return Ok((r + linear(x, w, Some(b), fused)?)?);
    }
    let packed = Tensor::cat(&[&w.flatten_all()?, b], 0)?;
    let op = LinearResidual {
        d_in,
        d_out,
        level: SimdLevel::detect(),
    };
    Ok(x.contiguous()?.apply_op3(&packed, &r.contiguous()?, op)?)
}

// ---------------------------------------------------------------- LayerNorm then linear

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
    saved: Mutex<Option<LnSaved>>,
}

/// What [`LnLinear`]'s forward pass keeps: LayerNorm's `(mean, 1/σ)` per
/// row and its output `(n, d)`.
type LnSaved = (Vec<(f32, f32)>, Vec<f32>);

impl LnLinear {
    /// Offsets of `[γ, β, W, b]` in the packed vector, and its length.
    fn parts(&self) -> ([usize; 4], usize) {
        let (d, o) = (self.d, self.d_out);
        packed_offsets([d, d, o * d, o])
    }
}

impl CustomOp2 for LnLinear {
    fn name(&self) -> &'static str {
        "lab-ln-linear"
    }
    fn cpu_fwd(
        &self,
        sx: &CpuStorage,
        lx: &Layout,
        sp: &CpuStorage,
        lp: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let x = f32s(sx, lx, "ln-linear x")?;
        let p = f32s(sp, lp, "ln-linear parameters")?;
        let (d, o) = (self.d, self.d_out);
        let ([g, be, w, b], len) = self.parts();
        if d == 0 || lx.shape().dims().last() != Some(&d) || p.len() != len {
            candle_core::bail!(
                "ln-linear: input {:?}, {} parameters for {d} → {o}",
                lx.shape(),
                p.len()
            );
        }
        let params = [&p[g..][..d], &p[be..][..d], &p[w..][..o * d], &p[b..][..o]];
        let (ln, stats, mut y, pending) = ln_product(x, params, self.eps, self.level);
        if let Some(bias) = pending {
            add_bias(&mut y, bias, None);
        }
        *self.saved.lock().unwrap_or_else(|e| e.into_inner()) = Some((stats, ln));
        let mut dims = lx.shape().dims().to_vec();
        *dims.last_mut().expect("rank ≥ 1") = o;
        Ok((CpuStorage::F32(y), Shape::from(dims)))
    }
    fn bwd(
        &self,
        x: &Tensor,
        p: &Tensor,
        _res: &Tensor,
        dy: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        let kept = self.saved.lock().unwrap_or_else(|e| e.into_inner());
        let Some((stats, ln)) = kept.as_ref() else {
            candle_core::bail!("ln-linear: backward pass before the forward pass");
        };
        let (d, o) = (self.d, self.d_out);
        let ([g, _, w, _], _) = self.parts();
        let n = x.elem_count() / d;
        packed_grads(x, p, dy, |xv, pv, dyv| {
            let (dln, dw, db) = linear_bwd(ln, &pv[w..][..o * d], dyv, n, d, o, true, self.level);
            let (dx, dg, dbe) = layer_norm_bwd(xv, &pv[g..][..d], &dln, stats, d, None);
            (dx, vec![dg, dbe, dw, db.unwrap_or_default()])
        })
    }
}

/// LayerNorm of `x` with `[γ, β, W, b]` (`γ`, `β` of `d`, `W` `(d_out, d)`),
/// then its product with `W` and `b`, the bias possibly left for the caller
/// ([`linear_product`]): `(LN(x), (mean, 1/σ) per row, product, pending
/// bias)`.
#[allow(clippy::type_complexity)]
fn ln_product<'p>(
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
) -> Result<Tensor, LabError> {
    let d = x.dim(D::Minus1)?;
    let (d_out, d_in) = w.dims2()?;
    let shapes_fit = d_in == d && ln_w.dims1()? == d && ln_b.dims1()? == d && b.dims1()? == d_out;
    if !(fused && fusable(&[x, ln_w, ln_b, w, b]) && shapes_fit) {
        return linear(&layer_norm(x, ln_w, ln_b, eps, fused)?, w, Some(b), fused);
    }
    let packed = Tensor::cat(&[ln_w, ln_b, &w.flatten_all()?, b], 0)?;
    let op = LnLinear {
        d,
        d_out,
        eps: eps as f32,
        level: SimdLevel::detect(),
        saved: Mutex::new(None),
    };
    Ok(x.contiguous()?.apply_op2(&packed, op)?)
}

// ---------------------------------------------------------------- MLP with its residual

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
    saved: Mutex<Option<MlpSaved>>,
}

impl MlpResidual {
    /// Offsets of `[γ, β, W₁, b₁, W₂, b₂]` in the packed vector, and its length.
    fn parts(&self) -> ([usize; 6], usize) {
        let (d, f) = (self.d, self.d_ff);
        packed_offsets([d, d, f * d, f, d * f, d])
    }
}

impl CustomOp2 for MlpResidual {
    fn name(&self) -> &'static str {
        "lab-mlp-residual"
    }
    fn cpu_fwd(
        &self,
        sx: &CpuStorage,
        lx: &Layout,
        sp: &CpuStorage,
        lp: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let x = f32s(sx, lx, "mlp x")?;
        let p = f32s(sp, lp, "mlp parameters")?;
        let (d, f) = (self.d, self.d_ff);
        let ([g, be, w1, b1, w2, b2], len) = self.parts();
        if d == 0 || lx.shape().dims().last() != Some(&d) || p.len() != len {
            candle_core::bail!(
                "mlp: input {:?}, {} parameters for d {d}, d_ff {f}",
                lx.shape(),
                p.len()
            );
        }
        let n = x.len() / d;
        let params = [
            &p[g..][..d],
            &p[be..][..d],
            &p[w1..][..f * d],
            &p[b1..][..f],
        ];
        let (ln, stats, mut pre, pending) = ln_product(x, params, self.eps, self.level);
        let h = gelu_after_bias(&mut pre, pending);
        let (mut y, pending) = linear_product(
            &h,
            &p[w2..][..d * f],
            Some(&p[b2..][..d]),
            n,
            f,
            d,
            self.level,
        );
        // The residual: x + MLP(x).
        match pending {
            Some(b) => add_bias(&mut y, b, Some(x)),
            None => add_into(&mut y, x),
        }
        *self.saved.lock().unwrap_or_else(|e| e.into_inner()) =
            Some(MlpSaved { stats, ln, pre, h });
        Ok((CpuStorage::F32(y), lx.shape().clone()))
    }
    fn bwd(
        &self,
        x: &Tensor,
        p: &Tensor,
        _res: &Tensor,
        dy: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        let kept = self.saved.lock().unwrap_or_else(|e| e.into_inner());
        let Some(s) = kept.as_ref() else {
            candle_core::bail!("mlp: backward pass before the forward pass");
        };
        let (d, f) = (self.d, self.d_ff);
        let ([g, _, w1, _, w2, _], _) = self.parts();
        let n = x.elem_count() / d;
        packed_grads(x, p, dy, |xv, pv, dyv| {
            // The second layer, then GELU, then the first, then LayerNorm.
            let (dh, dw2, db2) =
                linear_bwd(&s.h, &pv[w2..][..d * f], dyv, n, f, d, true, self.level);
            let (dpre, db1) = gelu_bwd_sums(&s.pre, &dh, f);
            drop(dh);
            let (dln, dw1, _) =
                linear_bwd(&s.ln, &pv[w1..][..f * d], &dpre, n, d, f, false, self.level);
            drop(dpre);
            // LayerNorm's gradient plus the residual's, as candle's backward
            // pass adds them.
            let (dx, dg, dbe) = layer_norm_bwd(xv, &pv[g..][..d], &dln, &s.stats, d, Some(dyv));
            (dx, vec![dg, dbe, dw1, db1, dw2, db2.unwrap_or_default()])
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
) -> Result<Tensor, LabError> {
    let all = [x, ln_w, ln_b, w1, b1, w2, b2];
    let d = x.dim(D::Minus1)?;
    let (d_ff, d_in) = w1.dims2()?;
    let shapes_fit = d_in == d
        && w2.dims2()? == (d, d_ff)
        && ln_w.dims1()? == d
        && ln_b.dims1()? == d
        && b1.dims1()? == d_ff
        && b2.dims1()? == d;
    if !(fused && fusable(&all) && shapes_fit) {
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
        saved: Mutex::new(None),
    };
    Ok(x.contiguous()?.apply_op2(&packed, op)?)
}

// ---------------------------------------------------------------- cross-entropy

/// Mean cross-entropy of `(N, V)` logits against `N` targets (`ignore`
/// rows are not scored), saving the log-sum-exp of each row.
struct CrossEntropy {
    targets: Vec<i64>,
    ignore: i64,
    lse: Mutex<Vec<f32>>,
}

impl CrossEntropy {
    fn count(&self) -> usize {
        self.targets.iter().filter(|&&t| t != self.ignore).count()
    }
}

impl CustomOp1 for CrossEntropy {
    fn name(&self) -> &'static str {
        "lab-cross-entropy"
    }
    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let x = f32s(s, l, "cross-entropy logits")?;
        let (n, v) = l.shape().dims2()?;
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
        *self.lse.lock().expect("lse lock") = lse;
        Ok((CpuStorage::F32(vec![total as f32]), Shape::from(())))
    }
    fn bwd(&self, x: &Tensor, _res: &Tensor, g: &Tensor) -> candle_core::Result<Option<Tensor>> {
        let (n, v) = x.dims2()?;
        let g = g.to_dtype(DType::F32)?.to_scalar::<f32>()? / self.count().max(1) as f32;
        let lse = self.lse.lock().expect("lse lock").clone();
        let dx = view(x, |xv| self.grad(xv, &lse, g, n, v))?;
        Ok(Some(Tensor::from_vec(dx, (n, v), x.device())?))
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
) -> Result<Tensor, LabError> {
    let (n, _) = logits.dims2()?;
    if targets.dims() != [n] {
        return Err(LabError::Invalid(format!(
            "cross-entropy: {n} rows of logits, targets {:?}",
            targets.dims()
        )));
    }
    if fused && fusable(&[logits]) {
        let t = targets.to_dtype(DType::I64)?.to_vec1::<i64>()?;
        return Ok(logits.contiguous()?.apply_op1(CrossEntropy {
            targets: t,
            ignore,
            lse: Mutex::new(Vec::new()),
        })?);
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
