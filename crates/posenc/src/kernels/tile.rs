//! Small dense building blocks for the fused CPU kernels: a register-blocked
//! `C (+)= A·B` for tiles that stay in cache, a vectorisable `exp`, and
//! reductions with a fixed summation order.
//!
//! Everything here is `#[inline(always)]` portable Rust written so that the
//! compiler vectorises it; a caller compiled with `#[target_feature]` (AVX2 +
//! FMA, AVX-512) gets that instruction set in these loops too
//! ([`crate::kernels::attention`] instantiates its tasks once per level).
//! The matrix product [`gemm`] also takes the level: its register tiles are
//! written with AVX-512 or AVX2 intrinsics (the compiler's vectoriser spills
//! registers once a tile is inlined into a large kernel), and the portable
//! panels run at [`SimdLevel::Scalar`].
//! Reductions accumulate in fixed-width lanes and add the lanes in a fixed
//! order, so a result never depends on the number of threads.

use std::cell::RefCell;

use super::SimdLevel;

thread_local! {
    static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Per-thread scratch memory for kernel tasks: [`Scratch::take`] borrows
/// the thread's buffer (kept between calls, so a task allocates nothing once
/// its thread has run a task as large) and gives it back when dropped.
/// Plain calls, no closures: a task compiled for a SIMD level keeps that
/// level across them.
pub struct Scratch {
    buf: Vec<f32>,
}

impl Scratch {
    /// Takes this thread's buffer (an empty one if it is already taken).
    #[inline(always)]
    pub fn take() -> Scratch {
        Scratch {
            buf: SCRATCH.with(|c| {
                c.try_borrow_mut()
                    .map(|mut b| std::mem::take(&mut *b))
                    .unwrap_or_default()
            }),
        }
    }

    /// `N` disjoint buffers of the given sizes. Their contents are
    /// whatever the last task left (initialised floats, never uninitialised
    /// memory): callers write or zero each buffer before reading it.
    #[inline(always)]
    pub fn split<const N: usize>(&mut self, sizes: [usize; N]) -> [&mut [f32]; N] {
        let total: usize = sizes.iter().sum();
        if self.buf.len() < total {
            self.buf.resize(total, 0.0);
        }
        let mut rest: &mut [f32] = &mut self.buf[..total];
        std::array::from_fn(|i| {
            let (a, b) = std::mem::take(&mut rest).split_at_mut(sizes[i]);
            rest = b;
            a
        })
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let buf = std::mem::take(&mut self.buf);
        SCRATCH.with(|c| {
            if let Ok(mut b) = c.try_borrow_mut() {
                if b.capacity() < buf.capacity() {
                    *b = buf;
                }
            }
        });
    }
}

/// A vector of `n` floats for a kernel to overwrite, without the memset of
/// `vec![0.0; n]` (as candle's own `alloc_uninit`).
///
/// # Safety
/// The caller writes every element before anything reads it (and before the
/// vector is returned, dropped after a panic excepted).
#[allow(clippy::uninit_vec)]
pub unsafe fn vec_for_overwrite(n: usize) -> Vec<f32> {
    let mut v = Vec::with_capacity(n);
    v.set_len(n);
    v
}

/// Lanes of the fixed-order reductions.
const LANES: usize = 16;

/// The operands of one product `C[m×n] (+)= A[m×k] · B[k×n]` for [`gemm`]
/// and [`gemm_blocked`]: element `A[i][p]` is `a.at(i, p)` (so `A` may be a
/// transposed view), `B` and `C` row-major with leading dimensions `ldb`,
/// `ldc`; `accumulate = false` overwrites `C`. `C` is `f32`; `A` and `B`
/// hold `T`s: `f32`, or pairs of bfloat16 values (`u32`) for
/// [`crate::kernels::bf16::gemm`], where `k` counts pairs.
///
/// Built by [`Gemm::new`] and the methods that set each operand:
/// `Gemm::new(m, n, k).a(a, lda).b(b, ldb).to(c, ldc)` for `C = A·B`.
#[derive(Clone, Copy, Debug)]
pub struct Gemm<T = f32> {
    /// Rows of `A` and `C`.
    pub m: usize,
    /// Columns of `B` and `C`.
    pub n: usize,
    /// Columns of `A`, rows of `B`: the length of each sum.
    pub k: usize,
    /// `A`, with any strides.
    pub a: Strided<T>,
    /// `B[0][0]`.
    pub b: *const T,
    /// The distance from one row of `B` to the next.
    pub ldb: usize,
    /// `C[0][0]`.
    pub c: *mut f32,
    /// The distance from one row of `C` to the next.
    pub ldc: usize,
    /// Whether the product is added to `C` (else it overwrites `C`).
    pub accumulate: bool,
}

impl<T: Copy> Gemm<T> {
    /// An `m × n × k` product whose operands are not set yet (null
    /// pointers): set `A`, `B` and `C` before running it.
    #[inline(always)]
    pub fn new(m: usize, n: usize, k: usize) -> Gemm<T> {
        Gemm {
            m,
            n,
            k,
            a: Strided::rows(std::ptr::null(), 0),
            b: std::ptr::null(),
            ldb: 0,
            c: std::ptr::null_mut(),
            ldc: 0,
            accumulate: false,
        }
    }

    /// `A` row-major: `A[i][p] = a[i·lda + p]`.
    #[inline(always)]
    pub fn a(self, a: *const T, lda: usize) -> Gemm<T> {
        Gemm {
            a: Strided::rows(a, lda),
            ..self
        }
    }

    /// `B` row-major: `B[p][j] = b[p·ldb + j]`.
    #[inline(always)]
    pub fn b(self, b: *const T, ldb: usize) -> Gemm<T> {
        Gemm { b, ldb, ..self }
    }

    /// `C = A·B`, row-major: `C[i][j] = c[i·ldc + j]` (overwritten).
    #[inline(always)]
    pub fn to(self, c: *mut f32, ldc: usize) -> Gemm<T> {
        self.c(c, ldc, false)
    }

    /// `C += A·B`, row-major: `C[i][j] = c[i·ldc + j]`.
    #[inline(always)]
    pub fn add_to(self, c: *mut f32, ldc: usize) -> Gemm<T> {
        self.c(c, ldc, true)
    }

    /// `C (+)= A·B`, row-major: `C[i][j] = c[i·ldc + j]`, added to when
    /// `accumulate`, else overwritten.
    #[inline(always)]
    pub fn c(self, c: *mut f32, ldc: usize, accumulate: bool) -> Gemm<T> {
        Gemm {
            c,
            ldc,
            accumulate,
            ..self
        }
    }

    /// The same product restricted to the columns from `j` on.
    ///
    /// # Safety
    /// `j ≤ n`, and the pointers address the operands.
    #[inline(always)]
    pub(crate) unsafe fn columns_from(self, j: usize) -> Gemm<T> {
        Gemm {
            n: self.n - j,
            b: self.b.add(j),
            c: self.c.add(j),
            ..self
        }
    }

    /// The block of rows `i0..i0 + m`, columns `j0..j0 + n` and steps
    /// `p0..p0 + k` of the product, continuing the sums already in `C` when
    /// `p0 > 0`.
    ///
    /// # Safety
    /// The block lies within the product, whose pointers address the
    /// operands.
    #[inline(always)]
    pub(crate) unsafe fn block(self, [i0, j0, p0]: [usize; 3], [m, n, k]: [usize; 3]) -> Gemm<T> {
        let a = self.a;
        Gemm {
            m,
            n,
            k,
            a: Strided {
                p: a.p.add(i0 * a.rs + p0 * a.cs),
                ..a
            },
            b: self.b.add(p0 * self.ldb + j0),
            c: self.c.add(i0 * self.ldc + j0),
            accumulate: self.accumulate || p0 > 0,
            ..self
        }
    }
}

impl Gemm<f32> {
    /// `A` given as its transpose, row-major: `A[i][p] = at[p·ld + i]`.
    #[inline(always)]
    pub fn a_t(self, at: *const f32, ld: usize) -> Gemm {
        Gemm {
            a: Strided {
                p: at,
                rs: 1,
                cs: ld,
            },
            ..self
        }
    }

    /// `A` with any strides: `A[i][p] = a[i·rs + p·cs]`.
    #[inline(always)]
    pub fn a_strided(self, a: *const f32, rs: usize, cs: usize) -> Gemm {
        Gemm {
            a: Strided { p: a, rs, cs },
            ..self
        }
    }
}

/// Runs the product `g` (see [`Gemm`]).
///
/// Register tiles, run with the instructions of `level` (which the CPU must
/// have): with AVX-512, 8 rows × 32 (or 16, or 1 to 15 masked) columns of
/// `C` in registers, narrow products (at most 8 columns) on 8-lane
/// registers; with AVX2 + FMA, 6 rows × 16 (or 4 × 8) columns; otherwise
/// portable panels of 4 rows × 16, 8, 4 or 1 columns. For each `p` one row
/// of `B` is loaded and multiplied by broadcast entries of `A`. Each entry
/// of `C` is a chain of fused multiply-adds over `p` in increasing order at
/// every level, so all levels give the same bits.
///
/// # Safety
/// The pointers must address every element: `A[i][p]` for `i < m`, `p < k`;
/// `b[(k−1)·ldb + n − 1]`; `c[(m−1)·ldc + n − 1]` (for non-empty sizes);
/// `level` must be supported by this CPU.
#[inline(always)]
pub unsafe fn gemm(level: SimdLevel, g: Gemm) {
    let n = g.n;
    let mut j = 0;
    #[cfg(target_arch = "x86_64")]
    match level {
        SimdLevel::Avx512 => {
            x86_512::gemm(g);
            return;
        }
        SimdLevel::Avx2 if n >= 8 => {
            while j + 16 <= n {
                x86::panel16(g.columns_from(j));
                j += 16;
            }
            if j + 8 <= n {
                x86::panel8(g.columns_from(j));
                j += 8;
            }
        }
        _ => {}
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = level;
    while j + 16 <= n {
        panel::<16>(g.columns_from(j));
        j += 16;
    }
    if j + 8 <= n {
        panel::<8>(g.columns_from(j));
        j += 8;
    }
    if j + 4 <= n {
        panel::<4>(g.columns_from(j));
        j += 4;
    }
    while j < n {
        panel::<1>(g.columns_from(j));
        j += 1;
    }
}

/// Rows of `C` in one register tile of [`gemm`] at `level`: 8 with
/// AVX-512, 6 with AVX2, 4 in the portable panels.
#[inline(always)]
pub fn row_tile(level: SimdLevel) -> usize {
    match level {
        SimdLevel::Avx512 => 8,
        SimdLevel::Avx2 => 6,
        _ => 4,
    }
}

/// [`gemm`] with parts of `C` and of the sums left out: the rows of `C` in
/// groups of [`row_tile`], the group of rows `r0..r1` restricted to the
/// columns `c0..c1` and the steps `p0..p1` of `k` that
/// `limit(r0, r1) = ([c0, c1], [p0, p1])` gives (within the product; a group
/// with no column or no step is skipped). Consecutive groups with the same
/// limits run as one product. For a product whose left-out
/// terms are exact zeros (the hidden keys of a causal or windowed tile) and
/// whose left-out entries of `C` nobody reads, this is [`gemm`]'s result
/// with the same bits: each entry that is computed is the same chain of
/// fused multiply-adds over `p` in increasing order, less terms that only
/// added zeros. The steps from `p0 > 0` continue the sums in `C` (as
/// [`Gemm::add_to`]).
///
/// # Safety
/// As [`gemm`], for the whole product.
#[inline(always)]
pub unsafe fn gemm_trimmed(
    level: SimdLevel,
    g: Gemm,
    limit: impl Fn(usize, usize) -> ([usize; 2], [usize; 2]),
) {
    trimmed(g, row_tile(level), limit, |g| gemm(level, g))
}

/// [`gemm_trimmed`]'s groups for any product `run` computes, `step` rows
/// of `C` a group (its register tile's height).
///
/// # Safety
/// `run` may be called on any block of `g` (a product within it).
#[inline(always)]
pub(crate) unsafe fn trimmed<T: Copy>(
    g: Gemm<T>,
    step: usize,
    limit: impl Fn(usize, usize) -> ([usize; 2], [usize; 2]),
    run: impl Fn(Gemm<T>),
) {
    if g.m == 0 {
        return;
    }
    let clipped = |r0: usize, r1: usize| {
        let ([c0, c1], [p0, p1]) = limit(r0, r1);
        [c0, c1.min(g.n), p0, p1.min(g.k)]
    };
    // The run of groups from row `start` with the limits `lim`.
    let (mut start, mut lim) = (0, clipped(0, step.min(g.m)));
    let mut r0 = 0;
    while r0 < g.m {
        let r1 = (r0 + step).min(g.m);
        let next = if r1 < g.m {
            Some(clipped(r1, (r1 + step).min(g.m)))
        } else {
            None
        };
        if next != Some(lim) {
            let [c0, c1, p0, p1] = lim;
            if c0 < c1 && p0 < p1 {
                run(g.block([start, c0, p0], [r1 - start, c1 - c0, p1 - p0]));
            }
            if let Some(next) = next {
                (start, lim) = (r1, next);
            }
        }
        r0 = r1;
    }
}

/// [`gemm_trimmed`] when `trim`, else [`gemm`].
///
/// # Safety
/// As [`gemm`].
#[inline(always)]
pub unsafe fn gemm_maybe_trimmed(
    level: SimdLevel,
    g: Gemm,
    trim: bool,
    limit: impl Fn(usize, usize) -> ([usize; 2], [usize; 2]),
) {
    if trim {
        gemm_trimmed(level, g, limit)
    } else {
        gemm(level, g)
    }
}

/// Rows of `C` per block of [`gemm_blocked`].
const BLOCK_M: usize = 64;
/// Columns of `C` per block of [`gemm_blocked`].
const BLOCK_N: usize = 128;
/// Steps of `k` per block of [`gemm_blocked`].
const BLOCK_K: usize = 256;

/// [`gemm`] for products larger than a cache: `C` in blocks of
/// [`BLOCK_M`] × [`BLOCK_N`] over [`BLOCK_K`] steps of `k` at a time (so
/// that the `A` and `B` blocks a register tile reads stay in the L2 cache),
/// row blocks split over `threads` rayon threads. Each entry of `C` is the
/// same chain of fused multiply-adds over `p` in increasing order as in
/// [`gemm`] (a block of `k` continues the chain from `C`), so the result has
/// the same bits as [`gemm`] for every block size and thread count.
///
/// # Safety
/// As [`gemm`].
pub unsafe fn gemm_blocked(level: SimdLevel, g: Gemm, threads: usize) {
    let Gemm { m, n, k, .. } = g;
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !g.accumulate {
            for i in 0..m {
                std::slice::from_raw_parts_mut(g.c.add(i * g.ldc), n).fill(0.0);
            }
        }
        return;
    }
    // The operands may cross threads: the row blocks write disjoint rows
    // of C.
    let g = SendGemm(g);
    let rows = move |i0: usize| {
        let g = g.get();
        let mb = BLOCK_M.min(m - i0);
        let mut p0 = 0;
        while p0 < k {
            let kb = BLOCK_K.min(k - p0);
            let mut j0 = 0;
            while j0 < n {
                let nb = BLOCK_N.min(n - j0);
                // SAFETY: a sub-block of the caller's product.
                unsafe { gemm(level, g.block([i0, j0, p0], [mb, nb, kb])) };
                j0 += nb;
            }
            p0 += kb;
        }
    };
    let blocks = m.div_ceil(BLOCK_M);
    if threads > 1 && blocks > 1 {
        use rayon::prelude::*;
        (0..blocks)
            .into_par_iter()
            .with_min_len(blocks.div_ceil(threads * 4).max(1))
            .for_each(|bi| rows(bi * BLOCK_M));
    } else {
        (0..blocks).for_each(|bi| rows(bi * BLOCK_M));
    }
}

/// A [`Gemm`] handed to [`gemm_blocked`]'s threads, which write disjoint
/// rows of `C`.
#[derive(Clone, Copy)]
struct SendGemm(Gemm);
// SAFETY: the threads read A and B and write disjoint blocks of C.
unsafe impl Send for SendGemm {}
unsafe impl Sync for SendGemm {}

impl SendGemm {
    /// The product (a method, so that closures capture the whole wrapper).
    #[inline(always)]
    fn get(self) -> Gemm {
        self.0
    }
}

/// AVX-512 micro-kernels of [`gemm`]: `R` rows × `W` registers of 16
/// columns of `C` stay in registers (8 × 32 at most: 16 of the 32 vector
/// registers), one row of `B` is loaded and `R` entries of `A` broadcast per
/// step of `k`; the last register of a row is masked, so any width runs
/// without a scalar tail. Products at most 8 columns wide run on 8-lane
/// registers. Same summation order as the other levels.
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86_512 {
    use std::arch::x86_64::*;

    use super::Gemm;

    /// The whole product: at most 8 columns on 8-lane registers, else
    /// [`panels`].
    #[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
    pub(super) unsafe fn gemm(g: Gemm) {
        if g.n <= 8 {
            let mask = ((1u32 << g.n) - 1) as __mmask8;
            rows(g.m, Narrow { g, mask });
            return;
        }
        panels(g);
    }

    /// Register tiles of `C` for [`rows`]: a product's tile of `R` rows
    /// from row `i`.
    pub(crate) trait RowTiles: Copy {
        /// Rows `i..i + R` of `C`.
        ///
        /// # Safety
        /// The rows are in the product, whose pointers address its
        /// operands; the CPU has the instructions the tile runs.
        unsafe fn tile<const R: usize>(self, i: usize);
    }

    /// Rows `0..m` of `C` in tiles of 8, then one of 4, then single rows.
    ///
    /// # Safety
    /// As [`RowTiles::tile`] for every row.
    #[inline(always)]
    pub(crate) unsafe fn rows(m: usize, t: impl RowTiles) {
        let mut i = 0;
        while i + 8 <= m {
            t.tile::<8>(i);
            i += 8;
        }
        if i + 4 <= m {
            t.tile::<4>(i);
            i += 4;
        }
        while i < m {
            t.tile::<1>(i);
            i += 1;
        }
    }

    /// One column panel of a product: `W` registers of 16 columns from its
    /// first column, the last register masked by `mask`. [`RowTiles`] for
    /// `f32` operands here, for bfloat16 pairs in
    /// [`crate::kernels::bf16`].
    #[derive(Clone, Copy)]
    pub(crate) struct Panel<T, const W: usize> {
        /// The product from the panel's first column on.
        pub(crate) g: Gemm<T>,
        /// The lanes of the last register.
        pub(crate) mask: __mmask16,
    }

    /// The whole product in column panels of 32, then 17 to 31 (one full
    /// register and one masked) or 1 to 16 (one masked).
    ///
    /// # Safety
    /// As [`RowTiles::tile`] for every tile.
    #[inline(always)]
    pub(crate) unsafe fn panels<T: Copy>(g: Gemm<T>)
    where
        Panel<T, 1>: RowTiles,
        Panel<T, 2>: RowTiles,
    {
        let n = g.n;
        let mut j = 0;
        while j + 32 <= n {
            let mask = 0xFFFF;
            rows(
                g.m,
                Panel::<T, 2> {
                    g: g.columns_from(j),
                    mask,
                },
            );
            j += 32;
        }
        if j + 16 < n {
            let mask = ((1u32 << (n - j - 16)) - 1) as __mmask16;
            rows(
                g.m,
                Panel::<T, 2> {
                    g: g.columns_from(j),
                    mask,
                },
            );
        } else if j < n {
            let mask = ((1u32 << (n - j)) - 1) as __mmask16;
            rows(
                g.m,
                Panel::<T, 1> {
                    g: g.columns_from(j),
                    mask,
                },
            );
        }
    }

    /// `R` rows of `C` from `c` (leading dimension `ldc`), `W` registers
    /// of 16 columns, the last one masked by `mask`: loaded when
    /// `accumulate`, else zeros. The register tile of [`gemm`] and of
    /// [`crate::kernels::bf16::gemm`].
    #[inline(always)]
    pub(crate) unsafe fn load_c<const R: usize, const W: usize>(
        c: *const f32,
        ldc: usize,
        accumulate: bool,
        mask: __mmask16,
    ) -> [[__m512; W]; R] {
        let mut acc = [[_mm512_setzero_ps(); W]; R];
        if accumulate {
            for (r, row) in acc.iter_mut().enumerate() {
                for (w, v) in row.iter_mut().enumerate() {
                    *v = _mm512_maskz_loadu_ps(lanes::<W>(w, mask), c.add(r * ldc + 16 * w));
                }
            }
        }
        acc
    }

    /// Stores a tile of [`load_c`]'s shape back to `c`.
    #[inline(always)]
    pub(crate) unsafe fn store_c<const R: usize, const W: usize>(
        acc: &[[__m512; W]; R],
        c: *mut f32,
        ldc: usize,
        mask: __mmask16,
    ) {
        for (r, row) in acc.iter().enumerate() {
            for (w, v) in row.iter().enumerate() {
                _mm512_mask_storeu_ps(c.add(r * ldc + 16 * w), lanes::<W>(w, mask), *v);
            }
        }
    }

    /// The lanes of register `w` of `W` in a row: all, or `mask` for the
    /// last one.
    #[inline(always)]
    pub(crate) fn lanes<const W: usize>(w: usize, mask: __mmask16) -> __mmask16 {
        if w + 1 == W {
            mask
        } else {
            0xFFFF
        }
    }

    impl<const W: usize> RowTiles for Panel<f32, W> {
        /// Rows `i..i + R` of the panel.
        #[inline(always)]
        unsafe fn tile<const R: usize>(self, i: usize) {
            let Panel { g, mask } = self;
            let (k, a, b, ldb, c, ldc) = (g.k, g.a, g.b, g.ldb, g.c, g.ldc);
            let mut acc = load_c::<R, W>(c.add(i * ldc), ldc, g.accumulate, mask);
            for p in 0..k {
                let bp = b.add(p * ldb);
                let mut bv = [_mm512_setzero_ps(); W];
                for (w, v) in bv.iter_mut().enumerate() {
                    *v = _mm512_maskz_loadu_ps(lanes::<W>(w, mask), bp.add(16 * w));
                }
                for (r, row) in acc.iter_mut().enumerate() {
                    let av = _mm512_set1_ps(a.at(i + r, p));
                    for (w, v) in row.iter_mut().enumerate() {
                        *v = _mm512_fmadd_ps(av, bv[w], *v);
                    }
                }
            }
            store_c(&acc, c.add(i * ldc), ldc, mask);
        }
    }

    /// A product at most 8 columns wide, on 8-lane registers.
    #[derive(Clone, Copy)]
    struct Narrow {
        /// The product.
        g: Gemm,
        /// Its columns.
        mask: __mmask8,
    }

    impl RowTiles for Narrow {
        /// Rows `i..i + R` of the product.
        #[inline(always)]
        unsafe fn tile<const R: usize>(self, i: usize) {
            let Narrow { g, mask } = self;
            let (k, a, b, ldb, c, ldc) = (g.k, g.a, g.b, g.ldb, g.c, g.ldc);
            let mut acc = [_mm256_setzero_ps(); R];
            if g.accumulate {
                for (r, v) in acc.iter_mut().enumerate() {
                    *v = _mm256_maskz_loadu_ps(mask, c.add((i + r) * ldc));
                }
            }
            for p in 0..k {
                let bv = _mm256_maskz_loadu_ps(mask, b.add(p * ldb));
                for (r, v) in acc.iter_mut().enumerate() {
                    *v = _mm256_fmadd_ps(_mm256_set1_ps(a.at(i + r, p)), bv, *v);
                }
            }
            for (r, v) in acc.iter().enumerate() {
                _mm256_mask_storeu_ps(c.add((i + r) * ldc), mask, *v);
            }
        }
    }
}

/// AVX2 + FMA micro-kernels of [`gemm`]: 6 (or 4, or 1) rows × 16 columns,
/// or 4 rows × 8 columns, of `C` in registers, one row of `B` loaded and an
/// entry of `A` per row broadcast per step of `k`. Same summation order as
/// the generic panels.
#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::Gemm;

    /// The first 16 columns of `g`.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn panel16(g: Gemm) {
        let m = g.m;
        let mut i = 0;
        while i + 6 <= m {
            block16::<6>(i, g);
            i += 6;
        }
        // The last rows in one block (a block of one row runs two chains of
        // fused multiply-adds, a quarter of what hides their latency).
        match m - i {
            5 => block16::<5>(i, g),
            4 => block16::<4>(i, g),
            3 => block16::<3>(i, g),
            2 => block16::<2>(i, g),
            1 => block16::<1>(i, g),
            _ => {}
        }
    }

    /// Rows `i..i + R` of a 16-column panel: `2·R` accumulators (12 of the
    /// 16 registers for six rows, so that the fused multiply-adds' latency
    /// hides behind independent chains), two loads of `B` and `R`
    /// broadcasts of `A` per step of `k`.
    #[inline(always)]
    unsafe fn block16<const R: usize>(i: usize, g: Gemm) {
        let (k, a, b, ldb, c, ldc) = (g.k, g.a, g.b, g.ldb, g.c, g.ldc);
        let mut acc = [[_mm256_setzero_ps(); 2]; R];
        if g.accumulate {
            for (r, row) in acc.iter_mut().enumerate() {
                row[0] = _mm256_loadu_ps(c.add((i + r) * ldc));
                row[1] = _mm256_loadu_ps(c.add((i + r) * ldc + 8));
            }
        }
        for p in 0..k {
            let bp = b.add(p * ldb);
            let b0 = _mm256_loadu_ps(bp);
            let b1 = _mm256_loadu_ps(bp.add(8));
            for (r, row) in acc.iter_mut().enumerate() {
                let av = _mm256_set1_ps(a.at(i + r, p));
                row[0] = _mm256_fmadd_ps(av, b0, row[0]);
                row[1] = _mm256_fmadd_ps(av, b1, row[1]);
            }
        }
        for (r, row) in acc.iter().enumerate() {
            _mm256_storeu_ps(c.add((i + r) * ldc), row[0]);
            _mm256_storeu_ps(c.add((i + r) * ldc + 8), row[1]);
        }
    }

    /// The first 8 columns of `g`.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn panel8(g: Gemm) {
        let (m, k, a, b, ldb, c, ldc, accumulate) =
            (g.m, g.k, g.a, g.b, g.ldb, g.c, g.ldc, g.accumulate);
        let ld = |r: usize| -> __m256 {
            if accumulate {
                _mm256_loadu_ps(c.add(r * ldc))
            } else {
                _mm256_setzero_ps()
            }
        };
        let mut i = 0;
        while i + 4 <= m {
            let (mut c0, mut c1, mut c2, mut c3) = (ld(i), ld(i + 1), ld(i + 2), ld(i + 3));
            for p in 0..k {
                let b0 = _mm256_loadu_ps(b.add(p * ldb));
                c0 = _mm256_fmadd_ps(_mm256_set1_ps(a.at(i, p)), b0, c0);
                c1 = _mm256_fmadd_ps(_mm256_set1_ps(a.at(i + 1, p)), b0, c1);
                c2 = _mm256_fmadd_ps(_mm256_set1_ps(a.at(i + 2, p)), b0, c2);
                c3 = _mm256_fmadd_ps(_mm256_set1_ps(a.at(i + 3, p)), b0, c3);
            }
            for (r, v) in [c0, c1, c2, c3].into_iter().enumerate() {
                _mm256_storeu_ps(c.add((i + r) * ldc), v);
            }
            i += 4;
        }
        while i < m {
            let mut v = ld(i);
            for p in 0..k {
                v = _mm256_fmadd_ps(
                    _mm256_set1_ps(a.at(i, p)),
                    _mm256_loadu_ps(b.add(p * ldb)),
                    v,
                );
            }
            _mm256_storeu_ps(c.add(i * ldc), v);
            i += 1;
        }
    }
}

