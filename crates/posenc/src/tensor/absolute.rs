//! Absolute encodings as candle modules (sinusoidal, learned, FLOATER).
//!
//! Each module adds a position vector to every token embedding of an
//! activation `x` of shape `(B, T, D)` (any float dtype; tables are kept in
//! `f32`, or the dtype of their `VarBuilder`, and cast to `x`'s dtype).
//! Positions are always explicit ([`Positions`]): either a scalar offset
//! (token `t` of every sequence is at position `offset + t`, the usual case,
//! and the one for incremental decoding with a KV cache) or a `(B, T)` tensor
//! of integer position ids (left padding, packed sequences).
//!
//! - [`SinusoidalEmbedding`]: [`Sinusoidal`] rows computed in `f64`, cached
//!   as an `f32` table that grows on demand;
//! - [`LearnedEmbedding`]: a trainable `(max_positions, D)` table; a position
//!   past it is [`Error::PositionOutOfRange`];
//! - [`FloaterEmbedding`]: FLOATER ([`crate::absolute::floater`]) with
//!   trainable parameters, the ODE solved with composed candle ops so that
//!   `backward()` reaches every parameter.
//!
//! ```
//! use candle_core::{DType, Device, Tensor};
//! use posenc::absolute::Sinusoidal;
//! use posenc::tensor::absolute::{Positions, SinusoidalEmbedding};
//!
//! let dev = Device::Cpu;
//! let emb = SinusoidalEmbedding::new(Sinusoidal::new(8)?, &dev)?;
//! let x = Tensor::zeros((2, 5, 8), DType::F32, &dev)?;
//! let y = emb.forward(&x, Positions::Offset(3))?;
//! assert_eq!(y.dims(), &[2, 5, 8]);
//! let row: Vec<f32> = y.get(1)?.get(0)?.to_vec1()?; // position 3
//! assert!((row[0] - 3f32.sin()).abs() < 1e-6);
//! # Ok::<(), posenc::Error>(())
//! ```

use std::sync::Mutex;

use candle_core::{DType, Device, Tensor};
use candle_nn::{Init, VarBuilder};

use crate::absolute::floater::{Floater, FloaterConfig, FloaterParams, Integrator};
use crate::absolute::sinusoidal::Sinusoidal;
use crate::encoding::AbsoluteEncoding;
use crate::error::{Error, Result};

pub use super::Positions;

/// Checks `x` is `(B, T, dim)` and returns `(B, T)`.
fn check_x(x: &Tensor, dim: usize) -> Result<(usize, usize)> {
    match x.dims() {
        &[b, t, d] if d == dim => Ok((b, t)),
        dims => Err(Error::Shape {
            what: "activation x",
            expected: format!("(B, T, {dim})"),
            got: format!("{dims:?}"),
        }),
    }
}

/// Adds `rows` (`(T, D)` shared by the batch, or `(B, T, D)`) to `x`.
fn add_rows(x: &Tensor, rows: &Tensor) -> Result<Tensor> {
    let rows = rows.to_dtype(x.dtype())?;
    Ok(x.broadcast_add(&rows)?)
}

/// The sinusoidal encoding as a module (see the [module docs](self)).
///
/// Rows are computed in `f64` by [`Sinusoidal`] (its own offset included)
/// and cached as `f32`; the cache grows (doubling) when a longer sequence
/// comes, up to 2^24 elements, beyond which rows are computed on the fly.
#[derive(Debug)]
pub struct SinusoidalEmbedding {
    encoding: Sinusoidal,
    device: Device,
    cache: Mutex<Option<Tensor>>,
}

impl SinusoidalEmbedding {
    const CACHE_ELEMENTS: usize = 1 << 24;

    /// A module for `encoding` on `device`; the cache starts empty.
    pub fn new(encoding: Sinusoidal, device: &Device) -> Result<Self> {
        Ok(Self {
            encoding,
            device: device.clone(),
            cache: Mutex::new(None),
        })
    }

    /// The underlying encoding.
    pub fn encoding(&self) -> &Sinusoidal {
        &self.encoding
    }

