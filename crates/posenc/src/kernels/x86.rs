//! x86-64 kernels: AVX-512F (16 lanes) and AVX2 + FMA + F16C (8 lanes).
//!
//! `f16` is widened and narrowed with the F16C / AVX-512F conversion
//! instructions (round to nearest even); `bf16` with 16-bit shifts, and
//! narrowed with the same round-to-nearest-even rule as `half::bf16::from_f32`
//! (NaN kept quiet). Arithmetic is `f32` with FMA.
//!
//! The AVX-512 intrinsics are stable since Rust 1.89: this module needs that
//! compiler even though the workspace still declares `rust-version = 1.85`.
#![allow(clippy::incompatible_msrv)]

use super::rope::{Angles, Element, Io, VecFn};
use crate::rope::PairLayout;

/// The kernels of one level, written once for both: `$features` is its
/// `target_feature` list, `$lanes` its `f32` lanes, `$tail` what finishes
/// the pairs past the last full register, `$Tail` the bound that tail
/// asks of the element type. The level's module names its intrinsics
/// without their width (`loadu_ps` for `_mm256_loadu_ps` or
/// `_mm512_loadu_ps`, `V` for its register) and supplies what differs in
/// more than the name: `F16_ROUNDING`, `pair_index`, `pair_signs`,
/// `dup_pairs` and `st_bf16_bits`.
macro_rules! level_kernels {
    ($features:literal, $lanes:literal, $tail:ident, $Tail:path) => {
        /// An activation type's loads (widened to `f32`) and stores
        /// (rounded to nearest even, NaN kept quiet) of one register.
        pub(crate) trait Lanes: $Tail {
            /// One register from `p`.
            unsafe fn ld(p: *const Self) -> V;
            /// `v` to `p`.
            unsafe fn st(p: *mut Self, v: V);
        }

        impl Lanes for f32 {
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn ld(p: *const f32) -> V {
                loadu_ps(p)
            }
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn st(p: *mut f32, v: V) {
                storeu_ps(p, v)
            }
        }

        impl Lanes for half::f16 {
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn ld(p: *const half::f16) -> V {
                cvtph_ps(loadu_half(p as *const HalfI))
            }
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn st(p: *mut half::f16, v: V) {
                storeu_half(p as *mut HalfI, cvtps_ph::<F16_ROUNDING>(v))
            }
        }

        impl Lanes for half::bf16 {
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn ld(p: *const half::bf16) -> V {
                let w = cvtepu16_epi32(loadu_half(p as *const HalfI));
                castsi_ps(slli_epi32::<16>(w))
            }
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn st(p: *mut half::bf16, v: V) {
                let b = castps_si(v);
                let hi = srli_epi32::<16>(b);
                let lsb = and_si(hi, set1_epi32(1));
                let r = srli_epi32::<16>(add_epi32(b, add_epi32(lsb, set1_epi32(0x7FFF))));
                let quiet = or_si(hi, set1_epi32(0x40));
                st_bf16_bits(p, v, r, quiet)
            }
        }

        /// This level's [`VecFn`]: pairs `from..nf` of one head vector,
        /// half-split or, with `INTERLEAVED`, interleaved; whole registers,
        /// then the tail.
        #[target_feature(enable = $features)]
        pub(crate) unsafe fn pairs_from<T: Lanes, const INTERLEAVED: bool>(
            v: Io<T>,
            row: Angles,
            nf: usize,
            from: usize,
            neg: bool,
        ) {
            let (src, dst, cos, sin) = (v.src, v.dst, row.cos, row.sin);
            let mut i = from;
            if INTERLEAVED {
                let idx = pair_index();
                let sgn = pair_signs(neg);
                while i + $lanes / 2 <= nf {
                    let c = dup_pairs(cos.add(i), idx);
                    let s = dup_pairs(sin.add(i), idx);
                    let s = castsi_ps(xor_si(castps_si(s), sgn));
                    let x = <T as Lanes>::ld(src.add(2 * i));
                    let xs = permute_ps::<0xB1>(x);
                    let y = fmadd_ps(x, c, mul_ps(xs, s));
                    <T as Lanes>::st(dst.add(2 * i), y);
                    i += $lanes / 2;
                }
            } else {
                let sgn = set1_epi32(if neg { i32::MIN } else { 0 });
                while i + $lanes <= nf {
                    let c = loadu_ps(cos.add(i));
                    let s = castsi_ps(xor_si(castps_si(loadu_ps(sin.add(i))), sgn));
                    let x0 = <T as Lanes>::ld(src.add(i));
                    let x1 = <T as Lanes>::ld(src.add(i + nf));
                    let y0 = fmsub_ps(x0, c, mul_ps(x1, s));
                    let y1 = fmadd_ps(x1, c, mul_ps(x0, s));
                    <T as Lanes>::st(dst.add(i), y0);
                    <T as Lanes>::st(dst.add(i + nf), y1);
                    i += $lanes;
                }
            }
            $tail::<T, INTERLEAVED>(v, row, nf, i, neg);
        }

        /// The per-vector kernel for `pairs`. Callers check the CPU first.
        pub(crate) fn select<T: Lanes>(pairs: PairLayout) -> VecFn<T> {
            match pairs {
                PairLayout::HalfSplit => pairs_from::<T, false>,
                PairLayout::Interleaved => pairs_from::<T, true>,
            }
        }
    };
}

