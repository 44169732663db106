//! Measured properties of encodings (distinctness, similarity against distance, linear maps, decay bounds).
