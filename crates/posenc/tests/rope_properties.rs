//! Property tests (proptest, fixed seed) for RoPE and xPos.
//!
//! - norms: RoPE multiplies every rotated pair's norm by the attention factor
//!   `a` and leaves the pass-through part alone;
//! - relativity: `⟨R(m)q, R(n)k⟩` depends only on `m − n`, in both layouts
//!   and under every scaling, to `1e-9 · a² |q||k|` (positions < 2^20);
//! - layouts: half-split and interleaved agree up to the permutation
//!   `P(2i) = i, P(2i+1) = i + d_r/2` (pass-through indices fixed);
//! - xPos: `q·k` depends only on `m − n`, to `1e-9 ·` the largest scale
//!   product;
//! - head dimensions at the edges: 2, 4, 126, 128, 130, and rotary parts of
//!   1, 2, 3 pairs in wider heads.

use posenc::rope::{xpos::XPos, PairLayout, Rope, RopeConfig, RopeScaling, YarnParams};
use posenc::RotaryEncoding;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

use crate::common;

fn runner() -> TestRunner {
    common::seeded(Config {
        cases: 64,
        ..Config::default()
    })
}

/// The score `⟨f_q(q, m), f_k(k, n)⟩` under `enc`.
fn score(enc: &dyn RotaryEncoding, q: &[f64], k: &[f64], m: u64, n: u64) -> f64 {
    let (mut q, mut k) = (q.to_vec(), k.to_vec());
    enc.apply_query(&mut q, m).unwrap();
    enc.apply_key(&mut k, n).unwrap();
    dot(&q, &k)
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}
fn norm(a: &[f64]) -> f64 {
    dot(a, a).sqrt()
}

/// Every scaling, valid for a rotary dimension `d` (≥ 4).
fn scalings(d: usize) -> Vec<RopeScaling> {
    vec![
        RopeScaling::Default,
        RopeScaling::Linear { factor: 4.0 },
        RopeScaling::Dynamic {
            factor: 2.0,
            max_position_embeddings: 512,
        },
        RopeScaling::Ntk { alpha: 8.0 },
        RopeScaling::Yarn(YarnParams {
            truncate: false,
            ..YarnParams::new(16.0, 4096)
        }),
        RopeScaling::LongRope {
            short_factor: (0..d / 2).map(|i| 1.0 + i as f64 * 0.1).collect(),
            long_factor: (0..d / 2).map(|i| 1.0 + i as f64).collect(),
            original_max_position_embeddings: 2048,
            factor: 32.0,
            attention_factor: None,
        },
        RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192,
        },
        RopeScaling::Proportional {
            factor: 1.0,
            partial_rotary_factor: 0.5,
        },
    ]
}

fn ropes(head_dim: usize, rotary_dim: usize, seq_len: Option<usize>) -> Vec<Rope> {
    let mut out = Vec::new();
    for layout in [PairLayout::HalfSplit, PairLayout::Interleaved] {
        for s in scalings(rotary_dim) {
            let (rd, hd) = match s {
                RopeScaling::Proportional { .. } => (head_dim, head_dim),
                _ => (rotary_dim, head_dim),
            };
            if matches!(s, RopeScaling::Dynamic { .. } | RopeScaling::Ntk { .. }) && rd <= 2 {
                continue;
            }
            let cfg = RopeConfig::new(10000.0, rd)
                .unwrap()
                .with_layout(layout)
                .with_scaling(s)
                .unwrap()
                .with_head_dim(hd);
            out.push(Rope::at_seq_len(cfg, seq_len).unwrap());
        }
    }
    out
}

const DIMS: &[(usize, usize)] = &[
    (2, 2),
    (4, 4),
    (126, 126),
    (128, 128),
    (130, 130),
    (64, 2),
    (64, 4),
    (64, 6),
    (128, 32),
];

fn vecs(n: usize) -> impl Strategy<Value = Vec<f64>> {
    prop::collection::vec(-3.0f64..3.0, n)
}

#[test]
fn rope_scales_norms_by_attention_factor() {
    for &(hd, rd) in DIMS {
        for rope in ropes(hd, rd, Some(8192)) {
            let a = rope.frequencies().attention_factor;
            let rdim = rope.frequencies().rotary_dim;
            runner()
                .run(&(vecs(hd), 0u64..1 << 20), |(x, p)| {
                    let mut y = x.clone();
                    rope.apply_query(&mut y, p).unwrap();
                    let (rx, ry) = (norm(&x[..rdim]), norm(&y[..rdim]));
                    prop_assert!((ry - a * rx).abs() <= 1e-12 * (1.0 + a * rx));
                    prop_assert_eq!(&y[rdim..], &x[rdim..]);
                    Ok(())
                })
                .unwrap();
        }
    }
}

