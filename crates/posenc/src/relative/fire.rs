//! FIRE, Li, You, Guruganesh, Ainslie, Ontañón, Zaheer, Sanghai, Yang, Kumar
//! and Bhojanapalli 2024, *Functional Interpolation for Relative Positions
//! Improves Long Context Transformers* (ICLR 2024, arXiv:2310.04418).
//!
//! An additive attention bias given by a small learned function of the
//! relative distance, normalised by the query position ("progressive
//! interpolation"), so that every distance the model sees at any length
//! falls into the range it was trained on:
//!
//! ```text
//! b_h(i, j) = f_θ( ψ(i − j) / ψ(max(L, i)) )[h]            (query i, key j ≤ i)
//! ψ(x)      = log(|c·x| + 1)
//! f_θ(u)    = W₂ · relu(w₁·u + b₁) + b₂                     (1 → width → H)
//! L         = |ℓ · L₀|
//! ```
//!
//! `c` (the log transform's slope) and `ℓ` (a multiplier of the threshold
//! `L₀`) are learned scalars, `f_θ` is an MLP with one hidden ReLU layer of
//! `mlp_width` units and one output per head. While `i < L` the denominator is
//! the constant `ψ(L)` and FIRE is a learned function of the distance (it can
//! represent T5's buckets, ALiBi and Kerple, the paper's Theorem 3.1); past
//! `L` the distances are interpolated into `[0, 1]`.
//!
//! Exactly the paper's reference code (its appendix, *FIRE implementation in
//! PyTorch*): the denominator is `ψ(max(L, i)) + ε` with `ε = 10⁻⁶` (it keeps
//! `0/0` away at `i = 0` when `L` has been trained to 0), `L₀ = 512`, initial
//! `c = 0.1`, initial `ℓ = 1`, `mlp_width = 32`; `L₀` itself is not trained
//! (`requires_grad=False` there) — only `ℓ` is.
//!
//! # Causal and bidirectional
//! The paper defines and evaluates FIRE for causal attention (`j ≤ i`). Its
//! reference code takes `|c·(i − j)|`, so for a key after the query
//! ([`FireMode::Causal`], entries a causal mask hides) the bias is the
//! formula at `|i − j|`: symmetric in the distance. A symmetric bias cannot
//! tell which of two tokens comes first, so posenc's
//! [`FireMode::Bidirectional`] (an extension, not in the paper) gives keys
//! after the query their own MLP `f_θ'` (same shape, same normaliser):
//! `b_h(i, j) = f_θ'(ψ(j − i) / ψ(max(L, i)))[h]` for `j > i`.
//!
//! # Shapes
//! `num_heads` outputs per (query, key) pair; positions are absolute
//! (`u64`), so a query slice at positions `p..p + Tq` against a KV cache at
//! `0..Tk` gets the rows of the full computation.
//!
//! # Errors
//! Zero heads ([`Error::ZeroHeads`]); `mlp_width = 0` or too large
//! ([`Error::InvalidDimension`]); `c`, `L₀` not finite and > 0
//! ([`Error::InvalidFactor`]); `ε` negative or not finite, `ℓ` or weights not
//! finite ([`Error::NotFinite`], [`Error::InvalidValue`]); weights of the
//! wrong shape ([`Error::Shape`]); a head out of range or positions above
//! `i64::MAX` ([`Error::InvalidValue`], [`Error::PositionOutOfRange`]).
//!
//! ```
//! use posenc::relative::fire::{Fire, FireConfig};
//! use posenc::AttentionBias;
//!
//! let cfg = FireConfig::new(4)?; // 4 heads, width 32, c = 0.1, L₀ = 512
//! let fire = Fire::random(cfg, 0)?;
//! // Below the threshold the normaliser is ψ(512): a function of i − j only.
//! assert_eq!(fire.bias(1, 10, 7)?, fire.bias(1, 100, 97)?);
//! let u = fire.normalized_distance(10, 7)?;
//! assert!((u - (1.0f64 + 0.1 * 3.0).ln() / ((1.0f64 + 0.1 * 512.0).ln() + 1e-6)).abs() < 1e-15);
//! # Ok::<(), posenc::Error>(())
//! ```

