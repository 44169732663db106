//! The rotary kernels: every SIMD level this CPU has against the scalar loop
//! and the f64 reference, on dirty output buffers, at edge sizes; the fast
//! table builder against the exact one; the tile matrix product
//! (`kernels::tile::gemm`, beneath the fused attention) the same way.

use half::{bf16, f16};
use posenc::kernels::rope::{rope_inplace, rope_out, rope_out_uninit, rope_reference, RopeCall};
use posenc::kernels::table::{TableSpec, Tables};
use posenc::kernels::{Element, HeadLayout, RopeGeometry, RowMap, SimdLevel};
use posenc::rope::{PairLayout, RopeFrequencies};
use proptest::prelude::*;
use proptest::test_runner::Config;

use crate::common;
use common::Rng;

/// Largest allowed |fast − reference| for an output `r` whose products
/// `x·cos`, `x·sin` are at most `mag` in size.
fn tol<T: Element>(r: f32, mag: f32) -> f32 {
    // f32 arithmetic (FMA or not) against f64 rounded once: 4 units of
    // 2^-24 of the largest product.
    let f32_err = 4.0 * 2f32.powi(-24) * mag;
    match T::NAME {
        "f32" => f32_err,
        // plus one ulp of the f16 / bf16 output.
        "f16" => r.abs().max(6.1e-5) * 2f32.powi(-10) + f32_err,
        _ => r.abs().max(1e-30) * 2f32.powi(-7) + f32_err,
    }
}

/// xPos tables (query ones, or the key ones with `xpos_key`), so that
/// magnitudes other than 1 are exercised too.
fn tables(rd: usize, rows: usize, xpos_key: bool) -> Tables {
    let f = RopeFrequencies::plain(10000.0, rd, PairLayout::HalfSplit).unwrap();
    let spec = TableSpec {
        inv_freq: &f.inv_freq,
        attention_factor: 1.0,
        xpos_scale_base: Some(64.0),
    };
    let mut t = Tables::contiguous(&spec, 0, rows);
    if xpos_key {
        // exercise non-unit magnitudes as well
        std::mem::swap(&mut t.cos, &mut t.cos_k);
        std::mem::swap(&mut t.sin, &mut t.sin_k);
    }
    t
}

/// Every level of `levels` against the reference and the scalar kernel, in
/// place and out of place, on a `T` buffer of geometry `g` (rows by `ids`
/// or an offset; the inverse rotation with `inverse`).
fn check_case<T: Element>(
    rng: &mut Rng,
    g: RopeGeometry,
    ids: bool,
    inverse: bool,
    levels: &[SimdLevel],
) {
    let rd = g.rotary_dim;
    let rows_avail = g.seq_len + 5;
    let t = tables(rd, rows_avail, rng.below(2) == 0);
    let src: Vec<T> = (0..g.len()).map(|_| T::from_f32(rng.next_f32())).collect();
    let id_vec: Vec<usize> = (0..g.batch * g.seq_len)
        .map(|_| rng.below(rows_avail as u64) as usize)
        .collect();
    let rows = if ids {
        RowMap::Ids(&id_vec)
    } else {
        RowMap::Offset(5)
    };
    let call = RopeCall {
        g: &g,
        tables: t.query(),
        rows,
        inverse,
    };
    let table_max = t.cos.iter().chain(&t.sin).fold(0f32, |m, v| m.max(v.abs()));
    let mag = 2.0 * 2.0 * table_max;
    let mut want = vec![T::from_f32(f32::NAN); g.len()];
    rope_reference(&src, &mut want, call).unwrap();
    let mut scalar = vec![T::from_f32(f32::NAN); g.len()];
    rope_out(SimdLevel::Scalar, &src, &mut scalar, call).unwrap();
    for &level in levels {
        // dirty output: NaN everywhere, then 7.0 for the second try.
        for dirt in [f32::NAN, 7.0] {
            let mut got = vec![T::from_f32(dirt); g.len()];
            rope_out(level, &src, &mut got, call).unwrap();
            for (j, ((&a, &w), &s)) in got.iter().zip(&want).zip(&scalar).enumerate() {
                let (a, w, s) = (a.to_f32(), w.to_f32(), s.to_f32());
                assert!(
                    (a - w).abs() <= tol::<T>(w, mag),
                    "{} {level} {g:?} ids={ids} inv={inverse} [{j}]: {a} vs reference {w}",
                    T::NAME
                );
                assert!(
                    (a - s).abs() <= 2.0 * tol::<T>(s, mag),
                    "{} {level} vs scalar [{j}]: {a} vs {s}",
                    T::NAME
                );
            }
            // in place gives bit for bit what out of place gives
            let mut inplace = src.clone();
            rope_inplace(level, &mut inplace, call).unwrap();
            assert!(inplace
                .iter()
                .zip(&got)
                .all(|(a, b)| a.to_f32().to_bits() == b.to_f32().to_bits()));
        }
        let mut uninit = vec![std::mem::MaybeUninit::<T>::uninit(); g.len()];
        rope_out_uninit(level, &src, &mut uninit, call).unwrap();
        let mut direct = vec![T::from_f32(0.0); g.len()];
        rope_out(level, &src, &mut direct, call).unwrap();
        for (u, d) in uninit.iter().zip(&direct) {
            // SAFETY: rope_out_uninit returned Ok, so every entry is written.
            let u = unsafe { u.assume_init() };
            assert_eq!(u.to_f32().to_bits(), d.to_f32().to_bits());
        }
    }
}

