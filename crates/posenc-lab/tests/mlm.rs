//! The masked-language-model task (`mlm`) and the token-encoder mode it
//! trains: invariants of the generator (targets exactly at the masked
//! positions, unmasked inputs equal to a window of the corpus, at least one
//! mask, the 15% rate, uniform positions, determinism), property tests at
//! edge lengths with a fixed seed, and the model: bidirectional attention, a
//! per-token head, NoPE's identical predictions at every `[MASK]`, a
//! checkpoint round trip, a corpus file, and learning.

use crate::common;

use std::path::PathBuf;

use candle_core::{Device, Tensor};
use posenc::analysis::SplitMix64;
use posenc_lab::config::{Mode, ModelConfig, PeConfig, TrainConfig};
use posenc_lab::optim::AdamW;
use posenc_lab::tasks::{masked_positions, Example, Task, TaskKind, IGNORE, MASK_RATE};
use posenc_lab::train::{self, make_batch, Lab, TrainOptions};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

fn runner(cases: u32) -> TestRunner {
    TestRunner::new_with_rng(
        Config {
            cases,
            ..Config::default()
        },
        TestRng::from_seed(RngAlgorithm::ChaCha, &[7u8; 32]),
    )
}

fn mlm() -> Task {
    Task::new(TaskKind::Mlm, 8).unwrap()
}

/// Checks one example against the corpus; returns the number of masks.
fn check_example(task: &Task, e: &Example, length: usize) -> usize {
    let mask = task.mask_token().unwrap();
    // The part of the corpus the task draws from (training by default).
    let corpus = task.corpus().unwrap().part(task.split);
    assert_eq!(e.input.len(), length);
    assert_eq!(e.target.len(), length);
    assert_eq!(e.label, None);
    // Scored exactly where the input is [MASK].
    let mut original = e.input.clone();
    let mut masks = 0;
    for (i, (&x, &y)) in e.input.iter().zip(&e.target).enumerate() {
        if x == mask {
            masks += 1;
            assert_ne!(y, IGNORE, "position {i} masked but not scored");
            assert!(
                (0..mask as i64).contains(&y),
                "target {y} is not a character"
            );
            original[i] = y as u32;
        } else {
            assert_eq!(y, IGNORE, "position {i} scored but not masked");
        }
    }
    assert!(masks >= 1, "nothing masked at length {length}");
    let expected = MASK_RATE * length as f64;
    assert!(
        masks == (expected.floor() as usize).max(1) || masks == expected.ceil() as usize,
        "{masks} masks at length {length}"
    );
    // Unmasked inputs (and the targets put back) are a window of that part.
    assert!(
        corpus.windows(length).any(|w| w == original.as_slice()),
        "length {length}: not a window of the corpus"
    );
    masks
}

#[test]
fn vocabulary_mode_and_names() {
    let t = mlm();
    let c = t.corpus().unwrap();
    // [MASK] is one id past the corpus's characters and never in the text.
    assert_eq!(t.vocab_size(), c.vocab.len() + 1);
    assert_eq!(t.num_outputs(), t.vocab_size());
    assert_eq!(t.mask_token(), Some(c.vocab.len() as u32));
    assert!(c.tokens.iter().all(|&x| (x as usize) < c.vocab.len()));
    // Same corpus as lm.
    let lm = Task::new(TaskKind::Lm, 8).unwrap();
    assert_eq!(lm.corpus().unwrap().tokens, c.tokens);
    assert_eq!(lm.vocab_size() + 1, t.vocab_size());
    assert_eq!(lm.mask_token(), None);
    assert_eq!(TaskKind::parse("mlm").unwrap(), TaskKind::Mlm);
    assert!(!TaskKind::Mlm.is_classification());
    assert_eq!(TaskKind::Mlm.mode(), Mode::TokenEncoder);
    assert_eq!(TaskKind::Order.mode(), Mode::Encoder);
    assert_eq!(TaskKind::Lm.mode(), Mode::Decoder);
    assert_eq!(TaskKind::Copy.mode(), Mode::Decoder);
    // A corpus from text; the synthetic tasks take none.
    let f = Task::from_text(TaskKind::Mlm, "hello world, hello posenc! hello again.").unwrap();
    assert_eq!(f.kind, TaskKind::Mlm);
    assert_eq!(f.mask_token(), Some(f.corpus().unwrap().vocab.len() as u32));
    assert!(Task::from_text(TaskKind::Copy, "hello world, hello posenc!").is_err());
    assert!(Task::from_text(TaskKind::Mlm, "short").is_err());
    assert!(mlm().sample(&mut SplitMix64::new(0), 0).is_err());
}

