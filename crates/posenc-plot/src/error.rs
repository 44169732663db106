//! Typed errors.

use std::path::PathBuf;

/// Everything that can go wrong while building or rendering a figure.
///
/// Bad input (empty or ragged data, NaN, a log axis with a non-positive
/// value, a zero-sized picture) is reported here; rendering never panics on
/// it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PlotError {
    /// The data has no values to draw (no rows, no columns, no points).
    #[error("{what} is empty")]
    Empty {
        /// What was empty ("matrix", "series `x`", ...).
        what: String,
    },
    /// The rows of a matrix do not all have the same length.
    #[error("ragged matrix: row {row} has {found} values, row 0 has {expected}")]
    Ragged {
        /// Index of the first row whose length differs.
        row: usize,
        /// Length of row 0.
        expected: usize,
        /// Length of the offending row.
        found: usize,
    },
    /// A value is NaN or infinite.
    #[error("{what} is not finite ({value}) at {location}")]
    NonFinite {
        /// What holds the value ("matrix", "series `x`", ...).
        what: String,
        /// Where it is, e.g. `row 1, column 2` or `point 3`.
        location: String,
        /// The offending value.
        value: f64,
    },
    /// A fixed value range is not a finite interval with `min < max`.
    #[error("invalid value range [{min}, {max}]: need finite min < max")]
    InvalidRange {
        /// Lower end.
        min: f64,
        /// Upper end.
        max: f64,
    },
    /// A value on a logarithmic axis is zero or negative.
    #[error("log-scale {axis} axis needs positive values, got {value}")]
    NonPositiveOnLogAxis {
        /// `"x"` or `"y"`.
        axis: &'static str,
        /// The offending value.
        value: f64,
    },
    /// Two inputs that must match in length do not.
    #[error("{what}: expected {expected}, found {found}")]
    LengthMismatch {
        /// What was compared.
        what: String,
        /// Expected length.
        expected: usize,
        /// Actual length.
        found: usize,
    },
    /// The requested picture size is outside what can be drawn.
    #[error("picture size {width}×{height} is invalid: {reason}")]
    InvalidSize {
        /// Requested width in pixels.
        width: u32,
        /// Requested height in pixels.
        height: u32,
        /// What is wrong (bounds).
        reason: String,
    },
    /// An option is out of its domain (message says which).
    #[error("invalid option: {0}")]
    InvalidOption(String),
    /// The drawing back end failed (plotters error, as text).
    #[error("drawing failed: {0}")]
    Backend(String),
    /// PNG encoding failed.
    #[error("PNG encoding failed: {0}")]
    Png(String),
    /// Writing the output file failed.
    #[error("cannot write {path}: {source}")]
    Io {
        /// The file being written.
        path: PathBuf,
        /// The underlying I/O error.
        #[source]
        source: std::io::Error,
    },
}

/// `Result` with [`PlotError`].
pub type Result<T, E = PlotError> = std::result::Result<T, E>;

impl PlotError {
    pub(crate) fn backend(e: impl std::fmt::Display) -> Self {
        PlotError::Backend(e.to_string())
    }
}

/// Checks that `data` is a non-empty rectangular matrix of finite values;
/// returns `(rows, cols)`.
pub(crate) fn check_matrix(data: &[Vec<f64>], what: &str) -> Result<(usize, usize)> {
    let rows = data.len();
    if rows == 0 || data[0].is_empty() {
        return Err(PlotError::Empty { what: what.into() });
    }
    let cols = data[0].len();
    for (i, row) in data.iter().enumerate() {
        if row.len() != cols {
            return Err(PlotError::Ragged {
                row: i,
                expected: cols,
                found: row.len(),
            });
        }
        for (j, &v) in row.iter().enumerate() {
            if !v.is_finite() {
                return Err(PlotError::NonFinite {
                    what: what.into(),
                    location: format!("row {i}, column {j}"),
                    value: v,
                });
            }
        }
    }
    Ok((rows, cols))
}

/// Checks that a value is finite.
pub(crate) fn check_finite(v: f64, what: &str, location: impl FnOnce() -> String) -> Result<()> {
    if v.is_finite() {
        Ok(())
    } else {
        Err(PlotError::NonFinite {
            what: what.into(),
            location: location(),
            value: v,
        })
    }
}
