//! Typed errors. Every check on user input happens at construction or before
//! a kernel runs, and reports one of these variants; nothing in posenc panics
//! on bad input.

use std::path::PathBuf;

/// Result alias used throughout posenc.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in posenc, with the values that caused it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A dimension is invalid: zero, odd where pairs are needed, or larger
    /// than the dimension that contains it.
    #[error("invalid {what} = {value}: {reason}")]
    InvalidDimension {
        /// Which dimension (for example `head_dim`, `rotary_dim`, `dim`).
        what: &'static str,
        /// The value given.
        value: usize,
        /// Why it is rejected.
        reason: &'static str,
    },

    /// A scaling factor (or another strictly positive real) is not finite or
    /// not strictly positive.
    #[error("invalid {name} = {value}: must be finite and > 0")]
    InvalidFactor {
        /// Parameter name as it appears in the config (`factor`, `beta_fast`, ...).
        name: &'static str,
        /// The value given.
        value: f64,
    },

    /// A real-valued parameter is not finite (NaN or infinite).
    #[error("invalid {name} = {value}: must be a finite number")]
    NotFinite {
        /// Parameter name.
        name: &'static str,
        /// The value given.
        value: f64,
    },

    /// RoPE base (`rope_theta`) is not finite or not > 0.
    #[error("invalid rope_theta = {0}: must be finite and > 0")]
    InvalidTheta(f64),

    /// Llama 3 scaling needs `low_freq_factor ≤ high_freq_factor` (equal
    /// factors leave no smoothing band, as in Llama 4).
    #[error("llama3 rope scaling needs low_freq_factor <= high_freq_factor, got low_freq_factor = {low}, high_freq_factor = {high}")]
    FreqFactorOrder {
        /// `low_freq_factor`.
        low: f64,
        /// `high_freq_factor`.
        high: f64,
    },

    /// A LongRoPE factor list does not have one entry per frequency.
    #[error("longrope {which} has {got} entries, expected {expected} (rotary_dim / 2)")]
    FactorListLength {
        /// `short_factor` or `long_factor`.
        which: &'static str,
        /// rotary_dim / 2.
        expected: usize,
        /// The length given.
        got: usize,
    },

    /// Unknown `rope_type` (or legacy `type`).
    #[error("unknown rope_type {name:?}; known types: {}", known.join(", "))]
    UnknownRopeType {
        /// The name given.
        name: String,
        /// Every name posenc understands.
        known: &'static [&'static str],
    },

    /// A key the configuration needs is absent.
    #[error("missing required key `{key}`{}", context.as_ref().map(|c| format!(" ({c})")).unwrap_or_default())]
    MissingKey {
        /// The key's name.
        key: String,
        /// Where it was needed (for example `rope_scaling of type yarn`).
        context: Option<String>,
    },

    /// A config key has a value of the wrong type or out of its domain.
    #[error("invalid value for `{key}`: {reason}")]
    InvalidValue {
        /// The key's name.
        key: String,
        /// Why it is rejected.
        reason: String,
    },

    /// `partial_rotary_factor` (or `rotary_pct`) outside (0, 1].
    #[error("partial_rotary_factor = {0} is outside (0, 1]")]
    PartialRotaryFactor(f64),

    /// A head count of zero.
    #[error("number of attention heads must be at least 1, got 0")]
    ZeroHeads,

    /// T5 bucketing needs at least two buckets (and, bidirectional, at least
    /// two per direction).
    #[error("num_buckets = {num_buckets} is too small: need at least {min}")]
    TooFewBuckets {
        /// The value given.
        num_buckets: usize,
        /// The smallest accepted value for this mode.
        min: usize,
    },

    /// A position below zero.
    #[error("position {0} is negative; positions start at 0")]
    NegativePosition(i64),

    /// A position past what the encoding can represent (learned tables,
    /// precomputed caches).
    #[error("position {position} is out of range: {what} covers positions 0..{limit}")]
    PositionOutOfRange {
        /// The position asked for.
        position: u64,
        /// The exclusive upper limit.
        limit: u64,
        /// What has the limit (for example `learned table`).
        what: &'static str,
    },

    /// A tensor or buffer of the wrong shape.
    #[error("shape mismatch for {what}: expected {expected}, got {got}")]
    Shape {
        /// What was checked.
        what: &'static str,
        /// The expected shape, in words.
        expected: String,
        /// The shape given.
        got: String,
    },

    /// A dtype the operation does not support.
    #[error("unsupported dtype {dtype} for {what}")]
    DType {
        /// The operation.
        what: &'static str,
        /// The dtype given.
        dtype: String,
    },

    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },

    /// A file (or string) is not valid JSON, or not the JSON expected.
    #[error("{} is not valid JSON: {source}", path.as_ref().map(|p| p.display().to_string()).unwrap_or_else(|| "input".into()))]
    Json {
        /// The file, if the JSON came from one.
        path: Option<PathBuf>,
        /// The underlying error.
        #[source]
        source: serde_json::Error,
    },

    /// A size read from user input (a config file, a grid, a list of
    /// positions) is above the bound posenc accepts; checked before anything
    /// of that size is allocated.
    #[error("{what} = {value} is too large (at most {max})")]
    TooLarge {
        /// What was too large (for example `head_dim`, `num_hidden_layers`).
        what: &'static str,
        /// The value given (saturated at `u64::MAX`).
        value: u64,
        /// The largest accepted value.
        max: u64,
    },

    /// A RoPE scaling name that does not parse
    /// ([`NamedScaling`](crate::rope::NamedScaling)).
    #[error(transparent)]
    ScalingName(#[from] crate::rope::ScalingNameError),

    /// An error from candle.
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}

