//! Training-free context methods: the fused path (one streaming pass per
//! range, merged by log-sum-exp) against the reference path (every logit
//! written out in f64), at edge sizes, with grouped-query heads, in a
//! prefill and in KV-cache decode steps, at every SIMD level of this CPU;
//! and the rules themselves against hand-computed positions.

use candle_core::{Device, Tensor};
use posenc::extend::{ContextMethod, KeyRange, ModelLengths, PosMap};
use posenc::kernels::SimdLevel;
use posenc::rope::{PairLayout, RopeFrequencies};
use posenc::tensor::attention::{Attention, AttentionHooks, AttnPositions};
use posenc::tensor::extend::MethodAttention;
use posenc::tensor::rope::Rope;

const METHODS: [&str; 7] = [
    "self-extend:4:16",
    "self-extend:2:2",
    "rerope:16",
    "leaky-rerope:16:4",
    "dca:48:16",
    "dca:3:1",
    "sinks:4:32",
];

fn rope(d: usize) -> Rope {
    Rope::new(RopeFrequencies::plain(10_000.0, d, PairLayout::HalfSplit).unwrap()).unwrap()
}

fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
    (a - b)
        .unwrap()
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap()
}

fn packed(t: usize, hq: usize, hk: usize, d: usize, seed: u64) -> Tensor {
    // Dirty, deterministic inputs (candle's randn is seeded per device).
    let n = t * (hq + 2 * hk) * d;
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let v: Vec<f32> = (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((x >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 3.0
        })
        .collect();
    Tensor::from_vec(v, (1, t, (hq + 2 * hk) * d), &Device::Cpu).unwrap()
}

/// A model trained at `n` positions, with `max_position_embeddings` `n`.
fn trained_at(n: usize) -> ModelLengths {
    ModelLengths {
        trained: Some(n),
        max_position_embeddings: Some(n),
    }
}

fn levels() -> Vec<SimdLevel> {
    [SimdLevel::Scalar, SimdLevel::Avx2, SimdLevel::Avx512]
        .into_iter()
        .filter(|l| l.is_supported())
        .collect()
}

/// The method named `m` on `r`, its kernels at `level`.
fn method_at<'r>(
    m: &str,
    r: &'r Rope,
    lengths: ModelLengths,
    level: SimdLevel,
) -> MethodAttention<'r> {
    let method: ContextMethod = m.parse().unwrap();
    MethodAttention::new(method, r, lengths)
        .unwrap()
        .with_simd_level(level)
        .unwrap()
}

/// The fused and the reference packed paths of `attn` agree within 2e-5.
fn assert_fused_equals_reference(
    attn: &MethodAttention<'_>,
    qkv: &Tensor,
    (hq, hk): (usize, usize),
    ctx: &str,
) {
    let fused = attn.forward_packed(qkv, hq, hk).unwrap();
    let reference = attn.forward_packed_reference(qkv, hq, hk).unwrap();
    let diff = max_diff(&fused, &reference);
    assert!(diff < 2e-5, "{ctx}: {diff}");
}

#[test]
fn fused_equals_reference_at_edge_sizes() {
    let lengths = trained_at(40);
    let (hq, hk, d) = (4, 2, 16);
    let r = rope(d);
    for m in METHODS {
        for level in levels() {
            let attn = method_at(m, &r, lengths, level);
            for t in [1, 2, 3, 127, 128, 129] {
                let qkv = packed(t, hq, hk, d, t as u64);
                assert_fused_equals_reference(
                    &attn,
                    &qkv,
                    (hq, hk),
                    &format!("{m} {level:?} T={t}"),
                );
            }
        }
    }
}

/// Methods whose range boundaries fall inside the long tiles at 1,100
/// tokens (a model trained at 600).
const LONG_TILE_METHODS: [&str; 5] = [
    "self-extend:4:200",
    "rerope:300",
    "leaky-rerope:300:2",
    "dca:700:100",
    "sinks:4:500",
];

/// More than 1,024 keys: the long-sequence tiles (512 keys, 96 queries),
/// where a range boundary falls inside a tile.
#[test]
fn fused_equals_reference_on_long_tiles() {
    let lengths = trained_at(600);
    let (hq, hk, d) = (2, 1, 8);
    let r = rope(d);
    for m in LONG_TILE_METHODS {
        for level in levels() {
            let attn = method_at(m, &r, lengths, level);
            let t = 1100;
            let qkv = packed(t, hq, hk, d, 7);
            assert_fused_equals_reference(&attn, &qkv, (hq, hk), &format!("{m} {level:?}"));
        }
    }
}

