//! T5 relative attention bias, Raffel et al. 2020, *Exploring the Limits of
//! Transfer Learning with a Unified Text-to-Text Transformer* (JMLR).
//!
//! Each head adds a learned scalar to its logits, looked up by a *bucket* of
//! the relative position `r = key − query`:
//!
//! ```text
//! b_h(i, j) = table[bucket(j − i)][h]
//! ```
//!
//! Bucketing ([`relative_position_bucket`], exactly Hugging Face
//! transformers' `T5Attention._relative_position_bucket`):
//!
//! - bidirectional: the buckets are halved, `n ← num_buckets / 2`; keys after
//!   the query (`r > 0`) use buckets `n..2n`, the others `0..n`, and
//!   `a = |r|`; unidirectional: `n = num_buckets`, `a = max(−r, 0)` (every
//!   key after the query shares bucket 0);
//! - `max_exact = n / 2`: distances `a < max_exact` get their own bucket `a`;
//! - larger distances are log-spaced up to `max_distance`:
//!   `max_exact + ⌊ln(a / max_exact) / ln(max_distance / max_exact) ·
//!   (n − max_exact)⌋`, capped at `n − 1`; computed in `float32` as
//!   transformers does (the `f32` rounding decides a few bucket edges).
//!
//! # Errors
//! [`T5Buckets::new`] validates: fewer than 2 buckets (4 bidirectional, i.e.
//! 2 per direction) is [`Error::TooFewBuckets`]; `max_distance ≤ max_exact`
//! (no room for the logarithmic buckets, a division by zero in the reference)
//! is [`Error::InvalidValue`]. [`T5Bias`] also reports zero heads
//! ([`Error::ZeroHeads`]), a table of the wrong shape ([`Error::Shape`]), a
//! head out of range ([`Error::InvalidValue`]) and positions above
//! `i64::MAX` ([`Error::PositionOutOfRange`]).
//!
//! ```
//! use posenc::relative::{relative_position_bucket, T5Bias, T5Buckets};
//! use posenc::AttentionBias;
//!
//! assert_eq!(relative_position_bucket(-3, true, 32, 128), 3);
//! assert_eq!(relative_position_bucket(3, true, 32, 128), 19);
//! assert_eq!(relative_position_bucket(1000, true, 32, 128), 31);
//! assert_eq!(relative_position_bucket(5, false, 32, 128), 0);
//!
//! let buckets = T5Buckets::new(32, 128, true)?;
//! let t5 = T5Bias::random(buckets, 8, 0)?;
//! let b = t5.bias(2, 10, 7)?; // key − query = −3: bucket 3
//! assert_eq!(b, t5.table()[3][2]);
//! # Ok::<(), posenc::Error>(())
//! ```

use crate::encoding::{positional_encoding, AttentionBias, Hooks};
use crate::error::{Error, Result};

/// The T5 bucket of the relative position `relative = key − query`, exactly
/// as transformers' `T5Attention._relative_position_bucket` (see the
/// [module docs](self)); the logarithmic part is computed in `f32`.
///
/// Total for every input, with documented results where the reference
/// fails: when the (halved) bucket count is below 2 (`max_exact = 0`,
/// a division by zero in the reference) every distance of a direction goes
/// to that direction's first bucket; when `max_distance ≤ max_exact` every
/// distance `≥ max_exact` goes to the last bucket of its direction. Use
/// [`T5Buckets::new`] to reject such parameters.
pub fn relative_position_bucket(
    relative: i64,
    bidirectional: bool,
    num_buckets: usize,
    max_distance: usize,
) -> usize {
    let mut n = num_buckets;
    let mut bucket = 0usize;
    let a: u64 = if bidirectional {
        n /= 2;
        if relative > 0 {
            bucket += n;
        }
        relative.unsigned_abs()
    } else {
        // −min(r, 0)
        if relative < 0 {
            relative.unsigned_abs()
        } else {
            0
        }
    };
    let max_exact = n / 2;
    if max_exact == 0 {
        return bucket;
    }
    if a < max_exact as u64 {
        return bucket + a as usize;
    }
    if max_distance <= max_exact {
        return bucket + n - 1;
    }
    // float32 as in transformers: relative_position.float() / max_exact,
    // torch.log, / math.log(max_distance / max_exact) (a Python float, used
    // as a float32 scalar), * (num_buckets - max_exact), .to(torch.long).
    let x = (a as f32) / (max_exact as f32);
    let denom = ((max_distance as f64) / (max_exact as f64)).ln() as f32;
    let scaled = x.ln() / denom * ((n - max_exact) as f32);
    let large = max_exact as i64 + scaled as i64;
    let large = large.min(n as i64 - 1) as usize;
    bucket + large
}

/// Validated T5 bucketing parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct T5Buckets {
    num_buckets: usize,
    max_distance: usize,
    bidirectional: bool,
}

impl T5Buckets {
    /// The defaults of T5: 32 buckets, max distance 128, bidirectional
    /// (encoder self-attention).
    pub const T5_DEFAULT: T5Buckets = T5Buckets {
        num_buckets: 32,
        max_distance: 128,
        bidirectional: true,
    };

