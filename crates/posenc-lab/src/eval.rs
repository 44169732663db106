//! Loss per position: the mean cross-entropy at each position of a window,
//! over many windows — the measurement behind "loss past the training
//! length" (the classic figure of the interpolation papers: loss against
//! position, with the training length marked).
//!
//! A mean over the whole window mixes positions the model was trained at
//! with the ones past them: at 2L half of the scored tokens are still in
//! distribution. [`PositionLoss::mean_over`] averages any range of
//! positions instead, e.g. `L..2L` only.
//!
//! The other measurements of a trained model are here too: loss and
//! accuracy per evaluation length ([`evaluate`], bits per character for a
//! corpus), the shuffle test ([`shuffle_test`]) and the linear probe of
//! absolute position ([`probe`]) of Haviv et al. 2022 (also re-exported
//! from [`crate::train`]).

use std::ops::Range;

use candle_core::{DType, Device, IndexOp, Tensor, D};
use posenc::analysis::SplitMix64;
use serde::{Deserialize, Serialize};

use crate::checkpoint::batch_seed;
use crate::config::Mode;
use crate::error::LabError;
use crate::lab::{loss_and_accuracy, loss_and_accuracy_with, make_batch, Lab};
use crate::model::{EvalScaling, Transformer};
use crate::tasks::{Task, IGNORE};

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
fn nan_as_null<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<f64>, D::Error> {
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
        let (sum, n) = self.scored_nats(range.start.min(end)..end, |p| self.count[p] as u64);
        if n == 0 {
            f64::NAN
        } else {
            sum / n as f64
        }
    }

    /// The total nats of the scored targets at `positions` (in order), and
    /// the sum of `weight` over the positions that scored any.
    fn scored_nats(&self, positions: Range<usize>, weight: impl Fn(usize) -> u64) -> (f64, u64) {
        let (mut nats, mut total) = (0.0, 0u64);
        for p in positions {
            if self.count[p] > 0 {
                nats += self.loss[p] * self.count[p] as f64;
                total += weight(p);
            }
        }
        (nats, total)
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
        let (nats, chars) = self.scored_nats(range.start.min(end)..end, |p| self.chars[p]);
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
    let micro = micro_batch(&model, length, batch)?;
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

/// Loss and accuracy per evaluation length.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalResult {
    /// Evaluation lengths.
    pub lengths: Vec<usize>,
    /// Mean loss at each length.
    pub loss: Vec<f64>,
    /// Exact-match accuracy per sequence at each length.
    pub accuracy: Vec<f64>,
    /// Bits per character at each length (`lm`, `mlm`): the total nats
    /// of the scored targets over the characters they hold
    /// ([`Corpus::chars_of`](crate::tasks::Corpus::chars_of)), / ln 2 — comparable across tokenizations.
    /// NaN (`null`) for tasks without a corpus.
    #[serde(default, deserialize_with = "nan_as_null")]
    pub bits_per_char: Vec<f64>,
}

/// Characters held by the scored targets of `target` (`(B, T)` ids,
/// [`IGNORE`] where not scored) and how many targets are scored; `None`
/// for a task without a corpus or a classification target.
pub fn scored_chars(task: &Task, target: &Tensor) -> Result<Option<(u64, usize)>, LabError> {
    let Some(c) = task.corpus() else {
        return Ok(None);
    };
    if target.rank() != 2 {
        return Ok(None);
    }
    let (mut chars, mut n) = (0u64, 0usize);
    for y in target.flatten_all()?.to_vec1::<i64>()? {
        if y != IGNORE {
            chars += c.chars_of(y as u32) as u64;
            n += 1;
        }
    }
    Ok(Some((chars, n)))
}

/// Memory a forward pass of [`evaluate`] may take (bytes); larger batches
/// are split into micro-batches that fit, and a length that does not fit
/// even one sequence is [`LabError::TooLong`].
pub const EVAL_MEMORY_BUDGET: u64 = 1 << 30;

