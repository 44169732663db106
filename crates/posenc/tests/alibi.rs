//! ALiBi: reference slopes, geometric structure, bias matrices, bad input.

// Naive reference loops index by position on purpose.
#![allow(clippy::needless_range_loop)]

use posenc::relative::{alibi_slopes, Alibi, AlibiMode};
use posenc::{AttentionBias, Error, Hooks, PositionalEncoding};

use crate::common;

#[test]
fn slopes_match_reference_fixture() {
    let fx = common::fixture("alibi.json");
    let cases = fx["cases"].as_array().unwrap();
    assert!(cases.len() >= 5);
    for case in cases {
        let heads = case["heads"].as_u64().unwrap() as usize;
        let want: Vec<f64> = serde_json::from_value(case["slopes"].clone()).unwrap();
        let got = alibi_slopes(heads).unwrap();
        assert_eq!(got.len(), want.len(), "heads {heads}");
        for (h, (g, w)) in got.iter().zip(&want).enumerate() {
            let rel = ((g - w) / w).abs();
            assert!(rel <= 1e-12, "heads {heads} head {h}: {g} vs {w}");
        }
    }
}

#[test]
fn power_of_two_slopes_are_geometric() {
    for n in [1usize, 2, 4, 8, 16, 32, 64, 128, 256] {
        let s = alibi_slopes(n).unwrap();
        let start = 2f64.powf(-8.0 / n as f64);
        assert!((s[0] - start).abs() <= 1e-15 * start);
        for h in 1..n {
            assert!((s[h] / s[h - 1] - start).abs() < 1e-12, "n {n} h {h}");
        }
        // The last slope of a power of two is always 2^-8.
        assert!((s[n - 1] - 1.0 / 256.0).abs() < 1e-15);
    }
}

#[test]
fn non_power_of_two_slopes_interleave() {
    for n in [3usize, 5, 6, 7, 12, 20, 24, 40, 127, 129] {
        let s = alibi_slopes(n).unwrap();
        assert_eq!(s.len(), n);
        let c = 1usize << n.ilog2();
        let base = alibi_slopes(c).unwrap();
        let twice = alibi_slopes(2 * c).unwrap();
        assert_eq!(&s[..c], &base[..]);
        for (t, v) in s[c..].iter().enumerate() {
            assert_eq!(*v, twice[2 * t]);
        }
        assert!(s.iter().all(|m| *m > 0.0 && *m < 1.0));
    }
}

#[test]
fn causal_and_bidirectional_bias_matrices() {
    let causal = Alibi::new(8, AlibiMode::Causal).unwrap();
    let bi = Alibi::new(8, AlibiMode::Bidirectional).unwrap();
    assert_eq!(causal.hooks(), Hooks::LOGITS);
    assert_eq!(causal.num_heads(), 8);
    let qs: Vec<u64> = (0..5).collect();
    let ks: Vec<u64> = (0..7).collect();
    for h in 0..8 {
        let m = causal.slopes()[h];
        let cm = causal.bias_matrix(h, &qs, &ks).unwrap();
        let bm = bi.bias_matrix(h, &qs, &ks).unwrap();
        for (i, (crow, brow)) in cm.iter().zip(&bm).enumerate() {
            for (j, (c, b)) in crow.iter().zip(brow).enumerate() {
                let d = i as f64 - j as f64;
                assert_eq!(*c, -m * d);
                assert_eq!(*b, -m * d.abs());
                if j <= i {
                    assert_eq!(c, b);
                    assert!(*c <= 0.0);
                }
            }
            assert_eq!(crow[i], 0.0);
        }
    }
    // Only the distance matters.
    assert_eq!(
        causal.bias(3, 1000, 990).unwrap(),
        causal.bias(3, 10, 0).unwrap()
    );
}

#[test]
fn bad_input_is_a_typed_error() {
    assert!(matches!(alibi_slopes(0), Err(Error::ZeroHeads)));
    assert!(matches!(
        Alibi::new(0, AlibiMode::Causal),
        Err(Error::ZeroHeads)
    ));
    assert!(matches!(
        Alibi::with_slopes(vec![], AlibiMode::Causal),
        Err(Error::ZeroHeads)
    ));
    assert!(matches!(
        Alibi::with_slopes(vec![0.5, f64::NAN], AlibiMode::Causal),
        Err(Error::NotFinite { .. })
    ));
    let a = Alibi::new(4, AlibiMode::Causal).unwrap();
    assert!(matches!(a.bias(4, 0, 0), Err(Error::InvalidValue { .. })));
    assert!(matches!(
        a.bias(0, u64::MAX, 0),
        Err(Error::PositionOutOfRange { .. })
    ));
}
