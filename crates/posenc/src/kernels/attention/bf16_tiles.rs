//! The forward pass's long tiles with bfloat16 products ([`Products::Bf16`],
//! AVX-512 BF16 only): keys and values rounded to bfloat16 pairs once per
//! head, the softmax in `f32`.

use rayon::prelude::*;

use super::*;

/// Whether the forward pass runs its long tiles' products in bfloat16.
#[cfg(target_arch = "x86_64")]
pub(super) fn bf16_forward(p: &Problem, level: SimdLevel) -> bool {
    p.products == Products::Bf16
        && p.dims.k_len > LONG_KEYS
        && level == SimdLevel::Avx512
        && p.vector.is_none()
        && p.dims.head_dim > 0
        && crate::kernels::bf16::supported()
}

/// The forward pass with [`Products::Bf16`]: keys (rotated) and values of
/// every `(b, h_k)` rounded to bfloat16 pairs once, then tasks of
/// [`BQ_LONG`] queries as in [`forward_task`], the softmax in `f32`.
#[cfg(target_arch = "x86_64")]
pub(super) fn forward_bf16(
    p: &Problem,
    out: &mut [f32],
    out_rows: Rows,
    lse: &mut [f32],
    parts: Option<Parts>,
    level: SimdLevel,
) {
    let dm = p.dims;
    let (d, bk) = (dm.head_dim, BK_LONG);
    let n_tiles = dm.k_len.div_ceil(bk);
    let per_k = d.div_ceil(2) * bk * n_tiles;
    let per_v = bk / 2 * d * n_tiles;
    let mut kp = vec![0u32; dm.batch * dm.kv_heads * per_k];
    let mut vp = vec![0u32; dm.batch * dm.kv_heads * per_v];
    let parallel = p.work() >= PARALLEL_WORK && crate::kernels::threads() > 1;
    let pack = |(task, (kd, vd)): (usize, (&mut [u32], &mut [u32]))| {
        pack_bf16_dispatch(level, p, task / dm.kv_heads, task % dm.kv_heads, kd, vd)
    };
    if parallel {
        kp.par_chunks_mut(per_k)
            .zip(vp.par_chunks_mut(per_v))
            .enumerate()
            .for_each(pack);
    } else {
        kp.chunks_mut(per_k)
            .zip(vp.chunks_mut(per_v))
            .enumerate()
            .for_each(pack);
    }
    let q_tiles = dm.q_len.div_ceil(BQ_LONG);
    let out_ptr = SendPtr(out.as_mut_ptr());
    let lse_ptr = SendPtr(lse.as_mut_ptr());
    let (kp, vp) = (&kp[..], &vp[..]);
    run_in_turn(dm.batch * dm.q_heads, q_tiles, parallel, |task| {
        let (out_ptr, lse_ptr) = (out_ptr, lse_ptr);
        let hk = (task / q_tiles) % dm.q_heads / p.group();
        let bh = task / (q_tiles * dm.q_heads) * dm.kv_heads + hk;
        forward_bf16_dispatch(
            level,
            p,
            task,
            q_tiles,
            &kp[bh * per_k..][..per_k],
            &vp[bh * per_v..][..per_v],
            out_ptr,
            out_rows,
            lse_ptr,
            parts,
        )
    });
}

#[cfg(target_arch = "x86_64")]
crate::multiversion!(fn pack_bf16_dispatch => pack_bf16(
    p: &Problem, b: usize, hk: usize, kd: &mut [u32], vd: &mut [u32]) -> ());

#[cfg(target_arch = "x86_64")]
crate::multiversion!(fn forward_bf16_dispatch => forward_task_bf16(
    p: &Problem, task: usize, q_tiles: usize, kp: &[u32], vp: &[u32], out: SendPtr, out_rows: Rows,
    lse: SendPtr, parts: Option<Parts>) -> ());

/// Packs the keys of `(b, hk)`, rotated, into `kd` (per tile of
/// [`BK_LONG`] keys, `(⌈D/2⌉, BK_LONG)` pairs along the head dimension) and
/// its values into `vd` (per tile, `(BK_LONG/2, D)` pairs along the keys);
/// both zeroed by the caller.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn pack_bf16(p: &Problem, b: usize, hk: usize, kd: &mut [u32], vd: &mut [u32]) {
    use crate::kernels::bf16::{pack_pairs, to_bf16};
    let d = p.dims.head_dim;
    let (dp, bk) = (d.div_ceil(2), BK_LONG);
    let mut row = vec![0f32; d];
    let mut pairs = vec![0u32; dp];
    for t in 0..p.dims.k_len {
        let (jt, j) = (t / bk, t % bk);
        load_k(p, b, hk, t, &mut row);
        pack_pairs(&row, &mut pairs);
        let blk = &mut kd[jt * dp * bk..][..dp * bk];
        for (q, v) in pairs.iter().enumerate() {
            blk[q * bk + j] = *v;
        }
        let v = &p.v[p.v_rows.at(b, hk, t)..][..d];
        let shift = if j % 2 == 0 { 0 } else { 16 };
        let vrow = &mut vd[(jt * (bk / 2) + j / 2) * d..][..d];
        for (o, x) in vrow.iter_mut().zip(v) {
            *o |= (to_bf16(*x) as u32) << shift;
        }
    }
}

