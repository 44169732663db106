//! The reference path: the same attention composed of candle ops (the whole
//! logits matrix, `softmax`), on any device and dtype, differentiable by
//! candle itself; what the fused path is tested against.

use candle_core::{DType, Device, Tensor};

use super::{dense_dims, k, HostPos, Plan};
use crate::error::Result;
use crate::rope::PairLayout;
use crate::tensor::hooks::LogitsBias;

/// `(B|1, T_q, T_k)` relative distances `pos_k − pos_q`.
fn relative(plan: &Plan, d: &k::Dims) -> (usize, Vec<i64>) {
    let (qp, kp) = (plan.q_pos.0.as_kernel(), plan.k_pos.0.as_kernel());
    let pb = match (&plan.q_pos.0, &plan.k_pos.0) {
        (HostPos::Offset(_), HostPos::Offset(_)) => 1,
        _ => d.batch,
    };
    let at = |p: &k::Pos, b: usize, t: usize, len: usize| match *p {
        k::Pos::Offset(o) => o + t as i64,
        k::Pos::Ids(ids) => ids[b * len + t],
    };
    let mut out = Vec::with_capacity(pb * d.q_len * d.k_len);
    for b in 0..pb {
        for i in 0..d.q_len {
            for j in 0..d.k_len {
                out.push(at(&kp, b, j, d.k_len) - at(&qp, b, i, d.q_len));
            }
        }
    }
    (pb, out)
}

/// One-hot `(B|1, T_q, T_k, rows)` of a relative index.
fn onehot(
    index: &k::RelIndex,
    rel: &[i64],
    shape: (usize, usize, usize),
    dev: &Device,
    dtype: DType,
) -> Result<Tensor> {
    let n = index.rows();
    let mut data = vec![0f32; rel.len() * n];
    for (e, &r) in rel.iter().enumerate() {
        data[e * n + index.get(r)] = 1.0;
    }
    Ok(Tensor::from_vec(data, (shape.0, shape.1, shape.2, n), dev)?.to_dtype(dtype)?)
}

/// Rotates `(B, H, T, D)` with the tables of a [`Rotation`] (composed ops).
fn rotate_ref(
    x: &Tensor,
    tables: &crate::kernels::RopeTables<'_>,
    rows: &crate::tensor::rope::RotationRows,
    rd: usize,
    pairs: PairLayout,
) -> Result<Tensor> {
    let (b, _h, t, d) = x.dims4()?;
    let nf = tables.n_freq;
    let (pb, idx): (usize, Vec<usize>) = match rows {
        crate::tensor::rope::RotationRows::Offset(o) => (1, (0..t).map(|i| o + i).collect()),
        crate::tensor::rope::RotationRows::Ids(v) => (b, v.clone()),
    };
    let mut c = Vec::with_capacity(idx.len() * nf);
    let mut s = Vec::with_capacity(idx.len() * nf);
    for &r in &idx {
        c.extend_from_slice(&tables.cos[r * nf..][..nf]);
        s.extend_from_slice(&tables.sin[r * nf..][..nf]);
    }
    let dev = x.device();
    let c = Tensor::from_vec(c, (pb, 1, t, nf), dev)?.to_dtype(x.dtype())?;
    let s = Tensor::from_vec(s, (pb, 1, t, nf), dev)?.to_dtype(x.dtype())?;
    let rot = x.narrow(3, 0, rd)?;
    let (a, bb) = match pairs {
        PairLayout::HalfSplit => (rot.narrow(3, 0, nf)?, rot.narrow(3, nf, nf)?),
        PairLayout::Interleaved => {
            let r = rot.reshape((b, x.dim(1)?, t, nf, 2))?;
            (
                r.narrow(4, 0, 1)?.squeeze(4)?,
                r.narrow(4, 1, 1)?.squeeze(4)?,
            )
        }
    };
    let ya = (a.broadcast_mul(&c)? - bb.broadcast_mul(&s)?)?;
    let yb = (bb.broadcast_mul(&c)? + a.broadcast_mul(&s)?)?;
    let rotated = match pairs {
        PairLayout::HalfSplit => Tensor::cat(&[&ya, &yb], 3)?,
        PairLayout::Interleaved => Tensor::stack(&[&ya, &yb], 4)?.reshape((b, x.dim(1)?, t, rd))?,
    };
    Ok(if rd < d {
        Tensor::cat(&[&rotated, &x.narrow(3, rd, d - rd)?], 3)?
    } else {
        rotated
    })
}

