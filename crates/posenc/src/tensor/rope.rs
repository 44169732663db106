//! Rotary embeddings on candle tensors: fused, differentiable, cached.
//!
//! [`Rope`] applies RoPE (Su et al. 2021, *RoFormer*) — and optionally xPos
//! (Sun et al. 2022, *A Length-Extrapolatable Transformer*) — to queries and
//! keys in one call. Pair `i` of the vector at position `m` is rotated by
//! `m·θ_i`:
//!
//! ```text
//! y_a = x_a·cos(mθ_i) − x_b·sin(mθ_i)
//! y_b = x_b·cos(mθ_i) + x_a·sin(mθ_i)
//! ```
//!
//! with `(a, b) = (i, i + d/2)` ([`PairLayout::HalfSplit`]) or `(2i, 2i + 1)`
//! ([`PairLayout::Interleaved`]); cos and sin are multiplied by the
//! frequencies' attention factor (YaRN, LongRoPE). Dimensions past
//! `rotary_dim` (partial rotary) pass through. With xPos, queries are also
//! multiplied by `ζ_i^(m/scale_base)` and keys by `ζ_i^(−n/scale_base)`,
//! `ζ_i = (2i/d + 0.4)/1.4`, so the logit of pair `i` decays as
//! `ζ_i^((m−n)/scale_base)`.
//!
//! # Shapes
//! Queries `(B, Hq, T, D)` and keys `(B, Hk, T, D)` ([`HeadLayout::Bhtd`]),
//! or `(B, T, Hq, D)` / `(B, T, Hk, D)` ([`HeadLayout::Bthd`]); `Hq` and `Hk`
//! may differ (grouped-query attention). Positions are a scalar offset
//! (`offset + t`, a KV cache) or a `(B, T)` `u32`/`i64` tensor of position
//! ids, one row per batch entry ([`Positions`]). Activations are `f32`,
//! `f16` or `bf16`; tables are always `f32` (never rounded to the
//! activation type), arithmetic `f32`, one rounding per output.
//!
//! # Tables
//! The cos/sin tables are computed exactly in `f64` (angles `m·f_i` with the
//! `f32` frequencies, see [`crate::kernels::table`]), rounded once to `f32`,
//! and cached inside the [`Rope`]: they grow on demand (doubling, up to
//! [`Rope::with_max_cached_positions`]) and are never rebuilt per call.
//! Positions past the cap get a table built for that call only. A
//! length-dependent [`FrequencySchedule`] (dynamic NTK, LongRoPE) switches
//! frequencies with the sequence length `max position + 1` as Hugging Face
//! transformers does, which rebuilds the cache.
//!
//! # Paths
//! - [`Rope::apply`]: fused kernel (SIMD + threads), out of place,
//!   differentiable (a candle `CustomOp1` whose backward pass is the same
//!   rotation with the sine negated).
//! - [`Rope::apply_inplace`]: the same kernel on the tensors' own storage,
//!   without allocating (contract there).
//! - [`Rope::apply_reference`]: composed candle ops (narrow, mul, cat) on
//!   exact tables, on any device and dtype, differentiable by candle itself:
//!   what the fused paths are tested against.
//!
//! candle-nn's own fused `rope` / `rope_i` / `rope_thd` are applied with
//! `apply_op3_no_bwd`: `loss.backward()` silently returns no gradient for
//! their input (measured in `tests/tensor_rope.rs`,
//! `candle_nn_rope_drops_gradients`). [`Rope::apply`] does not.
//!
//! ```
//! use candle_core::{Device, Tensor};
//! use posenc::rope::{PairLayout, RopeFrequencies};
//! use posenc::tensor::rope::{HeadLayout, Rope};
//!
//! let freqs = RopeFrequencies::plain(10000.0, 64, PairLayout::HalfSplit)?;
//! let rope = Rope::new(freqs)?.with_layout(HeadLayout::Bhtd);
//! let q = Tensor::randn(0f32, 1.0, (2, 8, 5, 64), &Device::Cpu)?;
//! let k = Tensor::randn(0f32, 1.0, (2, 2, 5, 64), &Device::Cpu)?;
//! // positions 10..15 (a KV cache holding 10 tokens)
//! let (q2, k2) = rope.apply(&q, &k, 10)?;
//! let (q3, k3) = rope.apply_reference(&q, &k, 10)?;
//! let diff = (q2 - q3)?.abs()?.max_all()?.to_scalar::<f32>()?;
//! assert!(diff < 1e-5);
//! // or in place, no allocation
//! rope.apply_inplace(&q, &k, 10)?;
//! # Ok::<(), posenc::Error>(())
//! ```

