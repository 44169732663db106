//! Loss per position: the mean cross-entropy at each position of a window,
//! over many windows — the measurement behind "loss past the training
//! length" (the classic figure of the interpolation papers: loss against
//! position, with the training length marked).
//!
//! A mean over the whole window mixes positions the model was trained at
//! with the ones past them: at 2L half of the scored tokens are still in
//! distribution. [`PositionLoss::mean_over`] averages any range of
//! positions instead, e.g. `L..2L` only.

use std::ops::Range;

use candle_core::{DType, Device, D};
use posenc::analysis::SplitMix64;
use serde::{Deserialize, Serialize};

use crate::config::Mode;
use crate::model::EvalScaling;
use crate::tasks::IGNORE;
use crate::train::{batch_seed, make_batch, Lab};
use crate::LabError;

/// The data stream of [`loss_per_position`]'s windows (distinct from the
/// training, evaluation, shuffle-test and probe streams).
pub const POSITION_STREAM: u64 = 6;

/// The seed of batch `b` of [`loss_per_position`] at `length` for a model
/// trained with `seed`.
pub fn position_batch_seed(seed: u64, length: usize, b: usize) -> u64 {
    batch_seed(seed, (length as u64) * 1000 + b as u64, POSITION_STREAM)
}

/// Mean loss at each position of windows of one length.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PositionLoss {
    /// Window length.
    pub length: usize,
    /// Mean cross-entropy (nats) of the scored targets at each position
    /// `0..length` (NaN where none was scored; `null` in JSON).
    #[serde(deserialize_with = "nan_as_null")]
    pub loss: Vec<f64>,
    /// How many targets were scored at each position.
    pub count: Vec<usize>,
    /// Characters the scored targets at each position hold
    /// ([`Corpus::chars_of`](crate::tasks::Corpus::chars_of); empty for a
    /// task without a corpus, and in results written before subword
    /// tokens).
    #[serde(default)]
    pub chars: Vec<u64>,
}

/// Reads `null` (how serde_json writes NaN) back as NaN.
pub(crate) fn nan_as_null<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<f64>, D::Error> {
    Ok(Vec::<Option<f64>>::deserialize(d)?
        .into_iter()
        .map(|x| x.unwrap_or(f64::NAN))
        .collect())
}

impl PositionLoss {
    /// The mean loss over the scored targets at positions `range` (each
    /// target weighs the same); NaN if none was scored there or the range
    /// is empty or past the window.
    pub fn mean_over(&self, range: Range<usize>) -> f64 {
        let end = range.end.min(self.length);
        let (mut sum, mut n) = (0.0, 0usize);
        for p in range.start.min(end)..end {
            if self.count[p] > 0 {
                sum += self.loss[p] * self.count[p] as f64;
                n += self.count[p];
            }
        }
        if n == 0 {
            f64::NAN
        } else {
            sum / n as f64
        }
    }

    /// The mean loss over every scored target of the window.
    pub fn mean(&self) -> f64 {
        self.mean_over(0..self.length)
    }

    /// Bits per character over positions `range`: the total nats of the
    /// scored targets there over the characters they hold, / ln 2; NaN
    /// where no character was scored (or none was counted).
    pub fn bits_per_char_over(&self, range: Range<usize>) -> f64 {
        let end = range.end.min(self.length).min(self.chars.len());
        let (mut nats, mut chars) = (0.0, 0u64);
        for p in range.start.min(end)..end {
            if self.count[p] > 0 {
                nats += self.loss[p] * self.count[p] as f64;
                chars += self.chars[p];
            }
        }
        if chars == 0 {
            f64::NAN
        } else {
            nats / chars as f64 / std::f64::consts::LN_2
        }
    }
}

