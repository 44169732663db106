//! The fused CPU ops of the lab's models and the fine-tuner, each a candle custom op with its backward pass,
//! beside the composed candle reference it is tested against:
//!
//! | op | fused | reference |
//! |---|---|---|
//! | `y = x·Wᵀ + b` | [`linear`](fn@linear) (one GEMM forward; dx, dW, db in one backward call) | `candle_nn::Linear` |
//! | LayerNorm | [`layer_norm`](fn@layer_norm) (one pass per row, saved mean and 1/σ) | mean, variance, normalise, scale, shift |
//! | GELU (tanh approximation) | [`gelu`](fn@gelu) | candle's `gelu` |
//! | `y = GELU(x·Wᵀ + b)` | [`linear_gelu`] (the pre-activation kept by the op, not a graph node: one gradient fewer for autograd to allocate and sum) | [`linear`](fn@linear) then [`gelu`](fn@gelu) |
//! | `y = LN(x)·Wᵀ + b` | [`ln_linear`] (a branch's LayerNorm and first layer; `[γ, β, W, b]` packed into one input) | [`layer_norm`](fn@layer_norm) then [`linear`](fn@linear) |
//! | `y = r + (x·Wᵀ + b)` | [`linear_residual`] (a residual branch's last layer and the addition; `[W, b]` packed into one input) | [`linear`](fn@linear) then an addition |
//! | `y = x + W₂·GELU(W₁·LN(x) + b₁) + b₂` | [`mlp_residual`] (a block's MLP half with its residual, its six parameters packed into one input) | [`layer_norm`](fn@layer_norm), [`linear_gelu`], [`linear`](fn@linear), an addition |
//! | RMSNorm | [`rms_norm`](fn@rms_norm) (one pass per row, the saved `1/√(mean(x²) + ε)`) | square, mean, reciprocal root, scale |
//! | `silu(g) ⊙ u` (SwiGLU's gate) | [`swiglu`](fn@swiglu) (one pass forward, both gradients in one backward pass) | candle's `silu` and a product |
//! | cross-entropy from logits | [`cross_entropy`](fn@cross_entropy) (log-sum-exp per row; the gradient is `softmax − onehot`) | `log_softmax`, `gather`, mask, mean |
//!
//! Every op takes `fused: bool`; `false` runs the reference. The fused ops
//! work on `f32` CPU tensors, made contiguous (others fall back to the
//! reference).
//! Rows are split over rayon's threads only when the op is large enough;
//! every output element is computed in a fixed order and parameter
//! gradients are reduced over fixed chunks of rows added in order, so
//! results do not depend on the number of threads.
//!
//! Each fused op is a `Kernel` (its forward and backward passes on `f32`
//! buffers) that one adapter in `fused.rs` makes a candle custom op, with
//! the choice between it and the reference. The files split by concern:
//! `matmul.rs` (the products: posenc's AVX-512 tiles or the `gemm` crate),
//! `rows.rs` (the fixed-order row-parallel helpers), `linear.rs` (also
//! [`linear_gelu`] and [`linear_residual`]), `layer_norm.rs` (also
//! [`ln_linear`]), `gelu.rs`, `mlp.rs`, `cross_entropy.rs`, and the pretrained decoders'
//! `rms_norm.rs` and `swiglu.rs` (used by posenc-tune).
//! The lab's model runs the first ones (its `set_fused(false)` picks the
//! references).

mod cross_entropy;
mod fused;
mod gelu;
mod layer_norm;
mod linear;
mod matmul;
mod mlp;
mod rms_norm;
mod rows;
mod swiglu;

pub use cross_entropy::cross_entropy;
pub use gelu::gelu;
pub use layer_norm::{layer_norm, ln_linear};
pub use linear::{linear, linear_at, linear_gelu, linear_residual};
pub use mlp::mlp_residual;
pub use rms_norm::rms_norm;
pub use swiglu::swiglu;
