//! Multi-axis RoPE: one position per axis, one axis per frequency.
//!
//! Plain RoPE rotates pair `j` of a head by `m · θ_j`, where `m` is the
//! token's position. Multi-axis variants give a token one position per axis
//! — (time, height, width) for M-RoPE, (row, column) for 2-D vision RoPE —
//! and assign each pair `j` a frequency `θ_j` and an axis `a(j)`:
//!
//! ```text
//! angle_j(p) = p[a(j)] · θ_j
//! x'_a = A · (x_a cos angle_j − x_b sin angle_j)
//! x'_b = A · (x_b cos angle_j + x_a sin angle_j)
//! ```
//!
//! with the pair `(a, b)` of the [`PairLayout`] and the attention factor `A`.
//! With the same position on every axis this is plain RoPE with the same
//! frequencies, which is why M-RoPE models read text exactly like a 1-D
//! RoPE. For two tokens `p`, `q` the logit of pair `j` depends on
//! `p[a(j)] − q[a(j)]` only: relative on every axis at once.
//!
//! Every variant of posenc is a constructor over [`AxialFrequencies`]:
//!
//! | variant | module | axes | assignment |
//! |---|---|---|---|
//! | generic axial RoPE (Heo et al. 2024) | [`AxialFrequencies::axial`] | any | chunked or interleaved |
//! | M-RoPE (Qwen2-VL, Qwen2.5-VL, GLM-4V) | [`super::mrope`] | t, h, w | chunked by `mrope_section` |
//! | interleaved M-RoPE (Qwen3-VL, Qwen3.5) | [`super::mrope`] | t, h, w | `j mod 3` within the sections |
//! | Pixtral | [`super::vision::pixtral`] | h, w | h: even frequencies, w: odd |
//! | Qwen-VL vision | [`super::vision::qwen_vl_vision`] | h, w | halves |
//! | Llama 4 vision | [`super::vision::llama4_vision`] | x, y | halves, interleaved pairs |
//!
//! Heo, Park, Han, Yun 2024, *Rotary Position Embedding for Vision
//! Transformer* (ECCV 2024, arXiv:2403.13298) introduced axial RoPE for
//! images; the multimodal variants are cited in their modules.
//!
//! Angles and their cos/sin are computed in `f64` from the `f32`
//! frequencies, as for 1-D RoPE ([`super::frequencies`]).

use super::frequencies::{PairLayout, RopeFrequencies};
use super::limits::{MAX_AXES, MAX_HEAD_DIM, MAX_TABLE_VALUES};
use super::scaling::default_inv_freq_f32;
use crate::error::{check_dim, check_size, Error, Result};

/// How a generic axial RoPE spreads its pairs over the axes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum AxisSplit {
    /// Axis `a` takes a contiguous block of pairs (Heo et al.'s RoPE-Axial,
    /// Qwen-VL's vision encoder).
    #[default]
    Chunked,
    /// Pair `j` takes axis `j mod A` (each axis spans every band of
    /// wavelengths).
    Interleaved,
}

/// The frequencies of a multi-axis RoPE: per pair `j` a frequency `θ_j` and
/// an axis `a(j)`. See [the module](self).
///
/// ```
/// use posenc::rope::axial::{AxialFrequencies, AxisSplit};
/// use posenc::rope::PairLayout;
/// // a 2-D axial RoPE over a 16-dimensional head: 4 pairs per axis
/// let f = AxialFrequencies::axial(100.0, 16, 2, AxisSplit::Chunked, PairLayout::HalfSplit)?;
/// assert_eq!(f.axes(), &[0, 0, 0, 0, 1, 1, 1, 1]);
/// // the patch at row 2, column 5
/// let (cos, _sin) = f.cos_sin_f64(&[2, 5])?;
/// assert!((cos[0] - 2f64.cos()).abs() < 1e-15 && (cos[4] - 5f64.cos()).abs() < 1e-15);
/// # Ok::<(), posenc::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct AxialFrequencies {
    rope_type: String,
    layout: PairLayout,
    inv_freq: Vec<f32>,
    axis: Vec<usize>,
    num_axes: usize,
    attention_factor: f64,
}

