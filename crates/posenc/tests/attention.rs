//! The fused attention against its composed reference: values and the
//! gradients of every input and parameter, for every hook, causal and
//! bidirectional, grouped heads, both layouts, offsets and position ids, edge
//! lengths (1, 2, 3, 127, 128, 129) and head dimensions across the tile
//! kernels' 8-, 16- and 32-column panels, at every SIMD level this CPU has
//! (AVX-512 and AVX2 both run on an AVX-512 machine), and thread counts.

use candle_core::{DType, Device, Tensor, Var};
use candle_nn::{VarBuilder, VarMap};
use posenc::kernels::attention as ka;
use posenc::kernels::{HeadLayout, SimdLevel};
use posenc::relative::{Alibi, AlibiMode, T5Buckets};
use posenc::rope::{PairLayout, RopeConfig, RopeFrequencies};
use posenc::tensor::attention::{Attention, AttentionHooks, AttnPositions};
use posenc::tensor::bias::{ShawRelative, T5RelativeBias};
use posenc::tensor::hooks::{CumulativeBias, DenseBias, LogitsHook, QueryKeyHook, ValuesHook};
use posenc::tensor::rope::Rope;
use posenc::tensor::Positions;

const DEV: Device = Device::Cpu;

/// Deterministic pseudo-random values in [-1, 1).
fn data(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn var(shape: &[usize], seed: u64, scale: f32) -> Var {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = data(n, seed).into_iter().map(|x| x * scale).collect();
    Var::from_tensor(&Tensor::from_vec(v, shape, &DEV).unwrap()).unwrap()
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Nope,
    Rope,
    RopeInterleavedPartial,
    Xpos,
    Alibi,
    T5,
    Shaw,
    Dense,
    DenseBroadcast,
    Cumulative,
}

/// One kind per hook: the cases run at the longer lengths.
const ONE_PER_HOOK: [Kind; 6] = [
    Kind::Nope,
    Kind::Rope,
    Kind::Alibi,
    Kind::T5,
    Kind::Shaw,
    Kind::Cumulative,
];

const KINDS: [Kind; 10] = [
    Kind::Nope,
    Kind::Rope,
    Kind::RopeInterleavedPartial,
    Kind::Xpos,
    Kind::Alibi,
    Kind::T5,
    Kind::Shaw,
    Kind::Dense,
    Kind::DenseBroadcast,
    Kind::Cumulative,
];

#[derive(Clone, Copy)]
struct Case {
    b: usize,
    hq: usize,
    hk: usize,
    tq: usize,
    tk: usize,
    d: usize,
    causal: bool,
    layout: HeadLayout,
    q_off: usize,
    k_off: usize,
    ids: bool,
}

struct Hooked {
    rope: Option<Rope>,
    alibi: Option<Alibi>,
    t5: Option<T5RelativeBias>,
    shaw: Option<ShawRelative>,
    dense: Option<DenseBias>,
    cum: Option<CumulativeBias>,
    params: Vec<Var>,
}

impl Hooked {
    fn new(kind: Kind, c: &Case, seed: u64) -> Hooked {
        let mut h = Hooked {
            rope: None,
            alibi: None,
            t5: None,
            shaw: None,
            dense: None,
            cum: None,
            params: Vec::new(),
        };
        match kind {
            Kind::Nope => {}
            Kind::Rope => {
                let f = RopeFrequencies::plain(10000.0, c.d, PairLayout::HalfSplit).unwrap();
                h.rope = Some(Rope::new(f).unwrap());
            }
            Kind::RopeInterleavedPartial => {
                let rd = (c.d / 2).max(2) & !1;
                let cfg = RopeConfig::new(500.0, rd)
                    .unwrap()
                    .with_head_dim(c.d)
                    .with_layout(PairLayout::Interleaved);
                h.rope = Some(Rope::new(cfg).unwrap());
            }
            Kind::Xpos => {
                let f = RopeFrequencies::plain(10000.0, c.d, PairLayout::HalfSplit).unwrap();
                h.rope = Some(Rope::new(f).unwrap().with_xpos(64.0).unwrap());
            }
            Kind::Alibi => {
                let mode = if c.causal {
                    AlibiMode::Causal
                } else {
                    AlibiMode::Bidirectional
                };
                h.alibi = Some(Alibi::new(c.hq, mode).unwrap());
            }
            Kind::T5 => {
                let vm = VarMap::new();
                let vb = VarBuilder::from_varmap(&vm, DType::F32, &DEV);
                let bk = T5Buckets::new(8, 20, !c.causal).unwrap();
                h.t5 = Some(T5RelativeBias::new(bk, c.hq, vb.pp("t5")).unwrap());
                h.params.extend(seeded(&vm, seed));
            }
            Kind::Shaw => {
                let vm = VarMap::new();
                let vb = VarBuilder::from_varmap(&vm, DType::F32, &DEV);
                h.shaw = Some(ShawRelative::new(3, c.d, vb.pp("shaw")).unwrap());
                h.params.extend(seeded(&vm, seed));
            }
            Kind::Dense => {
                let v = var(&[c.b, c.hq, c.tq, c.tk], seed ^ 77, 2.0);
                h.dense = Some(DenseBias(v.as_tensor().clone()));
                h.params.push(v);
            }
            Kind::DenseBroadcast => {
                let v = var(&[c.hq, c.tq, c.tk], seed ^ 78, 2.0);
                h.dense = Some(DenseBias(v.as_tensor().clone()));
                h.params.push(v);
            }
            Kind::Cumulative => {
                let q = var(&[c.b, c.hq, c.tq], seed ^ 79, 3.0);
                let k = var(&[c.b, c.hq, c.tk], seed ^ 80, 3.0);
                h.cum = Some(CumulativeBias {
                    q: q.as_tensor().clone(),
                    k: k.as_tensor().clone(),
                });
                h.params.push(q);
                h.params.push(k);
            }
        }
        h
    }

    fn hooks(&self) -> AttentionHooks<'_> {
        let logits: Option<&dyn LogitsHook> = if let Some(a) = &self.alibi {
            Some(a)
        } else if let Some(t) = &self.t5 {
            Some(t)
        } else if let Some(s) = &self.shaw {
            Some(s)
        } else if let Some(d) = &self.dense {
            Some(d)
        } else if let Some(c) = &self.cum {
            Some(c)
        } else {
            None
        };
        AttentionHooks {
            query_key: self.rope.as_ref().map(|r| r as &dyn QueryKeyHook),
            logits,
            values: self.shaw.as_ref().map(|s| s as &dyn ValuesHook),
        }
    }
}

