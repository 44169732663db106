//! Absolute encodings: a vector per position, added to the token embeddings
//! at the input ([`Hook::Input`](crate::Hook::Input)).
//!
//! - [`sinusoidal`]: fixed sines and cosines (Vaswani et al. 2017), in the
//!   paper's interleaved layout or the tensor2tensor / fairseq / Whisper
//!   concatenated layout;
//! - [`learned`]: a trainable table, one row per position (GPT-2, BERT);
//! - [`floater`]: FLOATER (Liu et al. 2020), positions as the solution of a
//!   learned ODE.
//!
//! The candle modules built on these live in
//! [`tensor::absolute`](crate::tensor::absolute).

pub mod floater;
pub mod learned;
pub mod sinusoidal;

pub use floater::{Floater, FloaterConfig, FloaterParams, Integrator};
pub use learned::LearnedTable;
pub use sinusoidal::{FrequencySpacing, Sinusoidal, SinusoidalLayout};

/// A small deterministic random number generator (SplitMix64 with a
/// Box–Muller normal sampler), used to initialise tables reproducibly from
/// a seed without an extra dependency.
#[derive(Debug, Clone)]
pub(crate) struct SeededRng {
    state: u64,
    spare: Option<f64>,
}

impl SeededRng {
    pub(crate) fn new(seed: u64) -> Self {
        Self {
            state: seed ^ 0x5DEE_CE66_D1CE_4E5B,
            spare: None,
        }
    }

    fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1).
    fn uniform(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    /// A sample of N(mean, std²).
    pub(crate) fn normal(&mut self, mean: f64, std: f64) -> f64 {
        if let Some(z) = self.spare.take() {
            return mean + std * z;
        }
        let u1 = self.uniform();
        let u2 = self.uniform();
        let r = (-2.0 * u1.ln()).sqrt();
        let (s, c) = (2.0 * std::f64::consts::PI * u2).sin_cos();
        self.spare = Some(r * s);
        mean + std * r * c
    }

    /// A `rows × cols` matrix of N(0, std²) samples.
    pub(crate) fn normal_matrix(&mut self, rows: usize, cols: usize, std: f64) -> Vec<Vec<f64>> {
        (0..rows)
            .map(|_| (0..cols).map(|_| self.normal(0.0, std)).collect())
            .collect()
    }
}

/// Checks that `out` has length `dim`.
pub(crate) fn check_out_len(what: &'static str, out: &[f64], dim: usize) -> crate::Result<()> {
    if out.len() != dim {
        return Err(crate::Error::Shape {
            what,
            expected: format!("[{dim}]"),
            got: format!("[{}]", out.len()),
        });
    }
    Ok(())
}

/// Checks that `rows` is a non-empty rectangular matrix of finite numbers
/// with `cols` columns (when given) and returns its column count.
pub(crate) fn check_matrix(
    what: &'static str,
    rows: &[Vec<f64>],
    expected_rows: Option<usize>,
    cols: Option<usize>,
) -> crate::Result<usize> {
    if let Some(r) = expected_rows {
        if rows.len() != r {
            return Err(crate::Error::Shape {
                what,
                expected: format!("{r} rows"),
                got: format!("{} rows", rows.len()),
            });
        }
    }
    let width = match (cols, rows.first()) {
        (Some(c), _) => c,
        (None, Some(r)) => r.len(),
        (None, None) => {
            return Err(crate::Error::Shape {
                what,
                expected: "at least one row".into(),
                got: "0 rows".into(),
            })
        }
    };
    for (i, row) in rows.iter().enumerate() {
        if row.len() != width {
            return Err(crate::Error::Shape {
                what,
                expected: format!("{width} columns in every row"),
                got: format!("{} columns in row {i}", row.len()),
            });
        }
        if let Some(&bad) = row.iter().find(|x| !x.is_finite()) {
            return Err(crate::Error::NotFinite {
                name: what,
                value: bad,
            });
        }
    }
    Ok(width)
}
