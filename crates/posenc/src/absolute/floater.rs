//! FLOATER, Liu et al. 2020, *Learning to Encode Position for Transformer
//! with Continuous Dynamical Model* (ICML 2020).
//!
//! Positions are samples of a continuous trajectory `p(t) ∈ R^D` that solves
//! a learned ordinary differential equation:
//!
//! ```text
//! dp/dt = h(t, p(t); θ),     p(0) = p0 (learned),     PE(i) = p(i · Δt)
//! h(t, p) = W2 · tanh(W1 · [p; t] + b1) + b2
//! ```
//!
//! `h` is a small MLP `D + 1 → hidden → D` with `tanh`, the time being an
//! extra input feature; `θ = (p0, W1, b1, W2, b2)`. The ODE is integrated
//! numerically from `t = 0`, with `steps_per_position` steps of the chosen
//! [`Integrator`] (explicit Euler or classical Runge–Kutta 4) between two
//! consecutive positions. Unlike a learned table, FLOATER is defined at every
//! position (it extrapolates), and its parameter count does not grow with
//! the sequence length.
//!
//! This is the plain `f64` path, for inspection and as a reference; the
//! trainable candle module (the ODE solve composed of candle ops, so that
//! `backward()` reaches every parameter) is
//! [`tensor::absolute::FloaterEmbedding`](crate::tensor::absolute::FloaterEmbedding),
//! which can export its parameters to this type.
//!
//! # Shapes
//! `p0`, `b2`: `[D]`; `W1`: `[hidden][D + 1]` (the last column multiplies
//! `t`); `b1`: `[hidden]`; `W2`: `[D][hidden]`.
//!
//! # Errors
//! `D = 0`, `hidden = 0` or `steps_per_position = 0`
//! ([`Error::InvalidDimension`]); `Δt` not finite or not `> 0`
//! ([`Error::InvalidFactor`]); parameters of the wrong shape
//! ([`Error::Shape`]) or not finite ([`Error::NotFinite`]).
//!
//! ```
//! use posenc::absolute::{Floater, FloaterConfig, Integrator};
//! use posenc::AbsoluteEncoding;
//!
//! let config = FloaterConfig::new(8, 16).with_integrator(Integrator::Rk4);
//! let floater = Floater::random(config, 7)?;
//! let table = floater.table_f64(10);
//! assert_eq!(table.len(), 10);
//! assert_eq!(table[0], floater.params().p0); // p(0) = p0
//! assert_eq!(floater.encode(3)?, table[3]);
//! # Ok::<(), posenc::Error>(())
//! ```

use crate::encoding::{positional_encoding, AbsoluteEncoding, Hooks};
use crate::error::{check_dim, check_positive, Result};

/// A numerical ODE integrator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Integrator {
    /// Explicit Euler: `y ← y + h·f(t, y)`; first order.
    Euler,
    /// Classical fourth-order Runge–Kutta.
    #[default]
    Rk4,
}

/// FLOATER's hyper-parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FloaterConfig {
    /// Width `D` of each position vector.
    pub dim: usize,
    /// Hidden width of the MLP `h`.
    pub hidden: usize,
    /// Time between two consecutive positions: position `i` is `p(i·Δt)`.
    pub delta_t: f64,
    /// Integrator steps between two consecutive positions.
    pub steps_per_position: usize,
    /// The integrator.
    pub integrator: Integrator,
}

impl FloaterConfig {
    /// `dim`, `hidden`, with `Δt = 0.1`, 4 steps per position and RK4.
    pub fn new(dim: usize, hidden: usize) -> Self {
        Self {
            dim,
            hidden,
            delta_t: 0.1,
            steps_per_position: 4,
            integrator: Integrator::Rk4,
        }
    }

    /// Sets `Δt`.
    pub fn with_delta_t(mut self, delta_t: f64) -> Self {
        self.delta_t = delta_t;
        self
    }

    /// Sets the number of integrator steps between consecutive positions.
    pub fn with_steps(mut self, steps_per_position: usize) -> Self {
        self.steps_per_position = steps_per_position;
        self
    }

    /// Sets the integrator.
    pub fn with_integrator(mut self, integrator: Integrator) -> Self {
        self.integrator = integrator;
        self
    }

