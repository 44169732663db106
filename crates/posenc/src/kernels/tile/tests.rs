//! Tests of the tile kernels: the transposes and products against their
//! element-by-element definitions.

use super::*;

/// The AVX transpose equals the element-by-element one at edge sizes,
/// with leading dimensions wider than the blocks and dirty outputs
/// (only the transposed block may change).
#[test]
fn transpose_matches_scalar() {
    let sizes = [1usize, 2, 3, 7, 8, 9, 15, 16, 17, 64, 127, 128, 129];
    for &rows in &sizes {
        for &cols in &sizes {
            let (lds, ldd) = (cols + 3, rows + 5);
            let src: Vec<f32> = (0..rows * lds).map(|i| i as f32 * 0.5 - 7.0).collect();
            let dirty = vec![f32::NAN; cols * ldd];
            let mut want = dirty.clone();
            let mut got = dirty.clone();
            let t = |dst: &mut Vec<f32>| Transpose {
                rows,
                cols,
                src: Strided::rows(src.as_ptr(), lds),
                dst: dst.as_mut_ptr(),
                ldd,
            };
            unsafe {
                transpose_scalar(t(&mut want));
                transpose(rows, cols, src.as_ptr(), lds, got.as_mut_ptr(), ldd);
            }
            for j in 0..cols {
                for i in 0..rows {
                    assert_eq!(want[j * ldd + i], src[i * lds + j]);
                }
            }
            let same = want
                .iter()
                .zip(&got)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "{rows} x {cols}: the transposes differ");
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("avx") && rows >= 8 && cols >= 8 {
                let mut avx = dirty.clone();
                unsafe { transpose_avx(t(&mut avx)) };
                assert!(
                    want.iter()
                        .zip(&avx)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{rows} x {cols}: AVX transpose differs"
                );
            }
        }
    }
}

#[test]
fn exp_is_accurate() {
    let mut worst = 0f64;
    let mut x = -87.0f32;
    while x < 88.0 {
        let want = (x as f64).exp();
        let got = exp(x) as f64;
        worst = worst.max(((got - want) / want).abs());
        x += 0.013;
    }
    assert!(worst < 3e-7, "worst relative error {worst}");
    assert_eq!(exp(f32::NEG_INFINITY), 0.0);
    assert!(exp(f32::NAN).is_nan());
    assert_eq!(exp(0.0), 1.0);
}

#[test]
fn tanh_is_accurate() {
    let mut worst = 0f64;
    let mut x = -20.0f32;
    while x < 20.0 {
        worst = worst.max((tanh(x) as f64 - (x as f64).tanh()).abs());
        x += 0.0071;
    }
    assert!(worst < 3e-7, "worst absolute error {worst}");
}

#[test]
fn gemm_matches_the_triple_loop() {
    for &(m, n, k) in &TEST_SIZES {
        let (lda, ldb, ldc) = (k + 3, n + 1, n + 2);
        let a: Vec<f32> = (0..m * lda).map(|i| ((i * 7 % 11) as f32) - 5.0).collect();
        let b: Vec<f32> = (0..k * ldb).map(|i| ((i * 5 % 13) as f32) * 0.5).collect();
        for (accumulate, level) in [false, true]
            .into_iter()
            .flat_map(|acc| SimdLevel::available().into_iter().map(move |l| (acc, l)))
        {
            let mut c: Vec<f32> = (0..m * ldc).map(|i| i as f32).collect();
            let c0 = c.clone();
            let g = Gemm::new(m, n, k).a(a.as_ptr(), lda).b(b.as_ptr(), ldb);
            unsafe { gemm(level, g.c(c.as_mut_ptr(), ldc, accumulate)) };
            for i in 0..m {
                for j in 0..ldc {
                    let want = if j < n {
                        let s: f32 = (0..k).map(|p| a[i * lda + p] * b[p * ldb + j]).sum();
                        s + if accumulate { c0[i * ldc + j] } else { 0.0 }
                    } else {
                        c0[i * ldc + j]
                    };
                    assert!(
                        (c[i * ldc + j] - want).abs() < 1e-3,
                        "{level} {m}x{n}x{k} ({i},{j})"
                    );
                }
            }
        }
    }
}

#[test]
fn transposed_a_matches() {
    let (m, n, k) = (6, 19, 5);
    // A stored as its transpose: (k × m) row-major.
    let at: Vec<f32> = (0..k * m).map(|i| (i % 9) as f32 - 4.0).collect();
    let b: Vec<f32> = (0..k * n).map(|i| (i % 4) as f32).collect();
    let mut c = vec![f32::NAN; m * n];
    let g = Gemm::new(m, n, k).a_t(at.as_ptr(), m).b(b.as_ptr(), n);
    unsafe { gemm(SimdLevel::detect(), g.to(c.as_mut_ptr(), n)) };
    for i in 0..m {
        for j in 0..n {
            let want: f32 = (0..k).map(|p| at[p * m + i] * b[p * n + j]).sum();
            assert!((c[i * n + j] - want).abs() < 1e-4);
        }
    }
}

