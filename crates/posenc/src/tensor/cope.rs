//! CoPE (Golovneva et al. 2024) as a trainable candle module: the
//! contextual-position logits term of [`crate::relative::cope`],
//! differentiable with respect to the queries, the keys that gate and the
//! position-embedding table.
//!
//! # Output
//! [`CopeBias::bias`] returns the additive bias `(B, H, Tq, Tk)` for queries
//! `(B, H, Tq, d)` and keys `(B, H, Tk, d)`: `CoPE_ij/√d` (or `CoPE_ij`
//! without [`CopeConfig::divide_by_sqrt_d`]), to add to the scaled logits
//! `q·k/√d`, then mask as usual (a masked key gets `z_i[0]`). When the
//! attention has the scaled logits already, [`CopeBias::bias_from_gate_logits`]
//! takes them instead of the keys.
//!
//! # Parameters (name in the [`VarBuilder`], initialisation)
//! `pos_emb`, `(d, npos_max)` (the reference's `(1, d, npos)` without the
//! leading 1), initialised to zero as the reference does: the CoPE term starts
//! at 0 and its gradient reaches the table (not yet the gates).
//!
//! # How it is computed
//! `z = q·e` is a `(B, H, Tq, P)` matmul. On the CPU (`f32`, `f64`) one fused
//! op then does the rest per (batch, head, query) row, rows in parallel, in
//! `f64`: the gates `σ(q·kᵀ/√d)` of the visible keys (the causal mask comes
//! from the explicit positions), their reverse cumulative sum, the clamp at
//! `P − 1`, and the interpolation between `z[⌊p⌋]` and `z[⌈p⌉]`. Its
//! backward pass is one more pass per row: `∂z` at the two ends,
//! `∂p = ∂out·(z[⌈p⌉] − z[⌊p⌋])` where `p ≤ P − 1` (as `torch.clamp`), a
//! forward cumulative sum to the gates, times `σ′`. Nothing of size
//! `Tq·Tk` is allocated besides the logits, the output and their gradients.
//!
//! The composed path ([`CopeBias::with_fused`]`(false)`, and on other
//! devices or dtypes) writes the same with candle ops: candle-nn's sigmoid,
//! a 0/1 mask, [`reverse_cumsum_last`], a `where` clamp, `floor`/`ceil`
//! (detached) and an `index_select` on the flattened `z` (backward:
//! `index_add`); about ten `(B, H, Tq, Tk)` temporaries. The tests compare
//! both paths with each other, with the plain [`Cope`], with PyTorch running
//! the reference code, and with finite differences.
//!
//! ```
//! use candle_core::{DType, Device, Tensor};
//! use candle_nn::{VarBuilder, VarMap};
//! use posenc::relative::cope::CopeConfig;
//! use posenc::tensor::cope::CopeBias;
//!
//! let vm = VarMap::new();
//! let vb = VarBuilder::from_varmap(&vm, DType::F32, &Device::Cpu);
//! let cope = CopeBias::new(CopeConfig::new(8, 16)?, vb.pp("cope"))?;
//! let q = Tensor::randn(0f32, 1.0, (2, 4, 5, 8), &Device::Cpu)?;
//! let k = Tensor::randn(0f32, 1.0, (2, 4, 5, 8), &Device::Cpu)?;
//! let bias = cope.bias(&q, &k, 0.into(), 0.into())?;
//! assert_eq!(bias.dims(), &[2, 4, 5, 5]);
//! // Contextual positions: between 0 and i − j + 1 for a visible key.
//! let p = cope.positions(&(q.matmul(&k.t()?)? / 8f64.sqrt())?, 0.into(), 0.into())?;
//! let p: Vec<Vec<f32>> = p.get(0)?.get(0)?.to_vec2()?;
//! assert!(p[4][0] > 0.0 && p[4][0] < 5.0 && p[0][4] == 0.0);
//! # Ok::<(), posenc::Error>(())
//! ```

use std::sync::Arc;