    /// Number of rows cached so far.
    pub fn cached_len(&self) -> usize {
        let cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        cache.as_ref().map_or(0, |t| t.dims()[0])
    }

    fn rows_tensor(&self, rows: Vec<Vec<f64>>) -> Result<Tensor> {
        let n = rows.len();
        let d = self.encoding.dim();
        let flat: Vec<f32> = rows.into_iter().flatten().map(|v| v as f32).collect();
        Ok(Tensor::from_vec(flat, (n, d), &self.device)?)
    }

    /// Rows for positions `start..start + len`, `(len, D)`, `f32`.
    ///
    /// # Errors
    /// [`Error::PositionOutOfRange`] if a position overflows.
    pub fn table(&self, start: usize, len: usize) -> Result<Tensor> {
        let end = start.checked_add(len).ok_or(Error::PositionOutOfRange {
            position: start as u64,
            limit: usize::MAX as u64,
            what: "sinusoidal embedding",
        })?;
        let d = self.encoding.dim();
        if end.saturating_mul(d) > Self::CACHE_ELEMENTS {
            return self.rows_tensor(self.encoding.table_range(start as u64, len)?);
        }
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        let have = cache.as_ref().map_or(0, |t| t.dims()[0]);
        if have < end {
            let want = end.max(2 * have).min((Self::CACHE_ELEMENTS / d).max(end));
            *cache = Some(self.rows_tensor(self.encoding.table_range(0, want)?)?);
        }
        let table = cache.as_ref().expect("cache was just filled");
        Ok(table.narrow(0, start, len)?)
    }

    /// `x + PE(positions)` for `x` of shape `(B, T, D)`.
    ///
    /// # Errors
    /// [`Error::Shape`] for a wrong `x` or id shape, [`Error::DType`] for
    /// non-integer ids, [`Error::NegativePosition`] for a negative id.
    pub fn forward(&self, x: &Tensor, positions: Positions<'_>) -> Result<Tensor> {
        let (b, t) = check_x(x, self.encoding.dim())?;
        match positions {
            Positions::Offset(offset) => add_rows(x, &self.table(offset, t)?),
            Positions::Ids(ids) => {
                let ids = super::batch_ids(ids, b, t, true)?;
                let rows = self.encoding.table(&ids)?;
                let rows = self
                    .rows_tensor(rows)?
                    .reshape((b, t, self.encoding.dim()))?;
                add_rows(x, &rows)
            }
        }
    }
}

/// Index tensor for `ids` on `device`.
fn id_tensor(ids: &[u64], device: &Device) -> Result<Tensor> {
    let v: Vec<u32> = ids.iter().map(|&p| p as u32).collect();
    Ok(Tensor::from_vec(v, ids.len(), device)?)
}

/// A learned table of position vectors as a trainable module (see the
/// [module docs](self)).
#[derive(Debug, Clone)]
pub struct LearnedEmbedding {
    weight: Tensor,
    max_positions: usize,
    dim: usize,
}

impl LearnedEmbedding {
    /// A `(max_positions, dim)` table named `weight` in `vb`, initialised
    /// N(0, 0.02²) when created.
    ///
    /// # Errors
    /// [`Error::InvalidDimension`] for a zero size; candle errors from `vb`
    /// (for example a stored tensor of another shape).
    pub fn new(max_positions: usize, dim: usize, vb: VarBuilder) -> Result<Self> {
        crate::error::check_dim("max_positions", max_positions, false)?;
        crate::error::check_dim("dim", dim, false)?;
        let weight = vb.get_with_hints(
            (max_positions, dim),
            "weight",
            Init::Randn {
                mean: 0.0,
                stdev: crate::absolute::LearnedTable::INIT_STD,
            },
        )?;
        Ok(Self {
            weight,
            max_positions,
            dim,
        })
    }

    /// The table, `(max_positions, D)`.
    pub fn weight(&self) -> &Tensor {
        &self.weight
    }

    /// Number of positions the table covers.
    pub fn max_positions(&self) -> usize {
        self.max_positions
    }