/// A strided read-only matrix: element `(i, j)` is `p[i·rs + j·cs]`.
#[derive(Clone, Copy, Debug)]
pub struct Strided<T = f32> {
    /// Element `(0, 0)`.
    pub p: *const T,
    /// The distance from one row to the next.
    pub rs: usize,
    /// The distance from one column to the next.
    pub cs: usize,
}

impl<T: Copy> Strided<T> {
    /// A row-major matrix with leading dimension `ld`.
    #[inline(always)]
    pub fn rows(p: *const T, ld: usize) -> Strided<T> {
        Strided { p, rs: ld, cs: 1 }
    }

    /// Element `(i, j)`.
    ///
    /// # Safety
    /// The element is in bounds.
    #[inline(always)]
    pub unsafe fn at(&self, i: usize, j: usize) -> T {
        *self.p.add(i * self.rs + j * self.cs)
    }
}

/// One column panel of width `NR` of [`gemm`].
#[inline(always)]
unsafe fn panel<const NR: usize>(g: Gemm) {
    let (m, k, a, b, ldb, c, ldc, accumulate) =
        (g.m, g.k, g.a, g.b, g.ldb, g.c, g.ldc, g.accumulate);
    let mut i = 0;
    while i + 4 <= m {
        let mut acc = [[0f32; NR]; 4];
        if accumulate {
            for (r, row) in acc.iter_mut().enumerate() {
                for (x, v) in row.iter_mut().enumerate() {
                    *v = *c.add((i + r) * ldc + x);
                }
            }
        }
        for p in 0..k {
            let bp = b.add(p * ldb);
            let mut brow = [0f32; NR];
            for (x, v) in brow.iter_mut().enumerate() {
                *v = *bp.add(x);
            }
            for (r, row) in acc.iter_mut().enumerate() {
                let av = a.at(i + r, p);
                for x in 0..NR {
                    row[x] = av.mul_add(brow[x], row[x]);
                }
            }
        }
        for (r, row) in acc.iter().enumerate() {
            for (x, v) in row.iter().enumerate() {
                *c.add((i + r) * ldc + x) = *v;
            }
        }
        i += 4;
    }
    while i < m {
        let mut acc = [0f32; NR];
        if accumulate {
            for (x, v) in acc.iter_mut().enumerate() {
                *v = *c.add(i * ldc + x);
            }
        }
        for p in 0..k {
            let bp = b.add(p * ldb);
            let av = a.at(i, p);
            for (x, v) in acc.iter_mut().enumerate() {
                *v = av.mul_add(*bp.add(x), *v);
            }
        }
        for (x, v) in acc.iter().enumerate() {
            *c.add(i * ldc + x) = *v;
        }
        i += 1;
    }
}