use crate::encoding::{positional_encoding, AttentionBias, Hooks};
use crate::error::{check_finite, check_positive, Error, Result};

/// Largest accepted `mlp_width`.
pub const MAX_MLP_WIDTH: usize = 1 << 16;
/// Largest accepted number of heads.
pub const MAX_HEADS: usize = 1 << 16;

/// Which keys FIRE distinguishes (see the [module docs](self)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FireMode {
    /// The paper's FIRE: one MLP; keys after the query (hidden by a causal
    /// mask) get the formula at `|i − j|`, as the reference code computes.
    #[default]
    Causal,
    /// posenc's extension for encoders: a second MLP for keys after the
    /// query, so the bias tells before from after.
    Bidirectional,
}

/// FIRE's hyperparameters, with the paper's reference defaults.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FireConfig {
    /// Number of heads `H` (one MLP output per head).
    pub num_heads: usize,
    /// Hidden width of `f_θ` (default 32).
    pub mlp_width: usize,
    /// Initial `c` of `ψ(x) = log(|c·x| + 1)` (default 0.1).
    pub init_c: f64,
    /// The threshold `L₀`, a constant; the learned multiplier `ℓ` starts at 1
    /// (default 512).
    pub init_l: f64,
    /// `ε` added to the denominator (default 10⁻⁶).
    pub eps: f64,
    /// Causal (default) or bidirectional.
    pub mode: FireMode,
}