    /// Checks and stores the parameters.
    ///
    /// # Errors
    /// [`Error::TooFewBuckets`] if `num_buckets < 2` (unidirectional) or
    /// `< 4` (bidirectional: each direction needs at least 2 buckets so that
    /// `max_exact ≥ 1`); [`Error::InvalidValue`] if
    /// `max_distance ≤ max_exact`.
    pub fn new(num_buckets: usize, max_distance: usize, bidirectional: bool) -> Result<Self> {
        let min = if bidirectional { 4 } else { 2 };
        if num_buckets < min {
            return Err(Error::TooFewBuckets { num_buckets, min });
        }
        let half = if bidirectional {
            num_buckets / 2
        } else {
            num_buckets
        };
        let max_exact = half / 2;
        if max_distance <= max_exact {
            return Err(Error::invalid(
                "max_distance",
                format!(
                    "{max_distance} must exceed max_exact = {max_exact} (half of the buckets of a direction)"
                ),
            ));
        }
        Ok(Self {
            num_buckets,
            max_distance,
            bidirectional,
        })
    }

    /// Number of buckets.
    pub fn num_buckets(&self) -> usize {
        self.num_buckets
    }

    /// Distance from which every bucket is the last one.
    pub fn max_distance(&self) -> usize {
        self.max_distance
    }

    /// Whether keys after the query get their own buckets.
    pub fn bidirectional(&self) -> bool {
        self.bidirectional
    }

    /// The bucket of `relative = key − query`.
    pub fn bucket(&self, relative: i64) -> usize {
        relative_position_bucket(
            relative,
            self.bidirectional,
            self.num_buckets,
            self.max_distance,
        )
    }

    /// The (queries × keys) bucket matrix for `q_len` queries at positions
    /// `q_offset..` and `k_len` keys at positions `k_offset..`.
    ///
    /// # Errors
    /// [`Error::PositionOutOfRange`] for positions above `i64::MAX`.
    pub fn bucket_matrix(
        &self,
        q_len: usize,
        k_len: usize,
        q_offset: u64,
        k_offset: u64,
    ) -> Result<Vec<Vec<usize>>> {
        super::position_grid(q_len, k_len, q_offset, k_offset, |q, k| {
            Ok(self.bucket(super::signed_distance(q, k)?))
        })
    }
}

/// T5's learned relative attention bias: a `num_buckets × num_heads` table
/// (see the [module docs](self)).
#[derive(Debug, Clone, PartialEq)]
pub struct T5Bias {
    buckets: T5Buckets,
    num_heads: usize,
    table: Vec<Vec<f64>>,
}

impl T5Bias {
    /// A bias with a given table, `table[bucket][head]`.
    ///
    /// # Errors
    /// [`Error::ZeroHeads`] for rows of length 0, [`Error::Shape`] if the
    /// table does not have `num_buckets` rows of equal length,
    /// [`Error::NotFinite`] for a NaN or infinite entry.
    pub fn new(buckets: T5Buckets, table: Vec<Vec<f64>>) -> Result<Self> {
        if table.first().is_some_and(|r| r.is_empty()) {
            return Err(Error::ZeroHeads);
        }
        let num_heads = crate::absolute::check_matrix(
            "t5 bias table",
            &table,
            Some(buckets.num_buckets),
            None,
        )?;
        Ok(Self {
            buckets,
            num_heads,
            table,
        })
    }

    /// A bias whose table is initialised N(0, 1) from a generator seeded
    /// with `seed` (the scale of Hugging Face's T5 initialisation with
    /// `initializer_factor = 1` and `d_model` of the table's fan-in is
    /// `d_model^−½`; use [`T5Bias::new`] for trained values).
    ///
    /// # Errors
    /// [`Error::ZeroHeads`] for `num_heads == 0`.
    pub fn random(buckets: T5Buckets, num_heads: usize, seed: u64) -> Result<Self> {
        if num_heads == 0 {
            return Err(Error::ZeroHeads);
        }
        let table = crate::absolute::SeededRng::new(seed).normal_matrix(
            buckets.num_buckets,
            num_heads,
            1.0,
        );
        Self::new(buckets, table)
    }

    /// The bucketing parameters.
    pub fn buckets(&self) -> &T5Buckets {
        &self.buckets
    }

    /// The table, `table[bucket][head]`.
    pub fn table(&self) -> &[Vec<f64>] {
        &self.table
    }
}

positional_encoding!(T5Bias, Hooks::LOGITS, |s| if s.buckets.bidirectional {
    "T5 relative bias (bidirectional)"
} else {
    "T5 relative bias (unidirectional)"
});

impl AttentionBias for T5Bias {
    fn num_heads(&self) -> usize {
        self.num_heads
    }

    fn bias(&self, head: usize, query: u64, key: u64) -> Result<f64> {
        super::check_head(head, self.num_heads)?;
        let r = super::signed_distance(query, key)?;
        Ok(self.table[self.buckets.bucket(r)][head])
    }
}
