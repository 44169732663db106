//! `posenc._posenc`: the native module behind the Python package `posenc`.
//!
//! Every number comes from the Rust crates the `posenc` command uses; no
//! formula is written a second time here. Arrays cross as numpy arrays
//! (the kernels read and write the caller's buffers in place, without a
//! copy); every computation runs with the GIL released; every error is a
//! `posenc.PosencError`.
#![warn(missing_docs)]

pub mod convert;
pub mod error;
pub mod families;
pub mod model;
pub mod ops;
pub mod passkey;
pub mod progress;
pub mod rope;

/// The native module: the classes and functions of the modules above.
#[pyo3::pymodule]
mod _posenc {
    #[pymodule_export]
    use crate::families::{
        alibi_bias, alibi_slopes, cope_positions, fire_distances, shaw_indices, sinusoidal,
        t5_bias, t5_buckets, xpos_scales,
    };
    #[pymodule_export]
    use crate::model::{finetune, Model};
    #[pymodule_export]
    use crate::ops::{
        _alibi_slopes_f32, _attention_backward, _attention_forward, _kept_pool_bytes,
        _method_forward, _rope_ptr, simd_level, KeptLogits,
    };
    #[pymodule_export]
    use crate::passkey::PasskeyProbe;
    #[pymodule_export]
    use crate::rope::{PyFrequencies, PyRopeConfig};
    use pyo3::prelude::*;

    #[pymodule_init]
    fn init(m: &Bound<'_, PyModule>) -> PyResult<()> {
        // At import, before posenc starts a thread: spares candle's matmul
        // (the fine-tuner's frozen products) a read of /proc/cpuinfo per call.
        posenc::kernels::default_rayon_threads_env();
        m.add("__version__", env!("CARGO_PKG_VERSION"))?;
        crate::error::register(m)
    }
}