    /// Checks every field.
    ///
    /// # Errors
    /// [`Error::InvalidDimension`](crate::Error::InvalidDimension) for a zero
    /// `dim`, `hidden` or `steps_per_position`;
    /// [`Error::InvalidFactor`](crate::Error::InvalidFactor) for a `Δt` that
    /// is not finite and `> 0`.
    pub fn validate(&self) -> Result<()> {
        check_dim("dim", self.dim, false)?;
        check_dim("hidden", self.hidden, false)?;
        check_dim("steps_per_position", self.steps_per_position, false)?;
        check_positive("delta_t", self.delta_t)?;
        Ok(())
    }
}

/// FLOATER's parameters `θ = (p0, W1, b1, W2, b2)` as plain `f64`.
#[derive(Debug, Clone, PartialEq)]
pub struct FloaterParams {
    /// Initial state `p(0)`, `[D]`.
    pub p0: Vec<f64>,
    /// First layer, `[hidden][D + 1]`; column `D` multiplies the time.
    pub w1: Vec<Vec<f64>>,
    /// First bias, `[hidden]`.
    pub b1: Vec<f64>,
    /// Second layer, `[D][hidden]`.
    pub w2: Vec<Vec<f64>>,
    /// Second bias, `[D]`.
    pub b2: Vec<f64>,
}

/// FLOATER with plain `f64` parameters (see the [module docs](self)).
#[derive(Debug, Clone, PartialEq)]
pub struct Floater {
    config: FloaterConfig,
    params: FloaterParams,
}

impl Floater {
    /// FLOATER with given parameters.
    ///
    /// # Errors
    /// An invalid `config` (see [`FloaterConfig::validate`]); parameters of
    /// the wrong shape ([`Error::Shape`](crate::Error::Shape)) or not finite
    /// ([`Error::NotFinite`](crate::Error::NotFinite)).
    pub fn new(config: FloaterConfig, params: FloaterParams) -> Result<Self> {
        config.validate()?;
        let (d, h) = (config.dim, config.hidden);
        super::check_matrix(
            "floater p0",
            std::slice::from_ref(&params.p0),
            None,
            Some(d),
        )?;
        super::check_matrix("floater W1", &params.w1, Some(h), Some(d + 1))?;
        super::check_matrix(
            "floater b1",
            std::slice::from_ref(&params.b1),
            None,
            Some(h),
        )?;
        super::check_matrix("floater W2", &params.w2, Some(d), Some(h))?;
        super::check_matrix(
            "floater b2",
            std::slice::from_ref(&params.b2),
            None,
            Some(d),
        )?;
        Ok(Self { config, params })
    }

    /// FLOATER with random parameters from a generator seeded with `seed`:
    /// `p0 ~ N(0, 0.02²)`, `W1 ~ N(0, 1/(D + 1))`, `W2 ~ N(0, 1/hidden)`,
    /// zero biases.
    ///
    /// # Errors
    /// An invalid `config` (see [`FloaterConfig::validate`]).
    pub fn random(config: FloaterConfig, seed: u64) -> Result<Self> {
        config.validate()?;
        let (d, h) = (config.dim, config.hidden);
        let mut rng = super::SeededRng::new(seed);
        let p0 = rng.normal_matrix(1, d, 0.02).remove(0);
        let w1 = rng.normal_matrix(h, d + 1, 1.0 / ((d + 1) as f64).sqrt());
        let w2 = rng.normal_matrix(d, h, 1.0 / (h as f64).sqrt());
        Self::new(
            config,
            FloaterParams {
                p0,
                w1,
                b1: vec![0.0; h],
                w2,
                b2: vec![0.0; d],
            },
        )
    }

    /// The configuration.
    pub fn config(&self) -> &FloaterConfig {
        &self.config
    }

    /// The parameters.
    pub fn params(&self) -> &FloaterParams {
        &self.params
    }

