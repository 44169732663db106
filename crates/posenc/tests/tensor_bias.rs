//! Tensor biases against naive f64 loops: ALiBi, T5 (with gradients to the
//! table) and Shaw (efficient one-hot matmul path, with gradients to both
//! tables).

// Naive reference loops index by position on purpose.
#![allow(clippy::needless_range_loop)]

use candle_core::{DType, Device, Tensor};
use candle_nn::{VarBuilder, VarMap};
use posenc::relative::{Alibi, AlibiMode, Shaw, T5Bias, T5Buckets};
use posenc::tensor::bias::{alibi_bias, ShawRelative, T5RelativeBias};
use posenc::{AttentionBias, Error};

const SIZES: [(usize, usize); 6] = [(1, 1), (1, 129), (129, 1), (2, 3), (3, 127), (128, 128)];
const OFFSETS: [(u64, u64); 3] = [(0, 0), (5, 0), (0, 9)];

fn det(n: usize, seed: f64) -> Vec<f64> {
    (0..n).map(|i| ((i as f64) * 0.618 + seed).sin()).collect()
}

/// `b` is `(heads, Tq, Tk)` and equals `plain`'s bias for queries at
/// `qo..qo + Tq` and keys at `ko..ko + Tk`, each rounded once to f32.
fn assert_equals_plain(
    b: &Tensor,
    plain: &dyn AttentionBias,
    (tq, tk): (usize, usize),
    (qo, ko): (u64, u64),
) {
    let b: Vec<Vec<Vec<f32>>> = b.to_vec3().unwrap();
    let heads = plain.num_heads();
    assert_eq!((b.len(), b[0].len(), b[0][0].len()), (heads, tq, tk));
    for h in 0..heads {
        for i in 0..tq {
            for j in 0..tk {
                let want = plain.bias(h, qo + i as u64, ko + j as u64).unwrap();
                assert_eq!(b[h][i][j], want as f32);
            }
        }
    }
}

#[test]
fn alibi_tensor_equals_plain() {
    for heads in [1usize, 2, 3, 8, 12] {
        for mode in [AlibiMode::Causal, AlibiMode::Bidirectional] {
            let alibi = Alibi::new(heads, mode).unwrap();
            for (tq, tk) in SIZES {
                for (qo, ko) in OFFSETS {
                    let b = alibi_bias(&alibi, tq, tk, qo, ko, &Device::Cpu).unwrap();
                    assert_equals_plain(&b, &alibi, (tq, tk), (qo, ko));
                }
            }
        }
    }
}

#[test]
fn t5_tensor_equals_plain() {
    for (nb, md, bi) in [
        (32usize, 128usize, true),
        (32, 128, false),
        (4, 8, true),
        (2, 3, false),
    ] {
        let buckets = T5Buckets::new(nb, md, bi).unwrap();
        let plain = T5Bias::random(buckets, 3, 11).unwrap();
        let module = T5RelativeBias::from_plain(&plain, &Device::Cpu).unwrap();
        for (tq, tk) in SIZES {
            for (qo, ko) in OFFSETS {
                let b = module.forward(tq, tk, qo, ko).unwrap();
                assert_equals_plain(&b, &plain, (tq, tk), (qo, ko));
            }
        }
    }
}

/// d/d table[b, h] of Σ W ⊙ bias = Σ over pairs in bucket b of W[h, i, j].
#[test]
fn t5_gradient_reaches_the_table() {
    let buckets = T5Buckets::new(8, 16, true).unwrap();
    let vm = VarMap::new();
    let vb = VarBuilder::from_varmap(&vm, DType::F32, &Device::Cpu);
    let module = T5RelativeBias::new(buckets, 2, vb).unwrap();
    let (tq, tk, qo, ko) = (7usize, 40usize, 30u64, 0u64);
    let w = det(2 * tq * tk, 0.3);
    let wt = Tensor::from_vec(
        w.iter().map(|&v| v as f32).collect::<Vec<_>>(),
        (2, tq, tk),
        &Device::Cpu,
    )
    .unwrap();
    let loss = (module.forward(tq, tk, qo, ko).unwrap() * wt)
        .unwrap()
        .sum_all()
        .unwrap();
    let grads = loss.backward().unwrap();
    let g: Vec<Vec<f32>> = grads.get(module.table()).unwrap().to_vec2().unwrap();
    let mut want = vec![vec![0.0f64; 2]; 8];
    for h in 0..2 {
        for i in 0..tq {
            for j in 0..tk {
                let r = (ko + j as u64) as i64 - (qo + i as u64) as i64;
                want[buckets.bucket(r)][h] += w[(h * tq + i) * tk + j];
            }
        }
    }
    let mut nonzero = 0;
    for b in 0..8 {
        for h in 0..2 {
            assert!(
                (g[b][h] as f64 - want[b][h]).abs() < 1e-4,
                "bucket {b} head {h}"
            );
            nonzero += usize::from(want[b][h] != 0.0);
        }
    }
    assert!(nonzero > 4);
}

fn rows(t: &Tensor) -> Vec<Vec<f64>> {
    t.to_dtype(DType::F64).unwrap().to_vec2().unwrap()
}

