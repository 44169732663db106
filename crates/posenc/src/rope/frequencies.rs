//! RoPE frequencies and the exact cos/sin tables built from them.
//!
//! The frequencies are the `f32` values Hugging Face transformers computes
//! (that is what checkpoints were trained with); the angle
//! `position × inv_freq` and its cosine and sine are evaluated in `f64` and
//! only then rounded, so a table is exact to `f32` rounding (≤ 6e-8) at every
//! position up to 2^53, where transformers' own `f32` angle is off by
//! 2.6e-2 at position 10^6.

use crate::error::{check_dim, check_positive, Error, Result};

/// How the rotated pairs are laid out in a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum PairLayout {
    /// Pair `i` is `(x[i], x[i + d/2])`: GPT-NeoX, Llama, Qwen, Mistral and
    /// most Hugging Face models (`rotate_half`).
    #[default]
    HalfSplit,
    /// Pair `i` is `(x[2i], x[2i + 1])`: GPT-J, RoFormer, the original paper.
    Interleaved,
}

impl PairLayout {
    /// The indices of pair `i` in a rotary block of width `rotary_dim`.
    #[inline]
    pub fn pair(self, i: usize, rotary_dim: usize) -> (usize, usize) {
        match self {
            PairLayout::HalfSplit => (i, i + rotary_dim / 2),
            PairLayout::Interleaved => (2 * i, 2 * i + 1),
        }
    }

    /// Name used on the command line and in JSON (`half-split`, `interleaved`).
    pub fn as_str(self) -> &'static str {
        match self {
            PairLayout::HalfSplit => "half-split",
            PairLayout::Interleaved => "interleaved",
        }
    }
}

crate::display_as_str!(PairLayout);

impl std::str::FromStr for PairLayout {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "half-split" | "half_split" | "halfsplit" | "neox" | "rotate_half" => {
                Ok(PairLayout::HalfSplit)
            }
            "interleaved" | "gptj" | "gpt-j" => Ok(PairLayout::Interleaved),
            _ => Err(Error::invalid(
                "layout",
                format!("{s:?} is not a pair layout (half-split or interleaved)"),
            )),
        }
    }
}

/// The frequencies of one RoPE configuration at one sequence length: what
/// transformers' `ROPE_INIT_FUNCTIONS[rope_type]` returns.
#[derive(Debug, Clone, PartialEq)]
pub struct RopeFrequencies {
    /// The rope type that produced them (`default`, `linear`, `yarn`, ...).
    pub rope_type: String,
    /// Number of rotated dimensions (2 × number of frequencies). The rest of
    /// the head passes through unchanged.
    pub rotary_dim: usize,
    /// Pair layout.
    pub layout: PairLayout,
    /// One inverse frequency per pair, in radians per position, as `f32`.
    pub inv_freq: Vec<f32>,
    /// Factor transformers multiplies cos and sin by (1 unless YaRN/LongRoPE).
    pub attention_factor: f64,
}

/// `1 / base^(2i / rotary_dim)` for `i in 0..rotary_dim/2`, as transformers'
/// `_compute_default_rope_parameters` (f64 here, rounded once to f32).
pub fn default_inv_freq(base: f64, rotary_dim: usize) -> Result<Vec<f64>> {
    if !(base.is_finite() && base > 0.0) {
        return Err(Error::InvalidTheta(base));
    }
    check_dim("rotary_dim", rotary_dim, true)?;
    Ok((0..rotary_dim / 2)
        .map(|i| 1.0 / base.powf((2 * i) as f64 / rotary_dim as f64))
        .collect())
}

