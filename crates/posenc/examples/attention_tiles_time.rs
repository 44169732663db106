//! Times `kernels::tile::gemm` on one thread, at every SIMD level this CPU
//! has, on the products of the fused attention's tiles at head_dim 64 with
//! more than 1,024 keys, their operands' strides as the kernels lay them out:
//! the backward's five products (64 queries × 128 keys; `dK` has `dV`'s
//! shape) and the forward's two (96 queries × 512 keys).
//! `cargo run --release -p posenc --example attention_tiles_time`
//!
//! Each figure is the best of 7 rounds of about 2 GFLOP each, operands in
//! cache: the rate the register tiles reach, to set beside one core's FMA
//! rate (`scripts/bench/fma_peak.c`). Without AVX2 the forward's long tiles
//! run on the `gemm` crate; its rate on every shape is printed too, at the
//! level the crate picks (AVX-512 where the CPU has it: posenc enables
//! the crate's `x86-v4` feature).

use std::time::Instant;

mod common;
use common::fill;

use posenc::kernels::{tile, SimdLevel};

/// One product: `(name, m, n, k, A's row stride, A's column stride, ldb,
/// accumulate)`.
type Case = (&'static str, usize, usize, usize, usize, usize, usize, bool);

const CASES: [Case; 6] = [
    ("bwd S = Q·Kᵀ", 64, 128, 64, 80, 1, 144, false),
    ("bwd dP = dO·Vᵀ", 64, 128, 64, 80, 1, 144, false),
    ("bwd dV += Pᵀ·dO", 128, 64, 64, 1, 144, 80, true),
    ("bwd dQ += dS·K", 64, 64, 128, 144, 1, 80, true),
    ("fwd S = Q·Kᵀ", 96, 512, 64, 64, 1, 528, false),
    ("fwd O += P·V", 96, 64, 512, 512, 1, 64, true),
];

fn main() {
    let best = |flops: f64, f: &mut dyn FnMut()| -> f64 {
        let reps = (2e9 / flops).max(1.0) as usize;
        f();
        let mut best = f64::INFINITY;
        for _ in 0..7 {
            let t = Instant::now();
            for _ in 0..reps {
                f();
            }
            best = best.min(t.elapsed().as_secs_f64() / reps as f64);
        }
        flops / best / 1e9
    };
    println!("GFLOP/s on one thread (2·m·n·k a product)");
    for (name, m, n, k, rs, cs, ldb, accumulate) in CASES {
        // A's extent: its last element is (m − 1)·rs + (k − 1)·cs.
        let a = fill((m - 1) * rs + (k - 1) * cs + 1, 1);
        let b = fill((k - 1) * ldb + n, 2);
        let mut c = vec![0f32; m * n];
        let flops = 2.0 * (m * n * k) as f64;
        print!("{name:<18} {m:>3}x{n:<3}x{k:<3}");
        for level in SimdLevel::available().into_iter().skip(1) {
            let g = tile::Gemm::new(m, n, k)
                .a_strided(a.as_ptr(), rs, cs)
                .b(b.as_ptr(), ldb)
                .c(c.as_mut_ptr(), n, accumulate);
            // SAFETY: the buffers hold every element the product reads and
            // writes; `level` is one this CPU has.
            let rate = best(flops, &mut || unsafe { tile::gemm(level, g) });
            print!("  {level} {rate:6.1}");
        }
        let crate_rate = best(flops, &mut || unsafe {
            // SAFETY: as above, with the crate's strides.
            gemm::gemm(
                m,
                n,
                k,
                c.as_mut_ptr(),
                1,
                n as isize,
                accumulate,
                a.as_ptr(),
                cs as isize,
                rs as isize,
                b.as_ptr(),
                1,
                ldb as isize,
                if accumulate { 1.0 } else { 0.0 },
                1.0,
                false,
                false,
                false,
                gemm::Parallelism::None,
            )
        });
        println!("  gemm crate {crate_rate:6.1}");
    }
}
