//! `posenc::tensor::rope::Rope` on candle tensors: fused paths against the
//! composed-ops reference and the f64 loop of `RopeFrequencies::rotate`,
//! gradients, errors, length-dependent schedules, the cache.

use candle_core::{DType, Device, Tensor, Var};
use posenc::rope::{PairLayout, RopeFrequencies};
use posenc::tensor::rope::{FrequencySchedule, HeadLayout, Positions, Role, Rope};
use posenc::Error;

use crate::common;
use common::{assert_heads_rotated, dims, vals, Rng};

const CPU: Device = Device::Cpu;

fn ids_tensor(rng: &mut Rng, b: usize, t: usize, max: u64, dtype: DType) -> Tensor {
    let v: Vec<u32> = (0..b * t).map(|_| rng.below(max) as u32).collect();
    Tensor::from_vec(v, (b, t), &CPU)
        .unwrap()
        .to_dtype(dtype)
        .unwrap()
}

#[allow(clippy::too_many_arguments)]
fn compare(
    rng: &mut Rng,
    layout: HeadLayout,
    pairs: PairLayout,
    dtype: DType,
    (b, hq, hk, t, d): (usize, usize, usize, usize, usize),
    rd: usize,
    xpos: bool,
    ids: Option<DType>,
) {
    let f = RopeFrequencies::plain(10000.0, rd, pairs).unwrap();
    let mut rope = Rope::new(f).unwrap().with_layout(layout);
    let mut mag = 4.0;
    if xpos {
        rope = rope.with_xpos(256.0).unwrap();
        // |ζ^(±p/256)| ≤ (0.4/1.4)^(-200/256) < 2.7 at the positions below
        mag *= 2.7;
    }
    let q = rng.tensor(&dims(layout, b, hq, t, d), dtype);
    let k = rng.tensor(&dims(layout, b, hk, t, d), dtype);
    let idt;
    let pos: Positions = match ids {
        Some(dt) => {
            idt = ids_tensor(rng, b, t, 200, dt);
            Positions::Ids(&idt)
        }
        None => Positions::Offset(rng.below(50) as usize),
    };
    let ctx = format!("{layout} {pairs} {dtype:?} b={b} hq={hq} hk={hk} t={t} d={d} rd={rd} xpos={xpos} ids={ids:?}");
    let (rq, rk) = rope.apply_reference(&q, &k, pos).unwrap();
    let (fq, fk) = rope.apply(&q, &k, pos).unwrap();
    assert_close(&fq, &rq, dtype, mag, &ctx);
    assert_close(&fk, &rk, dtype, mag, &ctx);
    // single-tensor variants
    assert_close(
        &rope.rotate(&q, pos, Role::Query).unwrap(),
        &rq,
        dtype,
        mag,
        &ctx,
    );
    assert_close(
        &rope.rotate(&k, pos, Role::Key).unwrap(),
        &rk,
        dtype,
        mag,
        &ctx,
    );
    // in place gives bit for bit what out of place gives
    let (iq, ik) = (q.copy().unwrap(), k.copy().unwrap());
    rope.apply_inplace(&iq, &ik, pos).unwrap();
    assert_eq!(vals(&iq), vals(&fq), "{ctx} in place");
    assert_eq!(vals(&ik), vals(&fk), "{ctx} in place");
}

const EDGES: [usize; 6] = [1, 2, 3, 127, 128, 129];

