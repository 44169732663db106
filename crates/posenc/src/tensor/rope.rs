//! Rotary embeddings on candle tensors.
