//! `posenc::tensor::axial::AxialRope`: the fused multi-axis path against the
//! composed reference (values and gradients), against the f64 rotation of
//! `AxialFrequencies::rotate`, against 1-D `Rope` on text positions, every
//! SIMD level, in place, and its typed errors.

use candle_core::{DType, Device, Tensor, Var};
use posenc::kernels::SimdLevel;
use posenc::rope::axial::{AxialFrequencies, AxisSplit};
use posenc::rope::mrope::{rope_index, IndexRules, Mrope, MropeLayout, Segment};
use posenc::rope::scaling::named::FactorScaling;
use posenc::rope::vision::{llama4_vision, pixtral};
use posenc::rope::{PairLayout, RopeConfig, RopeFrequencies};
use posenc::tensor::axial::{AxialRope, AxisPositions};
use posenc::tensor::rope::{HeadLayout, Positions, Rope};
use posenc::Error;

use crate::common;
use common::{assert_heads_rotated, dims, vals, Rng};

const CPU: Device = Device::Cpu;

/// The frequencies under test: M-RoPE chunked and interleaved, GLM-4V-like
/// interleaved pairs with partial rotary, Pixtral, Llama 4 vision, a 3-axis
/// axial RoPE; with the head dimension each is applied to.
fn cases() -> Vec<(&'static str, AxialFrequencies, usize)> {
    let mrope = |config: RopeConfig, sections: Vec<usize>, layout: MropeLayout| {
        Mrope::new(config, sections, layout)
            .unwrap()
            .frequencies(None)
            .unwrap()
    };
    let chunked = mrope(
        RopeConfig::new(1e6, 32).unwrap(),
        vec![4, 6, 6],
        MropeLayout::Chunked,
    );
    let inter = mrope(
        RopeConfig::new(5e6, 32).unwrap(),
        vec![6, 5, 5],
        MropeLayout::Interleaved,
    );
    let glm = mrope(
        RopeConfig::new(1e4, 16)
            .unwrap()
            .with_head_dim(32)
            .with_layout(PairLayout::Interleaved),
        vec![2, 3, 3],
        MropeLayout::Chunked,
    );
    // YaRN at factor 4 from 64 tokens, every other parameter transformers'
    // default (β_fast 32, β_slow 1, truncated correction range).
    let yarn = mrope(
        RopeConfig::new(1e6, 32)
            .unwrap()
            .with_scaling(FactorScaling::Yarn.rope_scaling(4.0, 64))
            .unwrap(),
        vec![4, 6, 6],
        MropeLayout::Chunked,
    );
    vec![
        ("mrope chunked", chunked, 32),
        ("mrope interleaved", inter, 32),
        ("glm-4v partial interleaved pairs", glm, 32),
        ("mrope + yarn", yarn, 32),
        ("pixtral", pixtral(1e4, 16).unwrap(), 16),
        ("llama4 vision", llama4_vision(1e4, 24).unwrap(), 24),
        (
            "axial 3-d",
            AxialFrequencies::axial(100.0, 24, 3, AxisSplit::Interleaved, PairLayout::HalfSplit)
                .unwrap(),
            24,
        ),
    ]
}

fn random_ids(rng: &mut Rng, na: usize, b: usize, t: usize, max: u64) -> Vec<u64> {
    (0..b * t * na).map(|_| rng.below(max)).collect()
}

/// `(A, B, T)` tensor of the row-major `(B, T, A)` host positions.
fn ids_tensor(host: &[u64], na: usize, b: usize, t: usize, dtype: DType) -> Tensor {
    let mut planes = vec![0u32; na * b * t];
    for i in 0..b * t {
        for a in 0..na {
            planes[a * b * t + i] = host[i * na + a] as u32;
        }
    }
    Tensor::from_vec(planes, (na, b, t), &CPU)
        .unwrap()
        .to_dtype(dtype)
        .unwrap()
}

#[test]
fn fused_matches_reference_and_f64_rotation() {
    let mut rng = Rng(0x5eed_1234_9abc_def1);
    for (name, f, d) in cases() {
        let na = f.num_axes();
        for layout in [HeadLayout::Bhtd, HeadLayout::Bthd] {
            for dtype in [DType::F32, DType::BF16, DType::F16] {
                let rope = AxialRope::new(f.clone()).unwrap().with_layout(layout);
                let (b, hq, hk, t) = (2, 3, 1, 9);
                let q = rng.tensor(&dims(layout, b, hq, t, d), dtype);
                let k = rng.tensor(&dims(layout, b, hk, t, d), dtype);
                let host = random_ids(&mut rng, na, b, t, 5000);
                let ctx = format!("{name} {layout} {dtype:?}");
                let (fq, fk) = rope.apply(&q, &k, AxisPositions::Host(&host)).unwrap();
                let (rq, rk) = rope
                    .apply_reference(&q, &k, AxisPositions::Host(&host))
                    .unwrap();
                assert_close(&fq, &rq, dtype, &format!("{ctx} q"));
                assert_close(&fk, &rk, dtype, &format!("{ctx} k"));
                // the same positions as an (A, B, T) tensor of ids
                for idt in [DType::U32, DType::I64] {
                    let ids = ids_tensor(&host, na, b, t, idt);
                    let (gq, _) = rope.apply(&q, &k, &ids).unwrap();
                    assert_eq!(vals(&gq), vals(&fq), "{ctx} ids {idt:?}");
                }
                if dtype == DType::F32 {
                    // against the plain f64 rotation of every head vector
                    let (qv, out) = (vals(&q), vals(&fq));
                    let shape = [b, hq, t, d];
                    assert_heads_rotated(&qv, &out, layout, shape, 2e-6, &ctx, |bb, tt, x| {
                        let p = &host[(bb * t + tt) * na..(bb * t + tt + 1) * na];
                        f.rotate(x, p).unwrap();
                    });
                }
            }
        }
    }
}

