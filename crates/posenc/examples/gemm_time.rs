//! Times `kernels::tile::gemm_blocked` at every SIMD level this CPU has
//! against the `gemm` crate on one thread, for the products of the lab's
//! linear layers (forward `x·Wᵀ`, `dx = dy·W`, `dW = dyᵀ·x`) at a given
//! token count and width: `cargo run --release -p posenc --example
//! gemm_time -- [TOKENS] [D_IN] [D_OUT]` (default 2048 128 512).

use std::time::Instant;

mod common;
use common::fill;

use posenc::kernels::{tile, SimdLevel};

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("sizes are integers"))
        .collect();
    let (n, d_in, d_out) = (
        *args.first().unwrap_or(&2048),
        *args.get(1).unwrap_or(&128),
        *args.get(2).unwrap_or(&512),
    );
    // (name, m, n, k, A strides, ldb, a len, b len)
    let cases = [
        ("x·Wᵀ", n, d_out, d_in, (d_in, 1), d_out),
        ("dy·W", n, d_in, d_out, (d_out, 1), d_in),
        ("dyᵀ·x", d_out, d_in, n, (1, d_out), d_in),
    ];
    for (name, m, nn, k, (a_rs, a_cs), ldb) in cases {
        let a = fill(m * k, 1);
        let b = fill(k * ldb, 2);
        let mut c = vec![0f32; m * nn];
        let flops = 2.0 * (m * nn * k) as f64;
        let time = |f: &mut dyn FnMut()| {
            f();
            let mut best = f64::INFINITY;
            for _ in 0..7 {
                let t = Instant::now();
                for _ in 0..5 {
                    f();
                }
                best = best.min(t.elapsed().as_secs_f64() / 5.0);
            }
            best
        };
        let crate_s = time(&mut || unsafe {
            gemm::gemm(
                m,
                nn,
                k,
                c.as_mut_ptr(),
                1,
                nn as isize,
                false,
                a.as_ptr(),
                a_cs as isize,
                a_rs as isize,
                b.as_ptr(),
                1,
                ldb as isize,
                0.0,
                1.0,
                false,
                false,
                false,
                gemm::Parallelism::None,
            )
        });
        print!(
            "{name:<6} {m}x{nn}x{k}: gemm crate {:6.3} ms ({:5.1} GFLOP/s)",
            crate_s * 1e3,
            flops / crate_s / 1e9
        );
        for level in SimdLevel::available().into_iter().skip(1) {
            let g = tile::Gemm::new(m, nn, k)
                .a_strided(a.as_ptr(), a_rs, a_cs)
                .b(b.as_ptr(), ldb)
                .to(c.as_mut_ptr(), nn);
            let s = time(&mut || unsafe { tile::gemm_blocked(level, g, 1) });
            print!(
                "  {level} {:6.3} ms ({:5.1} GFLOP/s)",
                s * 1e3,
                flops / s / 1e9
            );
        }
        println!();
    }
}