impl FireConfig {
    /// The reference defaults for `num_heads` heads: width 32, `c = 0.1`,
    /// `L₀ = 512`, `ε = 10⁻⁶`, causal.
    ///
    /// # Errors
    /// As [`FireConfig::validate`].
    pub fn new(num_heads: usize) -> Result<Self> {
        let cfg = Self {
            num_heads,
            mlp_width: 32,
            init_c: 0.1,
            init_l: 512.0,
            eps: 1e-6,
            mode: FireMode::Causal,
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// This config with another MLP width.
    ///
    /// # Errors
    /// As [`FireConfig::validate`].
    pub fn with_mlp_width(mut self, width: usize) -> Result<Self> {
        self.mlp_width = width;
        self.validate()?;
        Ok(self)
    }

    /// This config with another initial `c` and threshold `L₀`.
    ///
    /// # Errors
    /// As [`FireConfig::validate`].
    pub fn with_init(mut self, init_c: f64, init_l: f64) -> Result<Self> {
        self.init_c = init_c;
        self.init_l = init_l;
        self.validate()?;
        Ok(self)
    }

    /// This config in another mode.
    pub fn with_mode(mut self, mode: FireMode) -> Self {
        self.mode = mode;
        self
    }

    /// Checks every field.
    ///
    /// # Errors
    /// [`Error::ZeroHeads`]; [`Error::InvalidValue`] for more than
    /// [`MAX_HEADS`] heads; [`Error::InvalidDimension`] for a width of 0 or
    /// above [`MAX_MLP_WIDTH`]; [`Error::InvalidFactor`] for `c` or `L₀` not
    /// finite and > 0; [`Error::NotFinite`] / [`Error::InvalidValue`] for an
    /// `ε` that is not a finite number ≥ 0.
    pub fn validate(&self) -> Result<()> {
        if self.num_heads == 0 {
            return Err(Error::ZeroHeads);
        }
        if self.num_heads > MAX_HEADS {
            return Err(Error::invalid(
                "num_heads",
                format!(
                    "{} heads is more than FIRE's limit {MAX_HEADS}",
                    self.num_heads
                ),
            ));
        }
        if self.mlp_width == 0 || self.mlp_width > MAX_MLP_WIDTH {
            return Err(Error::InvalidDimension {
                what: "mlp_width",
                value: self.mlp_width,
                reason: "must be in 1..=65536",
            });
        }
        check_positive("init_c", self.init_c)?;
        check_positive("init_l", self.init_l)?;
        check_finite("eps", self.eps)?;
        if self.eps < 0.0 {
            return Err(Error::invalid("eps", format!("{} is negative", self.eps)));
        }
        Ok(())
    }
}

/// The MLP `f_θ: R → R^H` with one hidden ReLU layer, in `f64`.
#[derive(Debug, Clone, PartialEq)]
pub struct FireMlp {
    /// First layer weights `w₁`, `[width]` (PyTorch's `(width, 1)`).
    pub w1: Vec<f64>,
    /// First layer bias `b₁`, `[width]`.
    pub b1: Vec<f64>,
    /// Second layer weights `W₂`, `[H][width]`.
    pub w2: Vec<Vec<f64>>,
    /// Second layer bias `b₂`, `[H]`.
    pub b2: Vec<f64>,
}

impl FireMlp {
    fn random(width: usize, heads: usize, rng: &mut crate::absolute::SeededRng) -> Self {
        let s2 = 1.0 / (width as f64).sqrt();
        Self {
            w1: (0..width).map(|_| rng.normal(0.0, 1.0)).collect(),
            b1: (0..width).map(|_| rng.normal(0.0, 1.0)).collect(),
            w2: rng.normal_matrix(heads, width, s2),
            b2: (0..heads).map(|_| rng.normal(0.0, s2)).collect(),
        }
    }

    fn check(&self, width: usize, heads: usize) -> Result<()> {
        let shape = |what, exp, got| crate::error::check_count(what, exp, got, "entries");
        shape("fire mlp w1", width, self.w1.len())?;
        shape("fire mlp b1", width, self.b1.len())?;
        shape("fire mlp b2", heads, self.b2.len())?;
        crate::absolute::check_matrix("fire mlp w2", &self.w2, Some(heads), Some(width))?;
        for v in self.w1.iter().chain(&self.b1).chain(&self.b2) {
            check_finite("fire mlp weight", *v)?;
        }
        Ok(())
    }

    /// `f_θ(u)`, one value per head.
    pub fn eval(&self, u: f64) -> Vec<f64> {
        let hidden: Vec<f64> = self
            .w1
            .iter()
            .zip(&self.b1)
            .map(|(w, b)| (w * u + b).max(0.0))
            .collect();
        self.w2
            .iter()
            .zip(&self.b2)
            .map(|(row, b)| row.iter().zip(&hidden).map(|(w, h)| w * h).sum::<f64>() + b)
            .collect()
    }
}

/// FIRE with its parameters in `f64`: the reference the candle module
/// [`tensor::fire::FireBias`](crate::tensor::fire::FireBias) is tested
/// against (see the [module docs](self)).
#[derive(Debug, Clone, PartialEq)]
pub struct Fire {
    cfg: FireConfig,
    c: f64,
    l_multiplier: f64,
    mlp: FireMlp,
    mlp_future: Option<FireMlp>,
}

impl Fire {
    /// FIRE at its initial `c` and `ℓ = 1`, with MLP weights drawn from a
    /// generator seeded with `seed`: first layer N(0, 1), second layer
    /// N(0, 1/width) (a test and demonstration initialisation; the candle
    /// module initialises as PyTorch's `nn.Linear`).
    ///
    /// # Errors
    /// As [`FireConfig::validate`].
    pub fn random(cfg: FireConfig, seed: u64) -> Result<Self> {
        cfg.validate()?;
        let mut rng = crate::absolute::SeededRng::new(seed);
        let mlp = FireMlp::random(cfg.mlp_width, cfg.num_heads, &mut rng);
        let mlp_future = (cfg.mode == FireMode::Bidirectional)
            .then(|| FireMlp::random(cfg.mlp_width, cfg.num_heads, &mut rng));
        Ok(Self {
            cfg,
            c: cfg.init_c,
            l_multiplier: 1.0,
            mlp,
            mlp_future,
        })
    }

    /// FIRE with given parameters: `c`, the threshold multiplier `ℓ`, the MLP
    /// and (bidirectional only) the MLP of keys after the query.
    ///
    /// # Errors
    /// As [`FireConfig::validate`]; [`Error::NotFinite`] for a non-finite
    /// `c`, `ℓ` or weight; [`Error::Shape`] for weights of the wrong shape or
    /// a `mlp_future` given in causal mode (or missing in bidirectional
    /// mode).
    pub fn from_params(
        cfg: FireConfig,
        c: f64,
        l_multiplier: f64,
        mlp: FireMlp,
        mlp_future: Option<FireMlp>,
    ) -> Result<Self> {
        cfg.validate()?;
        check_finite("c", c)?;
        check_finite("l_multiplier", l_multiplier)?;
        mlp.check(cfg.mlp_width, cfg.num_heads)?;
        match (&mlp_future, cfg.mode) {
            (None, FireMode::Causal) => {}
            (Some(m), FireMode::Bidirectional) => m.check(cfg.mlp_width, cfg.num_heads)?,
            (got, mode) => {
                return Err(Error::Shape {
                    what: "fire mlp_future",
                    expected: format!(
                        "{} in {mode:?} mode",
                        if mode == FireMode::Causal {
                            "none"
                        } else {
                            "a second MLP"
                        }
                    ),
                    got: if got.is_some() { "an MLP" } else { "none" }.into(),
                })
            }
        }
        Ok(Self {
            cfg,
            c,
            l_multiplier,
            mlp,
            mlp_future,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &FireConfig {
        &self.cfg
    }

    /// The log transform's `c`.
    pub fn c(&self) -> f64 {
        self.c
    }

    /// The threshold multiplier `ℓ`.
    pub fn l_multiplier(&self) -> f64 {
        self.l_multiplier
    }

    /// The threshold `L = |ℓ · L₀|`.
    pub fn threshold(&self) -> f64 {
        (self.l_multiplier * self.cfg.init_l).abs()
    }

    /// The MLP of keys at or before the query.
    pub fn mlp(&self) -> &FireMlp {
        &self.mlp
    }

    /// The MLP of keys after the query (bidirectional mode only).
    pub fn mlp_future(&self) -> Option<&FireMlp> {
        self.mlp_future.as_ref()
    }

    /// `ψ(x) = log(|c·x| + 1)`.
    pub fn psi(&self, x: f64) -> f64 {
        (self.c * x).abs().ln_1p()
    }

    /// The MLP input `u = ψ(|i − j|) / (ψ(max(L, i)) + ε)` for query
    /// position `query = i` and key position `key = j`.
    ///
    /// # Errors
    /// [`Error::PositionOutOfRange`] for positions above `i64::MAX`.
    pub fn normalized_distance(&self, query: u64, key: u64) -> Result<f64> {
        let d = super::signed_distance(query, key)?.unsigned_abs() as f64;
        let den = self.psi((query as f64).max(self.threshold())) + self.cfg.eps;
        Ok(self.psi(d) / den)
    }

    /// Every head's bias for one (query, key) pair.
    ///
    /// # Errors
    /// [`Error::PositionOutOfRange`] for positions above `i64::MAX`.
    pub fn bias_heads(&self, query: u64, key: u64) -> Result<Vec<f64>> {
        let u = self.normalized_distance(query, key)?;
        let mlp = match (&self.mlp_future, key > query) {
            (Some(m), true) => m,
            _ => &self.mlp,
        };
        Ok(mlp.eval(u))
    }
}

positional_encoding!(Fire, Hooks::LOGITS, |s| format!(
    "FIRE ({} heads, width {}, {:?})",
    s.cfg.num_heads, s.cfg.mlp_width, s.cfg.mode
));

impl AttentionBias for Fire {
    fn num_heads(&self) -> usize {
        self.cfg.num_heads
    }

    fn bias(&self, head: usize, query: u64, key: u64) -> Result<f64> {
        super::check_head(head, self.cfg.num_heads)?;
        Ok(self.bias_heads(query, key)?[head])
    }
}
