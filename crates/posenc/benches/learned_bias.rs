//! `cargo bench -p posenc --bench learned_bias`: forward and forward +
//! backward of the learned biases at the lab's reference size (batch 32,
//! 4 heads, head dim 32, length 128) and at length 512: FIRE (distinct-input
//! table and the direct grid), CoPE, forgetting attention, and the `O(T)`
//! scan against the triangular matmul.

use candle_core::{DType, Device, Tensor, Var};
use candle_nn::{VarBuilder, VarMap};
use divan::Bencher;
use posenc::relative::cope::CopeConfig;
use posenc::relative::fire::FireConfig;
use posenc::relative::forgetting::ForgetGateConfig;
use posenc::tensor::cope::CopeBias;
use posenc::tensor::fire::FireBias;
use posenc::tensor::forgetting::ForgettingBias;
use posenc::tensor::scan::{cumsum_last_matmul, reverse_cumsum_last};

fn main() {
    divan::main();
}

const B: usize = 32;
const H: usize = 4;
const D: usize = 32;
const LENGTHS: [usize; 2] = [128, 512];

fn vb(vm: &VarMap) -> VarBuilder<'_> {
    VarBuilder::from_varmap(vm, DType::F32, &Device::Cpu)
}

#[divan::bench(args = LENGTHS)]
fn fire_forward(bencher: Bencher, t: usize) {
    let vm = VarMap::new();
    let fire = FireBias::new(FireConfig::new(H).unwrap(), vb(&vm)).unwrap();
    bencher.bench_local(|| fire.forward(t, t, 0.into(), 0.into()).unwrap());
}

#[divan::bench(args = LENGTHS)]
fn fire_forward_grid(bencher: Bencher, t: usize) {
    let vm = VarMap::new();
    let fire = FireBias::new(FireConfig::new(H).unwrap(), vb(&vm)).unwrap();
    bencher.bench_local(|| fire.direct().forward(t, t, 0.into(), 0.into()).unwrap());
}

#[divan::bench(args = LENGTHS)]
fn fire_backward(bencher: Bencher, t: usize) {
    let vm = VarMap::new();
    let fire = FireBias::new(FireConfig::new(H).unwrap(), vb(&vm)).unwrap();
    bencher.bench_local(|| {
        let b = fire.forward(t, t, 0.into(), 0.into()).unwrap();
        b.sum_all().unwrap().backward().unwrap()
    });
}

fn qk(t: usize) -> (Var, Var) {
    let q = Tensor::randn(0f32, 1.0, (B, H, t, D), &Device::Cpu).unwrap();
    let k = Tensor::randn(0f32, 1.0, (B, H, t, D), &Device::Cpu).unwrap();
    (Var::from_tensor(&q).unwrap(), Var::from_tensor(&k).unwrap())
}

#[divan::bench(args = LENGTHS)]
fn cope_forward(bencher: Bencher, t: usize) {
    let vm = VarMap::new();
    let cope = CopeBias::new(CopeConfig::new(D, 64).unwrap(), vb(&vm)).unwrap();
    let (q, k) = qk(t);
    bencher.bench_local(|| cope.bias(&q, &k, 0.into(), 0.into()).unwrap());
}

#[divan::bench(args = LENGTHS)]
fn cope_backward(bencher: Bencher, t: usize) {
    let vm = VarMap::new();
    let cope = CopeBias::new(CopeConfig::new(D, 64).unwrap(), vb(&vm)).unwrap();
    let (q, k) = qk(t);
    bencher.bench_local(|| {
        let b = cope.bias(&q, &k, 0.into(), 0.into()).unwrap();
        b.sum_all().unwrap().backward().unwrap()
    });
}

#[divan::bench(args = LENGTHS)]
fn forgetting_backward(bencher: Bencher, t: usize) {
    let vm = VarMap::new();
    let fox = ForgettingBias::new(ForgetGateConfig::new(H * D, H).unwrap(), vb(&vm)).unwrap();
    let x =
        Var::from_tensor(&Tensor::randn(0f32, 1.0, (B, t, H * D), &Device::Cpu).unwrap()).unwrap();
    bencher.bench_local(|| {
        let b = fox.bias(&x, 0.into(), t).unwrap();
        b.sum_all().unwrap().backward().unwrap()
    });
}

#[divan::bench(args = LENGTHS)]
fn scan_reverse(bencher: Bencher, t: usize) {
    let x = Tensor::randn(0f32, 1.0, (B, H, t, t), &Device::Cpu).unwrap();
    bencher.bench_local(|| reverse_cumsum_last(&x).unwrap());
}

#[divan::bench(args = LENGTHS)]
fn scan_reverse_matmul(bencher: Bencher, t: usize) {
    let x = Tensor::randn(0f32, 1.0, (B, H, t, t), &Device::Cpu).unwrap();
    bencher.bench_local(|| cumsum_last_matmul(&x, true).unwrap());
}
