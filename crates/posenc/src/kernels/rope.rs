//! The fused rotary kernel on raw buffers, and its scalar reference.
//!
//! A buffer holds `B · H · T` head vectors of `head_dim` elements each, in
//! one of two orders ([`HeadLayout`]). The vector of batch entry `b` at time
//! step `t` is rotated with row `r(b, t)` of the `(rows, rotary_dim / 2)`
//! cos/sin tables ([`RowMap`]): `r = offset + t` (a KV-cache offset, the
//! same for every batch entry) or `r = ids[b · T + t]` (position ids).
//!
//! For pair `i = (a, b)` of the rotary block ([`PairLayout`]) the kernel
//! writes `y_a = x_a·cos_i − x_b·sin_i`, `y_b = x_b·cos_i + x_a·sin_i`; with
//! `inverse` the sine is negated, which is the transpose of the rotation and
//! hence its backward pass. Entries from `rotary_dim` to `head_dim` pass
//! through unchanged.

use std::mem::MaybeUninit;

use rayon::prelude::*;

use super::SimdLevel;
use crate::error::{Error, Result};
use crate::rope::PairLayout;

/// Order of the axes of a query or key buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum HeadLayout {
    /// `(batch, heads, time, head_dim)`: the layout of most attention
    /// implementations after the head transpose.
    #[default]
    Bhtd,
    /// `(batch, time, heads, head_dim)`: the layout straight out of the
    /// projection (FlashAttention, candle-nn's `rope_thd`).
    Bthd,
}

impl HeadLayout {
    /// `bhtd` or `bthd`.
    pub fn as_str(self) -> &'static str {
        match self {
            HeadLayout::Bhtd => "bhtd",
            HeadLayout::Bthd => "bthd",
        }
    }
}

crate::display_as_str!(HeadLayout);

/// The shape of one query or key buffer and how its heads are rotated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RopeGeometry {
    /// Batch size `B`.
    pub batch: usize,
    /// Number of heads `H`.
    pub heads: usize,
    /// Sequence length `T`.
    pub seq_len: usize,
    /// Head dimension `D` (even).
    pub head_dim: usize,
    /// Rotated dimensions (even, at most `head_dim`); the rest passes through.
    pub rotary_dim: usize,
    /// Axis order.
    pub layout: HeadLayout,
    /// Pair layout inside the rotary block.
    pub pairs: PairLayout,
}

impl RopeGeometry {
    /// The geometry of a 4-d shape in `layout`.
    pub fn from_dims(
        dims: [usize; 4],
        layout: HeadLayout,
        rotary_dim: usize,
        pairs: PairLayout,
    ) -> Self {
        let (batch, heads, seq_len, head_dim) = match layout {
            HeadLayout::Bhtd => (dims[0], dims[1], dims[2], dims[3]),
            HeadLayout::Bthd => (dims[0], dims[2], dims[1], dims[3]),
        };
        RopeGeometry {
            batch,
            heads,
            seq_len,
            head_dim,
            rotary_dim,
            layout,
            pairs,
        }
    }

    /// Number of elements `B · H · T · D`.
    pub fn len(&self) -> usize {
        self.batch * self.heads * self.seq_len * self.head_dim
    }

    /// Whether the buffer is empty (never, once [`check`](Self::check) passed).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Checks every dimension.
    ///
    /// # Errors
    /// [`Error::InvalidDimension`] for a zero `B`, `H`, `T` or `D`, an odd
    /// `head_dim` or `rotary_dim`, or `rotary_dim > head_dim`.
    pub fn check(&self) -> Result<()> {
        crate::error::check_dim("batch", self.batch, false)?;
        crate::error::check_dim("heads", self.heads, false)?;
        crate::error::check_dim("seq_len", self.seq_len, false)?;
        crate::error::check_dim("head_dim", self.head_dim, true)?;
        crate::error::check_dim("rotary_dim", self.rotary_dim, true)?;
        if self.rotary_dim > self.head_dim {
            return Err(Error::InvalidDimension {
                what: "rotary_dim",
                value: self.rotary_dim,
                reason: "must not exceed head_dim",
            });
        }
        self.batch
            .checked_mul(self.heads)
            .and_then(|v| v.checked_mul(self.seq_len))
            .and_then(|v| v.checked_mul(self.head_dim))
            .ok_or(Error::InvalidDimension {
                what: "batch × heads × seq_len × head_dim",
                value: usize::MAX,
                reason: "overflows usize",
            })?;
        Ok(())
    }
}

