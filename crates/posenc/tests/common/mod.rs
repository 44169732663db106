//! Helpers shared by posenc's integration tests (`mod common;` in each):
//! deterministic xorshift data, the fused-against-reference check, seeded
//! property runners and the reference fixtures.

// Each test binary uses its own subset of these.
#![allow(dead_code)]

use candle_core::{DType, Device, Tensor};
use posenc::tensor::rope::HeadLayout;

/// Deterministic xorshift data in [-2, 2).
pub struct Rng(pub u64);
impl Rng {
    pub fn next_f32(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0
    }
    /// A value in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_f32();
        self.0 % n
    }
    /// A CPU tensor of `dims` filled with [`Rng::next_f32`], cast to `dtype`.
    pub fn tensor(&mut self, dims: &[usize], dtype: DType) -> Tensor {
        let n: usize = dims.iter().product();
        let v: Vec<f32> = (0..n).map(|_| self.next_f32()).collect();
        Tensor::from_vec(v, dims, &Device::Cpu)
            .unwrap()
            .to_dtype(dtype)
            .unwrap()
    }
}

/// All of `t`'s values as f32, flattened.
pub fn vals(t: &Tensor) -> Vec<f32> {
    t.to_dtype(DType::F32)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap()
}

/// |fast − reference| allowed for an output `r`: f32 arithmetic error on
/// products up to `mag`, plus one ulp of the output for f16/bf16.
pub fn tol(dtype: DType, r: f32, mag: f32) -> f32 {
    let f32_err = 8.0 * 2f32.powi(-24) * mag;
    match dtype {
        DType::F32 => f32_err,
        DType::F16 => r.abs().max(6.1e-5) * 2f32.powi(-10) + f32_err,
        DType::BF16 => r.abs().max(1e-30) * 2f32.powi(-7) + f32_err,
        _ => unreachable!(),
    }
}

/// `got` has `want`'s dims and each value within [`tol`] of it.
pub fn assert_close(got: &Tensor, want: &Tensor, dtype: DType, mag: f32, ctx: &str) {
    assert_eq!(got.dims(), want.dims(), "{ctx}");
    for (j, (a, w)) in vals(got).iter().zip(vals(want)).enumerate() {
        assert!(
            (a - w).abs() <= tol(dtype, w, mag),
            "{ctx} [{j}]: fused {a} vs reference {w}"
        );
    }
}

/// The dims of a `[b, h, t, d]` tensor in `layout`.
pub fn dims(layout: HeadLayout, b: usize, h: usize, t: usize, d: usize) -> [usize; 4] {
    match layout {
        HeadLayout::Bhtd => [b, h, t, d],
        HeadLayout::Bthd => [b, t, h, d],
    }
}

/// Where the head vector of batch `b`, head `h`, position `t` starts in a
/// `layout` tensor of `heads` heads, `len` positions and head dim `d`.
pub fn head_offset(
    layout: HeadLayout,
    [b, h, t]: [usize; 3],
    [heads, len, d]: [usize; 3],
) -> usize {
    match layout {
        HeadLayout::Bhtd => ((b * heads + h) * len + t) * d,
        HeadLayout::Bthd => ((b * len + t) * heads + h) * d,
    }
}

/// Every head vector of `out`, the rotation of `x` (both `[b, h, t, d]`
/// tensors' values in `layout`), is within `tol` of the same vector of `x`
/// rotated in f64 by `rotate(b, t, vector)`.
pub fn assert_heads_rotated(
    x: &[f32],
    out: &[f32],
    layout: HeadLayout,
    [b, h, t, d]: [usize; 4],
    tol: f64,
    ctx: &str,
    mut rotate: impl FnMut(usize, usize, &mut [f64]),
) {
    for bi in 0..b {
        for hi in 0..h {
            for ti in 0..t {
                let off = head_offset(layout, [bi, hi, ti], [h, t, d]);
                let mut head: Vec<f64> = x[off..off + d].iter().map(|&v| v as f64).collect();
                rotate(bi, ti, &mut head);
                for j in 0..d {
                    assert!(
                        (out[off + j] as f64 - head[j]).abs() < tol,
                        "{ctx}: vector ({bi},{hi},{ti})[{j}]: {} vs {}",
                        out[off + j],
                        head[j]
                    );
                }
            }
        }
    }
}

/// A property runner seeded with ChaCha `[7; 32]`, so every run draws the
/// same cases.
pub fn seeded(config: proptest::test_runner::Config) -> proptest::test_runner::TestRunner {
    use proptest::test_runner::{RngAlgorithm, TestRng, TestRunner};
    TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &[7u8; 32]))
}

/// [`seeded`] with `cases` cases and no failure file.
pub fn runner(cases: u32) -> proptest::test_runner::TestRunner {
    seeded(proptest::test_runner::Config {
        cases,
        failure_persistence: None,
        ..Default::default()
    })
}

/// The reference fixture `tests/fixtures/NAME`.
pub fn fixture(name: &str) -> serde_json::Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The largest `|a_i − b_i|` of two slices of one length (0 when empty).
pub fn max_abs_diff(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}