/// `exp(x)` in `f32`, branch-free so that loops over it vectorise: Cephes'
/// `expf` range reduction `x = n·ln 2 + r`, `|r| ≤ ln 2 / 2`, and its degree-6
/// polynomial (relative error below 2e-7 on the whole range); inputs are
/// clamped to `[−87.3, 88.3]`, and anything below −87.3 (`−∞` too) gives
/// exactly 0.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    let xc = x.clamp(-87.3, 88.3);
    let n = (xc * LOG2E + 0.5).floor();
    let r = xc - n * LN2_HI - n * LN2_LO;
    let r2 = r * r;
    let mut p = 1.987_569_1e-4f32;
    p = p.mul_add(r, 1.398_199_9e-3);
    p = p.mul_add(r, 8.333_452e-3);
    p = p.mul_add(r, 4.166_579_6e-2);
    p = p.mul_add(r, 1.666_666_5e-1);
    p = p.mul_add(r, 0.5);
    let e = p.mul_add(r2, r) + 1.0;
    // 2^n for n in [−126, 127]: exponent bits. `n` is integral, so adding
    // 1.5·2^23 leaves it in the low mantissa bits as a two's-complement
    // integer (an `as i32` conversion would not vectorise: it saturates).
    let ni = (n + 12_582_912.0).to_bits().wrapping_sub(0x4B40_0000);
    let bits = ni.wrapping_add(127) << 23;
    let y = e * f32::from_bits(bits);
    if x < -87.3 {
        0.0
    } else {
        y
    }
}

