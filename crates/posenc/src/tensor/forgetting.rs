//! Forgetting attention (Lin et al. 2025) as a trainable candle module: the
//! forget gate of [`crate::relative::forgetting`], its cumulative log `c` and
//! the bias `c_i − c_j`, differentiable with respect to the gate's weights
//! and the hidden states.
//!
//! # Outputs
//! - [`ForgettingBias::log_forget`]: `log f`, `(B, H, T)` (what a KV cache
//!   stores next to the keys, as the reference does);
//! - [`ForgettingBias::cumulative`] / [`cumulative_log_forget`]: `c`,
//!   `(B, H, T)`, continued from the `c` of the last cached token when given;
//!   the compact form a fused attention takes (bias = `c_i − c_j`);
//! - [`forget_bias`] / [`ForgettingBias::bias`]: the additive logits bias
//!   `(B, H, Tq, Tk)`, to add to the scaled logits `q·k/√d` under the usual
//!   causal mask (keys after the query hold `c_i − c_j ≥ 0`, the formula's
//!   value, which the mask hides).
//!
//! Forgetting attention has no position ids: `c` runs over the tokens in
//! their order. The queries are located by their index among the keys —
//! `Positions::Offset(o)`: queries are keys `o..o + Tq` (with a KV cache of
//! `o` tokens, the reference's `Tk − Tq`); `Positions::Ids` `(B, Tq)`: each
//! row's key indices.
//!
//! # Parameters (names in the [`VarBuilder`], initialisations)
//! As the reference's `fgate_proj = nn.Linear(hidden_size, num_heads)`:
//! `weight` `(H, D)` ~ N(0, `init_std`²) (0.02), `bias` `(H)` = 0. With
//! [`ForgetBiasInit::DecayTimes`](crate::relative::forgetting::ForgetBiasInit)
//! the parameter `bias` still starts at 0 and the module adds the constant
//! per-head decay-time bias `b₀` of the config to it (a `VarBuilder` can only
//! initialise a tensor to a constant or a distribution).
//!
//! `log σ` is a custom op on the CPU (value `min(z, 0) − log1p(e^(−|z|))`,
//! exact derivative `σ(−z)`), `f32` or `f64`; other dtypes are computed in
//! `f32` (the reference computes the gates in `f32`). The cumulative sum is
//! [`cumsum_last`] (`O(T)`, summed in `f64`).
//!
//! ```
//! use candle_core::{DType, Device, Tensor};
//! use candle_nn::{VarBuilder, VarMap};
//! use posenc::relative::forgetting::ForgetGateConfig;
//! use posenc::tensor::forgetting::{forget_bias, ForgettingBias};
//!
//! let vm = VarMap::new();
//! let vb = VarBuilder::from_varmap(&vm, DType::F32, &Device::Cpu);
//! let fox = ForgettingBias::new(ForgetGateConfig::new(16, 4)?, vb.pp("fgate_proj"))?;
//! let x = Tensor::randn(0f32, 1.0, (2, 10, 16), &Device::Cpu)?;
//! let c = fox.cumulative(&x, None)?; // (B, H, T)
//! assert_eq!(c.dims(), &[2, 4, 10]);
//! // Decoding: the last 3 tokens as queries against all 10 keys.
//! let bias = forget_bias(&c, 7.into(), 3)?;
//! assert_eq!(bias.dims(), &[2, 4, 3, 10]);
//! // A KV cache continues c from its last value.
//! let c_head = fox.cumulative(&x.narrow(1, 0, 7)?, None)?;
//! let last = c_head.narrow(2, 6, 1)?.squeeze(2)?;
//! let c_tail = fox.cumulative(&x.narrow(1, 7, 3)?, Some(&last))?;
//! let diff = (c_tail - c.narrow(2, 7, 3)?)?.abs()?.max_all()?.to_scalar::<f32>()?;
//! assert!(diff < 1e-5);
//! # Ok::<(), posenc::Error>(())
//! ```

use candle_core::{CpuStorage, CustomOp1, DType, Device, Layout, Shape, Tensor};
use candle_nn::{Init, VarBuilder};

use super::host::{checked_elements, read_positions};
use super::scan::cumsum_last;
use super::Positions;
use crate::error::{Error, Result};
use crate::relative::forgetting::{ForgetGate, ForgetGateConfig};

#[derive(Debug, Clone, Copy)]
struct LogSigmoid;

fn log_sigmoid_f64(z: f64) -> f64 {
    z.min(0.0) - (-z.abs()).exp().ln_1p()
}

