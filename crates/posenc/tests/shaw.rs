//! Shaw et al.: clipping, index matrix, logits and values against explicit
//! formulas, bad input. (The tensor path is checked in tensor_bias.rs.)

// Naive reference loops index by position on purpose.
#![allow(clippy::needless_range_loop)]

use posenc::relative::Shaw;
use posenc::{Error, Hooks, PositionalEncoding};

fn mat(rows: usize, cols: usize, seed: f64) -> Vec<Vec<f64>> {
    (0..rows)
        .map(|r| {
            (0..cols)
                .map(|c| ((r * cols + c) as f64 * 0.37 + seed).sin())
                .collect()
        })
        .collect()
}

#[test]
fn clipping_and_index_matrix() {
    for k in [0usize, 1, 2, 3, 127, 128] {
        let shaw = Shaw::new(k, 4, 1).unwrap();
        assert_eq!(shaw.num_relative(), 2 * k + 1);
        assert_eq!(shaw.key_table().len(), 2 * k + 1);
        for (q_off, k_off) in [(0u64, 0u64), (5, 0), (0, 7), (300, 290)] {
            let idx = shaw.index_matrix(9, 11, q_off, k_off).unwrap();
            for (i, row) in idx.iter().enumerate() {
                for (j, &r) in row.iter().enumerate() {
                    let d = (k_off + j as u64) as i64 - (q_off + i as u64) as i64;
                    let c = d.max(-(k as i64)).min(k as i64);
                    assert_eq!(r as i64, c + k as i64);
                    assert!(r < 2 * k + 1);
                    assert_eq!(
                        shaw.clipped_distance(q_off + i as u64, k_off + j as u64)
                            .unwrap(),
                        c
                    );
                }
            }
        }
    }
    let shaw = Shaw::new(0, 3, 0).unwrap();
    assert_eq!(shaw.relative_index(0, 100).unwrap(), 0);
    assert_eq!(shaw.relative_index(100, 0).unwrap(), 0);
    assert_eq!(shaw.hooks(), Hooks::LOGITS_AND_VALUES);
}

#[test]
fn logits_values_and_attention_match_the_formulas() {
    let (k, d, tq, tk) = (2usize, 5usize, 4usize, 6usize);
    let wk = mat(2 * k + 1, d, 0.1);
    let wv = mat(2 * k + 1, d, 0.7);
    let shaw = Shaw::from_tables(k, wk.clone(), wv.clone()).unwrap();
    let q = mat(tq, d, 1.3);
    let kk = mat(tk, d, 2.1);
    let v = mat(tk, d, 3.4);
    let (q_off, k_off) = (3u64, 0u64);
    let logits = shaw.logits(&q, &kk, q_off, k_off).unwrap();
    let mut weights = vec![vec![0.0; tk]; tq];
    for i in 0..tq {
        for j in 0..tk {
            let rel = j as i64 - (i as i64 + q_off as i64);
            let r = (rel.clamp(-(k as i64), k as i64) + k as i64) as usize;
            let mut e = 0.0;
            for c in 0..d {
                e += q[i][c] * (kk[j][c] + wk[r][c]);
            }
            e /= (d as f64).sqrt();
            assert!((logits[i][j] - e).abs() < 1e-12);
        }
        let max = logits[i].iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let s: f64 = logits[i].iter().map(|e| (e - max).exp()).sum();
        for j in 0..tk {
            weights[i][j] = (logits[i][j] - max).exp() / s;
        }
    }
    let z = shaw.attend(&q, &kk, &v, q_off, k_off, false).unwrap();
    let vt = shaw.values_term(&weights, q_off, k_off).unwrap();
    for i in 0..tq {
        for c in 0..d {
            let mut want = 0.0;
            let mut want_rel = 0.0;
            for j in 0..tk {
                let rel = j as i64 - (i as i64 + q_off as i64);
                let r = (rel.clamp(-(k as i64), k as i64) + k as i64) as usize;
                want += weights[i][j] * (v[j][c] + wv[r][c]);
                want_rel += weights[i][j] * wv[r][c];
            }
            assert!((z[i][c] - want).abs() < 1e-12);
            assert!((vt[i][c] - want_rel).abs() < 1e-12);
        }
    }
}

#[test]
fn causal_attention_ignores_future_keys() {
    let shaw = Shaw::new(2, 3, 9).unwrap();
    let q = mat(3, 3, 0.2);
    let k = mat(3, 3, 0.5);
    let mut v = mat(3, 3, 0.9);
    let z1 = shaw.attend(&q, &k, &v, 0, 0, true).unwrap();
    v[2] = vec![100.0, -100.0, 5.0];
    let z2 = shaw.attend(&q, &k, &v, 0, 0, true).unwrap();
    assert_eq!(z1[0], z2[0]);
    assert_eq!(z1[1], z2[1]);
    assert_ne!(z1[2], z2[2]);
    // The first query sees only key 0 (distance 0): z = v_0 + a^V[k].
    for c in 0..3 {
        assert!((z1[0][c] - (v[0][c] + shaw.value_table()[2][c])).abs() < 1e-12);
    }
}

#[test]
fn bad_input_is_a_typed_error() {
    assert!(matches!(
        Shaw::new(2, 0, 0),
        Err(Error::InvalidDimension {
            what: "head_dim",
            ..
        })
    ));
    assert!(matches!(
        Shaw::from_tables(1, mat(2, 4, 0.0), mat(3, 4, 0.0)),
        Err(Error::Shape { .. })
    ));
    assert!(matches!(
        Shaw::from_tables(1, mat(3, 4, 0.0), mat(3, 5, 0.0)),
        Err(Error::Shape { .. })
    ));
    let mut bad = mat(3, 4, 0.0);
    bad[1][2] = f64::INFINITY;
    assert!(matches!(
        Shaw::from_tables(1, mat(3, 4, 0.0), bad),
        Err(Error::NotFinite { .. })
    ));
    let shaw = Shaw::new(1, 4, 0).unwrap();
    assert!(matches!(
        shaw.logits(&mat(2, 3, 0.0), &mat(2, 4, 0.0), 0, 0),
        Err(Error::Shape { .. })
    ));
    assert!(matches!(
        shaw.attend(
            &mat(2, 4, 0.0),
            &mat(2, 4, 0.0),
            &mat(3, 4, 0.0),
            0,
            0,
            false
        ),
        Err(Error::Shape { .. })
    ));
    assert!(matches!(
        shaw.relative_index(u64::MAX, 0),
        Err(Error::PositionOutOfRange { .. })
    ));
}
