//! Bounds on every size posenc reads from user input.
//!
//! A `config.json`, a grid of patches or a list of positions is user input:
//! each size taken from it is checked against one of these bounds before
//! anything of that size is allocated, and a larger value is an
//! [`Error::TooLarge`](crate::Error::TooLarge) naming the key. The bounds are
//! far above every published model (head dimensions ≤ 576, ≤ 126 layers,
//! grids of a few thousand patches) and far below what would exhaust memory
//! or time.

/// Largest head dimension (and rotary dimension): 2^16.
pub const MAX_HEAD_DIM: usize = 1 << 16;

/// Largest number of layers (`num_hidden_layers`, the length of
/// `layer_types` or `no_rope_layers`): 2^16.
pub const MAX_LAYERS: usize = 1 << 16;

/// Largest number of distinct layer types in one model: 64.
pub const MAX_LAYER_TYPES: usize = 64;

/// Largest number of tokens a position-id builder produces (a sequence of
/// text runs and image or video grids): 2^24.
pub const MAX_TOKENS: usize = 1 << 24;

/// Largest table built from user input (`rows × rotary_dim / 2` values, per
/// table): 2^26.
pub const MAX_TABLE_VALUES: usize = 1 << 26;

/// Largest `config.json` read from a file: 64 MiB.
pub const MAX_CONFIG_BYTES: u64 = 64 << 20;

/// Largest number of axes of a multi-axis RoPE: 8.
pub const MAX_AXES: usize = 8;