/// The composed path on `(B, H, T, D)` tensors.
pub(super) fn reference(
    plan: &Plan,
    d: &k::Dims,
    q: &Tensor,
    kk: &Tensor,
    v: &Tensor,
) -> Result<Tensor> {
    let dev = q.device().clone();
    let dtype = q.dtype();
    let (mut q, mut kk) = (q.clone(), kk.clone());
    if let Some(r) = &plan.rotation {
        let t = &r.tables;
        q = rotate_ref(&q, &t.tables.query(), &t.q_rows, t.rotary_dim, t.pairs)?;
        kk = rotate_ref(&kk, &t.tables.key(), &t.k_rows, t.rotary_dim, t.pairs)?;
    }
    let group = d.q_heads / d.kv_heads;
    let expand = |x: &Tensor| -> Result<Tensor> {
        if group == 1 {
            return Ok(x.clone());
        }
        let (b, h, t, dd) = x.dims4()?;
        Ok(x.unsqueeze(2)?
            .broadcast_as((b, h, group, t, dd))?
            .reshape((b, h * group, t, dd))?)
    };
    let (kk, v) = (expand(&kk)?, expand(v)?);
    let qs = (q * plan.scale)?;
    let mut logits = qs.contiguous()?.matmul(&kk.t()?.contiguous()?)?;
    let (pb, rel) = relative(plan, d);
    let shape = (pb, d.q_len, d.k_len);
    match &plan.logits {
        Some(LogitsBias::Alibi { slopes, symmetric }) => {
            let mut data = Vec::with_capacity(pb * d.q_heads * rel.len() / pb);
            for b in 0..pb {
                for m in slopes {
                    for r in &rel[b * d.q_len * d.k_len..][..d.q_len * d.k_len] {
                        let v = if *symmetric {
                            -m * (*r as f64).abs()
                        } else {
                            m * *r as f64
                        };
                        data.push(v as f32);
                    }
                }
            }
            let bias =
                Tensor::from_vec(data, (pb, d.q_heads, d.q_len, d.k_len), &dev)?.to_dtype(dtype)?;
            logits = logits.broadcast_add(&bias)?;
        }
        Some(LogitsBias::Bucketed { index, table }) => {
            let ids: Vec<u32> = rel.iter().map(|&r| index.get(r) as u32).collect();
            let ids = Tensor::from_vec(ids, rel.len(), &dev)?;
            let rows = table.to_dtype(dtype)?.index_select(&ids, 0)?; // (pb·Tq·Tk, H)
            let bias = rows
                .reshape((pb, d.q_len, d.k_len, d.q_heads))?
                .permute((0, 3, 1, 2))?;
            logits = logits.broadcast_add(&bias)?;
        }
        Some(LogitsBias::RelativeKeys { index, keys }) => {
            let qa = qs.broadcast_matmul(&keys.to_dtype(dtype)?.t()?)?; // (B, H, Tq, n)
            let oh = onehot(index, &rel, shape, &dev, dtype)?; // (pb, Tq, Tk, n)
            let term = qa.unsqueeze(3)?.broadcast_mul(&oh.unsqueeze(1)?)?.sum(4)?;
            logits = (logits + term)?;
        }
        Some(LogitsBias::Dense(t)) => {
            let full = dense_dims(t, d)?;
            logits = logits.broadcast_add(&t.to_dtype(dtype)?.reshape(full.to_vec())?)?;
        }
        Some(LogitsBias::Cumulative { q: cq, k: ck }) => {
            let bias = cq
                .to_dtype(dtype)?
                .unsqueeze(3)?
                .broadcast_sub(&ck.to_dtype(dtype)?.unsqueeze(2)?)?;
            logits = (logits + bias)?;
        }
        None => {}
    }
    if plan.causal {
        let shift = d.k_len as i64 - d.q_len as i64;
        let m: Vec<f32> = (0..d.q_len)
            .flat_map(|i| {
                (0..d.k_len).map(move |j| {
                    if j as i64 > i as i64 + shift {
                        f32::NEG_INFINITY
                    } else {
                        0.0
                    }
                })
            })
            .collect();
        let mask = Tensor::from_vec(m, (d.q_len, d.k_len), &dev)?.to_dtype(dtype)?;
        logits = logits.broadcast_add(&mask)?;
    }
    let att = candle_nn::ops::softmax(&logits, candle_core::D::Minus1)?;
    let mut out = att.matmul(&v.contiguous()?)?;
    if let Some(vt) = &plan.values {
        let oh = onehot(&vt.index, &rel, shape, &dev, dtype)?; // (pb, Tq, Tk, n)
        let w = att.unsqueeze(4)?.broadcast_mul(&oh.unsqueeze(1)?)?.sum(3)?; // (B, H, Tq, n)
        out = (out + w.broadcast_matmul(&vt.values.to_dtype(dtype)?)?)?;
    }
    Ok(out)
}
