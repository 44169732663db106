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

use std::sync::{Arc, RwLock};

use candle_core::{CpuStorage, DType, Device, InplaceOp1, Layout, Shape, Storage, Tensor};

use super::custom::{AsCustomOp, CpuOutput, SliceGrads, SliceOp};

use crate::error::{check_positive, Error, Result};
use crate::kernels::rope::{rope_inplace, rope_out_uninit};
use crate::kernels::table::{TableSpec, Tables};
use crate::kernels::{Element, RopeGeometry, RowMap, SimdLevel};
use crate::rope::{PairLayout, RopeFrequencies};

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

fn to_candle(e: Error) -> candle_core::Error {
    candle_core::Error::wrap(e)
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

/// The checks every rope on candle tensors makes before a kernel runs
/// (this module's [`Rope`] and the multi-axis
/// [`AxialRope`](super::axial::AxialRope)): the tensors' layout and the
/// frequencies' rotary dimension and pair layout.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TensorChecks {
    pub(crate) layout: HeadLayout,
    pub(crate) rotary_dim: usize,
    pub(crate) pairs: PairLayout,
}

impl TensorChecks {
    /// A 4-d tensor's geometry under these settings.
    pub(crate) fn geometry(&self, x: &Tensor, what: &'static str) -> Result<RopeGeometry> {
        let dims: [usize; 4] = x.dims().try_into().map_err(|_| Error::Shape {
            what,
            expected: match self.layout {
                HeadLayout::Bhtd => "4 dims (batch, heads, seq_len, head_dim)".into(),
                HeadLayout::Bthd => "4 dims (batch, seq_len, heads, head_dim)".into(),
            },
            got: format!("{:?}", x.dims()),
        })?;
        let g = RopeGeometry::from_dims(dims, self.layout, self.rotary_dim, self.pairs);
        g.check()?;
        Ok(g)
    }

    /// One tensor for the fused paths: on the CPU, f32/f16/bf16.
    pub(crate) fn fused(&self, x: &Tensor, what: &'static str) -> Result<RopeGeometry> {
        if !matches!(x.device(), Device::Cpu) {
            return Err(Error::invalid(
                "device",
                format!(
                    "the fused rope runs on the CPU; {what} are on {:?} (use apply_reference)",
                    x.device().location()
                ),
            ));
        }
        match x.dtype() {
            DType::F32 | DType::F16 | DType::BF16 => {}
            other => {
                return Err(Error::DType {
                    what: "fused rope (f32, f16 or bf16)",
                    dtype: format!("{other:?}"),
                })
            }
        }
        self.geometry(x, what)
    }

    /// One tensor for the reference paths: f32/f16/bf16/f64, any device.
    pub(crate) fn reference(&self, x: &Tensor, what: &'static str) -> Result<RopeGeometry> {
        match x.dtype() {
            DType::F32 | DType::F16 | DType::BF16 | DType::F64 => {}
            other => {
                return Err(Error::DType {
                    what: "rope (f32, f16, bf16 or f64)",
                    dtype: format!("{other:?}"),
                })
            }
        }
        self.geometry(x, what)
    }

    /// Queries and keys for the reference paths: each as
    /// [`reference`](Self::reference), and the pair as [`check_pair`].
    pub(crate) fn reference_pair(&self, q: &Tensor, k: &Tensor) -> Result<()> {
        let gq = self.reference(q, "queries")?;
        let gk = self.reference(k, "keys")?;
        check_pair(q, &gq, k, &gk)
    }

    /// The in-place contract for one tensor (see [`Rope::apply_inplace`]);
    /// returns its geometry and its buffer's address.
    pub(crate) fn inplace(&self, x: &Tensor, what: &'static str) -> Result<(RopeGeometry, usize)> {
        let g = self.fused(x, what)?;
        let contract = |reason: String| Error::invalid(format!("in-place rope on {what}"), reason);
        if x.track_op() {
            return Err(contract(
                "the tensor is tracked by autograd (a Var or computed from one); \
                 writing it in place would corrupt the gradients: use apply"
                    .into(),
            ));
        }
        let (storage, layout) = x.storage_and_layout();
        let (len, addr) = match &*storage {
            Storage::Cpu(CpuStorage::F32(v)) => (v.len(), v.as_ptr() as usize),
            Storage::Cpu(CpuStorage::F16(v)) => (v.len(), v.as_ptr() as usize),
            Storage::Cpu(CpuStorage::BF16(v)) => (v.len(), v.as_ptr() as usize),
            _ => return Err(contract("not a CPU f32/f16/bf16 tensor".into())),
        };
        if !layout.is_contiguous() || layout.start_offset() != 0 || len != x.elem_count() {
            return Err(contract(format!(
                "the tensor must be contiguous and own its whole buffer (a view of a larger \
                 buffer, such as a narrow or a transpose, shares it): layout stride {:?}, \
                 offset {}, {} elements in a buffer of {len}",
                layout.stride(),
                layout.start_offset(),
                x.elem_count()
            )));
        }
        Ok((g, addr))
    }
}