impl CustomOp1 for LogSigmoid {
    fn name(&self) -> &'static str {
        "posenc-log-sigmoid"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        super::scan::float_op(
            "log-sigmoid",
            s,
            l,
            |v| {
                v.iter()
                    .map(|&z| log_sigmoid_f64(f64::from(z)) as f32)
                    .collect()
            },
            |v| v.iter().map(|&z| log_sigmoid_f64(z)).collect(),
        )
    }

    /// `d/dz log σ(z) = 1 − σ(z) = σ(−z)`.
    fn bwd(
        &self,
        arg: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<Option<Tensor>> {
        let s = candle_nn::ops::sigmoid(&arg.neg()?)?;
        Ok(Some(grad.mul(&s)?))
    }
}

/// `log σ(z)` elementwise, differentiable (see the [module docs](self)).
///
/// # Errors
/// Candle errors.
pub fn log_sigmoid(z: &Tensor) -> Result<Tensor> {
    if !z.device().is_cpu() {
        // min(z, 0) − log(1 + e^(−|z|)); at z = 0 exactly candle's abs
        // gradient is +1, so this path's derivative there is 1, not ½.
        let soft = (z.abs()?.neg()?.exp()? + 1.0)?.log()?;
        return Ok((z.minimum(0.0)? - soft)?);
    }
    match z.dtype() {
        DType::F32 | DType::F64 => Ok(z.contiguous()?.apply_op1(LogSigmoid)?),
        other => Ok(z
            .to_dtype(DType::F32)?
            .contiguous()?
            .apply_op1(LogSigmoid)?
            .to_dtype(other)?),
    }
}

/// `c[…, t] = start[…] + Σ_{l ≤ t} log_f[…, l]` for `log_f` of shape
/// `(B, H, T)` and `start` `(B, H)` (the `c` of the last cached token; zero
/// when `None`).
///
/// # Errors
/// [`Error::Shape`] for `log_f` not of rank 3 or `start` not `(B, H)`;
/// candle errors.
pub fn cumulative_log_forget(log_f: &Tensor, start: Option<&Tensor>) -> Result<Tensor> {
    let (b, h, _) = log_f.dims3().map_err(|_| Error::Shape {
        what: "log forget gates",
        expected: "(B, H, T)".into(),
        got: format!("{:?}", log_f.dims()),
    })?;
    let c = cumsum_last(log_f)?;
    match start {
        None => Ok(c),
        Some(s) => {
            if s.dims() != [b, h] {
                return Err(Error::Shape {
                    what: "cumulative start",
                    expected: format!("({b}, {h})"),
                    got: format!("{:?}", s.dims()),
                });
            }
            Ok(c.broadcast_add(&s.to_dtype(c.dtype())?.unsqueeze(2)?)?)
        }
    }
}

/// The bias `c_i − c_j`, `(B, H, Tq, Tk)`, for the cumulative vector `c`
/// of the `Tk` keys, `(B, H, Tk)`, and `q_len` queries located among the
/// keys by `queries` (see the [module docs](self)).
///
/// # Errors
/// [`Error::Shape`] for `c` not of rank 3, queries past the keys, or ids not
/// `(B, Tq)`; [`Error::DType`] / [`Error::NegativePosition`] for bad ids;
/// [`Error::InvalidValue`] for a bias above 2^31 elements; candle errors.
pub fn forget_bias(c: &Tensor, queries: Positions<'_>, q_len: usize) -> Result<Tensor> {
    let (b, h, tk) = c.dims3().map_err(|_| Error::Shape {
        what: "cumulative log forget gates c",
        expected: "(B, H, Tk)".into(),
        got: format!("{:?}", c.dims()),
    })?;
    checked_elements("forgetting attention bias", &[b, h, q_len, tk])?;
    let qp = read_positions(queries, q_len, "forgetting attention query indices")?;
    if qp.rows.is_some_and(|r| r != b) {
        return Err(Error::Shape {
            what: "forgetting attention query indices",
            expected: format!("({b}, {q_len})"),
            got: format!("({}, {q_len})", qp.rows.unwrap_or(0)),
        });
    }
    if q_len > 0 && qp.max() >= tk as u64 {
        return Err(Error::Shape {
            what: "forgetting attention queries",
            expected: format!("key indices below Tk = {tk}"),
            got: format!("index {}", qp.max()),
        });
    }
    let c_q = match qp.rows {
        None => c.narrow(2, qp.data.first().map_or(0, |&o| o as usize), q_len)?,
        Some(_) => {
            let mut idx = Vec::with_capacity(b * h * q_len);
            for bi in 0..b {
                for hi in 0..h {
                    let base = ((bi * h + hi) * tk) as i64;
                    idx.extend((0..q_len).map(|i| base + qp.get(bi, i) as i64));
                }
            }
            let idx = Tensor::from_vec(idx, b * h * q_len, c.device())?;
            c.flatten_all()?
                .index_select(&idx, 0)?
                .reshape((b, h, q_len))?
        }
    };
    Ok(c_q.unsqueeze(3)?.broadcast_sub(&c.unsqueeze(2)?)?)
}