fn shape(c: &Case, h: usize, t: usize) -> Vec<usize> {
    match c.layout {
        HeadLayout::Bhtd => vec![c.b, h, t, c.d],
        HeadLayout::Bthd => vec![c.b, t, h, c.d],
    }
}

fn ids(c: &Case, len: usize, offset: usize, seed: u64) -> Tensor {
    // Increasing ids with random gaps, a different row per batch entry.
    let r = data(c.b * len, seed);
    let mut v = Vec::new();
    for b in 0..c.b {
        let mut p = offset as u32 + b as u32;
        for t in 0..len {
            v.push(p);
            p += 1 + (r[b * len + t].abs() * 3.0) as u32;
        }
    }
    Tensor::from_vec(v, (c.b, len), &DEV).unwrap()
}

/// Overwrites the variables of a `VarMap` with deterministic values (candle's
/// own initialisation draws from an unseeded generator).
fn seeded(vm: &VarMap, seed: u64) -> Vec<Var> {
    // By name: a VarMap iterates in hash order.
    let mut named: Vec<(String, Var)> = vm
        .data()
        .lock()
        .unwrap()
        .iter()
        .map(|(n, v)| (n.clone(), v.clone()))
        .collect();
    named.sort_by(|a, b| a.0.cmp(&b.0));
    let vars: Vec<Var> = named.into_iter().map(|(_, v)| v).collect();
    for (i, v) in vars.iter().enumerate() {
        let t = Tensor::from_vec(data(v.elem_count(), seed + i as u64), v.shape(), &DEV).unwrap();
        v.set(&t).unwrap();
    }
    vars
}

/// The largest difference relative to the largest reference magnitude (at
/// least 0.1: entries that are zero in exact arithmetic, such as the
/// gradient of a lone softmax logit, are rounding noise in both paths).
fn max_rel(a: &Tensor, b: &Tensor) -> f32 {
    let a = a.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let b = b.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0.1f32, |m, v| m.max(v.abs()));
    a.iter()
        .zip(&b)
        .map(|(x, y)| {
            assert!(x.is_finite() && y.is_finite(), "{x} {y}");
            (x - y).abs() / scale
        })
        .fold(0.0, f32::max)
}

/// Compares outputs and gradients of every input and parameter, the fused
/// kernel at every SIMD level this CPU has against the composed reference.
fn check(kind: Kind, c: &Case, seed: u64) {
    let q = var(&shape(c, c.hq, c.tq), seed, 1.0);
    let k = var(&shape(c, c.hk, c.tk), seed + 1, 1.0);
    let v = var(&shape(c, c.hk, c.tk), seed + 2, 1.0);
    let h = Hooked::new(kind, c, seed);
    let attn = Attention::new(c.causal).with_layout(c.layout);
    let (qi, ki);
    let pos = if c.ids {
        qi = ids(c, c.tq, c.q_off, seed + 5);
        ki = ids(c, c.tk, c.k_off, seed + 6);
        AttnPositions {
            q: Positions::Ids(&qi),
            k: Positions::Ids(&ki),
        }
    } else {
        AttnPositions::offsets(c.q_off, c.k_off)
    };
    let hooks = h.hooks();
    let w = Tensor::from_vec(data(q.elem_count(), seed + 9), q.shape(), &DEV).unwrap();
    let refr = attn
        .forward_reference(q.as_tensor(), k.as_tensor(), v.as_tensor(), &hooks, pos)
        .unwrap();
    let gr = (&refr * &w).unwrap().sum_all().unwrap().backward().unwrap();
    for level in SimdLevel::available() {
        let fused = attn
            .with_simd_level(level)
            .unwrap()
            .forward(q.as_tensor(), k.as_tensor(), v.as_tensor(), &hooks, pos)
            .unwrap();
        let what = format!(
            "{kind:?} {level} b{} hq{} hk{} tq{} tk{} d{} causal {} {:?} offsets {}/{} ids {}",
            c.b, c.hq, c.hk, c.tq, c.tk, c.d, c.causal, c.layout, c.q_off, c.k_off, c.ids
        );
        let e = max_rel(&fused, &refr);
        assert!(e < 2e-5, "{what}: output differs by {e}");
        let gf = (fused * &w).unwrap().sum_all().unwrap().backward().unwrap();
        let mut all = vec![("q", &q), ("k", &k), ("v", &v)];
        for p in &h.params {
            all.push(("param", p));
        }
        for (name, x) in all {
            let a = gf
                .get(x.as_tensor())
                .unwrap_or_else(|| panic!("{what}: no fused grad for {name}"));
            let b = gr
                .get(x.as_tensor())
                .unwrap_or_else(|| panic!("{what}: no reference grad for {name}"));
            // f32 sums over up to T terms in a different order: 3e-4 of the
            // largest gradient.
            let e = max_rel(a, b);
            assert!(e < 3e-4, "{what}: gradient of {name} differs by {e}");
        }
    }
}