mod checks;
mod fused;

use std::sync::{Arc, RwLock};

use candle_core::Tensor;

use crate::error::{check_positive, Error, Result};
use crate::kernels::table::{TableSpec, Tables};
use crate::kernels::{RowMap, SimdLevel};
use crate::rope::{PairLayout, RopeFrequencies};

pub(crate) use checks::{check_pair, offset_end, TensorChecks};
pub(crate) use fused::{rotate_reference_with, FusedRope};

pub use crate::kernels::HeadLayout;

/// Where a [`Rope`] gets its frequencies: constant ([`RopeFrequencies`]) or
/// dependent on the sequence length (dynamic NTK, LongRoPE).
pub trait FrequencySchedule: Send + Sync {
    /// The frequencies for a sequence of `seq_len` positions (`None`: the
    /// table built at load time).
    ///
    /// # Errors
    /// Whatever the schedule rejects.
    fn frequencies(&self, seq_len: Option<usize>) -> Result<RopeFrequencies>;

    /// Whether [`frequencies`](Self::frequencies) depends on `seq_len`.
    fn length_dependent(&self) -> bool {
        false
    }

    /// The context length the load-time frequencies are for; sequences up to
    /// it use them (`None`: every length is "long").
    fn original_max_position_embeddings(&self) -> Option<usize> {
        None
    }
}

impl FrequencySchedule for RopeFrequencies {
    fn frequencies(&self, _seq_len: Option<usize>) -> Result<RopeFrequencies> {
        Ok(self.clone())
    }
}

/// A model's RoPE configuration is a schedule: dynamic NTK and LongRoPE
/// change their frequencies with the sequence length, exactly as
/// transformers' `dynamic_rope_update` does.
impl FrequencySchedule for crate::rope::RopeConfig {
    fn frequencies(&self, seq_len: Option<usize>) -> Result<RopeFrequencies> {
        crate::rope::RopeConfig::frequencies(self, seq_len)
    }

    fn length_dependent(&self) -> bool {
        matches!(
            self.scaling(),
            crate::rope::RopeScaling::Dynamic { .. } | crate::rope::RopeScaling::LongRope { .. }
        )
    }

    fn original_max_position_embeddings(&self) -> Option<usize> {
        match self.scaling() {
            crate::rope::RopeScaling::Dynamic { .. } => self.max_position_embeddings(),
            _ => crate::rope::RopeConfig::original_max_position_embeddings(self),
        }
    }
}

/// Whether a tensor holds queries or keys (they differ only with xPos).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// Queries: scaled by `ζ^(m/scale_base)` with xPos.
    Query,
    /// Keys: scaled by `ζ^(−n/scale_base)` with xPos.
    Key,
}

pub use super::Positions;

/// Default cap on cached positions (see [`Rope::with_max_cached_positions`]).
pub const DEFAULT_MAX_CACHED_POSITIONS: usize = 1 << 18;

/// Smallest cache built.
const MIN_CACHED_POSITIONS: usize = 256;

/// Frequencies and the tables built from them.
struct State {
    freqs: RopeFrequencies,
    /// The `seq_len` the frequencies were asked for (None: load time).
    freq_len: Option<usize>,
    tables: Arc<Tables>,
}

/// Which table row each time step uses (see [`RotationTables`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RotationRows {
    /// Row `offset + t` for every batch entry.
    Offset(usize),
    /// Row `ids[b·T + t]`.
    Ids(Vec<usize>),
}

impl RotationRows {
    /// As the kernels' row map.
    pub fn map(&self) -> RowMap<'_> {
        match self {
            RotationRows::Offset(o) => RowMap::Offset(*o),
            RotationRows::Ids(v) => RowMap::Ids(v),
        }
    }
}

/// The tables and rows a fused kernel rotates queries and keys with
/// ([`Rope::attention_tables`]).
#[derive(Debug, Clone)]
pub struct RotationTables {
    /// cos/sin tables (query tables, and key tables with xPos).
    pub tables: Arc<Tables>,
    /// Rows of the query steps.
    pub q_rows: RotationRows,
    /// Rows of the key steps.
    pub k_rows: RotationRows,
    /// Rotated entries of each head vector.
    pub rotary_dim: usize,
    /// Pair layout.
    pub pairs: PairLayout,
}

