//! Row-parallel helpers of the fused ops, each in a fixed order: rows
//! split over rayon's threads only when the buffer is large, and column
//! sums reduced over fixed chunks of rows added in order, so results do
//! not depend on the number of threads.

use posenc::kernels::{tile, SimdLevel};
use rayon::prelude::*;

/// Rows per chunk of the fixed-order parameter-gradient reductions.
pub(super) const CHUNK: usize = 64;
/// Elements below which an op stays on the calling thread.
const PARALLEL_ELEMS: usize = 1 << 15;

/// Whether a buffer of `len` elements is split over the threads.
pub(super) fn parallel(len: usize) -> bool {
    len >= PARALLEL_ELEMS && posenc::kernels::threads() > 1
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
posenc::multiversion!(pub(super) fn add_rows => add_rows_body(x: &[f32], acc: &mut [f32]) -> ());

/// `Σ_rows x[r, c]` for a row-major `(rows, cols)` buffer, over fixed chunks
/// of rows added in order.
pub(super) fn column_sums(x: &[f32], rows: usize, cols: usize) -> Vec<f32> {
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
pub(super) fn add_parts(parts: Vec<Vec<f32>>, cols: usize) -> Vec<f32> {
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
pub(super) fn for_rows(out: &mut [f32], width: usize, f: impl Fn(usize, &mut [f32]) + Sync + Send) {
    if parallel(out.len()) {
        out.par_chunks_mut(width)
            .enumerate()
            .for_each(|(r, row)| f(r, row));
    } else {
        out.chunks_mut(width)
            .enumerate()
            .for_each(|(r, row)| f(r, row));
    }
}

/// Splits `a` into chunks of `wa` elements and `b` into chunks of `wb`, and
/// runs `f(chunk index, chunk of a, chunk of b)` on each pair, on several
/// threads when `a` is large.
pub(super) fn for_chunk_pairs<A: Send, B: Send>(
    (a, wa): (&mut [A], usize),
    (b, wb): (&mut [B], usize),
    f: impl Fn(usize, &mut [A], &mut [B]) + Sync + Send,
) {
    if parallel(a.len()) {
        a.par_chunks_mut(wa)
            .zip(b.par_chunks_mut(wb))
            .enumerate()
            .for_each(|(i, (x, y))| f(i, x, y));
    } else {
        a.chunks_mut(wa)
            .zip(b.chunks_mut(wb))
            .enumerate()
            .for_each(|(i, (x, y))| f(i, x, y));
    }
}

/// `y += x` element by element, on several threads when large (IEEE
/// addition commutes, so this is candle's `x + y` bit for bit).
pub(super) fn add_into(y: &mut [f32], x: &[f32]) {
    for_rows(y, 4096, |r, yr| {
        for (o, v) in yr.iter_mut().zip(&x[r * 4096..]) {
            *o += v;
        }
    });
}

/// A norm's backward pass on the input `xv` and the output's gradient
/// `dyv`, over blocks of [`CHUNK`] rows of width `d`: `f(block, x, dy, dx,
/// prod)` fills the block's input gradient and the products `dy·x̂` from
/// the block's rows of `xv` and `dyv` (block `b` covers rows `b·CHUNK ..`);
/// returns `dx` and the column sums of the products (the weight's
/// gradient).
pub(super) fn norm_backward(
    xv: &[f32],
    dyv: &[f32],
    d: usize,
    f: impl Fn(usize, &[f32], &[f32], &mut [f32], &mut [f32]) + Sync + Send,
) -> (Vec<f32>, Vec<f32>) {
    let len = xv.len();
    // SAFETY: `f` writes every element of each block of dx and prod.
    let mut dx = unsafe { tile::vec_for_overwrite(len) };
    let mut prod = unsafe { tile::vec_for_overwrite(len) };
    let block = CHUNK * d;
    for_chunk_pairs((&mut dx, block), (&mut prod, block), |bi, dxr, pr| {
        let n = dxr.len();
        f(bi, &xv[bi * block..][..n], &dyv[bi * block..][..n], dxr, pr)
    });
    let dw = column_sums(&prod, len / d, d);
    (dx, dw)
}