    /// The vector field `h(t, p) = W2 · tanh(W1 · [p; t] + b1) + b2`.
    pub fn vector_field(&self, t: f64, p: &[f64]) -> Vec<f64> {
        let d = self.config.dim;
        let hidden: Vec<f64> = self
            .params
            .w1
            .iter()
            .zip(&self.params.b1)
            .map(|(row, b)| {
                let z: f64 =
                    row[..d].iter().zip(p).map(|(w, x)| w * x).sum::<f64>() + row[d] * t + b;
                z.tanh()
            })
            .collect();
        self.params
            .w2
            .iter()
            .zip(&self.params.b2)
            .map(|(row, b)| row.iter().zip(&hidden).map(|(w, x)| w * x).sum::<f64>() + b)
            .collect()
    }

    /// Positions `0..n` as rows `p(0), p(Δt), …, p((n − 1)·Δt)`.
    pub fn table_f64(&self, n: usize) -> Vec<Vec<f64>> {
        solve_grid(
            |t, y| self.vector_field(t, y),
            &self.params.p0,
            self.config.delta_t,
            self.config.steps_per_position,
            n,
            self.config.integrator,
        )
    }
}

positional_encoding!(Floater, Hooks::INPUT, "FLOATER");

impl AbsoluteEncoding for Floater {
    fn dim(&self) -> usize {
        self.config.dim
    }

    /// Integrates from 0 to `position · Δt` (cost linear in `position`; use
    /// [`Floater::table_f64`] for many consecutive positions).
    fn encode_into(&self, position: u64, out: &mut [f64]) -> Result<()> {
        super::check_out_len("floater output", out, self.config.dim)?;
        let mut y = self.params.p0.clone();
        let (dt, steps) = (self.config.delta_t, self.config.steps_per_position);
        for i in 0..position {
            let t0 = i as f64 * dt;
            y = integrate(
                |t, y| self.vector_field(t, y),
                &y,
                t0,
                t0 + dt,
                steps,
                self.config.integrator,
            );
        }
        out.copy_from_slice(&y);
        Ok(())
    }
}

/// Integrates `dy/dt = f(t, y)` from `(t0, y0)` to `t1` with `steps` equal
/// steps of `integrator` and returns `y(t1)`. `steps = 0` returns `y0`.
pub fn integrate<F>(
    mut f: F,
    y0: &[f64],
    t0: f64,
    t1: f64,
    steps: usize,
    integrator: Integrator,
) -> Vec<f64>
where
    F: FnMut(f64, &[f64]) -> Vec<f64>,
{
    let mut y = y0.to_vec();
    if steps == 0 {
        return y;
    }
    let h = (t1 - t0) / steps as f64;
    let axpy = |y: &[f64], k: &[f64], a: f64| -> Vec<f64> {
        y.iter().zip(k).map(|(y, k)| y + a * k).collect()
    };
    for s in 0..steps {
        let t = t0 + s as f64 * h;
        match integrator {
            Integrator::Euler => {
                let k = f(t, &y);
                y = axpy(&y, &k, h);
            }
            Integrator::Rk4 => {
                let k1 = f(t, &y);
                let k2 = f(t + h / 2.0, &axpy(&y, &k1, h / 2.0));
                let k3 = f(t + h / 2.0, &axpy(&y, &k2, h / 2.0));
                let k4 = f(t + h, &axpy(&y, &k3, h));
                for (j, yj) in y.iter_mut().enumerate() {
                    *yj += h / 6.0 * (k1[j] + 2.0 * k2[j] + 2.0 * k3[j] + k4[j]);
                }
            }
        }
    }
    y
}

/// The solution of `dy/dt = f(t, y)`, `y(0) = y0`, sampled at
/// `t = 0, dt, 2·dt, …, (n − 1)·dt`, with `steps` integrator steps between
/// samples.
pub fn solve_grid<F>(
    mut f: F,
    y0: &[f64],
    dt: f64,
    steps: usize,
    n: usize,
    integrator: Integrator,
) -> Vec<Vec<f64>>
where
    F: FnMut(f64, &[f64]) -> Vec<f64>,
{
    let mut out = Vec::with_capacity(n);
    let mut y = y0.to_vec();
    for i in 0..n {
        if i > 0 {
            let t0 = (i - 1) as f64 * dt;
            y = integrate(&mut f, &y, t0, t0 + dt, steps, integrator);
        }
        out.push(y.clone());
    }
    out
}