impl RotationTables {
    /// As the fused attention kernel's rotation, borrowing these tables.
    pub fn rotation(&self) -> crate::kernels::attention::Rotation<'_> {
        crate::kernels::attention::Rotation {
            rotary_dim: self.rotary_dim,
            pairs: self.pairs,
            q: self.tables.query(),
            k: self.tables.key(),
            q_rows: self.q_rows.map(),
            k_rows: self.k_rows.map(),
        }
    }
}

/// Resolved positions of one call.
#[derive(Debug, Clone)]
pub(crate) enum Rows {
    Offset(usize),
    Ids(Vec<usize>),
}

impl Rows {
    fn map(&self) -> RowMap<'_> {
        match self {
            Rows::Offset(o) => RowMap::Offset(*o),
            Rows::Ids(v) => RowMap::Ids(v),
        }
    }
}

/// Positions of a call, as the host sees them.
struct HostPositions {
    /// `Some(o)`: contiguous `o..o+T` for every batch entry.
    offset: Option<usize>,
    /// Row-major `(B, T)` ids (only with position ids).
    ids: Vec<u64>,
    /// Largest position + 1.
    seq_len: usize,
    t: usize,
}

/// RoPE (optionally xPos) on candle tensors, with a cached, exact `f32`
/// cos/sin table. See the [module docs](self).
pub struct Rope {
    schedule: Box<dyn FrequencySchedule>,
    layout: HeadLayout,
    xpos_scale_base: Option<f64>,
    max_cached: usize,
    level: SimdLevel,
    state: RwLock<Arc<State>>,
}

impl std::fmt::Debug for Rope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.snapshot();
        f.debug_struct("Rope")
            .field("rope_type", &st.freqs.rope_type)
            .field("rotary_dim", &st.freqs.rotary_dim)
            .field("pairs", &st.freqs.layout)
            .field("layout", &self.layout)
            .field("xpos_scale_base", &self.xpos_scale_base)
            .field("cached_positions", &st.tables.rows)
            .field("simd", &self.level)
            .finish()
    }
}

fn check_freqs(f: &RopeFrequencies) -> Result<()> {
    crate::error::check_dim("number of frequencies", f.inv_freq.len(), false)?;
    if f.rotary_dim != 2 * f.inv_freq.len() {
        return Err(Error::InvalidDimension {
            what: "rotary_dim",
            value: f.rotary_dim,
            reason: "must be twice the number of frequencies",
        });
    }
    for &v in &f.inv_freq {
        crate::error::check_finite("inv_freq", v as f64)?;
    }
    check_positive("attention_factor", f.attention_factor)?;
    Ok(())
}

impl Rope {
    /// A rope over `schedule`'s load-time frequencies, for the
    /// [`HeadLayout::Bhtd`] layout, without xPos. No table is built yet
    /// (see [`warm_up`](Self::warm_up)).
    ///
    /// # Errors
    /// The schedule's error, or [`Error::InvalidDimension`] /
    /// [`Error::NotFinite`] / [`Error::InvalidFactor`] for frequencies that
    /// are empty, inconsistent with `rotary_dim`, or not finite.
    pub fn new(schedule: impl FrequencySchedule + 'static) -> Result<Rope> {
        let freqs = schedule.frequencies(None)?;
        check_freqs(&freqs)?;
        let tables = Arc::new(Tables {
            n_freq: freqs.inv_freq.len(),
            ..Default::default()
        });
        Ok(Rope {
            schedule: Box::new(schedule),
            layout: HeadLayout::Bhtd,
            xpos_scale_base: None,
            max_cached: DEFAULT_MAX_CACHED_POSITIONS,
            level: SimdLevel::detect(),
            state: RwLock::new(Arc::new(State {
                freqs,
                freq_len: None,
                tables,
            })),
        })
    }

    /// Sets the axis order of the tensors this rope is applied to.
    pub fn with_layout(mut self, layout: HeadLayout) -> Rope {
        self.layout = layout;
        self
    }