/// AVX2 + FMA + F16C: 8 lanes; the scalar loop finishes a vector.
pub(crate) mod avx2 {
    use std::arch::x86_64::__m128i as HalfI;
    use std::arch::x86_64::__m256 as V;
    use std::arch::x86_64::__m256i as Vi;
    use std::arch::x86_64::_mm256_add_epi32 as add_epi32;
    use std::arch::x86_64::_mm256_and_si256 as and_si;
    use std::arch::x86_64::_mm256_castps_si256 as castps_si;
    use std::arch::x86_64::_mm256_castsi256_ps as castsi_ps;
    use std::arch::x86_64::_mm256_cvtepu16_epi32 as cvtepu16_epi32;
    use std::arch::x86_64::_mm256_cvtph_ps as cvtph_ps;
    use std::arch::x86_64::_mm256_cvtps_ph as cvtps_ph;
    use std::arch::x86_64::_mm256_fmadd_ps as fmadd_ps;
    use std::arch::x86_64::_mm256_fmsub_ps as fmsub_ps;
    use std::arch::x86_64::_mm256_loadu_ps as loadu_ps;
    use std::arch::x86_64::_mm256_mul_ps as mul_ps;
    use std::arch::x86_64::_mm256_or_si256 as or_si;
    use std::arch::x86_64::_mm256_permute_ps as permute_ps;
    use std::arch::x86_64::_mm256_set1_epi32 as set1_epi32;
    use std::arch::x86_64::_mm256_slli_epi32 as slli_epi32;
    use std::arch::x86_64::_mm256_srli_epi32 as srli_epi32;
    use std::arch::x86_64::_mm256_storeu_ps as storeu_ps;
    use std::arch::x86_64::_mm256_xor_si256 as xor_si;
    use std::arch::x86_64::_mm_loadu_si128 as loadu_half;
    use std::arch::x86_64::_mm_storeu_si128 as storeu_half;
    use std::arch::x86_64::*;

    use super::super::rope::scalar_pairs_from;
    use super::*;

    const F16_ROUNDING: i32 = _MM_FROUND_TO_NEAREST_INT;

    /// The lanes `dup_pairs` reads: `0, 0, 1, 1, …`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn pair_index() -> Vi {
        _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3)
    }

    /// The sign bits that turn interleaved `sin` into `(−s, s)` pairs
    /// (`(s, −s)` with `neg`).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn pair_signs(neg: bool) -> Vi {
        let m = i32::MIN;
        if neg {
            _mm256_setr_epi32(0, m, 0, m, 0, m, 0, m)
        } else {
            _mm256_setr_epi32(m, 0, m, 0, m, 0, m, 0)
        }
    }

    /// Four values from `p`, each twice.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dup_pairs(p: *const f32, idx: Vi) -> V {
        _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps(p)), idx)
    }

    /// Stores the rounded bf16 bits `r` (in the high halves' place), or
    /// `quiet` where `v` is NaN.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn st_bf16_bits(p: *mut half::bf16, v: V, r: Vi, quiet: Vi) {
        let nan = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_UNORD_Q>(v, v));
        let r = _mm256_blendv_epi8(r, quiet, nan);
        let packed = _mm256_packus_epi32(r, r);
        let packed = _mm256_permute4x64_epi64::<0b1000>(packed);
        _mm_storeu_si128(p as *mut __m128i, _mm256_castsi256_si128(packed));
    }

    level_kernels!("avx2,fma,f16c", 8, scalar_pairs_from, Element);
}

