//! Multi-axis RoPE on candle tensors: M-RoPE, 2-D vision RoPE, axial RoPE.
//!
//! [`AxialRope`] rotates queries and keys with the frequencies of an
//! [`AxialFrequencies`] (pair `j` by `p[a(j)] · θ_j`, one position per axis
//! and token; see [`crate::rope::axial`]). Positions are given per axis, as
//! transformers' `(3, B, T)` M-RoPE position ids ([`AxisPositions`]).
//!
//! # Paths
//! - [`AxialRope::apply`] / [`AxialRope::rotate`]: the fused SIMD kernel of
//!   [`crate::tensor::rope`] (same per-vector kernels, same backward pass:
//!   the rotation with the sine negated) with a per-token table: one exact
//!   `f64` row per distinct position tuple of the call, rounded once to
//!   `f32`. Out of place and differentiable.
//! - [`AxialRope::apply_inplace`]: the same kernel on the tensors' own
//!   storage (contract of [`crate::tensor::rope::Rope::apply_inplace`]).
//! - [`AxialRope::apply_reference`]: composed candle ops — angles per axis
//!   as `(A, B, T, D/2)` `f64` tensors, cos and sin by candle, the axis of
//!   each pair picked by a one-hot mask — then the same composed rotation
//!   as 1-D RoPE's reference; any device, differentiable by candle itself.
//!   The fused path is tested against it, values and gradients.
//!
//! # Shapes
//! Queries `(B, Hq, T, D)` and keys `(B, Hk, T, D)` ([`HeadLayout::Bhtd`]) or
//! `(B, T, H, D)` ([`HeadLayout::Bthd`]); `f32`, `f16`, `bf16` (reference
//! path: also `f64`).
//!
//! ```
//! use candle_core::{Device, Tensor};
//! use posenc::rope::mrope::{rope_index, IndexRules, Mrope, MropeLayout, Segment};
//! use posenc::rope::RopeConfig;
//! use posenc::tensor::axial::{AxialRope, AxisPositions};
//!
//! let m = Mrope::new(RopeConfig::new(1e6, 16)?, vec![2, 3, 3], MropeLayout::Chunked)?;
//! let rope = AxialRope::new(m.frequencies(None)?)?;
//! // text, a 1×4×4 image merged 2×2 (4 tokens), text
//! let ids = rope_index(&[Segment::Text(3), Segment::Image { t: 1, h: 4, w: 4 }, Segment::Text(2)],
//!                      IndexRules::Qwen2Vl, 2)?;
//! let q = Tensor::randn(0f32, 1.0, (1, 2, ids.len(), 16), &Device::Cpu)?;
//! let k = Tensor::randn(0f32, 1.0, (1, 2, ids.len(), 16), &Device::Cpu)?;
//! let flat = ids.flat();
//! let (q1, _k1) = rope.apply(&q, &k, AxisPositions::Host(&flat))?;
//! let (q2, _k2) = rope.apply_reference(&q, &k, AxisPositions::Host(&flat))?;
//! assert!((q1 - q2)?.abs()?.max_all()?.to_scalar::<f32>()? < 1e-5);
//! # Ok::<(), posenc::Error>(())
//! ```

use std::collections::HashMap;
use std::sync::Arc;

use candle_core::Tensor;
use rayon::prelude::*;

use super::rope::{offset_end, rotate_reference_with, FusedRope, Role, Rows, TensorChecks};
use super::{batch_ids, ids_to_u64, Positions};
use crate::error::{check_size, Error, Result};
use crate::kernels::table::Tables;
use crate::kernels::{HeadLayout, SimdLevel};
use crate::rope::axial::AxialFrequencies;
use crate::rope::limits::MAX_TABLE_VALUES;

/// The positions of a call, one per axis and token.
#[derive(Debug, Clone, Copy)]
pub enum AxisPositions<'a> {
    /// An `(A, B, T)` tensor of non-negative ids (`u32` or `i64`): plane `a`
    /// holds every token's position on axis `a` (transformers' `(3, B, T)`
    /// M-RoPE `position_ids`).
    Ids(&'a Tensor),
    /// Host positions, row-major `(B, T, A)`: token `(b, t)`'s position on
    /// axis `a` at `(b · T + t) · A + a` (what
    /// [`MropePositions::flat`](crate::rope::mrope::MropePositions::flat)
    /// gives for one sequence).
    Host(&'a [u64]),
    /// The same 1-D positions on every axis (text tokens): an offset or
    /// `(B, T)` ids.
    Same(Positions<'a>),
}

impl<'a> From<&'a Tensor> for AxisPositions<'a> {
    fn from(t: &'a Tensor) -> Self {
        AxisPositions::Ids(t)
    }
}

impl From<usize> for AxisPositions<'_> {
    fn from(o: usize) -> Self {
        AxisPositions::Same(Positions::Offset(o))
    }
}

/// Multi-axis RoPE on candle tensors. See [the module](self).
pub struct AxialRope {
    freqs: AxialFrequencies,
    /// Rope's fused paths with this rope's checks (layout, and the fixed
    /// frequencies' rotary_dim and pairs) and SIMD level.
    fused: FusedRope,
}