/// The same long tiles with bfloat16 products (AVX-512 BF16 CPUs only):
/// a range's first key tile starts inside a packed bfloat16 block, and the
/// output stays within bfloat16's rounding of the reference.
#[test]
fn bf16_products_on_long_tiles() {
    if !posenc::kernels::bf16::supported() {
        eprintln!("skipped: this CPU has no AVX512_BF16");
        return;
    }
    let lengths = trained_at(600);
    let (hq, hk, d) = (2, 1, 8);
    let r = rope(d);
    for m in LONG_TILE_METHODS {
        let method: ContextMethod = m.parse().unwrap();
        let attn = MethodAttention::new(method, &r, lengths).unwrap();
        let qkv = packed(1100, hq, hk, d, 11);
        let reference = attn.forward_packed_reference(&qkv, hq, hk).unwrap();
        let f32s = attn.forward_packed(&qkv, hq, hk).unwrap();
        let bf16 = attn
            .with_products(posenc::kernels::attention::Products::Bf16)
            .unwrap()
            .forward_packed(&qkv, hq, hk)
            .unwrap();
        let e = max_diff(&bf16, &reference);
        assert!(e < 3e-2, "{m}: bfloat16 output differs by {e}");
        assert!(e > 0.0, "{m}: no bfloat16 rounding at all");
        assert!(max_diff(&f32s, &reference) < 2e-5, "{m}: f32 output");
    }
}

/// `buffers::method_forward` writes the bits of
/// `MethodAttention::forward_buffers` in either layout: two ranges merged,
/// and one range written directly (Self-Extend with a window covering the
/// input: its grouped range holds no key).
#[test]
fn buffer_layouts_hold_the_same_bits() {
    use posenc::buffers::{method_forward, AttentionShape, OutLayout};
    let (b, hq, hk, t, d) = (2, 4, 2, 300, 16);
    let r = rope(d);
    let lengths = trained_at(40);
    let all = packed(b * t, hq, hk, d, 5)
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    let (nq, nkv) = (b * hq * t * d, b * hk * t * d);
    let (q, rest) = all.split_at(nq);
    let (k, rest) = rest.split_at(nkv);
    let v = &rest[..nkv];
    let s = AttentionShape::new(b, hq, hk, t, t, d);
    for m in [
        "self-extend:4:16",
        "self-extend:2:1000",
        "sinks:4:32",
        "dca:48:16",
    ] {
        let method: ContextMethod = m.parse().unwrap();
        let attn = MethodAttention::new(method, &r, lengths).unwrap();
        let want = attn.forward_buffers(q, k, v, s).unwrap();
        let mut bthd = vec![f32::NAN; nq];
        method_forward(method, &r, lengths, q, k, v, s, &mut bthd, OutLayout::Bthd).unwrap();
        assert_eq!(bthd, want, "{m}: (B, T, H, D)");
        let mut bhtd = vec![f32::NAN; nq];
        method_forward(method, &r, lengths, q, k, v, s, &mut bhtd, OutLayout::Bhtd).unwrap();
        for bi in 0..b {
            for h in 0..hq {
                for ti in 0..t {
                    let x = &bhtd[((bi * hq + h) * t + ti) * d..][..d];
                    let y = &want[((bi * t + ti) * hq + h) * d..][..d];
                    assert_eq!(x, y, "{m}: (B, H, T, D) at {bi} {h} {ti}");
                }
            }
        }
        let mut short = vec![0f32; nq - 1];
        assert!(
            method_forward(method, &r, lengths, q, k, v, s, &mut short, OutLayout::Bthd).is_err()
        );
    }
    // The covering window is plain causal RoPE attention.
    let cover: ContextMethod = "self-extend:2:1000".parse().unwrap();
    let attn = MethodAttention::new(cover, &r, lengths).unwrap();
    let qkv = packed(t, hq, hk, d, 9);
    assert_fused_equals_reference(&attn, &qkv, (hq, hk), "self-extend:2:1000");
}

/// A prefill followed by decode steps over the KV cache gives the rows of
/// one prefill over the whole sequence (every rule is a function of
/// absolute positions). DCA's mscale depends on the call's key count (as
/// the authors' tables do on the sequence length), so it is left out here.
#[test]
fn decode_steps_equal_the_prefill() {
    let lengths = ModelLengths {
        trained: Some(40),
        max_position_embeddings: None,
    };
    let (hq, hk, d) = (4, 2, 16);
    let r = rope(d);
    let t = 150;
    let qkv = packed(t, hq, hk, d, 3);
    let split = |x: &Tensor, n: usize| {
        let q = x
            .narrow(2, 0, hq * d)
            .unwrap()
            .reshape((1, n, hq, d))
            .unwrap();
        let k = x
            .narrow(2, hq * d, hk * d)
            .unwrap()
            .reshape((1, n, hk, d))
            .unwrap();
        let v = x
            .narrow(2, (hq + hk) * d, hk * d)
            .unwrap()
            .reshape((1, n, hk, d))
            .unwrap();
        (q, k, v)
    };
    for m in METHODS {
        let method: ContextMethod = m.parse().unwrap();
        let attn = MethodAttention::new(method, &r, lengths).unwrap();
        let whole = attn
            .forward_packed(&qkv, hq, hk)
            .unwrap()
            .reshape((1, t, hq, d))
            .unwrap();
        let (q, k, v) = split(&qkv, t);
        for (start, n) in [(0, 100), (100, 1), (101, 1), (102, 48)] {
            let qs = q.narrow(1, start, n).unwrap();
            let ks = k.narrow(1, 0, start + n).unwrap();
            let vs = v.narrow(1, 0, start + n).unwrap();
            let step = attn.forward(&qs, &ks, &vs).unwrap();
            let want = whole.narrow(1, start, n).unwrap();
            let diff = max_diff(&step, &want);
            assert!(diff < 1e-5, "{m} rows {start}..{}: {diff}", start + n);
            let reference = attn.forward_reference(&qs, &ks, &vs).unwrap();
            let diff = max_diff(&step, &reference);
            assert!(diff < 2e-5, "{m} reference rows {start}..: {diff}");
        }
    }
}

