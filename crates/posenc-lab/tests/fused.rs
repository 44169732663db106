//! The lab's fused ops against their composed references (values and
//! gradients), and whole training runs: fused and composed give the same
//! losses, and the fused run does not depend on the thread count.

use crate::common;

use candle_core::{Device, Tensor, Var};
use posenc::analysis::SplitMix64;
use posenc_lab::config::{Mode, PeConfig};
use posenc_lab::ops;
use posenc_lab::optim::AdamW;
use posenc_lab::tasks::{Task, TaskKind, IGNORE};
use posenc_lab::train::{batch_seed, Lab};

const DEV: Device = Device::Cpu;

fn data(n: usize, seed: u64, scale: f64) -> Vec<f32> {
    let mut r = SplitMix64::new(seed);
    (0..n).map(|_| (r.normal() * scale) as f32).collect()
}

fn var(shape: &[usize], seed: u64, scale: f64) -> Var {
    let n = shape.iter().product();
    Var::from_tensor(&Tensor::from_vec(data(n, seed, scale), shape, &DEV).unwrap()).unwrap()
}

fn vals(t: &Tensor) -> Vec<f32> {
    t.flatten_all().unwrap().to_vec1::<f32>().unwrap()
}

/// `max |a − b| / max(|b|, floor)`.
fn rel(a: &Tensor, b: &Tensor, floor: f32) -> f32 {
    let (a, b) = (vals(a), vals(b));
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(floor, |m, v| m.max(v.abs()));
    a.iter()
        .zip(&b)
        .map(|(x, y)| {
            assert!(x.is_finite(), "non-finite {x}");
            (x - y).abs() / scale
        })
        .fold(0.0, f32::max)
}

/// Runs `f` fused and composed on the same variables; compares the outputs
/// and the gradients of a random linear functional of them.
fn compare(vars: &[&Var], tol: f32, what: &str, f: impl Fn(bool) -> Tensor) {
    let a = f(true);
    let b = f(false);
    let e = rel(&a, &b, 1e-3);
    assert!(e < tol, "{what}: outputs differ by {e}");
    let w = Tensor::from_vec(data(a.elem_count(), 99, 1.0), a.shape(), &DEV).unwrap();
    let ga = (a * &w).unwrap().sum_all().unwrap().backward().unwrap();
    let gb = (b * &w).unwrap().sum_all().unwrap().backward().unwrap();
    for (i, v) in vars.iter().enumerate() {
        let e = rel(ga.get(v).unwrap(), gb.get(v).unwrap(), 1e-2);
        assert!(
            e < tol * 5.0,
            "{what}: gradient of input {i} differs by {e}"
        );
    }
}

/// Asserts that two computations of the same function give the same bits:
/// values, and the gradients of a random linear functional of them with
/// respect to every variable.
fn same_bits(one: Tensor, other: Tensor, vars: &[&Var], seed: u64, what: &str) {
    assert_eq!(vals(&one), vals(&other), "{what}: values");
    let w = Tensor::from_vec(data(one.elem_count(), seed, 1.0), one.shape(), &DEV).unwrap();
    let g1 = (one * &w).unwrap().sum_all().unwrap().backward().unwrap();
    let g2 = (other * &w).unwrap().sum_all().unwrap().backward().unwrap();
    for (i, v) in vars.iter().enumerate() {
        assert_eq!(
            vals(g1.get(v).unwrap()),
            vals(g2.get(v).unwrap()),
            "{what}: gradient of input {i}"
        );
    }
}

const SIZES: [usize; 6] = [1, 2, 3, 127, 128, 129];

/// `f(n, d_in, d_out)` at each size of [`SIZES`] and each pair of widths the
/// fused layers are checked at.
fn at_widths(mut f: impl FnMut(usize, usize, usize)) {
    for &n in &SIZES {
        for (d_in, d_out) in [(1, 1), (3, 5), (32, 129), (129, 7)] {
            f(n, d_in, d_out);
        }
    }
}

/// A linear layer's weight `(d_out, d_in)` and bias `(d_out,)`, seeds `seed`
/// and `seed + 1`, scale 0.5.
fn linear_params(d_in: usize, d_out: usize, seed: u64) -> (Var, Var) {
    (var(&[d_out, d_in], seed, 0.5), var(&[d_out], seed + 1, 0.5))
}