/// [`base`] with one batch of `hq` query and `hk` key heads of dim `d`.
fn one_batch(t: usize, hq: usize, hk: usize, d: usize) -> Case {
    Case {
        b: 1,
        hq,
        hk,
        d,
        ..base(t)
    }
}

fn base(t: usize) -> Case {
    Case {
        b: 2,
        hq: 2,
        hk: 2,
        tq: t,
        tk: t,
        d: 8,
        causal: true,
        layout: HeadLayout::Bhtd,
        q_off: 0,
        k_off: 0,
        ids: false,
    }
}

#[test]
fn every_hook_matches_the_reference_causal_and_bidirectional() {
    for kind in KINDS {
        for causal in [true, false] {
            for t in [1, 2, 3, 17] {
                let c = Case { causal, ..base(t) };
                check(kind, &c, 11 + t as u64);
            }
        }
    }
}

/// Every kind of [`ONE_PER_HOOK`] on `one_batch(t, hq, hk, d)` at each
/// length `t`: causal with seed `causal_seed + t`, and bidirectional with
/// seed `bidi_seed + t` at the lengths in `bidirectional_at`.
fn check_lengths(
    lengths: &[usize],
    [hq, hk, d]: [usize; 3],
    [causal_seed, bidi_seed]: [u64; 2],
    bidirectional_at: &[usize],
) {
    for kind in ONE_PER_HOOK {
        for &t in lengths {
            let c = one_batch(t, hq, hk, d);
            check(kind, &c, causal_seed + t as u64);
            if bidirectional_at.contains(&t) {
                check(kind, &Case { causal: false, ..c }, bidi_seed + t as u64);
            }
        }
    }
}

#[test]
fn edge_lengths_cross_the_tiles() {
    let lengths = [127, 128, 129];
    check_lengths(&lengths, [1, 1, 4], [3, 5], &lengths);
}

/// Past 1,024 keys the forward pass takes its long-sequence tiles (256 keys,
/// products on the gemm crate): the same values and gradients, for grouped
/// heads, every hook, causal and bidirectional, across the switch.
#[test]
fn long_sequence_tiles_match_the_reference() {
    check_lengths(&[1024, 1025, 1300], [2, 1, 8], [70, 71], &[1300]);
}

/// With bfloat16 products (long tiles only, forward only) the outputs stay
/// within bfloat16 rounding of the exact reference: queries, keys,
/// probabilities and values carry 8 significant bits (a relative rounding
/// error up to 2^-9 each), so with entries in [-1, 1) outputs move by up to
/// 3.1e-3 of the largest here; the bound is twice that. Shaw's tables,
/// shorter sequences and a level below AVX-512 keep `f32`.
#[test]
fn bf16_products_stay_within_bfloat16_rounding() {
    if Attention::new(true)
        .with_products(ka::Products::Bf16)
        .is_err()
    {
        eprintln!("skipped: this CPU has no AVX512_BF16");
        assert!(!posenc::kernels::bf16::supported());
        return;
    }
    // A lower level refuses bfloat16 products.
    if SimdLevel::available().contains(&SimdLevel::Avx2) {
        assert!(Attention::new(true)
            .with_simd_level(SimdLevel::Avx2)
            .unwrap()
            .with_products(ka::Products::Bf16)
            .is_err());
    }
    for kind in [
        Kind::Nope,
        Kind::Rope,
        Kind::RopeInterleavedPartial,
        Kind::Alibi,
        Kind::T5,
        Kind::Shaw,
        Kind::Cumulative,
    ] {
        for (t, d, hq, hk) in [
            (1025, 8, 2, 1),
            (1300, 6, 3, 1),
            (1537, 5, 2, 2),
            (700, 8, 1, 1),
        ] {
            if d % 2 == 1 && !matches!(kind, Kind::Nope | Kind::Alibi | Kind::T5 | Kind::Cumulative)
            {
                continue;
            }
            for causal in [true, false] {
                let c = Case {
                    b: 1,
                    hq,
                    hk,
                    d,
                    causal,
                    ..base(t)
                };
                let seed = 90 + t as u64;
                let q = var(&shape(&c, c.hq, c.tq), seed, 1.0);
                let k = var(&shape(&c, c.hk, c.tk), seed + 1, 1.0);
                let v = var(&shape(&c, c.hk, c.tk), seed + 2, 1.0);
                let h = Hooked::new(kind, &c, seed);
                let hooks = h.hooks();
                let pos = AttnPositions::default();
                let attn = Attention::new(causal);
                let (q, k, v) = (q.as_tensor(), k.as_tensor(), v.as_tensor());
                let exact = attn.forward_reference(q, k, v, &hooks, pos).unwrap();
                let f32s = attn.forward(q, k, v, &hooks, pos).unwrap();
                let bf16 = attn
                    .with_products(ka::Products::Bf16)
                    .unwrap()
                    .forward(q, k, v, &hooks, pos)
                    .unwrap();
                let what = format!("{kind:?} t{t} d{d} hq{hq} hk{hk} causal {causal}");
                let e = max_rel(&bf16, &exact);
                if t <= 1024 || matches!(kind, Kind::Shaw) {
                    // Not the bfloat16 path: the f32 kernel's own bits.
                    assert_eq!(
                        bf16.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                        f32s.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                        "{what}: f32 path"
                    );
                } else {
                    assert!(e < 6e-3, "{what}: output differs by {e}");
                    assert!(max_rel(&f32s, &exact) < 2e-5, "{what}: f32 output");
                    assert!(e > 0.0, "{what}: no bfloat16 rounding at all");
                }
            }
        }
    }
}