#[test]
fn examples_at_edge_lengths_satisfy_the_invariants() {
    let t = mlm();
    let mut rng = SplitMix64::new(11);
    for length in [1usize, 2, 3, 6, 7, 8, 16, 127, 128, 129] {
        for _ in 0..8 {
            let e = t.sample(&mut rng, length).unwrap();
            check_example(&t, &e, length);
        }
    }
    // From a text corpus too, up to the full length of its training part
    // (the first 90%; the rest is validation).
    let text = "the cat sees bob. the dogs chase alice.";
    let f = Task::from_text(TaskKind::Mlm, text).unwrap();
    let n = f.corpus().unwrap().split_at;
    assert_eq!(n, 35);
    for length in [1, 2, n - 1, n] {
        let e = f.sample(&mut rng, length).unwrap();
        check_example(&f, &e, length);
    }
    assert!(f.sample(&mut rng, n + 1).is_err());
}

#[test]
fn mask_rate_is_fifteen_percent_and_positions_are_uniform() {
    let t = mlm();
    let mask = t.mask_token().unwrap();
    for (length, samples) in [(16usize, 4000usize), (64, 1000), (129, 500)] {
        let mut rng = SplitMix64::new(length as u64);
        let mut per_pos = vec![0usize; length];
        for _ in 0..samples {
            let e = t.sample(&mut rng, length).unwrap();
            for (i, &x) in e.input.iter().enumerate() {
                per_pos[i] += usize::from(x == mask);
            }
        }
        let total: usize = per_pos.iter().sum();
        let rate = total as f64 / (samples * length) as f64;
        // The count per window is ⌊0.15 n⌋ or ⌈0.15 n⌉, so the mean rate's
        // standard error is below 0.5 / (n √samples) ≤ 0.0004 here.
        assert!(
            (rate - MASK_RATE).abs() < 0.003,
            "length {length}: rate {rate}"
        );
        // Every position is masked at the same rate: binomial, 5 sd.
        let sd = (samples as f64 * MASK_RATE * (1.0 - MASK_RATE)).sqrt();
        for (i, &c) in per_pos.iter().enumerate() {
            let z = (c as f64 - samples as f64 * MASK_RATE) / sd;
            assert!(
                z.abs() < 5.0,
                "length {length}, position {i}: {c} masks (z {z:.1})"
            );
        }
    }
}

#[test]
fn masked_positions_are_distinct_sorted_and_in_range() {
    assert!(masked_positions(&mut SplitMix64::new(1), 0).is_empty());
    runner(256)
        .run(&(1usize..400, any::<u64>()), |(n, seed)| {
            let p = masked_positions(&mut SplitMix64::new(seed), n);
            prop_assert!(!p.is_empty() && p.len() <= n);
            prop_assert!(p.windows(2).all(|w| w[0] < w[1]));
            prop_assert!(*p.last().unwrap() < n);
            let e = MASK_RATE * n as f64;
            prop_assert!(p.len() == (e.floor() as usize).max(1) || p.len() == e.ceil() as usize);
            Ok(())
        })
        .unwrap();
}

#[test]
fn property_invariants_and_determinism() {
    let t = mlm();
    let lengths = prop_oneof![
        Just(1usize),
        Just(2),
        Just(3),
        Just(127),
        Just(128),
        Just(129),
        1usize..200
    ];
    runner(48)
        .run(&(lengths, any::<u64>()), |(length, seed)| {
            let a = t.sample(&mut SplitMix64::new(seed), length).unwrap();
            check_example(&t, &a, length);
            let b = t.sample(&mut SplitMix64::new(seed), length).unwrap();
            prop_assert_eq!(a, b);
            Ok(())
        })
        .unwrap();
    // Different seeds give different windows or masks.
    let a = t.sample(&mut SplitMix64::new(1), 64).unwrap();
    let b = t.sample(&mut SplitMix64::new(2), 64).unwrap();
    assert_ne!(a, b);
}

fn model(task: &Task, pe: &str) -> ModelConfig {
    common::model(
        TaskKind::Mlm.mode(),
        task,
        PeConfig::parse(pe, 64, 4).unwrap(),
    )
}

fn run(steps: usize, len: usize, seed: u64) -> TrainConfig {
    common::run(TaskKind::Mlm, steps, len, seed)
}

fn tmp(name: &str) -> (tempfile::TempDir, PathBuf) {
    common::tmp_dir("posenc-mlm", name)
}

fn logits(lab: &Lab, input: Vec<Vec<u32>>) -> Vec<Vec<Vec<f32>>> {
    let x = Tensor::new(input, &Device::Cpu).unwrap();
    lab.model
        .forward(&x, 0, None)
        .unwrap()
        .to_vec3::<f32>()
        .unwrap()
}