impl std::fmt::Debug for AxialRope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AxialRope")
            .field("rope_type", &self.freqs.rope_type())
            .field("axes", &self.freqs.num_axes())
            .field("rotary_dim", &self.freqs.rotary_dim())
            .field("pairs", &self.freqs.layout())
            .field("layout", &self.fused.checks.layout)
            .field("simd", &self.fused.level)
            .finish()
    }
}

/// Positions of a call as the host sees them: row-major `(B·T, A)`.
struct HostAxes {
    pos: Vec<u64>,
}

impl AxialRope {
    /// A multi-axis rope for [`HeadLayout::Bhtd`] tensors.
    ///
    /// # Errors
    /// None today (the frequencies were checked when built); kept fallible
    /// like [`Rope::new`](super::rope::Rope::new).
    pub fn new(freqs: AxialFrequencies) -> Result<Self> {
        let checks = TensorChecks {
            layout: HeadLayout::Bhtd,
            rotary_dim: freqs.rotary_dim(),
            pairs: freqs.layout(),
        };
        Ok(AxialRope {
            freqs,
            fused: FusedRope {
                checks,
                level: SimdLevel::detect(),
            },
        })
    }

    /// Sets the axis order of the tensors.
    pub fn with_layout(mut self, layout: HeadLayout) -> Self {
        self.fused.checks.layout = layout;
        self
    }

    /// Forces a SIMD level (tests, benchmarks).
    ///
    /// # Errors
    /// [`Error::InvalidValue`] if this CPU lacks it.
    pub fn with_simd_level(mut self, level: SimdLevel) -> Result<Self> {
        self.fused.level = level.supported()?;
        Ok(self)
    }

    /// The frequencies.
    pub fn frequencies(&self) -> &AxialFrequencies {
        &self.freqs
    }

    /// The tensor layout.
    pub fn layout(&self) -> HeadLayout {
        self.fused.checks.layout
    }

    /// Tables and rows of a call at `positions`, for `b` sequences of `t`
    /// steps: one table row per distinct position tuple.
    fn rows_at(
        &self,
        positions: AxisPositions<'_>,
        b: usize,
        t: usize,
    ) -> Result<(Arc<Tables>, Rows)> {
        let h = self.host(positions, b, t)?;
        let (tables, rows) = self.tables(&h)?;
        Ok((tables, Rows::Ids(rows)))
    }

    /// Every token's positions, row-major `(B·T, A)`.
    fn host(&self, positions: AxisPositions<'_>, b: usize, t: usize) -> Result<HostAxes> {
        let na = self.freqs.num_axes();
        let n = b * t;
        let pos = match positions {
            AxisPositions::Host(v) => {
                if v.len() != n * na {
                    return Err(Error::Shape {
                        what: "multi-axis positions",
                        expected: format!(
                            "{} values (batch {b} × seq_len {t} × {na} axes)",
                            n * na
                        ),
                        got: format!("{}", v.len()),
                    });
                }
                v.to_vec()
            }
            AxisPositions::Ids(ids) => {
                if ids.dims() != [na, b, t] {
                    return Err(Error::Shape {
                        what: "multi-axis position ids",
                        expected: format!("({na}, {b}, {t}) = (axes, batch, seq_len)"),
                        got: format!("{:?}", ids.dims()),
                    });
                }
                let planes = ids_to_u64(ids, false)?;
                let mut v = vec![0u64; n * na];
                for a in 0..na {
                    for i in 0..n {
                        v[i * na + a] = planes[a * n + i];
                    }
                }
                v
            }
            AxisPositions::Same(p) => {
                let one: Vec<u64> = match p {
                    Positions::Offset(o) => {
                        let end = offset_end(o, t)?;
                        (0..b).flat_map(|_| o as u64..end as u64).collect()
                    }
                    Positions::Ids(ids) => batch_ids(ids, b, t, false)?,
                };
                one.iter()
                    .flat_map(|&p| std::iter::repeat_n(p, na))
                    .collect()
            }
        };
        Ok(HostAxes { pos })
    }

    /// Exact tables with one row per distinct position tuple, and the row
    /// of every token.
    fn tables(&self, h: &HostAxes) -> Result<(Arc<Tables>, Vec<usize>)> {
        let na = self.freqs.num_axes();
        let nf = self.freqs.num_freqs();
        let mut index: HashMap<&[u64], usize> = HashMap::new();
        let mut uniq: Vec<&[u64]> = Vec::new();
        let rows: Vec<usize> = h
            .pos
            .chunks(na)
            .map(|p| {
                *index.entry(p).or_insert_with(|| {
                    uniq.push(p);
                    uniq.len() - 1
                })
            })
            .collect();
        check_size(
            "table size (distinct positions × rotary_dim / 2)",
            uniq.len().saturating_mul(nf),
            MAX_TABLE_VALUES,
        )?;
        let mut cos = vec![0f32; uniq.len() * nf];
        let mut sin = vec![0f32; uniq.len() * nf];
        let a = self.freqs.attention_factor();
        let f = &self.freqs;
        cos.par_chunks_mut(nf)
            .zip(sin.par_chunks_mut(nf))
            .zip(uniq.par_iter())
            .for_each(|((c, s), p)| {
                for j in 0..nf {
                    let (sv, cv) = f.angle(p, j).sin_cos();
                    c[j] = (cv * a) as f32;
                    s[j] = (sv * a) as f32;
                }
            });
        Ok((
            Arc::new(Tables {
                n_freq: nf,
                rows: uniq.len(),
                cos,
                sin,
                cos_k: Vec::new(),
                sin_k: Vec::new(),
            }),
            rows,
        ))
    }