#[test]
fn fused_matches_reference_every_layout_dtype_and_edge_size() {
    let mut rng = Rng(0x2545_F491_4F6C_DD1D);
    for layout in [HeadLayout::Bhtd, HeadLayout::Bthd] {
        for pairs in [PairLayout::HalfSplit, PairLayout::Interleaved] {
            for dtype in [DType::F32, DType::F16, DType::BF16] {
                for (i, &t) in EDGES.iter().enumerate() {
                    let ids = [None, Some(DType::U32), Some(DType::I64)][i % 3];
                    compare(
                        &mut rng,
                        layout,
                        pairs,
                        dtype,
                        (2, 3, 1, t, 32),
                        32,
                        i % 2 == 0,
                        ids,
                    );
                }
                for (i, &h) in EDGES.iter().enumerate() {
                    compare(
                        &mut rng,
                        layout,
                        pairs,
                        dtype,
                        (1, h, 2, 3, 16),
                        16,
                        false,
                        [None, Some(DType::I64)][i % 2],
                    );
                }
                for d in [2usize, 128] {
                    compare(
                        &mut rng,
                        layout,
                        pairs,
                        dtype,
                        (2, 2, 1, 3, d),
                        d,
                        true,
                        Some(DType::U32),
                    );
                }
                // partial rotary: rotary_dim < head_dim
                for (d, rd) in [(128, 64), (130, 32), (6, 2), (128, 126)] {
                    compare(
                        &mut rng,
                        layout,
                        pairs,
                        dtype,
                        (2, 1, 3, 2, d),
                        rd,
                        d == 6,
                        None,
                    );
                }
            }
        }
    }
}

#[test]
fn fused_matches_f64_rotate_of_rope_frequencies() {
    // Independent of both the cache and the reference: one f64 head at a
    // time through RopeFrequencies::rotate (with an attention factor).
    let mut rng = Rng(99);
    for pairs in [PairLayout::HalfSplit, PairLayout::Interleaved] {
        let f = RopeFrequencies::new(
            "yarn-like",
            RopeFrequencies::plain(500000.0, 48, pairs)
                .unwrap()
                .inv_freq,
            1.1,
            pairs,
        )
        .unwrap();
        for layout in [HeadLayout::Bhtd, HeadLayout::Bthd] {
            let rope = Rope::new(f.clone()).unwrap().with_layout(layout);
            let (b, h, t, d) = (2, 3, 4, 64);
            let x = rng.tensor(&dims(layout, b, h, t, d), DType::F32);
            let ids =
                Tensor::from_vec(vec![0u32, 7, 100_000, 3, 65_535, 9, 2, 1], (b, t), &CPU).unwrap();
            let y = vals(&rope.rotate(&x, &ids, Role::Query).unwrap());
            let xv = vals(&x);
            let idv: Vec<u32> = ids.flatten_all().unwrap().to_vec1().unwrap();
            let ctx = format!("{pairs} {layout}");
            assert_heads_rotated(&xv, &y, layout, [b, h, t, d], 2e-6, &ctx, |bi, ti, head| {
                f.rotate(head, idv[bi * t + ti] as u64).unwrap();
            });
        }
    }
}

fn grads_of(
    rope: &Rope,
    q: &Tensor,
    k: &Tensor,
    wq: &Tensor,
    wk: &Tensor,
    pos: Positions,
    fused: bool,
) -> (Vec<f32>, Vec<f32>) {
    let qv = Var::from_tensor(q).unwrap();
    let kv = Var::from_tensor(k).unwrap();
    let (a, b) = if fused {
        rope.apply(qv.as_tensor(), kv.as_tensor(), pos).unwrap()
    } else {
        rope.apply_reference(qv.as_tensor(), kv.as_tensor(), pos)
            .unwrap()
    };
    // a loss that is not symmetric in q and k, with a product term
    let loss = ((a * wq).unwrap().sum_all().unwrap()
        + (b.sqr().unwrap() * wk).unwrap().sum_all().unwrap())
    .unwrap();
    let g = loss.backward().unwrap();
    (
        vals(g.get(qv.as_tensor()).expect("no gradient for q")),
        vals(g.get(kv.as_tensor()).expect("no gradient for k")),
    )
}

