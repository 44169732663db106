//! Forgetting attention (Lin et al. 2025): the candle module against the
//! plain `f64` reference, gradients with respect to the gate's weights and
//! the hidden states against central finite differences, KV-cache
//! continuation and query slices, the ALiBi special case, the decay-time
//! initialisation, the `O(T)` scans and `log σ`, and typed errors.

#![allow(clippy::needless_range_loop)]

use crate::learned_common;

use candle_core::{DType, Device, Tensor, Var};
use candle_nn::{VarBuilder, VarMap};
use learned_common::{check_grads, det, det_tensor, flat};
use posenc::relative::forgetting::{log_sigmoid, ForgetBiasInit, ForgetGate, ForgetGateConfig};
use posenc::tensor::forgetting::{cumulative_log_forget, forget_bias, ForgettingBias};
use posenc::tensor::scan::{cumsum_last, cumsum_last_matmul, reverse_cumsum_last};
use posenc::Error;

fn rows(t: &Tensor) -> Vec<Vec<f64>> {
    t.to_dtype(DType::F64).unwrap().to_vec2().unwrap()
}

/// A gate with weights big enough that f spreads over (0, 1).
fn gate(h: usize, d: usize, seed: f64) -> ForgetGate {
    let w = (0..h).map(|i| det(d, seed + i as f64)).collect();
    ForgetGate::from_weights(w, det(h, seed + 0.5)).unwrap()
}

#[test]
fn tensor_equals_plain() {
    for h in [1usize, 2, 3, 8] {
        for t in [1usize, 2, 3, 200] {
            let d = 5;
            let plain = gate(h, d, h as f64);
            let module = ForgettingBias::from_plain(&plain, DType::F64, &Device::Cpu).unwrap();
            let x = det_tensor(&[2, t, d], 0.3 + t as f64, 2.0);
            let lf = module.log_forget(&x).unwrap();
            let c = module.cumulative(&x, None).unwrap();
            let q_len = t.min(3);
            let bias = module.bias(&x, (t - q_len).into(), q_len).unwrap();
            assert_eq!(lf.dims(), &[2, h, t]);
            assert_eq!(bias.dims(), &[2, h, q_len, t]);
            for b in 0..2 {
                let xs = rows(&x.get(b).unwrap());
                let want_lf = plain.log_forget(&xs).unwrap();
                let want_c = plain.cumulative(&xs).unwrap();
                let (glf, gc) = (rows(&lf.get(b).unwrap()), rows(&c.get(b).unwrap()));
                for hi in 0..h {
                    for i in 0..t {
                        assert!((glf[hi][i] - want_lf[hi][i]).abs() < 1e-13);
                        assert!((gc[hi][i] - want_c[hi][i]).abs() < 1e-11);
                    }
                    let want_b = plain.bias_matrix(&want_c[hi], t - q_len, q_len).unwrap();
                    let gb = rows(&bias.get(b).unwrap().get(hi).unwrap());
                    for i in 0..q_len {
                        for j in 0..t {
                            assert!((gb[i][j] - want_b[i][j]).abs() < 1e-11);
                        }
                    }
                }
            }
        }
    }
}

/// The f32 module (the reference computes log f in f32) is close to f64.
#[test]
fn f32_module_is_close_to_plain() {
    let plain = gate(4, 8, 1.0);
    let module = ForgettingBias::from_plain(&plain, DType::F32, &Device::Cpu).unwrap();
    let x64 = det_tensor(&[1, 500, 8], 0.2, 2.0);
    let c = module
        .cumulative(&x64.to_dtype(DType::F32).unwrap(), None)
        .unwrap();
    let want = plain.cumulative(&rows(&x64.get(0).unwrap())).unwrap();
    let got = rows(&c.get(0).unwrap());
    for h in 0..4 {
        for t in 0..500 {
            assert!((got[h][t] - want[h][t]).abs() <= 1e-5 * (1.0 + want[h][t].abs()));
        }
    }
}

