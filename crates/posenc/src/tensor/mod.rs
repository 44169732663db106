//! The candle tensor API: encodings applied to activations inside a model.
//!
//! - [`absolute`]: modules that add absolute encodings to embeddings;
//! - [`bias`]: attention biases and relative terms as tensors;
//! - [`rope`]: rotary embeddings on queries and keys, fused and
//!   differentiable.

pub mod absolute;
pub mod bias;
pub mod rope;
