//! [`Rope`]: rotary position embedding at one configuration, on `f64` vectors.

use super::config::RopeConfig;
use super::frequencies::RopeFrequencies;
use crate::encoding::{positional_encoding, Hooks, RotaryEncoding};
use crate::error::{Error, Result};

/// Rotary position embedding (Su et al. 2021, *RoFormer*), with any scaling.
///
/// Pair `i` of a query or key at position `m` — `(x[i], x[i + d_r/2])`
/// half-split or `(x[2i], x[2i+1])` interleaved — is rotated by the angle
/// `m · θ_i` and, for YaRN and LongRoPE, multiplied by the attention factor
/// `a`:
///
/// ```text
/// x'_a = a · (x_a cos mθ_i − x_b sin mθ_i)
/// x'_b = a · (x_b cos mθ_i + x_a sin mθ_i)
/// ```
///
/// Entries past the rotary dimension `d_r` pass through unchanged. Because
/// rotations compose, `⟨R(m)q, R(n)k⟩ = a² ⟨q, R(n − m)k⟩` depends only on
/// `n − m`. Queries and keys are transformed identically. The angle and its
/// cosine and sine are computed in `f64` from the `f32` frequencies
/// transformers uses.
///
/// Shapes: one head vector of length [`head_dim`](RotaryEncoding::head_dim)
/// per call.
///
/// ```
/// use posenc::rope::{Rope, RopeConfig};
/// use posenc::RotaryEncoding;
/// let rope = Rope::new(RopeConfig::new(10000.0, 4)?)?;
/// let mut q = vec![1.0, 0.0, 0.0, 0.0];
/// rope.apply_query(&mut q, 1)?;
/// assert!((q[0] - 1f64.cos()).abs() < 1e-15 && (q[2] - 1f64.sin()).abs() < 1e-15);
/// # Ok::<(), posenc::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Rope {
    config: RopeConfig,
    freqs: RopeFrequencies,
}

impl Rope {
    /// RoPE with the frequencies `config` builds at load time
    /// (`frequencies(None)`).
    ///
    /// # Errors
    /// Those of [`RopeConfig::validate`].
    pub fn new(config: RopeConfig) -> Result<Self> {
        Self::at_seq_len(config, None)
    }

    /// RoPE with the frequencies for sequence length `seq_len` (dynamic NTK,
    /// LongRoPE).
    ///
    /// # Errors
    /// Those of [`RopeConfig::validate`].
    pub fn at_seq_len(config: RopeConfig, seq_len: Option<usize>) -> Result<Self> {
        let freqs = config.frequencies(seq_len)?;
        Ok(Rope { config, freqs })
    }

    /// The configuration.
    pub fn config(&self) -> &RopeConfig {
        &self.config
    }

    /// The frequencies in use.
    pub fn frequencies(&self) -> &RopeFrequencies {
        &self.freqs
    }

    fn check_len(&self, x: &[f64]) -> Result<()> {
        if x.len() != self.config.head_dim() {
            return Err(Error::Shape {
                what: "rope head vector",
                expected: format!("{} elements (head_dim)", self.config.head_dim()),
                got: format!("{}", x.len()),
            });
        }
        Ok(())
    }
}

positional_encoding!(Rope, Hooks::QUERY_KEY, |s| format!(
    "rope ({}, {})",
    s.config.rope_type(),
    s.config.layout().as_str()
));

impl RotaryEncoding for Rope {
    fn head_dim(&self) -> usize {
        self.config.head_dim()
    }

    /// # Errors
    /// [`Error::Shape`] if `q.len() != head_dim`.
    fn apply_query(&self, q: &mut [f64], position: u64) -> Result<()> {
        self.check_len(q)?;
        self.freqs.rotate(q, position)
    }

    /// # Errors
    /// [`Error::Shape`] if `k.len() != head_dim`.
    fn apply_key(&self, k: &mut [f64], position: u64) -> Result<()> {
        self.check_len(k)?;
        self.freqs.rotate(k, position)
    }
}
