//! `cargo bench -p posenc --bench rope`: the cases of `posenc bench rope`
//! under divan — posenc in place and out of place, candle-nn's fused rope
//! (`rope` for (B, H, T, D), `rope_thd` for (B, T, H, D)), a parallel copy of
//! the same bytes, and building a 131072 × 64 cache.

use std::fmt;

use candle_core::{DType, Device, Tensor};
use divan::Bencher;
use posenc::kernels::bench::{parallel_copy, SHAPES};
use posenc::kernels::HeadLayout;
use posenc::rope::{PairLayout, RopeFrequencies};
use posenc::tensor::rope::{Role, Rope};

fn main() {
    divan::main();
}

#[derive(Clone, Copy)]
struct Case {
    shape: usize,
    bf16: bool,
}

impl fmt::Display for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (dims, layout) = SHAPES[self.shape];
        write!(
            f,
            "{dims:?}-{layout}-{}",
            if self.bf16 { "bf16" } else { "f32" }
        )
    }
}

const CASES: [Case; 8] = [
    Case {
        shape: 0,
        bf16: false,
    },
    Case {
        shape: 0,
        bf16: true,
    },
    Case {
        shape: 1,
        bf16: false,
    },
    Case {
        shape: 1,
        bf16: true,
    },
    Case {
        shape: 2,
        bf16: false,
    },
    Case {
        shape: 2,
        bf16: true,
    },
    Case {
        shape: 3,
        bf16: false,
    },
    Case {
        shape: 3,
        bf16: true,
    },
];

struct Setup {
    x: Tensor,
    rope: Rope,
    cos: Tensor,
    sin: Tensor,
    layout: HeadLayout,
    offset: usize,
}

fn setup(c: Case) -> Setup {
    let (dims, layout) = SHAPES[c.shape];
    let dtype = if c.bf16 { DType::BF16 } else { DType::F32 };
    let (t, d) = match layout {
        HeadLayout::Bhtd => (dims[2], dims[3]),
        HeadLayout::Bthd => (dims[1], dims[3]),
    };
    let offset = if t == 1 { 4095 } else { 0 };
    let x = Tensor::randn(0f32, 1.0, dims.to_vec(), &Device::Cpu)
        .unwrap()
        .to_dtype(dtype)
        .unwrap();
    let f = RopeFrequencies::plain(500000.0, d, PairLayout::HalfSplit).unwrap();
    let rope = Rope::new(f.clone()).unwrap().with_layout(layout);
    rope.warm_up(offset + t).unwrap();
    let pos: Vec<u64> = (offset as u64..(offset + t) as u64).collect();
    let (cv, sv) = f.cos_sin_table(&pos);
    let cos = Tensor::from_vec(cv, (t, d / 2), &Device::Cpu)
        .unwrap()
        .to_dtype(dtype)
        .unwrap();
    let sin = Tensor::from_vec(sv, (t, d / 2), &Device::Cpu)
        .unwrap()
        .to_dtype(dtype)
        .unwrap();
    Setup {
        x,
        rope,
        cos,
        sin,
        layout,
        offset,
    }
}

#[divan::bench(args = CASES, sample_count = 20)]
fn posenc_inplace(b: Bencher, c: Case) {
    let s = setup(c);
    b.bench_local(|| s.rope.rotate_inplace(&s.x, s.offset, Role::Query).unwrap());
}

#[divan::bench(args = CASES, sample_count = 20)]
fn posenc(b: Bencher, c: Case) {
    let s = setup(c);
    b.bench_local(|| s.rope.rotate(&s.x, s.offset, Role::Query).unwrap());
}

#[divan::bench(args = CASES, sample_count = 20)]
fn candle(b: Bencher, c: Case) {
    let s = setup(c);
    b.bench_local(|| match s.layout {
        HeadLayout::Bhtd => candle_nn::rotary_emb::rope(&s.x, &s.cos, &s.sin).unwrap(),
        HeadLayout::Bthd => candle_nn::rotary_emb::rope_thd(&s.x, &s.cos, &s.sin).unwrap(),
    });
}

#[divan::bench(args = CASES, sample_count = 20)]
fn copy(b: Bencher, c: Case) {
    let s = setup(c);
    let src: Vec<f32> =
        s.x.to_dtype(DType::F32)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
    if c.bf16 {
        let src: Vec<half::bf16> = src.iter().map(|&v| half::bf16::from_f32(v)).collect();
        let mut dst = vec![half::bf16::ZERO; src.len()];
        b.bench_local(|| parallel_copy(&src, &mut dst));
    } else {
        let mut dst = vec![0f32; src.len()];
        b.bench_local(|| parallel_copy(&src, &mut dst));
    }
}

#[divan::bench(sample_count = 10)]
fn cache_131072x64(b: Bencher) {
    let f = RopeFrequencies::plain(500000.0, 128, PairLayout::HalfSplit).unwrap();
    b.bench_local(|| {
        let rope = Rope::new(f.clone())
            .unwrap()
            .with_max_cached_positions(131072);
        rope.warm_up(131072).unwrap();
        rope
    });
}
