//! T5 buckets: transformers fixture, monotonicity, range, bias, bad input.

// Naive reference loops index by position on purpose.
#![allow(clippy::needless_range_loop)]

use posenc::relative::{relative_position_bucket, T5Bias, T5Buckets};
use posenc::{AttentionBias, Error, Hooks, PositionalEncoding};
use proptest::prelude::*;

use crate::common;
use common::runner;

#[test]
fn matches_transformers_fixture_exactly() {
    let fx = common::fixture("t5.json");
    assert_eq!(fx["relative_position"], "key_position - query_position");
    let cases = fx["cases"].as_array().unwrap();
    assert!(!cases.is_empty());
    let mut checked = 0;
    for case in cases {
        let bi = case["bidirectional"].as_bool().unwrap();
        let nb = case["num_buckets"].as_u64().unwrap() as usize;
        let md = case["max_distance"].as_u64().unwrap() as usize;
        let rel: Vec<i64> = serde_json::from_value(case["relative"].clone()).unwrap();
        let want: Vec<usize> = serde_json::from_value(case["bucket"].clone()).unwrap();
        assert_eq!(rel.len(), want.len());
        let buckets = T5Buckets::new(nb, md, bi).unwrap();
        for (r, w) in rel.iter().zip(&want) {
            assert_eq!(
                relative_position_bucket(*r, bi, nb, md),
                *w,
                "relative {r}, bidirectional {bi}, {nb} buckets, max distance {md}"
            );
            assert_eq!(buckets.bucket(*r), *w);
            checked += 1;
        }
    }
    assert!(checked > 0);
}

/// Buckets never decrease with |distance| on either side, stay below
/// num_buckets, and the two directions use disjoint halves.
#[test]
fn monotone_and_in_range() {
    let strategy = (
        prop::sample::select(vec![2usize, 3, 4, 5, 8, 16, 31, 32, 64, 127, 128, 129]),
        prop::sample::select(vec![2usize, 3, 16, 64, 128, 129, 1000]),
        any::<bool>(),
    );
    runner(200)
        .run(&strategy, |(nb, md, bi)| {
            let Ok(b) = T5Buckets::new(nb, md, bi) else {
                return Ok(());
            };
            for sign in [-1i64, 1] {
                let mut prev = None;
                for a in 0i64..3000 {
                    let r = sign * a;
                    let bucket = b.bucket(r);
                    prop_assert!(bucket < nb);
                    if bi && r > 0 {
                        prop_assert!(bucket >= nb / 2);
                    } else if bi {
                        prop_assert!(bucket < nb / 2);
                    }
                    if let Some(p) = prev {
                        prop_assert!(bucket >= p, "nb {} md {} r {}", nb, md, r);
                    }
                    prev = Some(bucket);
                }
            }
            Ok(())
        })
        .unwrap();
}

#[test]
fn exact_region_and_unidirectional_future() {
    let b = T5Buckets::new(32, 128, true).unwrap();
    for a in 0..8 {
        assert_eq!(b.bucket(-a), a as usize);
    }
    for a in 1..8 {
        assert_eq!(b.bucket(a), 16 + a as usize);
    }
    assert_eq!(b.bucket(-100_000), 15);
    assert_eq!(b.bucket(i64::MIN), 15);
    assert_eq!(b.bucket(i64::MAX), 31);
    let u = T5Buckets::new(32, 128, false).unwrap();
    for r in [1i64, 5, 1000] {
        assert_eq!(u.bucket(r), 0);
    }
    assert_eq!(u.bucket(-15), 15);
    assert_eq!(u.bucket(-1_000_000), 31);
}

#[test]
fn bias_looks_up_the_table() {
    let buckets = T5Buckets::new(8, 20, true).unwrap();
    let table: Vec<Vec<f64>> = (0..8)
        .map(|b| (0..3).map(|h| (10 * b + h) as f64).collect())
        .collect();
    let t5 = T5Bias::new(buckets, table.clone()).unwrap();
    assert_eq!(t5.hooks(), Hooks::LOGITS);
    assert_eq!(t5.num_heads(), 3);
    let qs: Vec<u64> = (5..9).collect();
    let ks: Vec<u64> = (0..12).collect();
    let bm = buckets.bucket_matrix(4, 12, 5, 0).unwrap();
    for h in 0..3 {
        let m = t5.bias_matrix(h, &qs, &ks).unwrap();
        for (i, row) in m.iter().enumerate() {
            for (j, v) in row.iter().enumerate() {
                let r = ks[j] as i64 - qs[i] as i64;
                let b = relative_position_bucket(r, true, 8, 20);
                assert_eq!(bm[i][j], b);
                assert_eq!(*v, table[b][h]);
            }
        }
    }
}

#[test]
fn bad_input_is_a_typed_error() {
    for nb in [0usize, 1] {
        assert!(matches!(
            T5Buckets::new(nb, 128, false),
            Err(Error::TooFewBuckets { min: 2, .. })
        ));
    }
    for nb in [0usize, 1, 2, 3] {
        assert!(matches!(
            T5Buckets::new(nb, 128, true),
            Err(Error::TooFewBuckets { min: 4, .. })
        ));
    }
    assert!(matches!(
        T5Buckets::new(32, 8, true),
        Err(Error::InvalidValue { .. })
    ));
    assert!(T5Buckets::new(32, 9, true).is_ok());
    let b = T5Buckets::new(4, 8, true).unwrap();
    assert!(matches!(T5Bias::random(b, 0, 1), Err(Error::ZeroHeads)));
    assert!(matches!(
        T5Bias::new(b, vec![vec![0.0; 2]; 3]),
        Err(Error::Shape { .. })
    ));
    assert!(matches!(
        T5Bias::new(b, vec![vec![]; 4]),
        Err(Error::ZeroHeads)
    ));
    let t5 = T5Bias::random(b, 2, 1).unwrap();
    assert!(matches!(t5.bias(2, 0, 0), Err(Error::InvalidValue { .. })));
    assert!(matches!(
        t5.bias(0, 0, u64::MAX),
        Err(Error::PositionOutOfRange { .. })
    ));
    // The free function is total even for parameters T5Buckets rejects.
    assert_eq!(relative_position_bucket(5, true, 1, 128), 0);
    assert_eq!(relative_position_bucket(-5, false, 1, 128), 0);
    assert_eq!(relative_position_bucket(-50, true, 32, 4), 15);
}