#[test]
fn grouped_heads_layouts_and_head_dims() {
    for kind in [Kind::Nope, Kind::Rope, Kind::Alibi, Kind::Shaw, Kind::Dense] {
        for (hq, hk) in [(4, 2), (4, 1), (3, 3)] {
            for layout in [HeadLayout::Bhtd, HeadLayout::Bthd] {
                for d in [2, 6, 16, 34] {
                    let c = Case {
                        hq,
                        hk,
                        layout,
                        d,
                        ..base(9)
                    };
                    check(kind, &c, 40 + d as u64);
                }
            }
        }
    }
}

/// The lab's head dimensions (8 and 32: d_model 32 and 128 over 4 heads;
/// 64) at lengths inside one tile and across two query tiles: the
/// AVX-512 kernels' 8-lane and 32-column panels against the reference.
#[test]
fn lab_head_dims_cross_the_panels() {
    for kind in [Kind::Nope, Kind::Rope, Kind::Alibi, Kind::T5, Kind::Shaw] {
        for d in [8, 32, 64] {
            for t in [32, 129] {
                let c = one_batch(t, 2, 2, d);
                check(kind, &c, 90 + (d + t) as u64);
            }
        }
    }
}

/// A KV cache, a slice of a sequence split across devices and per-row
/// position ids, every hook. The last two cases have few (batch, key/value
/// head) pairs and several key tiles: the backward pass splits each pair's
/// keys into runs and adds the runs' query gradients afterwards
/// (bidirectional runs: [`long_sequence_tiles_match_the_reference`]).
#[test]
fn kv_cache_offsets_and_position_ids() {
    let cases = [
        // A KV cache: 5 new queries after 12 cached keys.
        (
            Case {
                tq: 5,
                tk: 17,
                q_off: 12,
                ..base(0)
            },
            90,
        ),
        // A slice of a sequence split across devices: positions 300.. .
        (
            Case {
                q_off: 300,
                k_off: 300,
                ..base(10)
            },
            91,
        ),
        // Per-row position ids with gaps.
        (
            Case {
                ids: true,
                q_off: 3,
                k_off: 3,
                ..base(12)
            },
            92,
        ),
        // Runs of keys: 200 new queries after 300 cached keys (the runs'
        // first queries differ; the first run meets every query).
        (
            Case {
                tq: 200,
                tk: 500,
                q_off: 300,
                ..one_batch(0, 4, 2, 8)
            },
            93,
        ),
        // Runs of keys with per-row position ids.
        (
            Case {
                ids: true,
                q_off: 3,
                k_off: 3,
                ..one_batch(300, 2, 1, 8)
            },
            94,
        ),
    ];
    for kind in KINDS {
        for (c, seed) in &cases {
            check(kind, c, *seed);
        }
    }
}

#[test]
fn packed_qkv_matches_separate_tensors() {
    let (b, t, hq, hk, d) = (2, 11, 4, 2, 8);
    let w = (hq + 2 * hk) * d;
    let qkv = var(&[b, t, w], 7, 1.0);
    let f = RopeFrequencies::plain(10000.0, d, PairLayout::HalfSplit).unwrap();
    let rope = Rope::new(f).unwrap();
    let vm = VarMap::new();
    let vb = VarBuilder::from_varmap(&vm, DType::F32, &DEV);
    let shaw = ShawRelative::new(2, d, vb.pp("shaw")).unwrap();
    seeded(&vm, 5);
    for hooks in [
        AttentionHooks {
            query_key: Some(&rope),
            ..Default::default()
        },
        AttentionHooks {
            logits: Some(&shaw),
            values: Some(&shaw),
            ..Default::default()
        },
    ] {
        let attn = Attention::new(true);
        let pos = AttnPositions::default();
        let fused = attn
            .forward_packed(qkv.as_tensor(), hq, hk, &hooks, pos)
            .unwrap();
        let refr = attn
            .forward_packed_reference(qkv.as_tensor(), hq, hk, &hooks, pos)
            .unwrap();
        assert_eq!(fused.dims(), &[b, t, hq * d]);
        assert!(max_rel(&fused, &refr) < 2e-5);
        let wt = Tensor::from_vec(data(fused.elem_count(), 3), fused.shape(), &DEV).unwrap();
        let gf = (fused * &wt)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        let gr = (refr * &wt).unwrap().sum_all().unwrap().backward().unwrap();
        let e = max_rel(
            gf.get(qkv.as_tensor()).unwrap(),
            gr.get(qkv.as_tensor()).unwrap(),
        );
        assert!(e < 1e-4, "packed gradient differs by {e}");
        for v in vm.all_vars() {
            if let (Some(a), Some(b)) = (gf.get(v.as_tensor()), gr.get(v.as_tensor())) {
                assert!(max_rel(a, b) < 1e-4);
            }
        }
    }
}