#[test]
fn backward_matches_reference_gradients() {
    let mut rng = Rng(7);
    for layout in [HeadLayout::Bhtd, HeadLayout::Bthd] {
        for pairs in [PairLayout::HalfSplit, PairLayout::Interleaved] {
            for xpos in [false, true] {
                let f = RopeFrequencies::plain(10000.0, 24, pairs).unwrap();
                let mut rope = Rope::new(f).unwrap().with_layout(layout);
                if xpos {
                    rope = rope.with_xpos(512.0).unwrap();
                }
                let (b, hq, hk, t, d) = (2, 4, 2, 5, 32);
                let q = rng.tensor(&dims(layout, b, hq, t, d), DType::F32);
                let k = rng.tensor(&dims(layout, b, hk, t, d), DType::F32);
                let wq = rng.tensor(&dims(layout, b, hq, t, d), DType::F32);
                let wk = rng.tensor(&dims(layout, b, hk, t, d), DType::F32);
                let ids = ids_tensor(&mut rng, b, t, 300, DType::I64);
                for pos in [Positions::Offset(17), Positions::Ids(&ids)] {
                    let (gq, gk) = grads_of(&rope, &q, &k, &wq, &wk, pos, true);
                    let (rq, rk) = grads_of(&rope, &q, &k, &wq, &wk, pos, false);
                    for (a, r) in gq.iter().zip(&rq).chain(gk.iter().zip(&rk)) {
                        assert!(
                            (a - r).abs() <= 1e-5,
                            "{layout} {pairs} xpos={xpos}: {a} vs {r}"
                        );
                    }
                    // and the gradient is not trivially zero
                    assert!(gq.iter().any(|v| v.abs() > 1e-3));
                }
            }
        }
    }
}

#[test]
fn candle_nn_rope_drops_gradients() {
    // Measured: candle-nn 0.11's fused rope is applied with apply_op3_no_bwd,
    // so backward() yields no gradient for its input, where the composed
    // rope_slow and posenc's fused rope both do.
    let mut rng = Rng(3);
    let (b, h, t, d) = (1, 2, 3, 8);
    let x = Var::from_tensor(&rng.tensor(&[b, h, t, d], DType::F32)).unwrap();
    let w = rng.tensor(&[b, h, t, d], DType::F32);
    let f = RopeFrequencies::plain(10000.0, d, PairLayout::HalfSplit).unwrap();
    let (c, s) = f.cos_sin_table(&[0, 1, 2]);
    let cos = Tensor::from_vec(c, (t, d / 2), &CPU).unwrap();
    let sin = Tensor::from_vec(s, (t, d / 2), &CPU).unwrap();

    let y = candle_nn::rotary_emb::rope(x.as_tensor(), &cos, &sin).unwrap();
    let g = (y * &w).unwrap().sum_all().unwrap().backward().unwrap();
    assert!(
        g.get(x.as_tensor()).is_none(),
        "candle-nn rope now has a backward pass"
    );

    let y = candle_nn::rotary_emb::rope_slow(x.as_tensor(), &cos, &sin).unwrap();
    let g = (y * &w).unwrap().sum_all().unwrap().backward().unwrap();
    let slow = vals(g.get(x.as_tensor()).unwrap());

    let rope = Rope::new(f).unwrap();
    let y = rope.rotate(x.as_tensor(), 0, Role::Query).unwrap();
    let g = (y * &w).unwrap().sum_all().unwrap().backward().unwrap();
    let ours = vals(g.get(x.as_tensor()).expect("posenc rope lost the gradient"));
    for (a, r) in ours.iter().zip(&slow) {
        assert!((a - r).abs() <= 1e-5, "{a} vs candle-nn rope_slow {r}");
    }
}

#[test]
fn half_precision_activations_use_f32_tables() {
    // bf16 activations at a long position: the result must be the f32
    // computation rounded once, not one with a bf16-rounded table.
    let f = RopeFrequencies::plain(10000.0, 8, PairLayout::HalfSplit).unwrap();
    let rope = Rope::new(f).unwrap();
    let x32 = Tensor::from_vec(
        vec![1.0f32, 0.5, -0.25, 2.0, 1.0, 1.0, 1.0, 1.0],
        (1, 1, 1, 8),
        &CPU,
    )
    .unwrap();
    let xb = x32.to_dtype(DType::BF16).unwrap();
    let y = rope.rotate(&xb, 123_457, Role::Query).unwrap();
    assert_eq!(y.dtype(), DType::BF16);
    let want = rope
        .rotate(&x32, 123_457, Role::Query)
        .unwrap()
        .to_dtype(DType::BF16)
        .unwrap();
    let (yv, wv) = (vals(&y), vals(&want));
    for (a, w) in yv.iter().zip(&wv) {
        assert!(
            (a - w).abs() <= w.abs() * 2f32.powi(-8) + 1e-6,
            "{a} vs {w}"
        );
    }
}

