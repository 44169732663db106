//! Forgetting attention, Lin, Nikishin, He and Courville 2025, *Forgetting
//! Transformer: Softmax Attention with a Forget Gate* (ICLR 2025,
//! arXiv:2503.02130): a data-dependent ALiBi.
//!
//! Every head has a scalar forget gate per token, computed from the token's
//! hidden state, and the attention weight of key `j` for query `i` is
//! multiplied by the product of the gates in between. In the logits this is
//! an additive bias, the difference of a cumulative sum:
//!
//! ```text
//! f_t^h   = σ(w_h · x_t + b_h)                     forget gate, in (0, 1)
//! c_i^h   = Σ_{l ≤ i} log f_l^h                     cumulative log gate (≤ 0, decreasing)
//! b_h(i, j) = c_i^h − c_j^h = Σ_{l=j+1}^{i} log f_l^h     (j ≤ i)
//! logits_ij = q_i · k_j / √d + b_h(i, j)
//! ```
//!
//! With a constant gate `f = σ(b)` the bias is `−(i − j)·log(1/f)`: ALiBi
//! with slope `−log f`. Data-dependent gates let a head forget at a
//! boundary and remember across filler. The paper uses no other positional
//! encoding (no RoPE).
//!
//! Read from the paper's reference code (`zhixuan-lin/forgetting-transformer`:
//! `ForgettingAttentionLayer`, `forgetting_attention`):
//! - `fgate_proj = nn.Linear(hidden_size, num_heads, bias=True)`, weights
//!   N(0, 0.02²) and bias 0 (its `initializer_range`), `log f` by
//!   `logsigmoid` in `f32`;
//! - the cumulative sum runs over the whole key sequence (the cache stores
//!   `log f` of every past token) and queries are the last `Tq` of the `Tk`
//!   keys: query `m` reads `c` at key index `Tk − Tq + m`;
//! - the bias is added to the scaled logits, unscaled; keys after the query
//!   are masked by the causal attention (only causal attention is
//!   supported there). For them `c_i − c_j ≥ 0` here: the formula's value,
//!   hidden by the mask;
//! - its data-independent variant initialises the bias per head from decay
//!   times `τ_h` log-spaced in `[T_min, T_max]`: `b_h = −log(expm1(1/τ_h))`,
//!   so that `−1/log σ(b_h) = τ_h` ([`ForgetBiasInit::DecayTimes`]).
//!
//! Only the forget gate is here; the paper's "Pro" block (output gate, QK
//! norm, key/value shift) is a model choice, not a positional encoding.
//!
//! # Shapes
//! Hidden states `[T][D]`; weights `[H][D]`, bias `[H]`; log gates and `c`
//! `[H][T]`; bias matrices `[Tq][Tk]` per head.
//!
//! # Errors
//! Zero heads ([`Error::ZeroHeads`]); `D = 0` or sizes above the limits
//! ([`Error::InvalidDimension`], [`Error::InvalidValue`]); inputs or weights
//! of the wrong shape ([`Error::Shape`]); non-finite weights
//! ([`Error::NotFinite`]); a decay-time range that is not `0 < T_min ≤
//! T_max` ([`Error::InvalidFactor`], [`Error::InvalidValue`]).
//!
//! ```
//! use posenc::relative::forgetting::ForgetGate;
//!
//! // One head, D = 1, w = 0, b = 0: every gate is ½, c_t = −(t + 1)·ln 2.
//! let gate = ForgetGate::from_weights(vec![vec![0.0]], vec![0.0])?;
//! let x = vec![vec![0.3]; 4];
//! let c = gate.cumulative(&x)?;
//! assert!((c[0][3] + 4.0 * 2f64.ln()).abs() < 1e-12);
//! // b(i, j) = c_i − c_j = −(i − j)·ln 2: ALiBi with slope ln 2.
//! let b = gate.bias_matrix(&c[0], 0, 4)?;
//! assert!((b[3][1] + 2.0 * 2f64.ln()).abs() < 1e-12);
//! # Ok::<(), posenc::Error>(())
//! ```

use crate::encoding::{positional_encoding, Hooks};
use crate::error::{check_positive, Error, Result};

/// Largest accepted number of heads.
pub const MAX_HEADS: usize = 1 << 16;
/// Largest accepted hidden size.
pub const MAX_HIDDEN: usize = 1 << 20;
/// Largest accepted weight count `H × D`.
pub const MAX_WEIGHTS: usize = 1 << 28;

