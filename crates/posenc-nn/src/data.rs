//! The seeds of training batches and the validation split of a text, shared
//! by the lab's runs and the fine-tuner's windows.

use posenc::analysis::SplitMix64;

/// The fraction of a corpus, at its end, that is validation text.
pub const VALIDATION_FRACTION: f64 = 0.1;

/// The seed of step `step`'s batch in the stream `stream` of a run seeded
/// `seed`.
pub fn batch_seed(seed: u64, step: u64, stream: u64) -> u64 {
    let mut r = SplitMix64::new(seed ^ stream.wrapping_mul(0xA076_1D64_78BD_642F));
    r.next_u64() ^ step.wrapping_mul(0xE703_7ED1_A0B4_28DB)
}

/// The first validation token of a text of `n` tokens: the last
/// [`VALIDATION_FRACTION`] (rounded up, at least one token) is validation.
pub fn split_point(n: usize) -> usize {
    let valid =
        ((n as f64 * VALIDATION_FRACTION).ceil() as usize).clamp(1, n.saturating_sub(1).max(1));
    n - valid
}