/// A LayerNorm's input `(2, n, d)` (seed `seed`) and its weight and bias
/// (seeds `seed + 1`, `seed + 2`, scale 0.5).
fn ln_inputs(n: usize, d: usize, seed: u64) -> (Var, Var, Var) {
    let (g, be) = (var(&[d], seed + 1, 0.5), var(&[d], seed + 2, 0.5));
    (var(&[2, n, d], seed, 1.0), g, be)
}

/// An input `(2, 3, 4)`, a `(4,)` vector, and a `(5, 3)` weight with a `(5,)`
/// bias that do not fit it.
fn misfits() -> (Var, Var, Var, Var) {
    let x = var(&[2, 3, 4], 1, 1.0);
    (
        x,
        var(&[4], 2, 1.0),
        var(&[5, 3], 3, 1.0),
        var(&[5], 4, 1.0),
    )
}

/// The fused linear layer at every SIMD level this CPU has (posenc's
/// AVX-512 tiles, the gemm crate below) against candle-nn's, across the
/// tiles' panel widths and the blocked product's block sizes.
#[test]
fn linear_matches_candle_nn() {
    for level in posenc::kernels::SimdLevel::available() {
        for &n in &SIZES {
            for (d_in, d_out) in [(1, 1), (3, 5), (32, 96), (129, 7), (8, 129), (300, 33)] {
                let x = var(&[2, n, d_in], 1, 1.0);
                let w = var(&[d_out, d_in], 2, 0.3);
                let b = var(&[d_out], 3, 0.3);
                let lin = |b: Option<&Var>, fused: bool| {
                    let b = b.map(|b| b.as_tensor());
                    if fused {
                        ops::linear_at(&x, &w, b, level).unwrap()
                    } else {
                        ops::linear(&x, &w, b, false).unwrap()
                    }
                };
                compare(
                    &[&x, &w, &b],
                    1e-5,
                    &format!("{level} linear {n}×{d_in}→{d_out}"),
                    |fused| lin(Some(&b), fused),
                );
                compare(
                    &[&x, &w],
                    1e-5,
                    &format!("{level} linear without bias {n}×{d_in}→{d_out}"),
                    |fused| lin(None, fused),
                );
            }
        }
    }
}

#[test]
fn layer_norm_matches_the_composed_ops() {
    for &n in &SIZES {
        for d in [1, 2, 3, 8, 32, 129] {
            let x = var(&[n, d], 4, 2.0);
            let w = var(&[d], 5, 1.0);
            let b = var(&[d], 6, 1.0);
            // d = 1: x̂ is 0 and the input gradient vanishes; compare anyway.
            compare(
                &[&x, &w, &b],
                2e-5,
                &format!("layer norm {n}×{d}"),
                |fused| ops::layer_norm(&x, &w, &b, 1e-5, fused).unwrap(),
            );
        }
    }
}

/// RMSNorm (the pretrained decoders' norm, fused for posenc-tune) against
/// the composed ops, at the edge sizes and one size large enough for the
/// row-parallel path.
#[test]
fn rms_norm_matches_the_composed_ops() {
    for (n, d) in SIZES
        .iter()
        .flat_map(|&n| [1, 2, 3, 8, 32, 129].map(|d| (n, d)))
        .chain([(300, 576)])
    {
        let x = var(&[n, d], 14, 2.0);
        let w = var(&[d], 15, 1.0);
        compare(&[&x, &w], 2e-5, &format!("rms norm {n}×{d}"), |fused| {
            ops::rms_norm(&x, &w, 1e-5, fused).unwrap()
        });
    }
}

/// SwiGLU's gate `silu(g) ⊙ u` against candle's `silu` and a product.
#[test]
fn swiglu_matches_candle() {
    for (n, d) in SIZES.iter().map(|&n| (n, 37)).chain([(300, 1536)]) {
        let g = var(&[n, d], 16, 4.0);
        let u = var(&[n, d], 17, 2.0);
        compare(&[&g, &u], 2e-6, &format!("swiglu {n}×{d}"), |fused| {
            ops::swiglu(&g, &u, fused).unwrap()
        });
    }
    let (a, b) = (var(&[2, 3], 1, 1.0), var(&[3, 2], 2, 1.0));
    assert!(ops::swiglu(&a, &b, true).is_err());
}

#[test]
fn gelu_matches_candle() {
    for &n in &SIZES {
        let x = var(&[n, 37], 7, 3.0);
        compare(&[&x], 2e-6, &format!("gelu {n}"), |fused| {
            ops::gelu(&x, fused).unwrap()
        });
    }
}

