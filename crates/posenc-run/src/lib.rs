//! The pretrained-model pipeline as a library call: one call prepares a
//! model, one runs each probe.
//!
//! [`Session::open`] checks a model path (a GGUF file or a Hugging Face
//! checkpoint directory) exactly as the `posenc` command does, reads its
//! config and tokenizer, and [`Session::load`] (or the first probe) reads
//! its weights once. Each probe then checks its own inputs before any
//! work, runs, and returns what the command's `--json` prints:
//!
//! - [`Session::perplexity`] — `posenc perplexity --json`;
//! - [`Session::passkey`] — `posenc passkey --json`;
//! - [`Session::generate`] — `posenc generate --json`;
//! - [`finetune()`](finetune::finetune) — `posenc finetune --model ... --out
//!   DIR --json` (it opens the model itself: training needs its own copy).
//!
//! Every long call takes a progress callback ([`Progress`]); returning
//! `false` from it stops the call within a layer (a trial for the passkey
//! probe, a step for fine-tuning) with [`RunError::Cancelled`]. Every
//! error is a [`RunError`] whose message is the one line the command
//! prints for the same condition.
//!
//! ```no_run
//! use posenc_run::{OpenOptions, PerplexityRequest, Session, Text};
//!
//! let mut session = Session::open("models/SmolLM2-135M-Instruct.Q4_1.gguf".as_ref(), &OpenOptions::default())?;
//! let request = PerplexityRequest {
//!     text: Text::Default,
//!     length: Some(512),
//!     scalings: vec!["none".into(), "yarn:2".into()],
//!     ..PerplexityRequest::default()
//! };
//! let json = session.perplexity(&request, &mut |p| {
//!     eprintln!("{}/{} {}", p.done, p.total, p.what);
//!     true
//! })?;
//! println!("{}", json["scalings"]["yarn:2"]["mean_beyond"]);
//! # Ok::<(), posenc_run::RunError>(())
//! ```
#![warn(missing_docs)]

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

pub mod corpus;
pub mod files;
pub mod finetune;
pub mod generate;
pub mod memory;
pub mod passkey;
pub mod perplexity;
pub mod session;
pub mod text;

pub use corpus::PRIDE_AND_PREJUDICE;
pub use files::{check_log, check_out_dir, check_writable};
pub use finetune::{finetune, FinetuneOptions, FinetuneOutcome};
pub use generate::{GenerateRequest, PromptSource};
pub use memory::{Limit, Plan};
pub use passkey::{HaystackSource, PasskeyPlan, PasskeyRequest, PasskeyRun};
pub use perplexity::PerplexityRequest;
pub use posenc_models::generate::Sampling;
pub use posenc_models::llama::Products;
pub use session::{check_model, OpenOptions, Session};

/// Largest window (or prompt and new tokens) accepted before any estimate;
/// the memory check comes next and is usually the tighter bound.
pub const MAX_LENGTH: usize = 1 << 22;

/// An error of a run: the one-line message the `posenc` command prints for
/// the same condition, or [`RunError::Cancelled`].
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The model's files, config, tokenizer or forward pass.
    #[error(transparent)]
    Model(#[from] posenc_models::ModelError),
    /// Fine-tuning and LoRA adapters.
    #[error(transparent)]
    Tune(#[from] posenc_tune::TuneError),
    /// posenc's RoPE and attention.
    #[error(transparent)]
    Posenc(#[from] posenc::Error),
    /// A bad argument, named as the command's flag names it.
    #[error("{0}")]
    Invalid(String),
    /// The progress callback asked to stop.
    #[error("cancelled")]
    Cancelled,
}

/// The result of a run.
pub type Result<T, E = RunError> = std::result::Result<T, E>;

/// Where a long call stands, given to its progress callback.
///
/// Every call reports first with `done = 0` (for a resumed fine-tune, the
/// step it resumes at) and `what` one line describing the run (the model,
/// tokenizer, window or grid: the line the command prints before its
/// progress bar); then once per layer (perplexity), trial (passkey), new
/// token (generation) or step (fine-tuning; at least every 200 ms), with
/// `what` the item being run. A forward pass also reports between the
/// parts of each layer, with the count unchanged: a repeated report is a
/// place to stop, nothing new to show.
#[derive(Debug, Clone, Copy)]
pub struct Progress<'a> {
    /// Units done.
    pub done: usize,
    /// Units in all.
    pub total: usize,
    /// The first call's description, then the item being run (a scaling's
    /// name, `METHOD @ LENGTH`, `token`, `step`).
    pub what: &'a str,
    /// The new token's id ([`Session::generate`] only).
    pub token: Option<u32>,
    /// The text the new token completes, once the tokens so far decode to
    /// whole characters (a byte-level token can end inside one); empty
    /// until then ([`Session::generate`] with
    /// [`GenerateRequest::stream_text`] only).
    pub text: Option<&'a str>,
}

impl<'a> Progress<'a> {
    /// A report of `done` of `total` units of `what`.
    pub fn new(done: usize, total: usize, what: &'a str) -> Self {
        Progress {
            done,
            total,
            what,
            token: None,
            text: None,
        }
    }
}

/// The progress callback of a long call: `false` stops it
/// ([`RunError::Cancelled`]).
pub type ProgressFn<'a> = dyn FnMut(Progress<'_>) -> bool + 'a;

/// A text to read: the built-in default, the text itself, or a file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Text {
    /// Jane Austen's *Pride and Prejudice*, built in
    /// ([`PRIDE_AND_PREJUDICE`]).
    #[default]
    Default,
    /// The text itself.
    String(String),
    /// A UTF-8 file (a regular file, read bounded).
    File(PathBuf),
}

impl Text {
    /// The file, if the text is one.
    pub fn path(&self) -> Option<&Path> {
        match self {
            Text::File(p) => Some(p),
            _ => None,
        }
    }
}

/// The payload of the unwind that stops a forward pass from inside its
/// per-layer callback (the model's callbacks cannot return an error).
struct Stop;

/// Calls `progress`; when it answers `false`, unwinds to the enclosing
/// [`cancellable`] (without running the panic hook). Only for callbacks
/// called on the caller's thread between layers or tokens, where no lock
/// is held and the model's weights are not being written.
fn report_or_stop(progress: &mut ProgressFn<'_>, p: Progress<'_>) {
    if !progress(p) {
        resume_unwind(Box::new(Stop));
    }
}

/// Runs `f`, turning a stop raised by [`report_or_stop`] inside it into
/// [`RunError::Cancelled`]; any other panic goes on unwinding.
fn cancellable<T>(f: impl FnOnce() -> Result<T>) -> Result<T> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(payload) if payload.is::<Stop>() => Err(RunError::Cancelled),
        Err(payload) => resume_unwind(payload),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stop_inside_becomes_cancelled_and_other_panics_pass() {
        let mut calls = 0;
        let mut cb = |_: Progress<'_>| {
            calls += 1;
            calls < 3
        };
        let r: Result<()> = cancellable(|| {
            for i in 0..10 {
                report_or_stop(&mut cb, Progress::new(i, 10, "layer"));
            }
            Ok(())
        });
        assert!(matches!(r, Err(RunError::Cancelled)));
        assert_eq!(calls, 3);
        let p = catch_unwind(|| cancellable::<()>(|| panic!("boom")));
        assert!(p.is_err());
    }
}
