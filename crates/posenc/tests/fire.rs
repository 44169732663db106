//! FIRE (Li et al. 2024): the candle module against the plain `f64`
//! reference (both evaluation paths, offsets and per-row ids), gradients of
//! every parameter against central finite differences, KV-cache slices,
//! causal/bidirectional semantics and typed errors.

// Naive reference loops index by position on purpose.
#![allow(clippy::needless_range_loop)]

use crate::learned_common;

use candle_core::{DType, Device, Tensor};
use candle_nn::{VarBuilder, VarMap};
use learned_common::{check_grads, det_tensor, flat};
use posenc::relative::fire::{Fire, FireConfig, FireMlp, FireMode};
use posenc::tensor::fire::FireBias;
use posenc::{AttentionBias, Error};

const OFFSETS: [(usize, usize); 3] = [(0, 0), (5, 0), (0, 9)];

fn bias4(t: &Tensor) -> Vec<Vec<Vec<Vec<f64>>>> {
    (0..t.dim(0).unwrap())
        .map(|b| {
            t.get(b)
                .unwrap()
                .to_dtype(DType::F64)
                .unwrap()
                .to_vec3()
                .unwrap()
        })
        .collect()
}

/// Every (head, query, key) of `t` (`(N, H, Tq, Tk)`) equals the plain
/// FIRE at positions `qpos(b, i)`, `kpos(b, j)`.
fn assert_matches_plain(
    t: &Tensor,
    fire: &Fire,
    qpos: impl Fn(usize, usize) -> u64,
    kpos: impl Fn(usize, usize) -> u64,
    tol: f64,
) {
    let v = bias4(t);
    for (b, heads) in v.iter().enumerate() {
        assert_eq!(heads.len(), fire.num_heads());
        for (h, rows) in heads.iter().enumerate() {
            for (i, row) in rows.iter().enumerate() {
                for (j, &got) in row.iter().enumerate() {
                    let want = fire.bias(h, qpos(b, i), kpos(b, j)).unwrap();
                    assert!(
                        (got - want).abs() <= tol * (1.0 + want.abs()),
                        "b {b} h {h} i {i} j {j}: {got} vs {want}"
                    );
                }
            }
        }
    }
}

fn configs() -> Vec<FireConfig> {
    let mut out = Vec::new();
    for heads in [1usize, 2, 3, 8] {
        for mode in [FireMode::Causal, FireMode::Bidirectional] {
            // The reference threshold (every query below L) and a small one
            // (queries past L: progressive interpolation, one class each).
            for init_l in [512.0, 3.3] {
                out.push(
                    FireConfig::new(heads)
                        .unwrap()
                        .with_mlp_width(if heads == 8 { 32 } else { 5 })
                        .unwrap()
                        .with_init(0.1, init_l)
                        .unwrap()
                        .with_mode(mode),
                );
            }
        }
    }
    out
}

#[test]
fn tensor_equals_plain_for_offsets() {
    for (n, cfg) in configs().into_iter().enumerate() {
        let fire = Fire::random(cfg, n as u64).unwrap();
        let module = FireBias::from_plain(&fire, DType::F64, &Device::Cpu).unwrap();
        for (tq, tk) in [
            (1usize, 1usize),
            (2, 3),
            (3, 2),
            (1, 129),
            (129, 1),
            (40, 40),
        ] {
            for (qo, ko) in OFFSETS {
                let fast = module.forward(tq, tk, qo.into(), ko.into()).unwrap();
                assert_eq!(fast.dims(), &[1, cfg.num_heads, tq, tk]);
                assert_matches_plain(
                    &fast,
                    &fire,
                    |_, i| (qo + i) as u64,
                    |_, j| (ko + j) as u64,
                    1e-12,
                );
                let grid = module
                    .direct()
                    .forward(tq, tk, qo.into(), ko.into())
                    .unwrap();
                let diff = (fast - grid).unwrap().abs().unwrap();
                assert!(flat(&diff).iter().all(|&d| d < 1e-13));
            }
        }
    }
}

