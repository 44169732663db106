//! CoPE, Golovneva, Wang, Weston and Sukhbaatar 2024, *Contextual Position
//! Encoding: Learning to Count What's Important* (arXiv:2405.18719).
//!
//! Positions counted by the context instead of by tokens: each query decides,
//! with a sigmoid gate per key, which keys count, and a key's position
//! relative to the query is the number of counted keys between them. The
//! positions are fractional; their embeddings are interpolated between the
//! two nearest integer positions:
//!
//! ```text
//! g_ij = σ(q_i · k_j / √d)                      gate: does key j count for query i?
//! p_ij = min(Σ_{t=j}^{i} g_it, P − 1)           contextual position of key j (j ≤ i)
//! z_i[p] = q_i · e[p]                            p = 0, …, P − 1 (P = npos_max)
//! CoPE_ij = z_i[⌈p_ij⌉]·(p_ij − ⌊p_ij⌋) + z_i[⌊p_ij⌋]·(1 − p_ij + ⌊p_ij⌋)
//! logits_ij = (q_i · k_j + CoPE_ij) / √d        (the reference's default)
//! ```
//!
//! `e ∈ R^(d × P)` is the learned position-embedding table, shared by the
//! heads of a layer (the reference folds heads into the batch). The bias
//! this module adds to the scaled logits `q·k/√d` is therefore
//! `CoPE_ij / √d`; with [`CopeConfig::divide_by_sqrt_d`] off it is
//! `CoPE_ij` (the reference's `--cope-nodiv`).
//!
//! Read from the paper's reference code
//! (`facebookresearch/RAM`, `projects/cope/src/cope/context_position.py`):
//! - the gates use the *scaled* logits `q·k/√d` (the paper's text writes
//!   `σ(q_i·k_j)`); the keys that gate may be the attention keys, a separate
//!   key projection (`--cope-sep-key`) or the values (`--cope-val-gates`):
//!   whatever is passed as `k`;
//! - masked gates are zeroed, then `p` is a reverse cumulative sum over the
//!   keys (`gates.flip(-1).cumsum(-1).flip(-1)`) clamped at `P − 1`, so a
//!   key hidden by the causal mask gets `p = 0` and the bias `z_i[0]`;
//! - the interpolation weight `p − ⌊p⌋` carries the gradient to the gates
//!   (the indices do not); at an integer `p` the two ends coincide;
//! - `e` starts at zero; `P` defaults to the block size + 1 there (position
//!   0 is possible) and is required here.
//!
//! Without a causal mask ([`CopeConfig::causal`] off: the reference's
//! encoder path) no gate is masked and `p_ij = Σ_{t ≥ j} g_it` counts from
//! key `j` to the end of the keys, whatever the query.
//!
//! Keys are summed in their order in the sequence (index `t ≥ j`), and the
//! causal mask uses the explicit positions: key `t` is visible to query `i`
//! when `key_pos[t] ≤ query_pos[i]`. A query slice at positions `p..p + Tq`
//! against keys `0..Tk` (a KV cache) gets the rows of the full computation.
//!
//! # Shapes
//! Queries `[Tq][d]`, keys `[Tk][d]`, positions `[Tq]` and `[Tk]`; gates,
//! positions and the logits term `[Tq][Tk]`; the table `[P][d]` (row `p` is
//! `e[p]`).
//!
//! # Errors
//! `d = 0` or `P = 0`, or too large ([`Error::InvalidDimension`]); inputs or
//! tables of the wrong shape ([`Error::Shape`]); non-finite table entries
//! ([`Error::NotFinite`]).
//!
//! ```
//! use posenc::relative::cope::{Cope, CopeConfig, CopeInputs};
//!
//! let cfg = CopeConfig::new(2, 4)?; // head_dim 2, positions 0..=3
//! let table = vec![vec![0.0, 0.0], vec![1.0, 0.0], vec![2.0, 0.0], vec![3.0, 0.0]];
//! let cope = Cope::from_table(cfg, table)?;
//! // q·k = 0: every gate is σ(0) = ½, so key j is at position (i − j + 1)/2.
//! let q = vec![vec![1.0, 0.0]; 3];
//! let k = vec![vec![0.0, 1.0]; 3];
//! let p = cope.positions(&q, &k, &[0, 1, 2], &[0, 1, 2])?;
//! assert_eq!(p[2], vec![1.5, 1.0, 0.5]);
//! assert_eq!(p[0], vec![0.5, 0.0, 0.0]); // keys after the query: masked, p = 0
//! // z[p] = p here, so the term is q·e[p] = p, divided by √d.
//! let (q_pos, k_pos) = (&[0, 1, 2], &[0, 1, 2]);
//! let term = cope.logits_term(CopeInputs { q: &q, k: &k, q_pos, k_pos })?;
//! assert!((term[2][0] - 1.5 / 2f64.sqrt()).abs() < 1e-15);
//! # Ok::<(), posenc::Error>(())
//! ```

