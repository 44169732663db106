//! FIRE (Li et al. 2024) as a trainable candle module: the bias
//! `b_h(i, j) = f_θ(ψ(i − j) / (ψ(max(L, i)) + ε))[h]` of
//! [`crate::relative::fire`], differentiable with respect to `c`, the
//! threshold multiplier `ℓ` and the MLP.
//!
//! # Output
//! [`FireBias::forward`] returns the additive logits bias `(1, H, Tq, Tk)`
//! when query and key positions are offsets (shared by the batch) and
//! `(B, H, Tq, Tk)` when either is a `(B, T)` id tensor; add it to the
//! scaled logits `q·k/√d` (broadcast over the batch) and mask as usual
//! (keys after the query get the formula's value in causal mode).
//!
//! # Parameters (names in the [`VarBuilder`], initialisations)
//! As the paper's reference `torch.nn` module, so a state dict maps by name
//! (`L₀` is a constant of the config, not a parameter):
//!
//! | name | shape | initialisation |
//! |---|---|---|
//! | `c` | `()` | `init_c` (0.1) |
//! | `l_multiplier` | `()` | 1 |
//! | `mlp.0.weight` | `(width, 1)` | U(−1, 1) (PyTorch's `nn.Linear`: ±1/√fan_in) |
//! | `mlp.0.bias` | `(width)` | U(−1, 1) |
//! | `mlp.2.weight` | `(H, width)` | U(±1/√width) |
//! | `mlp.2.bias` | `(H)` | U(±1/√width) |
//! | `mlp_future.*` | as `mlp.*` | bidirectional mode only |
//!
//! # How it is computed
//! The MLP input depends on `|i − j|`, on which side of the query the key
//! is (bidirectional), and on the normaliser `max(L, i)`, which is the same
//! for every query below the threshold. The module evaluates the MLP once per
//! distinct (normaliser class, side, distance) — `O(Tq + Tk)` rows instead of
//! `Tq·Tk` while the queries are below `L` (training lengths up to 512 with
//! the default `L₀`) — and expands with an `index_select`, whose backward
//! pass is an `index_add`; when the table would not be smaller than the grid
//! (many queries past `L`, or scattered ids) it evaluates the grid directly.
//! Both paths are the same differentiable expression; the tests compare them
//! with the plain [`Fire`] and with finite differences.
//!
//! ```
//! use candle_core::{DType, Device};
//! use candle_nn::{VarBuilder, VarMap};
//! use posenc::relative::fire::FireConfig;
//! use posenc::tensor::fire::FireBias;
//!
//! let vm = VarMap::new();
//! let vb = VarBuilder::from_varmap(&vm, DType::F32, &Device::Cpu);
//! let fire = FireBias::new(FireConfig::new(4)?, vb.pp("fire"))?;
//! // Queries 6..8 (a KV cache of 6 tokens) against keys 0..8.
//! let bias = fire.forward(2, 8, 6.into(), 0.into())?;
//! assert_eq!(bias.dims(), &[1, 4, 2, 8]);
//! // Gradients reach c, ℓ and the MLP.
//! let grads = bias.sum_all()?.backward()?;
//! assert!(grads.get(fire.c()).is_some());
//! # Ok::<(), posenc::Error>(())
//! ```

use candle_core::{DType, Device, Tensor};
use candle_nn::{Init, VarBuilder};

use super::host::{checked_elements, common_rows, read_positions};
use super::Positions;
#[cfg(doc)]
use crate::error::Error;
use crate::error::Result;
use crate::relative::fire::{Fire, FireConfig, FireMlp, FireMode};

/// The MLP's four tensors.
#[derive(Debug, Clone)]
pub struct FireMlpTensors {
    /// `(width, 1)`.
    pub w1: Tensor,
    /// `(width)`.
    pub b1: Tensor,
    /// `(H, width)`.
    pub w2: Tensor,
    /// `(H)`.
    pub b2: Tensor,
}

