//! The products of the lab's linear layers: posenc's one dispatch
//! ([`posenc::kernels::matmul`]) with the lab's policy
//! ([`MatmulPolicy::LAB`]: posenc's AVX-512 tiles for the small products,
//! the `gemm` crate for the others).

use posenc::kernels::matmul::MatmulPolicy;
use posenc::kernels::SimdLevel;

pub(super) use posenc::kernels::matmul::GEMM_ONE_PASS_K;

/// Whether [`matmul`] computes an `m × n × k` product on posenc's AVX-512
/// tiles rather than with the `gemm` crate.
pub(super) fn on_tiles(level: SimdLevel, m: usize, n: usize, k: usize) -> bool {
    MatmulPolicy::LAB.on_tiles(level, m, n, k)
}

/// `C (m×n) = α·C + A·B` with row and column strides, with the lab's
/// policy ([`posenc::kernels::matmul::matmul`]).
#[allow(clippy::too_many_arguments)]
pub(super) fn matmul(
    level: SimdLevel,
    m: usize,
    n: usize,
    k: usize,
    c: &mut [f32],
    c_strides: (isize, isize),
    accumulate: bool,
    a: &[f32],
    a_strides: (isize, isize),
    b: &[f32],
    b_strides: (isize, isize),
) {
    posenc::kernels::matmul::matmul(
        level,
        MatmulPolicy::LAB,
        m,
        n,
        k,
        c,
        c_strides,
        accumulate,
        a,
        a_strides,
        b,
        b_strides,
    )
}
