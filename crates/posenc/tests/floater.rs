//! FLOATER: integrators (closed form, convergence), the f64 path against the
//! candle path, gradients reaching every parameter (and matching finite
//! differences), bad input.

// Naive reference loops index by position on purpose.
#![allow(clippy::needless_range_loop)]

use candle_core::{DType, Device, Tensor};
use candle_nn::{VarBuilder, VarMap};
use posenc::absolute::floater::{integrate, solve_grid};
use posenc::absolute::{Floater, FloaterConfig, Integrator};
use posenc::tensor::absolute::{FloaterEmbedding, Positions};
use posenc::{AbsoluteEncoding, Error, Hooks, PositionalEncoding};

use crate::common;
use common::max_abs_diff;

/// dy/dt = A y with A = diag(λ) has y(t) = y0 · exp(λ t).
#[test]
fn linear_field_matches_exponential() {
    let lambdas = [-1.5, 0.3, 2.0];
    let y0 = [1.0, -2.0, 0.5];
    let f = |_t: f64, y: &[f64]| {
        y.iter()
            .zip(&lambdas)
            .map(|(y, l)| l * y)
            .collect::<Vec<_>>()
    };
    let exact: Vec<f64> = y0
        .iter()
        .zip(&lambdas)
        .map(|(y, l)| y * (l * 1.0f64).exp())
        .collect();
    let rk4 = integrate(f, &y0, 0.0, 1.0, 100, Integrator::Rk4);
    let euler = integrate(f, &y0, 0.0, 1.0, 100_000, Integrator::Euler);
    for i in 0..3 {
        let rel = ((rk4[i] - exact[i]) / exact[i]).abs();
        assert!(rel < 1e-8, "rk4 {i}: {} vs {}", rk4[i], exact[i]);
        assert!((euler[i] - exact[i]).abs() < 1e-3 * exact[i].abs().max(1.0));
    }
    // Time-dependent field: dy/dt = cos(t) → y = sin(t).
    let g = |t: f64, _y: &[f64]| vec![t.cos()];
    let grid = solve_grid(g, &[0.0], 0.5, 10, 7, Integrator::Rk4);
    for (i, y) in grid.iter().enumerate() {
        assert!((y[0] - (0.5 * i as f64).sin()).abs() < 2e-8);
    }
}

/// Orders of convergence: Euler's error halves when the steps double,
/// RK4's is divided by about 16.
#[test]
fn convergence_orders() {
    let f = |t: f64, y: &[f64]| vec![-y[0] + t.sin()];
    // Closed form: y(t) = 1.5 e^(−t) + (sin t − cos t) / 2.
    let reference = 1.5 * (-2.0f64).exp() + (2f64.sin() - 2f64.cos()) / 2.0;
    let err = |steps, integ| (integrate(f, &[1.0], 0.0, 2.0, steps, integ)[0] - reference).abs();
    let (e1, e2) = (err(200, Integrator::Euler), err(400, Integrator::Euler));
    assert!((e1 / e2 - 2.0).abs() < 0.1, "euler ratio {}", e1 / e2);
    let (r1, r2) = (err(80, Integrator::Rk4), err(160, Integrator::Rk4));
    assert!((r1 / r2 - 16.0).abs() < 2.0, "rk4 ratio {}", r1 / r2);
}

