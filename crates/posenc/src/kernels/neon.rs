//! aarch64 NEON kernels (4 lanes of `f32`) for `f32` and `bf16`; `bf16` is
//! widened with a long shift and narrowed with round-to-nearest-even (NaN
//! kept quiet), as `half::bf16::from_f32`. `f16` uses the scalar loop.

use std::arch::aarch64::*;

use super::rope::{scalar_pairs_from, Angles, Element, Io, VecFn};
use crate::rope::PairLayout;

/// An activation type's loads (widened to `f32`) and stores (rounded to
/// nearest even, NaN kept quiet) of four lanes.
pub(crate) trait Lanes: Element {
    /// Four lanes from `p`.
    unsafe fn ld(p: *const Self) -> float32x4_t;
    /// `v` to `p`.
    unsafe fn st(p: *mut Self, v: float32x4_t);
}

impl Lanes for f32 {
    #[inline(always)]
    unsafe fn ld(p: *const f32) -> float32x4_t {
        vld1q_f32(p)
    }
    #[inline(always)]
    unsafe fn st(p: *mut f32, v: float32x4_t) {
        vst1q_f32(p, v)
    }
}

impl Lanes for half::bf16 {
    #[inline(always)]
    unsafe fn ld(p: *const half::bf16) -> float32x4_t {
        vreinterpretq_f32_u32(vshll_n_u16::<16>(vld1_u16(p as *const u16)))
    }
    #[inline(always)]
    unsafe fn st(p: *mut half::bf16, v: float32x4_t) {
        let b = vreinterpretq_u32_f32(v);
        let hi = vshrq_n_u32::<16>(b);
        let lsb = vandq_u32(hi, vdupq_n_u32(1));
        let r = vshrq_n_u32::<16>(vaddq_u32(b, vaddq_u32(lsb, vdupq_n_u32(0x7FFF))));
        let is_num = vceqq_f32(v, v);
        let quiet = vorrq_u32(hi, vdupq_n_u32(0x40));
        vst1_u16(p as *mut u16, vmovn_u32(vbslq_u32(is_num, r, quiet)));
    }
}

/// The half-split [`VecFn`].
unsafe fn half_from<T: Lanes>(v: Io<T>, row: Angles, nf: usize, from: usize, neg: bool) {
    let (src, dst, cos, sin) = (v.src, v.dst, row.cos, row.sin);
    let mut i = from;
    while i + 4 <= nf {
        let c = vld1q_f32(cos.add(i));
        let mut s = vld1q_f32(sin.add(i));
        if neg {
            s = vnegq_f32(s);
        }
        let x0 = T::ld(src.add(i));
        let x1 = T::ld(src.add(i + nf));
        let y0 = vfmsq_f32(vmulq_f32(x0, c), x1, s);
        let y1 = vfmaq_f32(vmulq_f32(x1, c), x0, s);
        T::st(dst.add(i), y0);
        T::st(dst.add(i + nf), y1);
        i += 4;
    }
    scalar_pairs_from::<T, false>(v, row, nf, i, neg);
}

/// The interleaved [`VecFn`].
unsafe fn inter_from<T: Lanes>(v: Io<T>, row: Angles, nf: usize, from: usize, neg: bool) {
    let (src, dst, cos, sin) = (v.src, v.dst, row.cos, row.sin);
    let signs: [f32; 4] = if neg {
        [1.0, -1.0, 1.0, -1.0]
    } else {
        [-1.0, 1.0, -1.0, 1.0]
    };
    let sgn = vld1q_f32(signs.as_ptr());
    let mut i = from;
    while i + 2 <= nf {
        let c2 = vld1_f32(cos.add(i));
        let s2 = vld1_f32(sin.add(i));
        let cc = vcombine_f32(c2, c2);
        let ss = vcombine_f32(s2, s2);
        let c = vzip1q_f32(cc, cc);
        let s = vmulq_f32(vzip1q_f32(ss, ss), sgn);
        let x = T::ld(src.add(2 * i));
        let xs = vrev64q_f32(x);
        let y = vfmaq_f32(vmulq_f32(x, c), xs, s);
        T::st(dst.add(2 * i), y);
        i += 2;
    }
    scalar_pairs_from::<T, true>(v, row, nf, i, neg);
}

/// The per-vector kernel for `pairs` (`f32` and `bf16`; `f16` is scalar).
pub(crate) fn select<T: Lanes>(pairs: PairLayout) -> VecFn<T> {
    match pairs {
        PairLayout::HalfSplit => half_from::<T>,
        PairLayout::Interleaved => inter_from::<T>,
    }
}