/// `tanh(x)` from [`exp`]: `sign(x)·(1 − 2/(e^{2|x|} + 1))`, absolute error
/// below 3e-7.
#[inline(always)]
pub fn tanh(x: f32) -> f32 {
    let e = exp(2.0 * x.abs());
    let t = 1.0 - 2.0 / (e + 1.0);
    t.copysign(x)
}

/// `Σ x` in fixed lane order.
#[inline(always)]
pub fn sum(x: &[f32]) -> f32 {
    let mut acc = [0f32; LANES];
    let chunks = x.chunks_exact(LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for l in 0..LANES {
            acc[l] += c[l];
        }
    }
    for (l, v) in rest.iter().enumerate() {
        acc[l] += v;
    }
    fold(acc)
}

/// `Σ x·y` in fixed lane order.
#[inline(always)]
pub fn dot(x: &[f32], y: &[f32]) -> f32 {
    let n = x.len().min(y.len());
    let (x, y) = (&x[..n], &y[..n]);
    let mut acc = [0f32; LANES];
    let mut i = 0;
    while i + LANES <= n {
        for l in 0..LANES {
            acc[l] = x[i + l].mul_add(y[i + l], acc[l]);
        }
        i += LANES;
    }
    for l in 0..n - i {
        acc[l] = x[i + l].mul_add(y[i + l], acc[l]);
    }
    fold(acc)
}

