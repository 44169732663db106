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

use std::arch::x86_64::*;

use super::rope::{scalar_pairs_from, VecFn};
use crate::rope::PairLayout;

// ---------------------------------------------------------------- loads/stores

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn ld8_f32(p: *const f32) -> __m256 {
    _mm256_loadu_ps(p)
}
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn st8_f32(p: *mut f32, v: __m256) {
    _mm256_storeu_ps(p, v)
}
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn ld8_f16(p: *const half::f16) -> __m256 {
    _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
}
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn st8_f16(p: *mut half::f16, v: __m256) {
    _mm_storeu_si128(
        p as *mut __m128i,
        _mm256_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT }>(v),
    )
}
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn ld8_bf16(p: *const half::bf16) -> __m256 {
    let w = _mm256_cvtepu16_epi32(_mm_loadu_si128(p as *const __m128i));
    _mm256_castsi256_ps(_mm256_slli_epi32::<16>(w))
}
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn st8_bf16(p: *mut half::bf16, v: __m256) {
    let b = _mm256_castps_si256(v);
    let hi = _mm256_srli_epi32::<16>(b);
    let lsb = _mm256_and_si256(hi, _mm256_set1_epi32(1));
    let r = _mm256_srli_epi32::<16>(_mm256_add_epi32(
        b,
        _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF)),
    ));
    let nan = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_UNORD_Q>(v, v));
    let quiet = _mm256_or_si256(hi, _mm256_set1_epi32(0x40));
    let r = _mm256_blendv_epi8(r, quiet, nan);
    let packed = _mm256_packus_epi32(r, r);
    let packed = _mm256_permute4x64_epi64::<0b1000>(packed);
    _mm_storeu_si128(p as *mut __m128i, _mm256_castsi256_si128(packed));
}

#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn ld16_f32(p: *const f32) -> __m512 {
    _mm512_loadu_ps(p)
}
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn st16_f32(p: *mut f32, v: __m512) {
    _mm512_storeu_ps(p, v)
}
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn ld16_f16(p: *const half::f16) -> __m512 {
    _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i))
}
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn st16_f16(p: *mut half::f16, v: __m512) {
    _mm256_storeu_si256(
        p as *mut __m256i,
        _mm512_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(v),
    )
}
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn ld16_bf16(p: *const half::bf16) -> __m512 {
    let w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(p as *const __m256i));
    _mm512_castsi512_ps(_mm512_slli_epi32::<16>(w))
}
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn st16_bf16(p: *mut half::bf16, v: __m512) {
    let b = _mm512_castps_si512(v);
    let hi = _mm512_srli_epi32::<16>(b);
    let lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
    let r = _mm512_srli_epi32::<16>(_mm512_add_epi32(
        b,
        _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF)),
    ));
    let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v, v);
    let quiet = _mm512_or_si512(hi, _mm512_set1_epi32(0x40));
    let r = _mm512_mask_blend_epi32(nan, r, quiet);
    _mm256_storeu_si256(p as *mut __m256i, _mm512_cvtepi32_epi16(r));
}

// ---------------------------------------------------------------- kernels

macro_rules! avx2_kernels {
    ($T:ty, $half_from:ident, $inter_from:ident, $half:ident, $inter:ident, $ld:ident, $st:ident) => {
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn $half_from(
            src: *const $T,
            dst: *mut $T,
            cos: *const f32,
            sin: *const f32,
            nf: usize,
            from: usize,
            neg: bool,
        ) {
            let sgn = _mm256_set1_epi32(if neg { i32::MIN } else { 0 });
            let mut i = from;
            while i + 8 <= nf {
                let c = _mm256_loadu_ps(cos.add(i));
                let s = _mm256_castsi256_ps(_mm256_xor_si256(
                    _mm256_castps_si256(_mm256_loadu_ps(sin.add(i))),
                    sgn,
                ));
                let x0 = $ld(src.add(i));
                let x1 = $ld(src.add(i + nf));
                let y0 = _mm256_fmsub_ps(x0, c, _mm256_mul_ps(x1, s));
                let y1 = _mm256_fmadd_ps(x1, c, _mm256_mul_ps(x0, s));
                $st(dst.add(i), y0);
                $st(dst.add(i + nf), y1);
                i += 8;
            }
            scalar_pairs_from::<$T, false>(src, dst, cos, sin, nf, i, neg);
        }

        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn $inter_from(
            src: *const $T,
            dst: *mut $T,
            cos: *const f32,
            sin: *const f32,
            nf: usize,
            from: usize,
            neg: bool,
        ) {
            let idx = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3);
            let m = i32::MIN;
            let sgn = if neg {
                _mm256_setr_epi32(0, m, 0, m, 0, m, 0, m)
            } else {
                _mm256_setr_epi32(m, 0, m, 0, m, 0, m, 0)
            };
            let mut i = from;
            while i + 4 <= nf {
                let c =
                    _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps(cos.add(i))), idx);
                let s =
                    _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps(sin.add(i))), idx);
                let s = _mm256_castsi256_ps(_mm256_xor_si256(_mm256_castps_si256(s), sgn));
                let x = $ld(src.add(2 * i));
                let xs = _mm256_permute_ps::<0xB1>(x);
                let y = _mm256_fmadd_ps(x, c, _mm256_mul_ps(xs, s));
                $st(dst.add(2 * i), y);
                i += 4;
            }
            scalar_pairs_from::<$T, true>(src, dst, cos, sin, nf, i, neg);
        }

        unsafe fn $half(
            src: *const $T,
            dst: *mut $T,
            cos: *const f32,
            sin: *const f32,
            nf: usize,
            neg: bool,
        ) {
            $half_from(src, dst, cos, sin, nf, 0, neg)
        }

        unsafe fn $inter(
            src: *const $T,
            dst: *mut $T,
            cos: *const f32,
            sin: *const f32,
            nf: usize,
            neg: bool,
        ) {
            $inter_from(src, dst, cos, sin, nf, 0, neg)
        }
    };
}