/// The FLOATER table with Euler and many steps approaches the RK4 table.
#[test]
fn floater_euler_converges_to_rk4() {
    let base = FloaterConfig::new(6, 12).with_delta_t(0.2);
    let rk4 = Floater::random(base.with_steps(8), 3).unwrap();
    let params = rk4.params().clone();
    let reference = rk4.table_f64(20);
    let fine = Floater::new(base.with_steps(64), params.clone())
        .unwrap()
        .table_f64(20);
    let mut prev = f64::INFINITY;
    let mut errors = vec![];
    for steps in [16usize, 64, 256, 1024] {
        let euler = Floater::new(
            base.with_steps(steps).with_integrator(Integrator::Euler),
            params.clone(),
        )
        .unwrap()
        .table_f64(20);
        let e = max_abs_diff(&euler.concat(), &fine.concat());
        assert!(e < prev, "steps {steps}: {e} not below {prev}");
        prev = e;
        errors.push(e);
    }
    // First order: 4× the steps, about 1/4 of the error.
    let ratio = errors[3] / errors[2];
    assert!((0.2..0.3).contains(&ratio), "euler error ratio {ratio}");
    assert!(prev < 2e-3, "euler with 1024 steps: {prev}");
    let rk_diff = max_abs_diff(&reference.concat(), &fine.concat());
    assert!(rk_diff < 1e-7, "rk4 8 vs 64 steps: {rk_diff}");
    // encode(p) integrates from 0 and agrees with the table.
    for p in [0u64, 1, 7, 19] {
        assert_eq!(rk4.encode(p).unwrap(), reference[p as usize]);
    }
    assert_eq!(rk4.hooks(), Hooks::INPUT);
}

/// `config` with each integrator.
fn with_each_integrator(config: FloaterConfig) -> [FloaterConfig; 2] {
    [Integrator::Euler, Integrator::Rk4].map(|i| config.with_integrator(i))
}

fn module(config: FloaterConfig, dtype: DType) -> (VarMap, FloaterEmbedding) {
    let vm = VarMap::new();
    let vb = VarBuilder::from_varmap(&vm, dtype, &Device::Cpu);
    let m = FloaterEmbedding::new(config, vb).unwrap();
    (vm, m)
}

#[test]
fn candle_path_equals_f64_path() {
    for config in with_each_integrator(FloaterConfig::new(5, 7).with_steps(3)) {
        let (_vm, m) = module(config, DType::F64);
        let plain = m.to_plain().unwrap();
        let want = plain.table_f64(9);
        let got: Vec<Vec<f64>> = m.table(9).unwrap().to_vec2().unwrap();
        for (g, w) in got.iter().flatten().zip(want.iter().flatten()) {
            assert!((g - w).abs() < 1e-12);
        }
        // f32 parameters: same values to f32 precision.
        let (_vm, m32) = module(config, DType::F32);
        let plain32 = m32.to_plain().unwrap().table_f64(9);
        let got32: Vec<Vec<f32>> = m32.table(9).unwrap().to_vec2().unwrap();
        for (g, w) in got32.iter().flatten().zip(plain32.iter().flatten()) {
            assert!((*g as f64 - w).abs() < 1e-5);
        }
    }
}

#[test]
fn gradients_reach_every_parameter() {
    for config in with_each_integrator(FloaterConfig::new(4, 8).with_steps(2)) {
        let (vm, m) = module(config, DType::F32);
        let x = Tensor::zeros((2, 6, 4), DType::F32, &Device::Cpu).unwrap();
        let y = m.forward(&x, Positions::Offset(1)).unwrap();
        let loss = y.sqr().unwrap().sum_all().unwrap();
        let grads = loss.backward().unwrap();
        let vars = vm.all_vars();
        assert_eq!(vars.len(), 5);
        for p in m.parameters() {
            let g = grads.get(p).expect("parameter has a gradient");
            let n: f32 = g.abs().unwrap().sum_all().unwrap().to_scalar().unwrap();
            assert!(
                n > 0.0 && n.is_finite(),
                "zero gradient for a parameter of shape {:?}",
                p.dims()
            );
        }
    }
}