use candle_core::{CpuStorage, DType, Device, Layout, Shape, Tensor, WithDType};
use candle_nn::{Init, VarBuilder};
use rayon::prelude::*;

use super::custom::{AsCustomOp, CpuOutput, SliceGrads, SliceOp};
use super::host::{checked_elements, common_rows, read_positions};
use super::scan::reverse_cumsum_last;
use super::Positions;
use crate::error::{Error, Result};
use crate::relative::cope::{Cope, CopeConfig};

/// CoPE as a trainable module (see the [module docs](self)).
#[derive(Debug, Clone)]
pub struct CopeBias {
    cfg: CopeConfig,
    table: Tensor,
    fused: bool,
}

fn dims4(what: &'static str, t: &Tensor, last: Option<usize>) -> Result<[usize; 4]> {
    match t.dims() {
        &[b, h, n, d] if last.is_none_or(|l| l == d) => Ok([b, h, n, d]),
        dims => Err(Error::Shape {
            what,
            expected: match last {
                Some(d) => format!("(B, H, T, {d})"),
                None => "(B, H, Tq, Tk)".into(),
            },
            got: format!("{dims:?}"),
        }),
    }
}

impl CopeBias {
    /// The table `pos_emb`, `(d, npos_max)`, zero when created (see the
    /// [module docs](self)).
    ///
    /// # Errors
    /// As [`CopeConfig::validate`]; candle errors from `vb`.
    pub fn new(cfg: CopeConfig, vb: VarBuilder) -> Result<Self> {
        cfg.validate()?;
        let table = vb.get_with_hints((cfg.head_dim, cfg.npos_max), "pos_emb", Init::Const(0.0))?;
        Ok(Self {
            cfg,
            table,
            fused: true,
        })
    }

    /// A constant tensor (of `dtype`) holding a plain [`Cope`]'s table.
    ///
    /// # Errors
    /// Candle errors.
    pub fn from_plain(cope: &Cope, dtype: DType, device: &Device) -> Result<Self> {
        let cfg = *cope.config();
        let flat: Vec<f64> = cope.table().iter().flatten().copied().collect();
        let table = Tensor::from_vec(flat, (cfg.npos_max, cfg.head_dim), device)?
            .t()?
            .contiguous()?
            .to_dtype(dtype)?;
        Ok(Self {
            cfg,
            table,
            fused: true,
        })
    }

    /// This module computing the bias with the fused CPU op (`true`, the
    /// default) or with composed candle ops (`false`; the path on other
    /// devices and for `f16`/`bf16`), for comparison.
    pub fn with_fused(mut self, fused: bool) -> Self {
        self.fused = fused;
        self
    }

    /// The configuration.
    pub fn config(&self) -> &CopeConfig {
        &self.cfg
    }

    /// The table `e`, `(d, npos_max)`: column `p` is `e[p]`.
    pub fn table(&self) -> &Tensor {
        &self.table
    }

    /// The 0/1 causal mask, `rows × Tq × Tk` (`rows` 1 or B): key `j`
    /// visible to query `i` when `k_pos[j] ≤ q_pos[i]`.
    fn host_mask(
        &self,
        q_len: usize,
        k_len: usize,
        q_pos: Positions<'_>,
        k_pos: Positions<'_>,
    ) -> Result<(usize, Vec<u8>)> {
        let qp = read_positions(q_pos, q_len, "CoPE query position ids")?;
        let kp = read_positions(k_pos, k_len, "CoPE key position ids")?;
        let n = common_rows(&qp, &kp)?.unwrap_or(1);
        checked_elements("CoPE mask", &[n, q_len, k_len])?;
        let mut data = Vec::with_capacity(n * q_len * k_len);
        for b in 0..n {
            for i in 0..q_len {
                let q = qp.get(b, i);
                data.extend((0..k_len).map(|j| u8::from(kp.get(b, j) <= q)));
            }
        }
        Ok((n, data))
    }