/// Evaluates on `batches × batch` fresh sequences per length (seeded
/// independently of training), through the [`frozen`](Lab::frozen) model:
/// a batch whose forward pass would exceed [`EVAL_MEMORY_BUDGET`] runs as
/// micro-batches (the loss is the same mean over the batch's scored tokens).
///
/// # Errors
/// [`LabError::TooLong`] before any allocation for a length that does not
/// fit one sequence; a learned table too short; candle errors.
pub fn evaluate(
    lab: &Lab,
    lengths: &[usize],
    batches: usize,
    batch: usize,
    scaling: Option<&EvalScaling>,
) -> Result<EvalResult, LabError> {
    let device = Device::Cpu;
    let model = lab.frozen()?;
    let mut loss = Vec::new();
    let mut accuracy = Vec::new();
    let mut bits_per_char = Vec::new();
    for &len in lengths {
        model.check_length(len)?;
        let micro = micro_batch(&model, len, batch)?;
        let (mut l, mut a) = (0.0, 0.0);
        // Total nats and characters of the scored targets, for bits per
        // character.
        let (mut nats, mut chars) = (0.0f64, 0u64);
        for b in 0..batches {
            let mut rng =
                SplitMix64::new(batch_seed(lab.meta.train.seed, (len * 1000 + b) as u64, 1));
            let full = make_batch(&lab.task, &mut rng, batch, len, &device)?;
            let held = scored_chars(&lab.task, &full.target)?;
            if micro >= batch {
                let logits = model.forward(&full.input, 0, scaling)?;
                let (ls, acc) = loss_and_accuracy_with(&logits, &full.target, model.is_fused())?;
                let ls = ls.to_scalar::<f32>()? as f64;
                l += ls;
                a += acc;
                if let Some((c, n)) = held {
                    nats += ls * n as f64;
                    chars += c;
                }
                continue;
            }
            // Micro-batches: the mean over all scored tokens of the batch.
            let (mut sum, mut count, mut correct) = (0.0f64, 0usize, 0.0f64);
            let mut start = 0;
            while start < batch {
                let n = micro.min(batch - start);
                let input = full.input.narrow(0, start, n)?;
                let target = full.target.narrow(0, start, n)?;
                let scored = if target.rank() == 1 {
                    n
                } else {
                    target
                        .flatten_all()?
                        .to_vec1::<i64>()?
                        .iter()
                        .filter(|&&t| t != IGNORE)
                        .count()
                };
                let logits = model.forward(&input, 0, scaling)?;
                let (ls, acc) = loss_and_accuracy_with(&logits, &target, model.is_fused())?;
                sum += ls.to_scalar::<f32>()? as f64 * scored as f64;
                count += scored;
                correct += acc * n as f64;
                start += n;
            }
            l += sum / count.max(1) as f64;
            a += correct / batch as f64;
            if let Some((c, _)) = held {
                nats += sum;
                chars += c;
            }
        }
        loss.push(l / batches as f64);
        accuracy.push(a / batches as f64);
        bits_per_char.push(if chars == 0 {
            f64::NAN
        } else {
            nats / chars as f64 / std::f64::consts::LN_2
        });
    }
    Ok(EvalResult {
        lengths: lengths.to_vec(),
        loss,
        accuracy,
        bits_per_char,
    })
}

/// The largest number of sequences of `len` tokens (at most `batch`) whose
/// forward pass fits [`EVAL_MEMORY_BUDGET`].
///
/// # Errors
/// [`LabError::TooLong`] if not even one fits.
pub fn micro_batch(model: &Transformer, len: usize, batch: usize) -> Result<usize, LabError> {
    let (one, why) = model.eval_bytes(1, len);
    let budget = EVAL_MEMORY_BUDGET as u128;
    if one > budget {
        return Err(LabError::TooLong {
            len,
            need_mb: (one >> 20).min(u64::MAX as u128) as u64,
            budget_mb: EVAL_MEMORY_BUDGET >> 20,
            why,
        });
    }
    let mut n = batch.max(1);
    while n > 1 && model.eval_bytes(n, len).0 > budget {
        n = n.div_ceil(2);
    }
    Ok(n)
}

/// The shuffle test (Haviv et al. 2022 §5): loss on the last
/// `tail` positions of language-model windows with the prefix in order
/// versus randomly shuffled.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShuffleResult {
    /// Mean loss with the prefix in order.
    pub in_order: f64,
    /// Mean loss with the prefix shuffled.
    pub shuffled: f64,
    /// Unigram entropy of the corpus (the loss of a context-free model).
    pub unigram: Option<f64>,
}

/// Runs the shuffle test on `batches × batch` windows of `length` tokens:
/// the first `length − tail` tokens are permuted (the last `tail` kept), and
/// the loss is measured on the last `tail` targets only.
pub fn shuffle_test(
    lab: &Lab,
    length: usize,
    tail: usize,
    batches: usize,
    batch: usize,
) -> Result<ShuffleResult, LabError> {
    if lab.meta.model.mode != Mode::Decoder {
        return Err(LabError::Invalid(
            "the shuffle test needs a decoder checkpoint".into(),
        ));
    }
    if tail == 0 || tail >= length {
        return Err(LabError::Invalid(format!(
            "tail {tail} must be in 1..{length}"
        )));
    }
    let device = Device::Cpu;
    let model = lab.frozen()?;
    let (mut a, mut b) = (0.0, 0.0);
    for i in 0..batches {
        let mut rng = SplitMix64::new(batch_seed(lab.meta.train.seed, i as u64, 2));
        let batch = make_batch(&lab.task, &mut rng, batch, length, &device)?;
        let input = batch.input.to_vec2::<u32>()?;
        let target = batch.target.to_vec2::<i64>()?;
        let keep_from = length - tail;
        let mut shuffled = input.clone();
        for row in shuffled.iter_mut() {
            for j in (1..keep_from).rev() {
                row.swap(j, rng.below(j as u64 + 1) as usize);
            }
        }
        // Score only the last `tail` targets (their inputs are unshuffled).
        let masked: Vec<Vec<i64>> = target
            .iter()
            .map(|r| {
                r.iter()
                    .enumerate()
                    .map(|(j, &y)| if j >= keep_from { y } else { IGNORE })
                    .collect()
            })
            .collect();
        let tgt = Tensor::new(masked, &device)?;
        for (inp, acc) in [(input, &mut a), (shuffled, &mut b)] {
            let x = Tensor::new(inp, &device)?;
            let logits = model.forward(&x, 0, None)?;
            let (l, _) = loss_and_accuracy(&logits, &tgt)?;
            *acc += l.to_scalar::<f32>()? as f64;
        }
    }
    Ok(ShuffleResult {
        in_order: a / batches as f64,
        shuffled: b / batches as f64,
        unigram: lab.task.corpus().map(|c| c.unigram_entropy()),
    })
}