#[test]
fn tensor_equals_plain_for_per_row_ids() {
    for (n, cfg) in configs().into_iter().enumerate() {
        let fire = Fire::random(cfg, 100 + n as u64).unwrap();
        let module = FireBias::from_plain(&fire, DType::F64, &Device::Cpu).unwrap();
        // Two rows with different positions (left padding: row 1 starts at 3),
        // and a row with repeated and decreasing ids.
        let q_ids: Vec<u32> = vec![4, 5, 6, 0, 1, 2, 9, 9, 1];
        let k_ids: Vec<u32> = vec![
            0, 1, 2, 3, 4, 5, 6, 3, 3, 0, 1, 2, 0, 0, 9, 8, 7, 1, 0, 2, 30,
        ];
        let q = Tensor::from_vec(q_ids.clone(), (3, 3), &Device::Cpu).unwrap();
        let k = Tensor::from_vec(k_ids.clone(), (3, 7), &Device::Cpu).unwrap();
        let t = module.forward(3, 7, (&q).into(), (&k).into()).unwrap();
        assert_eq!(t.dims(), &[3, cfg.num_heads, 3, 7]);
        assert_matches_plain(
            &t,
            &fire,
            |b, i| q_ids[b * 3 + i] as u64,
            |b, j| k_ids[b * 7 + j] as u64,
            1e-12,
        );
        // Ids for the queries only: keys shared by the batch (offset 2).
        let t = module.forward(3, 4, (&q).into(), 2.into()).unwrap();
        assert_eq!(t.dims(), &[3, cfg.num_heads, 3, 4]);
        assert_matches_plain(
            &t,
            &fire,
            |b, i| q_ids[b * 3 + i] as u64,
            |_, j| 2 + j as u64,
            1e-12,
        );
    }
}

/// The f32 module is the f64 reference rounded (relative 1e-5).
#[test]
fn f32_module_is_close_to_plain() {
    let cfg = FireConfig::new(4).unwrap();
    let fire = Fire::random(cfg, 7).unwrap();
    let module = FireBias::from_plain(&fire, DType::F32, &Device::Cpu).unwrap();
    let t = module.forward(64, 64, 0.into(), 0.into()).unwrap();
    assert_eq!(t.dtype(), DType::F32);
    assert_matches_plain(&t, &fire, |_, i| i as u64, |_, j| j as u64, 1e-5);
}

/// A query slice at positions p..p + Tq (a KV cache) is the corresponding
/// rows of the full computation.
#[test]
fn query_slice_equals_rows_of_full() {
    for cfg in configs() {
        let fire = Fire::random(cfg, 3).unwrap();
        let module = FireBias::from_plain(&fire, DType::F64, &Device::Cpu).unwrap();
        let full = module.forward(12, 12, 0.into(), 0.into()).unwrap();
        for (start, len) in [(0usize, 12usize), (7, 3), (11, 1), (4, 8)] {
            let slice = module.forward(len, 12, start.into(), 0.into()).unwrap();
            let rows = full.narrow(2, start, len).unwrap();
            let diff = flat(&(slice - rows).unwrap().abs().unwrap());
            assert!(diff.iter().all(|&d| d < 1e-13), "slice {start}+{len}");
        }
    }
}

/// Causal mode: a key after the query gets the formula at |i − j| (the
/// reference code's value, hidden by the mask); bidirectional mode gives it
/// the second MLP, so before and after differ.
#[test]
fn causal_and_bidirectional_semantics() {
    let causal = Fire::random(FireConfig::new(2).unwrap(), 1).unwrap();
    for (i, j) in [(3u64, 7u64), (0, 5), (10, 11)] {
        for h in 0..2 {
            // Same distance, same normaliser (both below L = 512).
            assert_eq!(causal.bias(h, i, j).unwrap(), causal.bias(h, j, i).unwrap());
        }
        let u = causal.normalized_distance(i, j).unwrap();
        assert_eq!(causal.bias_heads(i, j).unwrap(), causal.mlp().eval(u));
    }
    let bidi = Fire::random(
        FireConfig::new(2)
            .unwrap()
            .with_mode(FireMode::Bidirectional),
        1,
    )
    .unwrap();
    let mut differ = 0;
    for (i, j) in [(3u64, 7u64), (0, 5), (10, 11)] {
        let u = bidi.normalized_distance(i, j).unwrap();
        assert_eq!(
            bidi.bias_heads(i, j).unwrap(),
            bidi.mlp_future().unwrap().eval(u)
        );
        assert_eq!(bidi.bias_heads(j, i).unwrap(), bidi.mlp().eval(u));
        differ += usize::from(bidi.bias(0, i, j).unwrap() != bidi.bias(0, j, i).unwrap());
    }
    assert_eq!(differ, 3);
    // The diagonal (i = j) is the MLP at u = 0 in both modes.
    assert_eq!(bidi.bias_heads(4, 4).unwrap(), bidi.mlp().eval(0.0));
}