fn max_gap(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn token_encoder_is_bidirectional_with_a_per_token_head() {
    for pe in ["nope", "sinusoidal", "rope", "alibi", "t5"] {
        let task = mlm();
        let v = task.vocab_size();
        let lab = Lab::new(model(&task, pe), run(1, 16, 3), task).unwrap();
        let a: Vec<u32> = (0..16).map(|i| (i % 7) as u32 + 1).collect();
        let mut b = a.clone();
        b[15] = 12;
        let out = logits(&lab, vec![a, b]);
        assert_eq!(
            (out.len(), out[0].len(), out[0][0].len()),
            (2, 16, v),
            "{pe}"
        );
        // Changing the last token changes the first position's output: no
        // causal mask.
        let gap = max_gap(&out[0][0], &out[1][0]);
        assert!(
            gap > 1e-6,
            "{pe}: position 0 does not see position 15 ({gap})"
        );
    }
}

#[test]
fn nope_predicts_the_same_at_every_mask_and_positions_break_the_tie() {
    let task = mlm();
    let mut rng = SplitMix64::new(4);
    let e = task.sample(&mut rng, 40).unwrap();
    let masked: Vec<usize> = (0..40).filter(|&i| e.target[i] != IGNORE).collect();
    assert!(masked.len() >= 2);
    let gaps = |pe: &str| {
        let t = mlm();
        let lab = Lab::new(model(&t, pe), run(1, 40, 5), t).unwrap();
        let out = logits(&lab, vec![e.input.clone()]);
        masked[1..]
            .iter()
            .map(|&i| max_gap(&out[0][masked[0]], &out[0][i]))
            .fold(0.0f32, f32::max)
    };
    // Without positions, identical [MASK] inputs see the same bag: same
    // logits to float rounding.
    let g = gaps("nope");
    assert!(g <= 1e-5, "NoPE tells masks apart: {g}");
    for pe in ["sinusoidal", "learned", "rope", "alibi"] {
        let g = gaps(pe);
        assert!(g > 1e-4, "{pe} gives every mask the same prediction: {g}");
    }
}

#[test]
fn trains_saves_loads_and_learns() {
    let (_tmp, out) = tmp("train");
    let task = mlm();
    let unigram = task.corpus().unwrap().unigram_entropy();
    // One layer learns this fastest (a layer of local attention suffices).
    let mut cfg = model(&task, "t5");
    cfg.n_layers = 1;
    let mut tc = run(300, 32, 7);
    tc.batch = 32;
    let mut lab = Lab::new(cfg, tc, task).unwrap();
    let before = train::evaluate(&lab, &[32], 4, 16, None).unwrap().loss[0];
    let mut opt = AdamW::new(lab.params(), 0.01).unwrap();
    let summary = train::train(&mut lab, &mut opt, &TrainOptions::quiet(&out)).unwrap();
    assert_eq!(summary.steps, 300);
    let after = train::evaluate(&lab, &[32], 4, 16, None).unwrap();
    // Untrained: about ln V, above the unigram entropy; trained, well
    // below it: the masked characters are predicted from their context.
    assert!(before > unigram, "before {before}, unigram {unigram}");
    assert!(
        after.loss[0] < unigram - 0.3,
        "{before} → {}",
        after.loss[0]
    );
    assert!((0.0..=1.0).contains(&after.accuracy[0]));
    // The checkpoint records the token-encoder mode and reloads exactly.
    let cfg = std::fs::read_to_string(out.join("config.json")).unwrap();
    assert!(cfg.contains("\"token-encoder\""), "{cfg}");
    let back = Lab::load(&out).unwrap();
    assert_eq!(back.meta.model.mode, Mode::TokenEncoder);
    assert_eq!(back.task.kind, TaskKind::Mlm);
    let again = train::evaluate(&back, &[32], 4, 16, None).unwrap();
    assert_eq!(again, after);
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn a_corpus_file_builds_an_mlm_task() {
    let (_tmp, dir) = common::fresh_dir("posenc-mlm", "corpus");
    let path = dir.join("text.txt");
    let text = "abracadabra, the magic word. ".repeat(20);
    std::fs::write(&path, &text).unwrap();
    let mut tc = run(1, 16, 0);
    tc.corpus = Some(path);
    let task = train::load_task(&tc).unwrap();
    assert_eq!(task.kind, TaskKind::Mlm);
    let n_chars = {
        let mut c: Vec<char> = text.chars().collect();
        c.sort();
        c.dedup();
        c.len()
    };
    // Characters and [MASK].
    assert_eq!(task.vocab_size(), n_chars + 1);
    let lab = Lab::new(model(&task, "learned"), tc, task).unwrap();
    let mut rng = SplitMix64::new(1);
    let b = make_batch(&lab.task, &mut rng, 4, 16, &Device::Cpu).unwrap();
    assert_eq!(b.target.dims(), &[4, 16]);
    let (loss, acc) = lab.batch_loss(&b, None).unwrap();
    assert!(loss.to_scalar::<f32>().unwrap().is_finite());
    assert!((0.0..=1.0).contains(&acc));
    let _ = std::fs::remove_dir_all(&dir);
}
