//! CoPE (Golovneva et al. 2024): the candle module against the plain `f64`
//! reference (every batch entry and head, causal and unmasked, both scales,
//! offsets and per-row ids), gradients with respect to the queries, the keys
//! and the table against central finite differences, KV-cache slices,
//! causal semantics and typed errors.

#![allow(clippy::needless_range_loop)]

use crate::learned_common;

use candle_core::{DType, Device, Tensor, Var};
use candle_nn::{VarBuilder, VarMap};
use learned_common::{check_grads, det_tensor, flat};
use posenc::relative::cope::{Cope, CopeConfig, CopeInputs};
use posenc::tensor::cope::CopeBias;
use posenc::Error;

/// A random plain CoPE of `cfg` (seed `seed`) and the candle module with
/// its table, in `dtype`.
fn random_pair(cfg: CopeConfig, seed: u64, dtype: DType) -> (Cope, CopeBias) {
    let cope = Cope::random(cfg, seed).unwrap();
    let module = CopeBias::from_plain(&cope, dtype, &Device::Cpu).unwrap();
    (cope, module)
}

/// Deterministic queries `(B, H, T_q, D)` and keys `(B, H, T_k, D)` for
/// `[B, H, T_q, T_k, D]`, of seeds `q_seed` and `k_seed` (scale 2).
fn queries_keys([b, h, tq, tk, d]: [usize; 5], q_seed: f64, k_seed: f64) -> (Tensor, Tensor) {
    (
        det_tensor(&[b, h, tq, d], q_seed, 2.0),
        det_tensor(&[b, h, tk, d], k_seed, 2.0),
    )
}

fn rows(t: &Tensor) -> Vec<Vec<f64>> {
    t.to_dtype(DType::F64).unwrap().to_vec2().unwrap()
}

/// The `(b, h)` slice of a `(B, H, T, X)` tensor as rows.
fn slice(t: &Tensor, b: usize, h: usize) -> Vec<Vec<f64>> {
    rows(&t.get(b).unwrap().get(h).unwrap())
}

fn configs() -> Vec<CopeConfig> {
    let mut out = Vec::new();
    for (d, npos) in [(4usize, 1usize), (4, 4), (8, 64), (3, 7)] {
        for causal in [true, false] {
            for div in [true, false] {
                out.push(
                    CopeConfig::new(d, npos)
                        .unwrap()
                        .with_causal(causal)
                        .with_divide_by_sqrt_d(div),
                );
            }
        }
    }
    out
}

/// The module's `bias` equals the plain logits term for every batch entry
/// and head, with positions per batch row from `qpos`, `kpos`.
fn check_against_plain(
    cope: &Cope,
    q: &Tensor,
    k: &Tensor,
    qpos: &dyn Fn(usize) -> Vec<u64>,
    kpos: &dyn Fn(usize) -> Vec<u64>,
    bias: &Tensor,
    tol: f64,
) {
    let (b, h) = (q.dim(0).unwrap(), q.dim(1).unwrap());
    assert_eq!(bias.dims(), &[b, h, q.dim(2).unwrap(), k.dim(2).unwrap()]);
    for bi in 0..b {
        for hi in 0..h {
            let (qs, ks) = (slice(q, bi, hi), slice(k, bi, hi));
            let want = cope
                .logits_term(CopeInputs {
                    q: &qs,
                    k: &ks,
                    q_pos: &qpos(bi),
                    k_pos: &kpos(bi),
                })
                .unwrap();
            let got = slice(bias, bi, hi);
            for i in 0..want.len() {
                for j in 0..want[i].len() {
                    assert!(
                        (got[i][j] - want[i][j]).abs() <= tol * (1.0 + want[i][j].abs()),
                        "b {bi} h {hi} i {i} j {j}: {} vs {}",
                        got[i][j],
                        want[i][j]
                    );
                }
            }
        }
    }
}