use crate::encoding::{positional_encoding, Hooks};
use crate::error::{Error, Result};

/// Largest accepted `head_dim`.
pub const MAX_HEAD_DIM: usize = 1 << 16;
/// Largest accepted `npos_max`.
pub const MAX_NPOS: usize = 1 << 24;
/// Largest accepted table size `head_dim × npos_max`.
pub const MAX_TABLE: usize = 1 << 28;

/// CoPE's hyperparameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopeConfig {
    /// Head dimension `d`.
    pub head_dim: usize,
    /// Number of embedded positions `P`: contextual positions are clamped to
    /// `P − 1` (the reference's `npos_max`).
    pub npos_max: usize,
    /// Divide the CoPE term by `√d` with the logits (default true, the
    /// reference's default; false is its `--cope-nodiv`).
    pub divide_by_sqrt_d: bool,
    /// Mask the gates of keys after the query (default true: decoders, the
    /// paper's setting); false counts to the end of the keys (the reference's
    /// encoder path).
    pub causal: bool,
}

impl CopeConfig {
    /// Head dimension `d` and `P = npos_max` positions; the CoPE term is
    /// divided by `√d`; causal.
    ///
    /// # Errors
    /// As [`CopeConfig::validate`].
    pub fn new(head_dim: usize, npos_max: usize) -> Result<Self> {
        let cfg = Self {
            head_dim,
            npos_max,
            divide_by_sqrt_d: true,
            causal: true,
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// This config without (false) or with the causal mask.
    pub fn with_causal(mut self, causal: bool) -> Self {
        self.causal = causal;
        self
    }

    /// This config with the CoPE term divided by `√d` (true) or not.
    pub fn with_divide_by_sqrt_d(mut self, divide: bool) -> Self {
        self.divide_by_sqrt_d = divide;
        self
    }

    /// The factor applied to `z_i[p]`: `1/√d` or 1.
    pub fn term_scale(&self) -> f64 {
        if self.divide_by_sqrt_d {
            1.0 / (self.head_dim as f64).sqrt()
        } else {
            1.0
        }
    }

    /// Checks the sizes.
    ///
    /// # Errors
    /// [`Error::InvalidDimension`] for `d` or `P` of 0 or above
    /// [`MAX_HEAD_DIM`], [`MAX_NPOS`], or a table above [`MAX_TABLE`]
    /// entries.
    pub fn validate(&self) -> Result<()> {
        if self.head_dim == 0 || self.head_dim > MAX_HEAD_DIM {
            return Err(Error::InvalidDimension {
                what: "head_dim",
                value: self.head_dim,
                reason: "must be in 1..=65536",
            });
        }
        if self.npos_max == 0 || self.npos_max > MAX_NPOS {
            return Err(Error::InvalidDimension {
                what: "npos_max",
                value: self.npos_max,
                reason: "must be in 1..=2^24",
            });
        }
        if self.head_dim * self.npos_max > MAX_TABLE {
            return Err(Error::InvalidDimension {
                what: "npos_max",
                value: self.npos_max,
                reason: "head_dim × npos_max exceeds 2^28 table entries",
            });
        }
        Ok(())
    }
}

/// CoPE with its table in `f64`: the reference the candle module
/// [`tensor::cope::CopeBias`](crate::tensor::cope::CopeBias) is tested
/// against (see the [module docs](self)).
#[derive(Debug, Clone, PartialEq)]
pub struct Cope {
    cfg: CopeConfig,
    table: Vec<Vec<f64>>,
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// The logistic function `1 / (1 + e^(−x))`, without overflow for large
/// `|x|` (also the fused CoPE kernel's gate).
pub(crate) fn sigmoid(x: f64) -> f64 {
    if x >= 0.0 {
        1.0 / (1.0 + (-x).exp())
    } else {
        let e = x.exp();
        e / (1.0 + e)
    }
}

impl Cope {
    /// The reference initialisation: a zero table (the CoPE term starts at
    /// zero and is learned).
    ///
    /// # Errors
    /// As [`CopeConfig::validate`].
    pub fn zeros(cfg: CopeConfig) -> Result<Self> {
        cfg.validate()?;
        Ok(Self {
            cfg,
            table: vec![vec![0.0; cfg.head_dim]; cfg.npos_max],
        })
    }

    /// A table of N(0, 1/d) entries from a generator seeded with `seed`.
    ///
    /// # Errors
    /// As [`CopeConfig::validate`].
    pub fn random(cfg: CopeConfig, seed: u64) -> Result<Self> {
        cfg.validate()?;
        let mut rng = crate::absolute::SeededRng::new(seed);
        let std = 1.0 / (cfg.head_dim as f64).sqrt();
        Ok(Self {
            cfg,
            table: rng.normal_matrix(cfg.npos_max, cfg.head_dim, std),
        })
    }

    /// A given table, `P` rows of `d` (row `p` is `e[p]`).
    ///
    /// # Errors
    /// As [`CopeConfig::validate`]; [`Error::Shape`] for a table that is not
    /// `P × d`; [`Error::NotFinite`] for NaN or infinite entries.
    pub fn from_table(cfg: CopeConfig, table: Vec<Vec<f64>>) -> Result<Self> {
        cfg.validate()?;
        crate::absolute::check_matrix(
            "cope table",
            &table,
            Some(cfg.npos_max),
            Some(cfg.head_dim),
        )?;
        Ok(Self { cfg, table })
    }

    /// The configuration.
    pub fn config(&self) -> &CopeConfig {
        &self.cfg
    }

    /// The table, `[P][d]`.
    pub fn table(&self) -> &[Vec<f64>] {
        &self.table
    }

    /// The gates `g_ij = σ(q_i · k_j / √d)`, zero where the causal mask hides
    /// key `j` from query `i` (`key_pos[j] > query_pos[i]`), `[Tq][Tk]`.
    ///
    /// # Errors
    /// [`Error::Shape`] for inputs of the wrong width or positions of the
    /// wrong length.
    pub fn gates(&self, x: CopeInputs<'_>) -> Result<Vec<Vec<f64>>> {
        x.check(self.cfg.head_dim)?;
        let CopeInputs { q, k, q_pos, k_pos } = x;
        let s = 1.0 / (self.cfg.head_dim as f64).sqrt();
        Ok(q.iter()
            .zip(q_pos)
            .map(|(qi, &pi)| {
                k.iter()
                    .zip(k_pos)
                    .map(|(kj, &pj)| {
                        if self.cfg.causal && pj > pi {
                            0.0
                        } else {
                            sigmoid(dot(qi, kj) * s)
                        }
                    })
                    .collect()
            })
            .collect())
    }

    /// The contextual positions `p_ij = min(Σ_{t ≥ j} g_it, P − 1)` (masked
    /// gates are zero, so for sorted causal keys the sum runs from `j` to
    /// the query), `[Tq][Tk]`, for queries `q` and keys `k` at `q_pos` and
    /// `k_pos` (as [`CopeInputs`]).
    ///
    /// # Errors
    /// As [`Cope::gates`].
    pub fn positions(
        &self,
        q: &[Vec<f64>],
        k: &[Vec<f64>],
        q_pos: &[u64],
        k_pos: &[u64],
    ) -> Result<Vec<Vec<f64>>> {
        let cap = (self.cfg.npos_max - 1) as f64;
        Ok(self
            .gates(CopeInputs { q, k, q_pos, k_pos })?
            .into_iter()
            .map(|g| {
                // Explicit double loop: the slow, obviously right reference.
                (0..g.len())
                    .map(|j| g[j..].iter().sum::<f64>().min(cap))
                    .collect()
            })
            .collect())
    }

    /// The interpolated `z_i[p] = q_i · e[p]` at a fractional `p` in
    /// `[0, P − 1]`.
    fn interpolate(&self, qi: &[f64], p: f64) -> f64 {
        let lo = p.floor();
        let hi = p.ceil();
        let w = p - lo;
        let z = |r: f64| dot(qi, &self.table[r as usize]);
        z(hi) * w + z(lo) * (1.0 - w)
    }

    /// The logits term `CoPE_ij` times [`CopeConfig::term_scale`]: the bias
    /// to add to the scaled logits `q·k/√d`, `[Tq][Tk]`.
    ///
    /// # Errors
    /// As [`Cope::gates`].
    pub fn logits_term(&self, x: CopeInputs<'_>) -> Result<Vec<Vec<f64>>> {
        let s = self.cfg.term_scale();
        let positions = self.positions(x.q, x.k, x.q_pos, x.k_pos)?;
        Ok(per_entry(positions, x.q, |qi, _, p| {
            s * self.interpolate(qi, p)
        }))
    }

    /// The full logits `q_i · k_j / √d + bias_ij`, `[Tq][Tk]` (no mask).
    ///
    /// # Errors
    /// As [`Cope::gates`].
    pub fn logits(&self, x: CopeInputs<'_>) -> Result<Vec<Vec<f64>>> {
        let s = 1.0 / (self.cfg.head_dim as f64).sqrt();
        let term = self.logits_term(x)?;
        Ok(per_entry(term, x.q, |qi, j, b| dot(qi, &x.k[j]) * s + b))
    }
}

/// One call's queries `q` (`[Tq][d]`) and keys `k` (`[Tk][d]`) with their
/// positions `q_pos` (`Tq` of them) and `k_pos` (`Tk`): the inputs of
/// [`Cope::gates`], [`Cope::logits_term`] and [`Cope::logits`].
#[derive(Debug, Clone, Copy)]
pub struct CopeInputs<'a> {
    /// Queries, `[Tq][d]`.
    pub q: &'a [Vec<f64>],
    /// Keys, `[Tk][d]`.
    pub k: &'a [Vec<f64>],
    /// Position of each query.
    pub q_pos: &'a [u64],
    /// Position of each key.
    pub k_pos: &'a [u64],
}

impl CopeInputs<'_> {
    /// Checks that every query and key has `d` entries and one position.
    fn check(&self, d: usize) -> Result<()> {
        let CopeInputs { q, k, q_pos, k_pos } = *self;
        for (what, m) in [("cope queries", q), ("cope keys", k)] {
            if let Some((i, row)) = m.iter().enumerate().find(|(_, r)| r.len() != d) {
                return Err(Error::Shape {
                    what,
                    expected: format!("{d} columns"),
                    got: format!("{} columns in row {i}", row.len()),
                });
            }
        }
        for (what, p, n) in [
            ("cope query positions", q_pos, q.len()),
            ("cope key positions", k_pos, k.len()),
        ] {
            if p.len() != n {
                return Err(Error::Shape {
                    what,
                    expected: format!("{n} positions"),
                    got: format!("{}", p.len()),
                });
            }
        }
        Ok(())
    }
}

/// `f(q_i, j, m_ij)` at every entry of the `[Tq][Tk]` matrix `m`.
fn per_entry(
    m: Vec<Vec<f64>>,
    q: &[Vec<f64>],
    f: impl Fn(&[f64], usize, f64) -> f64,
) -> Vec<Vec<f64>> {
    m.into_iter()
        .zip(q)
        .map(|(row, qi)| {
            row.into_iter()
                .enumerate()
                .map(|(j, x)| f(qi, j, x))
                .collect()
        })
        .collect()
}

positional_encoding!(Cope, Hooks::LOGITS, |s| format!(
    "CoPE (d = {}, {} positions{})",
    s.cfg.head_dim,
    s.cfg.npos_max,
    if s.cfg.causal { "" } else { ", unmasked" }
));