/// With windows at least the length, every method is plain RoPE attention.
#[test]
fn large_windows_are_plain_rope() {
    let (hq, hk, d) = (4, 2, 16);
    let r = rope(d);
    let t = 130;
    let qkv = packed(t, hq, hk, d, 11);
    let hooks = AttentionHooks {
        query_key: Some(&r),
        ..Default::default()
    };
    let plain = Attention::new(true)
        .forward_packed(&qkv, hq, hk, &hooks, AttnPositions::default())
        .unwrap();
    for m in [
        "self-extend:1:130",
        "self-extend:4:132",
        "rerope:130",
        "leaky-rerope:200:3",
        "dca:300:100",
        "sinks:4:130",
    ] {
        let method: ContextMethod = m.parse().unwrap();
        let attn = MethodAttention::new(method, &r, ModelLengths::default()).unwrap();
        let out = attn.forward_packed(&qkv, hq, hk).unwrap();
        let diff = max_diff(&out, &plain);
        assert!(diff < 1e-5, "{m}: {diff}");
    }
}

/// The rules' positions, computed by hand from the authors' formulas.
#[test]
fn rules_match_the_papers_positions() {
    let views = |s: &str| s.parse::<ContextMethod>().unwrap().views();
    // Self-Extend G=4, W=512: query 1000 and key 100 are 900 apart: grouped,
    // q at 1000/4 + 512 − 128 = 634, k at 25.
    let se = views("self-extend:4:512");
    assert!(se[1].keys.contains(1000, 100) && !se[0].keys.contains(1000, 100));
    assert_eq!((se[1].query.at(1000), se[1].key.at(100)), (634, 25));
    assert!(se[0].keys.contains(1000, 489) && !se[0].keys.contains(1000, 488));
    // ReRoPE w=512: distance clipped at 512.
    let re = views("rerope:512");
    assert_eq!(re[1].query.at(5000) - re[1].key.at(10), 512);
    // Leaky ReRoPE w=512, k=16: distance 512 + (d − 512)/16, with the
    // frequencies divided by 16: (q − k)/16 for q = a + 512·15.
    let lk = views("leaky-rerope:512:16");
    let (a, j) = (5000usize, 10usize);
    let dist = (lk[1].query.at(a) - lk[1].key.at(j)) as f64 / lk[1].freq_divisor;
    assert!((dist - (512.0 + (a - j - 512) as f64 / 16.0)).abs() < 1e-12);
    // DCA chunk 6144, local 1024: chunks of 5120.
    let dca = views("dca:6144:1024");
    assert_eq!(dca[0].keys, KeyRange::Chunk { len: 5120, back: 0 });
    assert_eq!(dca[0].query.at(5121), 1);
    assert_eq!(dca[1].query.at(5121), 5121);
    assert_eq!(dca[1].query.at(10239), 6144);
    assert_eq!(dca[2].query, PosMap::Const(6144));
    assert_eq!(dca[2].key.at(5121), 1);
    // Sinks 4 + 1,020 recent (window 1,024): query 5000 sees keys 0..4 with
    // itself at slot 1,024, and keys 3,980..=5000 at their true distance.
    let sk = views("sinks:4:1024");
    assert!(sk[1].keys.contains(5000, 3) && !sk[1].keys.contains(5000, 4));
    assert!(sk[0].keys.contains(5000, 3980) && !sk[0].keys.contains(5000, 3979));
    assert_eq!(sk[1].query.at(5000), 1024);
    assert_eq!(sk[1].query.at(1000), 1000);
}

#[test]
fn logn_and_mscale() {
    let re: ContextMethod = "rerope:16".parse().unwrap();
    let l = trained_at(100);
    assert_eq!(re.query_scale(50, &l), 1.0);
    let want = (1000f32).ln() / (100f64).ln() as f32;
    assert_eq!(re.query_scale(999, &l), want);
    let dca: ContextMethod = "dca:48:16".parse().unwrap();
    assert_eq!(dca.logit_scale(100, &l), 1.0);
    let ms = 0.05 * 2f64.ln() + 1.0;
    assert!((dca.logit_scale(200, &l) - ms * ms).abs() < 1e-6);
}
