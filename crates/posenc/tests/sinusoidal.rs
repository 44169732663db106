//! Sinusoidal encoding: reference fixture, the linear map M_k, the seed's
//! four-number example, distinctness, offsets, layouts and bad input.

// Naive reference loops index by position on purpose.
#![allow(clippy::needless_range_loop)]

use posenc::absolute::{FrequencySpacing, Sinusoidal, SinusoidalLayout};
use posenc::{AbsoluteEncoding, Error, Hooks, PositionalEncoding};
use proptest::prelude::*;

use crate::common;
use common::{max_abs_diff, runner};
use std::f64::consts::PI;

fn apply(m: &[Vec<f64>], v: &[f64]) -> Vec<f64> {
    m.iter()
        .map(|row| row.iter().zip(v).map(|(a, b)| a * b).sum())
        .collect()
}

#[test]
fn matches_seed_fixture() {
    let fx = common::fixture("sinusoidal.json");
    let cases = fx["cases"].as_array().unwrap();
    assert!(!cases.is_empty());
    for case in cases {
        let n = case["positions"].as_u64().unwrap() as usize;
        let dim = case["dim"].as_u64().unwrap() as usize;
        let expected: Vec<Vec<f64>> = serde_json::from_value(case["table"].clone()).unwrap();
        assert_eq!(expected.len(), n);
        let pe = Sinusoidal::new(dim).unwrap();
        let table = pe.table_range(0, n).unwrap();
        for (p, (got, want)) in table.iter().zip(&expected).enumerate() {
            let err = max_abs_diff(got, want);
            assert!(err <= 1e-6, "dim {dim} position {p}: error {err}");
        }
    }
}

#[test]
fn hooks_and_name() {
    let pe = Sinusoidal::new(8).unwrap();
    assert_eq!(pe.hooks(), Hooks::INPUT);
    assert!(pe.name().contains("interleaved"));
    assert_eq!(pe.dim(), 8);
}

/// PE(p + k) = M_k · PE(p), with one M_k for all p.
#[test]
fn linear_map_property() {
    let dims = [2usize, 4, 6, 16, 64, 126, 128, 130];
    let layouts = [
        SinusoidalLayout::Interleaved,
        SinusoidalLayout::Concatenated,
    ];
    let spacings = [FrequencySpacing::Paper, FrequencySpacing::Endpoint];
    let strategy = (
        prop::sample::select(dims.to_vec()),
        0usize..2,
        0usize..2,
        -2000i64..2000,
        prop::collection::vec(0u64..20_000, 1..16),
    );
    runner(128)
        .run(&strategy, |(dim, l, s, k, ps)| {
            let pe = Sinusoidal::new(dim)
                .unwrap()
                .with_layout(layouts[l])
                .with_spacing(spacings[s]);
            let m = pe.linear_map(k).unwrap();
            for p in ps {
                let p = p + 2000; // p + k >= 0
                let lhs = pe.encode((p as i64 + k) as u64).unwrap();
                let rhs = apply(&m, &pe.encode(p).unwrap());
                let r = max_abs_diff(&lhs, &rhs);
                prop_assert!(r <= 1e-9, "dim {} k {} p {}: residual {}", dim, k, p, r);
            }
            Ok(())
        })
        .unwrap();
}

#[test]
fn linear_map_is_orthogonal_and_composes() {
    let pe = Sinusoidal::new(16).unwrap();
    let m3 = pe.linear_map(3).unwrap();
    let m4 = pe.linear_map(4).unwrap();
    let m7 = pe.linear_map(7).unwrap();
    let m0 = pe.linear_map(0).unwrap();
    for r in 0..16 {
        for c in 0..16 {
            let prod: f64 = (0..16).map(|t| m3[r][t] * m4[t][c]).sum();
            assert!((prod - m7[r][c]).abs() < 1e-12);
            let mtm: f64 = (0..16).map(|t| m3[t][r] * m3[t][c]).sum();
            let id = if r == c { 1.0 } else { 0.0 };
            assert!((mtm - id).abs() < 1e-12);
            assert_eq!(m0[r][c], id);
        }
    }
}

/// The NoPE-and-RoPE post's example: pairs turning at 0.5 and 0.25 cycles per position.
#[test]
fn seed_four_number_example() {
    let pe = Sinusoidal::with_frequencies(vec![2.0 * PI * 0.5, 2.0 * PI * 0.25]).unwrap();
    assert_eq!(pe.dim(), 4);
    let p0 = pe.encode(0).unwrap();
    assert_eq!(p0, vec![0.0, 1.0, 0.0, 1.0]);
    let p1 = pe.encode(1).unwrap();
    assert!(max_abs_diff(&p1, &[0.0, -1.0, 1.0, 0.0]) < 1e-12, "{p1:?}");
    let w = pe.wavelengths();
    assert!((w[0] - 2.0).abs() < 1e-12 && (w[1] - 4.0).abs() < 1e-12);
}

