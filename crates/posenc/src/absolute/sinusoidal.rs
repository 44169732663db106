//! Sinusoidal positional encoding, Vaswani et al. 2017, *Attention Is All
//! You Need* (section 3.5).
//!
//! The model dimension is split into pairs; pair `i` turns at the angular
//! frequency `ω_i` (radians per position) and holds `sin(p·ω_i)` and
//! `cos(p·ω_i)` for position `p`:
//!
//! ```text
//! PE(p, 2i)     = sin(p · ω_i)        ω_i = base^(−2i/D)      (Paper spacing)
//! PE(p, 2i + 1) = cos(p · ω_i)        base = 10000
//! ```
//!
//! The wavelengths `2π/ω_i` form a geometric progression from `2π` towards
//! `base · 2π`.
//!
//! # Layouts and frequency spacings
//!
//! Two layouts are in use ([`SinusoidalLayout`]):
//!
//! - [`Interleaved`](SinusoidalLayout::Interleaved) (the default): even
//!   columns sin, odd columns cos, pair `i` in columns `(2i, 2i + 1)`. This is
//!   the paper's formula and the introductory articles' numpy/PyTorch code.
//! - [`Concatenated`](SinusoidalLayout::Concatenated): all sines first,
//!   then all cosines, `[sin(p·ω_0) … sin(p·ω_{n−1}) | cos(p·ω_0) … cos(p·ω_{n−1})]`,
//!   as in tensor2tensor's `get_timing_signal_1d`, fairseq's
//!   `SinusoidalPositionalEmbedding` and Whisper's `sinusoids`.
//!
//! and two frequency spacings ([`FrequencySpacing`]):
//!
//! - [`Paper`](FrequencySpacing::Paper) (the default): `ω_i = base^(−2i/D)`,
//!   `D` the full dimension (odd `D` included, exactly as the introductory articles' code
//!   `pos / 10000^(2·(j div 2)/D)`).
//! - [`Endpoint`](FrequencySpacing::Endpoint): `ω_i = base^(−i/max(n − 1, 1))`
//!   with `n` the number of pairs, so that the last frequency is exactly
//!   `1/base`. This is what tensor2tensor (`log(max_timescale)/max(n − 1, 1)`),
//!   fairseq (`log(10000)/(half_dim − 1)`) and Whisper
//!   (`log(max_timescale)/(channels//2 − 1)`) compute. It differs from the
//!   paper's spacing (`/n`) in every frequency but the first.
//!
//! [`Sinusoidal::new`] is the paper (interleaved, paper spacing);
//! [`Sinusoidal::tensor2tensor`] is the tensor2tensor / fairseq / Whisper
//! variant (concatenated, endpoint spacing).
//!
//! # Odd dimensions
//!
//! Odd `D` is accepted. Interleaved: there are `⌈D/2⌉` frequencies and the
//! last column is the sine of the last one, alone (as in the introductory articles' numpy
//! code). Concatenated: there are `⌊D/2⌋` frequencies and the last column is
//! zero (as tensor2tensor and fairseq pad it); `D = 1` is rejected there
//! since it would carry no information. With an odd interleaved `D` the last
//! sine has no cosine partner, so no linear map `M_k` exists and
//! [`Sinusoidal::linear_map`] returns an error.
//!
//! # Relative positions as a linear map
//!
//! For every shift `k` there is a matrix `M_k`, independent of `p`, with
//! `PE(p + k) = M_k · PE(p)`: a block-diagonal matrix of 2×2 rotations by
//! `k·ω_i` ([`Sinusoidal::linear_map`]).
//!
//! # Shapes and errors
//!
//! One row of length `D` per position; positions start at 0, plus the
//! [`offset`](Sinusoidal::with_offset). Errors: `D = 0`
//! ([`Error::InvalidDimension`]), a base that is not finite or `≤ 1`
//! ([`Error::InvalidValue`]), a non-finite explicit frequency
//! ([`Error::NotFinite`]), an output buffer of the wrong length
//! ([`Error::Shape`]), a position whose sum with the offset overflows
//! ([`Error::PositionOutOfRange`]).
//!
//! ```
//! use posenc::absolute::{Sinusoidal, SinusoidalLayout};
//! use posenc::AbsoluteEncoding;
//!
//! let pe = Sinusoidal::new(4)?;
//! let row = pe.encode(1)?;
//! assert!((row[0] - 1f64.sin()).abs() < 1e-15);
//! assert!((row[3] - (1.0 / 100f64).cos()).abs() < 1e-15);
//!
//! // PE(p + k) = M_k · PE(p)
//! let m = pe.linear_map(3)?;
//! let p5 = pe.encode(5)?;
//! let p8 = pe.encode(8)?;
//! for r in 0..4 {
//!     let y: f64 = (0..4).map(|c| m[r][c] * p5[c]).sum();
//!     assert!((y - p8[r]).abs() < 1e-12);
//! }
//!
//! let t2t = Sinusoidal::new(4)?.with_layout(SinusoidalLayout::Concatenated);
//! assert_eq!(t2t.encode(0)?, vec![0.0, 0.0, 1.0, 1.0]);
//! # Ok::<(), posenc::Error>(())
//! ```

