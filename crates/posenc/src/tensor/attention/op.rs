//! The fused path as candle custom ops: the chain of stages that carries
//! every input of a call ([`apply`]) and the fused backward pass that
//! computes all their gradients at once ([`backward`]).

use std::sync::Arc;

use candle_core::{CpuStorage, DType, Device, Layout, Shape, Storage, Tensor};

use super::{check_extent, cpu_f32_contiguous, k, Inputs, Shared};
use crate::error::{Error, Result};
use crate::kernels::HeadLayout;
use crate::tensor::custom::{AsCustomOp, CpuOutput, SliceGrads, SliceOp};
use crate::tensor::hooks::LogitsBias;

/// Applies a fused call as a chain of candle custom ops: the first stage
/// takes up to three inputs and computes the output; each further stage
/// takes the previous output and up to two more inputs and passes the output
/// through. The last stage's backward computes every gradient at once.
pub(super) fn apply(shared: Arc<Shared>) -> Result<Tensor> {
    let n = shared.inputs.len();
    let inputs = shared.inputs.clone();
    let stage = |index: usize| Stage {
        shared: shared.clone(),
        index,
        last: n <= 3 || index == (n - 3).div_ceil(2),
    };
    let mut out = match n {
        1 => inputs[0].apply_op1(AsCustomOp(stage(0)))?,
        2 => inputs[0].apply_op2(&inputs[1], AsCustomOp(stage(0)))?,
        _ => inputs[0].apply_op3(&inputs[1], &inputs[2], AsCustomOp(stage(0)))?,
    };
    let mut next = 3;
    let mut s = 1;
    while next < n {
        out = if next + 1 < n {
            out.apply_op3(&inputs[next], &inputs[next + 1], AsCustomOp(stage(s)))?
        } else {
            out.apply_op2(&inputs[next], AsCustomOp(stage(s)))?
        };
        next += 2;
        s += 1;
    }
    Ok(out)
}

/// One node of the chain built by [`apply`].
struct Stage {
    shared: Arc<Shared>,
    index: usize,
    last: bool,
}

impl SliceOp for Stage {
    fn name(&self) -> &'static str {
        "posenc-attention"
    }

    fn cpu_fwd(&self, args: &[(&CpuStorage, &Layout)]) -> CpuOutput {
        let sh = &self.shared;
        if self.index > 0 {
            // Pass the output through.
            let (s, l) = args[0];
            let v = match s {
                CpuStorage::F32(v) => v[l.start_offset()..][..l.shape().elem_count()].to_vec(),
                _ => candle_core::bail!("fused attention: expected f32"),
            };
            return Ok((CpuStorage::F32(v), sh.out_shape.clone()));
        }
        let mut slices: Vec<(&[f32], &Layout)> = Vec::new();
        let need = match sh.layouts {
            Inputs::Separate => 3,
            Inputs::Packed => 1,
        };
        for &(s, l) in args.iter().take(need) {
            match s {
                CpuStorage::F32(v) => slices.push((&v[..], l)),
                _ => candle_core::bail!("fused attention: expected f32"),
            }
        }
        let (out, lse) = sh.forward(&slices).map_err(candle_core::Error::wrap)?;
        *sh.lse.lock().expect("lse lock") = lse;
        Ok((CpuStorage::F32(out), sh.out_shape.clone()))
    }

    /// Gradients of this stage's arguments.
    fn bwd(&self, _args: &[&Tensor], res: &Tensor, grad: &Tensor) -> SliceGrads {
        let sh = &self.shared;
        let mut guard = sh.grads.lock().expect("grads lock");
        if guard.is_none() {
            if !self.last {
                candle_core::bail!("fused attention: backward reached an inner stage first");
            }
            *guard = Some(backward(sh, res, grad).map_err(candle_core::Error::wrap)?);
        }
        let all = guard.as_ref().expect("computed");
        let n = sh.inputs.len();
        Ok(if self.index == 0 {
            all[..n.min(3)].to_vec()
        } else {
            let start = 3 + 2 * (self.index - 1);
            let mut v = vec![Some(grad.clone())];
            v.extend(all[start..(start + 2).min(n)].iter().cloned());
            v
        })
    }
}

