//! Learned absolute positional embeddings: a table with one trainable row per
//! position, added to the token embeddings (BERT, Devlin et al. 2019; GPT-2,
//! Radford et al. 2019; also the "learned" variant of Vaswani et al. 2017,
//! Table 3 row E).
//!
//! ```text
//! PE(p) = W[p],   W ∈ R^(max_positions × D),   W initialised N(0, 0.02²)
//! ```
//!
//! The table has a fixed length: a position `p ≥ max_positions` has no row and
//! is an error ([`Error::PositionOutOfRange`]), never silently clamped. This is
//! the main practical weakness of learned embeddings: they cannot extrapolate.
//!
//! This is the plain `f64` table (for inspection and as a reference); the
//! trainable candle module is
//! [`tensor::absolute::LearnedEmbedding`](crate::tensor::absolute::LearnedEmbedding).
//!
//! Errors: `max_positions = 0` or `dim = 0` ([`Error::InvalidDimension`]);
//! ragged or non-finite given rows ([`Error::Shape`], [`Error::NotFinite`]).
//!
//! ```
//! use posenc::absolute::LearnedTable;
//! use posenc::{AbsoluteEncoding, Error};
//!
//! let table = LearnedTable::new(16, 8, 42)?;
//! assert_eq!(table.encode(15)?.len(), 8);
//! assert!(matches!(table.encode(16), Err(Error::PositionOutOfRange { .. })));
//! # Ok::<(), posenc::Error>(())
//! ```

use crate::encoding::{positional_encoding, AbsoluteEncoding, Hooks};
use crate::error::{check_dim, Error, Result};

/// A learned table of position vectors (see the [module docs](self)).
#[derive(Debug, Clone, PartialEq)]
pub struct LearnedTable {
    dim: usize,
    rows: Vec<Vec<f64>>,
}

impl LearnedTable {
    /// Standard deviation of the GPT-2/BERT initialisation.
    pub const INIT_STD: f64 = 0.02;

    /// A `max_positions × dim` table initialised with N(0, 0.02²) samples
    /// from a deterministic generator seeded with `seed`.
    ///
    /// # Errors
    /// [`Error::InvalidDimension`] if `max_positions` or `dim` is 0.
    pub fn new(max_positions: usize, dim: usize, seed: u64) -> Result<Self> {
        check_dim("max_positions", max_positions, false)?;
        check_dim("dim", dim, false)?;
        let rows = super::SeededRng::new(seed).normal_matrix(max_positions, dim, Self::INIT_STD);
        Ok(Self { dim, rows })
    }

    /// A table from given rows (one per position).
    ///
    /// # Errors
    /// [`Error::Shape`] if there are no rows or they differ in length,
    /// [`Error::InvalidDimension`] for rows of length 0, [`Error::NotFinite`]
    /// for a NaN or infinite entry.
    pub fn from_rows(rows: Vec<Vec<f64>>) -> Result<Self> {
        let dim = super::check_matrix("learned table", &rows, None, None)?;
        check_dim("dim", dim, false)?;
        Ok(Self { dim, rows })
    }

    /// Number of rows: positions `0..max_positions` are representable.
    pub fn max_positions(&self) -> usize {
        self.rows.len()
    }

    /// The rows.
    pub fn rows(&self) -> &[Vec<f64>] {
        &self.rows
    }
}

positional_encoding!(LearnedTable, Hooks::INPUT, "learned");

impl AbsoluteEncoding for LearnedTable {
    fn dim(&self) -> usize {
        self.dim
    }

    fn encode_into(&self, position: u64, out: &mut [f64]) -> Result<()> {
        super::check_out_len("learned output", out, self.dim)?;
        let row = usize::try_from(position)
            .ok()
            .and_then(|p| self.rows.get(p))
            .ok_or(Error::PositionOutOfRange {
                position,
                limit: self.rows.len() as u64,
                what: "learned table",
            })?;
        out.copy_from_slice(row);
        Ok(())
    }
}
