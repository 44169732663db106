//! Products in bfloat16 for the attention's long-sequence forward tiles
//! ([`super::attention::Products::Bf16`]): operands rounded to bfloat16
//! (8 significant bits, round to nearest even), products accumulated in
//! `f32` by AVX512_BF16's `VDPBF16PS`, which does two multiply-adds per
//! `f32` lane per instruction: twice the `f32` FMA rate on CPUs that have it
//! (230–233 GFLOP/s per core on a Zen 4 EPYC against 116–117,
//! `scripts/bench/fma_peak.c` built with AVX512_BF16).
//!
//! Operands are stored as `u32` pairs: element `(i, p)` of a pair matrix
//! holds the bfloat16 values of entries `2p` (low half) and `2p + 1` (high
//! half) of row `i` along the summed axis, which is what converting a
//! contiguous `f32` row gives. [`gemm()`] is tested against the same sums in
//! `f64` over the rounded values.

#[cfg(target_arch = "x86_64")]
use super::tile::x86_512::{lanes, load_c, panels, store_c, Panel, RowTiles};
#[cfg(target_arch = "x86_64")]
use super::tile::Gemm;

/// `x` rounded to bfloat16 (nearest, ties to even), as its 16 bits.
#[inline(always)]
pub fn to_bf16(x: f32) -> u16 {
    let b = x.to_bits();
    if x.is_nan() {
        return ((b >> 16) | 0x40) as u16;
    }
    (b.wrapping_add(0x7FFF + ((b >> 16) & 1)) >> 16) as u16
}