    /// Turns on xPos with `scale_base` (512 in the paper; see
    /// [`DEFAULT_XPOS_SCALE_BASE`]). Note that the scales leave the `f32`
    /// range past roughly `70 · scale_base` positions (the key scale
    /// overflows, the query scale underflows): xPos is meant for blockwise
    /// attention over short windows.
    ///
    /// # Errors
    /// [`Error::InvalidFactor`] if `scale_base` is not finite and positive.
    pub fn with_xpos(mut self, scale_base: f64) -> Result<Rope> {
        check_positive("scale_base", scale_base)?;
        self.xpos_scale_base = Some(scale_base);
        self.reset_tables();
        Ok(self)
    }

    /// Caps the cached table at `positions` rows (default
    /// [`DEFAULT_MAX_CACHED_POSITIONS`]); calls reaching past it build a
    /// table for their own positions only.
    pub fn with_max_cached_positions(mut self, positions: usize) -> Rope {
        self.max_cached = positions.max(1);
        self
    }

    /// Forces a SIMD level (tests and benchmarks); default
    /// [`SimdLevel::detect`].
    ///
    /// # Errors
    /// [`Error::InvalidValue`] if this CPU lacks the level.
    pub fn with_simd_level(mut self, level: SimdLevel) -> Result<Rope> {
        self.level = level.supported()?;
        Ok(self)
    }

    fn reset_tables(&mut self) {
        let st = self.snapshot();
        *self.state.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(State {
            freqs: st.freqs.clone(),
            freq_len: st.freq_len,
            tables: Arc::new(Tables {
                n_freq: st.freqs.inv_freq.len(),
                ..Default::default()
            }),
        });
    }

    /// The tensor layout.
    pub fn layout(&self) -> HeadLayout {
        self.layout
    }

    /// The xPos scale base, if xPos is on.
    pub fn xpos_scale_base(&self) -> Option<f64> {
        self.xpos_scale_base
    }

    /// The SIMD level the fused paths use.
    pub fn simd_level(&self) -> SimdLevel {
        self.level
    }

    /// The frequencies in use now (length-dependent schedules change them).
    pub fn frequencies(&self) -> RopeFrequencies {
        self.snapshot().freqs.clone()
    }

    /// Number of rotated dimensions.
    pub fn rotary_dim(&self) -> usize {
        self.snapshot().freqs.rotary_dim
    }

    /// Pair layout of the frequencies.
    pub fn pair_layout(&self) -> PairLayout {
        self.snapshot().freqs.layout
    }

    /// Number of positions the cache holds now.
    pub fn cached_positions(&self) -> usize {
        self.snapshot().tables.rows
    }

    /// Builds the cache for positions `0..positions` now (capped as in
    /// [`with_max_cached_positions`](Self::with_max_cached_positions)).
    ///
    /// # Errors
    /// The schedule's error.
    pub fn warm_up(&self, positions: usize) -> Result<()> {
        self.tables_for(positions, positions.min(self.max_cached))
            .map(|_| ())
    }