fn all_types(
    rng: &mut Rng,
    dims: [usize; 4],
    layout: HeadLayout,
    pairs: PairLayout,
    rd: usize,
    ids: bool,
    inverse: bool,
) {
    let g = RopeGeometry::from_dims(dims, layout, rd, pairs);
    let levels = SimdLevel::available();
    check_case::<f32>(rng, g, ids, inverse, &levels);
    check_case::<f16>(rng, g, ids, inverse, &levels);
    check_case::<bf16>(rng, g, ids, inverse, &levels);
}

const EDGES: [usize; 6] = [1, 2, 3, 127, 128, 129];

#[test]
fn every_level_matches_reference_at_edge_sizes() {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    eprintln!("levels: {:?}", SimdLevel::available());
    for layout in [HeadLayout::Bhtd, HeadLayout::Bthd] {
        for pairs in [PairLayout::HalfSplit, PairLayout::Interleaved] {
            for &t in &EDGES {
                all_types(
                    &mut rng,
                    [2, 3, t, 64],
                    layout,
                    pairs,
                    64,
                    t % 2 == 0,
                    false,
                );
            }
            for &h in &EDGES {
                all_types(
                    &mut rng,
                    [1, h, 2, 128],
                    layout,
                    pairs,
                    128,
                    h % 2 == 1,
                    h == 3,
                );
            }
            // head dims around every vector width, full and partial rotary
            for d in [2usize, 4, 6, 8, 14, 16, 18, 30, 32, 34, 62, 126, 128, 130] {
                all_types(&mut rng, [2, 2, 3, d], layout, pairs, d, d % 4 == 0, false);
                let rd = (d / 2) & !1;
                if rd > 0 {
                    all_types(&mut rng, [2, 2, 3, d], layout, pairs, rd, true, true);
                }
            }
            all_types(&mut rng, [3, 1, 129, 2], layout, pairs, 2, false, false);
            all_types(&mut rng, [1, 129, 1, 128], layout, pairs, 64, false, true);
        }
    }
}

#[test]
fn random_geometries_property() {
    let mut runner = common::seeded(Config {
        cases: 48,
        ..Config::default()
    });
    let strat = (
        1usize..4,
        prop::sample::select(EDGES.to_vec()),
        prop::sample::select(EDGES.to_vec()),
        1usize..40,
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        any::<u64>(),
    );
    runner
        .run(&strat, |(b, h, t, half_d, bthd, inter, inverse, seed)| {
            // keep the product small: at most one of H, T is large
            let (h, t) = if h > 3 && t > 3 { (h, 2) } else { (h, t) };
            let d = 2 * half_d;
            let layout = if bthd {
                HeadLayout::Bthd
            } else {
                HeadLayout::Bhtd
            };
            let pairs = if inter {
                PairLayout::Interleaved
            } else {
                PairLayout::HalfSplit
            };
            let mut rng = Rng(seed | 1);
            let rd = 2 * (1 + rng.below(half_d as u64) as usize);
            all_types(
                &mut rng,
                [b, h, t, d],
                layout,
                pairs,
                rd,
                seed % 3 == 0,
                inverse,
            );
            Ok(())
        })
        .unwrap();
}

