//! Attention biases as candle tensors (ALiBi, T5, Shaw).