#[test]
fn reductions() {
    let x: Vec<f32> = (0..37).map(|i| (i as f32) - 10.0).collect();
    assert_eq!(sum(&x), x.iter().sum::<f32>());
    assert_eq!(max(&x), 26.0);
    assert_eq!(max(&[]), f32::NEG_INFINITY);
    let y: Vec<f32> = (0..37).map(|i| (i % 3) as f32).collect();
    let want: f32 = x.iter().zip(&y).map(|(a, b)| a * b).sum();
    assert!((dot(&x, &y) - want).abs() < 1e-4);
}

/// `g` added to a C holding `start` (leading dimension `ldc`), whole and
/// trimmed by `limit`, gives the same bits.
fn assert_trimmed_adds_the_same_bits(
    level: SimdLevel,
    g: Gemm,
    start: &[f32],
    ldc: usize,
    limit: impl Fn(usize, usize) -> ([usize; 2], [usize; 2]),
    what: &str,
) {
    let (mut whole, mut cut) = (start.to_vec(), start.to_vec());
    unsafe {
        gemm(level, g.add_to(whole.as_mut_ptr(), ldc));
        gemm_trimmed(level, g.add_to(cut.as_mut_ptr(), ldc), limit);
    }
    assert!(
        whole
            .iter()
            .zip(&cut)
            .all(|(x, y)| x.to_bits() == y.to_bits()),
        "{level} {what}"
    );
}

/// `gemm_trimmed` on a causal product (row `i` of `A` zero from step
/// `i + 1 − shift` on, as the probabilities of a diagonal tile) gives
/// `gemm`'s bits on every entry it computes, at every level: limits by
/// columns (the logits: row groups up to the columns they see, rounded up to
/// 16) leave the other entries of a dirty `C` as they were; limits by steps
/// (`P·V`, from the first step and up to the last a group sees, and `Pᵀ·dO`
/// from the first row that sees a key) give every entry.
#[test]
fn trimmed_gemm_keeps_the_bits_of_the_whole_product() {
    for &(m, n, k, shift) in &[
        (64usize, 128usize, 64usize, 0usize),
        (64, 64, 64, 0),
        (96, 200, 64, 37),
        (13, 29, 7, 5),
        (1, 16, 3, 0),
    ] {
        let seen = |i: usize| (i + 1 + shift).min(n);
        // Logits: Q (m × k) · Kᵀ (k × n); only the columns each row sees
        // are ever read.
        let a: Vec<f32> = (0..m * k)
            .map(|x| ((x * 7 % 11) as f32) * 0.37 - 1.9)
            .collect();
        let b: Vec<f32> = (0..k * n)
            .map(|x| ((x * 5 % 13) as f32) * 0.21 - 1.1)
            .collect();
        // P (m × n), zero past each row's keys, and V (n × k).
        let p: Vec<f32> = (0..m * n)
            .map(|x| {
                let (i, j) = (x / n, x % n);
                if j < seen(i) {
                    ((x * 3 % 17) as f32) * 0.05
                } else {
                    0.0
                }
            })
            .collect();
        for level in SimdLevel::available() {
            let mut whole = vec![f32::NAN; m * n];
            let mut cut = vec![f32::NAN; m * n];
            let g = Gemm::new(m, n, k).a(a.as_ptr(), k).b(b.as_ptr(), n);
            unsafe {
                gemm(level, g.to(whole.as_mut_ptr(), n));
                gemm_trimmed(level, g.to(cut.as_mut_ptr(), n), |_, r1| {
                    ([0, seen(r1 - 1).next_multiple_of(16)], [0, k])
                });
            }
            for i in 0..m {
                for j in 0..n {
                    let (w, c) = (whole[i * n + j], cut[i * n + j]);
                    if j < seen(i) {
                        assert_eq!(w.to_bits(), c.to_bits(), "{level} {m}x{n}: ({i},{j})");
                    } else if j >= seen(i + row_tile(level)).next_multiple_of(16).min(n) {
                        assert!(c.is_nan(), "{level}: ({i},{j}) written");
                    }
                }
            }
            // P·V by steps, added to a C that already holds values.
            let start: Vec<f32> = (0..m * k).map(|x| (x % 5) as f32 - 2.0).collect();
            let g = Gemm::new(m, k, n).a(p.as_ptr(), n).b(b.as_ptr(), k);
            let limit = |_, r1: usize| ([0, k], [0, seen(r1 - 1)]);
            assert_trimmed_adds_the_same_bits(level, g, &start, k, limit, "P·V");
            // Pᵀ·V' (n × k, steps over the m rows) from the first row that
            // sees each group's first key.
            let first = |c: usize| (0..m).find(|&r| seen(r) > c).unwrap_or(m);
            let start: Vec<f32> = (0..n * k).map(|x| (x % 7) as f32 - 3.0).collect();
            let g = Gemm::new(n, k, m).a_t(p.as_ptr(), n).b(a.as_ptr(), k);
            let limit = |c0: usize, _| ([0, k], [first(c0), m]);
            assert_trimmed_adds_the_same_bits(level, g, &start, k, limit, "Pᵀ·V");
        }
    }
}