/// The fused linear + GELU against candle-nn's linear then candle's gelu,
/// and bit for bit against the fused linear then the fused GELU (the
/// model's path before the two were one op).
#[test]
fn linear_gelu_matches_linear_then_gelu() {
    at_widths(|n, d_in, d_out| {
        let x = var(&[2, n, d_in], 11, 1.0);
        let (w, b) = linear_params(d_in, d_out, 12);
        for bias in [Some(&b), None] {
            let bt = bias.map(|b| b.as_tensor());
            let what = format!("linear+gelu {n}×{d_in}→{d_out}, bias {}", bias.is_some());
            let mut vars = vec![&x, &w];
            vars.extend(bias);
            compare(&vars, 1e-5, &what, |fused| {
                ops::linear_gelu(&x, &w, bt, fused).unwrap()
            });
            let one = ops::linear_gelu(&x, &w, bt, true).unwrap();
            let two = ops::gelu(&ops::linear(&x, &w, bt, true).unwrap(), true).unwrap();
            same_bits(one, two, &vars, 98, &what);
        }
    });
}

/// A linear layer and a residual addition in one op: against its reference
/// (candle-nn's `Linear`) within a tolerance, and bit for bit against the
/// fused linear layer then the addition.
#[test]
fn linear_residual_matches_linear_then_add() {
    at_widths(|n, d_in, d_out| {
        let x = var(&[2, n, d_in], 31, 1.0);
        let (w, b) = linear_params(d_in, d_out, 32);
        let r = var(&[2, n, d_out], 34, 1.0);
        let vars = [&x, &w, &b, &r];
        let what = format!("linear+residual {n}×{d_in}→{d_out}");
        compare(&vars, 1e-5, &what, |fused| {
            ops::linear_residual(&x, &w, &b, &r, fused).unwrap()
        });
        let one = ops::linear_residual(&x, &w, &b, &r, true).unwrap();
        let two = (r.as_tensor() + ops::linear(&x, &w, Some(&b), true).unwrap()).unwrap();
        same_bits(one, two, &vars, 96, &what);
    });
    // A residual of another shape is refused, fused or not.
    let x = var(&[2, 3, 4], 1, 1.0);
    let w = var(&[5, 4], 2, 1.0);
    let b = var(&[5], 3, 1.0);
    let r = var(&[2, 3, 4], 4, 1.0);
    for fused in [true, false] {
        assert!(ops::linear_residual(&x, &w, &b, &r, fused).is_err());
    }
}

/// LayerNorm and a linear layer in one op: against its reference (candle's
/// ops) within a tolerance, and bit for bit against the fused LayerNorm then
/// the fused linear layer (sizes past the AVX-512 tiles' limit take the
/// `gemm` crate's product with the bias added after it).
#[test]
fn ln_linear_matches_layer_norm_then_linear() {
    at_widths(|n, d, d_out| {
        let (x, g, be) = ln_inputs(n, d, 41);
        let (w, b) = linear_params(d, d_out, 44);
        let vars = [&x, &g, &be, &w, &b];
        let what = format!("ln+linear {n}×{d}→{d_out}");
        let f = |fused: bool| ops::ln_linear(&x, &g, &be, 1e-5, (&w, &b), fused).unwrap();
        compare(&vars, 1e-4, &what, f);
        let two = {
            let ln = ops::layer_norm(&x, &g, &be, 1e-5, true).unwrap();
            ops::linear(&ln, &w, Some(&b), true).unwrap()
        };
        same_bits(f(true), two, &vars, 98, &what);
    });
    // Parameters of the wrong shapes are refused, fused or not.
    let (x, v4, w, b5) = misfits();
    for fused in [true, false] {
        assert!(ops::ln_linear(&x, &v4, &v4, 1e-5, (&w, &b5), fused).is_err());
    }
}

