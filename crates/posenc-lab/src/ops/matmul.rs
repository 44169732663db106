//! The products of the lab's linear layers: posenc's AVX-512 tiles for the
//! small ones, the `gemm` crate (the GEMM candle itself uses) for the
//! others, on the threads the size warrants.

use posenc::kernels::{tile, SimdLevel};

/// Multiply-adds below which a product stays on one thread.
const PARALLEL_MACS: usize = 1 << 20;

/// The threads for a product of `work` multiply-adds.
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
pub(super) fn on_tiles(level: SimdLevel, m: usize, n: usize, k: usize) -> bool {
    level == SimdLevel::Avx512 && m * n * k <= TILE_MAX_MACS
}

/// The `gemm` crate (0.19) sums at least 512 terms of the inner dimension
/// in registers before it touches `C` (`gemm-common`'s `kernel_params`
/// takes `kc = max(512, …)`, capped at `k`): up to this `k`, `C = A·B`
/// followed by `C += bias` rounds exactly as `C = bias; C += A·B`.
pub(super) const GEMM_ONE_PASS_K: usize = 512;

/// `C (m×n) = α·C + A·B` with row and column strides (any layout), on
/// the threads the size warrants: posenc's tile kernels at AVX-512 for
/// products up to [`TILE_MAX_MACS`], the `gemm` crate (AVX2 + FMA) otherwise.
#[allow(clippy::too_many_arguments)]
pub(super) fn matmul(
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