#[test]
fn tensor_equals_plain_for_offsets() {
    for (n, cfg) in configs().into_iter().enumerate() {
        let (cope, module) = random_pair(cfg, n as u64, DType::F64);
        let d = cfg.head_dim;
        for t in [1usize, 2, 3, 40] {
            // Scale 3: gates spread over (0, 1), positions past npos clamp.
            let q = det_tensor(&[2, 3, t, d], 0.1 + n as f64, 3.0);
            let k = det_tensor(&[2, 3, t, d], 0.7 + n as f64, 3.0);
            let bias = module.bias(&q, &k, 0.into(), 0.into()).unwrap();
            let pos = |_| (0..t as u64).collect::<Vec<_>>();
            check_against_plain(&cope, &q, &k, &pos, &pos, &bias, 1e-12);
            // Positions too.
            let gl = (q.matmul(&k.t().unwrap()).unwrap() / (d as f64).sqrt()).unwrap();
            let p = module.positions(&gl, 0.into(), 0.into()).unwrap();
            let want = cope
                .positions(&slice(&q, 1, 2), &slice(&k, 1, 2), &pos(0), &pos(0))
                .unwrap();
            let got = slice(&p, 1, 2);
            for i in 0..t {
                for j in 0..t {
                    assert!((got[i][j] - want[i][j]).abs() < 1e-12);
                }
            }
        }
    }
}

#[test]
fn tensor_equals_plain_for_per_row_ids() {
    let (cope, module) = random_pair(CopeConfig::new(4, 6).unwrap(), 9, DType::F64);
    let (q, k) = queries_keys([2, 2, 3, 5, 4], 0.2, 0.5);
    // Row 0: queries 2..5 against keys 0..5; row 1 left-padded: keys at
    // 0, 0, 1, 2, 3 and queries 1..4.
    let q_ids: Vec<i64> = vec![2, 3, 4, 1, 2, 3];
    let k_ids: Vec<i64> = vec![0, 1, 2, 3, 4, 0, 0, 1, 2, 3];
    let qi = Tensor::from_vec(q_ids.clone(), (2, 3), &Device::Cpu).unwrap();
    let ki = Tensor::from_vec(k_ids.clone(), (2, 5), &Device::Cpu).unwrap();
    let bias = module.bias(&q, &k, (&qi).into(), (&ki).into()).unwrap();
    let qpos = |b: usize| q_ids[b * 3..b * 3 + 3].iter().map(|&p| p as u64).collect();
    let kpos = |b: usize| k_ids[b * 5..b * 5 + 5].iter().map(|&p| p as u64).collect();
    check_against_plain(&cope, &q, &k, &qpos, &kpos, &bias, 1e-12);
}

#[test]
fn f32_module_is_close_to_plain() {
    let (cope, module) = random_pair(CopeConfig::new(8, 16).unwrap(), 4, DType::F32);
    let (q64, k64) = queries_keys([1, 2, 33, 33, 8], 0.3, 0.6);
    let q = q64.to_dtype(DType::F32).unwrap();
    let k = k64.to_dtype(DType::F32).unwrap();
    let bias = module.bias(&q, &k, 0.into(), 0.into()).unwrap();
    assert_eq!(bias.dtype(), DType::F32);
    let pos = |_| (0..33u64).collect::<Vec<_>>();
    check_against_plain(&cope, &q64, &k64, &pos, &pos, &bias, 1e-4);
}

/// Known values: q·k = 0 makes every gate ½, so a visible key j is at
/// (i − j + 1)/2, clamped at P − 1; a masked key is at 0 and gets z_i[0].
#[test]
fn half_gates_count_half_positions() {
    let cfg = CopeConfig::new(2, 3).unwrap();
    let table = vec![vec![10.0, 0.0], vec![20.0, 0.0], vec![30.0, 0.0]];
    let cope = Cope::from_table(cfg, table).unwrap();
    let module = CopeBias::from_plain(&cope, DType::F64, &Device::Cpu).unwrap();
    let t = 8;
    let q = Tensor::from_vec(
        (0..t).flat_map(|_| [1.0f64, 0.0]).collect::<Vec<_>>(),
        (1, 1, t, 2),
        &Device::Cpu,
    )
    .unwrap();
    let k = Tensor::from_vec(
        (0..t).flat_map(|_| [0.0f64, 1.0]).collect::<Vec<_>>(),
        (1, 1, t, 2),
        &Device::Cpu,
    )
    .unwrap();
    let gl = q.matmul(&k.t().unwrap()).unwrap();
    let p = slice(&module.positions(&gl, 0.into(), 0.into()).unwrap(), 0, 0);
    let b = slice(&module.bias(&q, &k, 0.into(), 0.into()).unwrap(), 0, 0);
    for i in 0..t {
        for j in 0..t {
            let want_p = if j <= i {
                ((i - j + 1) as f64 / 2.0).min(2.0)
            } else {
                0.0
            };
            assert_eq!(p[i][j], want_p, "p[{i}][{j}]");
            // z[p] = 10·(p + 1) on the grid, linear in between.
            let want_b = 10.0 * (want_p + 1.0) / 2f64.sqrt();
            assert!((b[i][j] - want_b).abs() < 1e-12, "bias[{i}][{j}]");
        }
    }
}