/// The MLP half of a block with its residual in one op: against its
/// reference (candle's ops) within a tolerance, and bit for bit against the
/// four fused ops it replaces (LayerNorm, linear + GELU, linear, addition).
#[test]
fn mlp_residual_matches_the_four_ops() {
    at_widths(|n, d, d_ff| {
        let (x, g, be) = ln_inputs(n, d, 21);
        let (w1, b1) = linear_params(d, d_ff, 24);
        let (w2, b2) = linear_params(d_ff, d, 26);
        let vars = [&x, &g, &be, &w1, &b1, &w2, &b2];
        let what = format!("mlp {n}×{d}, d_ff {d_ff}");
        let mlp = |fused: bool| {
            ops::mlp_residual(&x, &g, &be, 1e-5, (&w1, &b1), (&w2, &b2), fused).unwrap()
        };
        compare(&vars, 1e-4, &what, mlp);
        let one = mlp(true);
        let four = {
            let ln = ops::layer_norm(&x, &g, &be, 1e-5, true).unwrap();
            let h = ops::linear_gelu(&ln, &w1, Some(&b1), true).unwrap();
            (x.as_tensor() + ops::linear(&h, &w2, Some(&b2), true).unwrap()).unwrap()
        };
        same_bits(one, four, &vars, 97, &what);
    });
    // Parameters of the wrong shapes are refused, fused or not.
    let (x, v4, w, b5) = misfits();
    for fused in [true, false] {
        assert!(ops::mlp_residual(&x, &v4, &v4, 1e-5, (&w, &b5), (&w, &v4), fused).is_err());
    }
}

#[test]
fn cross_entropy_matches_the_composed_ops() {
    for &n in &SIZES {
        for v in [1, 2, 3, 33, 129] {
            let x = var(&[n, v], 8, 3.0);
            let mut r = SplitMix64::new(n as u64);
            let t: Vec<i64> = (0..n)
                .map(|i| {
                    if i % 5 == 4 {
                        IGNORE
                    } else {
                        r.below(v as u64) as i64
                    }
                })
                .collect();
            let t = Tensor::from_vec(t, n, &DEV).unwrap();
            compare(&[&x], 2e-5, &format!("cross-entropy {n}×{v}"), |fused| {
                ops::cross_entropy(&x, &t, IGNORE, fused).unwrap()
            });
        }
    }
    // A target outside the vocabulary is an error, not a read out of bounds.
    let x = var(&[2, 3], 9, 1.0);
    let bad = Tensor::new(&[0i64, 3], &DEV).unwrap();
    assert!(ops::cross_entropy(&x, &bad, IGNORE, true).is_err());
}

/// Every encoding, 50 steps: the losses of the fused run and of the run
/// with the composed reference ops (same seed, same batches) agree within
/// 1e-4 relative at every step.
#[test]
fn fifty_steps_fused_and_composed_agree() {
    let task = Task::new(TaskKind::Copy, 8).unwrap();
    // Every encoding of the command line but the concatenated sinusoidal
    // layout (the same table as the interleaved one, permuted).
    let pes = PeConfig::NAMES
        .iter()
        .filter(|&&n| n != "sinusoidal-concat")
        .map(|n| PeConfig::parse(n, 24, 4).unwrap());
    for pe in pes {
        let label = pe.label();
        let losses = |fused: bool| -> Vec<f64> {
            let m = common::model(Mode::Decoder, &task, pe.clone());
            let mut lab =
                Lab::new(m, common::run(TaskKind::Copy, 50, 24, 7), task.clone()).unwrap();
            lab.model.set_fused(fused);
            let mut opt = AdamW::new(lab.params(), 0.01).unwrap();
            (0..50)
                .map(|s| common::train_step(&lab, &mut opt, batch_seed(7, s, 0), 16, 24) as f64)
                .collect()
        };
        let (a, b) = (losses(true), losses(false));
        for (s, (x, y)) in a.iter().zip(&b).enumerate() {
            let e = (x - y).abs() / y.abs();
            assert!(
                e < 1e-4,
                "{label} step {s}: fused {x} vs composed {y} ({e:.2e})"
            );
        }
        assert!(
            a[49] < a[0],
            "{label}: the loss went down ({} → {})",
            a[0],
            a[49]
        );
    }
}

/// Training is deterministic for a seed, and the fused kernels give the same
/// bits on one thread as on two.
#[test]
fn training_does_not_depend_on_the_thread_count() {
    let task = Task::new(TaskKind::Copy, 8).unwrap();
    let run = |threads: usize| -> Vec<u32> {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| {
            let mut m = common::model(
                Mode::Decoder,
                &task,
                PeConfig::parse("shaw", 96, 4).unwrap(),
            );
            m.d_model = 64;
            m.d_ff = 256;
            let lab = Lab::new(m, common::run(TaskKind::Copy, 8, 96, 3), task.clone()).unwrap();
            let mut opt = AdamW::new(lab.params(), 0.01).unwrap();
            (0..8)
                .map(|s| common::train_step(&lab, &mut opt, batch_seed(3, s, 0), 32, 96).to_bits())
                .collect()
        })
    };
    let one = run(1);
    assert_eq!(one, run(1), "same seed, same thread count");
    assert_eq!(one, run(2), "one thread vs two");
}