impl FireMlpTensors {
    fn new(cfg: &FireConfig, vb: VarBuilder) -> Result<Self> {
        let (w, h) = (cfg.mlp_width, cfg.num_heads);
        let u1 = Init::Uniform { lo: -1.0, up: 1.0 };
        let s = 1.0 / (w as f64).sqrt();
        let u2 = Init::Uniform { lo: -s, up: s };
        Ok(Self {
            w1: vb.get_with_hints((w, 1), "0.weight", u1)?,
            b1: vb.get_with_hints(w, "0.bias", u1)?,
            w2: vb.get_with_hints((h, w), "2.weight", u2)?,
            b2: vb.get_with_hints(h, "2.bias", u2)?,
        })
    }

    fn from_plain(m: &FireMlp, dtype: DType, device: &Device) -> Result<Self> {
        let v = |data: Vec<f64>, shape: (usize, usize)| -> Result<Tensor> {
            Ok(Tensor::from_vec(data, shape, device)?.to_dtype(dtype)?)
        };
        let w = m.w1.len();
        let h = m.b2.len();
        Ok(Self {
            w1: v(m.w1.clone(), (w, 1))?,
            b1: v(m.b1.clone(), (1, w))?.squeeze(0)?,
            w2: v(m.w2.iter().flatten().copied().collect(), (h, w))?,
            b2: v(m.b2.clone(), (1, h))?.squeeze(0)?,
        })
    }

    /// `(M, 1)` inputs → `(M, H)` outputs.
    fn eval(&self, u: &Tensor) -> Result<Tensor> {
        let hidden = u.matmul(&self.w1.t()?)?.broadcast_add(&self.b1)?.relu()?;
        Ok(hidden.matmul(&self.w2.t()?)?.broadcast_add(&self.b2)?)
    }
}

/// FIRE as a trainable module (see the [module docs](self)).
#[derive(Debug, Clone)]
pub struct FireBias {
    cfg: FireConfig,
    c: Tensor,
    l_multiplier: Tensor,
    mlp: FireMlpTensors,
    mlp_future: Option<FireMlpTensors>,
    force_grid: bool,
}

/// The MLP inputs to evaluate: `(distance, normaliser position, after the
/// query)` per row, and how the `(N, Tq, Tk)` grid picks its row.
struct Inputs {
    dist: Vec<f64>,
    norm_pos: Vec<f64>,
    future: Vec<u8>,
    index: Option<Vec<u32>>,
}

impl FireBias {
    /// Parameters in `vb` (names and initialisations in the
    /// [module docs](self)).
    ///
    /// # Errors
    /// As [`FireConfig::validate`]; candle errors from `vb`.
    pub fn new(cfg: FireConfig, vb: VarBuilder) -> Result<Self> {
        cfg.validate()?;
        Ok(Self {
            c: vb.get_with_hints((), "c", Init::Const(cfg.init_c))?,
            l_multiplier: vb.get_with_hints((), "l_multiplier", Init::Const(1.0))?,
            mlp: FireMlpTensors::new(&cfg, vb.pp("mlp"))?,
            mlp_future: match cfg.mode {
                FireMode::Causal => None,
                FireMode::Bidirectional => Some(FireMlpTensors::new(&cfg, vb.pp("mlp_future"))?),
            },
            cfg,
            force_grid: false,
        })
    }