/// Row-major `(rows, n_freq)` cos and sin tables.
#[derive(Debug, Clone, Copy)]
pub struct RopeTables<'a> {
    /// Cosines (times any attention or xPos factor).
    pub cos: &'a [f32],
    /// Sines (times the same factor).
    pub sin: &'a [f32],
    /// Width of a row: `rotary_dim / 2`.
    pub n_freq: usize,
}

impl RopeTables<'_> {
    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.cos.len().checked_div(self.n_freq).unwrap_or(0)
    }
}

/// Which table row each `(b, t)` uses.
#[derive(Debug, Clone, Copy)]
pub enum RowMap<'a> {
    /// Row `offset + t` for every batch entry (a KV-cache offset).
    Offset(usize),
    /// Row `ids[b · T + t]` (one row of position ids per batch entry).
    Ids(&'a [usize]),
}

impl RowMap<'_> {
    #[inline(always)]
    pub(crate) fn row(&self, b: usize, t: usize, seq_len: usize) -> usize {
        match *self {
            RowMap::Offset(o) => o + t,
            RowMap::Ids(ids) => ids[b * seq_len + t],
        }
    }
}

/// One head vector's memory: read from `src`, written to `dst`, which may
/// be equal (in place), never partially overlapping.
#[doc(hidden)]
#[derive(Clone, Copy)]
pub struct Io<T> {
    pub(crate) src: *const T,
    pub(crate) dst: *mut T,
}

/// One row of the tables: `cos` and `sin` each point to `nf` values.
#[doc(hidden)]
#[derive(Clone, Copy)]
pub struct Angles {
    pub(crate) cos: *const f32,
    pub(crate) sin: *const f32,
}

/// Rotates pairs `from..nf` of one head vector by one row of the tables
/// (by its inverse with `neg`).
pub(crate) type VecFn<T> = unsafe fn(v: Io<T>, row: Angles, nf: usize, from: usize, neg: bool);

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::f16 {}
    impl Sealed for half::bf16 {}
}

/// An activation type the kernels accept: `f32`, `f16`, `bf16`. Arithmetic
/// is always `f32`.
pub trait Element: Copy + Send + Sync + 'static + sealed::Sealed {
    /// `f32`, `f16` or `bf16`.
    const NAME: &'static str;
    /// Widens to `f32` (exact).
    fn to_f32(self) -> f32;
    /// Rounds from `f32` (to nearest, ties to even).
    fn from_f32(v: f32) -> Self;
    /// The per-vector kernel of `level` for `pairs`.
    #[doc(hidden)]
    fn vec_kernel(level: SimdLevel, pairs: PairLayout) -> VecFn<Self>;
}

fn scalar_kernel<T: Element>(pairs: PairLayout) -> VecFn<T> {
    match pairs {
        PairLayout::HalfSplit => scalar_pairs_from::<T, false>,
        PairLayout::Interleaved => scalar_pairs_from::<T, true>,
    }
}

/// `impl Element` for one activation type: its name, its widening and
/// rounding (`|x| …` from `Self` to `f32`, `|v| …` back), and whether it
/// has NEON kernels on aarch64 (`neon`; others: scalar); every type has
/// the x86-64 ones.
macro_rules! element {
    ($T:ty, $name:literal, |$x:ident| $to:expr, |$v:ident| $from:expr $(, $neon:ident)?) => {
        impl Element for $T {
            const NAME: &'static str = $name;
            #[inline(always)]
            fn to_f32(self) -> f32 {
                let $x = self;
                $to
            }
            #[inline(always)]
            fn from_f32($v: f32) -> Self {
                $from
            }
            fn vec_kernel(level: SimdLevel, pairs: PairLayout) -> VecFn<Self> {
                match level {
                    #[cfg(target_arch = "x86_64")]
                    SimdLevel::Avx512 => super::x86::avx512::select::<$T>(pairs),
                    #[cfg(target_arch = "x86_64")]
                    SimdLevel::Avx2 => super::x86::avx2::select::<$T>(pairs),
                    $(
                        #[cfg(target_arch = "aarch64")]
                        SimdLevel::Neon => super::$neon::select::<$T>(pairs),
                    )?
                    _ => scalar_kernel::<$T>(pairs),
                }
            }
        }
    };
}

element!(f32, "f32", |x| x, |v| v, neon);
element!(half::f16, "f16", |x| half::f16::to_f32(x), |v| {
    half::f16::from_f32(v)
});
element!(
    half::bf16,
    "bf16",
    |x| half::bf16::to_f32(x),
    |v| half::bf16::from_f32(v),
    neon
);