/// A query slice at positions p..p + Tq against all keys (a KV cache) is
/// the corresponding rows of the full computation; with the causal mask,
/// keys after a query change nothing in its visible entries.
#[test]
fn query_slice_and_causality() {
    for cfg in configs().into_iter().filter(|c| c.causal) {
        let (_, module) = random_pair(cfg, 2, DType::F64);
        let d = cfg.head_dim;
        let q = det_tensor(&[2, 2, 12, d], 0.25, 2.0);
        let k = det_tensor(&[2, 2, 12, d], 0.85, 2.0);
        let full = module.bias(&q, &k, 0.into(), 0.into()).unwrap();
        for (start, len) in [(7usize, 3usize), (11, 1), (0, 12)] {
            let qs = q.narrow(2, start, len).unwrap();
            let part = module.bias(&qs, &k, start.into(), 0.into()).unwrap();
            let want = full.narrow(2, start, len).unwrap();
            let diff = flat(&(part - want).unwrap().abs().unwrap());
            assert!(diff.iter().all(|&x| x < 1e-13), "slice {start}+{len}");
        }
        // Change the keys after query 5: rows 0..=5, columns 0..=5 unchanged.
        let k2 = Tensor::cat(
            &[
                k.narrow(2, 0, 6).unwrap(),
                det_tensor(&[2, 2, 6, d], 9.0, 5.0),
            ],
            2,
        )
        .unwrap();
        let other = module.bias(&q, &k2, 0.into(), 0.into()).unwrap();
        for b in 0..2 {
            for h in 0..2 {
                let (x, y) = (slice(&full, b, h), slice(&other, b, h));
                for i in 0..6 {
                    for j in 0..=i {
                        assert!((x[i][j] - y[i][j]).abs() < 1e-13);
                    }
                }
            }
        }
    }
}

/// Without the mask (the reference's encoder path) every key's position
/// counts to the end of the keys: the future matters.
#[test]
fn unmasked_counts_to_the_end() {
    let cfg = CopeConfig::new(4, 64).unwrap().with_causal(false);
    let cope = Cope::random(cfg, 3).unwrap();
    let q = rows(&det_tensor(&[3, 4], 0.1, 1.0));
    let k = rows(&det_tensor(&[5, 4], 0.2, 1.0));
    let g = cope
        .gates(CopeInputs {
            q: &q,
            k: &k,
            q_pos: &[0, 1, 2],
            k_pos: &[0, 1, 2, 3, 4],
        })
        .unwrap();
    let p = cope
        .positions(&q, &k, &[0, 1, 2], &[0, 1, 2, 3, 4])
        .unwrap();
    for i in 0..3 {
        assert!((p[i][0] - g[i].iter().sum::<f64>()).abs() < 1e-15);
        assert!((p[i][4] - g[i][4]).abs() < 1e-15);
    }
}

#[test]
fn bias_from_gate_logits_equals_bias() {
    let (_, module) = random_pair(CopeConfig::new(4, 8).unwrap(), 5, DType::F64);
    let (q, k) = queries_keys([2, 3, 6, 9, 4], 0.3, 0.4);
    let gl = (q.matmul(&k.t().unwrap()).unwrap() / 2.0).unwrap();
    let a = module.bias(&q, &k, 3.into(), 0.into()).unwrap();
    let b = module
        .bias_from_gate_logits(&q, &gl, 3.into(), 0.into())
        .unwrap();
    assert_eq!(flat(&a), flat(&b));
}