impl AxialFrequencies {
    /// Frequencies `inv_freq[j]` on axes `axis[j]`.
    ///
    /// # Errors
    /// [`Error::InvalidDimension`] for no frequencies, no axis or lists of
    /// different lengths; [`Error::TooLarge`] for more than
    /// [`MAX_HEAD_DIM`]` / 2` frequencies or [`MAX_AXES`] axes;
    /// [`Error::InvalidValue`] for an axis `≥ num_axes`; [`Error::NotFinite`]
    /// for a frequency that is not finite and `≥ 0`;
    /// [`Error::InvalidFactor`] for an attention factor that is not finite
    /// and `> 0`.
    pub fn new(
        rope_type: impl Into<String>,
        inv_freq: Vec<f32>,
        axis: Vec<usize>,
        num_axes: usize,
        attention_factor: f64,
        layout: PairLayout,
    ) -> Result<Self> {
        check_dim("number of frequencies", inv_freq.len(), false)?;
        check_size("number of frequencies", inv_freq.len(), MAX_HEAD_DIM / 2)?;
        check_dim("number of axes", num_axes, false)?;
        check_size("number of axes", num_axes, MAX_AXES)?;
        if axis.len() != inv_freq.len() {
            return Err(Error::InvalidDimension {
                what: "number of axis assignments",
                value: axis.len(),
                reason: "must equal the number of frequencies",
            });
        }
        if let Some((j, &a)) = axis.iter().enumerate().find(|(_, &a)| a >= num_axes) {
            return Err(Error::invalid(
                "axis",
                format!("pair {j} is on axis {a}, but there are {num_axes} axes"),
            ));
        }
        if let Some(&f) = inv_freq.iter().find(|f| !(f.is_finite() && **f >= 0.0)) {
            return Err(Error::NotFinite {
                name: "inv_freq",
                value: f as f64,
            });
        }
        crate::error::check_positive("attention_factor", attention_factor)?;
        Ok(AxialFrequencies {
            rope_type: rope_type.into(),
            layout,
            inv_freq,
            axis,
            num_axes,
            attention_factor,
        })
    }

    /// The frequencies of a 1-D RoPE spread over axes: pair `j` on `axis[j]`.
    ///
    /// # Errors
    /// As [`new`](Self::new).
    pub fn from_frequencies(
        f: &RopeFrequencies,
        axis: Vec<usize>,
        num_axes: usize,
    ) -> Result<Self> {
        Self::new(
            f.rope_type.clone(),
            f.inv_freq.clone(),
            axis,
            num_axes,
            f.attention_factor,
            f.layout,
        )
    }

    /// Generic axial RoPE (Heo et al. 2024): `rotary_dim / 2` pairs split
    /// evenly over `num_axes` axes, each axis with the frequencies of a
    /// plain RoPE of `rotary_dim / num_axes` dimensions, `θ_k =
    /// theta^(−2k / (rotary_dim / num_axes))` (computed in `f32` as
    /// transformers does).
    ///
    /// # Errors
    /// [`Error::InvalidTheta`]; [`Error::InvalidDimension`] for an odd or zero
    /// `rotary_dim`, or `rotary_dim / 2` not a multiple of `num_axes`; those
    /// of [`new`](Self::new).
    pub fn axial(
        theta: f64,
        rotary_dim: usize,
        num_axes: usize,
        split: AxisSplit,
        layout: PairLayout,
    ) -> Result<Self> {
        if !(theta.is_finite() && theta > 0.0) {
            return Err(Error::InvalidTheta(theta));
        }
        check_size("rotary_dim", rotary_dim, MAX_HEAD_DIM)?;
        check_dim("rotary_dim", rotary_dim, true)?;
        check_dim("number of axes", num_axes, false)?;
        check_size("number of axes", num_axes, MAX_AXES)?;
        let pairs = rotary_dim / 2;
        if !pairs.is_multiple_of(num_axes) {
            return Err(Error::InvalidDimension {
                what: "rotary_dim / 2",
                value: pairs,
                reason: "must be a multiple of the number of axes",
            });
        }
        let per = pairs / num_axes;
        let base = default_inv_freq_f32(theta, 2 * per);
        let (inv, axis): (Vec<f32>, Vec<usize>) = (0..pairs)
            .map(|j| match split {
                AxisSplit::Chunked => (base[j % per], j / per),
                AxisSplit::Interleaved => (base[j / num_axes], j % num_axes),
            })
            .unzip();
        Self::new("axial", inv, axis, num_axes, 1.0, layout)
    }

