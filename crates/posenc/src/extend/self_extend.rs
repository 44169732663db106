//! Self-Extend (Jin et al. 2024, "LLM Maybe LongLM: Self-Extend LLM Context
//! Window Without Tuning"), as the authors' `self_extend_forward`
//! (datamllab/LongLM, `self_extend_patch/Llama.py`) computes it:
//!
//! ```text
//! a − j < W:  q at a,                  k at j            (neighbour attention)
//! a − j ≥ W:  q at ⌊a/G⌋ + W − W/G,    k at ⌊j/G⌋        (grouped attention)
//! ```
//!
//! with one softmax over the merged logits (`torch.where` on the neighbour
//! mask). The authors' code shifts the grouped query only when the largest
//! query position is at least `W`; a query with a grouped key is always
//! there (`a ≥ a − j ≥ W`), so the shift applies wherever it is used, in a
//! prefill and in a decode step alike. `scale_base` is −1 (no query scaling),
//! the authors' default. Their shift `W − W/G` is computed with true
//! division; posenc rotates at whole positions, so `G` must divide `W`.

use super::{KeyRange, PosMap, View};
use crate::error::{Error, Result};

pub(super) fn validate(group: usize, window: usize) -> Result<()> {
    if !window.is_multiple_of(group) {
        return Err(Error::invalid(
            "Self-Extend",
            format!(
                "the group size G = {group} must divide the window W = {window} \
                 (the grouped query's shift W − W/G must be a whole position)"
            ),
        ));
    }
    Ok(())
}

pub(super) fn views(group: usize, window: usize) -> Vec<View> {
    vec![
        View {
            keys: KeyRange::Near(window),
            query: PosMap::Identity,
            key: PosMap::Identity,
            freq_divisor: 1.0,
        },
        View {
            keys: KeyRange::Far(window),
            query: PosMap::Group {
                g: group,
                shift: window - window / group,
            },
            key: PosMap::Group { g: group, shift: 0 },
            freq_divisor: 1.0,
        },
    ]
}
