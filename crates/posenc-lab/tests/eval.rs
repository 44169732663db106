//! Loss per position: it agrees with the lab's own batch loss on the same
//! windows, the prefix of a causal decoder does not depend on what follows,
//! and classifiers are refused.

use crate::common;

use candle_core::Device;
use posenc::analysis::SplitMix64;
use posenc_lab::config::{Mode, PeConfig};
use posenc_lab::eval::{loss_per_position, position_batch_seed};
use posenc_lab::tasks::{Task, TaskKind};
use posenc_lab::train::{make_batch, Lab};

fn lm_lab(pe: PeConfig, len: usize) -> Lab {
    let task = Task::new(TaskKind::Lm, 8).unwrap();
    let model = common::model(Mode::Decoder, &task, pe);
    Lab::new(model, common::run(TaskKind::Lm, 10, len, 3), task).unwrap()
}

#[test]
fn the_mean_over_every_position_is_the_batch_loss_on_the_same_windows() {
    let mut lab = lm_lab(PeConfig::parse("rope", 16, 4).unwrap(), 16);
    lab.task = lab.task.validation();
    let (len, batches, batch) = (24, 3, 5);
    let p = loss_per_position(&lab, len, batches, batch, None).unwrap();
    assert_eq!(p.length, len);
    assert_eq!(p.count, vec![batches * batch; len]);
    assert!(p.loss.iter().all(|l| l.is_finite() && *l > 0.0));
    let mut reference = 0.0;
    for b in 0..batches {
        let mut rng = SplitMix64::new(position_batch_seed(lab.meta.train.seed, len, b));
        let x = make_batch(&lab.task, &mut rng, batch, len, &Device::Cpu).unwrap();
        let (l, _) = lab.batch_loss(&x, None).unwrap();
        reference += l.to_scalar::<f32>().unwrap() as f64 / batches as f64;
    }
    assert!(
        (p.mean() - reference).abs() < 1e-5 * reference,
        "{} vs {reference}",
        p.mean()
    );
    // An untrained model is near the uniform loss ln V at every position.
    let uniform = (lab.meta.model.vocab_size as f64).ln();
    for l in &p.loss {
        assert!((l - uniform).abs() < 0.5, "{l} vs ln V = {uniform}");
    }
}

#[test]
fn a_causal_prefix_is_scored_the_same_in_a_longer_window() {
    // The first L positions of a decoder see only themselves: scoring them in
    // windows of 2L (the same text, longer) changes nothing. Sinusoidal
    // inputs and no RoPE scaling keep the first L positions identical.
    let lab = lm_lab(PeConfig::parse("sinusoidal", 16, 4).unwrap(), 16);
    let long = loss_per_position(&lab, 32, 2, 4, None).unwrap();
    let mut rng = SplitMix64::new(position_batch_seed(lab.meta.train.seed, 32, 0));
    let x = make_batch(&lab.task, &mut rng, 4, 32, &Device::Cpu).unwrap();
    let short_in = x.input.narrow(1, 0, 16).unwrap();
    let full = lab.model.forward(&x.input, 0, None).unwrap();
    let short = lab.model.forward(&short_in, 0, None).unwrap();
    let diff = (full.narrow(1, 0, 16).unwrap() - short)
        .unwrap()
        .abs()
        .unwrap()
        .flatten_all()
        .unwrap()
        .max(0)
        .unwrap()
        .to_scalar::<f32>()
        .unwrap();
    assert!(diff < 1e-4, "{diff}");
    assert!(long.mean_over(0..16).is_finite() && long.mean_over(16..32).is_finite());
}

#[test]
fn masked_lm_scores_only_masked_positions_and_classifiers_are_refused() {
    // Ten steps of `kind` at length 16 on `mode` with `pe` (16 positions).
    let lab_of = |kind: TaskKind, mode: Mode, pe: &str| {
        let task = Task::new(kind, 8).unwrap();
        let pe = PeConfig::parse(pe, 16, 4).unwrap();
        common::new_lab(mode, task, pe, common::run(kind, 10, 16, 1))
    };
    let lab = lab_of(TaskKind::Mlm, Mode::TokenEncoder, "rope");
    let p = loss_per_position(&lab, 16, 4, 8, None).unwrap();
    let total: usize = p.count.iter().sum();
    // About 15% of 16 × 32 windows' positions, at least one per window.
    assert!((32..=160).contains(&total), "{total}");
    assert!(p.mean().is_finite());

    let lab = lab_of(TaskKind::Order, Mode::Encoder, "sinusoidal");
    let e = loss_per_position(&lab, 16, 1, 4, None).unwrap_err();
    assert!(e.to_string().contains("decoder"), "{e}");
    let lab = lm_lab(PeConfig::parse("rope", 16, 4).unwrap(), 16);
    assert!(loss_per_position(&lab, 16, 0, 4, None).is_err());
}
