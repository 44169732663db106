//! ALiBi, Press, Smith and Lewis 2022, *Train Short, Test Long: Attention
//! with Linear Biases Enables Input Length Extrapolation* (ICLR 2022).
//!
//! No position vectors at all: each head `h` adds a fixed penalty
//! proportional to the distance to its logits,
//!
//! ```text
//! causal:         b_h(i, j) = −m_h · (i − j)      (j ≤ i; the formula's value elsewhere)
//! bidirectional:  b_h(i, j) = −m_h · |i − j|
//! ```
//!
//! for query position `i` and key position `j`. The slopes `m_h` are a
//! geometric sequence ([`alibi_slopes`]): for `n` a power of two,
//! `m_h = 2^(−8(h+1)/n)`, i.e. start and ratio `2^(−8/n)`; otherwise the
//! slopes of the closest power of two below `n`, followed by every other
//! slope of twice that power, exactly as the reference `get_slopes` of
//! <https://github.com/ofirpress/attention_with_linear_biases>.
//!
//! Errors: zero heads ([`Error::ZeroHeads`]); a head index out of range
//! ([`Error::InvalidValue`]); positions above `i64::MAX`
//! ([`Error::PositionOutOfRange`]).
//!
//! ```
//! use posenc::relative::{alibi_slopes, Alibi, AlibiMode};
//! use posenc::AttentionBias;
//!
//! assert_eq!(alibi_slopes(4)?, vec![0.25, 0.0625, 0.015625, 0.00390625]);
//! let alibi = Alibi::new(4, AlibiMode::Causal)?;
//! assert_eq!(alibi.bias(0, 5, 2)?, -0.25 * 3.0);
//! let bi = Alibi::new(4, AlibiMode::Bidirectional)?;
//! assert_eq!(bi.bias(0, 2, 5)?, -0.25 * 3.0);
//! # Ok::<(), posenc::Error>(())
//! ```

use crate::encoding::{positional_encoding, AttentionBias, Hooks};
use crate::error::{Error, Result};

/// The ALiBi slopes `m_0, …, m_{n−1}` for `num_heads = n` heads, in head
/// order, as the reference `get_slopes`:
///
/// ```text
/// pow2(n)  = [start · start^h for h in 0..n],  start = 2^(−2^(−(log2 n − 3)))
/// slopes(n) = pow2(n)                                        if n is a power of 2
///           = pow2(c) ++ slopes(2c)[0::2][: n − c],  c = 2^⌊log2 n⌋   otherwise
/// ```
///
/// # Errors
/// [`Error::ZeroHeads`] for `num_heads == 0`.
pub fn alibi_slopes(num_heads: usize) -> Result<Vec<f64>> {
    if num_heads == 0 {
        return Err(Error::ZeroHeads);
    }
    fn pow2(n: usize) -> Vec<f64> {
        let log2n = (n as f64).log2();
        let start = 2f64.powf(-(2f64.powf(-(log2n - 3.0))));
        (0..n).map(|i| start * start.powi(i as i32)).collect()
    }
    if num_heads.is_power_of_two() {
        return Ok(pow2(num_heads));
    }
    let closest = 1usize << num_heads.ilog2();
    let mut slopes = pow2(closest);
    let extra = alibi_slopes(2 * closest)?;
    slopes.extend(extra.into_iter().step_by(2).take(num_heads - closest));
    Ok(slopes)
}

/// Causal (decoder) or bidirectional (encoder) ALiBi.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AlibiMode {
    /// `−m·(i − j)`: penalises keys in the past; keys in the future (which a
    /// causal mask hides) get the same formula, hence a positive value.
    #[default]
    Causal,
    /// `−m·|i − j|`: symmetric.
    Bidirectional,
}

/// ALiBi biases for a number of heads (see the [module docs](self)).
#[derive(Debug, Clone, PartialEq)]
pub struct Alibi {
    slopes: Vec<f64>,
    mode: AlibiMode,
}

impl Alibi {
    /// ALiBi with the reference slopes for `num_heads` heads.
    ///
    /// # Errors
    /// [`Error::ZeroHeads`] for `num_heads == 0`.
    pub fn new(num_heads: usize, mode: AlibiMode) -> Result<Self> {
        Ok(Self {
            slopes: alibi_slopes(num_heads)?,
            mode,
        })
    }

    /// ALiBi with given slopes, one per head.
    ///
    /// # Errors
    /// [`Error::ZeroHeads`] for an empty list, [`Error::NotFinite`] for a NaN
    /// or infinite slope.
    pub fn with_slopes(slopes: Vec<f64>, mode: AlibiMode) -> Result<Self> {
        if slopes.is_empty() {
            return Err(Error::ZeroHeads);
        }
        for &m in &slopes {
            crate::error::check_finite("slope", m)?;
        }
        Ok(Self { slopes, mode })
    }

    /// The slopes, one per head.
    pub fn slopes(&self) -> &[f64] {
        &self.slopes
    }

    /// The mode.
    pub fn mode(&self) -> AlibiMode {
        self.mode
    }

    /// The bias of a head with slope `m` for signed distance
    /// `key − query = r`: `m·r` (causal) or `−m·|r|` (bidirectional).
    pub fn bias_for_distance(&self, slope: f64, relative: i64) -> f64 {
        match self.mode {
            AlibiMode::Causal => slope * relative as f64,
            AlibiMode::Bidirectional => -slope * relative.unsigned_abs() as f64,
        }
    }
}

positional_encoding!(Alibi, Hooks::LOGITS, |s| match s.mode {
    AlibiMode::Causal => "ALiBi (causal)",
    AlibiMode::Bidirectional => "ALiBi (bidirectional)",
});

impl AttentionBias for Alibi {
    fn num_heads(&self) -> usize {
        self.slopes.len()
    }

    fn bias(&self, head: usize, query: u64, key: u64) -> Result<f64> {
        super::check_head(head, self.slopes.len())?;
        let r = super::signed_distance(query, key)?;
        Ok(self.bias_for_distance(self.slopes[head], r))
    }
}
