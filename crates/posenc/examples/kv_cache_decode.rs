//! Token-by-token decoding through posenc's fused attention with RoPE
//! inside, against one full causal pass over the same sequence.
//!
//! ```sh
//! cargo run -p posenc --example kv_cache_decode
//! ```
//!
//! The cache holds the keys unrotated; each new query at position `t` sees
//! every cached key (`AttnPositions::offsets(t, 0)`), and the kernel rotates
//! both by their own positions, so step `t`'s output equals row `t` of the
//! full pass (Su et al. 2021: the logit depends on `t − j` only).

use candle_core::{Device, Tensor};
use posenc::rope::RopeConfig;
use posenc::tensor::attention::{Attention, AttentionHooks, AttnPositions};
use posenc::tensor::rope::Rope;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (heads, kv_heads, head_dim, steps) = (8, 2, 64, 48);
    let dev = Device::Cpu;
    let rope = Rope::new(RopeConfig::new(10000.0, head_dim)?)?;
    let hooks = AttentionHooks {
        query_key: Some(&rope),
        ..Default::default()
    };
    let attn = Attention::new(true);
    let q = Tensor::randn(0f32, 1.0, (1, heads, steps, head_dim), &dev)?;
    let k = Tensor::randn(0f32, 1.0, (1, kv_heads, steps, head_dim), &dev)?;
    let v = Tensor::randn(0f32, 1.0, (1, kv_heads, steps, head_dim), &dev)?;

    let full = attn.forward(&q, &k, &v, &hooks, AttnPositions::default())?;
    let mut worst = 0f32;
    for t in 0..steps {
        // the cache: keys and values of tokens 0..=t
        let (kc, vc) = (k.narrow(2, 0, t + 1)?, v.narrow(2, 0, t + 1)?);
        let out = attn.forward(
            &q.narrow(2, t, 1)?,
            &kc,
            &vc,
            &hooks,
            AttnPositions::offsets(t, 0),
        )?;
        let d = (out - full.narrow(2, t, 1)?)?
            .abs()?
            .max_all()?
            .to_scalar::<f32>()?;
        worst = worst.max(d);
    }
    println!(
        "{steps} decode steps ({heads} query heads, {kv_heads} key/value heads, head_dim {head_dim}): \
         largest difference from the full pass {worst:.2e}"
    );
    if worst > 1e-5 {
        return Err(format!("decode differs from the full pass by {worst}").into());
    }
    Ok(())
}