/// `max x` (−∞ for an empty slice; NaN-free inputs).
#[inline(always)]
pub fn max(x: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; LANES];
    let chunks = x.chunks_exact(LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for l in 0..LANES {
            acc[l] = if c[l] > acc[l] { c[l] } else { acc[l] };
        }
    }
    for (l, v) in rest.iter().enumerate() {
        acc[l] = if *v > acc[l] { *v } else { acc[l] };
    }
    let mut m = f32::NEG_INFINITY;
    for v in acc {
        m = if v > m { v } else { m };
    }
    m
}

/// Adds the lanes pairwise in a fixed order.
#[inline(always)]
fn fold(mut acc: [f32; LANES]) -> f32 {
    let mut w = LANES / 2;
    while w > 0 {
        for l in 0..w {
            acc[l] += acc[l + w];
        }
        w /= 2;
    }
    acc[0]
}

/// `y += a·x`.
#[inline(always)]
pub fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
    for (yv, xv) in y.iter_mut().zip(x) {
        *yv = a.mul_add(*xv, *yv);
    }
}

/// `y *= a`.
#[inline(always)]
pub fn scale(a: f32, y: &mut [f32]) {
    for v in y.iter_mut() {
        *v *= a;
    }
}

/// Transposes the row-major `rows × cols` block at `src` (leading dimension
/// `lds`) into `dst` (`cols × rows`, leading dimension `ldd`).
///
/// # Safety
/// Both blocks must be in bounds.
#[inline(always)]
pub unsafe fn transpose(
    rows: usize,
    cols: usize,
    src: *const f32,
    lds: usize,
    dst: *mut f32,
    ldd: usize,
) {
    let src = Strided::rows(src, lds);
    let t = Transpose {
        rows,
        cols,
        src,
        dst,
        ldd,
    };
    #[cfg(target_arch = "x86_64")]
    if rows >= 8 && cols >= 8 && matches!(SimdLevel::detect(), SimdLevel::Avx2 | SimdLevel::Avx512)
    {
        // SAFETY: AVX is part of both levels, which `detect` only returns
        // on CPUs that have them.
        return unsafe { transpose_avx(t) };
    }
    unsafe { transpose_scalar(t) }
}

