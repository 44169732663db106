//! `posenc._posenc`: the native module behind the Python package `posenc`.
//!
//! Every number comes from the Rust crates the `posenc` command uses; no
//! formula is written a second time here. Arrays cross as numpy arrays
//! (the kernels read and write the caller's buffers in place, without a
//! copy); every computation runs with the GIL released; every error is a
//! `posenc.PosencError`.
#![warn(missing_docs)]

use pyo3::prelude::*;

pub mod convert;
pub mod error;
pub mod families;
pub mod model;
pub mod ops;
pub mod passkey;
pub mod progress;
pub mod rope;

/// The native module.
#[pymodule]
fn _posenc(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // At import, before posenc starts a thread: spares candle's matmul (the
    // fine-tuner's frozen products) a read of /proc/cpuinfo per call.
    posenc::kernels::default_rayon_threads_env();
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    error::register(m)?;
    rope::register(m)?;
    families::register(m)?;
    ops::register(m)?;
    model::register(m)?;
    passkey::register(m)?;
    Ok(())
}