#[test]
fn rope_scores_depend_only_on_distance() {
    for &(hd, rd) in DIMS {
        for rope in ropes(hd, rd, Some(8192)) {
            let a = rope.frequencies().attention_factor;
            runner()
                .run(
                    &(
                        vecs(hd),
                        vecs(hd),
                        0u64..1 << 20,
                        0u64..1 << 20,
                        0u64..1 << 20,
                    ),
                    |(q, k, m, n, shift)| {
                        let tol = 1e-9 * a * a * norm(&q) * norm(&k) + 1e-12;
                        let s0 = score(&rope, &q, &k, m, n);
                        let s1 = score(&rope, &q, &k, m + shift, n + shift);
                        prop_assert!(
                            (s0 - s1).abs() <= tol,
                            "{} vs {} ({})",
                            s0,
                            s1,
                            rope.name_for_tests()
                        );
                        Ok(())
                    },
                )
                .unwrap();
        }
    }
}

trait NameForTests {
    fn name_for_tests(&self) -> String;
}
impl NameForTests for Rope {
    fn name_for_tests(&self) -> String {
        use posenc::PositionalEncoding;
        format!("{} d={}", self.name(), self.head_dim())
    }
}

/// Half-split pair `i` is `(i, i + d_r/2)`, interleaved pair `i` is
/// `(2i, 2i+1)`: so `interleaved(x)[P(j)] = half_split(x ∘ P)`... precisely,
/// with `P(2i) = i`, `P(2i+1) = i + d_r/2` and `(Px)[j] = x[P(j)]`,
/// `R_interleaved(Px) = P R_half_split(x)`.
#[test]
fn layouts_agree_up_to_a_fixed_permutation() {
    // P over a head of `hd` entries whose first `rd` are rotated
    let permutation = |hd: usize, rd: usize| -> Vec<usize> {
        (0..hd)
            .map(|j| {
                if j >= rd {
                    j
                } else if j % 2 == 0 {
                    j / 2
                } else {
                    j / 2 + rd / 2
                }
            })
            .collect()
    };
    for &(hd, rd) in DIMS {
        let half = ropes(hd, rd, None);
        let n = half.len() / 2;
        for (h, i) in half[..n].iter().zip(&half[n..]) {
            assert_eq!(h.frequencies().layout, PairLayout::HalfSplit);
            assert_eq!(i.frequencies().layout, PairLayout::Interleaved);
            // (proportional: the rotary part may differ from rd)
            let perm = permutation(hd, h.frequencies().rotary_dim);
            runner()
                .run(&(vecs(hd), 0u64..1 << 20), |(x, p)| {
                    let mut y = x.clone();
                    h.apply_query(&mut y, p).unwrap();
                    let mut px: Vec<f64> = perm.iter().map(|&j| x[j]).collect();
                    i.apply_query(&mut px, p).unwrap();
                    for j in 0..hd {
                        prop_assert!((px[j] - y[perm[j]]).abs() <= 1e-12, "j={}", j);
                    }
                    Ok(())
                })
                .unwrap();
        }
    }
}

#[test]
fn xpos_scores_depend_only_on_distance() {
    for hd in [2usize, 4, 126, 128, 130] {
        for layout in [PairLayout::Interleaved, PairLayout::HalfSplit] {
            let x = XPos::new(hd).unwrap().with_layout(layout);
            runner()
                .run(
                    &(vecs(hd), vecs(hd), 0u64..2048, 0u64..2048, 0u64..2048),
                    |(q, k, m, n, shift)| {
                        // largest scale product over pairs: ζ^((m−n)/512) ≤ ζ_min^(−|m−n|/512)
                        let zmin = x.zeta().iter().cloned().fold(f64::INFINITY, f64::min);
                        let big = zmin.powf(-((m as f64 - n as f64).abs()) / 512.0);
                        let tol = 1e-9 * big * norm(&q) * norm(&k) + 1e-12;
                        let s0 = score(&x, &q, &k, m, n);
                        let s1 = score(&x, &q, &k, m + shift, n + shift);
                        prop_assert!((s0 - s1).abs() <= tol, "{} vs {}", s0, s1);
                        Ok(())
                    },
                )
                .unwrap();
        }
    }
}

/// xPos at position 0 is the identity, and a query after its key is damped:
/// each pair's contribution is scaled by ζ_i^((m−n)/512) < 1.
#[test]
fn xpos_decays_with_distance() {
    let x = XPos::new(8).unwrap();
    let z = x.zeta().to_vec();
    // torchscale: (2i + 0.4 d) / (1.4 d)
    for (i, zi) in z.iter().enumerate() {
        assert!((zi - (2.0 * i as f64 + 0.4 * 8.0) / (1.4 * 8.0)).abs() < 1e-15);
    }
    let mut q = vec![1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0];
    let mut k = q.clone();
    x.apply_query(&mut q, 1024).unwrap();
    x.apply_key(&mut k, 0).unwrap();
    // only pair 0 is non-zero: score = ζ_0^(1024/512) cos(1024 θ_0)
    let expected = z[0].powf(2.0) * (1024.0f64).cos();
    assert!((dot(&q, &k) - expected).abs() < 1e-12);
}
