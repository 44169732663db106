//! Shared helpers for the learned-bias tests (FIRE, CoPE, forgetting
//! attention): deterministic inputs and a central finite-difference check of
//! candle's gradients.
#![allow(dead_code)]

use candle_core::{DType, Device, Tensor, Var};

/// `n` deterministic values in [−1, 1].
pub fn det(n: usize, seed: f64) -> Vec<f64> {
    (0..n)
        .map(|i| ((i as f64) * 0.618_033_988_7 + seed).sin() * ((i as f64) * 0.3 + seed).cos())
        .collect()
}

/// A deterministic `f64` tensor of `shape`, entries in [−scale, scale].
pub fn det_tensor(shape: &[usize], seed: f64, scale: f64) -> Tensor {
    let n: usize = shape.iter().product();
    let v: Vec<f64> = det(n, seed).into_iter().map(|x| x * scale).collect();
    Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
}

/// Flattened `f64` values.
pub fn flat(t: &Tensor) -> Vec<f64> {
    t.to_dtype(DType::F64)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap()
}

/// Checks the autograd gradient of the scalar `loss()` with respect to every
/// element of every var against central differences with step `h`:
/// `|fd − grad| ≤ tol·(1 + |fd|)`. Returns, per var, the largest absolute
/// gradient seen (so callers can assert that a gradient actually flows).
pub fn check_grads(vars: &[(&str, &Var)], loss: &dyn Fn() -> Tensor, h: f64, tol: f64) -> Vec<f64> {
    let l = loss();
    let grads = l.backward().unwrap();
    let mut largest = Vec::new();
    for (name, var) in vars {
        let n = var.elem_count();
        let g = grads
            .get(var.as_tensor())
            .map(flat)
            .unwrap_or_else(|| vec![0.0; n]);
        let base = flat(var.as_tensor());
        let shape = var.shape().clone();
        let set = |v: Vec<f64>| {
            var.set(&Tensor::from_vec(v, shape.clone(), &Device::Cpu).unwrap())
                .unwrap()
        };
        let mut worst: f64 = 0.0;
        for idx in 0..n {
            let mut p = base.clone();
            p[idx] += h;
            set(p);
            let lp: f64 = loss().to_scalar().unwrap();
            let mut m = base.clone();
            m[idx] -= h;
            set(m);
            let lm: f64 = loss().to_scalar().unwrap();
            set(base.clone());
            let fd = (lp - lm) / (2.0 * h);
            let err = (fd - g[idx]).abs() / (1.0 + fd.abs());
            worst = worst.max(err);
            assert!(
                err <= tol,
                "{name}[{idx}]: autograd {} vs finite difference {fd} (rel. err {err:e})",
                g[idx]
            );
        }
        largest.push(g.iter().fold(0.0f64, |a, v| a.max(v.abs())));
        eprintln!("{name}: {n} entries, worst rel. err {worst:.2e}");
    }
    largest
}

/// The PyTorch reference values of `scripts/learned/gen_learned_fixtures.py`.
pub fn torch_fixture() -> serde_json::Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/learned_bias.json"
    );
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Every number of a (nested) JSON array, in order.
pub fn json_flat(v: &serde_json::Value) -> Vec<f64> {
    match v {
        serde_json::Value::Array(a) => a.iter().flat_map(json_flat).collect(),
        serde_json::Value::Number(n) => vec![n.as_f64().unwrap()],
        other => panic!("not a number: {other}"),
    }
}

/// A JSON array as an `f64` tensor of `shape`.
pub fn json_tensor(v: &serde_json::Value, shape: &[usize]) -> Tensor {
    Tensor::from_vec(json_flat(v), shape, &Device::Cpu).unwrap()
}

/// `|a − b| ≤ tol·(1 + |b|)` elementwise, with a message naming `what`.
pub fn assert_close(what: &str, a: &[f64], b: &[f64], tol: f64) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(
            (x - y).abs() <= tol * (1.0 + y.abs()),
            "{what}[{i}]: {x} vs {y}"
        );
    }
}

/// Checks the gradient of each `(key, tensor)` in `grads` against the
/// fixture's `want[key]` with [`assert_close`].
pub fn assert_grads(
    grads: &candle_core::backprop::GradStore,
    want: &serde_json::Value,
    tensors: &[(&str, &Tensor)],
    tol: f64,
) {
    for (key, t) in tensors {
        let got = flat(grads.get(t).unwrap());
        assert_close(&format!("grad {key}"), &got, &json_flat(&want[*key]), tol);
    }
}