/// The fused backward pass: gradients of every input of `sh`.
fn backward(sh: &Shared, out: &Tensor, grad: &Tensor) -> Result<Vec<Option<Tensor>>> {
    let d = sh.g.dims;
    let dev = Device::Cpu;
    let lse = sh.lse.lock().expect("lse lock").clone();
    let params = sh.param_data()?;
    let grad = grad.to_dtype(DType::F32)?.contiguous()?;
    let out = out.contiguous()?;
    // Both are contiguous f32 on the CPU: read them in place.
    let (go_s, go_l) = grad.storage_and_layout();
    let go = cpu_f32_contiguous(&go_s, go_l, grad.elem_count())?;
    let out = out.to_dtype(DType::F32)?;
    let (o_s, o_l) = out.storage_and_layout();
    let o = cpu_f32_contiguous(&o_s, o_l, out.elem_count())?;
    let n_qkv = match sh.layouts {
        Inputs::Separate => 3,
        Inputs::Packed => 1,
    };
    let guards: Vec<_> = sh.inputs[..n_qkv]
        .iter()
        .map(|t| t.storage_and_layout())
        .collect();
    let mut views: Vec<&[f32]> = Vec::new();
    for (s, l) in &guards {
        match &**s {
            Storage::Cpu(CpuStorage::F32(v)) => views.push(match sh.layouts {
                Inputs::Separate => &v[..],
                Inputs::Packed => &v[l.start_offset()..],
            }),
            _ => {
                return Err(Error::DType {
                    what: "fused attention (CPU f32)",
                    dtype: "not f32".into(),
                })
            }
        }
    }
    let (qs, ks, vs) = match sh.layouts {
        Inputs::Separate => (views[0], views[1], views[2]),
        Inputs::Packed => (views[0], views[0], views[0]),
    };
    let slopes = sh.alibi_slopes();
    let (prob, dense_full) = sh.problem(&params, &slopes, [qs, ks, vs])?;
    let n_vec = match (&sh.plan.logits, &sh.plan.values) {
        (Some(LogitsBias::RelativeKeys { index, .. }), _) => index.rows(),
        (_, Some(vt)) => vt.index.rows(),
        _ => 0,
    };
    let mut g_scalar = Vec::new();
    let mut g_keys = Vec::new();
    let mut g_values = Vec::new();
    let mut g_dense = Vec::new();
    let mut g_cq = Vec::new();
    let mut g_ck = Vec::new();
    match &sh.plan.logits {
        Some(LogitsBias::Bucketed { index, .. }) => {
            g_scalar = vec![0f32; index.rows() * d.q_heads];
        }
        Some(LogitsBias::RelativeKeys { .. }) => g_keys = vec![0f32; n_vec * d.head_dim],
        Some(LogitsBias::Dense(_)) => {
            g_dense = vec![0f32; d.batch * d.q_heads * d.q_len * d.k_len];
        }
        Some(LogitsBias::Cumulative { .. }) => {
            g_cq = vec![0f32; d.batch * d.q_heads * d.q_len];
            g_ck = vec![0f32; d.batch * d.q_heads * d.k_len];
        }
        Some(LogitsBias::Alibi { .. }) | None => {}
    }
    if sh.plan.values.is_some() {
        g_values = vec![0f32; n_vec * d.head_dim];
    }
    // Gradient buffers of q, k, v (or the packed qkv).
    let (mut gq, mut gk, mut gv);
    let (dq_ptr, dk_ptr, dv_ptr, dq_rows, dk_rows, dv_rows);
    let mut gqkv;
    match sh.layouts {
        Inputs::Separate => {
            let (hq, hk) = (d.q_heads, d.kv_heads);
            let (q_sh, kv_sh) = (sh.inputs[0].shape().clone(), sh.inputs[1].shape().clone());
            // SAFETY: the backward pass writes every element of dq, dk, dv.
            unsafe {
                gq = crate::kernels::tile::vec_for_overwrite(q_sh.elem_count());
                gk = crate::kernels::tile::vec_for_overwrite(kv_sh.elem_count());
                gv = crate::kernels::tile::vec_for_overwrite(kv_sh.elem_count());
            }
            let contiguous = |heads: usize, len: usize| match sh.g.layout {
                HeadLayout::Bthd => k::Rows::bthd(heads, len, d.head_dim),
                HeadLayout::Bhtd => k::Rows::bhtd(heads, len, d.head_dim),
            };
            dq_rows = contiguous(hq, d.q_len);
            dk_rows = contiguous(hk, d.k_len);
            dv_rows = dk_rows;
            dq_ptr = gq.as_mut_ptr();
            dk_ptr = gk.as_mut_ptr();
            dv_ptr = gv.as_mut_ptr();
            gqkv = Vec::new();
        }
        Inputs::Packed => {
            // SAFETY: dq, dk and dv tile the packed buffer, every element written.
            gqkv = unsafe { crate::kernels::tile::vec_for_overwrite(sh.inputs[0].elem_count()) };
            let base = gqkv.as_mut_ptr();
            let w = (d.q_heads + 2 * d.kv_heads) * d.head_dim;
            let r = |off: usize| k::Rows {
                offset: off,
                sb: d.q_len * w,
                sh: d.head_dim,
                st: w,
            };
            dq_rows = r(0);
            dk_rows = r(d.q_heads * d.head_dim);
            dv_rows = r((d.q_heads + d.kv_heads) * d.head_dim);
            dq_ptr = base;
            dk_ptr = base;
            dv_ptr = base;
            gq = Vec::new();
            gk = Vec::new();
            gv = Vec::new();
        }
    }
    check_extent(&prob)?;
    let grads = k::Grads {
        dq: dq_ptr,
        dq_rows,
        dk: dk_ptr,
        dk_rows,
        dv: dv_ptr,
        dv_rows,
        scalar: (!g_scalar.is_empty()).then_some(&mut g_scalar[..]),
        keys: (!g_keys.is_empty()).then_some(&mut g_keys[..]),
        values: (!g_values.is_empty()).then_some(&mut g_values[..]),
        dense: (!g_dense.is_empty()).then_some(&mut g_dense[..]),
        cumulative_q: (!g_cq.is_empty()).then_some(&mut g_cq[..]),
        cumulative_k: (!g_ck.is_empty()).then_some(&mut g_ck[..]),
    };
    let out_rows = sh.g.out_rows;
    k::backward(
        &prob,
        o,
        out_rows,
        go,
        out_rows,
        &lse,
        None,
        grads,
        sh.plan.level,
    );
    let _ = (&mut gq, &mut gk, &mut gv, &mut gqkv);
    // Assemble in input order.
    let mut res: Vec<Option<Tensor>> = Vec::new();
    match sh.layouts {
        Inputs::Separate => {
            let (hq, hk) = (d.q_heads, d.kv_heads);
            let bthd = sh.g.layout == HeadLayout::Bthd;
            let shape = |h: usize, t: usize| -> Shape {
                if bthd {
                    Shape::from((d.batch, t, h, d.head_dim))
                } else {
                    Shape::from((d.batch, h, t, d.head_dim))
                }
            };
            res.push(Some(Tensor::from_vec(gq, shape(hq, d.q_len), &dev)?));
            res.push(Some(Tensor::from_vec(gk, shape(hk, d.k_len), &dev)?));
            res.push(Some(Tensor::from_vec(gv, shape(hk, d.k_len), &dev)?));
        }
        Inputs::Packed => {
            res.push(Some(Tensor::from_vec(gqkv, sh.inputs[0].shape(), &dev)?));
        }
    }
    let param_grad = |data: Vec<f32>, like: &Tensor| -> Result<Option<Tensor>> {
        Ok(Some(
            Tensor::from_vec(data, like.shape(), &dev)?.to_dtype(like.dtype())?,
        ))
    };
    let mut pidx = 0;
    match &sh.plan.logits {
        Some(LogitsBias::Bucketed { .. }) => {
            res.push(param_grad(g_scalar, &sh.plan.params[pidx])?);
            pidx += 1;
        }
        Some(LogitsBias::RelativeKeys { .. }) => {
            res.push(param_grad(g_keys, &sh.plan.params[pidx])?);
            pidx += 1;
        }
        Some(LogitsBias::Dense(t)) => {
            let mut gt = Tensor::from_vec(g_dense, (d.batch, d.q_heads, d.q_len, d.k_len), &dev)?;
            if dense_full[0] == 1 {
                gt = gt.sum_keepdim(0)?;
            }
            if dense_full[1] == 1 {
                gt = gt.sum_keepdim(1)?;
            }
            res.push(Some(gt.reshape(t.shape())?.to_dtype(t.dtype())?));
            pidx += 1;
        }
        Some(LogitsBias::Cumulative { .. }) => {
            res.push(param_grad(g_cq, &sh.plan.params[pidx])?);
            res.push(param_grad(g_ck, &sh.plan.params[pidx + 1])?);
            pidx += 2;
        }
        Some(LogitsBias::Alibi { .. }) | None => {}
    }
    if sh.plan.values.is_some() {
        res.push(param_grad(g_values, &sh.plan.params[pidx])?);
    }
    debug_assert_eq!(res.len(), sh.inputs.len());
    Ok(res)
}