/// Decoding with a KV cache: c continues from the cached last value, and the
/// bias of a query slice is the rows of the full bias, with offsets or with
/// per-row indices (left padding: each row's queries at its own indices).
#[test]
fn kv_cache_and_query_slices() {
    let plain = gate(3, 4, 2.0);
    let module = ForgettingBias::from_plain(&plain, DType::F64, &Device::Cpu).unwrap();
    let x = det_tensor(&[2, 11, 4], 0.7, 2.0);
    let c = module.cumulative(&x, None).unwrap();
    let full = forget_bias(&c, 0.into(), 11).unwrap();
    for split in [1usize, 5, 10] {
        let head = module
            .cumulative(&x.narrow(1, 0, split).unwrap(), None)
            .unwrap();
        let last = head.narrow(2, split - 1, 1).unwrap().squeeze(2).unwrap();
        let tail = module
            .cumulative(&x.narrow(1, split, 11 - split).unwrap(), Some(&last))
            .unwrap();
        let joined = Tensor::cat(&[head, tail], 2).unwrap();
        let diff = flat(&(joined - &c).unwrap().abs().unwrap());
        assert!(diff.iter().all(|&v| v < 1e-12));
        let slice = forget_bias(&c, split.into(), 11 - split).unwrap();
        let want = full.narrow(2, split, 11 - split).unwrap();
        assert_eq!(flat(&slice), flat(&want));
    }
    // Per-row indices.
    let ids = Tensor::new(&[[8u32, 9, 10], [2, 7, 7]], &Device::Cpu).unwrap();
    let b = forget_bias(&c, (&ids).into(), 3).unwrap();
    let idx = [[8usize, 9, 10], [2, 7, 7]];
    for row in 0..2 {
        for h in 0..3 {
            let got = rows(&b.get(row).unwrap().get(h).unwrap());
            let full_rows = rows(&full.get(row).unwrap().get(h).unwrap());
            for i in 0..3 {
                assert_eq!(got[i], full_rows[idx[row][i]]);
            }
        }
    }
}

/// The semantics of the causal bias: 0 on the diagonal, ≤ 0 and
/// non-decreasing towards the query for keys at or before it, and the
/// product of the gates in between.
#[test]
fn causal_semantics() {
    let plain = gate(2, 3, 3.0);
    let x: Vec<Vec<f64>> = (0..9).map(|t| det(3, t as f64)).collect();
    let lf = plain.log_forget(&x).unwrap();
    let c = plain.cumulative(&x).unwrap();
    for h in 0..2 {
        let b = plain.bias_matrix(&c[h], 0, 9).unwrap();
        for i in 0..9 {
            assert!(b[i][i].abs() < 1e-15);
            for j in 0..i {
                assert!(b[i][j] < 0.0);
                assert!(b[i][j] <= b[i][j + 1]);
                let prod: f64 = (j + 1..=i).map(|l| lf[h][l].exp()).product();
                assert!((b[i][j].exp() - prod).abs() < 1e-12);
            }
            for j in i + 1..9 {
                assert!(b[i][j] > 0.0, "masked entries hold the formula's value");
            }
        }
    }
}

/// A constant gate σ(b) is ALiBi with slope −log σ(b).
#[test]
fn constant_gate_is_alibi() {
    let bias = [-1.0, 0.0, 2.5];
    let plain = ForgetGate::from_weights(vec![vec![0.0; 2]; 3], bias.to_vec()).unwrap();
    let x: Vec<Vec<f64>> = (0..6).map(|t| det(2, t as f64)).collect();
    let c = plain.cumulative(&x).unwrap();
    for h in 0..3 {
        let slope = -log_sigmoid(bias[h]);
        let b = plain.bias_matrix(&c[h], 0, 6).unwrap();
        for i in 0..6 {
            for j in 0..=i {
                assert!((b[i][j] + slope * (i - j) as f64).abs() < 1e-12);
            }
        }
    }
}