fn expect_err<T: std::fmt::Debug>(r: posenc::Result<T>, pred: impl Fn(&Error) -> bool, ctx: &str) {
    match r {
        Err(e) if pred(&e) => {}
        other => panic!("{ctx}: unexpected {other:?}"),
    }
}

#[test]
fn typed_errors_before_any_kernel() {
    let f = RopeFrequencies::plain(10000.0, 8, PairLayout::HalfSplit).unwrap();
    let rope = Rope::new(f.clone()).unwrap();
    let z = |d: &[usize], dt: DType| Tensor::zeros(d, dt, &CPU).unwrap();
    let q = z(&[1, 2, 3, 8], DType::F32);
    let is_dim = |e: &Error| matches!(e, Error::InvalidDimension { .. });
    let is_shape = |e: &Error| matches!(e, Error::Shape { .. });
    let is_dtype = |e: &Error| matches!(e, Error::DType { .. });
    let is_value = |e: &Error| matches!(e, Error::InvalidValue { .. });
    // odd head dim (rotary 8 < 9), rotary_dim > head_dim, zero dims
    let odd = z(&[1, 2, 3, 9], DType::F32);
    expect_err(rope.apply(&odd, &odd, 0), is_dim, "odd head dim");
    let small = z(&[1, 2, 3, 6], DType::F32);
    expect_err(rope.apply(&small, &small, 0), is_dim, "rotary > head");
    let empty = z(&[1, 2, 0, 8], DType::F32);
    expect_err(rope.apply(&empty, &empty, 0), is_dim, "zero seq");
    expect_err(
        rope.apply_reference(&empty, &empty, 0),
        is_dim,
        "zero seq reference",
    );
    // not 4-d
    let three = z(&[2, 3, 8], DType::F32);
    expect_err(rope.apply(&three, &three, 0), is_shape, "3-d");
    // q/k mismatch (T, D, B); heads may differ
    expect_err(
        rope.apply(&q, &z(&[1, 2, 4, 8], DType::F32), 0),
        is_shape,
        "T mismatch",
    );
    expect_err(
        rope.apply(&q, &z(&[2, 2, 3, 8], DType::F32), 0),
        is_shape,
        "B mismatch",
    );
    assert!(rope.apply(&q, &z(&[1, 1, 3, 8], DType::F32), 0).is_ok());
    expect_err(
        rope.apply(&q, &z(&[1, 2, 3, 8], DType::BF16), 0),
        is_dtype,
        "dtype mismatch",
    );
    // unsupported dtypes
    let q64 = z(&[1, 2, 3, 8], DType::F64);
    expect_err(rope.apply(&q64, &q64, 0), is_dtype, "f64 fused");
    assert!(rope.apply_reference(&q64, &q64, 0).is_ok());
    let qu = z(&[1, 2, 3, 8], DType::U32);
    expect_err(rope.apply(&qu, &qu, 0), is_dtype, "u32 fused");
    // position ids: wrong shape, wrong dtype, negative
    let ids = Tensor::zeros((1, 4), DType::U32, &CPU).unwrap();
    expect_err(rope.apply(&q, &q, &ids), is_shape, "ids shape");
    let ids = Tensor::zeros(3, DType::U32, &CPU).unwrap();
    expect_err(rope.apply(&q, &q, &ids), is_shape, "ids rank");
    let ids = Tensor::zeros((1, 3), DType::F32, &CPU).unwrap();
    expect_err(rope.apply(&q, &q, &ids), is_dtype, "ids dtype");
    let ids = Tensor::from_vec(vec![0i64, -5, 2], (1, 3), &CPU).unwrap();
    expect_err(
        rope.apply(&q, &q, &ids),
        |e| matches!(e, Error::NegativePosition(-5)),
        "negative id",
    );
    // bad construction
    expect_err(
        Rope::new(f.clone()).unwrap().with_xpos(0.0),
        |e| matches!(e, Error::InvalidFactor { .. }),
        "xpos 0",
    );
    expect_err(
        Rope::new(f.clone()).unwrap().with_xpos(f64::NAN),
        |e| matches!(e, Error::InvalidFactor { .. }),
        "xpos nan",
    );
    let mut broken = f.clone();
    broken.rotary_dim = 10;
    expect_err(Rope::new(broken), is_dim, "rotary_dim inconsistent");
    // in-place contract
    let v = Var::from_tensor(&q).unwrap();
    expect_err(
        rope.apply_inplace(v.as_tensor(), &q.copy().unwrap(), 0),
        is_value,
        "var in place",
    );
    let big = z(&[2, 2, 3, 8], DType::F32);
    let view = big.narrow(0, 1, 1).unwrap();
    assert!(view.is_contiguous());
    expect_err(
        rope.apply_inplace(&view, &q.copy().unwrap(), 0),
        is_value,
        "narrow view in place",
    );
    let tr = z(&[1, 3, 2, 8], DType::F32).transpose(1, 2).unwrap();
    expect_err(
        rope.apply_inplace(&tr, &q.copy().unwrap(), 0),
        is_value,
        "transposed in place",
    );
    let same = q.copy().unwrap();
    expect_err(
        rope.apply_inplace(&same, &same.clone(), 0),
        is_value,
        "q and k one buffer",
    );
    // nothing was written by the failed calls
    assert!(vals(&same).iter().all(|&v| v == 0.0));
}