    fn out_of_range(&self, position: u64) -> Error {
        Error::PositionOutOfRange {
            position,
            limit: self.max_positions as u64,
            what: "learned embedding table",
        }
    }

    /// `x + W[positions]` for `x` of shape `(B, T, D)`.
    ///
    /// # Errors
    /// [`Error::PositionOutOfRange`] for a position `≥ max_positions` (never
    /// clamped); [`Error::Shape`], [`Error::DType`],
    /// [`Error::NegativePosition`] as [`SinusoidalEmbedding::forward`].
    pub fn forward(&self, x: &Tensor, positions: Positions<'_>) -> Result<Tensor> {
        let (b, t) = check_x(x, self.dim)?;
        match positions {
            Positions::Offset(offset) => {
                if t > 0 && offset.saturating_add(t) > self.max_positions {
                    return Err(self.out_of_range(offset.saturating_add(t - 1) as u64));
                }
                add_rows(
                    x,
                    &self.weight.narrow(0, offset.min(self.max_positions), t)?,
                )
            }
            Positions::Ids(ids) => {
                let ids = super::batch_ids(ids, b, t, true)?;
                if let Some(&bad) = ids.iter().find(|&&p| p >= self.max_positions as u64) {
                    return Err(self.out_of_range(bad));
                }
                let idx = id_tensor(&ids, self.weight.device())?;
                let rows = self
                    .weight
                    .index_select(&idx, 0)?
                    .reshape((b, t, self.dim))?;
                add_rows(x, &rows)
            }
        }
    }
}

/// FLOATER as a trainable module (see [`crate::absolute::floater`]).
///
/// Parameters in `vb`: `p0` `(D)`, `w1` `(hidden, D + 1)`, `b1` `(hidden)`,
/// `w2` `(D, hidden)`, `b2` `(D)`, initialised as
/// [`Floater::random`](crate::absolute::Floater::random) describes. The
/// table is recomputed at each call (its cost is linear in the largest
/// position, with `steps_per_position` integrator steps per position, each
/// one MLP evaluation for Euler and four for RK4).
#[derive(Debug, Clone)]
pub struct FloaterEmbedding {
    config: FloaterConfig,
    p0: Tensor,
    w1: Tensor,
    b1: Tensor,
    w2: Tensor,
    b2: Tensor,
}

