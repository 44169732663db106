//! What the GEMM timing examples share.

/// `len` deterministic values in `[−0.5, 0.5)` (a multiplicative hash of
/// the index, seeded by `seed`): operands whose products neither overflow
/// nor cancel to zeros.
pub fn fill(len: usize, seed: u32) -> Vec<f32> {
    (0..len)
        .map(|i| {
            ((i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) >> 8) as f32 / 16_777_216.0
                - 0.5
        })
        .collect()
}