fn grads(
    rope: &AxialRope,
    q: &Tensor,
    k: &Tensor,
    host: &[u64],
    w: &Tensor,
    fused: bool,
) -> (Tensor, Tensor) {
    let qv = Var::from_tensor(q).unwrap();
    let kv = Var::from_tensor(k).unwrap();
    let (a, b) = if fused {
        rope.apply(qv.as_tensor(), kv.as_tensor(), AxisPositions::Host(host))
            .unwrap()
    } else {
        rope.apply_reference(qv.as_tensor(), kv.as_tensor(), AxisPositions::Host(host))
            .unwrap()
    };
    let loss = ((a * w).unwrap().sum_all().unwrap() + (b * w).unwrap().sum_all().unwrap()).unwrap();
    let g = loss.backward().unwrap();
    (
        g.get(qv.as_tensor()).unwrap().clone(),
        g.get(kv.as_tensor()).unwrap().clone(),
    )
}

#[test]
fn backward_matches_reference_gradients() {
    let mut rng = Rng(0xfeed_beef_0bad_cafe);
    for (name, f, d) in cases() {
        let rope = AxialRope::new(f.clone()).unwrap();
        let (b, h, t) = (2, 2, 7);
        let q = rng.tensor(&[b, h, t, d], DType::F32);
        let k = rng.tensor(&[b, h, t, d], DType::F32);
        let w = rng.tensor(&[b, h, t, d], DType::F32);
        let host = random_ids(&mut rng, f.num_axes(), b, t, 300);
        let (gq, gk) = grads(&rope, &q, &k, &host, &w, true);
        let (rq, rk) = grads(&rope, &q, &k, &host, &w, false);
        assert_close(&gq, &rq, DType::F32, &format!("{name} dq"));
        assert_close(&gk, &rk, DType::F32, &format!("{name} dk"));
        // the gradient of a rotation is the inverse rotation: not the identity
        assert!(
            vals(&gq)
                .iter()
                .zip(vals(&w))
                .any(|(a, b)| (a - b).abs() > 1e-3),
            "{name}"
        );
    }
}

#[test]
fn text_positions_equal_one_dimensional_rope() {
    // M-RoPE on text (t = h = w) is plain RoPE with the same frequencies
    let cfg = RopeConfig::new(1e6, 32).unwrap();
    let m = Mrope::new(cfg.clone(), vec![4, 6, 6], MropeLayout::Chunked).unwrap();
    let axial = AxialRope::new(m.frequencies(None).unwrap()).unwrap();
    let plain = Rope::new(cfg).unwrap();
    let mut rng = Rng(7);
    let q = rng.tensor(&[2, 2, 6, 32], DType::F32);
    let k = rng.tensor(&[2, 2, 6, 32], DType::F32);
    let (a, _) = axial.apply(&q, &k, 40usize).unwrap();
    let (p, _) = plain.apply(&q, &k, 40usize).unwrap();
    assert_eq!(vals(&a), vals(&p));
    let ids =
        Tensor::from_vec((0..12u32).map(|i| i * 7).collect::<Vec<_>>(), (2, 6), &CPU).unwrap();
    let (a, _) = axial
        .apply(&q, &k, AxisPositions::Same(Positions::Ids(&ids)))
        .unwrap();
    let (p, _) = plain.apply(&q, &k, &ids).unwrap();
    assert_eq!(vals(&a), vals(&p));
}