use crate::encoding::{positional_encoding, AbsoluteEncoding, Hooks};
use crate::error::{check_dim, check_finite, Error, Result};

/// Where the sines and cosines go in a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SinusoidalLayout {
    /// Even columns sin, odd columns cos (the paper, the introductory articles' code).
    #[default]
    Interleaved,
    /// All sines, then all cosines (tensor2tensor, fairseq, Whisper); an odd
    /// dimension gets a zero last column.
    Concatenated,
}

/// How the frequencies are spaced between `1` and `1/base`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FrequencySpacing {
    /// `ω_i = base^(−2i/D)` (the paper).
    #[default]
    Paper,
    /// `ω_i = base^(−i/max(n − 1, 1))`, `n` the number of frequencies
    /// (tensor2tensor, fairseq, Whisper): the last frequency is `1/base`.
    Endpoint,
}

/// The sinusoidal encoding (see the [module docs](self)).
#[derive(Debug, Clone, PartialEq)]
pub struct Sinusoidal {
    dim: usize,
    base: f64,
    layout: SinusoidalLayout,
    spacing: FrequencySpacing,
    offset: u64,
    explicit: bool,
    freqs: Vec<f64>,
}

impl Sinusoidal {
    /// The default base, 10000.
    pub const DEFAULT_BASE: f64 = 10000.0;

    /// The paper's encoding of width `dim`: interleaved layout, paper
    /// spacing, base 10000, offset 0.
    ///
    /// # Errors
    /// [`Error::InvalidDimension`] if `dim == 0`.
    pub fn new(dim: usize) -> Result<Self> {
        check_dim("dim", dim, false)?;
        let mut s = Self {
            dim,
            base: Self::DEFAULT_BASE,
            layout: SinusoidalLayout::Interleaved,
            spacing: FrequencySpacing::Paper,
            offset: 0,
            explicit: false,
            freqs: Vec::new(),
        };
        s.refresh();
        Ok(s)
    }

    /// The tensor2tensor / fairseq / Whisper variant: concatenated layout,
    /// endpoint spacing, base 10000.
    ///
    /// # Errors
    /// [`Error::InvalidDimension`] if `dim < 2`.
    pub fn tensor2tensor(dim: usize) -> Result<Self> {
        let s = Self::new(dim)?;
        if dim < 2 {
            return Err(Error::InvalidDimension {
                what: "dim",
                value: dim,
                reason: "the concatenated layout needs at least 2 columns",
            });
        }
        Ok(s.with_layout(SinusoidalLayout::Concatenated)
            .with_spacing(FrequencySpacing::Endpoint))
    }

    /// An encoding with explicit angular frequencies (radians per position),
    /// one per pair: `dim = 2 · frequencies.len()`, interleaved layout.
    ///
    /// A pair turning at `f` cycles per position has `ω = 2π f`.
    ///
    /// # Errors
    /// [`Error::InvalidDimension`] if the list is empty, [`Error::NotFinite`]
    /// for a NaN or infinite frequency.
    pub fn with_frequencies(frequencies: Vec<f64>) -> Result<Self> {
        check_dim("number of frequencies", frequencies.len(), false)?;
        for &f in &frequencies {
            check_finite("frequency", f)?;
        }
        Ok(Self {
            dim: 2 * frequencies.len(),
            base: Self::DEFAULT_BASE,
            layout: SinusoidalLayout::Interleaved,
            spacing: FrequencySpacing::Paper,
            offset: 0,
            explicit: true,
            freqs: frequencies,
        })
    }

    /// Sets the base (10000 by default). Replaces explicit frequencies, if
    /// any, by the base's.
    ///
    /// # Errors
    /// [`Error::InvalidValue`] if `base` is not finite or `≤ 1`.
    pub fn with_base(mut self, base: f64) -> Result<Self> {
        if !base.is_finite() || base <= 1.0 {
            return Err(Error::invalid(
                "base",
                format!("{base} must be a finite number > 1"),
            ));
        }
        self.base = base;
        self.explicit = false;
        self.refresh();
        Ok(self)
    }

    /// Sets the layout.
    ///
    /// An odd dimension with the concatenated layout gets a zero last
    /// column; a dimension of 1 with it has no frequency at all (all zeros):
    /// use [`Sinusoidal::tensor2tensor`] to have that rejected.
    pub fn with_layout(mut self, layout: SinusoidalLayout) -> Self {
        self.layout = layout;
        self.refresh();
        self
    }

    /// Sets the frequency spacing (ignored for explicit frequencies).
    pub fn with_spacing(mut self, spacing: FrequencySpacing) -> Self {
        self.spacing = spacing;
        self.refresh();
        self
    }

    /// Shifts every position by `offset`: `encode(p)` returns the plain
    /// encoding of `p + offset`.
    pub fn with_offset(mut self, offset: u64) -> Self {
        self.offset = offset;
        self
    }

    fn num_freqs_for(&self) -> usize {
        match self.layout {
            SinusoidalLayout::Interleaved => self.dim.div_ceil(2),
            SinusoidalLayout::Concatenated => self.dim / 2,
        }
    }