/// The `f32` value of bfloat16 bits.
#[inline(always)]
pub fn from_bf16(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// Packs `x` (any length) into `dst` as pairs: `dst[p]` holds `x[2p]` low
/// and `x[2p + 1]` high, a missing last partner as zero. `dst` must hold
/// `x.len().div_ceil(2)` pairs; the rest of it is left alone.
#[inline(always)]
pub fn pack_pairs(x: &[f32], dst: &mut [u32]) {
    let full = x.len() / 2;
    for (d, xy) in dst[..full].iter_mut().zip(x.chunks_exact(2)) {
        *d = to_bf16(xy[0]) as u32 | (to_bf16(xy[1]) as u32) << 16;
    }
    if x.len() % 2 == 1 {
        dst[full] = to_bf16(x[x.len() - 1]) as u32;
    }
}

/// Whether this CPU runs [`gemm()`] (AVX-512 F and AVX512_BF16).
pub fn supported() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bf16")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `C[m×n] (+)= A·B` over `g.k` pairs: `C[i][j] = Σ_p a_lo·b_lo + a_hi·b_hi`
/// with `A[i][p] = a[i·lda + p]` (row-major: `g.a.cs = 1`, as
/// [`Gemm::a`] sets it), `B[p][j] = b[p·ldb + j]` (pairs),
/// `accumulate = false` overwrites `C`. Register tiles of 8 rows × 32 (or
/// 16, or a masked rest) columns, as `tile::gemm`'s `f32` ones.
///
/// # Safety
/// [`supported`] must be true; the pointers must address every element
/// (`a[(m−1)·lda + k − 1]`, `b[(k−1)·ldb + n − 1]`, `c[(m−1)·ldc + n − 1]`
/// for non-empty sizes).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
pub unsafe fn gemm(g: Gemm<u32>) {
    debug_assert_eq!(g.a.cs, 1, "bf16::gemm reads A row-major");
    panels(g);
}

/// One register tile: rows `i..i + R` of `C`, `W` registers of columns.
#[cfg(target_arch = "x86_64")]
impl<const W: usize> RowTiles for Panel<u32, W> {
    #[inline(always)]
    unsafe fn tile<const R: usize>(self, i: usize) {
        use std::arch::x86_64::*;
        let Panel { g, mask } = self;
        let (a, lda) = (g.a.p, g.a.rs);
        let (b, ldb) = (g.b, g.ldb);
        // C from row i on.
        let (c, ldc) = (g.c.add(i * g.ldc), g.ldc);
        let mut acc = load_c::<R, W>(c, ldc, g.accumulate, mask);
        for p in 0..g.k {
            let bp = b.add(p * ldb);
            let mut bv = [_mm512_setzero_si512(); W];
            for (w, v) in bv.iter_mut().enumerate() {
                *v = _mm512_maskz_loadu_epi32(lanes::<W>(w, mask), bp.add(16 * w) as *const i32);
            }
            for (r, row) in acc.iter_mut().enumerate() {
                let av: __m512bh =
                    std::mem::transmute(_mm512_set1_epi32(*a.add((i + r) * lda + p) as i32));
                for (w, v) in row.iter_mut().enumerate() {
                    *v = _mm512_dpbf16_ps(*v, av, std::mem::transmute::<__m512i, __m512bh>(bv[w]));
                }
            }
        }
        store_c(&acc, c, ldc, mask);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_is_to_nearest_even() {
        assert_eq!(to_bf16(1.0), 0x3F80);
        // One step above 1 is 2^-7 = 4/512.
        assert_eq!(from_bf16(to_bf16(1.0 + 1.9 / 512.0)), 1.0);
        assert_eq!(from_bf16(to_bf16(1.0 + 2.1 / 512.0)), 1.0 + 4.0 / 512.0);
        // Ties go to the even neighbour.
        assert_eq!(from_bf16(to_bf16(1.0 + 2.0 / 512.0)), 1.0);
        assert_eq!(from_bf16(to_bf16(1.0 + 6.0 / 512.0)), 1.0 + 8.0 / 512.0);
        assert_eq!(from_bf16(to_bf16(-2.5)), -2.5);
        assert!(from_bf16(to_bf16(f32::NAN)).is_nan());
        assert_eq!(from_bf16(to_bf16(f32::INFINITY)), f32::INFINITY);
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn gemm_matches_f64_sums_of_the_rounded_operands() {
        if !supported() {
            eprintln!("skipped: no AVX512_BF16 on this CPU");
            return;
        }
        let mut s = 1u64;
        let mut rnd = || {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) - 0.5
        };
        for &(m, n, k) in &crate::kernels::tile::TEST_SIZES {
            let kp = k / 2 + k % 2;
            let a: Vec<f32> = (0..m * k).map(|_| rnd()).collect();
            let bt: Vec<f32> = (0..n * k).map(|_| rnd()).collect(); // B transposed: n rows of k
            let mut ap = vec![0u32; m * kp];
            for i in 0..m {
                pack_pairs(&a[i * k..][..k], &mut ap[i * kp..][..kp]);
            }
            // B pairs: row p, column j.
            let mut bp = vec![0u32; kp * n];
            let mut col = vec![0u32; kp];
            for j in 0..n {
                pack_pairs(&bt[j * k..][..k], &mut col);
                for p in 0..kp {
                    bp[p * n + j] = col[p];
                }
            }
            for accumulate in [false, true] {
                let mut c = vec![0.25f32; m * n];
                let g = Gemm::new(m, n, kp).a(ap.as_ptr(), kp).b(bp.as_ptr(), n);
                unsafe { gemm(g.c(c.as_mut_ptr(), n, accumulate)) };
                for i in 0..m {
                    for j in 0..n {
                        let exact: f64 = (0..k)
                            .map(|p| {
                                from_bf16(to_bf16(a[i * k + p])) as f64
                                    * from_bf16(to_bf16(bt[j * k + p])) as f64
                            })
                            .sum::<f64>()
                            + if accumulate { 0.25 } else { 0.0 };
                        let got = c[i * n + j] as f64;
                        assert!(
                            (got - exact).abs() <= 1e-5 * (1.0 + exact.abs()) * (k as f64).sqrt(),
                            "{m}×{n}×{k} ({i}, {j}): {got} against {exact}"
                        );
                    }
                }
            }
        }
    }
}
