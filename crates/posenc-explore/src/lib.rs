//! `posenc explore`: an interactive explorer of positional encodings and of
//! any model's RoPE, served on 127.0.0.1 with everything embedded (no CDN,
//! charts drawn by the page's own canvas code).
//!
//! The JSON API ([`server`]) serves the analysis layer's documents
//! (`posenc-viz`): [`json`] builds the documents that the CLI's `--json`
//! outputs print, so the page shows the CLI's numbers; [`model`] labels each
//! frequency pair of a model's RoPE (kept, interpolated, on the ramp) and
//! finds the pairs that meet unseen angles at a target length; [`views`]
//! computes the teaching views (sinusoidal table, plain RoPE, relative
//! biases). This crate adds the server and the page.
#![warn(missing_docs)]

pub mod assets;
pub mod configs;
pub mod server;

pub use posenc_viz::{json, model, views};

pub use server::{
    app, router, run, run_with, serve, serve_with, Limits, MAX_ANSWER_BYTES, MAX_BODY_BYTES,
};