/// Gradients with respect to q, k and the table against central finite
/// differences (f64), causal and unmasked, with a query slice, for the
/// fused op and the composed path.
#[test]
fn gradients_match_finite_differences() {
    for causal in [true, false] {
        let cfg = CopeConfig::new(3, 4).unwrap().with_causal(causal);
        let vm = VarMap::new();
        let vb = VarBuilder::from_varmap(&vm, DType::F64, &Device::Cpu);
        let fused = CopeBias::new(cfg, vb.pp("cope")).unwrap();
        let composed = fused.clone().with_fused(false);
        // Random table (the reference starts at zero, where the gates get
        // no gradient).
        let table = vm.data().lock().unwrap()["cope.pos_emb"].clone();
        table.set(&det_tensor(&[3, 4], 0.9, 1.0)).unwrap();
        let q = Var::from_tensor(&det_tensor(&[2, 2, 4, 3], 0.15, 1.5)).unwrap();
        let k = Var::from_tensor(&det_tensor(&[2, 2, 7, 3], 0.55, 1.5)).unwrap();
        let w = det_tensor(&[2, 2, 4, 7], 0.35, 1.0);
        for module in [&fused, &composed] {
            let loss = || {
                let b = module
                    .bias(q.as_tensor(), k.as_tensor(), 3.into(), 0.into())
                    .unwrap();
                (b * &w).unwrap().sum_all().unwrap()
            };
            let largest = check_grads(
                &[("table", &table), ("q", &q), ("k", &k)],
                &loss,
                1e-6,
                1e-6,
            );
            assert!(largest.iter().all(|&g| g > 1e-4), "{largest:?}");
        }
    }
}

#[test]
fn zero_initialisation_from_varbuilder() {
    let vm = VarMap::new();
    let vb = VarBuilder::from_varmap(&vm, DType::F32, &Device::Cpu);
    let module = CopeBias::new(CopeConfig::new(8, 10).unwrap(), vb.pp("cope")).unwrap();
    assert_eq!(module.table().dims(), &[8, 10]);
    assert!(vm.data().lock().unwrap().contains_key("cope.pos_emb"));
    let q = Tensor::randn(0f32, 1.0, (1, 2, 4, 8), &Device::Cpu).unwrap();
    let bias = module.bias(&q, &q, 0.into(), 0.into()).unwrap();
    assert!(flat(&bias).iter().all(|&v| v == 0.0));
    // The table still gets a gradient.
    let g = bias.sum_all().unwrap().backward().unwrap();
    let gt = flat(g.get(module.table()).unwrap());
    assert!(gt.iter().any(|&v| v != 0.0));
}

#[test]
fn shapes() {
    for h in [1usize, 2, 3, 8] {
        let cfg = CopeConfig::new(4, 16).unwrap();
        let (_, module) = random_pair(cfg, 1, DType::F32);
        for t in [1usize, 2, 3, 200] {
            let q = Tensor::randn(0f32, 1.0, (2, h, t, 4), &Device::Cpu).unwrap();
            let b = module.bias(&q, &q, 0.into(), 0.into()).unwrap();
            assert_eq!(b.dims(), &[2, h, t, t]);
        }
        // No queries (or no keys): an empty bias.
        let q = Tensor::randn(0f32, 1.0, (2, h, 3, 4), &Device::Cpu).unwrap();
        let none = q.narrow(2, 0, 0).unwrap();
        let b = module.bias(&none, &q, 3.into(), 0.into()).unwrap();
        assert_eq!(b.dims(), &[2, h, 0, 3]);
        let b = module.bias(&q, &none, 0.into(), 0.into()).unwrap();
        assert_eq!(b.dims(), &[2, h, 3, 0]);
    }
}