    /// The causal mask as host data, checked against the batch `b`.
    fn batch_mask(
        &self,
        b: usize,
        q_len: usize,
        k_len: usize,
        q_pos: Positions<'_>,
        k_pos: Positions<'_>,
    ) -> Result<(usize, Vec<u8>)> {
        let (n, data) = self.host_mask(q_len, k_len, q_pos, k_pos)?;
        if n != 1 && n != b {
            return Err(Error::Shape {
                what: "CoPE position ids",
                expected: format!("{b} rows (the batch)"),
                got: format!("{n} rows"),
            });
        }
        Ok((n, data))
    }

    /// The contextual positions `p_ij = min(Σ_{t ≥ j} g_it, P − 1)`,
    /// `(B, H, Tq, Tk)`, from the scaled gate logits `q·kᵀ/√d` of shape
    /// `(B, H, Tq, Tk)` (masked by the positions when causal).
    ///
    /// # Errors
    /// [`Error::Shape`] for logits not of rank 4 or position ids whose batch
    /// is not the logits' (or that differ); as [`CopeBias::bias`].
    pub fn positions(
        &self,
        gate_logits: &Tensor,
        q_pos: Positions<'_>,
        k_pos: Positions<'_>,
    ) -> Result<Tensor> {
        let [b, h, tq, tk] = dims4("CoPE gate logits", gate_logits, None)?;
        checked_elements("CoPE positions", &[b, h, tq, tk])?;
        let dtype = self.table.dtype();
        let gl = gate_logits.to_dtype(dtype)?;
        let mut g = candle_nn::ops::sigmoid(&gl)?;
        if self.cfg.causal {
            let (n, mask) = self.batch_mask(b, tq, tk, q_pos, k_pos)?;
            let mask = Tensor::from_vec(mask, (n, 1, tq, tk), gl.device())?.to_dtype(dtype)?;
            g = g.broadcast_mul(&mask)?;
        }
        let p = reverse_cumsum_last(&g)?;
        let cap = (self.cfg.npos_max - 1) as f64;
        let cap_t = Tensor::full(cap, p.shape(), p.device())?.to_dtype(dtype)?;
        Ok(p.le(cap)?.where_cond(&p, &cap_t)?)
    }

    /// The bias `(B, H, Tq, Tk)` for queries `q` `(B, H, Tq, d)` and scaled
    /// gate logits `q·kᵀ/√d` `(B, H, Tq, Tk)` (see the [module docs](self)).
    ///
    /// # Errors
    /// As [`CopeBias::bias`].
    pub fn bias_from_gate_logits(
        &self,
        q: &Tensor,
        gate_logits: &Tensor,
        q_pos: Positions<'_>,
        k_pos: Positions<'_>,
    ) -> Result<Tensor> {
        let [b, h, tq, _] = dims4("CoPE queries", q, Some(self.cfg.head_dim))?;
        let [gb, gh, gq, tk] = dims4("CoPE gate logits", gate_logits, None)?;
        if (gb, gh, gq) != (b, h, tq) {
            return Err(Error::Shape {
                what: "CoPE gate logits",
                expected: format!("({b}, {h}, {tq}, Tk), as the queries"),
                got: format!("{:?}", gate_logits.dims()),
            });
        }
        let npos = self.cfg.npos_max;
        checked_elements("CoPE position logits", &[b, h, tq, npos])?;
        if b * h * tq * tk == 0 {
            return Ok(Tensor::zeros((b, h, tq, tk), q.dtype(), q.device())?);
        }
        let in_dtype = q.dtype();
        let dtype = self.table.dtype();
        let q = q.to_dtype(dtype)?;
        if self.fused && q.device().is_cpu() && matches!(dtype, DType::F32 | DType::F64) {
            checked_elements("CoPE logits", &[b, h, tq, tk])?;
            let mask = if self.cfg.causal {
                let (n, m) = self.batch_mask(b, tq, tk, q_pos, k_pos)?;
                Some((n, Arc::new(m)))
            } else {
                None
            };
            let op = CopeOp {
                mask_rows: mask.as_ref().map_or(1, |m| m.0),
                mask: mask.map(|m| m.1),
                heads: h,
                tq,
                tk,
                npos,
            };
            let z = q.broadcast_matmul(&self.table)?.contiguous()?; // (B, H, Tq, P)
            let gl = gate_logits.to_dtype(dtype)?.contiguous()?;
            let term = gl.apply_op2(&z, AsCustomOp(op))?;
            return Ok((term * self.cfg.term_scale())?.to_dtype(in_dtype)?);
        }
        let p = self.positions(gate_logits, q_pos, k_pos)?;
        let floor = p.floor()?.detach();
        let ceil = p.ceil()?.detach();
        let w = (&p - &floor)?;
        // z[b, h, i, r] = q_i · e[r], flattened; row (b, h, i) starts at
        // ((b·H + h)·Tq + i)·P.
        let z = q.broadcast_matmul(&self.table)?.flatten_all()?;
        let rows = b * h * tq;
        let base: Vec<i64> = (0..rows).map(|r| (r * npos) as i64).collect();
        let base = Tensor::from_vec(base, (b, h, tq, 1), q.device())?;
        let pick = |idx: &Tensor| -> Result<Tensor> {
            let flat = idx
                .to_dtype(DType::I64)?
                .broadcast_add(&base)?
                .flatten_all()?;
            Ok(z.index_select(&flat, 0)?.reshape((b, h, tq, tk))?)
        };
        let z_floor = pick(&floor)?;
        let z_ceil = pick(&ceil)?;
        let term = (&z_floor + (w * (z_ceil - &z_floor)?)?)?;
        Ok((term * self.cfg.term_scale())?.to_dtype(in_dtype)?)
    }