#[test]
fn positions_are_distinct() {
    for dim in [16usize, 64] {
        let n = 2000;
        let pe = Sinusoidal::new(dim).unwrap();
        let t = pe.table_range(0, n).unwrap();
        let mut min = f64::INFINITY;
        for i in 0..n {
            for j in 0..i {
                let d2: f64 = t[i].iter().zip(&t[j]).map(|(a, b)| (a - b) * (a - b)).sum();
                min = min.min(d2);
            }
        }
        assert!(
            min.sqrt() > 1e-3,
            "dim {dim}: closest pair at distance {}",
            min.sqrt()
        );
    }
}

#[test]
fn offset_rows_equal_shifted_plain_rows() {
    for (dim, offset) in [(1usize, 5u64), (2, 1), (3, 127), (16, 128), (129, 1000)] {
        let plain = Sinusoidal::new(dim).unwrap();
        let shifted = plain.clone().with_offset(offset);
        assert_eq!(
            shifted.table_range(0, 40).unwrap(),
            plain.table_range(offset, 40).unwrap()
        );
    }
}

#[test]
fn paper_frequencies_and_wavelengths() {
    let pe = Sinusoidal::new(128).unwrap();
    let f = pe.frequencies();
    assert_eq!(f.len(), 64);
    for (i, w) in f.iter().enumerate() {
        let want = 1.0 / 10000f64.powf(2.0 * i as f64 / 128.0);
        assert!((w - want).abs() <= 1e-15 * want.max(1e-300) + 1e-18);
    }
    let wl = pe.wavelengths();
    assert!((wl[0] - 2.0 * PI).abs() < 1e-12);
    let ratio = wl[1] / wl[0];
    for k in 1..wl.len() {
        assert!((wl[k] / wl[k - 1] - ratio).abs() < 1e-9);
    }
    assert!(wl[63] < 10000.0 * 2.0 * PI);
}

/// The introductory articles' numpy formula, for odd dimensions too.
#[test]
fn odd_interleaved_matches_seed_formula() {
    for dim in [1usize, 3, 127, 129] {
        let pe = Sinusoidal::new(dim).unwrap();
        for p in [0u64, 1, 7, 500] {
            let row = pe.encode(p).unwrap();
            for (j, v) in row.iter().enumerate() {
                let angle = p as f64 / 10000f64.powf(2.0 * (j / 2) as f64 / dim as f64);
                let want = if j % 2 == 0 { angle.sin() } else { angle.cos() };
                assert!((v - want).abs() < 1e-12, "dim {dim} p {p} col {j}");
            }
        }
        assert!(matches!(
            pe.linear_map(1),
            Err(Error::InvalidDimension { what: "dim", .. })
        ));
    }
}

/// tensor2tensor / fairseq / Whisper: [sin | cos], log(base)/(n − 1).
#[test]
fn tensor2tensor_variant() {
    for dim in [2usize, 3, 8, 9, 128] {
        let pe = Sinusoidal::tensor2tensor(dim).unwrap();
        let n = dim / 2;
        let inc = 10000f64.ln() / ((n as f64 - 1.0).max(1.0));
        for p in [0u64, 1, 3, 99] {
            let row = pe.encode(p).unwrap();
            for i in 0..n {
                let a = p as f64 * (-(i as f64) * inc).exp();
                assert!((row[i] - a.sin()).abs() < 1e-12);
                assert!((row[n + i] - a.cos()).abs() < 1e-12);
            }
            if dim % 2 == 1 {
                assert_eq!(row[dim - 1], 0.0);
            }
        }
        if n > 1 {
            assert!((pe.frequencies()[n - 1] - 1e-4).abs() < 1e-16);
        }
    }
}

#[test]
fn base_changes_frequencies() {
    let pe = Sinusoidal::new(4).unwrap().with_base(100.0).unwrap();
    assert!((pe.frequencies()[1] - 0.1).abs() < 1e-15);
    assert_eq!(pe.base(), 100.0);
}

#[test]
fn bad_input_is_a_typed_error() {
    assert!(matches!(
        Sinusoidal::new(0),
        Err(Error::InvalidDimension {
            what: "dim",
            value: 0,
            ..
        })
    ));
    for base in [1.0, 0.5, 0.0, -3.0, f64::NAN, f64::INFINITY] {
        assert!(matches!(
            Sinusoidal::new(8).unwrap().with_base(base),
            Err(Error::InvalidValue { ref key, .. }) if key == "base"
        ));
    }
    assert!(matches!(
        Sinusoidal::with_frequencies(vec![]),
        Err(Error::InvalidDimension { .. })
    ));
    assert!(matches!(
        Sinusoidal::with_frequencies(vec![1.0, f64::NAN]),
        Err(Error::NotFinite { .. })
    ));
    assert!(matches!(
        Sinusoidal::tensor2tensor(1),
        Err(Error::InvalidDimension { .. })
    ));
    let pe = Sinusoidal::new(8).unwrap();
    let mut short = vec![0.0; 7];
    assert!(matches!(
        pe.encode_into(0, &mut short),
        Err(Error::Shape { .. })
    ));
    let far = pe.with_offset(u64::MAX);
    assert!(matches!(
        far.encode(1),
        Err(Error::PositionOutOfRange { .. })
    ));
    assert!(far.encode(0).is_ok());
}