/// The kernel tests' problem: `B = 2`, 2 query heads sharing one key/value
/// head, `T` queries and keys of dimension 5 laid out `(B, H, T, D)`, scale
/// 0.4, ALiBi slopes 0.5 and 0.25 (symmetric when bidirectional), no
/// rotation.
fn alibi_problem<'a>(
    t: usize,
    causal: bool,
    [q, k, v]: [&'a [f32]; 3],
    slopes: &'a [f32],
) -> ka::Problem<'a> {
    let kv_rows = ka::Rows::bhtd(1, t, 5);
    ka::Problem {
        dims: ka::Dims {
            batch: 2,
            q_heads: 2,
            kv_heads: 1,
            q_len: t,
            k_len: t,
            head_dim: 5,
        },
        scale: 0.4,
        causal,
        q,
        q_rows: ka::Rows::bhtd(2, t, 5),
        k,
        k_rows: kv_rows,
        v,
        v_rows: kv_rows,
        rotation: None,
        q_pos: ka::Pos::Offset(0),
        k_pos: ka::Pos::Offset(0),
        alibi: Some(ka::AlibiBias {
            slopes,
            symmetric: !causal,
        }),
        scalar: None,
        vector: None,
        dense: None,
        cumulative: None,
        products: ka::Products::F32,
        window: None,
    }
}

/// The kernel alone: dirty output buffers, every SIMD level, against the
/// `f64` triple loop.
#[test]
fn kernel_writes_every_output_at_every_level() {
    let rows = ka::Rows::bhtd(2, 129, 5);
    let q = data(2 * 2 * 129 * 5, 1);
    let k = data(2 * 129 * 5, 2);
    let v = data(2 * 129 * 5, 3);
    let slopes = [0.5f32, 0.25];
    for causal in [true, false] {
        let p = alibi_problem(129, causal, [&q, &k, &v], &slopes);
        let want = ka::reference_forward(&p);
        for level in SimdLevel::available() {
            let mut out = vec![f32::NAN; q.len()];
            let mut lse = vec![f32::NAN; 2 * 2 * 129];
            ka::forward(&p, &mut out, rows, &mut lse, level);
            for (a, b) in out.iter().zip(&want) {
                assert!((*a as f64 - b).abs() < 2e-5, "{level}: {a} vs {b}");
            }
            assert!(lse.iter().all(|x| x.is_finite()));
        }
    }
}

/// The backward kernel at every SIMD level, its gradient buffers filled with
/// NaN first (every element must be written), against an `f64` reference of
/// softmax attention's gradients, at a shape whose 2 (batch, key/value head)
/// pairs and 2 key tiles take the runs of keys (and a longer one with 3 key
/// tiles): grouped heads, an ALiBi bias, causal and bidirectional.
#[test]
fn backward_writes_every_gradient_at_every_level() {
    for t in [129, 300] {
        let (nq, nk) = (2 * 2 * t * 5, 2 * t * 5);
        let (q, k, v, d_o) = (data(nq, 11), data(nk, 12), data(nk, 13), data(nq, 14));
        let slopes = [0.5f32, 0.25];
        for causal in [true, false] {
            let p = alibi_problem(t, causal, [&q, &k, &v], &slopes);
            let dims = p.dims;
            let [want_q, want_k, want_v] =
                reference_grads(dims, causal, &slopes, [&q, &k, &v, &d_o]);
            let largest = |g: &[f64]| g.iter().fold(0f64, |m, x| m.max(x.abs()));
            for level in SimdLevel::available() {
                let recomputed = passes(&p, &d_o, level, None);
                // With the logits kept by the forward (their buffer NaN
                // first), the same output and gradients, bit for bit.
                let kept = passes(&p, &d_o, level, Some(|_| ()));
                assert_eq!(
                    bits(&kept),
                    bits(&recomputed),
                    "T {t}, causal {causal}, {level}"
                );
                let [_, _, dq, dk, dv] = recomputed;
                for (name, got, want) in [
                    ("q", &dq, &want_q),
                    ("k", &dk, &want_k),
                    ("v", &dv, &want_v),
                ] {
                    let tol = 1e-5 * largest(want).max(1.0);
                    for (a, b) in got.iter().zip(want) {
                        assert!(
                            (*a as f64 - b).abs() <= tol,
                            "T {t}, causal {causal}, {level}: d{name} {a} against {b}"
                        );
                    }
                }
            }
        }
    }
}

