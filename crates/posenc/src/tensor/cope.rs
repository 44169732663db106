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
//! `g = σ(q·kᵀ/√d)` (candle-nn's sigmoid, which has a backward pass), times
//! the 0/1 causal mask from the explicit positions; `p` is the reverse
//! cumulative sum over the keys ([`reverse_cumsum_last`], `O(Tk)` per row)
//! clamped at `P − 1` (gradient passes at `p ≤ P − 1`, as `torch.clamp`);
//! `z = q·e` is `(B, H, Tq, P)`; `z[⌊p⌋]` and `z[⌈p⌉]` are picked by an
//! `index_select` on the flattened `z` (backward: `index_add`), and
//! interpolated with the weight `p − ⌊p⌋`. Memory is a few `(B, H, Tq, Tk)`
//! tensors and one `(B, H, Tq, P)`.
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

use candle_core::{DType, Device, Tensor};
use candle_nn::{Init, VarBuilder};

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
        Ok(Self { cfg, table })
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
        Ok(Self { cfg, table })
    }

    /// The configuration.
    pub fn config(&self) -> &CopeConfig {
        &self.cfg
    }

    /// The table `e`, `(d, npos_max)`: column `p` is `e[p]`.
    pub fn table(&self) -> &Tensor {
        &self.table
    }

    /// The 0/1 causal mask `(1 or B, 1, Tq, Tk)`: key `j` visible to query
    /// `i` when `k_pos[j] ≤ q_pos[i]`.
    fn mask(
        &self,
        q_len: usize,
        k_len: usize,
        q_pos: Positions<'_>,
        k_pos: Positions<'_>,
        dtype: DType,
        device: &Device,
    ) -> Result<Tensor> {
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
        Ok(Tensor::from_vec(data, (n, 1, q_len, k_len), device)?.to_dtype(dtype)?)
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
            let mask = self.mask(tq, tk, q_pos, k_pos, dtype, gl.device())?;
            if mask.dim(0)? != 1 && mask.dim(0)? != b {
                return Err(Error::Shape {
                    what: "CoPE position ids",
                    expected: format!("{b} rows (the batch)"),
                    got: format!("{} rows", mask.dim(0)?),
                });
            }
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
        let in_dtype = q.dtype();
        let dtype = self.table.dtype();
        let q = q.to_dtype(dtype)?;
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