/// AVX-512F: 16 lanes; the AVX2 kernel finishes a vector.
pub(crate) mod avx512 {
    use std::arch::x86_64::__m256i as HalfI;
    use std::arch::x86_64::__m512 as V;
    use std::arch::x86_64::__m512i as Vi;
    use std::arch::x86_64::_mm256_loadu_si256 as loadu_half;
    use std::arch::x86_64::_mm256_storeu_si256 as storeu_half;
    use std::arch::x86_64::_mm512_add_epi32 as add_epi32;
    use std::arch::x86_64::_mm512_and_si512 as and_si;
    use std::arch::x86_64::_mm512_castps_si512 as castps_si;
    use std::arch::x86_64::_mm512_castsi512_ps as castsi_ps;
    use std::arch::x86_64::_mm512_cvtepu16_epi32 as cvtepu16_epi32;
    use std::arch::x86_64::_mm512_cvtph_ps as cvtph_ps;
    use std::arch::x86_64::_mm512_cvtps_ph as cvtps_ph;
    use std::arch::x86_64::_mm512_fmadd_ps as fmadd_ps;
    use std::arch::x86_64::_mm512_fmsub_ps as fmsub_ps;
    use std::arch::x86_64::_mm512_loadu_ps as loadu_ps;
    use std::arch::x86_64::_mm512_mul_ps as mul_ps;
    use std::arch::x86_64::_mm512_or_si512 as or_si;
    use std::arch::x86_64::_mm512_permute_ps as permute_ps;
    use std::arch::x86_64::_mm512_set1_epi32 as set1_epi32;
    use std::arch::x86_64::_mm512_slli_epi32 as slli_epi32;
    use std::arch::x86_64::_mm512_srli_epi32 as srli_epi32;
    use std::arch::x86_64::_mm512_storeu_ps as storeu_ps;
    use std::arch::x86_64::_mm512_xor_si512 as xor_si;
    use std::arch::x86_64::*;

    use super::avx2::pairs_from as avx2_pairs_from;
    use super::*;

    const F16_ROUNDING: i32 = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;

    /// The lanes `dup_pairs` reads: `0, 0, 1, 1, …`.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    unsafe fn pair_index() -> Vi {
        _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7)
    }

    /// The sign bits that turn interleaved `sin` into `(−s, s)` pairs
    /// (`(s, −s)` with `neg`).
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    unsafe fn pair_signs(neg: bool) -> Vi {
        let m = i32::MIN;
        if neg {
            _mm512_setr_epi32(0, m, 0, m, 0, m, 0, m, 0, m, 0, m, 0, m, 0, m)
        } else {
            _mm512_setr_epi32(m, 0, m, 0, m, 0, m, 0, m, 0, m, 0, m, 0, m, 0)
        }
    }

    /// Eight values from `p`, each twice.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    unsafe fn dup_pairs(p: *const f32, idx: Vi) -> V {
        _mm512_permutexvar_ps(idx, _mm512_castps256_ps512(_mm256_loadu_ps(p)))
    }

    /// Stores the rounded bf16 bits `r` (in the high halves' place), or
    /// `quiet` where `v` is NaN.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    unsafe fn st_bf16_bits(p: *mut half::bf16, v: V, r: Vi, quiet: Vi) {
        let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v, v);
        let r = _mm512_mask_blend_epi32(nan, r, quiet);
        _mm256_storeu_si256(p as *mut __m256i, _mm512_cvtepi32_epi16(r));
    }

    level_kernels!(
        "avx512f,avx2,fma,f16c",
        16,
        avx2_pairs_from,
        super::avx2::Lanes
    );
}