#[test]
fn non_contiguous_inputs_and_positions_per_row() {
    let mut rng = Rng(11);
    let f = RopeFrequencies::plain(10000.0, 16, PairLayout::Interleaved).unwrap();
    let rope = Rope::new(f).unwrap().with_layout(HeadLayout::Bhtd);
    // a (B, T, H, D) tensor transposed to (B, H, T, D): not contiguous
    let x = rng
        .tensor(&[3, 5, 2, 16], DType::F32)
        .transpose(1, 2)
        .unwrap();
    assert!(!x.is_contiguous());
    let ids = Tensor::from_vec(
        vec![0u32, 1, 2, 3, 4, 10, 11, 12, 13, 14, 7, 3, 9, 0, 1],
        (3, 5),
        &CPU,
    )
    .unwrap();
    let y = rope.rotate(&x, &ids, Role::Key).unwrap();
    // row b with ids equal to offset + t must equal the offset path
    for (b, off) in [(0usize, 0usize), (1, 10)] {
        let xb = x.narrow(0, b, 1).unwrap();
        let yb = rope.rotate(&xb, off, Role::Key).unwrap();
        assert_eq!(vals(&y.narrow(0, b, 1).unwrap()), vals(&yb));
    }
    let r = rope.rotate_reference(&x, &ids, Role::Key).unwrap();
    assert_close(&y, &r, DType::F32, 4.0, "non-contiguous");
}

/// Test-only dynamic NTK schedule (transformers'
/// `_compute_dynamic_ntk_parameters`): for seq_len > original,
/// base' = base · (factor·L/orig − (factor − 1))^(d/(d−2)).
struct DynamicNtk {
    base: f64,
    dim: usize,
    factor: f64,
    orig: usize,
}

impl FrequencySchedule for DynamicNtk {
    fn frequencies(&self, seq_len: Option<usize>) -> posenc::Result<RopeFrequencies> {
        let base = match seq_len {
            Some(l) if l > self.orig => {
                let d = self.dim as f64;
                self.base
                    * (self.factor * l as f64 / self.orig as f64 - (self.factor - 1.0))
                        .powf(d / (d - 2.0))
            }
            _ => self.base,
        };
        RopeFrequencies::plain(base, self.dim, PairLayout::HalfSplit)
    }
    fn length_dependent(&self) -> bool {
        true
    }
    fn original_max_position_embeddings(&self) -> Option<usize> {
        Some(self.orig)
    }
}

/// Test-only LongRoPE-like schedule: short factors up to the original
/// length, long factors past it (independent of the exact length).
struct ShortLong {
    orig: usize,
}