/// The formula's ingredients: ψ, the threshold, and progressive
/// interpolation past L (u ≤ 1 for every key at or before the query).
#[test]
fn progressive_interpolation() {
    let cfg = FireConfig::new(1).unwrap().with_init(0.5, 8.0).unwrap();
    let fire = Fire::random(cfg, 0).unwrap();
    assert_eq!(fire.threshold(), 8.0);
    // Below L: the normaliser is ψ(8).
    let den = (1.0f64 + 0.5 * 8.0).ln() + 1e-6;
    let u = fire.normalized_distance(5, 2).unwrap();
    assert!((u - (1.0f64 + 1.5).ln() / den).abs() < 1e-15);
    // Past L: ψ(i); the first key is at u = ψ(i) / (ψ(i) + ε) < 1.
    for i in [8u64, 100, 10_000, 1 << 40] {
        let u = fire.normalized_distance(i, 0).unwrap();
        assert!(u < 1.0 && u > 0.999, "{i}: {u}");
        assert_eq!(fire.normalized_distance(i, i).unwrap(), 0.0);
    }
}

fn fire_varmap(cfg: FireConfig) -> (VarMap, FireBias) {
    let vm = VarMap::new();
    let vb = VarBuilder::from_varmap(&vm, DType::F64, &Device::Cpu);
    let module = FireBias::new(cfg, vb.pp("fire")).unwrap();
    (vm, module)
}

/// Every parameter's gradient against central finite differences, in f64,
/// with queries on both sides of a small threshold (so ℓ gets a gradient
/// from the queries below it) and both evaluation paths.
#[test]
fn gradients_match_finite_differences() {
    for mode in [FireMode::Causal, FireMode::Bidirectional] {
        for grid in [false, true] {
            let cfg = FireConfig::new(3)
                .unwrap()
                .with_mlp_width(6)
                .unwrap()
                .with_init(0.3, 4.3)
                .unwrap()
                .with_mode(mode);
            let (vm, module) = fire_varmap(cfg);
            // candle draws the MLP's initial weights from an unseeded
            // generator; a draw with a dead ReLU unit left some weight
            // without gradient now and then. Fixed values instead.
            {
                let data = vm.data().lock().unwrap();
                let mut names: Vec<&String> = data.keys().filter(|n| n.contains("mlp")).collect();
                names.sort();
                for (i, n) in names.iter().enumerate() {
                    let v = &data[*n];
                    let t = det_tensor(v.dims(), 0.37 + i as f64, 0.8);
                    v.set(&t).unwrap();
                }
            }
            let (tq, tk) = (5usize, 9usize);
            let w = det_tensor(&[1, 3, tq, tk], 0.4, 1.0);
            let loss = || {
                let b = if grid {
                    module.direct().forward(tq, tk, 4.into(), 0.into())
                } else {
                    module.forward(tq, tk, 4.into(), 0.into())
                }
                .unwrap();
                (b * &w).unwrap().sum_all().unwrap()
            };
            let data = vm.data().lock().unwrap().clone();
            let mut names: Vec<&String> = data.keys().collect();
            names.sort();
            let vars: Vec<(&str, &candle_core::Var)> =
                names.iter().map(|n| (n.as_str(), &data[*n])).collect();
            let expected = if mode == FireMode::Bidirectional {
                10
            } else {
                6
            };
            assert_eq!(vars.len(), expected, "{names:?}");
            let largest = check_grads(&vars, &loss, 1e-6, 1e-6);
            for ((name, _), g) in vars.iter().zip(&largest) {
                assert!(*g > 1e-6, "{name} gets no gradient");
            }
        }
    }
}

#[test]
fn varbuilder_names_and_initialisation() {
    let cfg = FireConfig::new(4).unwrap();
    let (vm, module) = fire_varmap(cfg);
    let data = vm.data().lock().unwrap();
    let mut names: Vec<&str> = data.keys().map(String::as_str).collect();
    names.sort();
    assert_eq!(
        names,
        [
            "fire.c",
            "fire.l_multiplier",
            "fire.mlp.0.bias",
            "fire.mlp.0.weight",
            "fire.mlp.2.bias",
            "fire.mlp.2.weight"
        ]
    );
    assert_eq!(module.c().to_scalar::<f64>().unwrap(), 0.1);
    assert_eq!(module.l_multiplier().to_scalar::<f64>().unwrap(), 1.0);
    assert_eq!(module.mlp().w1.dims(), &[32, 1]);
    assert_eq!(module.mlp().w2.dims(), &[4, 32]);
    let bound = 1.0 / 32f64.sqrt();
    assert!(flat(&module.mlp().w1).iter().all(|v| v.abs() <= 1.0));
    assert!(flat(&module.mlp().w2).iter().all(|v| v.abs() <= bound));
    // Not all equal: drawn, not constant.
    let w2 = flat(&module.mlp().w2);
    assert!(w2.iter().any(|&v| v != w2[0]));
}