impl RopeFrequencies {
    /// Plain RoPE with base `theta` over `rotary_dim` dimensions.
    ///
    /// ```
    /// use posenc::rope::{PairLayout, RopeFrequencies};
    /// let f = RopeFrequencies::plain(10000.0, 4, PairLayout::HalfSplit).unwrap();
    /// assert_eq!(f.inv_freq, vec![1.0, 0.01]);
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidTheta`] for a base that is not finite and positive;
    /// [`Error::InvalidDimension`] for an odd or zero `rotary_dim`.
    pub fn plain(theta: f64, rotary_dim: usize, layout: PairLayout) -> Result<Self> {
        let inv = default_inv_freq(theta, rotary_dim)?;
        Ok(RopeFrequencies {
            rope_type: "default".into(),
            rotary_dim,
            layout,
            inv_freq: inv.into_iter().map(|v| v as f32).collect(),
            attention_factor: 1.0,
        })
    }

    /// Builds frequencies from explicit values, checking them.
    ///
    /// # Errors
    /// [`Error::InvalidDimension`] if `inv_freq` is empty;
    /// [`Error::InvalidFactor`] if a frequency or the attention factor is not
    /// finite and positive.
    pub fn new(
        rope_type: impl Into<String>,
        inv_freq: Vec<f32>,
        attention_factor: f64,
        layout: PairLayout,
    ) -> Result<Self> {
        check_dim("number of frequencies", inv_freq.len(), false)?;
        for &f in &inv_freq {
            check_positive("inv_freq", f as f64)?;
        }
        check_positive("attention_factor", attention_factor)?;
        Ok(RopeFrequencies {
            rope_type: rope_type.into(),
            rotary_dim: 2 * inv_freq.len(),
            layout,
            inv_freq,
            attention_factor,
        })
    }

    /// Number of rotated pairs (`rotary_dim / 2`).
    pub fn num_freqs(&self) -> usize {
        self.inv_freq.len()
    }

    /// The angle of pair `i` at `position`, in f64.
    #[inline]
    pub fn angle(&self, position: u64, i: usize) -> f64 {
        position as f64 * self.inv_freq[i] as f64
    }

    /// `cos` and `sin` of every pair's angle at `position`, in f64, times the
    /// attention factor — one row of transformers' `(cos, sin)` (width
    /// `rotary_dim / 2`).
    pub fn cos_sin_f64(&self, position: u64) -> (Vec<f64>, Vec<f64>) {
        let a = self.attention_factor;
        (0..self.num_freqs())
            .map(|i| {
                let (s, c) = self.angle(position, i).sin_cos();
                (c * a, s * a)
            })
            .unzip()
    }

    /// Row-major `(positions.len(), rotary_dim / 2)` tables of cos and sin
    /// (attention factor applied), computed in f64 and rounded to f32.
    pub fn cos_sin_table(&self, positions: &[u64]) -> (Vec<f32>, Vec<f32>) {
        let n = self.num_freqs();
        let mut cos = Vec::with_capacity(positions.len() * n);
        let mut sin = Vec::with_capacity(positions.len() * n);
        for &p in positions {
            let (c, s) = self.cos_sin_f64(p);
            cos.extend(c.into_iter().map(|v| v as f32));
            sin.extend(s.into_iter().map(|v| v as f32));
        }
        (cos, sin)
    }

    /// Rotates the first `rotary_dim` entries of `x` (one query or key head)
    /// to `position`, in f64, as transformers' `apply_rotary_pos_emb` does:
    /// `x·cos + rotate(x)·sin`, both multiplied by the attention factor. The
    /// remaining entries (partial rotary) pass through.
    ///
    /// # Errors
    /// [`Error::Shape`] if `x` is shorter than `rotary_dim`.
    pub fn rotate(&self, x: &mut [f64], position: u64) -> Result<()> {
        if x.len() < self.rotary_dim {
            return Err(Error::Shape {
                what: "rope input",
                expected: format!("at least {} elements", self.rotary_dim),
                got: format!("{}", x.len()),
            });
        }
        let (cos, sin) = self.cos_sin_f64(position);
        for i in 0..self.num_freqs() {
            let (a, b) = self.layout.pair(i, self.rotary_dim);
            let (x0, x1) = (x[a], x[b]);
            x[a] = x0 * cos[i] - x1 * sin[i];
            x[b] = x1 * cos[i] + x0 * sin[i];
        }
        Ok(())
    }
}