#[test]
fn inverse_undoes_forward() {
    let mut rng = Rng(42);
    let g = RopeGeometry::from_dims([2, 4, 9, 64], HeadLayout::Bhtd, 64, PairLayout::HalfSplit);
    let f = RopeFrequencies::plain(10000.0, 64, PairLayout::HalfSplit).unwrap();
    let spec = TableSpec {
        inv_freq: &f.inv_freq,
        attention_factor: 1.0,
        xpos_scale_base: None,
    };
    let t = Tables::contiguous(&spec, 0, 20);
    let src: Vec<f32> = (0..g.len()).map(|_| rng.next_f32()).collect();
    for level in SimdLevel::available() {
        let mut x = src.clone();
        let call = |inverse| RopeCall {
            g: &g,
            tables: t.query(),
            rows: RowMap::Offset(11),
            inverse,
        };
        rope_inplace(level, &mut x, call(false)).unwrap();
        assert!(x.iter().zip(&src).any(|(a, b)| (a - b).abs() > 1e-3));
        rope_inplace(level, &mut x, call(true)).unwrap();
        for (a, b) in x.iter().zip(&src) {
            assert!(
                (a - b).abs() <= 1e-6 * (1.0 + b.abs()),
                "{level}: {a} vs {b}"
            );
        }
    }
}

#[test]
fn bf16_and_f16_rounding_match_half_crate_on_specials() {
    // With cos = c, sin = 0 and x_b = 0 the first half of each head is x_a·c:
    // c = 1 must reproduce every input bit for bit (NaN and infinities
    // included); c = 1 + 2^-9 and 0.999 test round-to-nearest-even against
    // half's conversion.
    let specials = [
        0.0f32,
        -0.0,
        1.0,
        -1.5,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        65504.0,
        1e-8,
        3.0e38,
        1.0039062,
        1.0117188,
    ];
    let n = 32;
    let g = RopeGeometry::from_dims([1, 1, 1, n], HeadLayout::Bhtd, n, PairLayout::HalfSplit);
    for factor in [1.0f32, 1.0 + 2f32.powi(-9), 0.999] {
        let cos = vec![factor; n / 2];
        let sin = vec![0.0f32; n / 2];
        let tabs = posenc::kernels::RopeTables {
            cos: &cos,
            sin: &sin,
            n_freq: n / 2,
        };
        let src32: Vec<f32> = (0..n)
            .map(|i| {
                if i < n / 2 {
                    specials[i % specials.len()]
                } else {
                    0.0
                }
            })
            .collect();
        for level in SimdLevel::available() {
            let gt = (&g, tabs);
            rounds_like_half(level, gt, &src32, factor, bf16::from_f32, bf16::to_bits);
            rounds_like_half(level, gt, &src32, factor, f16::from_f32, f16::to_bits);
        }
    }
}

/// `src32` converted by `from` (half's rounding) through `rope_out` at
/// `level` with cos = `factor`, sin = 0: each output of the first half is,
/// bit for bit (or both NaN), `from(s · factor)`.
fn rounds_like_half<T: Element + std::fmt::Display>(
    level: SimdLevel,
    (g, tables): (&RopeGeometry, posenc::kernels::RopeTables),
    src32: &[f32],
    factor: f32,
    from: fn(f32) -> T,
    bits: fn(T) -> u16,
) {
    let n = src32.len();
    let src: Vec<T> = src32.iter().map(|&v| from(v)).collect();
    let mut out = vec![from(0.0); n];
    let call = RopeCall {
        g,
        tables,
        rows: RowMap::Offset(0),
        inverse: false,
    };
    rope_out(level, &src, &mut out, call).unwrap();
    for (&o, &s) in out.iter().zip(&src).take(n / 2) {
        let want = from(s.to_f32() * factor);
        assert!(
            bits(o) == bits(want) || (o.to_f32().is_nan() && want.to_f32().is_nan()),
            "{} {level}: {s} × {factor} gave {o}, half gives {want}",
            T::NAME
        );
    }
}

#[test]
fn kernel_errors_are_typed() {
    let t = tables(8, 4, false);
    let g = RopeGeometry::from_dims([1, 1, 4, 8], HeadLayout::Bhtd, 8, PairLayout::HalfSplit);
    let src = vec![0.0f32; g.len()];
    let mut dst = vec![0.0f32; g.len()];
    let mut run = |src: &[f32], rows: RowMap| {
        let call = RopeCall {
            g: &g,
            tables: t.query(),
            rows,
            inverse: false,
        };
        rope_out(SimdLevel::Scalar, src, &mut dst, call)
    };
    // row past the table
    let e = run(&src, RowMap::Offset(1));
    assert!(
        matches!(e, Err(posenc::Error::PositionOutOfRange { .. })),
        "{e:?}"
    );
    let ids = [0usize, 1, 2, 4];
    let e = run(&src, RowMap::Ids(&ids));
    assert!(
        matches!(
            e,
            Err(posenc::Error::PositionOutOfRange { position: 4, .. })
        ),
        "{e:?}"
    );
    let e = run(&src, RowMap::Ids(&ids[..3]));
    assert!(matches!(e, Err(posenc::Error::Shape { .. })), "{e:?}");
    // wrong buffer length
    let e = run(&src[1..], RowMap::Offset(0));
    assert!(matches!(e, Err(posenc::Error::Shape { .. })), "{e:?}");
    // odd head dim, rotary_dim > head_dim, zero T
    for (dims, rd) in [([1, 1, 4, 7], 6), ([1, 1, 4, 6], 8), ([1, 1, 0, 8], 8)] {
        let g = RopeGeometry::from_dims(dims, HeadLayout::Bhtd, rd, PairLayout::HalfSplit);
        let call = RopeCall {
            g: &g,
            tables: t.query(),
            rows: RowMap::Offset(0),
            inverse: false,
        };
        let e = rope_inplace::<f32>(SimdLevel::Scalar, &mut [], call);
        assert!(
            matches!(e, Err(posenc::Error::InvalidDimension { .. })),
            "{e:?}"
        );
    }
}

