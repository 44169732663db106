//! posenc's analysis layer: what `posenc show`, `posenc analyze` and
//! `posenc compare` compute, as a library.
//!
//! An ENCODING spec is a family name (`sinusoidal`, `rope`, `alibi`, `t5`,
//! `shaw`, `learned`, `floater`, `xpos`, `binary`) optionally followed by
//! `:KEY=VALUE,...` with the keys of [`EncodingOptions`]
//! (`rope:scaling=yarn,factor=8`); the spec's values win over the options.
//!
//! - [`encodings`]: a spec and its options into an [`Encoding`], and the
//!   matrices that picture it ([`Picture`]).
//! - [`show`](mod@show): the picture of an encoding (or of a 2-D RoPE's patch
//!   similarity, [`rope2d`]), written as PNG/SVG or drawn in the terminal.
//! - [`analyze`](mod@analyze): measured properties, each claim with a verdict from the
//!   report's rules, and one line plot per measurement.
//! - [`compare`](mod@compare): two encodings side by side, with a text summary.
//! - [`output`]: file formats, sizes, and a grid of figures.
//!
//! - [`claims`]: every claim's rule and verdict type, shared by `analyze`,
//!   the report and the explorer.
//! - [`json`], [`model`], [`views`]: the JSON documents that the CLI's
//!   `--json` outputs print and the explorer serves (sinusoidal tables, a
//!   model's RoPE per layer and its scaling, relative biases, the teaching
//!   views), so both show the same numbers.
//!
//! Every function takes plain option structs (their defaults are the CLI's)
//! and returns [`VizError`] on bad input. The binary only maps its arguments
//! onto these structs and prints or writes what they return; the report
//! (`posenc-report`) and the explorer (`posenc-explore`) sit above this
//! crate.
//!
//! ```
//! use posenc_viz::{analyze, AnalyzeOptions};
//!
//! let opts = AnalyzeOptions { encoding: "alibi".into(), ..Default::default() };
//! let (analysis, plots) = analyze(&opts).unwrap();
//! assert_eq!(analysis.family, "alibi");
//! assert!(!plots.is_empty());
//! ```

#![warn(missing_docs)]

pub mod analyze;
pub mod claims;
pub mod compare;
pub mod encodings;
mod error;
pub mod json;
pub mod model;
pub mod output;
pub mod rope2d;
pub mod show;
pub mod sources;
pub mod views;

pub use analyze::{analyze, Analysis, AnalyzeOptions, Measurement};
pub use compare::{compare, Comparison};
pub use encodings::{build, parse_spec, Encoding, EncodingOptions, Family, Panel, Picture, Spec};
pub use error::{Result, VizError};
pub use show::{picture, ShowOptions};
