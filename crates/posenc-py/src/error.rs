//! One Python exception class for every error posenc reports.
//!
//! Every error the Rust library or the CLI reports as one line reaches
//! Python as `posenc.PosencError` (a subclass of `ValueError`) with the
//! same words; a Rust panic inside a call is caught and becomes the same
//! exception ("internal error: ..."), never an abort.

use std::fmt::Display;
use std::panic::{catch_unwind, AssertUnwindSafe};

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

pyo3::create_exception!(
    posenc,
    PosencError,
    PyValueError,
    "An error reported by posenc: a bad argument, shape, dtype, device, name or file, \
     with the same one-line message the `posenc` command prints."
);

/// The error as a `PosencError` with its message on one line.
pub fn err(e: impl Display) -> PyErr {
    PosencError::new_err(one_line(&e.to_string()))
}

/// A message folded onto one line (newlines become "; ").
pub fn one_line(s: &str) -> String {
    let parts: Vec<&str> = s.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    parts.join("; ")
}

/// Extension for `Result`s of the Rust crates: `.py()?` raises
/// `PosencError`.
pub trait IntoPy<T> {
    /// The value, or the error as a `PosencError`.
    fn py(self) -> PyResult<T>;
}

impl<T, E: Display> IntoPy<T> for Result<T, E> {
    fn py(self) -> PyResult<T> {
        self.map_err(err)
    }
}

/// Runs `f`, turning a panic into a `PosencError` ("internal error: ...").
pub fn guard<T>(f: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(payload) => {
            let what = payload
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "a panic without a message".into());
            Err(PosencError::new_err(format!(
                "internal error: {} (please report it)",
                one_line(&what)
            )))
        }
    }
}

/// Runs `f` with the GIL released and panics caught (see [`guard`]).
pub fn detached<T: Send>(py: Python<'_>, f: impl FnOnce() -> PyResult<T> + Send) -> PyResult<T> {
    py.detach(|| guard(f))
}

/// Adds `PosencError`.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("PosencError", m.py().get_type::<PosencError>())?;
    Ok(())
}
