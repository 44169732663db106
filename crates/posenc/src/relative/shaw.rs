//! Relative position representations, Shaw, Uszkoreit and Vaswani 2018,
//! *Self-Attention with Relative Position Representations* (NAACL 2018).
//!
//! The distance from query `i` to key `j` is clipped to `[−k, k]`, and each of
//! the `2k + 1` clipped distances has two learned vectors of the head
//! dimension `d`: `a^K` for the keys and `a^V` for the values,
//!
//! ```text
//! a^K_ij = w^K[clip(j − i, −k, k) + k],   a^V_ij = w^V[clip(j − i, −k, k) + k]
//! e_ij   = q_i · (k_j + a^K_ij) / √d                     (logits hook)
//! α_ij   = softmax_j(e_ij)
//! z_i    = Σ_j α_ij (v_j + a^V_ij)                       (values hook)
//! ```
//!
//! `w^K, w^V ∈ R^((2k+1) × d)` are shared across heads (and, in the paper,
//! learned per layer). Clipping lets the model generalise to distances not
//! seen in training. `k = 0` is allowed: one row, no position information
//! (the same vector is added to every key and every value).
//!
//! Shaw's terms depend on the queries and attention weights, not only on the
//! positions, so this type implements [`PositionalEncoding`] with
//! [`Hooks::LOGITS_AND_VALUES`] but not the position-only
//! [`AttentionBias`](crate::AttentionBias); its hooks are
//! [`Shaw::logits`] and [`Shaw::values_term`] (and [`Shaw::attend`] for a
//! whole attention head). The efficient candle version is
//! [`tensor::bias::ShawRelative`](crate::tensor::bias::ShawRelative).
//!
//! # Shapes
//! Queries `[Tq][d]`, keys and values `[Tk][d]`, queries at positions
//! `q_offset..q_offset + Tq`, keys at `k_offset..k_offset + Tk`; logits and
//! weights `[Tq][Tk]`; outputs `[Tq][d]`.
//!
//! # Errors
//! `d = 0` ([`Error::InvalidDimension`]); tables or inputs of the wrong shape
//! ([`Error::Shape`]); non-finite table entries ([`Error::NotFinite`]);
//! positions above `i64::MAX` ([`Error::PositionOutOfRange`]).
//!
//! ```
//! use posenc::relative::Shaw;
//!
//! let shaw = Shaw::new(2, 4, 0)?; // k = 2: 5 rows
//! assert_eq!(shaw.relative_index(10, 3)?, 0); // j − i = −7 → clipped to −2
//! assert_eq!(shaw.relative_index(3, 4)?, 3); // j − i = 1
//! let idx = shaw.index_matrix(3, 3, 0, 0)?;
//! assert_eq!(idx, vec![vec![2, 3, 4], vec![1, 2, 3], vec![0, 1, 2]]);
//! # Ok::<(), posenc::Error>(())
//! ```

use crate::encoding::{positional_encoding, Hooks};
use crate::error::{check_dim, Error, Result};

/// Shaw et al.'s relative key and value tables (see the [module docs](self)).
#[derive(Debug, Clone, PartialEq)]
pub struct Shaw {
    max_relative: usize,
    head_dim: usize,
    keys: Vec<Vec<f64>>,
    values: Vec<Vec<f64>>,
}

fn shape_err(what: &'static str, expected: String, got: String) -> Error {
    Error::Shape {
        what,
        expected,
        got,
    }
}