/// `offset + seq_len`, the end of a call at an offset.
///
/// # Errors
/// [`Error::PositionOutOfRange`] when it overflows.
pub(crate) fn offset_end(offset: usize, seq_len: usize) -> Result<usize> {
    offset
        .checked_add(seq_len)
        .ok_or(Error::PositionOutOfRange {
            position: u64::MAX,
            limit: usize::MAX as u64,
            what: "rope offset + seq_len",
        })
}

/// Queries and keys of one call agree: same dtype, batch, seq_len and
/// head_dim.
pub(crate) fn check_pair(
    q: &Tensor,
    gq: &RopeGeometry,
    k: &Tensor,
    gk: &RopeGeometry,
) -> Result<()> {
    if q.dtype() != k.dtype() {
        return Err(Error::DType {
            what: "keys (must have the queries' dtype)",
            dtype: format!("{:?} vs queries {:?}", k.dtype(), q.dtype()),
        });
    }
    if (gq.batch, gq.seq_len, gq.head_dim) != (gk.batch, gk.seq_len, gk.head_dim) {
        return Err(Error::Shape {
            what: "keys (batch, seq_len and head_dim must match the queries')",
            expected: format!("{:?}", q.dims()),
            got: format!("{:?}", k.dims()),
        });
    }
    Ok(())
}

/// The fused paths of every rope on candle tensors (this module's [`Rope`]
/// and the multi-axis [`AxialRope`](super::axial::AxialRope)): the checks,
/// then the tables and rows that `resolve` gives for the tensors' batch size
/// and sequence length, then the kernel ([`RopeOp`]) out of place or in
/// place. Queries are rotated with the query tables, keys with the key
/// tables (the same ones without xPos).
#[derive(Debug, Clone, Copy)]
pub(crate) struct FusedRope {
    pub(crate) checks: TensorChecks,
    pub(crate) level: SimdLevel,
}

impl FusedRope {
    fn op(&self, tables: Arc<Tables>, rows: Arc<Rows>, role: Role, g: &RopeGeometry) -> RopeOp {
        RopeOp {
            tables,
            rows,
            role,
            layout: self.checks.layout,
            rotary_dim: g.rotary_dim,
            pairs: g.pairs,
            level: self.level,
            inverse: false,
        }
    }

    /// Queries and keys, out of place (differentiable).
    pub(crate) fn apply(
        &self,
        q: &Tensor,
        k: &Tensor,
        resolve: impl FnOnce(usize, usize) -> Result<(Arc<Tables>, Rows)>,
    ) -> Result<(Tensor, Tensor)> {
        let gq = self.checks.fused(q, "queries")?;
        let gk = self.checks.fused(k, "keys")?;
        check_pair(q, &gq, k, &gk)?;
        let (tables, rows) = resolve(gq.batch, gq.seq_len)?;
        let rows = Arc::new(rows);
        let qo = self.op(tables.clone(), rows.clone(), Role::Query, &gq);
        let ko = self.op(tables, rows, Role::Key, &gk);
        Ok((
            q.contiguous()?.apply_op1(AsCustomOp(qo))?,
            k.contiguous()?.apply_op1(AsCustomOp(ko))?,
        ))
    }

    /// One tensor, out of place (differentiable).
    pub(crate) fn rotate(
        &self,
        x: &Tensor,
        role: Role,
        resolve: impl FnOnce(usize, usize) -> Result<(Arc<Tables>, Rows)>,
    ) -> Result<Tensor> {
        let g = self.checks.fused(x, "input")?;
        let (tables, rows) = resolve(g.batch, g.seq_len)?;
        let op = self.op(tables, Arc::new(rows), role, &g);
        Ok(x.contiguous()?.apply_op1(AsCustomOp(op))?)
    }

