//! CPU kernels (SIMD, threads) beneath the tensor API, each beside a reference path.