/// A gate over `hidden` features and `heads` heads whose bias starts at
/// decay times spread from `min` to `max`.
fn decay_times(hidden: usize, heads: usize, min: f64, max: f64) -> ForgetGateConfig {
    ForgetGateConfig::new(hidden, heads)
        .unwrap()
        .with_bias_init(ForgetBiasInit::DecayTimes { min, max })
        .unwrap()
}

#[test]
fn decay_time_initialisation() {
    let cfg = decay_times(8, 4, 2.0, 128.0);
    let b0 = cfg.initial_bias();
    let taus: Vec<f64> = b0.iter().map(|&b| -1.0 / log_sigmoid(b)).collect();
    for (h, want) in [2.0, 8.0, 32.0, 128.0].iter().enumerate() {
        assert!((taus[h] - want).abs() < 1e-9 * want, "{taus:?}");
    }
    // The module adds b0 to its zero-initialised parameter.
    let vm = VarMap::new();
    let vb = VarBuilder::from_varmap(&vm, DType::F64, &Device::Cpu);
    let module = ForgettingBias::new(cfg, vb).unwrap();
    assert!(flat(module.bias_param()).iter().all(|&v| v == 0.0));
    let x = Tensor::zeros((1, 1, 8), DType::F64, &Device::Cpu).unwrap();
    let lf = flat(&module.log_forget(&x).unwrap());
    for h in 0..4 {
        assert!((lf[h] - log_sigmoid(b0[h])).abs() < 1e-15);
    }
}

#[test]
fn reference_initialisation_and_names() {
    let vm = VarMap::new();
    let vb = VarBuilder::from_varmap(&vm, DType::F32, &Device::Cpu);
    let module =
        ForgettingBias::new(ForgetGateConfig::new(64, 4).unwrap(), vb.pp("fgate_proj")).unwrap();
    let mut names: Vec<String> = vm.data().lock().unwrap().keys().cloned().collect();
    names.sort();
    assert_eq!(names, ["fgate_proj.bias", "fgate_proj.weight"]);
    assert_eq!(module.weight().dims(), &[4, 64]);
    assert!(flat(module.bias_param()).iter().all(|&v| v == 0.0));
    let w = flat(module.weight());
    let mean = w.iter().sum::<f64>() / w.len() as f64;
    let std = (w.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / w.len() as f64).sqrt();
    assert!((std - 0.02).abs() < 0.004, "std {std}");
}

/// Gradients with respect to the weights, the bias and the hidden states
/// against central finite differences (f64): through the full bias with a
/// query slice, and through c continued from a cached start.
#[test]
fn gradients_match_finite_differences() {
    let vm = VarMap::new();
    let vb = VarBuilder::from_varmap(&vm, DType::F64, &Device::Cpu);
    let cfg = decay_times(4, 3, 1.5, 20.0);
    let module = ForgettingBias::new(cfg, vb.pp("f")).unwrap();
    let (weight, bias) = {
        let data = vm.data().lock().unwrap();
        (data["f.weight"].clone(), data["f.bias"].clone())
    };
    weight.set(&det_tensor(&[3, 4], 0.45, 1.5)).unwrap();
    let x = Var::from_tensor(&det_tensor(&[2, 7, 4], 0.65, 1.5)).unwrap();
    let start = Var::from_tensor(&det_tensor(&[2, 3], 0.1, 2.0)).unwrap();
    let w = det_tensor(&[2, 3, 4, 7], 0.25, 1.0);
    let wc = det_tensor(&[2, 3, 7], 0.95, 1.0);
    let loss = || {
        let b = module.bias(x.as_tensor(), 3.into(), 4).unwrap();
        let c = module
            .cumulative(x.as_tensor(), Some(start.as_tensor()))
            .unwrap();
        ((b * &w).unwrap().sum_all().unwrap() + (c * &wc).unwrap().sum_all().unwrap()).unwrap()
    };
    let largest = check_grads(
        &[
            ("weight", &weight),
            ("bias", &bias),
            ("x", &x),
            ("start", &start),
        ],
        &loss,
        1e-6,
        1e-7,
    );
    assert!(largest.iter().all(|&g| g > 1e-3), "{largest:?}");
}