    /// The bias `(B, H, Tq, Tk)` for queries `q` `(B, H, Tq, d)` at
    /// `q_pos` and gating keys `k` `(B, H, Tk, d)` at `k_pos` (see the
    /// [module docs](self)); inputs of another dtype than the table are
    /// computed in the table's dtype and the result cast back.
    ///
    /// # Errors
    /// [`Error::Shape`] for inputs that are not `(B, H, T, d)` with the same
    /// `B` and `H`, or position ids not `(B, T)`; [`Error::DType`] /
    /// [`Error::NegativePosition`] for bad ids; [`Error::InvalidValue`] for
    /// tensors above 2^31 elements; candle errors.
    pub fn bias(
        &self,
        q: &Tensor,
        k: &Tensor,
        q_pos: Positions<'_>,
        k_pos: Positions<'_>,
    ) -> Result<Tensor> {
        let d = self.cfg.head_dim;
        let [b, h, tq, _] = dims4("CoPE queries", q, Some(d))?;
        let [kb, kh, tk, _] = dims4("CoPE keys", k, Some(d))?;
        if (kb, kh) != (b, h) {
            return Err(Error::Shape {
                what: "CoPE keys",
                expected: format!("({b}, {h}, Tk, {d}), as the queries"),
                got: format!("{:?}", k.dims()),
            });
        }
        checked_elements("CoPE logits", &[b, h, tq, tk])?;
        let dtype = self.table.dtype();
        let qd = q.to_dtype(dtype)?.contiguous()?;
        let kd = k.to_dtype(dtype)?.contiguous()?;
        let gate_logits = (qd.matmul(&kd.t()?)? / (d as f64).sqrt())?;
        Ok(self
            .bias_from_gate_logits(&qd, &gate_logits, q_pos, k_pos)?
            .to_dtype(q.dtype())?)
    }
}

/// The fused CoPE term on the CPU: gates, reverse sum, clamp and
/// interpolation in one pass per (batch, head, query) row, in `f64`, rows in
/// parallel. Inputs: the scaled gate logits `(B, H, Tq, Tk)` and `z = q·e`
/// `(B, H, Tq, P)`; output `(B, H, Tq, Tk)` (before the `1/√d`).
#[derive(Debug, Clone)]
struct CopeOp {
    /// `mask_rows × Tq × Tk` visibility (None: every key visible).
    mask: Option<Arc<Vec<u8>>>,
    mask_rows: usize,
    heads: usize,
    tq: usize,
    tk: usize,
    npos: usize,
}

