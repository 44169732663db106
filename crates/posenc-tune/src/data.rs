//! Training windows from a text's first 90%, seeded per step.
//!
//! [`TrainText`] splits a tokenized text as the lab splits its corpora
//! ([`posenc_nn::data::split_point`]): the last 10% of the tokens
//! (rounded up) is held out and dropped on construction, so no window can
//! read it; `posenc perplexity` and `posenc passkey` may score it.
//!
//! [`Windows`] draws the windows of a step. Step `s`'s generator is
//! [`PyRandom::seed`]`(`[`step_seed`]`(seed, s))`, so a step's windows
//! depend on the seed and the step only: a resumed run draws exactly the
//! windows an uninterrupted one would, with no generator state to save.
//! Each window of the step, in order:
//!
//! - **contiguous** ([`WindowPlan::Contiguous`] of `N` tokens, plain
//!   fine-tuning at the target length as Position Interpolation and YaRN
//!   do): `start = randint(0, n − N)`, the tokens `train[start..start + N]`
//!   at positions `0..N`;
//! - **PoSE** ([`WindowPlan::Pose`], windows of `L` tokens with ids over
//!   `0..N`): a document of `d = min(5·L, n)` tokens (the authors'
//!   truncation) at `start = randint(0, n − d)`, then the three draws of
//!   [`PoseSampler::draw`] on it, so the window's tokens are
//!   `doc[0..rt1] ++ doc[lt2..rt2]` at the ids of
//!   [`PoseDraw::positions`](crate::pose::PoseDraw::positions).
//!
//! (`n`: tokens of the training part; `randint` both ends inclusive.)
//! `scripts/finetune/pose_reference.py` draws the same windows with
//! Python's `random` module and the authors' function.

use posenc_nn::data::batch_seed;
use serde::{Deserialize, Serialize};

use crate::error::{Result, TuneError};
use crate::pose::{PoseSampler, PyRandom};

/// The stream of [`posenc_nn::data::batch_seed`] the windows come
/// from (issue 27's number: distinct from the lab's streams 0 and 5).
pub const WINDOW_STREAM: u64 = 27;

/// The seed of step `step`'s window generator.
pub fn step_seed(seed: u64, step: u64) -> u64 {
    batch_seed(seed, step, WINDOW_STREAM)
}

/// The training part of a tokenized text (see the [module docs](self)).
#[derive(Debug, Clone)]
pub struct TrainText {
    train: Vec<u32>,
    held_out: usize,
}

impl TrainText {
    /// Splits `tokens` (a whole text, tokenized) and keeps its first 90%.
    ///
    /// # Errors
    /// [`TuneError::TextTooShort`] for fewer than 2 tokens (no split).
    pub fn new(mut tokens: Vec<u32>) -> Result<TrainText> {
        if tokens.len() < 2 {
            return Err(TuneError::TextTooShort {
                need: 2,
                have: tokens.len(),
            });
        }
        let split = posenc_nn::data::split_point(tokens.len());
        let held_out = tokens.len() - split;
        tokens.truncate(split);
        tokens.shrink_to_fit();
        Ok(TrainText {
            train: tokens,
            held_out,
        })
    }

    /// The training tokens (the text's first 90%).
    pub fn tokens(&self) -> &[u32] {
        &self.train
    }

    /// Tokens of the training part.
    pub fn len(&self) -> usize {
        self.train.len()
    }

    /// Whether the training part is empty (never, once constructed).
    pub fn is_empty(&self) -> bool {
        self.train.is_empty()
    }

    /// Tokens held out (the last 10%, never kept).
    pub fn held_out(&self) -> usize {
        self.held_out
    }
}

/// The held-out part of a text's tokens: the last 10% that
/// [`TrainText::new`] drops, never trained on (what `posenc perplexity
/// --held-out` scores).
pub fn held_out_tokens(tokens: &[u32]) -> &[u32] {
    &tokens[posenc_nn::data::split_point(tokens.len())..]
}

/// What a training window is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum WindowPlan {
    /// `len` consecutive tokens at positions `0..len`.
    Contiguous {
        /// Tokens per window.
        len: usize,
    },
    /// PoSE: `window` tokens with ids over `0..target`.
    Pose {
        /// Tokens per window.
        window: usize,
        /// The length the ids cover.
        target: usize,
    },
}

impl WindowPlan {
    /// Tokens per window.
    pub fn window(&self) -> usize {
        match *self {
            WindowPlan::Contiguous { len } => len,
            WindowPlan::Pose { window, .. } => window,
        }
    }

    /// The length the position ids cover.
    pub fn target(&self) -> usize {
        match *self {
            WindowPlan::Contiguous { len } => len,
            WindowPlan::Pose { target, .. } => target,
        }
    }

    /// Checks the lengths: a window of at least 2 tokens, and for PoSE a
    /// window below the target ([`PoseSampler::new`]).
    ///
    /// # Errors
    /// [`TuneError::Config`], [`TuneError::PoseWindow`].
    pub fn validate(&self) -> Result<()> {
        match *self {
            WindowPlan::Contiguous { len } => {
                if !(2..=crate::pose::MAX_TARGET).contains(&len) {
                    return Err(TuneError::Config(format!(
                        "the training length {len} must be in 2..={}",
                        crate::pose::MAX_TARGET
                    )));
                }
            }
            WindowPlan::Pose { window, target } => {
                PoseSampler::new(window, target)?;
            }
        }
        Ok(())
    }
}

/// One training window: its tokens and their position ids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Window {
    /// Where its document starts in the training tokens.
    pub start: usize,
    /// The tokens.
    pub tokens: Vec<u32>,
    /// One position id per token.
    pub positions: Vec<u32>,
}

