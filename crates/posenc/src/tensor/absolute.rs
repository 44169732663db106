//! Absolute encodings as candle modules (sinusoidal, learned, FLOATER).