    fn snapshot(&self) -> Arc<State> {
        self.state.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn spec<'a>(&self, freqs: &'a RopeFrequencies) -> TableSpec<'a> {
        TableSpec {
            inv_freq: &freqs.inv_freq,
            attention_factor: freqs.attention_factor,
            xpos_scale_base: self.xpos_scale_base,
        }
    }

    /// The `seq_len` the frequencies should be for after seeing `seq_len`:
    /// Hugging Face's dynamic update (grow past the original length, keep
    /// the grown frequencies for shorter long sequences, reset at or below
    /// the original length).
    fn wanted_freq_len(&self, current: Option<usize>, seq_len: usize) -> Option<usize> {
        if !self.schedule.length_dependent() {
            return None;
        }
        let orig = self
            .schedule
            .original_max_position_embeddings()
            .unwrap_or(0);
        match current {
            _ if seq_len <= orig => None,
            Some(c) if seq_len <= c => Some(c),
            _ => Some(seq_len),
        }
    }

    /// The state with frequencies for `seq_len` and at least `rows` cached
    /// rows (`rows ≤ max_cached`).
    fn tables_for(&self, seq_len: usize, rows: usize) -> Result<Arc<State>> {
        let st = self.snapshot();
        let want_len = self.wanted_freq_len(st.freq_len, seq_len);
        if want_len == st.freq_len && st.tables.rows >= rows {
            return Ok(st);
        }
        let mut guard = self.state.write().unwrap_or_else(|e| e.into_inner());
        let st = guard.clone();
        let want_len = self.wanted_freq_len(st.freq_len, seq_len);
        if want_len == st.freq_len && st.tables.rows >= rows {
            return Ok(st);
        }
        let mut freqs = st.freqs.clone();
        let mut tables = st.tables.clone();
        if want_len != st.freq_len {
            let new = self.schedule.frequencies(want_len)?;
            check_freqs(&new)?;
            if new.rotary_dim != freqs.rotary_dim {
                return Err(Error::InvalidDimension {
                    what: "rotary_dim",
                    value: new.rotary_dim,
                    reason: "a frequency schedule must keep rotary_dim for every length",
                });
            }
            if new != freqs {
                freqs = new;
                tables = Arc::new(Tables {
                    n_freq: freqs.inv_freq.len(),
                    ..Default::default()
                });
            }
        }
        if tables.rows < rows {
            let target = rows
                .max(2 * tables.rows)
                .max(MIN_CACHED_POSITIONS)
                .next_power_of_two()
                .min(self.max_cached)
                .max(rows);
            tables = Arc::new(tables.extended(&self.spec(&freqs), 0, target));
        }
        let new = Arc::new(State {
            freqs,
            freq_len: want_len,
            tables,
        });
        *guard = new.clone();
        Ok(new)
    }

    /// Tables and rows for a call.
    fn resolve(&self, pos: &HostPositions) -> Result<(Arc<Tables>, Rows)> {
        let needed = pos.seq_len;
        if needed <= self.max_cached {
            let st = self.tables_for(pos.seq_len, needed)?;
            let rows = match pos.offset {
                Some(o) => Rows::Offset(o),
                None => Rows::Ids(pos.ids.iter().map(|&p| p as usize).collect()),
            };
            return Ok((st.tables.clone(), rows));
        }
        // Past the cap: frequencies still follow the schedule, the table is
        // built for this call's positions only.
        let st = self.tables_for(pos.seq_len, 0)?;
        let spec = self.spec(&st.freqs);
        Ok(match pos.offset {
            Some(o) => (
                Arc::new(Tables::contiguous(&spec, o as u64, pos.t)),
                Rows::Offset(0),
            ),
            None => (
                Arc::new(Tables::exact(&spec, &pos.ids)),
                Rows::Ids((0..pos.ids.len()).collect()),
            ),
        })
    }

    fn host_positions(
        &self,
        positions: Positions<'_>,
        b: usize,
        t: usize,
    ) -> Result<HostPositions> {
        match positions {
            Positions::Offset(o) => Ok(HostPositions {
                offset: Some(o),
                ids: Vec::new(),
                seq_len: offset_end(o, t)?,
                t,
            }),
            Positions::Ids(ids) => {
                let v = super::batch_ids(ids, b, t, false)?;
                let max = v.iter().copied().max().unwrap_or(0);
                let seq_len = usize::try_from(max)
                    .ok()
                    .and_then(|m| m.checked_add(1))
                    .ok_or(Error::PositionOutOfRange {
                        position: max,
                        limit: usize::MAX as u64,
                        what: "position ids",
                    })?;
                Ok(HostPositions {
                    offset: None,
                    ids: v,
                    seq_len,
                    t,
                })
            }
        }
    }

    /// The checks of this rope's tensors (layout, rotary_dim, pairs).
    fn checks(&self) -> TensorChecks {
        let st = self.snapshot();
        TensorChecks {
            layout: self.layout,
            rotary_dim: st.freqs.rotary_dim,
            pairs: st.freqs.layout,
        }
    }

    /// The fused paths with this rope's checks and SIMD level.
    fn fused(&self) -> FusedRope {
        FusedRope {
            checks: self.checks(),
            level: self.level,
        }
    }

    /// Tables and rows of a call at `positions`, for `b` sequences of `t`
    /// steps.
    fn rows_at(&self, positions: Positions<'_>, b: usize, t: usize) -> Result<(Arc<Tables>, Rows)> {
        let pos = self.host_positions(positions, b, t)?;
        self.resolve(&pos)
    }

    /// Rotates queries and keys (fused kernel, out of place). Differentiable:
    /// gradients flow to `q` and `k` (the tables and positions are constants).
    ///
    /// # Errors
    /// Before any kernel runs: [`Error::InvalidValue`] for a tensor not on
    /// the CPU; [`Error::DType`] for a dtype other than f32/f16/bf16, or keys
    /// of another dtype than the queries, or position ids that are not
    /// u32/i64; [`Error::Shape`] for tensors that are not 4-d, keys whose
    /// batch, seq_len or head_dim differ from the queries', or position ids
    /// that are not `(B, T)`; [`Error::InvalidDimension`] for a zero
    /// dimension, an odd head_dim, or `rotary_dim > head_dim`;
    /// [`Error::NegativePosition`] for a negative id; the schedule's errors.
    pub fn apply<'a>(
        &self,
        q: &Tensor,
        k: &Tensor,
        positions: impl Into<Positions<'a>>,
    ) -> Result<(Tensor, Tensor)> {
        let p = positions.into();
        self.fused().apply(q, k, |b, t| self.rows_at(p, b, t))
    }

    /// Rotates one tensor of queries or keys (fused, out of place,
    /// differentiable).
    ///
    /// # Errors
    /// As [`apply`](Self::apply).
    pub fn rotate<'a>(
        &self,
        x: &Tensor,
        positions: impl Into<Positions<'a>>,
        role: Role,
    ) -> Result<Tensor> {
        let p = positions.into();
        self.fused().rotate(x, role, |b, t| self.rows_at(p, b, t))
    }

    /// The tables and table rows with which queries at `q_positions` (`T_q`
    /// steps) and keys at `k_positions` (`T_k` steps) are rotated, for a
    /// kernel that rotates inside a larger fused op
    /// ([`crate::tensor::attention`]). Frequencies follow the schedule for
    /// the longer of the two (`max position + 1`), exactly as
    /// [`apply`](Self::apply) would choose them for that length.
    ///
    /// # Errors
    /// As [`apply`](Self::apply) for the positions.
    pub fn attention_tables(
        &self,
        q_positions: Positions<'_>,
        k_positions: Positions<'_>,
        batch: usize,
        q_len: usize,
        k_len: usize,
    ) -> Result<RotationTables> {
        let hq = self.host_positions(q_positions, batch, q_len)?;
        let hk = self.host_positions(k_positions, batch, k_len)?;
        let seq_len = hq.seq_len.max(hk.seq_len);
        let rows_of = |h: &HostPositions, base: usize| -> RotationRows {
            match h.offset {
                Some(o) => RotationRows::Offset(o + base),
                None => RotationRows::Ids(h.ids.iter().map(|&p| p as usize + base).collect()),
            }
        };
        let (tables, freqs) = if seq_len <= self.max_cached {
            let st = self.tables_for(seq_len, seq_len)?;
            (st.tables.clone(), st.freqs.clone())
        } else {
            // Past the cap: a table of this call's rows only, queries first.
            let st = self.tables_for(seq_len, 0)?;
            let list = |h: &HostPositions| -> Vec<u64> {
                match h.offset {
                    Some(o) => (o as u64..(o + h.t) as u64).collect(),
                    None => h.ids.clone(),
                }
            };
            let mut all = list(&hq);
            let nq = all.len();
            all.extend(list(&hk));
            let t = Arc::new(Tables::exact(&self.spec(&st.freqs), &all));
            let seq = |n: usize, start: usize| RotationRows::Ids((start..start + n).collect());
            return Ok(RotationTables {
                tables: t,
                q_rows: match hq.offset {
                    Some(_) => RotationRows::Offset(0),
                    None => seq(nq, 0),
                },
                k_rows: match hk.offset {
                    Some(_) => RotationRows::Offset(nq),
                    None => seq(all.len() - nq, nq),
                },
                rotary_dim: st.freqs.rotary_dim,
                pairs: st.freqs.layout,
            });
        };
        Ok(RotationTables {
            tables,
            q_rows: rows_of(&hq, 0),
            k_rows: rows_of(&hk, 0),
            rotary_dim: freqs.rotary_dim,
            pairs: freqs.layout,
        })
    }

    /// [`attention_tables`](Self::attention_tables) for queries and keys at
    /// the ids of a `(B, T_q)` and a `(B, T_k)` tensor.
    pub(crate) fn attention_tables_at_ids(
        &self,
        q_ids: &Tensor,
        k_ids: &Tensor,
    ) -> Result<RotationTables> {
        let (batch, q_len) = q_ids.dims2()?;
        let k_len = k_ids.dim(1)?;
        let (q, k) = (Positions::Ids(q_ids), Positions::Ids(k_ids));
        self.attention_tables(q, k, batch, q_len, k_len)
    }

    /// Rotates queries and keys in place, allocating nothing for the
    /// activations.
    ///
    /// # Contract
    /// Each tensor must be on the CPU, f32/f16/bf16, contiguous, and own its
    /// whole storage buffer (offset 0, as many elements as the buffer: a
    /// `narrow`, `transpose` or `i(..)` view of a larger tensor is refused,
    /// since writing it would change the tensor it was cut from); it must
    /// not be tracked by autograd (`Var`s and results of tracked ops are
    /// refused: use [`apply`](Self::apply)); `q` and `k` must be different
    /// buffers. Handles that share the same buffer — clones of the `Tensor`,
    /// `detach()`, or a `reshape` of a contiguous tensor — see the new
    /// values, as with every candle in-place op.
    ///
    /// # Errors
    /// [`Error::InvalidValue`] when the contract is broken, otherwise as
    /// [`apply`](Self::apply); nothing is written on error.
    pub fn apply_inplace<'a>(
        &self,
        q: &Tensor,
        k: &Tensor,
        positions: impl Into<Positions<'a>>,
    ) -> Result<()> {
        let p = positions.into();
        self.fused()
            .apply_inplace(q, k, |b, t| self.rows_at(p, b, t))
    }

    /// Rotates one tensor in place (contract of [`apply_inplace`](Self::apply_inplace)).
    ///
    /// # Errors
    /// As [`apply_inplace`](Self::apply_inplace).
    pub fn rotate_inplace<'a>(
        &self,
        x: &Tensor,
        positions: impl Into<Positions<'a>>,
        role: Role,
    ) -> Result<()> {
        let p = positions.into();
        self.fused()
            .rotate_inplace(x, role, |b, t| self.rows_at(p, b, t))
    }

    /// The reference path for queries and keys: composed candle ops on exact
    /// tables, on any device, in f32 (f64 for f64 inputs), differentiable by
    /// candle's own autograd.
    ///
    /// # Errors
    /// As [`apply`](Self::apply), except that any device and f64 are accepted.
    pub fn apply_reference<'a>(
        &self,
        q: &Tensor,
        k: &Tensor,
        positions: impl Into<Positions<'a>>,
    ) -> Result<(Tensor, Tensor)> {
        self.checks().reference_pair(q, k)?;
        let positions = positions.into();
        Ok((
            self.rotate_reference(q, positions, Role::Query)?,
            self.rotate_reference(k, positions, Role::Key)?,
        ))
    }

    /// The reference path for one tensor (see [`apply_reference`](Self::apply_reference)).
    ///
    /// # Errors
    /// As [`apply_reference`](Self::apply_reference).
    pub fn rotate_reference<'a>(
        &self,
        x: &Tensor,
        positions: impl Into<Positions<'a>>,
        role: Role,
    ) -> Result<Tensor> {
        let g = self.checks().reference(x, "input")?;
        let pos = self.host_positions(positions.into(), g.batch, g.seq_len)?;
        // same frequency schedule as the fused path, but exact tables of
        // this call's positions (not the cache)
        let st = self.tables_for(pos.seq_len, 0)?;
        let (pb, flat): (usize, Vec<u64>) = match pos.offset {
            Some(o) => (1, (o as u64..(o + g.seq_len) as u64).collect()),
            None => (g.batch, pos.ids.clone()),
        };
        let t = Tables::exact(&self.spec(&st.freqs), &flat);
        let (c, s) = match (role, t.has_key_tables()) {
            (Role::Key, true) => (&t.cos_k, &t.sin_k),
            _ => (&t.cos, &t.sin),
        };
        let shape = (pb, g.seq_len, t.n_freq);
        let cos = Tensor::from_slice(c, shape, x.device())?;
        let sin = Tensor::from_slice(s, shape, x.device())?;
        rotate_reference_with(x, &cos, &sin, self.layout, &g)
    }
}

/// Default xPos `scale_base` (Sun et al. 2022).
pub const DEFAULT_XPOS_SCALE_BASE: f64 = 512.0;