    /// Constant tensors (of `dtype`) holding a plain [`Fire`]'s parameters.
    ///
    /// # Errors
    /// Candle errors.
    pub fn from_plain(fire: &Fire, dtype: DType, device: &Device) -> Result<Self> {
        let scalar = |v: f64| -> Result<Tensor> { Ok(Tensor::new(v, device)?.to_dtype(dtype)?) };
        Ok(Self {
            cfg: *fire.config(),
            c: scalar(fire.c())?,
            l_multiplier: scalar(fire.l_multiplier())?,
            mlp: FireMlpTensors::from_plain(fire.mlp(), dtype, device)?,
            mlp_future: fire
                .mlp_future()
                .map(|m| FireMlpTensors::from_plain(m, dtype, device))
                .transpose()?,
            force_grid: false,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &FireConfig {
        &self.cfg
    }

    /// `c`, a scalar tensor.
    pub fn c(&self) -> &Tensor {
        &self.c
    }

    /// The threshold multiplier `ℓ`, a scalar tensor.
    pub fn l_multiplier(&self) -> &Tensor {
        &self.l_multiplier
    }

    /// The MLP of keys at or before the query.
    pub fn mlp(&self) -> &FireMlpTensors {
        &self.mlp
    }

    /// The MLP of keys after the query (bidirectional mode).
    pub fn mlp_future(&self) -> Option<&FireMlpTensors> {
        self.mlp_future.as_ref()
    }

    /// The bias for `q_len` queries and `k_len` keys at the given positions:
    /// `(1, H, Tq, Tk)` for offsets, `(B, H, Tq, Tk)` when either positions
    /// are a `(B, T)` id tensor (see the [module docs](self)).
    ///
    /// # Errors
    /// [`Error::Shape`] for id tensors that are not `(B, len)` or whose `B`
    /// differ; [`Error::DType`] / [`Error::NegativePosition`] for bad ids;
    /// [`Error::PositionOutOfRange`] for positions above `i64::MAX`;
    /// [`Error::InvalidValue`] for a grid above 2^31 elements; candle errors.
    pub fn forward(
        &self,
        q_len: usize,
        k_len: usize,
        q_pos: Positions<'_>,
        k_pos: Positions<'_>,
    ) -> Result<Tensor> {
        let h = self.cfg.num_heads;
        checked_elements("FIRE bias", &[h, q_len, k_len])?;
        let qp = read_positions(q_pos, q_len, "FIRE query position ids")?;
        let kp = read_positions(k_pos, k_len, "FIRE key position ids")?;
        let rows = common_rows(&qp, &kp)?;
        let n = rows.unwrap_or(1);
        let cells = checked_elements("FIRE bias", &[n, h, q_len, k_len])? / h;
        crate::relative::check_signed([qp.max(), kp.max()], "FIRE positions (subtracted as i64)")?;
        let dtype = self.c.dtype();
        let device = self.c.device();
        if cells == 0 {
            return Ok(Tensor::zeros((n, h, q_len, k_len), dtype, device)?);
        }
        let thr = (&self.l_multiplier * self.cfg.init_l)?.abs()?;
        let thr_value = thr.to_dtype(DType::F64)?.to_scalar::<f64>()?;
        let bidi = self.mlp_future.is_some();
        let inputs = Self::inputs(&qp, &kp, n, thr_value, bidi, cells, self.force_grid);
        checked_elements(
            "FIRE hidden layer",
            &[inputs.dist.len(), self.cfg.mlp_width],
        )?;

        let m = inputs.dist.len();
        let col = |v: Vec<f64>| -> Result<Tensor> {
            Ok(Tensor::from_vec(v, (m, 1), device)?.to_dtype(dtype)?)
        };
        let dist = col(inputs.dist)?;
        let norm_pos = col(inputs.norm_pos)?;
        // u = log(|c·d| + 1) / (log(|c·max(i, L)| + 1) + ε)
        let num = (dist.broadcast_mul(&self.c)?.abs()? + 1.0)?.log()?;
        let den = ((norm_pos
            .broadcast_maximum(&thr)?
            .broadcast_mul(&self.c)?
            .abs()?
            + 1.0)?
            .log()?
            + self.cfg.eps)?;
        let u = (num / den)?;
        let mut out = self.mlp.eval(&u)?; // (M, H)
        if let Some(future) = &self.mlp_future {
            let mask = Tensor::from_vec(inputs.future, (m, 1), device)?.broadcast_as((m, h))?;
            out = mask.where_cond(&future.eval(&u)?, &out)?;
        }
        if let Some(index) = inputs.index {
            let idx = Tensor::from_vec(index, cells, device)?;
            out = out.index_select(&idx, 0)?;
        }
        Ok(out
            .reshape((n, q_len, k_len, h))?
            .permute((0, 3, 1, 2))?
            .contiguous()?)
    }

    /// The distinct MLP inputs and the grid's index into them (see the
    /// [module docs](self)).
    fn inputs(
        qp: &super::host::HostPositions,
        kp: &super::host::HostPositions,
        n: usize,
        thr: f64,
        bidi: bool,
        cells: usize,
        force_grid: bool,
    ) -> Inputs {
        let (tq, tk) = (qp.len, kp.len);
        // Normaliser classes: every query below the threshold shares class 0
        // (represented by the smallest such position); each distinct
        // position at or above it is its own class.
        let below: Vec<u64> = qp
            .data
            .iter()
            .copied()
            .filter(|&p| (p as f64) < thr)
            .collect();
        let rep = below.iter().copied().min();
        let mut above: Vec<u64> = qp
            .data
            .iter()
            .copied()
            .filter(|&p| (p as f64) >= thr)
            .collect();
        above.sort_unstable();
        above.dedup();
        let class_of = |p: u64| -> usize {
            if (p as f64) < thr {
                0
            } else {
                usize::from(rep.is_some()) + above.binary_search(&p).unwrap_or(0)
            }
        };
        let class_pos: Vec<u64> = rep.into_iter().chain(above.iter().copied()).collect();
        let (mut dmin, mut dmax) = (u64::MAX, 0u64);
        for b in 0..n {
            for i in 0..tq {
                let q = qp.get(b, i);
                for j in 0..tk {
                    let d = q.abs_diff(kp.get(b, j));
                    dmin = dmin.min(d);
                    dmax = dmax.max(d);
                }
            }
        }
        let sides = if bidi { 2 } else { 1 };
        let span = dmax - dmin + 1;
        let table = (class_pos.len() as u64)
            .checked_mul(sides)
            .and_then(|x| x.checked_mul(span))
            .filter(|&x| !force_grid && x <= cells as u64 && x <= u32::MAX as u64);
        let side = |q: u64, k: u64| usize::from(bidi && k > q);
        match table {
            Some(size) => {
                let size = size as usize;
                let span = span as usize;
                let mut dist = Vec::with_capacity(size);
                let mut norm_pos = Vec::with_capacity(size);
                let mut future = Vec::with_capacity(size);
                for &p in &class_pos {
                    for s in 0..sides as usize {
                        for d in 0..span {
                            dist.push((dmin + d as u64) as f64);
                            norm_pos.push(p as f64);
                            future.push(s as u8);
                        }
                    }
                }
                let mut index = Vec::with_capacity(cells);
                for b in 0..n {
                    for i in 0..tq {
                        let q = qp.get(b, i);
                        let base = class_of(q) * sides as usize;
                        for j in 0..tk {
                            let k = kp.get(b, j);
                            let row = (base + side(q, k)) * span + (q.abs_diff(k) - dmin) as usize;
                            index.push(row as u32);
                        }
                    }
                }
                Inputs {
                    dist,
                    norm_pos,
                    future,
                    index: Some(index),
                }
            }
            None => {
                let mut dist = Vec::with_capacity(cells);
                let mut norm_pos = Vec::with_capacity(cells);
                let mut future = Vec::with_capacity(cells);
                for b in 0..n {
                    for i in 0..tq {
                        let q = qp.get(b, i);
                        for j in 0..tk {
                            let k = kp.get(b, j);
                            dist.push(q.abs_diff(k) as f64);
                            norm_pos.push(q as f64);
                            future.push(side(q, k) as u8);
                        }
                    }
                }
                Inputs {
                    dist,
                    norm_pos,
                    future,
                    index: None,
                }
            }
        }
    }

    /// A copy of this bias whose [`forward`](Self::forward) evaluates the
    /// MLP on the whole grid without the distinct-input table: the direct
    /// path, for tests and comparison.
    pub fn direct(&self) -> Self {
        let mut direct = self.clone();
        direct.force_grid = true;
        direct
    }
}
