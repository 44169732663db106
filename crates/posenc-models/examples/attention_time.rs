//! Times posenc's fused causal attention with RoPE on one packed projection
//! of SmolLM2-135M's shape (9 query heads, 3 key/value heads, head_dim 64):
//! `cargo run --release -p posenc-models --example attention_time -- 4096 5`
//! (a third argument `bf16` runs the long tiles' products in bfloat16).

use std::time::Instant;

use posenc::tensor::attention::{Attention, AttentionHooks, AttnPositions};

mod common;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .take(2)
        .map(|a| a.parse().unwrap())
        .collect();
    let t = args.first().copied().unwrap_or(4096);
    let reps = args.get(1).copied().unwrap_or(3);
    let (hq, hk, d) = common::HEADS;
    let (qkv, rope) = common::packed_qkv(t)?;
    let hooks = AttentionHooks {
        query_key: Some(&rope),
        ..Default::default()
    };
    let bf16 = std::env::args().nth(3).as_deref() == Some("bf16");
    let attn = if bf16 {
        Attention::new(true).with_products(posenc::kernels::attention::Products::Bf16)?
    } else {
        Attention::new(true)
    };
    attn.forward_packed(&qkv, hq, hk, &hooks, AttnPositions::default())?;
    let mut best = f64::INFINITY;
    for _ in 0..reps {
        let s = Instant::now();
        attn.forward_packed(&qkv, hq, hk, &hooks, AttnPositions::default())?;
        best = best.min(s.elapsed().as_secs_f64());
    }
    let flops = 4.0 * hq as f64 * d as f64 * (t as f64 * (t as f64 + 1.0) / 2.0);
    println!(
        "T={t}: best {:.1} ms, {:.1} GFLOP/s (causal QK and PV)",
        best * 1e3,
        flops / best / 1e9
    );
    Ok(())
}