/// Scalar pairs `from..nf` of one head vector, half-split (`(i, i + nf)`)
/// or, with `INTERLEAVED`, interleaved (`(2i, 2i + 1)`); also the SIMD
/// kernels' tail and the scalar level's [`VecFn`].
///
/// # Safety
/// `src`/`dst` valid for `2·nf` elements, `cos`/`sin` for `nf`.
#[inline(always)]
pub(crate) unsafe fn scalar_pairs_from<T: Element, const INTERLEAVED: bool>(
    Io { src, dst }: Io<T>,
    Angles { cos, sin }: Angles,
    nf: usize,
    from: usize,
    neg: bool,
) {
    for i in from..nf {
        let (a, b) = if INTERLEAVED {
            (2 * i, 2 * i + 1)
        } else {
            (i, i + nf)
        };
        let c = *cos.add(i);
        let s = if neg { -*sin.add(i) } else { *sin.add(i) };
        let x0 = (*src.add(a)).to_f32();
        let x1 = (*src.add(b)).to_f32();
        *dst.add(a) = T::from_f32(x0 * c - x1 * s);
        *dst.add(b) = T::from_f32(x1 * c + x0 * s);
    }
}

/// What one rotation reads besides its buffers: the geometry of the
/// buffers, the cos/sin tables, the table row of every `(b, t)`, and
/// whether to rotate by the inverse angles (`sin → −sin`).
#[derive(Debug, Clone, Copy)]
pub struct RopeCall<'a> {
    /// Shape of the buffers and how their heads are rotated.
    pub g: &'a RopeGeometry,
    /// The cos and sin tables.
    pub tables: RopeTables<'a>,
    /// Which table row each `(b, t)` uses.
    pub rows: RowMap<'a>,
    /// Rotate by `−θ` instead of `θ`.
    pub inverse: bool,
}

impl RopeCall<'_> {
    /// Checks tables and rows against the geometry.
    fn check(&self) -> Result<()> {
        let RopeCall {
            g, tables, rows, ..
        } = *self;
        g.check()?;
        if tables.n_freq * 2 != g.rotary_dim {
            return Err(Error::Shape {
                what: "rope table width",
                expected: format!("rotary_dim / 2 = {}", g.rotary_dim / 2),
                got: format!("{}", tables.n_freq),
            });
        }
        if tables.cos.len() != tables.sin.len() || !tables.cos.len().is_multiple_of(tables.n_freq) {
            return Err(Error::Shape {
                what: "rope cos/sin tables",
                expected: format!("two tables of rows × {} values", tables.n_freq),
                got: format!("{} and {} values", tables.cos.len(), tables.sin.len()),
            });
        }
        let n_rows = tables.rows();
        match rows {
            RowMap::Offset(o) => {
                if o.checked_add(g.seq_len).is_none_or(|end| end > n_rows) {
                    return Err(Error::PositionOutOfRange {
                        position: (o as u64).saturating_add(g.seq_len as u64 - 1),
                        limit: n_rows as u64,
                        what: "rope table",
                    });
                }
            }
            RowMap::Ids(ids) => {
                if ids.len() != g.batch * g.seq_len {
                    return Err(Error::Shape {
                        what: "position ids",
                        expected: format!("{} = batch × seq_len", g.batch * g.seq_len),
                        got: format!("{}", ids.len()),
                    });
                }
                if let Some(&bad) = ids.iter().find(|&&r| r >= n_rows) {
                    return Err(Error::PositionOutOfRange {
                        position: bad as u64,
                        limit: n_rows as u64,
                        what: "rope table",
                    });
                }
            }
        }
        Ok(())
    }
}

fn check_len(what: &'static str, got: usize, g: &RopeGeometry) -> Result<()> {
    if got != g.len() {
        return Err(Error::Shape {
            what,
            expected: format!(
                "{} elements (B={}, H={}, T={}, D={})",
                g.len(),
                g.batch,
                g.heads,
                g.seq_len,
                g.head_dim
            ),
            got: format!("{got} elements"),
        });
    }
    Ok(())
}

/// Rotates `x` in place with the kernel of `level`.
///
/// # Errors
/// [`Error::InvalidDimension`] / [`Error::Shape`] for an inconsistent
/// geometry, buffer or tables, [`Error::PositionOutOfRange`] for a row past
/// the tables, [`Error::InvalidValue`] for a level this CPU lacks.
pub fn rope_inplace<T: Element>(level: SimdLevel, x: &mut [T], call: RopeCall<'_>) -> Result<()> {
    level.supported()?;
    call.check()?;
    check_len("rope buffer", x.len(), call.g)?;
    let p = x.as_mut_ptr();
    // SAFETY: lengths checked above; src == dst is allowed by the kernels.
    unsafe { drive(level, p, p, call) };
    Ok(())
}