/// The forget gate as a trainable module (see the [module docs](self)).
#[derive(Debug, Clone)]
pub struct ForgettingBias {
    num_heads: usize,
    hidden_size: usize,
    weight: Tensor,
    bias: Tensor,
    bias_offset: Option<Tensor>,
}

impl ForgettingBias {
    /// `weight` `(H, D)` and `bias` `(H)` in `vb` (initialisations in the
    /// [module docs](self)).
    ///
    /// # Errors
    /// As [`ForgetGateConfig::validate`]; candle errors from `vb`.
    pub fn new(cfg: ForgetGateConfig, vb: VarBuilder) -> Result<Self> {
        cfg.validate()?;
        let (h, d) = (cfg.num_heads, cfg.hidden_size);
        let weight = vb.get_with_hints(
            (h, d),
            "weight",
            Init::Randn {
                mean: 0.0,
                stdev: cfg.init_std,
            },
        )?;
        let bias = vb.get_with_hints(h, "bias", Init::Const(0.0))?;
        let b0 = cfg.initial_bias();
        let bias_offset = if b0.iter().all(|&v| v == 0.0) {
            None
        } else {
            Some(Tensor::from_vec(b0, h, vb.device())?.to_dtype(vb.dtype())?)
        };
        Ok(Self {
            num_heads: h,
            hidden_size: d,
            weight,
            bias,
            bias_offset,
        })
    }

    /// Constant tensors (of `dtype`) holding a plain [`ForgetGate`]'s
    /// weights.
    ///
    /// # Errors
    /// Candle errors.
    pub fn from_plain(gate: &ForgetGate, dtype: DType, device: &Device) -> Result<Self> {
        let (h, d) = (gate.num_heads(), gate.hidden_size());
        let w: Vec<f64> = gate.weight().iter().flatten().copied().collect();
        Ok(Self {
            num_heads: h,
            hidden_size: d,
            weight: Tensor::from_vec(w, (h, d), device)?.to_dtype(dtype)?,
            bias: Tensor::from_vec(gate.bias().to_vec(), h, device)?.to_dtype(dtype)?,
            bias_offset: None,
        })
    }

    /// The weights `(H, D)`.
    pub fn weight(&self) -> &Tensor {
        &self.weight
    }

    /// The bias parameter `(H)` (without the decay-time offset, if any).
    pub fn bias_param(&self) -> &Tensor {
        &self.bias
    }

    /// Number of heads.
    pub fn num_heads(&self) -> usize {
        self.num_heads
    }

    /// `log f = log σ(x·Wᵀ + b)`, `(B, H, T)`, for hidden states `x`
    /// `(B, T, D)` (computed in the weights' dtype, returned in it).
    ///
    /// # Errors
    /// [`Error::Shape`] for `x` not `(B, T, D)`; candle errors.
    pub fn log_forget(&self, x: &Tensor) -> Result<Tensor> {
        let d = self.hidden_size;
        let (b, t) = match x.dims() {
            &[b, t, xd] if xd == d => (b, t),
            dims => {
                return Err(Error::Shape {
                    what: "forget gate input x",
                    expected: format!("(B, T, {d})"),
                    got: format!("{dims:?}"),
                })
            }
        };
        checked_elements("forget gates", &[b, self.num_heads, t])?;
        let x = x.to_dtype(self.weight.dtype())?;
        let mut bias = self.bias.clone();
        if let Some(off) = &self.bias_offset {
            bias = (bias + off)?;
        }
        let z = x
            .broadcast_matmul(&self.weight.t()?)?
            .broadcast_add(&bias)?; // (B, T, H)
        log_sigmoid(&z.transpose(1, 2)?)
    }

    /// `c`, `(B, H, T)`, for hidden states `x` `(B, T, D)`, continued from
    /// `start` `(B, H)` (the `c` of the last cached token) when given.
    ///
    /// # Errors
    /// As [`ForgettingBias::log_forget`] and [`cumulative_log_forget`].
    pub fn cumulative(&self, x: &Tensor, start: Option<&Tensor>) -> Result<Tensor> {
        cumulative_log_forget(&self.log_forget(x)?, start)
    }

    /// The bias `(B, H, Tq, Tk)` for all `Tk` tokens `x` `(B, Tk, D)` as keys
    /// and `q_len` of them as queries, located by `queries` (see
    /// [`forget_bias`]).
    ///
    /// # Errors
    /// As [`ForgettingBias::cumulative`] and [`forget_bias`].
    pub fn bias(&self, x: &Tensor, queries: Positions<'_>, q_len: usize) -> Result<Tensor> {
        forget_bias(&self.cumulative(x, None)?, queries, q_len)
    }
}