#[test]
fn invalid_arguments_are_typed_errors() {
    for (d, npos) in [(0, 4), (4, 0), (1 << 17, 4), (1 << 16, 1 << 16)] {
        assert!(
            matches!(
                CopeConfig::new(d, npos),
                Err(Error::InvalidDimension { .. })
            ),
            "d {d}, npos {npos}"
        );
    }
    let cfg = CopeConfig::new(2, 3).unwrap();
    assert!(matches!(
        Cope::from_table(cfg, vec![vec![0.0; 2]; 2]),
        Err(Error::Shape { .. })
    ));
    assert!(matches!(
        Cope::from_table(cfg, vec![vec![f64::NAN, 0.0]; 3]),
        Err(Error::NotFinite { .. })
    ));
    let cope = Cope::zeros(cfg).unwrap();
    assert!(matches!(
        cope.gates(CopeInputs {
            q: &[vec![0.0; 3]],
            k: &[vec![0.0; 2]],
            q_pos: &[0],
            k_pos: &[0],
        }),
        Err(Error::Shape { .. })
    ));
    assert!(matches!(
        cope.gates(CopeInputs {
            q: &[vec![0.0; 2]],
            k: &[vec![0.0; 2]],
            q_pos: &[0, 1],
            k_pos: &[0],
        }),
        Err(Error::Shape { .. })
    ));
    let m = CopeBias::from_plain(&cope, DType::F32, &Device::Cpu).unwrap();
    let dev = Device::Cpu;
    let q = Tensor::zeros((1, 2, 3, 2), DType::F32, &dev).unwrap();
    let bad_d = Tensor::zeros((1, 2, 3, 4), DType::F32, &dev).unwrap();
    let bad_h = Tensor::zeros((1, 3, 3, 2), DType::F32, &dev).unwrap();
    let rank3 = Tensor::zeros((2, 3, 2), DType::F32, &dev).unwrap();
    for (a, b) in [(&bad_d, &q), (&q, &bad_d), (&q, &bad_h), (&rank3, &q)] {
        assert!(matches!(
            m.bias(a, b, 0.into(), 0.into()),
            Err(Error::Shape { .. })
        ));
    }
    let ids = Tensor::new(&[[0u32, 1]], &dev).unwrap();
    assert!(matches!(
        m.bias(&q, &q, (&ids).into(), 0.into()),
        Err(Error::Shape { .. })
    ));
    let two_rows = Tensor::new(&[[0u32, 1, 2], [0, 1, 2]], &dev).unwrap();
    assert!(matches!(
        m.bias(&q, &q, (&two_rows).into(), 0.into()),
        Err(Error::Shape { .. })
    ));
    let neg = Tensor::new(&[[0i64, -4, 2]], &dev).unwrap();
    assert!(matches!(
        m.bias(&q, &q, (&neg).into(), 0.into()),
        Err(Error::NegativePosition(-4))
    ));
    let gl = Tensor::zeros((1, 2, 2, 3), DType::F32, &dev).unwrap();
    assert!(matches!(
        m.bias_from_gate_logits(&q, &gl, 0.into(), 0.into()),
        Err(Error::Shape { .. })
    ));
}