/// Rotates `src` into `dst` (every element of `dst` is written).
///
/// # Errors
/// As [`rope_inplace`], plus [`Error::Shape`] if `dst` and `src` differ in length.
pub fn rope_out<T: Element>(
    level: SimdLevel,
    src: &[T],
    dst: &mut [T],
    call: RopeCall<'_>,
) -> Result<()> {
    // SAFETY: the kernels write only initialised values into dst, so it
    // stays initialised; `&mut dst` cannot overlap `&src`.
    let dst = unsafe { &mut *(dst as *mut [T] as *mut [MaybeUninit<T>]) };
    rope_out_uninit(level, src, dst, call)
}

/// [`rope_out`] into uninitialised memory; on `Ok` every element of `dst`
/// is initialised.
///
/// # Errors
/// As [`rope_out`].
pub fn rope_out_uninit<T: Element>(
    level: SimdLevel,
    src: &[T],
    dst: &mut [MaybeUninit<T>],
    call: RopeCall<'_>,
) -> Result<()> {
    level.supported()?;
    call.check()?;
    check_len("rope input", src.len(), call.g)?;
    check_len("rope output", dst.len(), call.g)?;
    // SAFETY: as rope_out; the kernels only write to dst.
    unsafe { drive(level, src.as_ptr(), dst.as_mut_ptr() as *mut T, call) };
    Ok(())
}

/// The reference: plain loops over `(b, h, t, pair)` with explicit strides,
/// arithmetic in `f64`, one rounding to `T` per output.
///
/// # Errors
/// As [`rope_out`].
pub fn rope_reference<T: Element>(src: &[T], dst: &mut [T], call: RopeCall<'_>) -> Result<()> {
    call.check()?;
    let RopeCall {
        g,
        tables,
        rows,
        inverse,
    } = call;
    check_len("rope input", src.len(), g)?;
    check_len("rope output", dst.len(), g)?;
    let (bb, hh, tt, dd) = (g.batch, g.heads, g.seq_len, g.head_dim);
    let nf = g.rotary_dim / 2;
    for b in 0..bb {
        for h in 0..hh {
            for t in 0..tt {
                let base = match g.layout {
                    HeadLayout::Bhtd => ((b * hh + h) * tt + t) * dd,
                    HeadLayout::Bthd => ((b * tt + t) * hh + h) * dd,
                };
                let r = rows.row(b, t, tt);
                dst[base + g.rotary_dim..base + dd]
                    .copy_from_slice(&src[base + g.rotary_dim..base + dd]);
                for i in 0..nf {
                    let c = tables.cos[r * nf + i] as f64;
                    let s = tables.sin[r * nf + i] as f64;
                    let s = if inverse { -s } else { s };
                    let (ia, ib) = g.pairs.pair(i, g.rotary_dim);
                    let xa = src[base + ia].to_f32() as f64;
                    let xb = src[base + ib].to_f32() as f64;
                    dst[base + ia] = T::from_f32((xa * c - xb * s) as f32);
                    dst[base + ib] = T::from_f32((xb * c + xa * s) as f32);
                }
            }
        }
    }
    Ok(())
}

#[derive(Clone, Copy)]
struct SendPtr<T>(*mut T);
// SAFETY: only used to hand disjoint ranges of one buffer to rayon tasks.
unsafe impl<T> Send for SendPtr<T> {}
unsafe impl<T> Sync for SendPtr<T> {}

impl<T> SendPtr<T> {
    #[inline(always)]
    fn get(self) -> *mut T {
        self.0
    }
}

/// Smallest piece of work handed to one rayon task, in elements.
const MIN_TASK_ELEMS: usize = 16 * 1024;

/// Time steps per tile in `(B, H, T, D)`: a tile's table rows (32 × 64
/// frequencies × 8 bytes = 16 KiB) stay in L1/L2 while every head of the
/// tile reads them, instead of streaming the whole table once per head.
const TIME_BLOCK: usize = 32;