impl Error {
    /// Convenience constructor for [`Error::InvalidValue`].
    pub fn invalid(key: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::InvalidValue {
            key: key.into(),
            reason: reason.into(),
        }
    }

    /// Convenience constructor for [`Error::MissingKey`].
    pub fn missing(key: impl Into<String>, context: Option<&str>) -> Self {
        Error::MissingKey {
            key: key.into(),
            context: context.map(str::to_owned),
        }
    }
}

/// `Ok(())` where `holds`, else [`Error::InvalidValue`] for `key` with the
/// reason `reason` gives (built only on failure).
pub(crate) fn ensure(holds: bool, key: &str, reason: impl FnOnce() -> String) -> Result<()> {
    if holds {
        Ok(())
    } else {
        Err(Error::invalid(key, reason()))
    }
}

/// Checks that `value` is finite and strictly positive.
pub fn check_positive(name: &'static str, value: f64) -> Result<f64> {
    if value.is_finite() && value > 0.0 {
        Ok(value)
    } else {
        Err(Error::InvalidFactor { name, value })
    }
}

/// Checks that `value` is finite.
pub fn check_finite(name: &'static str, value: f64) -> Result<f64> {
    if value.is_finite() {
        Ok(value)
    } else {
        Err(Error::NotFinite { name, value })
    }
}

/// Checks that a size read from user input is at most `max`.
pub fn check_size(what: &'static str, value: usize, max: usize) -> Result<usize> {
    if value > max {
        Err(Error::TooLarge {
            what,
            value: value as u64,
            max: max as u64,
        })
    } else {
        Ok(value)
    }
}

/// Checks that a dimension is non-zero (and even, when `even` is set).
pub fn check_dim(what: &'static str, value: usize, even: bool) -> Result<usize> {
    if value == 0 {
        return Err(Error::InvalidDimension {
            what,
            value,
            reason: "must be at least 1",
        });
    }
    if even && !value.is_multiple_of(2) {
        return Err(Error::InvalidDimension {
            what,
            value,
            reason: "must be even (dimensions are used in pairs)",
        });
    }
    Ok(value)
}

/// Checks that a buffer or list of `what` holds `need` items: otherwise
/// [`Error::Shape`] with both counts in `unit` (`elements`, `entries`).
pub(crate) fn check_count(what: &'static str, need: usize, got: usize, unit: &str) -> Result<()> {
    if got != need {
        return Err(Error::Shape {
            what,
            expected: format!("{need} {unit}"),
            got: format!("{got} {unit}"),
        });
    }
    Ok(())
}
