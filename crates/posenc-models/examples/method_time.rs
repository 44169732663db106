//! Times each training-free attention method against plain RoPE attention
//! on one packed projection of SmolLM2-135M's shape (9 query heads, 3
//! key/value heads, head_dim 64, RoPE θ = 1e5, trained length 8,192), the
//! two alternated in each round:
//! `cargo run --release -p posenc-models --example method_time -- 16384 3`
//! (then the methods to time, default: every method at the parameters of
//! the docs' tables).

use std::time::Instant;

use posenc::extend::{ContextMethod, ModelLengths};
use posenc::tensor::attention::{Attention, AttentionHooks, AttnPositions};
use posenc::tensor::extend::MethodAttention;

mod common;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let t: usize = args.first().map_or(Ok(16384), |a| a.parse())?;
    let reps: usize = args.get(1).map_or(Ok(3), |a| a.parse())?;
    let methods: Vec<String> = if args.len() > 2 {
        args[2..].to_vec()
    } else {
        [
            "self-extend:4:1024",
            "self-extend:4:512",
            "rerope:1024",
            "leaky-rerope:1024:16",
            "dca:6144:1024",
            "sinks:4:1024",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };
    let (hq, hk, _) = common::HEADS;
    let (qkv, rope) = common::packed_qkv(t)?;
    let hooks = AttentionHooks {
        query_key: Some(&rope),
        ..Default::default()
    };
    let plain = Attention::new(true);
    let lengths = ModelLengths {
        trained: Some(8192),
        max_position_embeddings: Some(8192),
    };
    let time = |f: &dyn Fn() -> Result<(), Box<dyn std::error::Error>>| -> Result<f64, Box<dyn std::error::Error>> {
        let s = Instant::now();
        f()?;
        Ok(s.elapsed().as_secs_f64())
    };
    let run_plain = || -> Result<(), Box<dyn std::error::Error>> {
        plain.forward_packed(&qkv, hq, hk, &hooks, AttnPositions::default())?;
        Ok(())
    };
    run_plain()?;
    println!("T={t}, best of {reps} rounds (plain and method alternated)");
    for name in &methods {
        let m: ContextMethod = name.parse()?;
        let attn = MethodAttention::new(m, &rope, lengths)?;
        let run_m = || -> Result<(), Box<dyn std::error::Error>> {
            attn.forward_packed(&qkv, hq, hk)?;
            Ok(())
        };
        run_m()?;
        let (mut bp, mut bm) = (f64::INFINITY, f64::INFINITY);
        for _ in 0..reps {
            bp = bp.min(time(&run_plain)?);
            bm = bm.min(time(&run_m)?);
        }
        println!(
            "{name:>22}: {:.0} ms against plain RoPE {:.0} ms: {:.2}x",
            bm * 1e3,
            bp * 1e3,
            bm / bp
        );
    }
    Ok(())
}