macro_rules! avx512_kernels {
    ($T:ty, $half:ident, $inter:ident, $ld:ident, $st:ident, $tail_half:ident, $tail_inter:ident) => {
        #[target_feature(enable = "avx512f,avx2,fma,f16c")]
        unsafe fn $half(
            src: *const $T,
            dst: *mut $T,
            cos: *const f32,
            sin: *const f32,
            nf: usize,
            neg: bool,
        ) {
            let sgn = _mm512_set1_epi32(if neg { i32::MIN } else { 0 });
            let mut i = 0;
            while i + 16 <= nf {
                let c = _mm512_loadu_ps(cos.add(i));
                let s = _mm512_castsi512_ps(_mm512_xor_si512(
                    _mm512_castps_si512(_mm512_loadu_ps(sin.add(i))),
                    sgn,
                ));
                let x0 = $ld(src.add(i));
                let x1 = $ld(src.add(i + nf));
                let y0 = _mm512_fmsub_ps(x0, c, _mm512_mul_ps(x1, s));
                let y1 = _mm512_fmadd_ps(x1, c, _mm512_mul_ps(x0, s));
                $st(dst.add(i), y0);
                $st(dst.add(i + nf), y1);
                i += 16;
            }
            $tail_half(src, dst, cos, sin, nf, i, neg);
        }

        #[target_feature(enable = "avx512f,avx2,fma,f16c")]
        unsafe fn $inter(
            src: *const $T,
            dst: *mut $T,
            cos: *const f32,
            sin: *const f32,
            nf: usize,
            neg: bool,
        ) {
            let idx = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
            let m = i32::MIN;
            let sgn = if neg {
                _mm512_setr_epi32(0, m, 0, m, 0, m, 0, m, 0, m, 0, m, 0, m, 0, m)
            } else {
                _mm512_setr_epi32(m, 0, m, 0, m, 0, m, 0, m, 0, m, 0, m, 0, m, 0)
            };
            let mut i = 0;
            while i + 8 <= nf {
                let c =
                    _mm512_permutexvar_ps(idx, _mm512_castps256_ps512(_mm256_loadu_ps(cos.add(i))));
                let s =
                    _mm512_permutexvar_ps(idx, _mm512_castps256_ps512(_mm256_loadu_ps(sin.add(i))));
                let s = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(s), sgn));
                let x = $ld(src.add(2 * i));
                let xs = _mm512_permute_ps::<0xB1>(x);
                let y = _mm512_fmadd_ps(x, c, _mm512_mul_ps(xs, s));
                $st(dst.add(2 * i), y);
                i += 8;
            }
            $tail_inter(src, dst, cos, sin, nf, i, neg);
        }
    };
}

avx2_kernels!(
    f32,
    avx2_half_from_f32,
    avx2_inter_from_f32,
    avx2_half_f32,
    avx2_inter_f32,
    ld8_f32,
    st8_f32
);
avx2_kernels!(
    half::f16,
    avx2_half_from_f16,
    avx2_inter_from_f16,
    avx2_half_f16,
    avx2_inter_f16,
    ld8_f16,
    st8_f16
);
avx2_kernels!(
    half::bf16,
    avx2_half_from_bf16,
    avx2_inter_from_bf16,
    avx2_half_bf16,
    avx2_inter_bf16,
    ld8_bf16,
    st8_bf16
);

avx512_kernels!(
    f32,
    avx512_half_f32,
    avx512_inter_f32,
    ld16_f32,
    st16_f32,
    avx2_half_from_f32,
    avx2_inter_from_f32
);
avx512_kernels!(
    half::f16,
    avx512_half_f16,
    avx512_inter_f16,
    ld16_f16,
    st16_f16,
    avx2_half_from_f16,
    avx2_inter_from_f16
);
avx512_kernels!(
    half::bf16,
    avx512_half_bf16,
    avx512_inter_bf16,
    ld16_bf16,
    st16_bf16,
    avx2_half_from_bf16,
    avx2_inter_from_bf16
);

macro_rules! selector {
    ($name:ident, $T:ty, $half:ident, $inter:ident) => {
        /// The per-vector kernel for `pairs`. Callers check the CPU first.
        pub(crate) fn $name(pairs: PairLayout) -> VecFn<$T> {
            match pairs {
                PairLayout::HalfSplit => $half,
                PairLayout::Interleaved => $inter,
            }
        }
    };
}

selector!(avx2_f32, f32, avx2_half_f32, avx2_inter_f32);
selector!(avx2_f16, half::f16, avx2_half_f16, avx2_inter_f16);
selector!(avx2_bf16, half::bf16, avx2_half_bf16, avx2_inter_bf16);
selector!(avx512_f32, f32, avx512_half_f32, avx512_inter_f32);
selector!(avx512_f16, half::f16, avx512_half_f16, avx512_inter_f16);
selector!(avx512_bf16, half::bf16, avx512_half_bf16, avx512_inter_bf16);