#[test]
fn fast_table_matches_exact_f64_up_to_ten_million() {
    for xpos in [None, Some(512.0)] {
        let f = RopeFrequencies::plain(500000.0, 128, PairLayout::HalfSplit).unwrap();
        let spec = TableSpec {
            inv_freq: &f.inv_freq,
            attention_factor: 1.07,
            xpos_scale_base: xpos,
        };
        // windows of contiguous positions up to 10^7 (xPos overflows f32
        // past ~3·10^4, so it is tested at small positions only)
        let starts: &[u64] = if xpos.is_some() {
            &[0, 777, 20_000]
        } else {
            &[0, 65_536 - 100, 1_000_003, 9_999_000]
        };
        for &start in starts {
            let n = 1000;
            let fast = Tables::contiguous(&spec, start, n);
            let positions: Vec<u64> = (start..start + n as u64).collect();
            let exact = Tables::exact(&spec, &positions);
            assert_eq!(fast.rows, exact.rows);
            let pairs = [
                (&fast.cos, &exact.cos),
                (&fast.sin, &exact.sin),
                (&fast.cos_k, &exact.cos_k),
                (&fast.sin_k, &exact.sin_k),
            ];
            for (a, b) in pairs {
                assert_eq!(a.len(), b.len());
                for (j, (x, y)) in a.iter().zip(b.iter()).enumerate() {
                    let scale = y.abs().max(1.0);
                    assert!(
                        (x - y).abs() <= 2e-7 * scale,
                        "xpos={xpos:?} start={start} [{j}]: fast {x} exact {y}"
                    );
                }
            }
        }
    }
    // and the exact table is the f64 formula of RopeFrequencies
    let f = RopeFrequencies::plain(10000.0, 16, PairLayout::HalfSplit).unwrap();
    let spec = TableSpec {
        inv_freq: &f.inv_freq,
        attention_factor: 1.0,
        xpos_scale_base: None,
    };
    let pos = [0u64, 1, 5000, 10_000_000];
    let exact = Tables::exact(&spec, &pos);
    let (c, s) = f.cos_sin_table(&pos);
    assert_eq!(exact.cos, c);
    assert_eq!(exact.sin, s);
}

#[test]
fn extended_table_equals_built_at_once() {
    let f = RopeFrequencies::plain(10000.0, 64, PairLayout::Interleaved).unwrap();
    let spec = TableSpec {
        inv_freq: &f.inv_freq,
        attention_factor: 1.0,
        xpos_scale_base: Some(256.0),
    };
    let small = Tables::contiguous(&spec, 0, 100);
    let grown = small.extended(&spec, 0, 5000);
    let positions: Vec<u64> = (0..5000).collect();
    let exact = Tables::exact(&spec, &positions);
    assert_eq!(grown.rows, 5000);
    assert_eq!(&grown.cos[..small.cos.len()], &small.cos[..]);
    for (x, y) in grown.cos.iter().zip(&exact.cos) {
        assert!((x - y).abs() <= 2e-7 * y.abs().max(1.0));
    }
    for (x, y) in grown.sin_k.iter().zip(&exact.sin_k) {
        assert!((x - y).abs() <= 2e-7 * y.abs().max(1.0));
    }
}