/// Values and gradients against CoPE computed by PyTorch as the paper's
/// reference code does (`scripts/learned/gen_learned_fixtures.py`), causal
/// and unmasked, with positions clamped at npos − 1.
#[test]
fn matches_pytorch_reference() {
    use learned_common::{assert_close, assert_grads, json_flat, json_tensor, torch_fixture};
    let fx = torch_fixture();
    for case in fx["cope"].as_array().unwrap() {
        let u = |k: &str| case[k].as_u64().unwrap() as usize;
        let (b, h, t, d, npos) = (u("b"), u("h"), u("t"), u("d"), u("npos"));
        let causal = case["causal"].as_bool().unwrap();
        let cfg = CopeConfig::new(d, npos).unwrap().with_causal(causal);
        let table: Vec<Vec<f64>> = json_flat(&case["table"])
            .chunks(d)
            .map(<[f64]>::to_vec)
            .collect();
        let plain = Cope::from_table(cfg, table).unwrap();
        let q = Var::from_tensor(&json_tensor(&case["q"], &[b, h, t, d])).unwrap();
        let k = Var::from_tensor(&json_tensor(&case["k"], &[b, h, t, d])).unwrap();
        let pos: Vec<u64> = (0..t as u64).collect();
        let mut plain_bias = Vec::new();
        let mut plain_pos = Vec::new();
        for bi in 0..b {
            for hi in 0..h {
                let (qs, ks) = (slice(&q, bi, hi), slice(&k, bi, hi));
                plain_bias.extend(
                    plain
                        .logits_term(CopeInputs {
                            q: &qs,
                            k: &ks,
                            q_pos: &pos,
                            k_pos: &pos,
                        })
                        .unwrap()
                        .concat(),
                );
                plain_pos.extend(plain.positions(&qs, &ks, &pos, &pos).unwrap().concat());
            }
        }
        let want = json_flat(&case["bias"]);
        assert_close(
            "plain CoPE positions",
            &plain_pos,
            &json_flat(&case["positions"]),
            1e-12,
        );
        assert_close("plain CoPE bias", &plain_bias, &want, 1e-12);

        let vm = VarMap::new();
        let vb = VarBuilder::from_varmap(&vm, DType::F64, &Device::Cpu);
        let module = CopeBias::new(cfg, vb.pp("cope")).unwrap();
        let tv = vm.data().lock().unwrap()["cope.pos_emb"].clone();
        tv.set(
            &json_tensor(&case["table"], &[npos, d])
                .t()
                .unwrap()
                .contiguous()
                .unwrap(),
        )
        .unwrap();
        let bias = module
            .bias(q.as_tensor(), k.as_tensor(), 0.into(), 0.into())
            .unwrap();
        assert_close("CoPE bias", &flat(&bias), &want, 1e-12);
        let lw = json_tensor(&case["loss_weight"], &[b, h, t, t]);
        let grads = (bias * lw).unwrap().sum_all().unwrap().backward().unwrap();
        let gr = &case["grad"];
        assert_grads(
            &grads,
            gr,
            &[("q", q.as_tensor()), ("k", k.as_tensor())],
            1e-10,
        );
        let gt = grads.get(tv.as_tensor()).unwrap().t().unwrap();
        assert_close("grad table", &flat(&gt), &json_flat(&gr["table"]), 1e-10);
    }
}

/// The fused CPU op and the composed candle path agree in value and
/// gradient (f64 and f32), causal with per-row ids and unmasked, with
/// positions past npos (clamped).
#[test]
fn fused_equals_composed() {
    for (causal, dtype, tol) in [
        (true, DType::F64, 1e-12),
        (false, DType::F64, 1e-12),
        (true, DType::F32, 1e-4),
    ] {
        let cfg = CopeConfig::new(8, 6).unwrap().with_causal(causal);
        let cope = Cope::random(cfg, 8).unwrap();
        let fused = CopeBias::from_plain(&cope, dtype, &Device::Cpu).unwrap();
        let composed = fused.clone().with_fused(false);
        let q = Var::from_tensor(
            &det_tensor(&[2, 3, 17, 8], 0.1, 2.0)
                .to_dtype(dtype)
                .unwrap(),
        )
        .unwrap();
        let k = Var::from_tensor(
            &det_tensor(&[2, 3, 20, 8], 0.2, 2.0)
                .to_dtype(dtype)
                .unwrap(),
        )
        .unwrap();
        let q_ids = Tensor::from_vec(
            (0..34u32)
                .map(|i| i % 17 + 3 * (i / 17))
                .collect::<Vec<_>>(),
            (2, 17),
            &Device::Cpu,
        )
        .unwrap();
        let w = det_tensor(&[2, 3, 17, 20], 0.3, 1.0)
            .to_dtype(dtype)
            .unwrap();
        let run = |m: &CopeBias| {
            let b = m.bias(&q, &k, (&q_ids).into(), 0.into()).unwrap();
            let g = (&b * &w).unwrap().sum_all().unwrap().backward().unwrap();
            let gq = flat(g.get(&q).unwrap());
            let gk = flat(g.get(&k).unwrap());
            // candle also returns the gradient of the matmul's constant
            // operand, the table.
            let gt = flat(g.get(m.table()).unwrap());
            (flat(&b), gq, gk, gt)
        };
        let (a, b) = (run(&fused), run(&composed));
        for (what, x, y) in [
            ("bias", &a.0, &b.0),
            ("dq", &a.1, &b.1),
            ("dk", &a.2, &b.2),
            ("dtable", &a.3, &b.3),
        ] {
            assert_eq!(x.len(), y.len());
            for (i, (u, v)) in x.iter().zip(y).enumerate() {
                assert!(
                    (u - v).abs() <= tol * (1.0 + v.abs()),
                    "{what}[{i}]: {u} vs {v}"
                );
            }
        }
    }
}