/// The windows of each step (see the [module docs](self)).
#[derive(Debug, Clone)]
pub struct Windows {
    text: TrainText,
    plan: WindowPlan,
    seed: u64,
}

impl Windows {
    /// Windows of `plan` from `text`, seeded by `seed`.
    ///
    /// # Errors
    /// [`WindowPlan::validate`]'s; [`TuneError::TextTooShort`] when the
    /// training part is shorter than one window.
    pub fn new(text: TrainText, plan: WindowPlan, seed: u64) -> Result<Windows> {
        plan.validate()?;
        if text.len() < plan.window() {
            return Err(TuneError::TextTooShort {
                need: plan.window(),
                have: text.len(),
            });
        }
        Ok(Windows { text, plan, seed })
    }

    /// The plan.
    pub fn plan(&self) -> WindowPlan {
        self.plan
    }

    /// The training text.
    pub fn text(&self) -> &TrainText {
        &self.text
    }

    /// Tokens of one window's document: the window itself, or PoSE's
    /// `min(5·L, n)`.
    pub fn doc_len(&self) -> usize {
        match self.plan {
            WindowPlan::Contiguous { len } => len,
            WindowPlan::Pose { window, .. } => window
                .saturating_mul(PoseSampler::DOC_FACTOR)
                .min(self.text.len()),
        }
    }

    /// The `batch` windows of step `step`, in order.
    pub fn step(&self, step: u64, batch: usize) -> Vec<Window> {
        let mut rng = PyRandom::seed(step_seed(self.seed, step));
        (0..batch).map(|_| self.draw(&mut rng)).collect()
    }

    /// One window from `rng`.
    pub fn draw(&self, rng: &mut PyRandom) -> Window {
        let train = self.text.tokens();
        let d = self.doc_len();
        let start = rng.randint(0, (train.len() - d) as u64) as usize;
        let doc = &train[start..start + d];
        match self.plan {
            WindowPlan::Contiguous { len } => Window {
                start,
                tokens: doc.to_vec(),
                positions: (0..len as u32).collect(),
            },
            WindowPlan::Pose { window, target } => {
                let sampler = PoseSampler::new(window, target).expect("validated in Windows::new");
                let draw = sampler
                    .draw(d, rng)
                    .expect("the document holds at least one window");
                let tokens = draw
                    .token_ranges()
                    .into_iter()
                    .flat_map(|r| doc[r].iter().copied())
                    .collect();
                Window {
                    start,
                    tokens,
                    positions: draw.positions(window),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_held_out_tenth_is_dropped() {
        let t = TrainText::new((0..1000).collect()).unwrap();
        assert_eq!((t.len(), t.held_out()), (900, 100));
        assert_eq!(*t.tokens().last().unwrap(), 899);
        let t = TrainText::new((0..11).collect()).unwrap();
        assert_eq!((t.len(), t.held_out()), (9, 2));
        assert!(matches!(
            TrainText::new(vec![1]),
            Err(TuneError::TextTooShort { .. })
        ));
    }

    #[test]
    fn windows_never_read_the_held_out_part_and_are_seeded_per_step() {
        let text = TrainText::new((0..1000).collect()).unwrap();
        for plan in [
            WindowPlan::Contiguous { len: 64 },
            WindowPlan::Pose {
                window: 16,
                target: 128,
            },
            // A document clipped to the training part: 5·200 > 900.
            WindowPlan::Pose {
                window: 200,
                target: 400,
            },
        ] {
            let w = Windows::new(text.clone(), plan, 3).unwrap();
            let mut seen_start = std::collections::BTreeSet::new();
            for step in 0..200 {
                let batch = w.step(step, 2);
                assert_eq!(batch, w.step(step, 2), "step {step} is not reproducible");
                for win in &batch {
                    assert_eq!(win.tokens.len(), plan.window());
                    assert_eq!(win.positions.len(), plan.window());
                    assert!(win.tokens.iter().all(|&t| t < 900), "{plan:?}");
                    assert!(win.positions.iter().all(|&p| (p as usize) < plan.target()));
                    assert!(win.positions.windows(2).all(|p| p[0] < p[1]));
                    // The ids of the text are its offsets: the tokens are
                    // the document's, in order.
                    assert!(win.tokens.windows(2).all(|t| t[0] < t[1]));
                    assert_eq!(win.tokens[0] as usize, win.start);
                    seen_start.insert(win.start);
                }
            }
            if w.doc_len() < text.len() {
                assert!(seen_start.len() > 50, "{plan:?}: starts hardly vary");
            } else {
                // The document is the whole training part.
                assert_eq!(seen_start.into_iter().collect::<Vec<_>>(), vec![0]);
            }
            assert_ne!(w.step(0, 2), w.step(1, 2));
            let other = Windows::new(text.clone(), plan, 4).unwrap();
            assert_ne!(w.step(0, 2), other.step(0, 2));
        }
    }

    #[test]
    fn a_window_longer_than_the_training_part_is_refused() {
        let text = TrainText::new((0..100).collect()).unwrap();
        let e = Windows::new(text.clone(), WindowPlan::Contiguous { len: 91 }, 0).unwrap_err();
        assert!(
            matches!(e, TuneError::TextTooShort { need: 91, have: 90 }),
            "{e}"
        );
        assert!(Windows::new(text.clone(), WindowPlan::Contiguous { len: 90 }, 0).is_ok());
        let e = Windows::new(
            text,
            WindowPlan::Pose {
                window: 32,
                target: 32,
            },
            0,
        )
        .unwrap_err();
        assert!(matches!(e, TuneError::PoseWindow { .. }), "{e}");
    }
}
