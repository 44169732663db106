//! Dual chunk attention (An et al. 2024, "Training-Free Long-Context
//! Scaling of Large Language Models"), as HKUNLP/ChunkLlama's
//! `chunkllama_attn_replace.py` computes it, with `c = chunk_size −
//! local_window` keys per chunk and every key at `j mod c`:
//!
//! ```text
//! same chunk (intra):        q at a mod c
//! the chunk before (succ):   q at min(a mod c + c, chunk_size)
//! earlier chunks (inter):    q at min(2c − 1, chunk_size)
//! ```
//!
//! The authors' rotary tables carry `mscale = 0.05·ln(T/M) + 1` on both the
//! query and key cosines and sines once the sequence length `T` exceeds the
//! model's `max_position_embeddings` `M` (and 1 before), so every logit is
//! multiplied by `mscale²`. The authors' flash path merges the three parts
//! with bfloat16 weights; posenc merges them in `f32` (one softmax over all
//! the logits, as their KV-cache path does).

use super::{KeyRange, PosMap, View};

pub(super) fn views(chunk: usize, local: usize) -> Vec<View> {
    let c = chunk - local;
    vec![
        View {
            keys: KeyRange::Chunk { len: c, back: 0 },
            query: PosMap::Mod(c),
            key: PosMap::Mod(c),
            freq_divisor: 1.0,
        },
        View {
            keys: KeyRange::Chunk { len: c, back: 1 },
            query: PosMap::ModAddMin {
                c,
                add: c,
                max: chunk,
            },
            key: PosMap::Mod(c),
            freq_divisor: 1.0,
        },
        View {
            keys: KeyRange::ChunksBefore { len: c, back: 2 },
            query: PosMap::Const((2 * c - 1).min(chunk)),
            key: PosMap::Mod(c),
            freq_divisor: 1.0,
        },
    ]
}

/// `mscale²` for `k_len` keys and `max_position_embeddings` `m`.
pub(super) fn logit_scale(k_len: usize, m: usize) -> f64 {
    if m == 0 || k_len <= m {
        return 1.0;
    }
    // ChunkLlama computes mscale in Python floats and multiplies the f32
    // tables by it.
    let ms = (0.05 * (k_len as f64 / m as f64).ln() + 1.0) as f32 as f64;
    ms * ms
}