impl FrequencySchedule for ShortLong {
    fn frequencies(&self, seq_len: Option<usize>) -> posenc::Result<RopeFrequencies> {
        let plain = RopeFrequencies::plain(10000.0, 16, PairLayout::HalfSplit)?;
        let long = matches!(seq_len, Some(l) if l > self.orig);
        let inv: Vec<f32> = plain
            .inv_freq
            .iter()
            .enumerate()
            .map(|(i, &f)| if long { f / (1.0 + i as f32) } else { f / 1.5 })
            .collect();
        RopeFrequencies::new(
            "longrope",
            inv,
            if long { 1.2 } else { 1.0 },
            PairLayout::HalfSplit,
        )
    }
    fn length_dependent(&self) -> bool {
        true
    }
    fn original_max_position_embeddings(&self) -> Option<usize> {
        Some(self.orig)
    }
}

/// Applies `rope` at `offset..offset+t` and checks the result against the
/// f64 rotation with `want` frequencies.
fn check_against(rope: &Rope, want: &RopeFrequencies, offset: usize, t: usize, rng: &mut Rng) {
    let d = want.rotary_dim;
    let x = rng.tensor(&[1, 1, t, d], DType::F32);
    let y = vals(&rope.rotate(&x, offset, Role::Query).unwrap());
    assert_eq!(&rope.frequencies(), want, "offset {offset} t {t}");
    let xv = vals(&x);
    for ti in 0..t {
        let mut head: Vec<f64> = xv[ti * d..(ti + 1) * d].iter().map(|&v| v as f64).collect();
        want.rotate(&mut head, (offset + ti) as u64).unwrap();
        for j in 0..d {
            assert!(
                (y[ti * d + j] as f64 - head[j]).abs() < 2e-6,
                "offset {offset} t {ti} [{j}]"
            );
        }
    }
}

#[test]
fn dynamic_ntk_schedule_follows_transformers_updates() {
    let s = DynamicNtk {
        base: 10000.0,
        dim: 16,
        factor: 2.0,
        orig: 32,
    };
    let at = |l: Option<usize>| s.frequencies(l).unwrap();
    let (f0, f50) = (at(None), at(Some(50)));
    let rope = Rope::new(DynamicNtk { ..s }).unwrap();
    let mut rng = Rng(5);
    check_against(&rope, &f0, 0, 20, &mut rng); // short: load-time frequencies
    check_against(&rope, &f0, 12, 20, &mut rng); // seq_len 32 = original: unchanged
    check_against(&rope, &f50, 40, 10, &mut rng); // seq_len 50 > 32: grow
    check_against(&rope, &f50, 0, 45, &mut rng); // 45 ≤ 50 but long: keep grown
    check_against(&rope, &f0, 0, 8, &mut rng); // back below the original: reset
    let s2 = DynamicNtk {
        base: 10000.0,
        dim: 16,
        factor: 2.0,
        orig: 32,
    };
    check_against(&rope, &s2.frequencies(Some(64)).unwrap(), 60, 4, &mut rng);
    // position ids drive it as well: max id + 1 = 100
    let ids = Tensor::from_vec(vec![99u32, 0], (1, 2), &CPU).unwrap();
    let x = rng.tensor(&[1, 1, 2, 16], DType::F32);
    rope.rotate(&x, &ids, Role::Query).unwrap();
    assert_eq!(rope.frequencies(), s2.frequencies(Some(100)).unwrap());
}

#[test]
fn longrope_like_schedule_switches_short_and_long() {
    let s = ShortLong { orig: 64 };
    let (short, long) = (
        s.frequencies(None).unwrap(),
        s.frequencies(Some(65)).unwrap(),
    );
    assert_ne!(short, long);
    let rope = Rope::new(ShortLong { orig: 64 }).unwrap();
    let mut rng = Rng(8);
    for (offset, t, want) in [
        (0, 64, &short),
        (60, 10, &long),
        (100, 1, &long),
        (0, 30, &short),
        (64, 1, &long),
    ] {
        check_against(&rope, want, offset, t, &mut rng);
        // reference path follows the same schedule
        let x = rng.tensor(&[1, 1, t, 16], DType::F32);
        let y = rope.rotate(&x, offset, Role::Key).unwrap();
        let r = rope.rotate_reference(&x, offset, Role::Key).unwrap();
        assert_close(&y, &r, DType::F32, 5.0, "longrope reference");
    }
}