impl FloaterEmbedding {
    /// Creates (or loads) the parameters from `vb`.
    ///
    /// # Errors
    /// An invalid config (see [`FloaterConfig::validate`]); candle errors
    /// from `vb`.
    pub fn new(config: FloaterConfig, vb: VarBuilder) -> Result<Self> {
        config.validate()?;
        let (d, h) = (config.dim, config.hidden);
        let randn = |stdev: f64| Init::Randn { mean: 0.0, stdev };
        Ok(Self {
            config,
            p0: vb.get_with_hints(d, "p0", randn(0.02))?,
            w1: vb.get_with_hints((h, d + 1), "w1", randn(1.0 / ((d + 1) as f64).sqrt()))?,
            b1: vb.get_with_hints(h, "b1", Init::Const(0.0))?,
            w2: vb.get_with_hints((d, h), "w2", randn(1.0 / (h as f64).sqrt()))?,
            b2: vb.get_with_hints(d, "b2", Init::Const(0.0))?,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &FloaterConfig {
        &self.config
    }

    /// The parameters `[p0, w1, b1, w2, b2]`.
    pub fn parameters(&self) -> [&Tensor; 5] {
        [&self.p0, &self.w1, &self.b1, &self.w2, &self.b2]
    }

    /// The parameters as plain `f64`, for inspection with the `f64` path.
    ///
    /// # Errors
    /// Candle errors reading the tensors.
    pub fn to_plain(&self) -> Result<Floater> {
        let v1 = |t: &Tensor| -> Result<Vec<f64>> { Ok(t.to_dtype(DType::F64)?.to_vec1()?) };
        let v2 = |t: &Tensor| -> Result<Vec<Vec<f64>>> { Ok(t.to_dtype(DType::F64)?.to_vec2()?) };
        Floater::new(
            self.config,
            FloaterParams {
                p0: v1(&self.p0)?,
                w1: v2(&self.w1)?,
                b1: v1(&self.b1)?,
                w2: v2(&self.w2)?,
                b2: v1(&self.b2)?,
            },
        )
    }

    /// Positions `0..n` as a `(n, D)` tensor (in the parameters' dtype),
    /// differentiable with respect to every parameter.
    ///
    /// # Errors
    /// Candle errors.
    pub fn table(&self, n: usize) -> Result<Tensor> {
        let d = self.config.dim;
        let w1p_t = self.w1.narrow(1, 0, d)?.t()?.contiguous()?; // (D, H)
        let w1t = self.w1.narrow(1, d, 1)?.t()?.contiguous()?; // (1, H)
        let w2_t = self.w2.t()?.contiguous()?; // (H, D)
        let b1 = self.b1.unsqueeze(0)?;
        let b2 = self.b2.unsqueeze(0)?;
        let field = |t: f64, p: &Tensor| -> candle_core::Result<Tensor> {
            let z = (p.matmul(&w1p_t)? + (&w1t * t)?)?.broadcast_add(&b1)?;
            z.tanh()?.matmul(&w2_t)?.broadcast_add(&b2)
        };
        let (dt, steps) = (self.config.delta_t, self.config.steps_per_position);
        let h = dt / steps as f64;
        let mut y = self.p0.unsqueeze(0)?; // (1, D)
        let mut rows = Vec::with_capacity(n);
        for i in 0..n {
            if i > 0 {
                let t0 = (i - 1) as f64 * dt;
                for s in 0..steps {
                    let t = t0 + s as f64 * h;
                    y = match self.config.integrator {
                        Integrator::Euler => (&y + (field(t, &y)? * h)?)?,
                        Integrator::Rk4 => {
                            let k1 = field(t, &y)?;
                            let k2 = field(t + h / 2.0, &(&y + (&k1 * (h / 2.0))?)?)?;
                            let k3 = field(t + h / 2.0, &(&y + (&k2 * (h / 2.0))?)?)?;
                            let k4 = field(t + h, &(&y + (&k3 * h)?)?)?;
                            let sum = (((k1 + (k2 * 2.0)?)? + (k3 * 2.0)?)? + k4)?;
                            (&y + (sum * (h / 6.0))?)?
                        }
                    };
                }
            }
            rows.push(y.clone());
        }
        if rows.is_empty() {
            return Ok(Tensor::zeros((0, d), self.p0.dtype(), self.p0.device())?);
        }
        Ok(Tensor::cat(&rows, 0)?)
    }

    /// `x + p(positions · Δt)` for `x` of shape `(B, T, D)`.
    ///
    /// # Errors
    /// [`Error::Shape`], [`Error::DType`], [`Error::NegativePosition`] as
    /// [`SinusoidalEmbedding::forward`]; [`Error::PositionOutOfRange`] for
    /// ids above `u32::MAX`.
    pub fn forward(&self, x: &Tensor, positions: Positions<'_>) -> Result<Tensor> {
        let (b, t) = check_x(x, self.config.dim)?;
        match positions {
            Positions::Offset(offset) => {
                let end = offset.checked_add(t).ok_or(Error::PositionOutOfRange {
                    position: offset as u64,
                    limit: usize::MAX as u64,
                    what: "FLOATER positions",
                })?;
                let table = self.table(end)?;
                add_rows(x, &table.narrow(0, offset, t)?)
            }
            Positions::Ids(ids) => {
                let ids = super::batch_ids(ids, b, t, true)?;
                if let Some(&bad) = ids.iter().find(|&&p| p > u32::MAX as u64) {
                    return Err(Error::PositionOutOfRange {
                        position: bad,
                        limit: u32::MAX as u64 + 1,
                        what: "FLOATER position ids",
                    });
                }
                let n = ids.iter().max().map_or(0, |m| m + 1) as usize;
                let table = self.table(n)?;
                let idx = id_tensor(&ids, table.device())?;
                let rows = table
                    .index_select(&idx, 0)?
                    .reshape((b, t, self.config.dim))?;
                add_rows(x, &rows)
            }
        }
    }
}