/// `log σ` at extreme values, and its derivative σ(−z).
#[test]
fn log_sigmoid_op() {
    let z = Var::new(
        &[-800.0f64, -30.0, -1.0, 0.0, 1e-9, 2.0, 40.0, 800.0],
        &Device::Cpu,
    )
    .unwrap();
    let lf = posenc::tensor::forgetting::log_sigmoid(z.as_tensor()).unwrap();
    let v = flat(&lf);
    let want = [
        -800.0,
        -30.0 - (-30f64).exp().ln_1p(),
        log_sigmoid(-1.0),
        -2f64.ln(),
    ];
    for (a, b) in v.iter().zip(want) {
        assert!((a - b).abs() < 1e-15, "{a} vs {b}");
    }
    assert!(v.iter().all(|x| x.is_finite() && *x <= 0.0));
    assert_eq!(v[7], 0.0);
    let g = flat(
        lf.sum_all()
            .unwrap()
            .backward()
            .unwrap()
            .get(z.as_tensor())
            .unwrap(),
    );
    for (gi, zi) in g.iter().zip(flat(z.as_tensor())) {
        let s = 1.0 / (1.0 + zi.exp());
        assert!((gi - s).abs() < 1e-15, "{zi}: {gi} vs {s}");
    }
    // f32 and bf16 go through the same op.
    let z32 = Tensor::new(&[-100f32, 0.0, 3.0], &Device::Cpu).unwrap();
    let l32 = flat(&posenc::tensor::forgetting::log_sigmoid(&z32).unwrap());
    assert!((l32[1] + 2f64.ln()).abs() < 1e-7 && (l32[0] + 100.0).abs() < 1e-4);
    let zb = z32.to_dtype(DType::BF16).unwrap();
    let lb = posenc::tensor::forgetting::log_sigmoid(&zb).unwrap();
    assert_eq!(lb.dtype(), DType::BF16);
}

/// The O(T) scans equal the triangular-matmul reference, forward and
/// reverse, in value and gradient, for lengths 1, 2, 3 and a larger one.
#[test]
fn scans_equal_matmul_reference() {
    for n in [1usize, 2, 3, 257] {
        for reverse in [false, true] {
            let x = Var::from_tensor(&det_tensor(&[2, 3, n], n as f64, 1.0)).unwrap();
            let w = det_tensor(&[2, 3, n], 0.5, 1.0);
            let fast = if reverse {
                reverse_cumsum_last(x.as_tensor())
            } else {
                cumsum_last(x.as_tensor())
            }
            .unwrap();
            let slow = cumsum_last_matmul(x.as_tensor(), reverse).unwrap();
            let (fv, sv) = (flat(&fast), flat(&slow));
            for (a, b) in fv.iter().zip(&sv) {
                assert!((a - b).abs() < 1e-12);
            }
            // d(Σ w·y)/dx of each scan.
            let grad = |y: Tensor| {
                let grads = (y * &w).unwrap().sum_all().unwrap().backward().unwrap();
                flat(grads.get(x.as_tensor()).unwrap())
            };
            let (gf, gs) = (grad(fast), grad(slow));
            for (a, b) in gf.iter().zip(&gs) {
                assert!((a - b).abs() < 1e-12);
            }
        }
    }
    // A non-contiguous input (a transpose) and f32.
    let x = det_tensor(&[4, 6], 0.3, 1.0).to_dtype(DType::F32).unwrap();
    let xt = x.t().unwrap();
    let a = flat(&cumsum_last(&xt).unwrap());
    let b = flat(&cumsum_last_matmul(&xt, false).unwrap());
    for (p, q) in a.iter().zip(&b) {
        assert!((p - q).abs() < 1e-6);
    }
}

