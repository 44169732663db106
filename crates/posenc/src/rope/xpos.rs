//! xPos: RoPE with an exponential decay that makes attention length-extrapolatable.
//!
//! Sun, Dong, Patra, Ma, Huang, Benhaim, Chaudhary, Song, Wei 2022, *A
//! Length-Extrapolatable Transformer* (arXiv:2212.10554); reference code
//! `XPOS` in microsoft/torchscale (`xpos_relative_position.py`). Each rotary
//! pair `i` of a `d`-dimensional head gets, besides RoPE's rotation by
//! `m · θ_i` (`θ_i = base^(−2i/d)`), a scale
//!
//! ```text
//! ζ_i = (2i/d + γ) / (1 + γ),      γ = 0.4        (torchscale: (2i + 0.4 d) / (1.4 d))
//! query at m:  R(m) q · ζ_i^( m / scale_base)
//! key   at n:  R(n) k · ζ_i^(−n / scale_base)     (scale_base = 512)
//! ```
//!
//! so that `⟨q_m, k_n⟩ = Σ_i ζ_i^((m−n)/scale_base) · (rotated pair products)`
//! depends only on `m − n`, and decays with the distance for a query after
//! its key (`ζ_i < 1`). torchscale measures the scale exponent from the
//! middle of the window (`min_pos = −(L + offset)/2`); that shift multiplies
//! queries by `ζ^(−c)` and keys by `ζ^(c)`, which cancels in every `q·k`, so
//! plain positions are used here. torchscale pairs dimensions interleaved
//! (`rotate_every_two`), the default layout here.
//!
//! Note that `ζ^(m/scale_base)` under- or overflows `f64` for positions far
//! beyond what xPos is used with (ζ_0 = 0.2857 and m/512 ≈ 600 reach 1e−327):
//! keep positions within the attention window, as torchscale does.

use super::frequencies::PairLayout;
use crate::encoding::{positional_encoding, Hooks, RotaryEncoding};
use crate::error::{check_dim, check_positive, Error, Result};

/// xPos on `f64` head vectors.
///
/// ```
/// use posenc::rope::xpos::XPos;
/// use posenc::RotaryEncoding;
/// let x = XPos::new(4)?;
/// // q·k depends on m − n only
/// let dot = |m: u64, n: u64| -> posenc::Result<f64> {
///     let (mut q, mut k) = (vec![1.0, 2.0, 3.0, 4.0], vec![0.5, -1.0, 2.0, 1.0]);
///     x.apply_query(&mut q, m)?;
///     x.apply_key(&mut k, n)?;
///     Ok(q.iter().zip(&k).map(|(a, b)| a * b).sum())
/// };
/// assert!((dot(10, 3)? - dot(107, 100)?).abs() < 1e-12);
/// # Ok::<(), posenc::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct XPos {
    head_dim: usize,
    theta: f64,
    gamma: f64,
    scale_base: f64,
    layout: PairLayout,
    inv_freq: Vec<f64>,
    zeta: Vec<f64>,
}

impl XPos {
    /// xPos over a head of `head_dim` dimensions with torchscale's defaults:
    /// base 10000, γ = 0.4, `scale_base` = 512, interleaved pairs.
    ///
    /// # Errors
    /// [`Error::InvalidDimension`] if `head_dim` is zero or odd.
    pub fn new(head_dim: usize) -> Result<Self> {
        check_dim("head_dim", head_dim, true)?;
        let mut x = XPos {
            head_dim,
            theta: 10000.0,
            gamma: 0.4,
            scale_base: 512.0,
            layout: PairLayout::Interleaved,
            inv_freq: Vec::new(),
            zeta: Vec::new(),
        };
        x.rebuild();
        Ok(x)
    }

    fn rebuild(&mut self) {
        let d = self.head_dim as f64;
        self.inv_freq = (0..self.head_dim / 2)
            .map(|i| self.theta.powf(-((2 * i) as f64) / d))
            .collect();
        self.zeta = (0..self.head_dim / 2)
            .map(|i| ((2 * i) as f64 / d + self.gamma) / (1.0 + self.gamma))
            .collect();
    }