    /// Queries and keys in place (the contract of [`Rope::apply_inplace`]);
    /// nothing is written on error.
    pub(crate) fn apply_inplace(
        &self,
        q: &Tensor,
        k: &Tensor,
        resolve: impl FnOnce(usize, usize) -> Result<(Arc<Tables>, Rows)>,
    ) -> Result<()> {
        let (gq, aq) = self.checks.inplace(q, "queries")?;
        let (gk, ak) = self.checks.inplace(k, "keys")?;
        check_pair(q, &gq, k, &gk)?;
        if aq == ak {
            return Err(Error::invalid(
                "in-place rope",
                "queries and keys share one buffer",
            ));
        }
        let (tables, rows) = resolve(gq.batch, gq.seq_len)?;
        let rows = Arc::new(rows);
        q.inplace_op1(&self.op(tables.clone(), rows.clone(), Role::Query, &gq))?;
        k.inplace_op1(&self.op(tables, rows, Role::Key, &gk))?;
        Ok(())
    }

    /// One tensor in place (the same contract).
    pub(crate) fn rotate_inplace(
        &self,
        x: &Tensor,
        role: Role,
        resolve: impl FnOnce(usize, usize) -> Result<(Arc<Tables>, Rows)>,
    ) -> Result<()> {
        let (g, _) = self.checks.inplace(x, "input")?;
        let (tables, rows) = resolve(g.batch, g.seq_len)?;
        x.inplace_op1(&self.op(tables, Arc::new(rows), role, &g))?;
        Ok(())
    }
}

/// The end of the reference paths: `cos` and `sin` are `(B', T, D/2)`
/// tables (`B'` is 1 or the batch) of any float dtype, laid out for
/// `layout` and taken to f32 (f64 for an f64 `x`) with `x`, which is
/// rotated by [`rotate_with_tables`] and returned in its own dtype.
pub(crate) fn rotate_reference_with(
    x: &Tensor,
    cos: &Tensor,
    sin: &Tensor,
    layout: HeadLayout,
    g: &RopeGeometry,
) -> Result<Tensor> {
    let (pb, t, nf) = cos.dims3()?;
    let shape = match layout {
        HeadLayout::Bhtd => (pb, 1, t, nf),
        HeadLayout::Bthd => (pb, t, 1, nf),
    };
    let cdt = if x.dtype() == DType::F64 {
        DType::F64
    } else {
        DType::F32
    };
    let cos = cos.reshape(shape)?.to_dtype(cdt)?;
    let sin = sin.reshape(shape)?.to_dtype(cdt)?;
    let y = rotate_with_tables(&x.to_dtype(cdt)?, &cos, &sin, g.rotary_dim, g.pairs)?;
    Ok(y.to_dtype(x.dtype())?)
}

/// The composed rotation of the reference paths: `x` is `(d0, d1, d2, D)`,
/// `cos` and `sin` broadcast to `(d0, d1, d2, rotary_dim / 2)`; pairs of
/// `layout` in the first `rotary_dim` entries are rotated, the rest passes
/// through. Differentiable by candle's autograd.
pub(crate) fn rotate_with_tables(
    xf: &Tensor,
    cos: &Tensor,
    sin: &Tensor,
    rd: usize,
    pairs: PairLayout,
) -> Result<Tensor> {
    let d = xf.dim(3)?;
    let nf = rd / 2;
    let rot = xf.narrow(3, 0, rd)?;
    let y = match pairs {
        PairLayout::HalfSplit => {
            let a = rot.narrow(3, 0, nf)?;
            let b = rot.narrow(3, nf, nf)?;
            let ya = (a.broadcast_mul(cos)? - b.broadcast_mul(sin)?)?;
            let yb = (b.broadcast_mul(cos)? + a.broadcast_mul(sin)?)?;
            Tensor::cat(&[ya, yb], 3)?
        }
        PairLayout::Interleaved => {
            let (d0, d1, d2, _) = rot.dims4()?;
            let r5 = rot.reshape((d0, d1, d2, nf, 2))?;
            let a = r5.narrow(4, 0, 1)?.squeeze(4)?;
            let b = r5.narrow(4, 1, 1)?.squeeze(4)?;
            let ya = (a.broadcast_mul(cos)? - b.broadcast_mul(sin)?)?;
            let yb = (b.broadcast_mul(cos)? + a.broadcast_mul(sin)?)?;
            Tensor::stack(&[ya, yb], 4)?.reshape((d0, d1, d2, rd))?
        }
    };
    Ok(if rd < d {
        Tensor::cat(&[y, xf.narrow(3, rd, d - rd)?], 3)?
    } else {
        y
    })
}