/// `C (+)= A·B` of the tile kernels at every level this CPU has, against an
/// `f64` triple loop, for every combination of the edge sizes (1, 2, 3,
/// 127, 128, 129: across the 8-, 16- and 32-column panels, the 4- and 8-row
/// blocks and the masked tails), `A` row-major and transposed, overwriting
/// a dirty `C` and accumulating into it; columns past `n` (the leading
/// dimension's padding) must keep their dirt. Every level computes each
/// entry as the same chain of fused multiply-adds, so all of them must
/// give the same bits as the portable panels.
#[test]
fn tile_gemm_every_level_matches_reference_at_edge_sizes() {
    use posenc::kernels::tile::{gemm, Gemm};
    let levels = SimdLevel::available();
    eprintln!("levels: {levels:?}");
    let mut rng = Rng(0x2545_F491_4F6C_DD1D);
    for &m in &EDGES {
        for &n in &EDGES {
            for &k in &EDGES {
                let ldc = n + 3;
                let ldb = n + 1;
                let a: Vec<f32> = (0..m * k + 7).map(|_| rng.next_f32()).collect();
                let b: Vec<f32> = (0..k * ldb).map(|_| rng.next_f32()).collect();
                let c0: Vec<f32> = (0..m * ldc).map(|_| rng.next_f32()).collect();
                // (row stride, column stride) of A: row-major (lda = k + 2
                // would overrun for m = 1, so k), and transposed (k × m).
                for (a_rs, a_cs) in [(k, 1), (1, m)] {
                    for accumulate in [false, true] {
                        let mut want = vec![(0f64, 0f64); m * n];
                        for i in 0..m {
                            for j in 0..n {
                                let (mut sum, mut mag) = (0f64, 0f64);
                                for p in 0..k {
                                    let x = a[i * a_rs + p * a_cs] as f64 * b[p * ldb + j] as f64;
                                    sum += x;
                                    mag += x.abs();
                                }
                                if accumulate {
                                    sum += c0[i * ldc + j] as f64;
                                    mag += (c0[i * ldc + j] as f64).abs();
                                }
                                want[i * n + j] = (sum, mag);
                            }
                        }
                        let g = Gemm::new(m, n, k)
                            .a_strided(a.as_ptr(), a_rs, a_cs)
                            .b(b.as_ptr(), ldb);
                        let mut first: Option<Vec<f32>> = None;
                        for &level in &levels {
                            for dirt in [f32::NAN, 1e30] {
                                let mut c: Vec<f32> = if accumulate {
                                    c0.clone()
                                } else {
                                    vec![dirt; m * ldc]
                                };
                                // SAFETY: A holds (m-1)·a_rs + (k-1)·a_cs + 1
                                // ≤ m·k entries, B k rows of ldb ≥ n, C m rows
                                // of ldc ≥ n; `level` is one this CPU has.
                                unsafe { gemm(level, g.c(c.as_mut_ptr(), ldc, accumulate)) };
                                for i in 0..m {
                                    for j in 0..ldc {
                                        let got = c[i * ldc + j];
                                        let base = if accumulate { c0[i * ldc + j] } else { dirt };
                                        if j >= n {
                                            assert!(
                                                got.to_bits() == base.to_bits(),
                                                "{level} {m}x{n}x{k}: padding ({i},{j}) written"
                                            );
                                            continue;
                                        }
                                        let (want, mag) = want[i * n + j];
                                        assert!(
                                            (got as f64 - want).abs() <= 1e-6 * mag + 1e-30,
                                            "{level} {m}x{n}x{k} A strides ({a_rs},{a_cs}) \
                                             accumulate {accumulate} ({i},{j}): {got} vs {want}"
                                        );
                                    }
                                }
                                match &first {
                                    None => first = Some(c),
                                    Some(f) => assert!(
                                        f.iter()
                                            .zip(&c)
                                            .enumerate()
                                            .all(|(x, (p, q))| x % ldc >= n
                                                || p.to_bits() == q.to_bits()),
                                        "{level} {m}x{n}x{k}: not the bits of {}",
                                        levels[0]
                                    ),
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// `POSENC_SIMD` names: every level parses (any ASCII case), anything else
/// is a typed error that names the bad value.
#[test]
fn simd_level_names_parse() {
    for level in [
        SimdLevel::Scalar,
        SimdLevel::Avx2,
        SimdLevel::Avx512,
        SimdLevel::Neon,
    ] {
        assert_eq!(SimdLevel::parse(level.as_str()).unwrap(), level);
        assert_eq!(
            SimdLevel::parse(&level.as_str().to_ascii_uppercase()).unwrap(),
            level
        );
    }
    let e = SimdLevel::parse("avx1024").unwrap_err().to_string();
    assert!(e.contains("avx1024") && e.contains("POSENC_SIMD"), "{e}");
    assert!(SimdLevel::available().contains(&SimdLevel::best()));
    assert!(SimdLevel::detect().is_supported());
}