#[test]
fn mrope_prompt_end_to_end() {
    // positions of a text-image-video prompt through the fused path
    let m = Mrope::new(
        RopeConfig::new(1e6, 32).unwrap(),
        vec![4, 6, 6],
        MropeLayout::Chunked,
    )
    .unwrap();
    let ids = rope_index(
        &[
            Segment::Text(4),
            Segment::Image { t: 1, h: 4, w: 6 },
            Segment::Text(2),
            Segment::Video {
                t: 3,
                h: 2,
                w: 2,
                seconds_per_grid: Some(0.5),
            },
            Segment::Text(3),
        ],
        IndexRules::Qwen25Vl {
            tokens_per_second: 2.0,
        },
        2,
    )
    .unwrap();
    let f = m.frequencies(None).unwrap();
    let rope = AxialRope::new(f.clone()).unwrap();
    let mut rng = Rng(99);
    let q = rng.tensor(&[1, 2, ids.len(), 32], DType::F32);
    let flat = ids.flat();
    let y = rope.rotate(&q, AxisPositions::Host(&flat)).unwrap();
    let qv = vals(&q);
    let yv = vals(&y);
    for (i, p) in ids.ids.iter().enumerate() {
        let mut x: Vec<f64> = qv[i * 32..(i + 1) * 32].iter().map(|&v| v as f64).collect();
        f.rotate(&mut x, p).unwrap();
        for j in 0..32 {
            assert!(
                (yv[i * 32 + j] as f64 - x[j]).abs() < 2e-6,
                "token {i} {p:?}"
            );
        }
    }
}

#[test]
fn every_simd_level_and_in_place() {
    let mut rng = Rng(0x1234);
    for (name, f, d) in cases() {
        let host = random_ids(&mut rng, f.num_axes(), 2, 5, 1000);
        let q = rng.tensor(&[2, 3, 5, d], DType::F32);
        let k = rng.tensor(&[2, 1, 5, d], DType::F32);
        let scalar = AxialRope::new(f.clone())
            .unwrap()
            .with_simd_level(SimdLevel::Scalar)
            .unwrap();
        let (sq, sk) = scalar.apply(&q, &k, AxisPositions::Host(&host)).unwrap();
        for level in SimdLevel::available() {
            let r = AxialRope::new(f.clone())
                .unwrap()
                .with_simd_level(level)
                .unwrap();
            let (fq, fk) = r.apply(&q, &k, AxisPositions::Host(&host)).unwrap();
            assert_close(&fq, &sq, DType::F32, &format!("{name} {level} q"));
            assert_close(&fk, &sk, DType::F32, &format!("{name} {level} k"));
            let (iq, ik) = (q.copy().unwrap(), k.copy().unwrap());
            r.apply_inplace(&iq, &ik, AxisPositions::Host(&host))
                .unwrap();
            assert_eq!(vals(&iq), vals(&fq), "{name} {level} in place");
            assert_eq!(vals(&ik), vals(&fk), "{name} {level} in place");
        }
    }
}

#[test]
fn typed_errors() {
    let f = pixtral(1e4, 16).unwrap();
    let rope = AxialRope::new(f).unwrap();
    let q = Tensor::zeros((1, 2, 3, 16), DType::F32, &CPU).unwrap();
    // wrong number of host positions
    let e = rope
        .apply(&q, &q.copy().unwrap(), AxisPositions::Host(&[0, 1, 2]))
        .unwrap_err();
    assert!(matches!(e, Error::Shape { .. }), "{e}");
    // ids of the wrong shape: 3 axes for a 2-axis rope
    let ids = Tensor::zeros((3, 1, 3), DType::U32, &CPU).unwrap();
    assert!(matches!(
        rope.apply(&q, &q.copy().unwrap(), &ids).unwrap_err(),
        Error::Shape { .. }
    ));
    // negative ids
    let ids = Tensor::from_vec(vec![0i64, 1, -4, 0, 0, 0], (2, 1, 3), &CPU).unwrap();
    assert!(matches!(
        rope.apply(&q, &q.copy().unwrap(), &ids).unwrap_err(),
        Error::NegativePosition(-4)
    ));
    // float ids
    let ids = Tensor::zeros((2, 1, 3), DType::F32, &CPU).unwrap();
    assert!(matches!(
        rope.apply(&q, &q.copy().unwrap(), &ids).unwrap_err(),
        Error::DType { .. }
    ));
    // head narrower than the rotary dimension
    let small = Tensor::zeros((1, 2, 3, 8), DType::F32, &CPU).unwrap();
    assert!(matches!(
        rope.rotate(&small, AxisPositions::Host(&[0; 6]))
            .unwrap_err(),
        Error::InvalidDimension { .. }
    ));
    // in place on a view
    let big = Tensor::zeros((2, 2, 3, 16), DType::F32, &CPU).unwrap();
    let view = big.narrow(0, 0, 1).unwrap();
    assert!(matches!(
        rope.apply_inplace(&view, &q.copy().unwrap(), AxisPositions::Host(&[0; 6]))
            .unwrap_err(),
        Error::InvalidValue { .. }
    ));
    // 1-D frequencies spread over axes: a bad axis is refused
    let f1 = RopeFrequencies::plain(1e4, 8, PairLayout::HalfSplit).unwrap();
    assert!(AxialFrequencies::from_frequencies(&f1, vec![0, 1, 2, 3], 3).is_err());
}

fn assert_close(got: &Tensor, want: &Tensor, dtype: DType, ctx: &str) {
    common::assert_close(got, want, dtype, 8.0, ctx);
}