/// Shapes 1, 2, 3 and a larger one, for heads and lengths.
#[test]
fn shapes() {
    for heads in [1usize, 2, 3, 16] {
        let fire = Fire::random(FireConfig::new(heads).unwrap(), 5).unwrap();
        let m = FireBias::from_plain(&fire, DType::F32, &Device::Cpu).unwrap();
        for t in [1usize, 2, 3, 300] {
            assert_eq!(
                m.forward(t, t, 0.into(), 0.into()).unwrap().dims(),
                &[1, heads, t, t]
            );
        }
        assert_eq!(
            m.forward(0, 5, 0.into(), 0.into()).unwrap().dims(),
            &[1, heads, 0, 5]
        );
    }
}

#[test]
fn invalid_arguments_are_typed_errors() {
    assert!(matches!(FireConfig::new(0), Err(Error::ZeroHeads)));
    assert!(matches!(
        FireConfig::new(1 << 20),
        Err(Error::InvalidValue { .. })
    ));
    let cfg = FireConfig::new(2).unwrap();
    assert!(matches!(
        cfg.with_mlp_width(0),
        Err(Error::InvalidDimension { .. })
    ));
    assert!(matches!(
        cfg.with_mlp_width(1 << 30),
        Err(Error::InvalidDimension { .. })
    ));
    for (c, l) in [
        (0.0, 512.0),
        (-1.0, 512.0),
        (f64::NAN, 512.0),
        (0.1, 0.0),
        (0.1, f64::INFINITY),
    ] {
        assert!(
            matches!(cfg.with_init(c, l), Err(Error::InvalidFactor { .. })),
            "{c} {l}"
        );
    }
    let mut bad = cfg;
    bad.eps = -1.0;
    assert!(matches!(bad.validate(), Err(Error::InvalidValue { .. })));
    bad.eps = f64::NAN;
    assert!(matches!(bad.validate(), Err(Error::NotFinite { .. })));

    // Plain parameters of the wrong shape, or a second MLP in causal mode.
    let good = Fire::random(cfg, 0).unwrap();
    let mut mlp = good.mlp().clone();
    mlp.w2.pop();
    assert!(matches!(
        Fire::from_params(cfg, 0.1, 1.0, mlp, None),
        Err(Error::Shape { .. })
    ));
    assert!(matches!(
        Fire::from_params(cfg, 0.1, 1.0, good.mlp().clone(), Some(good.mlp().clone())),
        Err(Error::Shape { .. })
    ));
    let nan = FireMlp {
        b1: vec![f64::NAN; 32],
        ..good.mlp().clone()
    };
    assert!(matches!(
        Fire::from_params(cfg, 0.1, 1.0, nan, None),
        Err(Error::NotFinite { .. })
    ));
    assert!(matches!(
        Fire::from_params(cfg, f64::INFINITY, 1.0, good.mlp().clone(), None),
        Err(Error::NotFinite { .. })
    ));
    assert!(matches!(
        good.bias(2, 0, 0),
        Err(Error::InvalidValue { .. })
    ));
    assert!(matches!(
        good.bias(0, u64::MAX, 0),
        Err(Error::PositionOutOfRange { .. })
    ));

    // The module: bad ids, mismatched batches, sizes past the limit.
    let m = FireBias::from_plain(&good, DType::F32, &Device::Cpu).unwrap();
    let dev = Device::Cpu;
    let ids = Tensor::new(&[[0u32, 1, 2]], &dev).unwrap();
    assert!(matches!(
        m.forward(2, 3, (&ids).into(), 0.into()),
        Err(Error::Shape { .. })
    ));
    let f = Tensor::new(&[[0f32, 1., 2.]], &dev).unwrap();
    assert!(matches!(
        m.forward(3, 3, (&f).into(), 0.into()),
        Err(Error::DType { .. })
    ));
    let neg = Tensor::new(&[[0i64, -1, 2]], &dev).unwrap();
    assert!(matches!(
        m.forward(3, 3, (&neg).into(), 0.into()),
        Err(Error::NegativePosition(-1))
    ));
    let two = Tensor::new(&[[0u32, 1, 2], [0, 1, 2]], &dev).unwrap();
    assert!(matches!(
        m.forward(3, 3, (&ids).into(), (&two).into()),
        Err(Error::Shape { .. })
    ));
    let huge = Tensor::new(&[[i64::MAX, 0, 1]], &dev).unwrap();
    assert!(m.forward(3, 3, (&huge).into(), 0.into()).is_ok());
    assert!(matches!(
        m.forward(1 << 20, 1 << 20, 0.into(), 0.into()),
        Err(Error::InvalidValue { .. })
    ));
    assert!(matches!(
        m.forward(2, 2, usize::MAX.into(), 0.into()),
        Err(Error::PositionOutOfRange { .. })
    ));
}