/// The operands of one [`transpose`]: the `rows × cols` block `src`
/// (row-major) into `dst` (leading dimension `ldd`).
#[derive(Clone, Copy)]
struct Transpose {
    rows: usize,
    cols: usize,
    src: Strided,
    dst: *mut f32,
    ldd: usize,
}

impl Transpose {
    /// The part of the block from row `i0`, column `j0` of the source on.
    ///
    /// # Safety
    /// `i0 ≤ rows`, `j0 ≤ cols`.
    #[inline(always)]
    unsafe fn part_from(self, i0: usize, j0: usize) -> Transpose {
        Transpose {
            rows: self.rows - i0,
            cols: self.cols - j0,
            src: Strided::rows(self.src.p.add(i0 * self.src.rs + j0), self.src.rs),
            dst: self.dst.add(j0 * self.ldd + i0),
            ..self
        }
    }
}

/// [`transpose`] element by element in 8 × 8 blocks: the reference, and
/// the path without AVX.
///
/// # Safety
/// As [`transpose`].
#[inline(always)]
unsafe fn transpose_scalar(t: Transpose) {
    let (rows, cols, src, lds, dst, ldd) = (t.rows, t.cols, t.src.p, t.src.rs, t.dst, t.ldd);
    const B: usize = 8;
    let mut i0 = 0;
    while i0 < rows {
        let i1 = (i0 + B).min(rows);
        let mut j0 = 0;
        while j0 < cols {
            let j1 = (j0 + B).min(cols);
            for i in i0..i1 {
                for j in j0..j1 {
                    unsafe { *dst.add(j * ldd + i) = *src.add(i * lds + j) };
                }
            }
            j0 = j1;
        }
        i0 = i1;
    }
}