/// Default xPos `scale_base` (Sun et al. 2022).
pub const DEFAULT_XPOS_SCALE_BASE: f64 = 512.0;

/// The fused kernel as a candle op (out of place with backward, or in place).
#[derive(Clone)]
pub(crate) struct RopeOp {
    pub(crate) tables: Arc<Tables>,
    pub(crate) rows: Arc<Rows>,
    pub(crate) role: Role,
    pub(crate) layout: HeadLayout,
    pub(crate) rotary_dim: usize,
    pub(crate) pairs: PairLayout,
    pub(crate) level: SimdLevel,
    pub(crate) inverse: bool,
}

impl RopeOp {
    fn geometry(&self, l: &Layout) -> candle_core::Result<RopeGeometry> {
        let (a, b, c, d) = l.shape().dims4()?;
        Ok(RopeGeometry::from_dims(
            [a, b, c, d],
            self.layout,
            self.rotary_dim,
            self.pairs,
        ))
    }

    fn out<T: Element + candle_core::WithDType>(
        &self,
        src: &[T],
        l: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (o1, o2) = l
            .contiguous_offsets()
            .ok_or_else(|| candle_core::Error::Msg("posenc rope: input not contiguous".into()))?;
        let src = &src[o1..o2];
        let g = self.geometry(l)?;
        let tables = match self.role {
            Role::Query => self.tables.query(),
            Role::Key => self.tables.key(),
        };
        let mut dst: Vec<T> = crate::kernels::mem::with_capacity_huge(src.len());
        // SAFETY: the capacity is ours and unread until rope_out_uninit fills it.
        unsafe {
            crate::kernels::mem::prefault(dst.as_mut_ptr() as *mut u8, std::mem::size_of_val(src))
        };
        rope_out_uninit(
            self.level,
            src,
            &mut dst.spare_capacity_mut()[..src.len()],
            &g,
            &tables,
            self.rows.map(),
            self.inverse,
        )
        .map_err(to_candle)?;
        // SAFETY: rope_out_uninit returned Ok, so all src.len() entries are written.
        unsafe { dst.set_len(src.len()) };
        Ok((T::to_cpu_storage_owned(dst), l.shape().clone()))
    }

    fn in_place<T: Element>(&self, x: &mut [T], l: &Layout) -> candle_core::Result<()> {
        let (o1, o2) = l
            .contiguous_offsets()
            .ok_or_else(|| candle_core::Error::Msg("posenc rope: input not contiguous".into()))?;
        let g = self.geometry(l)?;
        let tables = match self.role {
            Role::Query => self.tables.query(),
            Role::Key => self.tables.key(),
        };
        rope_inplace(
            self.level,
            &mut x[o1..o2],
            &g,
            &tables,
            self.rows.map(),
            self.inverse,
        )
        .map_err(to_candle)
    }
}

impl SliceOp for RopeOp {
    fn name(&self) -> &'static str {
        "posenc-rope"
    }

    fn cpu_fwd(&self, args: &[(&CpuStorage, &Layout)]) -> CpuOutput {
        use candle_core::backend::BackendStorage;
        let (s, l) = args[0];
        match s {
            CpuStorage::F32(v) => self.out(v, l),
            CpuStorage::F16(v) => self.out(v, l),
            CpuStorage::BF16(v) => self.out(v, l),
            other => Err(candle_core::Error::Msg(format!(
                "posenc rope: unsupported dtype {:?}",
                other.dtype()
            ))),
        }
    }

    /// `y = S·R(θ)·x` per pair (S the xPos scale, 1 without xPos), so
    /// `∂L/∂x = S·R(−θ)·∂L/∂y`: the same kernel with the sine negated.
    fn bwd(&self, _args: &[&Tensor], _res: &Tensor, grad_res: &Tensor) -> SliceGrads {
        let mut t = self.clone();
        t.inverse = !t.inverse;
        Ok(vec![Some(grad_res.contiguous()?.apply_op1(AsCustomOp(t))?)])
    }
}

impl InplaceOp1 for RopeOp {
    fn name(&self) -> &'static str {
        "posenc-rope-inplace"
    }

    fn cpu_fwd(&self, s: &mut CpuStorage, l: &Layout) -> candle_core::Result<()> {
        match s {
            CpuStorage::F32(v) => self.in_place(v, l),
            CpuStorage::F16(v) => self.in_place(v, l),
            CpuStorage::BF16(v) => self.in_place(v, l),
            _ => Err(candle_core::Error::Msg(
                "posenc rope: unsupported dtype".into(),
            )),
        }
    }
}