/// Shaw's efficient tensor path equals the plain (explicit loops) path for
/// every slice of a (B, H, T, d) batch.
#[test]
fn shaw_tensor_equals_plain() {
    let d = 4;
    for k in [0usize, 1, 2, 127, 128] {
        let shaw = Shaw::new(k, d, k as u64).unwrap();
        let module = ShawRelative::from_plain(&shaw, DType::F64, &Device::Cpu).unwrap();
        for (tq, tk) in [(1usize, 1usize), (2, 3), (3, 2), (129, 3), (2, 129)] {
            for (qo, ko) in OFFSETS {
                let q = Tensor::from_vec(det(2 * 2 * tq * d, 0.1), (2, 2, tq, d), &Device::Cpu)
                    .unwrap();
                let kk = Tensor::from_vec(det(2 * 2 * tk * d, 0.9), (2, 2, tk, d), &Device::Cpu)
                    .unwrap();
                let a = Tensor::from_vec(det(2 * 2 * tq * tk, 1.7), (2, 2, tq, tk), &Device::Cpu)
                    .unwrap();
                let logits = module.logits(&q, &kk, qo, ko).unwrap();
                let rel = module.key_logits(&q, tk, qo, ko).unwrap();
                let vals = module.relative_values(&a, qo, ko).unwrap();
                for b in 0..2 {
                    for h in 0..2 {
                        let s = |t: &Tensor| rows(&t.get(b).unwrap().get(h).unwrap());
                        let (qs, ks, as_) = (s(&q), s(&kk), s(&a));
                        let want_logits = shaw.logits(&qs, &ks, qo, ko).unwrap();
                        let want_vals = shaw.values_term(&as_, qo, ko).unwrap();
                        let idx = shaw.index_matrix(tq, tk, qo, ko).unwrap();
                        let (gl, gr, gv) = (s(&logits), s(&rel), s(&vals));
                        for i in 0..tq {
                            for j in 0..tk {
                                assert!((gl[i][j] - want_logits[i][j]).abs() < 1e-12);
                                let qa: f64 = (0..d)
                                    .map(|c| qs[i][c] * shaw.key_table()[idx[i][j]][c])
                                    .sum();
                                assert!((gr[i][j] - qa).abs() < 1e-12);
                            }
                            for c in 0..d {
                                assert!((gv[i][c] - want_vals[i][c]).abs() < 1e-12);
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Gradients to w^K and w^V equal the naive sums over pairs per relative
/// index.
#[test]
fn shaw_gradients_reach_both_tables() {
    let (k, d, tq, tk, qo, ko) = (2usize, 3usize, 5usize, 7usize, 4u64, 0u64);
    let vm = VarMap::new();
    let vb = VarBuilder::from_varmap(&vm, DType::F64, &Device::Cpu);
    let module = ShawRelative::new(k, d, vb).unwrap();
    let q = det(tq * d, 0.2);
    let alpha = det(tq * tk, 0.5);
    let wl = det(tq * tk, 1.1);
    let wv = det(tq * d, 2.3);
    let t = |v: &Vec<f64>, s: (usize, usize)| Tensor::from_vec(v.clone(), s, &Device::Cpu).unwrap();
    let l1 = (module.key_logits(&t(&q, (tq, d)), tk, qo, ko).unwrap() * t(&wl, (tq, tk)))
        .unwrap()
        .sum_all()
        .unwrap();
    let l2 = (module
        .relative_values(&t(&alpha, (tq, tk)), qo, ko)
        .unwrap()
        * t(&wv, (tq, d)))
    .unwrap()
    .sum_all()
    .unwrap();
    let grads = (l1 + l2).unwrap().backward().unwrap();
    let gk = rows(grads.get(module.key_table()).unwrap());
    let gv = rows(grads.get(module.value_table()).unwrap());
    let mut want_k = vec![vec![0.0; d]; 2 * k + 1];
    let mut want_v = vec![vec![0.0; d]; 2 * k + 1];
    for i in 0..tq {
        for j in 0..tk {
            let r = ((ko + j as u64) as i64 - (qo + i as u64) as i64).clamp(-(k as i64), k as i64);
            let r = (r + k as i64) as usize;
            for c in 0..d {
                want_k[r][c] += wl[i * tk + j] * q[i * d + c];
                want_v[r][c] += alpha[i * tk + j] * wv[i * d + c];
            }
        }
    }
    for r in 0..2 * k + 1 {
        for c in 0..d {
            assert!((gk[r][c] - want_k[r][c]).abs() < 1e-12, "w^K[{r}][{c}]");
            assert!((gv[r][c] - want_v[r][c]).abs() < 1e-12, "w^V[{r}][{c}]");
        }
    }
    assert!(gk.iter().flatten().all(|v| *v != 0.0));
}

#[test]
fn bad_input_is_a_typed_error() {
    let vm = VarMap::new();
    let vb = VarBuilder::from_varmap(&vm, DType::F32, &Device::Cpu);
    let buckets = T5Buckets::new(8, 16, true).unwrap();
    assert!(matches!(
        T5RelativeBias::new(buckets, 0, vb.pp("t5")),
        Err(Error::ZeroHeads)
    ));
    assert!(matches!(
        ShawRelative::new(2, 0, vb.pp("shaw0")),
        Err(Error::InvalidDimension { .. })
    ));
    let shaw = ShawRelative::new(2, 4, vb.pp("shaw")).unwrap();
    let q = Tensor::zeros((3, 5), DType::F32, &Device::Cpu).unwrap();
    assert!(matches!(
        shaw.key_logits(&q, 3, 0, 0),
        Err(Error::Shape { .. })
    ));
    let w = Tensor::zeros(3, DType::F32, &Device::Cpu).unwrap();
    assert!(matches!(
        shaw.relative_values(&w, 0, 0),
        Err(Error::Shape { .. })
    ));
    let alibi = Alibi::new(2, AlibiMode::Causal).unwrap();
    assert!(matches!(
        alibi_bias(&alibi, 2, 2, u64::MAX, 0, &Device::Cpu),
        Err(Error::PositionOutOfRange { .. })
    ));
    let t5 = T5RelativeBias::new(buckets, 2, vb.pp("t5b")).unwrap();
    assert!(matches!(
        t5.forward(1, 1, 0, u64::MAX),
        Err(Error::PositionOutOfRange { .. })
    ));
}