/// Splits the work into tiles, several per thread whatever the shape, and
/// runs the per-vector kernel on each.
///
/// - `(B, T, H, D)`: contiguous runs of head vectors (the `H` vectors of one
///   time step share a table row).
/// - `(B, H, T, D)`: tiles of (batch entry, `TIME_BLOCK` time steps, a group
///   of heads); heads are split only when batch × time blocks alone would
///   leave threads idle (decode, short sequences).
///
/// # Safety
/// `src` and `dst` valid for `call.g.len()` elements, equal or disjoint;
/// `call` checked by [`RopeCall::check`].
unsafe fn drive<T: Element>(level: SimdLevel, src: *const T, dst: *mut T, call: RopeCall<'_>) {
    let g = call.g;
    let f = T::vec_kernel(level, g.pairs);
    let (bb, hh, tt, d) = (g.batch, g.heads, g.seq_len, g.head_dim);
    let n_vec = bb * hh * tt;
    let total = n_vec * d;
    let threads = rayon::current_num_threads().max(1);
    let want_tasks = (threads * 4).min(total / MIN_TASK_ELEMS).max(1);
    let src = SendPtr(src as *mut T);
    let dst = SendPtr(dst);
    let k = Kernel { f, call };
    match g.layout {
        HeadLayout::Bthd => {
            let chunk = n_vec.div_ceil(want_tasks);
            let n_chunks = n_vec.div_ceil(chunk);
            let run = |c: usize| {
                let v0 = c * chunk;
                let v1 = (v0 + chunk).min(n_vec);
                // SAFETY: chunk c covers vectors v0..v1, disjoint from other chunks.
                unsafe { k.run_vectors(src.get(), dst.get(), v0..v1) };
            };
            if n_chunks <= 1 {
                run(0);
            } else {
                (0..n_chunks).into_par_iter().for_each(run);
            }
        }
        HeadLayout::Bhtd => {
            let tb = tt.min(TIME_BLOCK);
            let n_tb = tt.div_ceil(tb);
            let base = bb * n_tb;
            let n_hb = want_tasks.div_ceil(base).clamp(1, hh);
            let hb = hh.div_ceil(n_hb);
            let n_hb = hh.div_ceil(hb);
            let n_tasks = base * n_hb;
            let run = |task: usize| {
                let hbk = task % n_hb;
                let tbk = (task / n_hb) % n_tb;
                let b = task / (n_hb * n_tb);
                let (t0, t1) = (tbk * tb, ((tbk + 1) * tb).min(tt));
                let (h0, h1) = (hbk * hb, ((hbk + 1) * hb).min(hh));
                for h in h0..h1 {
                    let v0 = (b * hh + h) * tt;
                    // SAFETY: tiles are disjoint sets of (b, h, t).
                    unsafe { k.run_vectors(src.get(), dst.get(), v0 + t0..v0 + t1) };
                }
            };
            if want_tasks <= 1 || n_tasks <= 1 {
                (0..n_tasks).for_each(run);
            } else {
                (0..n_tasks).into_par_iter().for_each(run);
            }
        }
    }
}

/// Everything a tile needs besides its buffers.
struct Kernel<'a, T> {
    f: VecFn<T>,
    call: RopeCall<'a>,
}

// SAFETY: shared read-only across rayon tasks (slices, plain values, fn pointer).
unsafe impl<T> Sync for Kernel<'_, T> {}

impl<T: Element> Kernel<'_, T> {
    /// Head vectors `vs` (flat indices in the buffer's own layout).
    ///
    /// # Safety
    /// As `drive`; no other task touches these vectors.
    #[inline(never)]
    unsafe fn run_vectors(&self, src: *const T, dst: *mut T, vs: std::ops::Range<usize>) {
        let RopeCall {
            g,
            tables,
            rows,
            inverse,
        } = self.call;
        let (hh, tt, d, rd) = (g.heads, g.seq_len, g.head_dim, g.rotary_dim);
        let nf = tables.n_freq;
        let cos = tables.cos.as_ptr();
        let sin = tables.sin.as_ptr();
        let in_place = std::ptr::eq(src, dst);
        for v in vs {
            let (b, t) = match g.layout {
                HeadLayout::Bhtd => (v / (hh * tt), v % tt),
                HeadLayout::Bthd => (v / (tt * hh), (v / hh) % tt),
            };
            let r = rows.row(b, t, tt);
            let s = src.add(v * d);
            let o = dst.add(v * d);
            let row = Angles {
                cos: cos.add(r * nf),
                sin: sin.add(r * nf),
            };
            (self.f)(Io { src: s, dst: o }, row, nf, 0, inverse);
            if !in_place && rd < d {
                std::ptr::copy_nonoverlapping(s.add(rd), o.add(rd), d - rd);
            }
        }
    }
}