#[test]
fn shapes() {
    for h in [1usize, 2, 3, 12] {
        let plain = gate(h, 6, 0.0);
        let m = ForgettingBias::from_plain(&plain, DType::F32, &Device::Cpu).unwrap();
        for t in [1usize, 2, 3, 300] {
            let x = Tensor::randn(0f32, 1.0, (2, t, 6), &Device::Cpu).unwrap();
            let c = m.cumulative(&x, None).unwrap();
            assert_eq!(c.dims(), &[2, h, t]);
            assert_eq!(forget_bias(&c, 0.into(), t).unwrap().dims(), &[2, h, t, t]);
            assert_eq!(
                forget_bias(&c, (t - 1).into(), 1).unwrap().dims(),
                &[2, h, 1, t]
            );
        }
    }
}

#[test]
fn invalid_arguments_are_typed_errors() {
    assert!(matches!(ForgetGateConfig::new(8, 0), Err(Error::ZeroHeads)));
    assert!(matches!(
        ForgetGateConfig::new(0, 2),
        Err(Error::InvalidDimension { .. })
    ));
    assert!(matches!(
        ForgetGateConfig::new(1 << 21, 2),
        Err(Error::InvalidValue { .. })
    ));
    assert!(matches!(
        ForgetGateConfig::new(1 << 20, 1 << 10),
        Err(Error::InvalidValue { .. })
    ));
    let cfg = ForgetGateConfig::new(4, 2).unwrap();
    assert!(matches!(
        cfg.with_bias_init(ForgetBiasInit::DecayTimes { min: 4.0, max: 2.0 }),
        Err(Error::InvalidValue { .. })
    ));
    assert!(matches!(
        cfg.with_bias_init(ForgetBiasInit::DecayTimes { min: 0.0, max: 2.0 }),
        Err(Error::InvalidFactor { .. })
    ));
    assert!(matches!(
        ForgetGate::from_weights(vec![], vec![]),
        Err(Error::ZeroHeads)
    ));
    assert!(matches!(
        ForgetGate::from_weights(vec![vec![0.0, 1.0], vec![0.0]], vec![0.0, 0.0]),
        Err(Error::Shape { .. })
    ));
    assert!(matches!(
        ForgetGate::from_weights(vec![vec![0.0]], vec![0.0, 0.0]),
        Err(Error::Shape { .. })
    ));
    assert!(matches!(
        ForgetGate::from_weights(vec![vec![f64::NAN]], vec![0.0]),
        Err(Error::NotFinite { .. })
    ));
    let plain = gate(2, 3, 0.0);
    assert!(matches!(
        plain.log_forget(&[vec![0.0; 4]]),
        Err(Error::Shape { .. })
    ));
    assert!(matches!(
        plain.bias_matrix(&[0.0; 4], 3, 2),
        Err(Error::Shape { .. })
    ));
    let m = ForgettingBias::from_plain(&plain, DType::F32, &Device::Cpu).unwrap();
    let dev = Device::Cpu;
    let x = Tensor::zeros((2, 5, 3), DType::F32, &dev).unwrap();
    assert!(matches!(
        m.log_forget(&Tensor::zeros((2, 5, 4), DType::F32, &dev).unwrap()),
        Err(Error::Shape { .. })
    ));
    assert!(matches!(
        m.cumulative(&x, Some(&Tensor::zeros((2, 3), DType::F32, &dev).unwrap())),
        Err(Error::Shape { .. })
    ));
    let c = m.cumulative(&x, None).unwrap();
    assert!(matches!(
        forget_bias(&c, 3.into(), 3),
        Err(Error::Shape { .. })
    ));
    assert!(matches!(
        forget_bias(&c.flatten_all().unwrap(), 0.into(), 1),
        Err(Error::Shape { .. })
    ));
    assert!(matches!(
        cumulative_log_forget(&c.flatten_all().unwrap(), None),
        Err(Error::Shape { .. })
    ));
    let ids = Tensor::new(&[[0u32, 5]], &dev).unwrap();
    assert!(matches!(
        forget_bias(&c, (&ids).into(), 2),
        Err(Error::Shape { .. })
    ));
    let ids = Tensor::new(&[[0u32, 4], [1, 9]], &dev).unwrap();
    assert!(matches!(
        forget_bias(&c, (&ids).into(), 2),
        Err(Error::Shape { .. })
    ));
    assert!(matches!(
        forget_bias(&c, usize::MAX.into(), 2),
        Err(Error::PositionOutOfRange { .. })
    ));
}

