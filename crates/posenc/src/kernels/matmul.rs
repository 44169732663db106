//! One dispatch for the products of linear layers, used by the lab's fused
//! ops and by the pretrained decoders: `C = α·C + A·B` with any strides, on
//! posenc's AVX-512 tiles ([`tile::gemm_blocked`]) for the products a
//! [`MatmulPolicy`] sends there, otherwise on the `gemm` crate (the GEMM
//! candle itself uses), on the threads the policy gives the size.

use super::{tile, SimdLevel};

/// Where a product runs: which sizes go to posenc's tiles, which to
/// several threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MatmulPolicy {
    /// The largest product (multiply-adds `m·n·k`) computed on posenc's
    /// AVX-512 tiles (at [`SimdLevel::Avx512`] only); 0: never.
    pub tile_max_macs: usize,
    /// Products of at least this many multiply-adds run on
    /// [`super::threads`] threads; smaller ones on the calling thread.
    pub parallel_macs: usize,
}

impl MatmulPolicy {
    /// The lab's small models: the tiles up to 2^20 multiply-adds (`cargo
    /// run --release -p posenc --example gemm_time`: on a Zen 4 EPYC, whose
    /// 512-bit FMAs have the throughput of two 256-bit ones, the tiles are
    /// as fast or faster up to about 2^20 and slower on the 2048-row
    /// products of a 4-layer d_model 128 step), threads from 2^20.
    pub const LAB: MatmulPolicy = MatmulPolicy {
        tile_max_macs: 1 << 20,
        parallel_macs: 1 << 20,
    };

    /// The pretrained decoders: the `gemm` crate for every product (their
    /// values are tested against transformers' with it), threads from 2^16
    /// multiply-adds.
    pub const DECODER: MatmulPolicy = MatmulPolicy {
        tile_max_macs: 0,
        parallel_macs: 1 << 16,
    };

    /// Whether an `m × n × k` product at `level` runs on posenc's AVX-512
    /// tiles (given row-major `C` and non-negative strides) rather than on
    /// the `gemm` crate.
    pub fn on_tiles(self, level: SimdLevel, m: usize, n: usize, k: usize) -> bool {
        level == SimdLevel::Avx512 && m * n * k <= self.tile_max_macs
    }

    /// The threads for a product of `work` multiply-adds.
    fn threads_for(self, work: usize) -> usize {
        if work >= self.parallel_macs {
            super::threads()
        } else {
            1
        }
    }
}

/// The `gemm` crate (0.19) sums at least 512 terms of the inner dimension
/// in registers before it touches `C` (`gemm-common`'s `kernel_params`
/// takes `kc = max(512, …)`, capped at `k`): up to this `k`, `C = A·B`
/// followed by `C += bias` rounds exactly as `C = bias; C += A·B`.
pub const GEMM_ONE_PASS_K: usize = 512;

/// `C (m×n) = α·C + A·B` (α = 1 when `accumulate`, else 0) with row and
/// column strides (any layout), as `policy` places it: posenc's tile
/// kernels at AVX-512, or the `gemm` crate (AVX2 + FMA, or AVX-512 where
/// it picks it), on the threads the size warrants.
///
/// # Panics
/// Not by itself; the slices must hold every element the strides address
/// (the callers size them from the same numbers).
#[allow(clippy::too_many_arguments)]
pub fn matmul(
    level: SimdLevel,
    policy: MatmulPolicy,
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
    let threads = policy.threads_for(m * n * k);
    if policy.on_tiles(level, m, n, k) && c_cs == 1 && c_rs >= 0 && a_rs >= 0 && a_cs >= 0 {
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
        let g = tile::Gemm::new(m, n, k)
            .a_strided(a.as_ptr(), a_rs as usize, a_cs as usize)
            .b(bp, ldb)
            .c(c.as_mut_ptr(), c_rs as usize, accumulate);
        // SAFETY: the callers pass slices holding every addressed element;
        // `packed` is k × n; the level is the one this CPU runs.
        unsafe { tile::gemm_blocked(SimdLevel::Avx512, g, threads) };
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

#[cfg(test)]
mod tests {
    use super::*;

    /// `C = A·B` (row-major `A` `m × k`, `B` given as `Bᵀ` `n × k`, as a
    /// linear layer's weight) in `f64`.
    fn naive(m: usize, n: usize, k: usize, a: &[f32], wt: &[f32]) -> Vec<f64> {
        let mut c = vec![0f64; m * n];
        for i in 0..m {
            for j in 0..n {
                c[i * n + j] = (0..k)
                    .map(|p| a[i * k + p] as f64 * wt[j * k + p] as f64)
                    .sum();
            }
        }
        c
    }

    /// Both policies, every level this CPU has, the edge sizes, `x·Wᵀ`
    /// strides, a dirty output buffer, with and without accumulation.
    #[test]
    fn every_policy_and_level_computes_the_product() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        };
        for level in SimdLevel::available() {
            for policy in [MatmulPolicy::LAB, MatmulPolicy::DECODER] {
                for (m, n, k) in [
                    (1, 1, 1),
                    (2, 3, 1),
                    (3, 2, 127),
                    (127, 129, 128),
                    (129, 128, 3),
                ] {
                    let a: Vec<f32> = (0..m * k).map(|_| next()).collect();
                    let wt: Vec<f32> = (0..n * k).map(|_| next()).collect();
                    let want = naive(m, n, k, &a, &wt);
                    for accumulate in [false, true] {
                        let start: Vec<f32> = (0..m * n).map(|_| next()).collect();
                        let mut c = start.clone();
                        matmul(
                            level,
                            policy,
                            m,
                            n,
                            k,
                            &mut c,
                            (n as isize, 1),
                            accumulate,
                            &a,
                            (k as isize, 1),
                            &wt,
                            (1, k as isize),
                        );
                        for (i, (&got, &w)) in c.iter().zip(&want).enumerate() {
                            let w = w + if accumulate { start[i] as f64 } else { 0.0 };
                            assert!(
                                (got as f64 - w).abs()
                                    <= 1e-4 * (1.0 + w.abs()) * (k as f64).sqrt(),
                                "{level} {policy:?} {m}×{n}×{k} acc {accumulate}: {got} vs {w}"
                            );
                        }
                    }
                }
            }
        }
    }
}