/// [`forward_task`] with the products in bfloat16 (keys and values packed
/// by [`pack_bf16`] for this task's `(b, h_k)`).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn forward_task_bf16(
    p: &Problem,
    task: usize,
    q_tiles: usize,
    kp: &[u32],
    vp: &[u32],
    out: SendPtr,
    out_rows: Rows,
    lse: SendPtr,
    parts: Option<Parts>,
) {
    use crate::kernels::bf16::pack_pairs;
    let dm = p.dims;
    let d = dm.head_dim;
    let (dp, bk) = (d.div_ceil(2), BK_LONG);
    let qt = task % q_tiles;
    let h = (task / q_tiles) % dm.q_heads;
    let b = task / (q_tiles * dm.q_heads);
    let i0 = qt * BQ_LONG;
    let rows = BQ_LONG.min(dm.q_len - i0);
    let (k_start, k_end) = p.tile_span(i0, rows);
    let mut q = vec![0f32; d];
    let mut qp = vec![0u32; rows * dp];
    let mut pp = vec![0u32; rows * bk / 2];
    let mut scratch = tile::Scratch::take();
    let [m, l, acc, s] = scratch.split([rows, rows, rows * d, rows * bk]);
    for r in 0..rows {
        load_q(p, b, h, i0 + r, &mut q);
        pack_pairs(&q, &mut qp[r * dp..][..dp]);
    }
    m.fill(f32::NEG_INFINITY);
    l.fill(0.0);
    acc.fill(0.0);
    for (j0, n) in key_tiles(k_start, k_end, bk) {
        let np = n.div_ceil(2);
        // The tile's block and column (even: a window's first key is a
        // multiple of WINDOW_ALIGN, every other tile of bk).
        let (jt, jc) = (j0 / bk, j0 % bk);
        debug_assert!(jc % 2 == 0);
        // As in forward_task: a tile its first rows see only in part runs
        // its products by groups of rows (8, the bf16 register tile's
        // height) on the keys each group sees. Same bits.
        let trim = p.sees_part(i0, rows, j0, n);
        let seen = |r0, r1| p.seen(i0, j0, n, r0, r1);
        // SAFETY: bf16_forward checked the CPU; qp holds rows × dp pairs,
        // the key tile dp × bk from column jc, s rows × n.
        unsafe {
            let g = tile::Gemm::new(rows, n, dp)
                .a(qp.as_ptr(), dp)
                .b(kp.as_ptr().add(jt * dp * bk + jc), bk)
                .to(s.as_mut_ptr(), n);
            let run = |g| crate::kernels::bf16::gemm(g);
            if trim {
                let limit = |r0, r1| {
                    let (lo, hi) = seen(r0, r1);
                    ([lo / 16 * 16, hi.next_multiple_of(16)], [0, dp])
                };
                tile::trimmed(g, 8, limit, run);
            } else {
                run(g);
            }
        };
        for r in 0..rows {
            let sr = &mut s[r * n..][..n];
            let acc_r = &mut acc[r * d..][..d];
            softmax_step(
                p,
                (b, h, i0 + r, j0),
                sr,
                &[],
                (&mut m[r], &mut l[r]),
                acc_r,
                &mut [],
                None,
            );
            pack_pairs(sr, &mut pp[r * np..][..np]);
        }
        // SAFETY: as above; pp holds rows × np pairs, the value tile np
        // (≤ bk/2) × d pairs, acc rows × d.
        unsafe {
            let g = tile::Gemm::new(rows, d, np)
                .a(pp.as_ptr(), np)
                .b(vp.as_ptr().add((jt * (bk / 2) + jc / 2) * d), d)
                .add_to(acc.as_mut_ptr(), d);
            let run = |g| crate::kernels::bf16::gemm(g);
            if trim {
                // The pairs of probabilities a group's keys fall in.
                let limit = |r0, r1| {
                    let (lo, hi) = seen(r0, r1);
                    ([0, d], [lo / 2, hi.div_ceil(2)])
                };
                tile::trimmed(g, 8, limit, run);
            } else {
                run(g);
            }
        };
    }
    for r in 0..rows {
        let i = i0 + r;
        // SAFETY: each task writes its own rows.
        let o = unsafe { std::slice::from_raw_parts_mut(out.0.add(out_rows.at(b, h, i)), d) };
        let lse_i = unsafe { &mut *lse.0.add((b * dm.q_heads + h) * dm.q_len + i) };
        finish_row(o, &acc[r * d..][..d], m[r], l[r], lse_i);
        if let Some(parts) = &parts {
            // (The first row of the accumulators is finished with.)
            merge_row(parts, (b, h, i), dm, o, *lse_i, &mut acc[..d]);
        }
    }
}