/// Values and gradients against forgetting attention computed by PyTorch as
/// the paper's reference code does (`scripts/learned/gen_learned_fixtures.py`):
/// `logsigmoid` of the gate projection, `cumsum`, queries the last keys.
#[test]
fn matches_pytorch_reference() {
    use learned_common::{assert_close, assert_grads, json_flat, json_tensor, torch_fixture};
    let fx = torch_fixture();
    let f = &fx["forgetting"];
    let u = |k: &str| f[k].as_u64().unwrap() as usize;
    let (b, t, d, h, p) = (u("b"), u("t"), u("d"), u("h"), u("q_offset"));
    let weight: Vec<Vec<f64>> = json_flat(&f["weight"])
        .chunks(d)
        .map(<[f64]>::to_vec)
        .collect();
    let plain = ForgetGate::from_weights(weight, json_flat(&f["bias_param"])).unwrap();
    let want_c = json_flat(&f["cumulative"]);
    let want_bias = json_flat(&f["bias"]);
    let x = Var::from_tensor(&json_tensor(&f["x"], &[b, t, d])).unwrap();
    let mut plain_c = Vec::new();
    let mut plain_bias = Vec::new();
    for bi in 0..b {
        let c = plain.cumulative(&rows(&x.get(bi).unwrap())).unwrap();
        for row in &c {
            plain_bias.extend(plain.bias_matrix(row, p, t - p).unwrap().concat());
        }
        plain_c.extend(c.concat());
    }
    assert_close("plain c", &plain_c, &want_c, 1e-12);
    assert_close("plain bias", &plain_bias, &want_bias, 1e-12);

    let vm = VarMap::new();
    let vb = VarBuilder::from_varmap(&vm, DType::F64, &Device::Cpu);
    let module = ForgettingBias::new(ForgetGateConfig::new(d, h).unwrap(), vb).unwrap();
    let (wv, bv) = {
        let data = vm.data().lock().unwrap();
        (data["weight"].clone(), data["bias"].clone())
    };
    wv.set(&json_tensor(&f["weight"], &[h, d])).unwrap();
    bv.set(&json_tensor(&f["bias_param"], &[h])).unwrap();
    let lf = module.log_forget(x.as_tensor()).unwrap();
    assert_close("log f", &flat(&lf), &json_flat(&f["log_forget"]), 1e-12);
    assert_close(
        "c",
        &flat(&module.cumulative(x.as_tensor(), None).unwrap()),
        &want_c,
        1e-12,
    );
    let bias = module.bias(x.as_tensor(), p.into(), t - p).unwrap();
    assert_close("bias", &flat(&bias), &want_bias, 1e-12);
    let lw = json_tensor(&f["loss_weight"], &[b, h, t - p, t]);
    let grads = (bias * lw).unwrap().sum_all().unwrap().backward().unwrap();
    let grad_of = [
        ("x", x.as_tensor()),
        ("weight", wv.as_tensor()),
        ("bias_param", bv.as_tensor()),
    ];
    assert_grads(&grads, &f["grad"], &grad_of, 1e-10);
}