/// [`transpose`] with whole 8 × 8 blocks in AVX registers (eight row
/// loads, the unpack–shuffle–permute network, eight column stores), the
/// ragged edges element by element. Data movement only: the result is the
/// scalar path's, bit for bit.
///
/// # Safety
/// As [`transpose`], on a CPU with AVX.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
unsafe fn transpose_avx(t: Transpose) {
    use std::arch::x86_64::*;
    let (rows, cols, src, lds, dst, ldd) = (t.rows, t.cols, t.src.p, t.src.rs, t.dst, t.ldd);
    let (fr, fc) = (rows / 8 * 8, cols / 8 * 8);
    let mut i0 = 0;
    while i0 < fr {
        let mut j0 = 0;
        while j0 < fc {
            // SAFETY: rows i0..i0 + 8 and columns j0..j0 + 8 are in bounds.
            unsafe {
                let r = |i: usize| _mm256_loadu_ps(src.add((i0 + i) * lds + j0));
                let (r0, r1, r2, r3) = (r(0), r(1), r(2), r(3));
                let (r4, r5, r6, r7) = (r(4), r(5), r(6), r(7));
                let t0 = _mm256_unpacklo_ps(r0, r1);
                let t1 = _mm256_unpackhi_ps(r0, r1);
                let t2 = _mm256_unpacklo_ps(r2, r3);
                let t3 = _mm256_unpackhi_ps(r2, r3);
                let t4 = _mm256_unpacklo_ps(r4, r5);
                let t5 = _mm256_unpackhi_ps(r4, r5);
                let t6 = _mm256_unpacklo_ps(r6, r7);
                let t7 = _mm256_unpackhi_ps(r6, r7);
                let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
                let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
                let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
                let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
                let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
                let u5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
                let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
                let u7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
                let w = |j: usize, v: __m256| _mm256_storeu_ps(dst.add((j0 + j) * ldd + i0), v);
                w(0, _mm256_permute2f128_ps::<0x20>(u0, u4));
                w(1, _mm256_permute2f128_ps::<0x20>(u1, u5));
                w(2, _mm256_permute2f128_ps::<0x20>(u2, u6));
                w(3, _mm256_permute2f128_ps::<0x20>(u3, u7));
                w(4, _mm256_permute2f128_ps::<0x31>(u0, u4));
                w(5, _mm256_permute2f128_ps::<0x31>(u1, u5));
                w(6, _mm256_permute2f128_ps::<0x31>(u2, u6));
                w(7, _mm256_permute2f128_ps::<0x31>(u3, u7));
            }
            j0 += 8;
        }
        i0 += 8;
    }
    // The ragged right columns of the full rows, then the ragged bottom rows.
    unsafe {
        transpose_scalar(Transpose {
            rows: fr,
            ..t.part_from(0, fc)
        });
        transpose_scalar(t.part_from(fr, 0));
    }
}

/// Sizes `(m, n, k)` for the tests of [`gemm`] and of
/// [`crate::kernels::bf16::gemm`]: single rows and columns, a row tile and a
/// half, the 8-lane, 16- and 32-column panels with and without masked rests.
#[cfg(test)]
pub(crate) const TEST_SIZES: [(usize, usize, usize); 11] = [
    (1, 1, 1),
    (3, 2, 3),
    (3, 5, 2),
    (4, 16, 8),
    (5, 21, 40),
    (7, 33, 13),
    (8, 16, 2),
    (9, 8, 1),
    (9, 33, 64),
    (13, 127, 129),
    (96, 129, 128),
];

#[cfg(test)]
mod tests;
