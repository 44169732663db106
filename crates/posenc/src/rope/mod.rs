//! Rotary position embedding (RoPE), Su et al. 2021, *RoFormer: Enhanced
//! Transformer with Rotary Position Embedding*, and its long-context scalings.
//!
//! Queries and keys are split into pairs and pair `i` of the vector at
//! position `m` is rotated by the angle `m · θ_i`, with
//! `θ_i = base^(−2i/d)` before scaling. Because rotations compose,
//! `⟨R(m)q, R(n)k⟩ = ⟨q, R(n − m)k⟩` depends only on the distance.

pub mod frequencies;

pub use frequencies::{PairLayout, RopeFrequencies};