/// A per-layer linear probe of absolute position (Haviv et al. 2022 §4):
/// for the activations after the embedding and after each block, fit a
/// ridge regression from the activation of the token at position t to t on
/// one set of sequences and report the mean absolute error on another,
/// against the error of always predicting the mean position.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProbeResult {
    /// Sequence length probed.
    pub length: usize,
    /// Mean absolute error per layer (index 0: embeddings + input encoding).
    pub mae: Vec<f64>,
    /// The error of predicting the mean position.
    pub baseline_mae: f64,
}

/// Runs the probe.
pub fn probe(
    lab: &Lab,
    length: usize,
    batches: usize,
    batch: usize,
) -> Result<ProbeResult, LabError> {
    let device = Device::Cpu;
    let model = lab.frozen()?;
    let collect = |stream: u64| -> Result<Vec<Tensor>, LabError> {
        let mut per_layer: Vec<Vec<Tensor>> = Vec::new();
        for i in 0..batches {
            let mut rng = SplitMix64::new(batch_seed(lab.meta.train.seed, i as u64, stream));
            let b = make_batch(&lab.task, &mut rng, batch, length, &device)?;
            let acts = model.hidden_states(&b.input, 0)?;
            if per_layer.is_empty() {
                per_layer = vec![Vec::new(); acts.len()];
            }
            for (l, a) in acts.into_iter().enumerate() {
                let d = a.dim(2)?;
                per_layer[l].push(a.reshape((batch * length, d))?);
            }
        }
        per_layer
            .into_iter()
            .map(|v| Ok(Tensor::cat(&v, 0)?.to_dtype(DType::F64)?))
            .collect()
    };
    let train_x = collect(3)?;
    let test_x = collect(4)?;
    let pos: Vec<f64> = (0..batches * batch)
        .flat_map(|_| (0..length).map(|t| t as f64))
        .collect();
    let y = Tensor::from_vec(pos.clone(), (pos.len(), 1), &device)?;
    let mean = pos.iter().sum::<f64>() / pos.len() as f64;
    let baseline = pos.iter().map(|p| (p - mean).abs()).sum::<f64>() / pos.len() as f64;
    let mut mae = Vec::new();
    for (xtr, xte) in train_x.iter().zip(&test_x) {
        let n = xtr.dim(0)?;
        let ones = Tensor::ones((n, 1), DType::F64, &device)?;
        let xtr1 = Tensor::cat(&[xtr, &ones], 1)?;
        let xte1 = Tensor::cat(
            &[xte, &Tensor::ones((xte.dim(0)?, 1), DType::F64, &device)?],
            1,
        )?;
        let d = xtr1.dim(1)?;
        let xtx = (xtr1.t()?.matmul(&xtr1)? + (Tensor::eye(d, DType::F64, &device)? * 1e-3)?)?;
        let xty = xtr1.t()?.matmul(&y)?;
        let w = solve_spd(&xtx, &xty)?;
        let pred = xte1.matmul(&w)?.squeeze(1)?.to_vec1::<f64>()?;
        let err = pred
            .iter()
            .zip(&pos)
            .map(|(p, t)| (p - t).abs())
            .sum::<f64>()
            / pos.len() as f64;
        mae.push(err);
    }
    Ok(ProbeResult {
        length,
        mae,
        baseline_mae: baseline,
    })
}

/// Solves `A w = b` for symmetric positive-definite `A` (Cholesky, f64:
/// [`posenc::analysis::cholesky_solve`]).
fn solve_spd(a: &Tensor, b: &Tensor) -> Result<Tensor, LabError> {
    let a = a.to_vec2::<f64>()?;
    let b: Vec<f64> = b.i((.., 0))?.to_vec1::<f64>()?;
    let n = b.len();
    let w = posenc::analysis::cholesky_solve(&a, &b)
        .map_err(|e| LabError::Invalid(format!("probe: {e}")))?;
    Ok(Tensor::from_vec(w, (n, 1), &Device::Cpu)?)
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