fn check_rows(what: &'static str, m: &[Vec<f64>], rows: Option<usize>, cols: usize) -> Result<()> {
    if let Some(r) = rows {
        if m.len() != r {
            return Err(shape_err(
                what,
                format!("{r} rows"),
                format!("{} rows", m.len()),
            ));
        }
    }
    for (i, row) in m.iter().enumerate() {
        if row.len() != cols {
            return Err(shape_err(
                what,
                format!("{cols} columns"),
                format!("{} columns in row {i}", row.len()),
            ));
        }
    }
    Ok(())
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

impl Shaw {
    /// Tables for clipping distance `max_relative = k` and head dimension
    /// `head_dim`, initialised N(0, 1/d) from a generator seeded with `seed`
    /// (keys first, then values).
    ///
    /// # Errors
    /// [`Error::InvalidDimension`] if `head_dim == 0`.
    pub fn new(max_relative: usize, head_dim: usize, seed: u64) -> Result<Self> {
        check_dim("head_dim", head_dim, false)?;
        let rows = 2 * max_relative + 1;
        let std = 1.0 / (head_dim as f64).sqrt();
        let mut rng = crate::absolute::SeededRng::new(seed);
        let keys = rng.normal_matrix(rows, head_dim, std);
        let values = rng.normal_matrix(rows, head_dim, std);
        Ok(Self {
            max_relative,
            head_dim,
            keys,
            values,
        })
    }

    /// Given tables, each `(2k + 1) × d`; row `r` is clipped distance
    /// `r − k`.
    ///
    /// # Errors
    /// [`Error::Shape`] if a table does not have `2k + 1` rows of one common
    /// length, [`Error::InvalidDimension`] for rows of length 0,
    /// [`Error::NotFinite`] for NaN or infinite entries.
    pub fn from_tables(
        max_relative: usize,
        keys: Vec<Vec<f64>>,
        values: Vec<Vec<f64>>,
    ) -> Result<Self> {
        let rows = 2 * max_relative + 1;
        let d = crate::absolute::check_matrix("shaw key table", &keys, Some(rows), None)?;
        check_dim("head_dim", d, false)?;
        crate::absolute::check_matrix("shaw value table", &values, Some(rows), Some(d))?;
        Ok(Self {
            max_relative,
            head_dim: d,
            keys,
            values,
        })
    }

    /// The clipping distance `k`.
    pub fn max_relative(&self) -> usize {
        self.max_relative
    }

    /// The head dimension `d`.
    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// Number of table rows, `2k + 1`.
    pub fn num_relative(&self) -> usize {
        2 * self.max_relative + 1
    }

    /// The key table `w^K`, `(2k + 1) × d`.
    pub fn key_table(&self) -> &[Vec<f64>] {
        &self.keys
    }

    /// The value table `w^V`, `(2k + 1) × d`.
    pub fn value_table(&self) -> &[Vec<f64>] {
        &self.values
    }

    /// `clip(key − query, −k, k)`.
    ///
    /// # Errors
    /// [`Error::PositionOutOfRange`] for positions above `i64::MAX`.
    pub fn clipped_distance(&self, query: u64, key: u64) -> Result<i64> {
        let r = super::signed_distance(query, key)?;
        let k = self.max_relative.min(i64::MAX as usize) as i64;
        Ok(r.clamp(-k, k))
    }

    /// The table row of a (query, key) pair: `clip(key − query, −k, k) + k`.
    ///
    /// # Errors
    /// [`Error::PositionOutOfRange`] for positions above `i64::MAX`.
    pub fn relative_index(&self, query: u64, key: u64) -> Result<usize> {
        let c = self.clipped_distance(query, key)?;
        Ok((c + self.max_relative as i64) as usize)
    }

    /// The `Tq × Tk` matrix of table rows for queries at
    /// `q_offset..q_offset + q_len` and keys at `k_offset..k_offset + k_len`.
    ///
    /// # Errors
    /// [`Error::PositionOutOfRange`] for positions above `i64::MAX`.
    pub fn index_matrix(
        &self,
        q_len: usize,
        k_len: usize,
        q_offset: u64,
        k_offset: u64,
    ) -> Result<Vec<Vec<usize>>> {
        super::position_grid(q_len, k_len, q_offset, k_offset, |q, k| {
            self.relative_index(q, k)
        })
    }

    /// The logits `e_ij = q_i · (k_j + a^K_ij) / √d`, `[Tq][Tk]`.
    ///
    /// # Errors
    /// [`Error::Shape`] if a query or key does not have length `d`;
    /// [`Error::PositionOutOfRange`] for positions above `i64::MAX`.
    pub fn logits(
        &self,
        queries: &[Vec<f64>],
        keys: &[Vec<f64>],
        q_offset: u64,
        k_offset: u64,
    ) -> Result<Vec<Vec<f64>>> {
        check_rows("shaw queries", queries, None, self.head_dim)?;
        check_rows("shaw keys", keys, None, self.head_dim)?;
        let idx = self.index_matrix(queries.len(), keys.len(), q_offset, k_offset)?;
        let scale = 1.0 / (self.head_dim as f64).sqrt();
        Ok(queries
            .iter()
            .zip(&idx)
            .map(|(q, row)| {
                keys.iter()
                    .zip(row)
                    .map(|(k, &r)| (dot(q, k) + dot(q, &self.keys[r])) * scale)
                    .collect()
            })
            .collect())
    }

    /// The relative value term `Σ_j α_ij a^V_ij`, `[Tq][d]`, for attention
    /// weights `α` of shape `[Tq][Tk]`.
    ///
    /// # Errors
    /// [`Error::Shape`] for ragged weights; [`Error::PositionOutOfRange`] for
    /// positions above `i64::MAX`.
    pub fn values_term(
        &self,
        weights: &[Vec<f64>],
        q_offset: u64,
        k_offset: u64,
    ) -> Result<Vec<Vec<f64>>> {
        let k_len = weights.first().map_or(0, Vec::len);
        check_rows("shaw attention weights", weights, None, k_len)?;
        let idx = self.index_matrix(weights.len(), k_len, q_offset, k_offset)?;
        Ok(weights
            .iter()
            .zip(&idx)
            .map(|(w, row)| {
                let mut z = vec![0.0; self.head_dim];
                for (&a, &r) in w.iter().zip(row) {
                    for (zc, vc) in z.iter_mut().zip(&self.values[r]) {
                        *zc += a * vc;
                    }
                }
                z
            })
            .collect())
    }

    /// One attention head with Shaw's relative terms: `z_i = Σ_j α_ij (v_j +
    /// a^V_ij)`, `α = softmax(e)` over the keys; with `causal`, keys after
    /// the query are masked (a query that sees no key gets a zero output).
    ///
    /// # Errors
    /// [`Error::Shape`] if the inputs do not have length `d` or keys and
    /// values differ in number; [`Error::PositionOutOfRange`] for positions
    /// above `i64::MAX`.
    pub fn attend(
        &self,
        queries: &[Vec<f64>],
        keys: &[Vec<f64>],
        values: &[Vec<f64>],
        q_offset: u64,
        k_offset: u64,
        causal: bool,
    ) -> Result<Vec<Vec<f64>>> {
        check_rows("shaw values", values, Some(keys.len()), self.head_dim)?;
        let mut logits = self.logits(queries, keys, q_offset, k_offset)?;
        for (i, row) in logits.iter_mut().enumerate() {
            let qp = q_offset.saturating_add(i as u64);
            let visible = |j: usize| !causal || k_offset.saturating_add(j as u64) <= qp;
            let max = row
                .iter()
                .enumerate()
                .filter(|(j, _)| visible(*j))
                .map(|(_, &e)| e)
                .fold(f64::NEG_INFINITY, f64::max);
            let mut sum = 0.0;
            for (j, e) in row.iter_mut().enumerate() {
                *e = if visible(j) { (*e - max).exp() } else { 0.0 };
                sum += *e;
            }
            if sum > 0.0 {
                row.iter_mut().for_each(|e| *e /= sum);
            }
        }
        let mut out = self.values_term(&logits, q_offset, k_offset)?;
        for (z, w) in out.iter_mut().zip(&logits) {
            for (&a, v) in w.iter().zip(values) {
                for (zc, vc) in z.iter_mut().zip(v) {
                    *zc += a * vc;
                }
            }
        }
        Ok(out)
    }
}

positional_encoding!(Shaw, Hooks::LOGITS_AND_VALUES, |s| format!(
    "Shaw relative (k = {})",
    s.max_relative
));
