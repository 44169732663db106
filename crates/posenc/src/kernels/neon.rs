//! aarch64 NEON kernels (4 lanes of `f32`) for `f32` and `bf16`; `bf16` is
//! widened with a long shift and narrowed with round-to-nearest-even (NaN
//! kept quiet), as `half::bf16::from_f32`. `f16` uses the scalar loop.

use std::arch::aarch64::*;

use super::rope::{scalar_pairs_from, VecFn};
use crate::rope::PairLayout;

#[inline(always)]
unsafe fn ld4_f32(p: *const f32) -> float32x4_t {
    vld1q_f32(p)
}
#[inline(always)]
unsafe fn st4_f32(p: *mut f32, v: float32x4_t) {
    vst1q_f32(p, v)
}
#[inline(always)]
unsafe fn ld4_bf16(p: *const half::bf16) -> float32x4_t {
    vreinterpretq_f32_u32(vshll_n_u16::<16>(vld1_u16(p as *const u16)))
}
#[inline(always)]
unsafe fn st4_bf16(p: *mut half::bf16, v: float32x4_t) {
    let b = vreinterpretq_u32_f32(v);
    let hi = vshrq_n_u32::<16>(b);
    let lsb = vandq_u32(hi, vdupq_n_u32(1));
    let r = vshrq_n_u32::<16>(vaddq_u32(b, vaddq_u32(lsb, vdupq_n_u32(0x7FFF))));
    let is_num = vceqq_f32(v, v);
    let quiet = vorrq_u32(hi, vdupq_n_u32(0x40));
    vst1_u16(p as *mut u16, vmovn_u32(vbslq_u32(is_num, r, quiet)));
}

macro_rules! neon_kernels {
    ($T:ty, $half:ident, $inter:ident, $ld:ident, $st:ident) => {
        unsafe fn $half(
            src: *const $T,
            dst: *mut $T,
            cos: *const f32,
            sin: *const f32,
            nf: usize,
            neg: bool,
        ) {
            let mut i = 0;
            while i + 4 <= nf {
                let c = vld1q_f32(cos.add(i));
                let mut s = vld1q_f32(sin.add(i));
                if neg {
                    s = vnegq_f32(s);
                }
                let x0 = $ld(src.add(i));
                let x1 = $ld(src.add(i + nf));
                let y0 = vfmsq_f32(vmulq_f32(x0, c), x1, s);
                let y1 = vfmaq_f32(vmulq_f32(x1, c), x0, s);
                $st(dst.add(i), y0);
                $st(dst.add(i + nf), y1);
                i += 4;
            }
            scalar_pairs_from::<$T, false>(src, dst, cos, sin, nf, i, neg);
        }

        unsafe fn $inter(
            src: *const $T,
            dst: *mut $T,
            cos: *const f32,
            sin: *const f32,
            nf: usize,
            neg: bool,
        ) {
            let signs: [f32; 4] = if neg {
                [1.0, -1.0, 1.0, -1.0]
            } else {
                [-1.0, 1.0, -1.0, 1.0]
            };
            let sgn = vld1q_f32(signs.as_ptr());
            let mut i = 0;
            while i + 2 <= nf {
                let c2 = vld1_f32(cos.add(i));
                let s2 = vld1_f32(sin.add(i));
                let cc = vcombine_f32(c2, c2);
                let ss = vcombine_f32(s2, s2);
                let c = vzip1q_f32(cc, cc);
                let s = vmulq_f32(vzip1q_f32(ss, ss), sgn);
                let x = $ld(src.add(2 * i));
                let xs = vrev64q_f32(x);
                let y = vfmaq_f32(vmulq_f32(x, c), xs, s);
                $st(dst.add(2 * i), y);
                i += 2;
            }
            scalar_pairs_from::<$T, true>(src, dst, cos, sin, nf, i, neg);
        }
    };
}

neon_kernels!(f32, neon_half_f32, neon_inter_f32, ld4_f32, st4_f32);
neon_kernels!(
    half::bf16,
    neon_half_bf16,
    neon_inter_bf16,
    ld4_bf16,
    st4_bf16
);

/// The per-vector `f32` kernel for `pairs`.
pub(crate) fn neon_f32(pairs: PairLayout) -> VecFn<f32> {
    match pairs {
        PairLayout::HalfSplit => neon_half_f32,
        PairLayout::Interleaved => neon_inter_f32,
    }
}

/// The per-vector `bf16` kernel for `pairs`.
pub(crate) fn neon_bf16(pairs: PairLayout) -> VecFn<half::bf16> {
    match pairs {
        PairLayout::HalfSplit => neon_half_bf16,
        PairLayout::Interleaved => neon_inter_bf16,
    }
}