    fn refresh(&mut self) {
        if self.explicit {
            return;
        }
        let n = self.num_freqs_for();
        let d = self.dim as f64;
        let ln_base = self.base.ln();
        self.freqs = (0..n)
            .map(|i| match self.spacing {
                FrequencySpacing::Paper => (-(2.0 * i as f64 / d) * ln_base).exp(),
                FrequencySpacing::Endpoint => {
                    let denom = (n.max(2) - 1) as f64;
                    (-(i as f64) * ln_base / denom).exp()
                }
            })
            .collect();
    }

    /// The base.
    pub fn base(&self) -> f64 {
        self.base
    }

    /// The layout.
    pub fn layout(&self) -> SinusoidalLayout {
        self.layout
    }

    /// The frequency spacing.
    pub fn spacing(&self) -> FrequencySpacing {
        self.spacing
    }

    /// The position offset.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// The angular frequencies `ω_i` (radians per position), one per pair.
    pub fn frequencies(&self) -> &[f64] {
        &self.freqs
    }

    /// The wavelengths `2π/ω_i` (positions per turn), one per pair.
    pub fn wavelengths(&self) -> Vec<f64> {
        self.freqs
            .iter()
            .map(|w| 2.0 * std::f64::consts::PI / w)
            .collect()
    }

    /// The columns `(sin, cos)` of pair `i`; `cos` is `None` for the lone
    /// last sine of an odd interleaved dimension.
    fn columns(&self, i: usize) -> (usize, Option<usize>) {
        match self.layout {
            SinusoidalLayout::Interleaved => {
                let c = 2 * i + 1;
                (2 * i, (c < self.dim).then_some(c))
            }
            SinusoidalLayout::Concatenated => (i, Some(self.freqs.len() + i)),
        }
    }

    /// Rows for positions `start, start + 1, …, start + count − 1` (each
    /// shifted by the offset).
    ///
    /// # Errors
    /// [`Error::PositionOutOfRange`] if a position overflows `u64`.
    pub fn table_range(&self, start: u64, count: usize) -> Result<Vec<Vec<f64>>> {
        (0..count as u64)
            .map(|i| {
                let p = start.checked_add(i).ok_or(Error::PositionOutOfRange {
                    position: start,
                    limit: u64::MAX,
                    what: "sinusoidal table",
                })?;
                self.encode(p)
            })
            .collect()
    }

    /// The `D × D` matrix `M_k` with `PE(p + k) = M_k · PE(p)` for every `p`
    /// (with `p + k ≥ 0`): block-diagonal, the block of pair `i` being the
    /// rotation
    ///
    /// ```text
    /// [ sin(ω(p+k)) ]   [  cos(kω)  sin(kω) ] [ sin(ωp) ]
    /// [ cos(ω(p+k)) ] = [ −sin(kω)  cos(kω) ] [ cos(ωp) ]
    /// ```
    ///
    /// placed on the pair's columns. The zero padding column of an odd
    /// concatenated layout maps to itself.
    ///
    /// # Errors
    /// [`Error::InvalidDimension`] for an odd interleaved dimension (its last
    /// sine has no cosine, so no such matrix exists).
    pub fn linear_map(&self, k: i64) -> Result<Vec<Vec<f64>>> {
        let d = self.dim;
        let mut m = vec![vec![0.0; d]; d];
        for i in 0..self.freqs.len() {
            let (s, c) = self.columns(i);
            let Some(c) = c else {
                return Err(Error::InvalidDimension {
                    what: "dim",
                    value: d,
                    reason: "an odd interleaved dimension has no linear map PE(p + k) = M_k PE(p)",
                });
            };
            let (sk, ck) = (k as f64 * self.freqs[i]).sin_cos();
            m[s][s] = ck;
            m[s][c] = sk;
            m[c][s] = -sk;
            m[c][c] = ck;
        }
        if self.layout == SinusoidalLayout::Concatenated && d % 2 == 1 {
            m[d - 1][d - 1] = 1.0;
        }
        Ok(m)
    }
}

positional_encoding!(Sinusoidal, Hooks::INPUT, |s| match s.layout {
    SinusoidalLayout::Interleaved => "sinusoidal (interleaved)",
    SinusoidalLayout::Concatenated => "sinusoidal (concatenated)",
});

impl AbsoluteEncoding for Sinusoidal {
    fn dim(&self) -> usize {
        self.dim
    }

    fn encode_into(&self, position: u64, out: &mut [f64]) -> Result<()> {
        super::check_out_len("sinusoidal output", out, self.dim)?;
        let p = position
            .checked_add(self.offset)
            .ok_or(Error::PositionOutOfRange {
                position,
                limit: u64::MAX - self.offset,
                what: "sinusoidal encoding with this offset",
            })? as f64;
        out.fill(0.0);
        for (i, &w) in self.freqs.iter().enumerate() {
            let (s, c) = (p * w).sin_cos();
            let (cs, cc) = self.columns(i);
            out[cs] = s;
            if let Some(cc) = cc {
                out[cc] = c;
            }
        }
        Ok(())
    }
}
