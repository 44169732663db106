//! What the timing examples share: one packed projection of SmolLM2-135M's
//! attention shape and its RoPE.

use candle_core::{Device, Tensor};
use posenc::rope::RopeConfig;
use posenc::tensor::rope::{HeadLayout, Rope};

/// SmolLM2-135M's query heads, key/value heads and head dimension.
pub const HEADS: (usize, usize, usize) = (9, 3, 64);

/// A random packed `[q | k | v]` projection of `t` tokens of [`HEADS`]
/// (`(1, t, (hq + 2·hk)·d)`), and the RoPE of θ = 1e5 over its heads.
pub fn packed_qkv(t: usize) -> Result<(Tensor, Rope), Box<dyn std::error::Error>> {
    let (hq, hk, d) = HEADS;
    let w = (hq + 2 * hk) * d;
    let qkv = Tensor::randn(0f32, 1.0, (1, t, w), &Device::Cpu)?;
    let rope = Rope::new(RopeConfig::new(100000.0, d)?)?.with_layout(HeadLayout::Bthd);
    Ok((qkv, rope))
}