/// Autograd through the RK4 solve equals central finite differences of the
/// f64 path.
#[test]
fn gradient_matches_finite_differences() {
    let config = FloaterConfig::new(3, 5).with_steps(2).with_delta_t(0.3);
    let (_vm, m) = module(config, DType::F64);
    let n = 6;
    let weights: Vec<f64> = (0..n * 3).map(|i| ((i as f64) * 0.7).cos()).collect();
    let wt = Tensor::from_vec(weights.clone(), (n, 3), &Device::Cpu).unwrap();
    let loss = (m.table(n).unwrap() * &wt).unwrap().sum_all().unwrap();
    let grads = loss.backward().unwrap();
    let plain = m.to_plain().unwrap();
    let loss_of = |f: &Floater| -> f64 {
        f.table_f64(n)
            .iter()
            .flatten()
            .zip(&weights)
            .map(|(a, b)| a * b)
            .sum()
    };
    let eps = 1e-6;
    // w1[1][3] (the time column), p0[2], b2[0].
    let g_w1: Vec<Vec<f64>> = grads.get(m.parameters()[1]).unwrap().to_vec2().unwrap();
    let g_p0: Vec<f64> = grads.get(m.parameters()[0]).unwrap().to_vec1().unwrap();
    let g_b2: Vec<f64> = grads.get(m.parameters()[4]).unwrap().to_vec1().unwrap();
    type Edit = Box<dyn Fn(&mut posenc::absolute::FloaterParams, f64)>;
    let cases: Vec<(Edit, f64)> = vec![
        (Box::new(|p, e| p.w1[1][3] += e), g_w1[1][3]),
        (Box::new(|p, e| p.p0[2] += e), g_p0[2]),
        (Box::new(|p, e| p.b2[0] += e), g_b2[0]),
    ];
    for (edit, auto) in cases {
        let mut plus = plain.params().clone();
        edit(&mut plus, eps);
        let mut minus = plain.params().clone();
        edit(&mut minus, -eps);
        let fd = (loss_of(&Floater::new(config, plus).unwrap())
            - loss_of(&Floater::new(config, minus).unwrap()))
            / (2.0 * eps);
        assert!(
            (fd - auto).abs() < 1e-6 * auto.abs().max(1.0),
            "fd {fd} vs autograd {auto}"
        );
    }
}

#[test]
fn bad_input_is_a_typed_error() {
    let c = FloaterConfig::new(4, 8);
    assert!(matches!(
        Floater::random(FloaterConfig::new(0, 8), 0),
        Err(Error::InvalidDimension { what: "dim", .. })
    ));
    assert!(matches!(
        Floater::random(FloaterConfig::new(4, 0), 0),
        Err(Error::InvalidDimension { what: "hidden", .. })
    ));
    assert!(matches!(
        Floater::random(c.with_steps(0), 0),
        Err(Error::InvalidDimension { .. })
    ));
    for dt in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        assert!(matches!(
            Floater::random(c.with_delta_t(dt), 0),
            Err(Error::InvalidFactor { .. })
        ));
    }
    let mut p = Floater::random(c, 0).unwrap().params().clone();
    p.w1[0].pop();
    assert!(matches!(Floater::new(c, p), Err(Error::Shape { .. })));
    let mut p = Floater::random(c, 0).unwrap().params().clone();
    p.b1[0] = f64::NAN;
    assert!(matches!(Floater::new(c, p), Err(Error::NotFinite { .. })));
    let vm = VarMap::new();
    let vb = VarBuilder::from_varmap(&vm, DType::F32, &Device::Cpu);
    assert!(matches!(
        FloaterEmbedding::new(c.with_steps(0), vb),
        Err(Error::InvalidDimension { .. })
    ));
    let (_vm, m) = module(c, DType::F32);
    let x = Tensor::zeros((1, 3, 5), DType::F32, &Device::Cpu).unwrap();
    assert!(matches!(
        m.forward(&x, Positions::Offset(0)),
        Err(Error::Shape { .. })
    ));
    let x = Tensor::zeros((1, 2, 4), DType::F32, &Device::Cpu).unwrap();
    let ids = Tensor::new(&[[0i64, -1]], &Device::Cpu).unwrap();
    assert!(matches!(
        m.forward(&x, Positions::Ids(&ids)),
        Err(Error::NegativePosition(-1))
    ));
    assert_eq!(Floater::random(c, 0).unwrap().name(), "FLOATER");
}