    /// The name of the variant (`axial`, `mrope`, `pixtral`, ... or the
    /// scaling's `rope_type` for M-RoPE).
    pub fn rope_type(&self) -> &str {
        &self.rope_type
    }
    /// The pair layout.
    pub fn layout(&self) -> PairLayout {
        self.layout
    }
    /// One frequency per pair.
    pub fn inv_freq(&self) -> &[f32] {
        &self.inv_freq
    }
    /// The axis of each pair.
    pub fn axes(&self) -> &[usize] {
        &self.axis
    }
    /// Number of axes (positions per token).
    pub fn num_axes(&self) -> usize {
        self.num_axes
    }
    /// Number of pairs (`rotary_dim / 2`).
    pub fn num_freqs(&self) -> usize {
        self.inv_freq.len()
    }
    /// Number of rotated dimensions.
    pub fn rotary_dim(&self) -> usize {
        2 * self.inv_freq.len()
    }
    /// Factor applied to cos and sin.
    pub fn attention_factor(&self) -> f64 {
        self.attention_factor
    }
    /// Number of pairs on each axis.
    pub fn axis_counts(&self) -> Vec<usize> {
        let mut c = vec![0; self.num_axes];
        for &a in &self.axis {
            c[a] += 1;
        }
        c
    }

    fn check_position(&self, pos: &[u64]) -> Result<()> {
        if pos.len() != self.num_axes {
            return Err(Error::Shape {
                what: "multi-axis position",
                expected: format!("{} values (one per axis)", self.num_axes),
                got: format!("{}", pos.len()),
            });
        }
        Ok(())
    }

    /// The angle of pair `j` at the position `pos` (one value per axis), in
    /// `f64`.
    ///
    /// # Panics
    /// If `j` or an axis is out of range (see
    /// [`cos_sin_f64`](Self::cos_sin_f64) for the checked form).
    #[inline]
    pub fn angle(&self, pos: &[u64], j: usize) -> f64 {
        pos[self.axis[j]] as f64 * self.inv_freq[j] as f64
    }

    /// `cos` and `sin` of every pair's angle at `pos`, times the attention
    /// factor, in `f64`.
    ///
    /// # Errors
    /// [`Error::Shape`] unless `pos` has one value per axis.
    pub fn cos_sin_f64(&self, pos: &[u64]) -> Result<(Vec<f64>, Vec<f64>)> {
        self.check_position(pos)?;
        let a = self.attention_factor;
        Ok((0..self.num_freqs())
            .map(|j| {
                let (s, c) = self.angle(pos, j).sin_cos();
                (c * a, s * a)
            })
            .unzip())
    }

    /// Row-major `(rows, rotary_dim / 2)` tables of cos and sin (attention
    /// factor applied) at `positions`, a row-major `(rows, num_axes)` list,
    /// computed in `f64` and rounded to `f32`.
    ///
    /// # Errors
    /// [`Error::Shape`] if `positions.len()` is not a multiple of the number
    /// of axes; [`Error::TooLarge`] for tables of more than
    /// [`MAX_TABLE_VALUES`] values.
    pub fn cos_sin_table(&self, positions: &[u64]) -> Result<(Vec<f32>, Vec<f32>)> {
        if !positions.len().is_multiple_of(self.num_axes) {
            return Err(Error::Shape {
                what: "multi-axis positions",
                expected: format!("a multiple of {} values (rows × axes)", self.num_axes),
                got: format!("{}", positions.len()),
            });
        }
        let rows = positions.len() / self.num_axes;
        let n = self.num_freqs();
        check_size(
            "table size (positions × rotary_dim / 2)",
            rows.saturating_mul(n),
            MAX_TABLE_VALUES,
        )?;
        let mut cos = Vec::with_capacity(rows * n);
        let mut sin = Vec::with_capacity(rows * n);
        for p in positions.chunks(self.num_axes) {
            let (c, s) = self.cos_sin_f64(p)?;
            cos.extend(c.into_iter().map(|v| v as f32));
            sin.extend(s.into_iter().map(|v| v as f32));
        }
        Ok((cos, sin))
    }

    /// Rotates the first `rotary_dim` entries of `x` (one query or key head)
    /// to the position `pos`, in `f64`; the rest passes through.
    ///
    /// # Errors
    /// [`Error::Shape`] if `x` is shorter than `rotary_dim` or `pos` does not
    /// have one value per axis.
    pub fn rotate(&self, x: &mut [f64], pos: &[u64]) -> Result<()> {
        let rd = self.rotary_dim();
        if x.len() < rd {
            return Err(Error::Shape {
                what: "multi-axis rope input",
                expected: format!("at least {rd} elements"),
                got: format!("{}", x.len()),
            });
        }
        let (cos, sin) = self.cos_sin_f64(pos)?;
        for j in 0..self.num_freqs() {
            let (a, b) = self.layout.pair(j, rd);
            let (x0, x1) = (x[a], x[b]);
            x[a] = x0 * cos[j] - x1 * sin[j];
            x[b] = x1 * cos[j] + x0 * sin[j];
        }
        Ok(())
    }
}