impl CopeOp {
    fn cap(&self) -> f64 {
        (self.npos - 1) as f64
    }

    /// The visibility of the keys of row `row = (b·H + h)·Tq + i` (`None`:
    /// every key visible).
    fn visibility(&self, row: usize) -> Option<&[u8]> {
        self.mask.as_ref().map(|m| {
            let i = row % self.tq;
            let b = row / (self.tq * self.heads);
            let bm = if self.mask_rows == 1 { 0 } else { b };
            let start = (bm * self.tq + i) * self.tk;
            &m[start..start + self.tk]
        })
    }

    /// Gates and unclamped positions of one row.
    fn row<T: WithDType>(&self, row: usize, gl: &[T], g: &mut [f64], p: &mut [f64]) {
        let vis = self.visibility(row);
        let mut acc = 0.0;
        for j in (0..self.tk).rev() {
            g[j] = if vis.is_none_or(|v| v[j] != 0) {
                crate::relative::cope::sigmoid(gl[j].to_f64())
            } else {
                0.0
            };
            acc += g[j];
            p[j] = acc;
        }
    }

    /// `(⌊p⌋, ⌈p⌉, p − ⌊p⌋)` of the clamped position.
    fn ends(&self, p: f64) -> (usize, usize, f64) {
        let pc = p.min(self.cap()).max(0.0);
        let (fl, ce) = (pc.floor(), pc.ceil());
        (fl as usize, ce as usize, pc - fl)
    }

    fn forward<T: WithDType>(&self, gl: &[T], z: &[T]) -> Vec<T> {
        let (tk, npos) = (self.tk, self.npos);
        let mut out = vec![T::from_f64(0.0); gl.len()];
        out.par_chunks_mut(tk)
            .zip(gl.par_chunks(tk))
            .zip(z.par_chunks(npos))
            .enumerate()
            .for_each_init(
                || (vec![0.0; tk], vec![0.0; tk]),
                |(g, p), (row, ((o, glr), zr))| {
                    self.row(row, glr, g, p);
                    for j in 0..tk {
                        let (fl, ce, w) = self.ends(p[j]);
                        let (zf, zc) = (zr[fl].to_f64(), zr[ce].to_f64());
                        o[j] = T::from_f64(zf + w * (zc - zf));
                    }
                },
            );
        out
    }

    /// `[∂L/∂gate_logits (B·H·Tq·Tk), ∂L/∂z (B·H·Tq·P)]`, concatenated.
    fn backward<T: WithDType>(&self, gl: &[T], z: &[T], dout: &[T]) -> Vec<T> {
        let (tk, npos) = (self.tk, self.npos);
        let n_gl = gl.len();
        let mut out = vec![T::from_f64(0.0); n_gl + z.len()];
        let (dgl, dz) = out.split_at_mut(n_gl);
        let cap = self.cap();
        dgl.par_chunks_mut(tk)
            .zip(dz.par_chunks_mut(npos))
            .enumerate()
            .for_each_init(
                || (vec![0.0; tk], vec![0.0; tk], vec![0.0; npos]),
                |(g, p, dzr), (row, (dglr, dzo))| {
                    let glr = &gl[row * tk..(row + 1) * tk];
                    let zr = &z[row * npos..(row + 1) * npos];
                    let dor = &dout[row * tk..(row + 1) * tk];
                    self.row(row, glr, g, p);
                    dzr.iter_mut().for_each(|v| *v = 0.0);
                    // dp_j, then ∂L/∂g_t = Σ_{j ≤ t} dp_j (a forward scan).
                    let mut acc = 0.0;
                    for j in 0..tk {
                        let (fl, ce, w) = self.ends(p[j]);
                        let d = dor[j].to_f64();
                        dzr[fl] += d * (1.0 - w);
                        dzr[ce] += d * w;
                        if p[j] <= cap {
                            acc += d * (zr[ce].to_f64() - zr[fl].to_f64());
                        }
                        dglr[j] = T::from_f64(acc * g[j] * (1.0 - g[j]));
                    }
                    for (o, v) in dzo.iter_mut().zip(dzr.iter()) {
                        *o = T::from_f64(*v);
                    }
                },
            );
        out
    }
}

