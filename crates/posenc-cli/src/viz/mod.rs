//! `posenc show`, `posenc analyze`, `posenc compare`: see and measure any
//! encoding.
//!
//! An ENCODING is a family name (`sinusoidal`, `rope`, `alibi`, `t5`,
//! `shaw`, `learned`, `floater`, `xpos`, `binary`) optionally followed by
//! `:KEY=VALUE,...` with the same keys as the long options
//! (`rope:scaling=yarn,factor=8`); the spec's values win over the options.
//! `posenc show rope2d --grid HxW` draws a 2-D RoPE's patch similarity.

mod analyze;
mod compare;
pub mod encodings;
mod output;
mod rope2d;
mod show;

pub use analyze::{analyze, AnalyzeArgs};
pub use compare::{compare, CompareArgs};
pub use show::{show, ShowArgs};