    /// Sets the decay length `scale_base` (default 512).
    ///
    /// # Errors
    /// [`Error::InvalidFactor`] unless finite and > 0.
    pub fn with_scale_base(mut self, scale_base: f64) -> Result<Self> {
        self.scale_base = check_positive("scale_base", scale_base)?;
        Ok(self)
    }

    /// Sets γ (default 0.4).
    ///
    /// # Errors
    /// [`Error::InvalidFactor`] unless finite and > 0.
    pub fn with_gamma(mut self, gamma: f64) -> Result<Self> {
        self.gamma = check_positive("gamma", gamma)?;
        self.rebuild();
        Ok(self)
    }

    /// Sets the rotary base (default 10000).
    ///
    /// # Errors
    /// [`Error::InvalidTheta`] unless finite and > 0.
    pub fn with_theta(mut self, theta: f64) -> Result<Self> {
        if !(theta.is_finite() && theta > 0.0) {
            return Err(Error::InvalidTheta(theta));
        }
        self.theta = theta;
        self.rebuild();
        Ok(self)
    }

    /// Sets the pair layout (default interleaved, as torchscale).
    pub fn with_layout(mut self, layout: PairLayout) -> Self {
        self.layout = layout;
        self
    }

    /// The per-pair decay bases `ζ_i`.
    pub fn zeta(&self) -> &[f64] {
        &self.zeta
    }

    /// The per-pair frequencies `θ_i` (f64).
    pub fn inv_freq(&self) -> &[f64] {
        &self.inv_freq
    }

    /// `scale_base`.
    pub fn scale_base(&self) -> f64 {
        self.scale_base
    }

    /// The layout.
    pub fn layout(&self) -> PairLayout {
        self.layout
    }

    /// The factor of each pair at `position`: `ζ_i^(m/scale_base)` for a
    /// query (`key = false`), `ζ_i^(−n/scale_base)` for a key.
    pub fn scales(&self, position: u64, key: bool) -> Vec<f64> {
        let sign = if key { -1.0 } else { 1.0 };
        let e = sign * position as f64 / self.scale_base;
        self.zeta.iter().map(|z| z.powf(e)).collect()
    }

    fn apply(&self, x: &mut [f64], position: u64, sign: f64) -> Result<()> {
        if x.len() != self.head_dim {
            return Err(Error::Shape {
                what: "xpos head vector",
                expected: format!("{} elements (head_dim)", self.head_dim),
                got: format!("{}", x.len()),
            });
        }
        let m = position as f64;
        let scales = self.scales(position, sign < 0.0);
        for (i, &z) in scales.iter().enumerate() {
            let (s, c) = (m * self.inv_freq[i]).sin_cos();
            let (a, b) = self.layout.pair(i, self.head_dim);
            let (x0, x1) = (x[a], x[b]);
            x[a] = (x0 * c - x1 * s) * z;
            x[b] = (x1 * c + x0 * s) * z;
        }
        Ok(())
    }
}

positional_encoding!(XPos, Hooks::QUERY_KEY, |s| format!(
    "xpos ({})",
    s.layout.as_str()
));

impl RotaryEncoding for XPos {
    fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// Rotates by `m·θ_i` and scales pair `i` by `ζ_i^(m/scale_base)`.
    ///
    /// # Errors
    /// [`Error::Shape`] if `q.len() != head_dim`.
    fn apply_query(&self, q: &mut [f64], position: u64) -> Result<()> {
        self.apply(q, position, 1.0)
    }

    /// Rotates by `n·θ_i` and scales pair `i` by `ζ_i^(−n/scale_base)`.
    ///
    /// # Errors
    /// [`Error::Shape`] if `k.len() != head_dim`.
    fn apply_key(&self, k: &mut [f64], position: u64) -> Result<()> {
        self.apply(k, position, -1.0)
    }
}