/// The forward and backward passes of `p` at `level` with the output's
/// gradient `d_o`, every buffer NaN first: `[out, lse, dq, dk, dv]`. With
/// `keep`, the forward keeps the logits, `keep` edits each of them (or
/// leaves it), and the backward reads them.
fn passes(
    p: &ka::Problem,
    d_o: &[f32],
    level: SimdLevel,
    keep: Option<fn(&mut f32)>,
) -> [Vec<f32>; 5] {
    let dm = p.dims;
    let (nq, nk) = (
        dm.batch * dm.q_heads * dm.q_len * dm.head_dim,
        dm.batch * dm.kv_heads * dm.k_len * dm.head_dim,
    );
    let rows = ka::Rows::bhtd(dm.q_heads, dm.q_len, dm.head_dim);
    let kv_rows = ka::Rows::bhtd(dm.kv_heads, dm.k_len, dm.head_dim);
    let mut out = vec![f32::NAN; nq];
    let mut lse = vec![f32::NAN; dm.batch * dm.q_heads * dm.q_len];
    let mut kept = Vec::new();
    if let Some(edit) = keep {
        let layout = ka::KeptLogits::new(p, level).expect("no window, f32 products");
        kept = vec![f32::NAN; layout.floats()];
        ka::forward_keeping(p, &mut out, rows, &mut lse, &mut kept, level);
        kept.iter_mut().for_each(edit);
    } else {
        ka::forward(p, &mut out, rows, &mut lse, level);
    }
    let (mut dq, mut dk, mut dv) = (vec![f32::NAN; nq], vec![f32::NAN; nk], vec![f32::NAN; nk]);
    let g = ka::Grads::qkv(
        (dq.as_mut_ptr(), rows),
        (dk.as_mut_ptr(), kv_rows),
        (dv.as_mut_ptr(), kv_rows),
    );
    let kept = keep.map(|_| &kept[..]);
    ka::backward(p, &out, rows, d_o, rows, &lse, kept, g, level);
    [out, lse, dq, dk, dv]
}

/// The bits of each buffer.
fn bits(xs: &[Vec<f32>; 5]) -> Vec<Vec<u32>> {
    xs.iter()
        .map(|x| x.iter().map(|v| v.to_bits()).collect())
        .collect()
}

/// The logits kept by the forward on the long-sequence tiles (more than
/// 1,024 keys: 512-key forward tiles against the backward's 128) give the
/// recomputed gradients: bit for bit where both passes' products run on
/// posenc's tile kernels (AVX2, AVX-512), within 1e-5 of the largest
/// elsewhere (the forward's long tiles run on the `gemm` crate).
#[test]
fn kept_logits_give_the_recomputed_gradients_on_long_tiles() {
    let t = 1100;
    let (nq, nk) = (2 * 2 * t * 5, 2 * t * 5);
    let (q, k, v, d_o) = (data(nq, 21), data(nk, 22), data(nk, 23), data(nq, 24));
    let slopes = [0.5f32, 0.25];
    for causal in [true, false] {
        let p = alibi_problem(t, causal, [&q, &k, &v], &slopes);
        for level in SimdLevel::available() {
            let recomputed = passes(&p, &d_o, level, None);
            let kept = passes(&p, &d_o, level, Some(|_| ()));
            // The backward reads the kept logits: halved, they change
            // every gradient (the output, the forward's, stays).
            let halved = passes(&p, &d_o, level, Some(|x| *x *= 0.5));
            assert_eq!(bits(&halved)[..2], bits(&kept)[..2]);
            for g in 2..5 {
                assert_ne!(bits(&halved)[g], bits(&kept)[g], "{level}: gradient {g}");
            }
            if matches!(level, SimdLevel::Avx2 | SimdLevel::Avx512) {
                assert_eq!(bits(&kept), bits(&recomputed), "causal {causal}, {level}");
            }
            for (a, b) in kept.iter().zip(&recomputed) {
                let tol = 1e-5 * b.iter().fold(1f32, |m, x| m.max(x.abs()));
                for (x, y) in a.iter().zip(b) {
                    assert!((x - y).abs() <= tol, "causal {causal}, {level}: {x} vs {y}");
                }
            }
        }
    }
}