/// How the gate's bias starts.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum ForgetBiasInit {
    /// Zero, as the reference's data-dependent gate (`f ≈ ½` at first).
    #[default]
    Zeros,
    /// `b_h = −log(expm1(1/τ_h))`, `τ_h` log-spaced from `min` to `max`
    /// (head 0 gets `min`): head `h` forgets with time constant `τ_h`
    /// tokens. The reference uses it for its data-independent gate.
    DecayTimes {
        /// `T_min` (> 0).
        min: f64,
        /// `T_max` (≥ `T_min`).
        max: f64,
    },
}

/// The forget gate's sizes and initialisation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ForgetGateConfig {
    /// Hidden size `D` of the tokens the gate reads.
    pub hidden_size: usize,
    /// Number of heads `H`.
    pub num_heads: usize,
    /// Standard deviation of the weights at initialisation (default 0.02).
    pub init_std: f64,
    /// The bias at initialisation (default zeros).
    pub bias_init: ForgetBiasInit,
}

impl ForgetGateConfig {
    /// The reference's initialisation: weights N(0, 0.02²), bias 0.
    ///
    /// # Errors
    /// As [`ForgetGateConfig::validate`].
    pub fn new(hidden_size: usize, num_heads: usize) -> Result<Self> {
        let cfg = Self {
            hidden_size,
            num_heads,
            init_std: 0.02,
            bias_init: ForgetBiasInit::Zeros,
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// This config with another bias initialisation.
    ///
    /// # Errors
    /// As [`ForgetGateConfig::validate`].
    pub fn with_bias_init(mut self, init: ForgetBiasInit) -> Result<Self> {
        self.bias_init = init;
        self.validate()?;
        Ok(self)
    }

    /// Checks every field.
    ///
    /// # Errors
    /// [`Error::ZeroHeads`]; [`Error::InvalidDimension`] for `D = 0`;
    /// [`Error::InvalidValue`] for sizes above [`MAX_HEADS`],
    /// [`MAX_HIDDEN`], [`MAX_WEIGHTS`] or a decay range with `max < min`;
    /// [`Error::InvalidFactor`] for a non-positive `init_std` or decay time;
    pub fn validate(&self) -> Result<()> {
        if self.num_heads == 0 {
            return Err(Error::ZeroHeads);
        }
        if self.hidden_size == 0 {
            return Err(Error::InvalidDimension {
                what: "hidden_size",
                value: 0,
                reason: "must be at least 1",
            });
        }
        if self.num_heads > MAX_HEADS
            || self.hidden_size > MAX_HIDDEN
            || self.num_heads * self.hidden_size > MAX_WEIGHTS
        {
            return Err(Error::invalid(
                "forget gate size",
                format!(
                    "{} heads × hidden size {} exceeds the limits ({MAX_HEADS} heads, \
                     hidden size {MAX_HIDDEN}, {MAX_WEIGHTS} weights)",
                    self.num_heads, self.hidden_size
                ),
            ));
        }
        check_positive("init_std", self.init_std)?;
        if let ForgetBiasInit::DecayTimes { min, max } = self.bias_init {
            check_positive("decay_time_min", min)?;
            check_positive("decay_time_max", max)?;
            if max < min {
                return Err(Error::invalid(
                    "decay_time_max",
                    format!("{max} is below decay_time_min = {min}"),
                ));
            }
        }
        Ok(())
    }

    /// The initial bias per head.
    pub fn initial_bias(&self) -> Vec<f64> {
        match self.bias_init {
            ForgetBiasInit::Zeros => vec![0.0; self.num_heads],
            ForgetBiasInit::DecayTimes { min, max } => {
                let n = self.num_heads;
                (0..n)
                    .map(|h| {
                        let t = if n == 1 {
                            0.0
                        } else {
                            h as f64 / (n - 1) as f64
                        };
                        let tau = (min.ln() + t * (max.ln() - min.ln())).exp();
                        -(1.0 / tau).exp_m1().ln()
                    })
                    .collect()
            }
        }
    }
}

/// `log σ(z)`, stable for large `|z|`: `min(z, 0) − log(1 + e^(−|z|))`.
pub fn log_sigmoid(z: f64) -> f64 {
    z.min(0.0) - (-z.abs()).exp().ln_1p()
}

/// The forget gate with its weights in `f64`: the reference the candle
/// module [`tensor::forgetting::ForgettingBias`](crate::tensor::forgetting::ForgettingBias)
/// is tested against (see the [module docs](self)).
#[derive(Debug, Clone, PartialEq)]
pub struct ForgetGate {
    weight: Vec<Vec<f64>>,
    bias: Vec<f64>,
}

impl ForgetGate {
    /// Weights drawn N(0, init_std²) from a generator seeded with `seed`,
    /// bias as the config says.
    ///
    /// # Errors
    /// As [`ForgetGateConfig::validate`].
    pub fn random(cfg: ForgetGateConfig, seed: u64) -> Result<Self> {
        cfg.validate()?;
        let mut rng = crate::absolute::SeededRng::new(seed);
        Ok(Self {
            weight: rng.normal_matrix(cfg.num_heads, cfg.hidden_size, cfg.init_std),
            bias: cfg.initial_bias(),
        })
    }

    /// Given weights `[H][D]` and bias `[H]`.
    ///
    /// # Errors
    /// [`Error::ZeroHeads`] for no rows; [`Error::Shape`] for ragged weights or
    /// a bias of another length; [`Error::NotFinite`] for NaN or infinite
    /// entries; [`ForgetGateConfig::validate`]'s size limits.
    pub fn from_weights(weight: Vec<Vec<f64>>, bias: Vec<f64>) -> Result<Self> {
        if weight.is_empty() {
            return Err(Error::ZeroHeads);
        }
        let d = crate::absolute::check_matrix("forget gate weight", &weight, None, None)?;
        ForgetGateConfig::new(d, weight.len())?;
        crate::absolute::check_matrix(
            "forget gate bias",
            std::slice::from_ref(&bias),
            Some(1),
            Some(weight.len()),
        )?;
        Ok(Self { weight, bias })
    }

    /// Number of heads `H`.
    pub fn num_heads(&self) -> usize {
        self.weight.len()
    }

    /// Hidden size `D`.
    pub fn hidden_size(&self) -> usize {
        self.weight[0].len()
    }

    /// The weights, `[H][D]`.
    pub fn weight(&self) -> &[Vec<f64>] {
        &self.weight
    }

    /// The bias, `[H]`.
    pub fn bias(&self) -> &[f64] {
        &self.bias
    }

    /// `log f_t^h = log σ(w_h · x_t + b_h)`, `[H][T]`, for hidden states
    /// `x` of shape `[T][D]`.
    ///
    /// # Errors
    /// [`Error::Shape`] if a row of `x` does not have length `D`.
    pub fn log_forget(&self, x: &[Vec<f64>]) -> Result<Vec<Vec<f64>>> {
        let d = self.hidden_size();
        if let Some((t, row)) = x.iter().enumerate().find(|(_, r)| r.len() != d) {
            return Err(Error::Shape {
                what: "forget gate input x",
                expected: format!("{d} columns"),
                got: format!("{} columns in row {t}", row.len()),
            });
        }
        Ok(self
            .weight
            .iter()
            .zip(&self.bias)
            .map(|(w, b)| {
                x.iter()
                    .map(|xt| log_sigmoid(w.iter().zip(xt).map(|(a, c)| a * c).sum::<f64>() + b))
                    .collect()
            })
            .collect())
    }

    /// `c_t^h = Σ_{l ≤ t} log f_l^h`, `[H][T]`.
    ///
    /// # Errors
    /// As [`ForgetGate::log_forget`].
    pub fn cumulative(&self, x: &[Vec<f64>]) -> Result<Vec<Vec<f64>>> {
        Ok(self
            .log_forget(x)?
            .into_iter()
            .map(|row| {
                row.iter()
                    .scan(0.0, |s, v| {
                        *s += v;
                        Some(*s)
                    })
                    .collect()
            })
            .collect())
    }

    /// One head's bias `c_i − c_j`, `[Tq][Tk]`, for the cumulative vector
    /// `c` of the `Tk` keys and the queries at key indices
    /// `q_offset..q_offset + q_len` (the last `Tq` keys in a decoder with a
    /// KV cache: `q_offset = Tk − Tq`).
    ///
    /// # Errors
    /// [`Error::Shape`] if `q_offset + q_len > Tk`.
    pub fn bias_matrix(&self, c: &[f64], q_offset: usize, q_len: usize) -> Result<Vec<Vec<f64>>> {
        if q_offset.checked_add(q_len).is_none_or(|e| e > c.len()) {
            return Err(Error::Shape {
                what: "forgetting attention queries",
                expected: format!("q_offset + q_len ≤ {} keys", c.len()),
                got: format!("{q_offset} + {q_len}"),
            });
        }
        Ok(c[q_offset..q_offset + q_len]
            .iter()
            .map(|ci| c.iter().map(|cj| ci - cj).collect())
            .collect())
    }
}

positional_encoding!(ForgetGate, Hooks::LOGITS, |s| format!(
    "forgetting attention ({} heads)",
    s.num_heads()
));