fn slice_of<'a, T>(v: &'a [T], l: &Layout, what: &str) -> candle_core::Result<&'a [T]> {
    let (o1, o2) = l
        .contiguous_offsets()
        .ok_or_else(|| candle_core::Error::Msg(format!("posenc cope: {what} not contiguous")))?;
    Ok(&v[o1..o2])
}

impl SliceOp for CopeOp {
    fn name(&self) -> &'static str {
        "posenc-cope"
    }

    fn cpu_fwd(&self, args: &[(&CpuStorage, &Layout)]) -> CpuOutput {
        let [(s1, l1), (s2, l2)] = args else {
            candle_core::bail!("posenc cope: takes two tensors, not {}", args.len())
        };
        let out = match (s1, s2) {
            (CpuStorage::F32(a), CpuStorage::F32(b)) => {
                CpuStorage::F32(self.forward(slice_of(a, l1, "logits")?, slice_of(b, l2, "z")?))
            }
            (CpuStorage::F64(a), CpuStorage::F64(b)) => {
                CpuStorage::F64(self.forward(slice_of(a, l1, "logits")?, slice_of(b, l2, "z")?))
            }
            _ => {
                return Err(candle_core::Error::Msg(
                    "posenc cope: needs two f32 or two f64 tensors".into(),
                ))
            }
        };
        Ok((out, l1.shape().clone()))
    }

    fn bwd(&self, args: &[&Tensor], _res: &Tensor, grad: &Tensor) -> SliceGrads {
        let [gl, z] = args else {
            candle_core::bail!("posenc cope: takes two tensors, not {}", args.len())
        };
        let packed = gl.contiguous()?.apply_op3_no_bwd(
            &z.contiguous()?,
            &grad.contiguous()?,
            &AsCustomOp(CopeGrad(self.clone())),
        )?;
        let n = gl.elem_count();
        let dgl = packed.narrow(0, 0, n)?.reshape(gl.shape())?;
        let dz = packed.narrow(0, n, z.elem_count())?.reshape(z.shape())?;
        Ok(vec![Some(dgl), Some(dz)])
    }
}

/// The backward pass of [`CopeOp`], as one op with both gradients packed.
struct CopeGrad(CopeOp);

impl SliceOp for CopeGrad {
    fn name(&self) -> &'static str {
        "posenc-cope-grad"
    }

    fn cpu_fwd(&self, args: &[(&CpuStorage, &Layout)]) -> CpuOutput {
        let [(s1, l1), (s2, l2), (s3, l3)] = args else {
            candle_core::bail!(
                "posenc cope backward: takes three tensors, not {}",
                args.len()
            )
        };
        let out = match (s1, s2, s3) {
            (CpuStorage::F32(a), CpuStorage::F32(b), CpuStorage::F32(c)) => {
                CpuStorage::F32(self.0.backward(
                    slice_of(a, l1, "logits")?,
                    slice_of(b, l2, "z")?,
                    slice_of(c, l3, "gradient")?,
                ))
            }
            (CpuStorage::F64(a), CpuStorage::F64(b), CpuStorage::F64(c)) => {
                CpuStorage::F64(self.0.backward(
                    slice_of(a, l1, "logits")?,
                    slice_of(b, l2, "z")?,
                    slice_of(c, l3, "gradient")?,
                ))
            }
            _ => {
                return Err(candle_core::Error::Msg(
                    "posenc cope backward: needs f32 or f64 tensors of one dtype".into(),
                ))
            }
        };
        let n = l1.shape().elem_count() + l2.shape().elem_count();
        Ok((out, Shape::from(n)))
    }

    /// Never called: the op runs without a backward pass
    /// (`apply_op3_no_bwd`).
    fn bwd(&self, _args: &[&Tensor], _res: &Tensor, _dy: &Tensor) -> SliceGrads {
        candle_core::bail!("posenc cope backward: no second derivative")
    }
}