/// The last range's pass merging the earlier ranges' outputs
/// (`forward_merging`): the same bits as merging every range's output
/// afterwards with the same arithmetic, and within 2e-6 of one causal pass
/// over all keys (the two ranges split them: `Far(w)` and `Near(w)`; the
/// first `w` queries have no far key, a `−∞` log-sum-exp), at every SIMD
/// level, short and long tiles, the output buffer NaN first.
#[test]
fn the_last_range_merges_the_earlier_ones() {
    use posenc::extend::KeyRange;
    let slopes = [0.5f32, 0.25];
    for (t, w) in [(300, 100), (1100, 700)] {
        let (nq, nk) = (2 * 2 * t * 5, 2 * t * 5);
        let (q, k, v) = (data(nq, 31), data(nk, 32), data(nk, 33));
        let rows = ka::Rows::bhtd(2, t, 5);
        let whole = alibi_problem(t, true, [&q, &k, &v], &slopes);
        let far = ka::Problem {
            window: Some(KeyRange::Far(w)),
            ..alibi_problem(t, true, [&q, &k, &v], &slopes)
        };
        let near = ka::Problem {
            window: Some(KeyRange::Near(w)),
            ..alibi_problem(t, true, [&q, &k, &v], &slopes)
        };
        for level in SimdLevel::available() {
            let pass = |p: &ka::Problem| {
                let (mut out, mut lse) = (vec![f32::NAN; nq], vec![f32::NAN; 2 * 2 * t]);
                ka::forward(p, &mut out, rows, &mut lse, level);
                (out, lse)
            };
            let (all, _) = pass(&whole);
            let (o1, l1) = pass(&far);
            let (o2, l2) = pass(&near);
            assert!(l1[..w].iter().all(|l| *l == f32::NEG_INFINITY));
            let (mut merged, mut lse) = (vec![f32::NAN; nq], vec![f32::NAN; 2 * 2 * t]);
            let parts = ka::Parts {
                parts: &[(&o1, &l1)],
                rows,
            };
            ka::forward_merging(&near, &mut merged, rows, &mut lse, parts, level);
            assert_eq!(lse, l2, "{level}: the pass's own log-sum-exp");
            // Merged afterwards: weights e^{lse − m} over their sum.
            let mut after = vec![0f32; nq];
            for (row, li) in after.chunks_mut(5).zip(0..) {
                let m = f32::NEG_INFINITY.max(l1[li]).max(l2[li]);
                let z = (l1[li] - m).exp() + (l2[li] - m).exp();
                for (o, l) in [(&o1, l1[li]), (&o2, l2[li])] {
                    let f = (l - m).exp() / z;
                    if f != 0.0 {
                        for (x, y) in row.iter_mut().zip(&o[li * 5..li * 5 + 5]) {
                            *x += f * y;
                        }
                    }
                }
            }
            let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&merged), bits(&after), "T {t}, {level}");
            for (a, b) in merged.iter().zip(&all) {
                assert!((a - b).abs() <= 2e-6, "T {t}, {level}: {a} vs {b}");
            }
        }
    }
}

/// `∂L/∂q`, `∂L/∂k`, `∂L/∂v` of `L = Σ d_o · softmax(scale·q·kᵀ + ALiBi)·v`
/// in `f64`, for `(B, H_q, T, D)` queries and `(B, 1, T, D)` keys and
/// values (every query head shares the one key/value head).
fn reference_grads(
    dims: ka::Dims,
    causal: bool,
    slopes: &[f32],
    [q, k, v, d_o]: [&[f32]; 4],
) -> [Vec<f64>; 3] {
    let (t, d, hq) = (dims.q_len, dims.head_dim, dims.q_heads);
    let (mut dq, mut dk, mut dv) = (
        vec![0f64; q.len()],
        vec![0f64; k.len()],
        vec![0f64; v.len()],
    );
    let at = |x: &[f32], row: usize, c: usize| x[row * d + c] as f64;
    for b in 0..dims.batch {
        for (h, &slope) in slopes.iter().enumerate().take(hq) {
            let qr = (b * hq + h) * t;
            let kr = b * t;
            for i in 0..t {
                let seen = if causal { i + 1 } else { t };
                let logits: Vec<f64> = (0..seen)
                    .map(|j| {
                        let dot: f64 = (0..d).map(|c| at(q, qr + i, c) * at(k, kr + j, c)).sum();
                        let r = j as f64 - i as f64;
                        let m = slope as f64;
                        0.4 * dot + if causal { m * r } else { -m * r.abs() }
                    })
                    .collect();
                let mx = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = logits.iter().map(|x| (x - mx).exp()).collect();
                let z: f64 = e.iter().sum();
                let p: Vec<f64> = e.iter().map(|x| x / z).collect();
                let dp: Vec<f64> = (0..seen)
                    .map(|j| (0..d).map(|c| at(d_o, qr + i, c) * at(v, kr + j, c)).sum())
                    .collect();
                let mean: f64 = p.iter().zip(&dp).map(|(a, b)| a * b).sum();
                for j in 0..seen {
                    let ds = p[j] * (dp[j] - mean);
                    for c in 0..d {
                        dv[(kr + j) * d + c] += p[j] * at(d_o, qr + i, c);
                        dq[(qr + i) * d + c] += 0.4 * ds * at(k, kr + j, c);
                        dk[(kr + j) * d + c] += 0.4 * ds * at(q, qr + i, c);
                    }
                }
            }
        }
    }
    [dq, dk, dv]
}

#[test]
fn results_do_not_depend_on_the_thread_count() {
    // Shaw's tables on 16 (batch, head) pairs; RoPE on one pair of grouped
    // heads, whose backward pass splits the keys into runs.
    let shaw = Case {
        b: 4,
        hq: 4,
        hk: 4,
        d: 16,
        ..base(150)
    };
    let runs = one_batch(700, 4, 2, 16);
    for (kind, c) in [(Kind::Shaw, shaw), (Kind::Rope, runs)] {
        let run = |threads: usize| run_with_threads(kind, &c, threads);
        let one = run(1);
        let two = run(2);
        let three = run(3);
        assert!(
            one.iter()
                .zip(&two)
                .chain(one.iter().zip(&three))
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{kind:?}: results differ between thread counts"
        );
    }
}

