//! Attention sinks (Xiao et al. 2024, "Efficient Streaming Language Models
//! with Attention Sinks"), as mit-han-lab/streaming-llm evaluates them
//! (`examples/eval_long_ppl.py`: one token at a time, a `StartRecentKVCache`
//! of `start_size + recent_size` entries, and
//! `enable_llama_pos_shift_attention`, which rotates the cached keys at their
//! cache slots). With `S` sinks, a cache of `WINDOW` slots and `R = WINDOW −
//! S`, query `a` sees:
//!
//! ```text
//! a − j ≤ R:             every recent key, at its true distance a − j
//! j < S and a − j > R:   the sinks, with the query at slot min(a, WINDOW)
//!                         (distance min(a, WINDOW) − j)
//! ```
//!
//! and nothing else: the keys between were evicted. Up to `a = WINDOW` no
//! key is evicted and every distance is the true one.

use super::{KeyRange, PosMap, View};

pub(super) fn views(sinks: usize, window: usize) -> Vec<View> {
    let recent = window - sinks;
    vec![
        View {
            keys: KeyRange::Near(recent + 1),
            query: PosMap::Identity,
            key: PosMap::Identity,
            freq_divisor: 1.0,
        },
        View {
            keys: KeyRange::SinksFar { sinks, recent },
            query: PosMap::Min(window),
            key: PosMap::Identity,
            freq_divisor: 1.0,
        },
    ]
}