    /// Rotates queries and keys (fused kernel, out of place, differentiable).
    ///
    /// # Errors
    /// Before any kernel runs: [`Error::InvalidValue`] for a tensor not on
    /// the CPU; [`Error::DType`] for a dtype other than f32/f16/bf16, keys
    /// of another dtype, or ids that are not u32/i64; [`Error::Shape`] for
    /// tensors that are not 4-d, keys that do not match the queries, or
    /// positions of the wrong shape; [`Error::InvalidDimension`] for a zero
    /// or odd dimension or `rotary_dim > head_dim`;
    /// [`Error::NegativePosition`]; [`Error::TooLarge`] for a table of more
    /// than [`MAX_TABLE_VALUES`] values.
    pub fn apply<'a>(
        &self,
        q: &Tensor,
        k: &Tensor,
        positions: impl Into<AxisPositions<'a>>,
    ) -> Result<(Tensor, Tensor)> {
        let p = positions.into();
        self.fused.apply(q, k, |b, t| self.rows_at(p, b, t))
    }

    /// Rotates one tensor (fused, out of place, differentiable).
    ///
    /// # Errors
    /// As [`apply`](Self::apply).
    pub fn rotate<'a>(
        &self,
        x: &Tensor,
        positions: impl Into<AxisPositions<'a>>,
    ) -> Result<Tensor> {
        let p = positions.into();
        self.fused
            .rotate(x, Role::Query, |b, t| self.rows_at(p, b, t))
    }

    /// Rotates queries and keys in place (the contract of
    /// [`Rope::apply_inplace`](super::rope::Rope::apply_inplace)).
    ///
    /// # Errors
    /// [`Error::InvalidValue`] when the contract is broken, otherwise as
    /// [`apply`](Self::apply); nothing is written on error.
    pub fn apply_inplace<'a>(
        &self,
        q: &Tensor,
        k: &Tensor,
        positions: impl Into<AxisPositions<'a>>,
    ) -> Result<()> {
        let p = positions.into();
        self.fused.apply_inplace(q, k, |b, t| self.rows_at(p, b, t))
    }

    /// The reference path for queries and keys (see [the module](self)).
    ///
    /// # Errors
    /// As [`apply`](Self::apply), except that any device and f64 are accepted.
    pub fn apply_reference<'a>(
        &self,
        q: &Tensor,
        k: &Tensor,
        positions: impl Into<AxisPositions<'a>>,
    ) -> Result<(Tensor, Tensor)> {
        self.fused.checks.reference_pair(q, k)?;
        let p = positions.into();
        Ok((self.rotate_reference(q, p)?, self.rotate_reference(k, p)?))
    }

    /// The reference path for one tensor.
    ///
    /// # Errors
    /// As [`apply_reference`](Self::apply_reference).
    pub fn rotate_reference<'a>(
        &self,
        x: &Tensor,
        positions: impl Into<AxisPositions<'a>>,
    ) -> Result<Tensor> {
        let g = self.fused.checks.reference(x, "input")?;
        let h = self.host(positions.into(), g.batch, g.seq_len)?;
        let (na, nf) = (self.freqs.num_axes(), self.freqs.num_freqs());
        let (b, t) = (g.batch, g.seq_len);
        let dev = x.device();
        // (A, B, T, 1) positions × (1, 1, 1, nf) frequencies, in f64
        let mut planes = vec![0f64; na * b * t];
        for (i, p) in h.pos.chunks(na).enumerate() {
            for a in 0..na {
                planes[a * b * t + i] = p[a] as f64;
            }
        }
        let pos = Tensor::from_vec(planes, (na, b, t, 1), dev)?;
        let inv: Vec<f64> = self.freqs.inv_freq().iter().map(|&v| v as f64).collect();
        let inv = Tensor::from_vec(inv, (1, 1, 1, nf), dev)?;
        let ang = pos.broadcast_mul(&inv)?;
        let mut mask = vec![0f64; na * nf];
        for (j, &a) in self.freqs.axes().iter().enumerate() {
            mask[a * nf + j] = self.freqs.attention_factor();
        }
        let mask = Tensor::from_vec(mask, (na, 1, 1, nf), dev)?;
        let cos = ang.cos()?.broadcast_mul(&mask)?.sum(0)?; // (B, T, nf)
        let sin = ang.sin()?.broadcast_mul(&mask)?.sum(0)?;
        rotate_reference_with(x, &cos, &sin, self.layout(), &g)
    }
}