/// The output and every gradient of `sum(out²)`, flattened, computed on a
/// pool of `threads` threads.
fn run_with_threads(kind: Kind, c: &Case, threads: usize) -> Vec<f32> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    pool.install(|| {
        let q = var(&shape(c, c.hq, c.tq), 1, 1.0);
        let k = var(&shape(c, c.hk, c.tk), 2, 1.0);
        let v = var(&shape(c, c.hk, c.tk), 3, 1.0);
        let h = Hooked::new(kind, c, 4);
        let out = Attention::new(true)
            .forward(
                q.as_tensor(),
                k.as_tensor(),
                v.as_tensor(),
                &h.hooks(),
                AttnPositions::default(),
            )
            .unwrap();
        let g = out.sqr().unwrap().sum_all().unwrap().backward().unwrap();
        let mut all = out.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        for x in [&q, &k, &v].into_iter().chain(&h.params) {
            all.extend(
                g.get(x.as_tensor())
                    .unwrap()
                    .flatten_all()
                    .unwrap()
                    .to_vec1::<f32>()
                    .unwrap(),
            );
        }
        all
    })
}

#[test]
fn bad_inputs_are_typed_errors() {
    let q = Tensor::zeros((1, 3, 4, 8), DType::F32, &DEV).unwrap();
    let k = Tensor::zeros((1, 2, 4, 8), DType::F32, &DEV).unwrap();
    let attn = Attention::new(true);
    let none = AttentionHooks::default();
    let pos = AttnPositions::default();
    // 3 query heads do not group over 2 key heads
    assert!(attn.forward(&q, &k, &k, &none, pos).is_err());
    let k3 = Tensor::zeros((1, 3, 4, 6), DType::F32, &DEV).unwrap();
    assert!(attn.forward(&q, &k3, &k3, &none, pos).is_err());
    let q3 = Tensor::zeros((3, 4, 8), DType::F32, &DEV).unwrap();
    assert!(attn.forward(&q3, &q3, &q3, &none, pos).is_err());
    let alibi = Alibi::new(2, AlibiMode::Causal).unwrap();
    let with_alibi = AttentionHooks {
        logits: Some(&alibi),
        ..Default::default()
    };
    let q = Tensor::zeros((1, 3, 4, 8), DType::F32, &DEV).unwrap();
    assert!(attn.forward(&q, &q, &q, &with_alibi, pos).is_err());
    let bad_dense = DenseBias(Tensor::zeros((5, 4), DType::F32, &DEV).unwrap());
    let h = AttentionHooks {
        logits: Some(&bad_dense),
        ..Default::default()
    };
    assert!(attn.forward(&q, &q, &q, &h, pos).is_err());
    let ids = Tensor::new(&[[0i64, 1, -2, 3]], &DEV).unwrap();
    assert!(attn
        .forward(&q, &q, &q, &none, AttnPositions::same(Positions::Ids(&ids)))
        .is_err());
    let qkv = Tensor::zeros((1, 4, 30), DType::F32, &DEV).unwrap();
    assert!(attn.forward_packed(&qkv, 4, 2, &none, pos).is_err());
}

#[test]
fn long_sequences_stream_without_a_square_matrix() {
    // 20 000 queries × 20 000 keys would need 1.6 GB of logits per head in
    // the composed path; the fused forward keeps tiles only.
    let t = 20_000;
    let q = Tensor::from_vec(data(t * 4, 1), (1, 1, t, 4), &DEV).unwrap();
    let alibi = Alibi::new(1, AlibiMode::Causal).unwrap();
    let h = AttentionHooks {
        logits: Some(&alibi),
        ..Default::default()
    };
    let out = Attention::new(true)
        .forward(&q, &q, &q, &h, AttnPositions::default())
        .unwrap();
    let v = out.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    assert!(v.iter().all(|x| x.is_finite()));
    // The first query sees only itself.
    let first = q.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    for x in 0..4 {
        assert!((v[x] - first[x]).abs() < 1e-6);
    }
}

/// Past [`ka::LONG_KEYS`] keys the forward's tile products run on posenc's
/// tile kernel at AVX2 and at AVX-512 (the `gemm` crate only without
/// AVX2), whose sums have the same order at every level: the two levels
/// give the same bits.
#[test]
fn long_tiles_have_the_same_bits_at_avx2_and_avx512() {
    let levels = SimdLevel::available();
    if !(levels.contains(&SimdLevel::Avx2) && levels.contains(&SimdLevel::Avx512)) {
        eprintln!("skipped: this CPU lacks AVX2 or AVX-512 ({levels:?})");
        return;
    }
    let (t, d) = (ka::LONG_KEYS + 300, 64);
    let q = Tensor::from_vec(data(2 * t * d, 1), (1, 2, t, d), &DEV).unwrap();
    let k = Tensor::from_vec(data(t * d, 2), (1, 1, t, d), &DEV).unwrap();
    let v = Tensor::from_vec(data(t * d, 3), (1, 1, t, d), &DEV).unwrap();
    let f = RopeFrequencies::plain(10000.0, d, PairLayout::HalfSplit).unwrap();
    let rope = Rope::new(f).unwrap();
    let hooks = AttentionHooks {
        query_key: Some(&rope),
        ..Default::default()
    };
    let run = |level: SimdLevel| -> Vec<u32> {
        Attention::new(true)
            .with_simd_level(level)
            .unwrap()
            .forward(&q, &k, &v, &hooks, AttnPositions::default())
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap()
            .iter()
            .map(|x| x.to_bits())
            .collect()
    };
    assert_eq!(run(SimdLevel::Avx2), run(SimdLevel::Avx512));
}