/// The mean loss at each position of `batches × batch` windows of `length`
/// tokens drawn from `lab.task` (use [`Task::validation`] for held-out
/// text), with `scaling` replacing the model's RoPE if given. Batches are
/// seeded by [`position_batch_seed`], so every model trained with the same
/// seed is scored on the same windows.
///
/// For a decoder, position `t` scores the prediction of token `t + 1` from
/// tokens `0..=t`; for a token encoder (`mlm`), the masked tokens at `t`.
///
/// # Errors
/// [`LabError::Invalid`] for a classification encoder (it has one output
/// per sequence, not per position) or zero batches; whatever the model
/// returns at a length it cannot run at (a learned table's rows).
///
/// [`Task::validation`]: crate::tasks::Task::validation
pub fn loss_per_position(
    lab: &Lab,
    length: usize,
    batches: usize,
    batch: usize,
    scaling: Option<&EvalScaling>,
) -> Result<PositionLoss, LabError> {
    if lab.meta.model.mode == Mode::Encoder {
        return Err(LabError::Invalid(
            "loss per position needs a decoder or a token encoder (a classifier has one output per sequence)".into(),
        ));
    }
    if batches == 0 || batch == 0 || length == 0 {
        return Err(LabError::Invalid(
            "loss per position needs at least one batch of one window of one token".into(),
        ));
    }
    // A frozen model keeps no graph; windows go in micro-batches that fit
    // the evaluation memory budget.
    let model = lab.frozen()?;
    model.check_length(length)?;
    let micro = crate::train::micro_batch(&model, length, batch)?;
    let device = Device::Cpu;
    let mut sum = vec![0.0f64; length];
    let mut count = vec![0usize; length];
    let corpus = lab.task.corpus();
    let mut chars = vec![0u64; if corpus.is_some() { length } else { 0 }];
    for b in 0..batches {
        let mut rng = SplitMix64::new(position_batch_seed(lab.meta.train.seed, length, b));
        let x = make_batch(&lab.task, &mut rng, batch, length, &device)?;
        let mut start = 0;
        while start < batch {
            let n = micro.min(batch - start);
            let logits = model.forward(&x.input.narrow(0, start, n)?, 0, scaling)?;
            let logp = candle_nn::ops::log_softmax(&logits.to_dtype(DType::F32)?, D::Minus1)?;
            let target = x.target.narrow(0, start, n)?.to_vec2::<i64>()?;
            let logp = logp.to_vec3::<f32>()?;
            for (row_t, row_p) in target.iter().zip(&logp) {
                for (t, (&y, p)) in row_t.iter().zip(row_p).enumerate() {
                    if y != IGNORE {
                        sum[t] -= p[y as usize] as f64;
                        count[t] += 1;
                        if let Some(c) = corpus {
                            chars[t] += c.chars_of(y as u32) as u64;
                        }
                    }
                }
            }
            start += n;
        }
    }
    let loss = sum
        .iter()
        .zip(&count)
        .map(|(&s, &n)| if n == 0 { f64::NAN } else { s / n as f64 })
        .collect();
    Ok(PositionLoss {
        length,
        loss,
        count,
        chars,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn means_weigh_every_scored_target_equally() {
        let p = PositionLoss {
            length: 4,
            loss: vec![1.0, 2.0, f64::NAN, 4.0],
            count: vec![1, 3, 0, 2],
            chars: vec![2, 3, 0, 2],
        };
        assert!((p.mean_over(0..2) - (1.0 + 6.0) / 4.0).abs() < 1e-12);
        assert!((p.mean() - (1.0 + 6.0 + 8.0) / 6.0).abs() < 1e-12);
        assert_eq!(p.mean_over(3..9), 4.0);
        assert!(p.mean_over(2..3).is_nan());
        assert!(p.mean_over(5..9).is_nan());
        assert!(p.mean_over(2..2).is_nan());
        let ln2 = std::f64::consts::LN_2;
        assert!((p.bits_per_char_over(0..2) - 7.0 / 5.0 / ln2).abs() < 1e-12);
        assert!((p.bits_per_char_over(0..4) - 15.0 / 7.0 / ln2).abs() < 1e-12);
        assert!(p.bits_per_char_over(2..3).is_nan());
        // Through JSON, NaN (written as null) comes back.
        let back: PositionLoss = serde_json::from_str(&serde_json::to_string(&p).unwrap()).unwrap();
        assert!(back.loss[2].is_nan());
        assert_eq!(back.loss[..2], p.loss[..2]);
        assert_eq!(back.count, p.count);
    }
}