/// Values and gradients against FIRE computed by PyTorch as the paper's
/// reference code does (`scripts/learned/gen_learned_fixtures.py`): every
/// entry of a 10-token grid, queries on both sides of the threshold.
#[test]
fn matches_pytorch_reference() {
    use learned_common::{assert_close, json_flat, json_tensor, torch_fixture};
    let fx = torch_fixture();
    let f = &fx["fire"];
    let (h, w, t) = (3usize, 5usize, 10usize);
    assert_eq!(f["heads"].as_u64(), Some(h as u64));
    let cfg = FireConfig::new(h)
        .unwrap()
        .with_mlp_width(w)
        .unwrap()
        .with_init(f["c"].as_f64().unwrap(), f["init_l"].as_f64().unwrap())
        .unwrap();
    let mlp = FireMlp {
        w1: json_flat(&f["w1"]),
        b1: json_flat(&f["b1"]),
        w2: json_flat(&f["w2"]).chunks(w).map(<[f64]>::to_vec).collect(),
        b2: json_flat(&f["b2"]),
    };
    let l_mult = f["l_multiplier"].as_f64().unwrap();
    let c = f["c"].as_f64().unwrap();
    let plain = Fire::from_params(cfg, c, l_mult, mlp.clone(), None).unwrap();
    let want = json_flat(&f["bias"]);
    let mut got = Vec::new();
    for hi in 0..h {
        for i in 0..t as u64 {
            for j in 0..t as u64 {
                got.push(plain.bias(hi, i, j).unwrap());
            }
        }
    }
    assert_close("plain FIRE bias", &got, &want, 1e-12);

    // The module, with its parameters set to the reference's, in f64.
    let (vm, module) = fire_varmap(cfg);
    {
        let data = vm.data().lock().unwrap();
        let set = |name: &str, v: Tensor| data[name].set(&v).unwrap();
        set("fire.c", Tensor::new(c, &Device::Cpu).unwrap());
        set(
            "fire.l_multiplier",
            Tensor::new(l_mult, &Device::Cpu).unwrap(),
        );
        set("fire.mlp.0.weight", json_tensor(&f["w1"], &[w, 1]));
        set("fire.mlp.0.bias", json_tensor(&f["b1"], &[w]));
        set("fire.mlp.2.weight", json_tensor(&f["w2"], &[h, w]));
        set("fire.mlp.2.bias", json_tensor(&f["b2"], &[h]));
    }
    let bias = module.forward(t, t, 0.into(), 0.into()).unwrap();
    assert_close("FIRE bias", &flat(&bias), &want, 1e-12);
    let lw = json_tensor(&f["loss_weight"], &[1, h, t, t]);
    let grads = (bias * lw).unwrap().sum_all().unwrap().backward().unwrap();
    let data = vm.data().lock().unwrap();
    let g = |name: &str| flat(grads.get(data[name].as_tensor()).unwrap());
    let gr = &f["grad"];
    // (the fixture's name, the module's parameter) of every gradient
    for (key, param) in [
        ("c", "fire.c"),
        ("l_multiplier", "fire.l_multiplier"),
        ("w1", "fire.mlp.0.weight"),
        ("b1", "fire.mlp.0.bias"),
        ("w2", "fire.mlp.2.weight"),
        ("b2", "fire.mlp.2.bias"),
    ] {
        let what = format!("grad {key}");
        assert_close(&what, &g(param), &json_flat(&gr[key]), 1e-10);
    }
}
