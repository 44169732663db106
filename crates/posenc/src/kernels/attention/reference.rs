//! The plain `f64` reference the kernels are tested against.

use super::*;

/// The plain `f64` reference: the whole `(T_q × T_k)` logits matrix per head,
/// exact softmax, the formula of the [module docs](super). Returns the output
/// as contiguous `(B, H_q, T_q, D)`.
pub fn reference_forward(p: &Problem) -> Vec<f64> {
    let dm = p.dims;
    let d = dm.head_dim;
    let mut out = vec![0f64; dm.batch * dm.q_heads * dm.q_len * d];
    let nv = p.n_vec_rows();
    // Time step (b, t) of the queries (`query`) or the keys, rotated.
    let rotated = |src: &[f32], query: bool, b: usize, t: usize| -> Vec<f64> {
        let mut y: Vec<f64> = src.iter().map(|&v| v as f64).collect();
        let Some(rot) = &p.rotation else {
            return y;
        };
        let (tables, row) = if query {
            (&rot.q, rot.q_rows.row(b, t, dm.q_len))
        } else {
            (&rot.k, rot.k_rows.row(b, t, dm.k_len))
        };
        let nf = tables.n_freq;
        for pi in 0..rot.rotary_dim / 2 {
            let (a, bb) = match rot.pairs {
                PairLayout::HalfSplit => (pi, pi + rot.rotary_dim / 2),
                PairLayout::Interleaved => (2 * pi, 2 * pi + 1),
            };
            let (c, s) = (
                tables.cos[row * nf + pi] as f64,
                tables.sin[row * nf + pi] as f64,
            );
            let (x0, x1) = (src[a] as f64, src[bb] as f64);
            y[a] = x0 * c - x1 * s;
            y[bb] = x1 * c + x0 * s;
        }
        y
    };
    for b in 0..dm.batch {
        for h in 0..dm.q_heads {
            let hk = h / p.group();
            let qv: Vec<Vec<f64>> = (0..dm.q_len)
                .map(|t| rotated(&p.q[p.q_rows.at(b, h, t)..][..d], true, b, t))
                .collect();
            let kv: Vec<Vec<f64>> = (0..dm.k_len)
                .map(|t| rotated(&p.k[p.k_rows.at(b, hk, t)..][..d], false, b, t))
                .collect();
            for i in 0..dm.q_len {
                let qp = p.q_pos.at(b, i, dm.q_len);
                let (lo, vis) = p.span(i);
                let mut s = vec![f64::NEG_INFINITY; dm.k_len];
                for (j, sj) in s.iter_mut().enumerate().take(vis).skip(lo) {
                    let r = p.k_pos.at(b, j, dm.k_len) - qp;
                    let mut x: f64 = (0..d).map(|x| qv[i][x] * kv[j][x]).sum();
                    if let Some(ak) = p.vector.and_then(|v| v.keys) {
                        let idx = p.vector.map(|v| v.index.get(r)).unwrap_or(0);
                        x += (0..d)
                            .map(|x| qv[i][x] * ak[idx * d + x] as f64)
                            .sum::<f64>();
                    }
                    x *= p.scale as f64;
                    if let Some(a) = p.alibi {
                        let m = a.slopes[h] as f64;
                        x += if a.symmetric {
                            -m * (r as f64).abs()
                        } else {
                            m * r as f64
                        };
                    }
                    if let Some(t) = p.scalar {
                        x += t.table[t.index.get(r) * dm.q_heads + h] as f64;
                    }
                    if let Some(db) = p.dense {
                        x += db.data[db.offset + b * db.sb + h * db.sh + i * db.si + j * db.sj]
                            as f64;
                    }
                    if let Some(cb) = p.cumulative {
                        x += cb.q[(b * dm.q_heads + h) * dm.q_len + i] as f64
                            - cb.k[(b * dm.q_heads + h) * dm.k_len + j] as f64;
                    }
                    *sj = x;
                }
                if vis <= lo {
                    continue;
                }
                let mx = s[..vis].iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = s[..vis].iter().map(|x| (x - mx).exp()).collect();
                let z: f64 = e.iter().sum();
                let o = &mut out[((b * dm.q_heads + h) * dm.q_len + i) * d..][..d];
                for (j, ej) in e.iter().enumerate() {
                    let pj = ej / z;
                    let vrow = &p.v[p.v_rows.at(b, hk, j)..][..d];
                    for x in 0..d {
                        o[x] += pj * vrow[x] as f64;
                    }
                    if let Some(av) = p.vector.and_then(|v| v.values) {
                        let r = p.k_pos.at(b, j, dm.k_len) - qp;
                        let idx = p.vector.map(|v| v.index.get(r)).unwrap_or(0);
                        debug_assert!(idx < nv);
                        for x in 0..d {
                            o[x] += pj * av[idx * d + x] as f64;
                        }
                    }
                }
            }
        }
    }
    out
}