#[test]
fn cache_grows_on_demand_and_is_reused() {
    let f = RopeFrequencies::plain(10000.0, 32, PairLayout::HalfSplit).unwrap();
    let rope = Rope::new(f).unwrap().with_max_cached_positions(4096);
    assert_eq!(rope.cached_positions(), 0);
    let mut rng = Rng(1);
    let x = rng.tensor(&[1, 2, 10, 32], DType::F32);
    rope.rotate(&x, 0, Role::Query).unwrap();
    let first = rope.cached_positions();
    assert!((10..=4096).contains(&first));
    for off in [0, 5, 100] {
        rope.rotate(&x, off, Role::Query).unwrap();
    }
    assert_eq!(
        rope.cached_positions(),
        first,
        "rebuilt for positions it had"
    );
    rope.rotate(&x, 1000, Role::Query).unwrap();
    let grown = rope.cached_positions();
    assert!((1010..=4096).contains(&grown));
    // past the cap: correct, and the cache stays at the cap
    let y = rope.rotate(&x, 1_000_000, Role::Query).unwrap();
    let r = rope.rotate_reference(&x, 1_000_000, Role::Query).unwrap();
    assert_close(&y, &r, DType::F32, 4.0, "past the cap");
    let ids = Tensor::from_vec(
        (0..10).map(|i| i * 99_991u32).collect::<Vec<_>>(),
        (1, 10),
        &CPU,
    )
    .unwrap();
    let y = rope.rotate(&x, &ids, Role::Query).unwrap();
    let r = rope.rotate_reference(&x, &ids, Role::Query).unwrap();
    assert_close(&y, &r, DType::F32, 4.0, "ids past the cap");
    assert!(rope.cached_positions() <= 4096);
    rope.warm_up(4096).unwrap();
    assert_eq!(rope.cached_positions(), 4096);
}

#[test]
fn concurrent_calls_share_the_cache() {
    let f = RopeFrequencies::plain(10000.0, 64, PairLayout::HalfSplit).unwrap();
    let rope = std::sync::Arc::new(Rope::new(f).unwrap());
    let handles: Vec<_> = (0..4)
        .map(|i| {
            let rope = rope.clone();
            std::thread::spawn(move || {
                let mut rng = Rng(100 + i);
                for j in 0..5 {
                    let off = (i as usize * 997 + j * 3001) % 20_000;
                    let x = rng.tensor(&[1, 2, 7, 64], DType::F32);
                    let y = rope.rotate(&x, off, Role::Query).unwrap();
                    let r = rope.rotate_reference(&x, off, Role::Query).unwrap();
                    assert_close(&y, &r, DType::F32, 4.0, "threads");
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

#[test]
fn every_simd_level_through_the_tensor_api() {
    let mut rng = Rng(21);
    let f = RopeFrequencies::plain(10000.0, 64, PairLayout::Interleaved).unwrap();
    let x = rng.tensor(&[2, 9, 3, 64], DType::BF16);
    let base = Rope::new(f.clone()).unwrap().with_layout(HeadLayout::Bthd);
    let r = base.rotate_reference(&x, 3, Role::Query).unwrap();
    for level in posenc::kernels::SimdLevel::available() {
        let rope = Rope::new(f.clone())
            .unwrap()
            .with_layout(HeadLayout::Bthd)
            .with_simd_level(level)
            .unwrap();
        let y = rope.rotate(&x, 3, Role::Query).unwrap();
        assert_close(&y, &r, DType::BF16, 4.0, level.as_str());
    }
}

fn assert_close(got: &Tensor, want: &Tensor, dtype: DType, mag: f32, ctx: &str) {
    assert_eq!(got.dtype(), want.dtype(), "{ctx}");
    common::assert_close(got, want, dtype, mag, ctx);
}
