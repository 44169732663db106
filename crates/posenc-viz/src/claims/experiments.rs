//! The trained and analytic experiments' claims: each with its stable id,
//! its source and its rule, fixed here before any run, and the verdict
//! function that applies the rule to the numbers.
//!
//! Ids never change meaning; a new claim gets a new id. The rules are as
//! strong as the claims they cite: a claim that does not reproduce at the
//! preset's scale says so with the numbers, never by a relaxed rule.

use super::{lower, Compare, Stat, Verdict};

/// A claim an experiment tests, fixed in code before the runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimDef {
    /// Stable identifier, `eN.name`.
    pub id: &'static str,
    /// The experiment (1–7) that measures it.
    pub experiment: usize,
    /// The claim, in words.
    pub claim: &'static str,
    /// Paper and table (or seed) it comes from.
    pub source: &'static str,
    /// The rule that turns the numbers into the verdict.
    pub rule: &'static str,
}

/// Every claim of the experiments, in report order.
pub const ALL: [&ClaimDef; 23] = [
    &PERMUTATION_INVARIANCE,
    &NOPE_NEAR_CHANCE,
    &POSITIONAL_SOLVE,
    &MLM_NOPE_NEAR_UNIGRAM,
    &QUIZ_ENCODER_FAILS,
    &NOPE_CLOSE,
    &NOPE_GAP_SHRINKS,
    &PROBE,
    &SHUFFLE,
    &QUIZ_DECODER_WORKS,
    &NO_SCALING_BLOWS_UP,
    &PI_ZERO_SHOT_FINITE,
    &PI_FINETUNE_RECOVERS,
    &DYNAMIC_YARN_BEST,
    &QUIZ_ROPE_NEEDS_INTERPOLATION,
    &IN_DISTRIBUTION,
    &PAST_THE_TABLE,
    &SINUSOIDAL_EXTRAPOLATES,
    &RANKING,
    &NEWER_GENERALISE,
    &SHAW_K,
    &ROPE_DECAY,
    &PI_FIT,
];

/// The three answers of the NoPE-and-RoPE post's quiz, as claims (one per answer).
pub const QUIZ: [&ClaimDef; 3] = [
    &QUIZ_ENCODER_FAILS,
    &QUIZ_DECODER_WORKS,
    &QUIZ_ROPE_NEEDS_INTERPOLATION,
];

// ------------------------------------------------------------ e1 ---

/// e1: an untrained NoPE encoder's pooled output ignores the order.
pub const PERMUTATION_INVARIANCE: ClaimDef = ClaimDef {
    id: "e1.permutation-invariance",
    experiment: 1,
    claim: "A NoPE encoder's pooled output is invariant to permutations of its input.",
    source: concat!(crate::src_quiz!(), "; Haviv et al. 2022 §1"),
    rule: "reproduced if NoPE's gap ≤ 1e-5 while sinusoidal's is ≥ 1e-3; partly if NoPE's is ≤ 1e-5 only",
};

/// [`PERMUTATION_INVARIANCE`]'s rule.
pub fn permutation_invariance(nope_gap: f64, sinusoidal_gap: f64) -> Verdict {
    Verdict::finite_or_nan(&[nope_gap, sinusoidal_gap], || {
        Verdict::three(nope_gap <= 1e-5 && sinusoidal_gap >= 1e-3, nope_gap <= 1e-5)
    })
}

/// e1: a NoPE encoder stays near chance on the order task.
pub const NOPE_NEAR_CHANCE: ClaimDef = ClaimDef {
    id: "e1.nope-near-chance",
    experiment: 1,
    claim:
        "Without positions an encoder cannot solve an order-sensitive task: NoPE stays near chance.",
    source: concat!(
        crate::src_quiz!(),
        "; Haviv et al. 2022 (MLM perplexity 147 vs 4.1)"
    ),
    rule: "reproduced if accuracy ≤ 60%; partly if ≤ 70%",
};

/// [`NOPE_NEAR_CHANCE`]'s rule.
pub fn nope_near_chance(accuracy: f64) -> Verdict {
    Verdict::finite_or_nan(&[accuracy], || {
        Verdict::three(accuracy <= 0.60, accuracy <= 0.70)
    })
}

/// e1: every encoding that can tell the order solves the order task.
pub const POSITIONAL_SOLVE: ClaimDef = ClaimDef {
    id: "e1.positional-solve",
    experiment: 1,
    claim: "With any positional encoding the order task is solved (≥ 95%).",
    source: concat!(crate::src_quiz!(), "; Haviv et al. 2022"),
    rule: "reproduced if every positional encoding that can tell the order reaches ≥ 95%; partly if the worst of them reaches ≥ 80% or all but one reach 95%. An encoding whose pooled output is unchanged when the sequence is reversed (measured on the untrained model: symmetric bidirectional ALiBi, whose bias depends on |i − j| only) cannot tell A-before-B from B-before-A by construction: it is reported separately with the reason, not judged",
};

/// [`POSITIONAL_SOLVE`]'s rule over the accuracies of the encodings that
/// can tell the order (NaN if there are none).
pub fn positional_solve(accuracies: &[f64]) -> Verdict {
    if accuracies.is_empty() {
        return Verdict::Nan;
    }
    Verdict::finite_or_nan(accuracies, || {
        let failing = accuracies.iter().filter(|&&a| a < 0.95).count();
        let worst = accuracies.iter().copied().fold(f64::INFINITY, f64::min);
        Verdict::three(failing == 0, worst >= 0.80 || failing == 1)
    })
}

/// e1: a NoPE masked language model stays near the unigram level.
pub const MLM_NOPE_NEAR_UNIGRAM: ClaimDef = ClaimDef {
    id: "e1.mlm-nope-near-unigram",
    experiment: 1,
    claim: "Without positions a masked language model fails: NoPE's masked-token loss stays much closer to the unigram level (no context) than to the positional encoders'.",
    source: "Haviv et al. 2022, §6 and Table 4: RoBERTa-large MLMs on the Pile, 128-token sequences — perplexity NoPE 147.18, learned 4.06, sinusoidal 4.07, ALiBi 4.00 (numbers as quoted by a secondary summary of the paper; not checked against the PDF here)",
    rule: "fraction = (NoPE − mean of the positional encodings) / (unigram entropy − mean of the positional encodings), masked-token validation losses averaged over seeds; reproduced if every positional encoding's mean loss is below NoPE's and the fraction ≥ 0.5 (NoPE closer to the unigram level than to the positional encoders); partly if every positional encoding beats NoPE and the fraction ≥ 0.25; tie if a positional encoding's mean loss equals NoPE's; NaN if the positional encoders do not beat the unigram level (the fraction is undefined)",
};

/// The fraction of [`MLM_NOPE_NEAR_UNIGRAM`]: where NoPE's loss sits
/// between the positional encoders' mean (0) and the unigram entropy (1);
/// NaN when the positional encoders do not beat the unigram level.
pub fn unigram_fraction(nope: f64, positional_mean: f64, unigram: f64) -> f64 {
    share_of(nope - positional_mean, unigram - positional_mean)
}

/// `part / whole` for a positive `whole`, NaN otherwise.
fn share_of(part: f64, whole: f64) -> f64 {
    if whole > 0.0 {
        part / whole
    } else {
        f64::NAN
    }
}

/// [`MLM_NOPE_NEAR_UNIGRAM`]'s rule.
pub fn mlm_nope_near_unigram(nope: f64, positional: &[f64], unigram: f64) -> Verdict {
    if positional.is_empty() {
        return Verdict::Nan;
    }
    let mut all = positional.to_vec();
    all.extend([nope, unigram]);
    Verdict::finite_or_nan(&all, || {
        if positional.contains(&nope) {
            return Verdict::Tie;
        }
        let mean = positional.iter().sum::<f64>() / positional.len() as f64;
        let frac = unigram_fraction(nope, mean, unigram);
        if frac.is_nan() {
            return Verdict::Nan;
        }
        let all_beat = positional.iter().all(|&p| p < nope);
        Verdict::three(all_beat && frac >= 0.5, all_beat && frac >= 0.25)
    })
}

/// e1: the quiz's first answer.
pub const QUIZ_ENCODER_FAILS: ClaimDef = ClaimDef {
    id: "e1.quiz-encoder-fails",
    experiment: 1,
    claim: "The NoPE-and-RoPE post's quiz, first answer: an encoder (BERT) cannot work well without a positional encoding.",
    source: concat!(crate::src_quiz!(), ": «Can BERT work well on standard tasks without positional encoding? No»; Haviv et al. 2022 §6"),
    rule: "reproduced if e1.mlm-nope-near-unigram's rule gives reproduced (NoPE's masked-LM loss closer to the unigram level than to the positional encoders') and NoPE's order-task accuracy ≤ 60%; partly if one of the two holds; tie or NaN if the masked-LM comparison is",
};

/// [`QUIZ_ENCODER_FAILS`]'s rule.
pub fn quiz_encoder_fails(
    nope_mlm: f64,
    positional_mlm: &[f64],
    unigram: f64,
    nope_order_accuracy: f64,
) -> Verdict {
    let mlm = mlm_nope_near_unigram(nope_mlm, positional_mlm, unigram);
    if matches!(mlm, Verdict::Tie | Verdict::Nan) {
        return mlm;
    }
    Verdict::finite_or_nan(&[nope_order_accuracy], || {
        let a = mlm == Verdict::Reproduced;
        let b = nope_order_accuracy <= 0.60;
        Verdict::three(a && b, a || b)
    })
}

// ------------------------------------------------------------ e2 ---

/// e2: a NoPE decoder is nearly as good as a positional one.
pub const NOPE_CLOSE: ClaimDef = ClaimDef {
    id: "e2.nope-close",
    experiment: 2,
    claim: "A decoder without positional encoding reaches nearly the loss of one with positions.",
    source: concat!(crate::src_nope_rope_ru!(), ", on NoPE: «works in principle, but slightly worse»; Haviv et al. 2022, Table 1 and §3 (the gap shrinks as models grow)"),
    rule: "closed = (unigram entropy − NoPE) / (unigram entropy − best positional encoding), validation losses at the largest size, mean over seeds; reproduced if closed ≥ 0.9 and NoPE's gap to the best, |NoPE − best| (nats, mean over seeds), is smaller at the largest size than at the smallest, beyond the spread; partly if closed ≥ 0.75; tie if closed ≥ 0.9 and the gaps are within the spread",
};

/// The fraction of the unigram-to-best gap that NoPE closes: 1 when NoPE
/// equals the best positional encoding, 0 at the unigram level; NaN when
/// the best does not beat the unigram level.
pub fn closed_fraction(unigram: f64, nope: f64, best: f64) -> f64 {
    share_of(unigram - nope, unigram - best)
}

/// A gap's size: |mean| with its spread. The claims are about NoPE and the
/// positional encodings converging, from either side.
fn size(gap: Stat) -> Stat {
    Stat {
        mean: gap.mean.abs(),
        ..gap
    }
}

/// [`NOPE_CLOSE`]'s rule: `closed` at the largest size, and NoPE's gap to
/// the best (NoPE − best, per seed) at the smallest and the largest size.
pub fn nope_close(closed: f64, gap_smallest: Stat, gap_largest: Stat) -> Verdict {
    Verdict::finite_or_nan(&[closed], || {
        if closed >= 0.9 {
            match lower(size(gap_largest), size(gap_smallest)) {
                Compare::Lower => Verdict::Reproduced,
                Compare::Tie => Verdict::Tie,
                Compare::Higher => Verdict::Partly,
                Compare::Nan => Verdict::Nan,
            }
        } else {
            Verdict::three(false, closed >= 0.75)
        }
    })
}

/// e2: the NoPE gap shrinks with scale (measured at two or more sizes).
pub const NOPE_GAP_SHRINKS: ClaimDef = ClaimDef {
    id: "e2.nope-gap-shrinks",
    experiment: 2,
    claim: "The gap between NoPE and the best positional encoding shrinks as the model grows.",
    source: "Haviv et al. 2022, §3 and Table 1 (NoPE's perplexity gap to the positional models narrows from 125M to 1.3B parameters)",
    rule: "gap = NoPE's validation loss − the best positional encoding's (nats), per seed, at each size from smallest to largest; its size |mean| with the sd over seeds; reproduced if the size is smaller at each size than at the one before, beyond the spread; partly if smaller at the largest size than at the smallest beyond the spread, but not at every step; tie if the smallest and largest sizes are within the spread",
};

/// [`NOPE_GAP_SHRINKS`]'s rule over the gap (NoPE − best, per seed) at
/// each size, smallest first (NaN for fewer than two sizes).
pub fn nope_gap_shrinks(gaps: &[Stat]) -> Verdict {
    if gaps.len() < 2 {
        return Verdict::Nan;
    }
    let gaps: Vec<Stat> = gaps.iter().map(|g| size(*g)).collect();
    match lower(gaps[gaps.len() - 1], gaps[0]) {
        Compare::Nan => Verdict::Nan,
        Compare::Tie => Verdict::Tie,
        Compare::Higher => Verdict::NotReproduced,
        Compare::Lower => {
            let steps: Vec<Compare> = gaps.windows(2).map(|w| lower(w[1], w[0])).collect();
            if steps.contains(&Compare::Nan) {
                Verdict::Nan
            } else {
                Verdict::three(steps.iter().all(|c| *c == Compare::Lower), true)
            }
        }
    }
}

/// e2: a linear probe finds no position at NoPE's embedding layer, and
/// finds it later.
pub const PROBE: ClaimDef = ClaimDef {
    id: "e2.probe",
    experiment: 2,
    claim: "NoPE's embedding layer carries no position (probe at the random baseline); later layers learn it.",
    source: "Haviv et al. 2022, §4 and Fig. 2",
    rule: "reproduced if the embedding layer's ratio ≥ 0.9 and a later layer's ≤ 0.6; partly if ≥ 0.9 and a later layer's ≤ 0.85",
};

/// [`PROBE`]'s rule: probe error over the error of predicting the mean, at
/// the embedding layer and the best later layer.
pub fn probe(embedding_ratio: f64, best_later_ratio: f64) -> Verdict {
    Verdict::finite_or_nan(&[embedding_ratio, best_later_ratio], || {
        Verdict::three(
            embedding_ratio >= 0.9 && best_later_ratio <= 0.6,
            embedding_ratio >= 0.9 && best_later_ratio <= 0.85,
        )
    })
}

/// e2: shuffling the prefix hurts a NoPE decoder.
pub const SHUFFLE: ClaimDef = ClaimDef {
    id: "e2.shuffle",
    experiment: 2,
    claim: "Shuffling the prefix raises a NoPE decoder's loss toward the unigram level: it uses order it was never given.",
    source: "Haviv et al. 2022, §5",
    rule: "reproduced if the fraction (shuffled − in order) / (unigram − in order) ≥ 0.5; partly if ≥ 0.1",
};

/// [`SHUFFLE`]'s rule.
pub fn shuffle(fraction: f64) -> Verdict {
    Verdict::finite_or_nan(&[fraction], || {
        Verdict::three(fraction >= 0.5, fraction >= 0.1)
    })
}

/// e2: the quiz's second answer.
pub const QUIZ_DECODER_WORKS: ClaimDef = ClaimDef {
    id: "e2.quiz-decoder-works",
    experiment: 2,
    claim: "The NoPE-and-RoPE post's quiz, second answer: a decoder (GPT) can work well without a positional encoding.",
    source: concat!(crate::src_quiz!(), ": «Can GPT work well on standard tasks without positional encoding? Yes»; Haviv et al. 2022, Table 1"),
    rule: "reproduced if NoPE closes ≥ 90% of the gap between the unigram entropy and the best positional encoding's validation loss at the largest size (mean over seeds); partly if ≥ 75%",
};

/// [`QUIZ_DECODER_WORKS`]'s rule on the closed fraction.
pub fn quiz_decoder_works(closed: f64) -> Verdict {
    Verdict::finite_or_nan(&[closed], || Verdict::three(closed >= 0.9, closed >= 0.75))
}

// ------------------------------------------------------------ e3 ---

/// e3: without scaling, RoPE fails past its training length.
pub const NO_SCALING_BLOWS_UP: ClaimDef = ClaimDef {
    id: "e3.no-scaling-blows-up",
    experiment: 3,
    claim: "Without scaling, RoPE's loss blows up past the training length.",
    source: concat!(crate::src_quiz!(), "; Chen et al. 2023 (PI), Fig. 1 and Table 1 (perplexity > 10^3 past L)"),
    rule: "loss on positions L..nL of validation windows of nL (n the largest factor), no scaling, mean over seeds: reproduced if ≥ the unigram entropy (worse than ignoring the context); partly if ≥ 2 × the loss at L",
};

/// [`NO_SCALING_BLOWS_UP`]'s rule.
pub fn no_scaling_blows_up(past_l: f64, at_l: f64, unigram: f64) -> Verdict {
    Verdict::finite_or_nan(&[past_l, at_l, unigram], || {
        Verdict::three(past_l >= unigram, past_l >= 2.0 * at_l)
    })
}

/// e3: Position Interpolation zero-shot beats no scaling.
pub const PI_ZERO_SHOT_FINITE: ClaimDef = ClaimDef {
    id: "e3.pi-zero-shot-finite",
    experiment: 3,
    claim: "Position Interpolation keeps the loss finite zero-shot, below no scaling.",
    source: "Chen et al. 2023, §2.3 and Table 1",
    rule: "loss on positions L..nL of windows of nL, over seeds: reproduced if PI's is finite and lower than no scaling's beyond the spread; tie if within the spread; otherwise not reproduced (no partly)",
};

/// [`PI_ZERO_SHOT_FINITE`]'s rule.
pub fn pi_zero_shot_finite(pi: Stat, none: Stat) -> Verdict {
    lower_reproduces(lower(pi, none))
}

/// e3: a short PI fine-tune recovers the loss at 2L.
pub const PI_FINETUNE_RECOVERS: ClaimDef = ClaimDef {
    id: "e3.pi-finetune-recovers",
    experiment: 3,
    claim: "After a short fine-tune, PI recovers the in-distribution loss at the longer length.",
    source: "Chen et al. 2023, Table 1 and §3.2 (1000 steps suffice)",
    rule: "after the fine-tune at 2L with PI ×2 kept, loss on positions L..2L of validation windows of 2L (mean over seeds): reproduced if ≤ 1.05 × the loss at L; partly if lower than PI zero-shot's on the same positions beyond the spread; tie if within the spread",
};

/// [`PI_FINETUNE_RECOVERS`]'s rule.
pub fn pi_finetune_recovers(finetuned: Stat, zero_shot: Stat, at_l: f64) -> Verdict {
    Verdict::finite_or_nan(&[finetuned.mean, at_l], || {
        if finetuned.mean <= 1.05 * at_l {
            return Verdict::Reproduced;
        }
        lower_is_partly(lower(finetuned, zero_shot))
    })
}

/// e3: dynamic NTK and YaRN are the best zero-shot scalings.
pub const DYNAMIC_YARN_BEST: ClaimDef = ClaimDef {
    id: "e3.dynamic-yarn-best",
    experiment: 3,
    claim: "Dynamic NTK and YaRN are the best zero-shot scalings past L.",
    source: "Peng et al. 2023 (YaRN), Table 1 and Fig. 4",
    rule: "loss on positions L..nL of windows of nL, zero-shot, over seeds: reproduced if dynamic NTK and YaRN each are lower than both PI and no scaling beyond the spread; partly if one of the two is; tie if neither is but no comparison goes the other way beyond the spread; otherwise not reproduced",
};

/// [`DYNAMIC_YARN_BEST`]'s rule.
pub fn dynamic_yarn_best(dynamic: Stat, yarn: Stat, pi: Stat, none: Stat) -> Verdict {
    two_best([
        lower(dynamic, pi),
        lower(dynamic, none),
        lower(yarn, pi),
        lower(yarn, none),
    ])
}

/// "Dynamic NTK and YaRN are best" from the comparisons dynamic vs PI,
/// dynamic vs none, YaRN vs PI, YaRN vs none, however they were made (e3:
/// over seeds; e8: paired bands).
fn two_best(c: [Compare; 4]) -> Verdict {
    if c.contains(&Compare::Nan) {
        return Verdict::Nan;
    }
    let dyn_wins = c[0] == Compare::Lower && c[1] == Compare::Lower;
    let yarn_wins = c[2] == Compare::Lower && c[3] == Compare::Lower;
    if dyn_wins && yarn_wins {
        Verdict::Reproduced
    } else if dyn_wins || yarn_wins {
        Verdict::Partly
    } else if !c.contains(&Compare::Higher) {
        Verdict::Tie
    } else {
        Verdict::NotReproduced
    }
}

/// "Lower beyond the spread" as the whole rule: reproduced, tie, not
/// reproduced (no partly), NaN.
fn lower_reproduces(c: Compare) -> Verdict {
    match c {
        Compare::Lower => Verdict::Reproduced,
        Compare::Tie => Verdict::Tie,
        Compare::Higher => Verdict::NotReproduced,
        Compare::Nan => Verdict::Nan,
    }
}

/// The weaker form shared by several rules: lower beyond the spread is
/// partly, within it a tie, higher not reproduced.
fn lower_is_partly(c: Compare) -> Verdict {
    match c {
        Compare::Lower => Verdict::Partly,
        Compare::Tie => Verdict::Tie,
        Compare::Higher => Verdict::NotReproduced,
        Compare::Nan => Verdict::Nan,
    }
}

/// `better` where `a` is above `b`, a tie where they are equal, not
/// reproduced where it is below.
fn ahead(a: f64, b: f64, better: Verdict) -> Verdict {
    if a > b {
        better
    } else if a == b {
        Verdict::Tie
    } else {
        Verdict::NotReproduced
    }
}

/// e3: the quiz's third answer.
pub const QUIZ_ROPE_NEEDS_INTERPOLATION: ClaimDef = ClaimDef {
    id: "e3.quiz-rope-needs-interpolation",
    experiment: 3,
    claim: "The NoPE-and-RoPE post's quiz, third answer: a RoPE decoder trained at L runs well at 2L only with interpolation (and a short fine-tune).",
    source: concat!(crate::src_quiz!(), ": «Can a RoPE decoder trained on 1024 tokens generate 2048 well? Only after extrapolation/interpolation»; Chen et al. 2023"),
    rule: "loss on positions L..2L of validation windows of 2L, over seeds: reproduced if without scaling it is ≥ 2 × the loss at L while PI with the short fine-tune is ≤ 1.05 × the loss at L; partly if PI with the fine-tune is lower than no scaling beyond the spread; tie if within the spread",
};

/// [`QUIZ_ROPE_NEEDS_INTERPOLATION`]'s rule.
pub fn quiz_rope_needs_interpolation(none_2l: Stat, pi_finetuned_2l: Stat, at_l: f64) -> Verdict {
    Verdict::finite_or_nan(&[none_2l.mean, pi_finetuned_2l.mean, at_l], || {
        if none_2l.mean >= 2.0 * at_l && pi_finetuned_2l.mean <= 1.05 * at_l {
            return Verdict::Reproduced;
        }
        lower_is_partly(lower(pi_finetuned_2l, none_2l))
    })
}

// ------------------------------------------------------------ e4 ---

/// e4: learned and sinusoidal are equally good within the table.
pub const IN_DISTRIBUTION: ClaimDef = ClaimDef {
    id: "e4.in-distribution",
    experiment: 4,
    claim: "Learned and sinusoidal absolute encodings are equally good within the training length.",
    source: "Vaswani et al. 2017, Table 3 row E (PPL 4.92 vs 4.92)",
    rule: "reproduced if |difference of the mean validation losses at L| ≤ max(2 × the larger sd over seeds, 2% of sinusoidal's loss); partly if ≤ 5% of it",
};

/// [`IN_DISTRIBUTION`]'s rule.
pub fn in_distribution(learned: Stat, sinusoidal: Stat) -> Verdict {
    Verdict::finite_or_nan(
        &[learned.mean, learned.sd, sinusoidal.mean, sinusoidal.sd],
        || {
            let diff = (learned.mean - sinusoidal.mean).abs();
            let tol = (2.0 * learned.sd.max(sinusoidal.sd)).max(0.02 * sinusoidal.mean);
            Verdict::three(diff <= tol, diff <= 0.05 * sinusoidal.mean)
        },
    )
}

/// e4: only the sinusoid runs past the learned table.
pub const PAST_THE_TABLE: ClaimDef = ClaimDef {
    id: "e4.past-the-table",
    experiment: 4,
    claim: "Past the learned table only the sinusoidal encoding can run at all.",
    source: "Vaswani et al. 2017, §3.5",
    rule: "reproduced if the learned model refuses 2L and the sinusoidal one returns a finite loss there; NaN if the sinusoidal loss is not finite. The refusal holds by construction (the table has L rows); how well the sinusoid does there is e4.sinusoidal-extrapolates",
};

/// [`PAST_THE_TABLE`]'s rule.
pub fn past_the_table(learned_refuses: bool, sinusoidal_loss_2l: f64) -> Verdict {
    Verdict::finite_or_nan(&[sinusoidal_loss_2l], || {
        Verdict::from_bool(learned_refuses)
    })
}

/// e4: the sinusoid extrapolates.
pub const SINUSOIDAL_EXTRAPOLATES: ClaimDef = ClaimDef {
    id: "e4.sinusoidal-extrapolates",
    experiment: 4,
    claim: "The sinusoidal encoding lets the model extrapolate to sequences longer than those seen in training.",
    source: "Vaswani et al. 2017, §3.5 («it may allow the model to extrapolate to sequence lengths longer than the ones encountered during training»)",
    rule: "sinusoidal model, loss on positions L..2L of validation windows of 2L (mean over seeds): reproduced if ≤ 1.1 × its loss at L; partly if below the unigram entropy",
};

/// [`SINUSOIDAL_EXTRAPOLATES`]'s rule.
pub fn sinusoidal_extrapolates(past_l: f64, at_l: f64, unigram: f64) -> Verdict {
    Verdict::finite_or_nan(&[past_l, at_l, unigram], || {
        Verdict::three(past_l <= 1.1 * at_l, past_l < unigram)
    })
}

// ------------------------------------------------------------ e5 ---

/// e5: the length-generalisation ranking of Kazemnejad et al.
pub const RANKING: ClaimDef = ClaimDef {
    id: "e5.ranking",
    experiment: 5,
    claim: "NoPE generalises to longer lengths best, then T5, ALiBi, RoPE and absolute encodings.",
    source: "Kazemnejad et al. 2023, Fig. 1 (mean reciprocal rank over tasks)",
    rule: "mean reciprocal rank (MRR) of accuracy beyond L over the tasks where some encoding scores above 0 (the others rank nothing and are named); reproduced if NoPE alone has the top MRR and Spearman ρ with the paper's MRRs ≥ 0.7; partly if NoPE alone is top or ρ ≥ 0.3; tie if NoPE shares the top MRR, every MRR is equal, or no task separates the encodings",
};

/// [`RANKING`]'s rule: NoPE's MRR, the other ranked encodings' MRRs,
/// Spearman's ρ with the paper's, and how many tasks separate the
/// encodings.
pub fn ranking(nope_mrr: f64, others_mrr: &[f64], rho: f64, informative_tasks: usize) -> Verdict {
    if informative_tasks == 0 {
        return Verdict::Tie;
    }
    let mut all = others_mrr.to_vec();
    all.push(nope_mrr);
    Verdict::finite_or_nan(&all, || {
        let top_other = others_mrr.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        if all.iter().all(|&m| m == nope_mrr) || nope_mrr == top_other {
            return Verdict::Tie;
        }
        if rho.is_nan() {
            return Verdict::Nan;
        }
        let alone = nope_mrr > top_other;
        Verdict::three(alone && rho >= 0.7, alone || rho >= 0.3)
    })
}

/// e5: the learned relative encodings published since generalise better
/// than RoPE and ALiBi.
pub const NEWER_GENERALISE: ClaimDef = ClaimDef {
    id: "e5.newer-beat-rope-alibi",
    experiment: 5,
    claim: "FIRE, CoPE and forgetting attention generalise to longer lengths better than RoPE and ALiBi.",
    source: "Li et al. 2024 (FIRE), §4 and Fig. 1; Golovneva et al. 2024 (CoPE), §4; Lin et al. 2025 (forgetting attention), §4",
    rule: "exact-match accuracy beyond L, mean over the tasks, per encoding; each of FIRE, CoPE and forgetting attention that the preset trains is better if its mean is above both RoPE's and ALiBi's, tied if it equals the larger of the two; reproduced if every one is better; partly if at least one is; tie if none is better and at least one ties; otherwise not reproduced",
};

/// [`NEWER_GENERALISE`]'s rule: the newer encodings' mean accuracies beyond
/// L, and RoPE's and ALiBi's.
pub fn newer_generalise(newer: &[f64], rope: f64, alibi: f64) -> Verdict {
    if newer.is_empty() {
        return Verdict::Nan;
    }
    let mut all = newer.to_vec();
    all.extend([rope, alibi]);
    Verdict::finite_or_nan(&all, || {
        let bar = rope.max(alibi);
        let better = newer.iter().filter(|&&m| m > bar).count();
        let tied = newer.iter().filter(|&&m| m == bar).count();
        if better == 0 && tied > 0 {
            return Verdict::Tie;
        }
        Verdict::three(better == newer.len(), better > 0)
    })
}

// ------------------------------------------------------------ e6 ---

/// e6: Shaw's k = 0 collapses, k ≥ 2 plateaus.
pub const SHAW_K: ClaimDef = ClaimDef {
    id: "e6.k0-collapses-k2-plateau",
    experiment: 6,
    claim: "k = 0 collapses (no position); from k = 2 on quality plateaus.",
    source: "Shaw et al. 2018, Table 2 (BLEU 12.5 at k = 0; 25.8 for k ≥ 2)",
    rule: "order-task accuracy per k, mean over seeds: reproduced if k = 0's ≤ 60%, every k ≥ 2 is ≥ k = 0's + 20 points and within 5 points of each other; partly if k = 0 is strictly the lowest; tie if k = 0 ties the lowest",
};

/// [`SHAW_K`]'s rule: accuracy at k = 0, at each k ≥ 2, and at every
/// k ≥ 1.
pub fn shaw_k(k0: f64, k_ge_2: &[f64], k_ge_1: &[f64]) -> Verdict {
    if k_ge_2.is_empty() || k_ge_1.is_empty() {
        return Verdict::Nan;
    }
    let mut all = vec![k0];
    all.extend(k_ge_1);
    all.extend(k_ge_2);
    Verdict::finite_or_nan(&all, || {
        let lo = k_ge_2.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = k_ge_2.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        if k0 <= 0.6 && lo >= k0 + 0.2 && hi - lo <= 0.05 {
            return Verdict::Reproduced;
        }
        let lowest_other = k_ge_1.iter().copied().fold(f64::INFINITY, f64::min);
        ahead(lowest_other, k0, Verdict::Partly)
    })
}

// ------------------------------------------------------------ e7 ---

/// e7: RoFormer's decay bound (the rule is the encodings' own:
/// [`super::properties::roformer_decay`]).
pub const ROPE_DECAY: ClaimDef = ClaimDef {
    id: "e7.rope-decay",
    experiment: 7,
    claim: "RoPE's relative upper bound decays with the relative distance.",
    source: "Su et al. 2021 (RoFormer), §3.4.3 and Fig. 2 (d = 128, base 10000)",
    rule: "reproduced if every value is within 5% of the figure's (32.5 at 0, 10.2 at 100, 6.6 at 250); partly if within 15%",
};

/// e7: Position Interpolation's Fig. 2.
pub const PI_FIT: ClaimDef = ClaimDef {
    id: "e7.pi-fit",
    experiment: 7,
    claim: "A fit bounded inside the trained range explodes outside it, while interpolated points stay bounded.",
    source: "Chen et al. 2023 (Position Interpolation), Fig. 2",
    rule: "reproduced if extrapolated ≥ 100 × inside and interpolated ≤ 2 × inside; partly if extrapolated ≥ 10 × inside",
};

/// [`PI_FIT`]'s rule: max |a(s)| inside the fitted range, at interpolated
/// points, and past the range.
pub fn pi_fit(inside: f64, interpolated: f64, extrapolated: f64) -> Verdict {
    Verdict::finite_or_nan(&[inside, interpolated, extrapolated], || {
        Verdict::three(
            extrapolated >= 100.0 * inside && interpolated <= 2.0 * inside,
            extrapolated >= 10.0 * inside,
        )
    })
}

#[cfg(test)]
mod tests;

// ------------------------------------------------------------ e8 ---
//
// Experiment 8 runs only with `posenc report --model FILE`: a pretrained
// RoPE decoder, one window of twice its trained length L, zero-shot. Its
// claims are e3's, with e3's thresholds; what changes is the spread: one
// model and one window have no seeds, so two scalings are compared on the
// same positions, band by band (bands of 1,024 positions beyond L), and one
// is lower "beyond the spread" when the mean of the paired band differences
// plus twice its standard error is below 0.

/// The claims of experiment 8, in report order (not in [`ALL`]: the
/// experiment runs only when a model is given).
pub const PRETRAINED: [&ClaimDef; 5] = [
    &PRETRAINED_QUIZ,
    &PRETRAINED_NO_SCALING_BLOWS_UP,
    &PRETRAINED_PI_ZERO_SHOT,
    &PRETRAINED_DYNAMIC_YARN_BEST,
    &PRETRAINED_RETRIEVAL,
];

/// The claims experiment 8 adds when it also fine-tunes
/// (`posenc report --model M --finetune-steps N`), in report order.
pub const PRETRAINED_FINETUNE: [&ClaimDef; 2] = [&PI_FINETUNE_CLOSES_GAP, &FINETUNE_RETRIEVES];

/// e8 with fine-tuning: PI + a short fine-tune recovers the loss at L.
pub const PI_FINETUNE_CLOSES_GAP: ClaimDef = ClaimDef {
    id: "e8.pi-finetune-closes-gap",
    experiment: 8,
    claim: "A short fine-tune under Position Interpolation recovers what zero-shot PI costs: past L, the fine-tuned model scores about as well as the original model does within L.",
    source: "Chen et al. 2023 (PI), §3.2 and Table 1 (LLaMA 7B–65B, 1,000 fine-tuning steps: perplexity at the extended window at or below the original's at 2,048); Zhu et al. 2024 (PoSE), Table 2 (the same with windows of the original length)",
    rule: "held-out text (the text's last 10% of tokens, never trained on), one window of 2L; at L: the base model's mean loss on positions 0..L without scaling. Reproduced if PI + fine-tune's mean loss on L..2L is ≤ 1.05 × at L and lower than zero-shot PI's beyond the spread (paired bands beyond L: mean difference + 2 standard errors < 0); partly if only lower than zero-shot PI's beyond the spread; tie if within it; otherwise not reproduced",
};

/// [`PI_FINETUNE_CLOSES_GAP`]'s rule: bands beyond L of PI + fine-tune
/// and of zero-shot PI, and the base model's loss at L.
pub fn pi_finetune_closes_gap(tuned: &[f64], zero_shot: &[f64], at_l: f64) -> Verdict {
    let m = mean_of(tuned);
    Verdict::finite_or_nan(&[m, mean_of(zero_shot), at_l], || {
        match paired_lower(tuned, zero_shot) {
            Compare::Lower if m <= 1.05 * at_l => Verdict::Reproduced,
            c => lower_is_partly(c),
        }
    })
}

/// e8 with fine-tuning: retrieval at 2L after a short fine-tune.
pub const FINETUNE_RETRIEVES: ClaimDef = ClaimDef {
    id: "e8.finetune-retrieves",
    experiment: 8,
    claim: "After a short fine-tune with interpolation, a RoPE decoder retrieves a passkey at twice its trained length.",
    source: "Chen et al. 2023 (PI), §3.4 (passkey retrieval up to the extended window after fine-tuning); Peng et al. 2023 (YaRN), repository data/passkey-32k.csv (LLaMA 7B fine-tuned 2k → 32k: YaRN 1.0/1.0/.98/1.0 and PI .54/.52/.44/.50 at 2k–16k)",
    rule: "landmark passkey prompts as in e8.retrieval-needs-interpolation; accuracy at 2L over every depth and trial; the better of PI + fine-tune and YaRN + fine-tune against the same scaling zero-shot. Reproduced if it retrieves ≥ 80% at 2L and more than zero-shot; partly if more than zero-shot but < 80%; tie if as much as zero-shot; not reproduced if less",
};

/// [`FINETUNE_RETRIEVES`]'s rule: accuracy at 2L of the better fine-tune
/// and of the same scaling zero-shot.
pub fn finetune_retrieves(tuned_at_2l: f64, zero_shot_at_2l: f64) -> Verdict {
    Verdict::finite_or_nan(&[tuned_at_2l, zero_shot_at_2l], || {
        let gain = Verdict::three(tuned_at_2l >= 0.8, true);
        ahead(tuned_at_2l, zero_shot_at_2l, gain)
    })
}

/// e8: "generates well" judged by retrieval.
pub const PRETRAINED_RETRIEVAL: ClaimDef = ClaimDef {
    id: "e8.retrieval-needs-interpolation",
    experiment: 8,
    claim: "The NoPE-and-RoPE post's quiz, third answer, judged as the papers judge generation at length: a RoPE decoder trained at L retrieves a passkey at 2L only with interpolation (or an attention-level extension).",
    source: concat!(crate::src_quiz!(), "; Chen et al. 2023 (PI), §3.4 passkey retrieval; Peng et al. 2023 (YaRN), passkey (repository data/passkey-32k.csv: YaRN 0.68–1.0 up to 32k after fine-tuning); Jin et al. 2024 (Self-Extend), passkey without fine-tuning"),
    rule: "landmark passkey prompts (YaRN's eval/passkey.py format), greedy, the first integer of 10 generated tokens; accuracy at 2L over every depth and trial, zero-shot. Reproduced if no scaling retrieves ≤ 20% while the best of PI, dynamic NTK, YaRN and Self-Extend retrieves ≥ 80%; partly if no scaling ≤ 20% and the best ≥ 50%; not reproduced otherwise (no scaling above 20%, or no method at 50%)",
};

/// [`PRETRAINED_RETRIEVAL`]'s rule: accuracies at 2L of no scaling and of
/// the best interpolation or extension.
pub fn pretrained_retrieval(none_at_2l: f64, best_at_2l: f64) -> Verdict {
    Verdict::finite_or_nan(&[none_at_2l, best_at_2l], || {
        if none_at_2l > 0.2 {
            Verdict::NotReproduced
        } else if best_at_2l >= 0.8 {
            Verdict::Reproduced
        } else if best_at_2l >= 0.5 {
            Verdict::Partly
        } else {
            Verdict::NotReproduced
        }
    })
}

/// e8: the quiz's third answer on a pretrained model.
pub const PRETRAINED_QUIZ: ClaimDef = ClaimDef {
    id: "e8.quiz-rope-needs-interpolation",
    experiment: 8,
    claim: "The NoPE-and-RoPE post's quiz, third answer, on a pretrained model: a RoPE decoder trained at L runs well at 2L only with interpolation.",
    source: concat!(crate::src_quiz!(), "; Chen et al. 2023 (PI), Fig. 1 and Table 1; Peng et al. 2023 (YaRN), Table 1 and Fig. 4"),
    rule: "one window of 2L tokens, zero-shot; at L: no scaling's mean loss on positions 0..L; best: the lowest mean loss on positions L..2L among PI, dynamic NTK and YaRN. Reproduced if no scaling's loss on L..2L is ≥ 2 × at L while best ≤ 1.05 × at L (e3's thresholds); partly if best is lower than no scaling's beyond the spread (paired bands beyond L: mean difference + 2 standard errors < 0); tie if within it; otherwise not reproduced",
};

/// e8: no scaling blows up past L.
pub const PRETRAINED_NO_SCALING_BLOWS_UP: ClaimDef = ClaimDef {
    id: "e8.no-scaling-blows-up",
    experiment: 8,
    claim: "Without scaling, a pretrained RoPE decoder's loss blows up past its trained length.",
    source: "Chen et al. 2023 (PI), Fig. 1 and Table 1 (perplexity > 10^3 past L, LLaMA 7B)",
    rule: "mean loss on positions L..2L of one window of 2L, no scaling: reproduced if ≥ the unigram entropy of the text's tokens (worse than ignoring the context); partly if ≥ 2 × the loss on positions 0..L (e3's rule)",
};

/// e8: PI zero-shot beats no scaling.
pub const PRETRAINED_PI_ZERO_SHOT: ClaimDef = ClaimDef {
    id: "e8.pi-zero-shot-finite",
    experiment: 8,
    claim: "Position Interpolation keeps a pretrained model's loss finite zero-shot past L, below no scaling.",
    source: "Chen et al. 2023, §2.3 and Table 1",
    rule: "mean loss on positions L..2L: reproduced if PI's is finite and lower than no scaling's beyond the spread (paired bands); tie if within it; otherwise not reproduced (no partly)",
};

/// e8: dynamic NTK and YaRN are the best zero-shot scalings.
pub const PRETRAINED_DYNAMIC_YARN_BEST: ClaimDef = ClaimDef {
    id: "e8.dynamic-yarn-best",
    experiment: 8,
    claim: "Dynamic NTK and YaRN are the best zero-shot scalings of a pretrained model past L.",
    source: "Peng et al. 2023 (YaRN), Table 1 and Fig. 4",
    rule: "mean loss on positions L..2L, zero-shot: reproduced if dynamic NTK and YaRN each are lower than both PI and no scaling beyond the spread (paired bands); partly if one of the two is; tie if neither is but no comparison goes the other way beyond it; otherwise not reproduced",
};

/// Compares two scalings on the same bands: `a` lower when the mean of
/// `a_b − b_b` plus twice its standard error is below 0 (NaN for fewer than
/// two bands or a value that is not finite).
pub fn paired_lower(a: &[f64], b: &[f64]) -> Compare {
    let n = a.len().min(b.len());
    let d: Vec<f64> = a.iter().zip(b).map(|(x, y)| x - y).collect();
    if n < 2 || d.iter().any(|x| !x.is_finite()) || a.len() != b.len() {
        return Compare::Nan;
    }
    let mean = d.iter().sum::<f64>() / n as f64;
    let var = d.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
    let se = (var / n as f64).sqrt();
    if mean + 2.0 * se < 0.0 {
        Compare::Lower
    } else if mean - 2.0 * se > 0.0 {
        Compare::Higher
    } else {
        Compare::Tie
    }
}

fn mean_of(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len() as f64
}

/// [`PRETRAINED_QUIZ`]'s rule: band means beyond L of no scaling and of
/// each interpolation (PI, dynamic NTK, YaRN), and no scaling's loss on
/// 0..L.
pub fn pretrained_quiz(none: &[f64], interpolations: &[&[f64]], at_l: f64) -> Verdict {
    let best = interpolations
        .iter()
        .copied()
        .min_by(|a, b| mean_of(a).total_cmp(&mean_of(b)));
    let Some(best) = best else {
        return Verdict::Nan;
    };
    let (none_m, best_m) = (mean_of(none), mean_of(best));
    Verdict::finite_or_nan(&[none_m, best_m, at_l], || {
        if none_m >= 2.0 * at_l && best_m <= 1.05 * at_l {
            return Verdict::Reproduced;
        }
        lower_is_partly(paired_lower(best, none))
    })
}

/// [`PRETRAINED_PI_ZERO_SHOT`]'s rule.
pub fn pretrained_pi_zero_shot(pi: &[f64], none: &[f64]) -> Verdict {
    lower_reproduces(paired_lower(pi, none))
}

/// [`PRETRAINED_DYNAMIC_YARN_BEST`]'s rule.
pub fn pretrained_dynamic_yarn_best(
    dynamic: &[f64],
    yarn: &[f64],
    pi: &[f64],
    none: &[f64],
) -> Verdict {
    two_best([
        paired_lower(dynamic, pi),
        paired_lower(dynamic, none),
        paired_lower(yarn, pi),
        paired_lower(yarn, none),
    ])
}

/// The claims of experiment 9, "training-free methods side by side", in
/// report order (not in [`ALL`]: the experiment runs only when a model is
/// given).
pub const TRAINING_FREE: [&ClaimDef; 4] = [
    &SELF_EXTEND_RETRIEVES,
    &REROPE_AT_MOST_NTK,
    &SINKS_FLAT_NO_RETRIEVAL,
    &DCA_FLAT,
];

/// e9: Self-Extend retrieves past L without training.
pub const SELF_EXTEND_RETRIEVES: ClaimDef = ClaimDef {
    id: "e9.self-extend-retrieves",
    experiment: 9,
    claim: "Self-Extend lets a RoPE decoder retrieve a passkey past its trained length without any training.",
    source: "Jin et al. 2024 (LLM Maybe LongLM: Self-Extend), §4.3 and Fig. 3: passkey retrieval near 100% at every depth up to 4 × the trained length (Llama-2-chat, Mistral), no fine-tuning",
    rule: "landmark passkey prompts at 1.5L and 2L, every depth, greedy exact match, zero-shot; Self-Extend with group 4 and a neighbour window of L/8. Reproduced if its accuracy is ≥ 80% at both lengths; partly if its mean accuracy over the two is ≥ 50% and at least 30 points above no scaling's on the same prompts; not reproduced otherwise",
};

/// [`SELF_EXTEND_RETRIEVES`]'s rule: accuracies at 1.5L and 2L of
/// Self-Extend and of no scaling.
pub fn self_extend_retrieves(se: [f64; 2], none: [f64; 2]) -> Verdict {
    Verdict::finite_or_nan(&[se[0], se[1], none[0], none[1]], || {
        let (m, n) = ((se[0] + se[1]) / 2.0, (none[0] + none[1]) / 2.0);
        if se[0] >= 0.8 && se[1] >= 0.8 {
            Verdict::Reproduced
        } else if m >= 0.5 && m - n >= 0.3 {
            Verdict::Partly
        } else {
            Verdict::NotReproduced
        }
    })
}

/// e9: ReRoPE's loss past L is at most NTK-aware scaling's.
pub const REROPE_AT_MOST_NTK: ClaimDef = ClaimDef {
    id: "e9.rerope-at-most-ntk",
    experiment: 9,
    claim: "ReRoPE's loss past the trained length is at most that of NTK-aware scaling, without training.",
    source: "Su 2023, Rectified Rotary Position Embeddings (github.com/bojone/rerope, README: Llama-2 13B trained at 4k, loss at 8k: RoPE 8.86, NTK-RoPE 1.54, ReRoPE w 1,024 1.43)",
    rule: "one window of 2L tokens, zero-shot; ReRoPE with w = L/4 (Su's w 1,024 at L 4,096) against static NTK-aware scaling of factor 2; paired bands of 1,024 positions beyond L. Reproduced if ReRoPE's loss is lower beyond the spread (mean difference + 2 standard errors < 0); tie if within it; not reproduced if higher",
};

/// [`REROPE_AT_MOST_NTK`]'s rule: band losses beyond L.
pub fn rerope_at_most_ntk(rerope: &[f64], ntk: &[f64]) -> Verdict {
    lower_reproduces(paired_lower(rerope, ntk))
}

/// e9: sinks keep the loss flat but do not retrieve beyond their window.
pub const SINKS_FLAT_NO_RETRIEVAL: ClaimDef = ClaimDef {
    id: "e9.sinks-flat-no-retrieval",
    experiment: 9,
    claim: "Attention sinks keep a pretrained model's loss flat far past its trained length, but do not extend its context: nothing beyond the window is retrieved.",
    source: "Xiao et al. 2024 (StreamingLLM), Fig. 3 (flat perplexity up to 4M tokens) and the authors' FAQ (github.com/mit-han-lab/streaming-llm: «Is the context window of LLMs expanded? No»)",
    rule: "4 sink tokens and a cache of L/8 keys. (a) flat: its mean loss on positions L..2L of one window of 2L is ≤ 1.05 × its own mean loss on positions L/8..L (where its cache is already full); (b) no retrieval beyond the window: its greedy accuracy on the passkey prompts at 1.5L and 2L with the needle at depths 0 and 0.5 (farther from the question than the window) is ≤ 20%, while no scaling retrieves ≥ 50% of the prompts of at most L tokens (the control: the probe works on this model; without it (b) does not hold). Reproduced if both hold; partly if one does; not reproduced if neither",
};

/// [`SINKS_FLAT_NO_RETRIEVAL`]'s rule: sinks' mean loss past L, its mean
/// loss on L/8..L, its accuracy on needles beyond its window, and no
/// scaling's accuracy on prompts of at most L tokens (the control).
pub fn sinks_flat_no_retrieval(
    beyond: f64,
    inside: f64,
    far_accuracy: f64,
    control: f64,
) -> Verdict {
    Verdict::finite_or_nan(&[beyond, inside, far_accuracy, control], || {
        let flat = beyond <= 1.05 * inside;
        let blind = far_accuracy <= 0.2 && control >= 0.5;
        match (flat, blind) {
            (true, true) => Verdict::Reproduced,
            (true, false) | (false, true) => Verdict::Partly,
            (false, false) => Verdict::NotReproduced,
        }
    })
}

/// e9: dual chunk attention keeps the loss near its level within L.
pub const DCA_FLAT: ClaimDef = ClaimDef {
    id: "e9.dca-flat",
    experiment: 9,
    claim: "Dual chunk attention keeps a pretrained model's loss past its trained length near its loss within it, without training.",
    source: "An et al. 2024 (Training-Free Long-Context Scaling of Large Language Models: ChunkLlama), Table 1 (PG19 perplexity of Llama 2 flat from 4k to 32k and beyond, no fine-tuning)",
    rule: "one window of 2L tokens, zero-shot; DCA with ChunkLlama's defaults (chunk 3L/4, local window L/8). Reproduced if its mean loss on positions L..2L is ≤ 1.05 × no scaling's mean loss on 0..L (e3's threshold); partly if lower than no scaling's past L beyond the spread (paired bands); tie if within it; not reproduced otherwise",
};

/// [`DCA_FLAT`]'s rule: DCA's and no scaling's band losses beyond L, and
/// no scaling's mean loss on 0..L.
pub fn dca_flat(dca: &[f64], none: &[f64], at_l: f64) -> Verdict {
    let m = mean_of(dca);
    Verdict::finite_or_nan(&[m, at_l], || {
        if m <= 1.05 * at_l {
            Verdict::Reproduced
        } else {
            lower_is_partly(paired_lower(dca, none))
        }
    })
}

/// Checks a rule on a table of cases, `(inputs, expected outcome)` per
/// row; a failure names the row's inputs.
#[cfg(test)]
fn check_rule<I: Copy + std::fmt::Debug, V: PartialEq + std::fmt::Debug>(
    rule: impl Fn(I) -> V,
    cases: &[(I, V)],
) {
    for &(inputs, ref expected) in cases {
        assert_eq!(rule(inputs), *expected, "inputs {inputs:?}");
    }
}

/// A run's losses per band, as a rule's input in the tests.
#[cfg(test)]
type Bands<'a> = &'a [f64];

#[cfg(test)]
mod training_free_rules {
    use super::Verdict::*;
    use super::*;

    #[test]
    fn self_extend_rule() {
        // (Self-Extend, no scaling): accuracy at 1.5L and 2L.
        check_rule(
            |(se, none)| self_extend_retrieves(se, none),
            &[
                (([0.8, 1.0], [0.0, 0.0]), Reproduced),
                (([0.6, 0.5], [0.0, 0.0]), Partly),
                // Not enough above no scaling.
                (([0.6, 0.5], [0.4, 0.4]), NotReproduced),
                (([0.3, 0.3], [0.0, 0.0]), NotReproduced),
                (([f64::NAN, 1.0], [0.0, 0.0]), Nan),
            ],
        );
    }

    #[test]
    fn rerope_rule() {
        // (ReRoPE, NTK): losses per band.
        let cases: [((Bands, Bands), Verdict); 3] = [
            ((&[3.0, 3.1, 3.2], &[3.2, 3.3, 3.4]), Reproduced),
            ((&[3.2, 3.3, 3.4], &[3.0, 3.1, 3.2]), NotReproduced),
            ((&[3.0, 3.3, 3.1], &[3.1, 3.2, 3.15]), Tie),
        ];
        check_rule(|(rerope, ntk)| rerope_at_most_ntk(rerope, ntk), &cases);
    }

    #[test]
    fn sinks_rule() {
        // (loss beyond L, loss inside, far accuracy, control accuracy).
        check_rule(
            |(beyond, inside, far, control)| sinks_flat_no_retrieval(beyond, inside, far, control),
            &[
                ((3.1, 3.0, 0.0, 1.0), Reproduced),
                ((3.5, 3.0, 0.0, 1.0), Partly),
                ((3.1, 3.0, 0.5, 1.0), Partly),
                ((3.5, 3.0, 0.5, 1.0), NotReproduced),
                // A model that retrieves nothing says nothing about the window.
                ((3.5, 3.0, 0.0, 0.0), NotReproduced),
                ((3.1, 3.0, 0.0, 0.0), Partly),
                ((f64::NAN, 3.0, 0.0, 1.0), Nan),
            ],
        );
    }

    #[test]
    fn dca_rule() {
        // DCA's losses per band against no scaling's, at a loss of 3 at L.
        let none = [6.0, 6.5, 7.0];
        check_rule(
            |dca: [f64; 3]| dca_flat(&dca, &none, 3.0),
            &[
                ([3.0, 3.1, 3.1], Reproduced),
                ([4.0, 4.1, 4.2], Partly),
                ([7.0, 7.5, 8.0], NotReproduced),
            ],
        );
    }
}

#[cfg(test)]
mod pretrained_rules {
    use super::Verdict::*;
    use super::*;

    #[test]
    fn retrieval_rule_reads_no_scaling_and_the_best_method_at_2l() {
        // (no scaling, the best method): accuracy at 2L.
        check_rule(
            |(none, best)| pretrained_retrieval(none, best),
            &[
                ((0.0, 1.0), Reproduced),
                ((0.2, 0.8), Reproduced),
                ((0.0, 0.6), Partly),
                ((0.0, 0.4), NotReproduced),
                // No scaling still retrieves: the claim's premise fails.
                ((0.6, 1.0), NotReproduced),
                ((f64::NAN, 1.0), Nan),
            ],
        );
    }

    #[test]
    fn finetune_rules_read_the_held_out_bands_and_retrieval() {
        let zero = [4.0, 4.2, 4.4, 4.1];
        let tuned = [3.05, 3.1, 3.0, 3.12];
        // (fine-tuned, zero-shot): losses per band, and the loss at L.
        let cases: [((Bands, Bands, f64), Verdict); 5] = [
            // Below zero-shot PI on every band and within 5% of the loss at L.
            ((&tuned, &zero, 3.0), Reproduced),
            // Below zero-shot PI, but far above the loss at L.
            ((&tuned, &zero, 2.5), Partly),
            // No better than zero-shot: never reproduced, however low L's loss.
            ((&zero, &tuned, 9.0), NotReproduced),
            ((&[3.0, 3.2], &[3.1, 3.1], 3.0), Tie),
            ((&tuned, &zero, f64::NAN), Nan),
        ];
        check_rule(|(t, z, at_l)| pi_finetune_closes_gap(t, z, at_l), &cases);
        // The fine-tune's accuracy at 2L against zero-shot's 20%.
        check_rule(
            |tuned| finetune_retrieves(tuned, 0.2),
            &[
                (0.8, Reproduced),
                (0.6, Partly),
                (0.2, Tie),
                (0.0, NotReproduced),
                (f64::NAN, Nan),
            ],
        );
        // 80% that zero-shot already had is no gain from the fine-tune.
        assert_eq!(finetune_retrieves(0.8, 0.8), Tie);
    }

    #[test]
    fn paired_comparison_uses_the_band_differences() {
        // Same level shift on every band: lower however noisy the bands.
        let a = [3.0, 5.0, 4.0, 7.0];
        let b = [3.2, 5.2, 4.2, 7.2];
        let cases: [((Bands, Bands), Compare); 5] = [
            ((&a, &b), Compare::Lower),
            ((&b, &a), Compare::Higher),
            // Differences of both signs: a tie.
            ((&[1.0, 2.0, 3.0], &[1.1, 1.9, 3.05]), Compare::Tie),
            ((&[1.0], &[2.0]), Compare::Nan),
            ((&[f64::NAN, 1.0], &[2.0, 2.0]), Compare::Nan),
        ];
        check_rule(|(x, y)| paired_lower(x, y), &cases);
    }

    #[test]
    fn quiz_rule_follows_e3_thresholds() {
        let none = [6.5, 7.0, 7.5];
        let good = [3.0, 3.05, 3.1];
        let mild = [3.3, 3.4, 3.5];
        let none_mild = [3.4, 4.0, 5.0];
        // (no scaling, the interpolations): losses per band, at a loss of 3
        // at L.
        let cases: [((Bands, &[Bands]), Verdict); 5] = [
            ((&none, &[&good]), Reproduced),
            ((&none, &[&mild]), Partly),
            ((&none_mild, &[&good]), Partly),
            ((&good, &[&none]), NotReproduced),
            ((&none, &[]), Nan),
        ];
        check_rule(
            |(n, interpolations)| pretrained_quiz(n, interpolations, 3.0),
            &cases,
        );
    }

    #[test]
    fn dynamic_yarn_rule() {
        let none = [5.0, 6.0, 7.0];
        let pi = [4.0, 4.1, 4.2];
        let good = [3.0, 3.1, 3.2];
        // (dynamic, YaRN): losses per band against PI's and no scaling's.
        let cases: [((Bands, Bands), Verdict); 2] = [
            ((&good, &good), Reproduced),
            ((&good, &[4.5, 4.6, 4.7]), Partly),
        ];
        check_rule(
            |(dynamic, yarn)| pretrained_dynamic_yarn_best(dynamic, yarn, &pi, &none),
            &cases,
        );
        assert_eq!(pretrained_pi_zero_shot(&pi, &none), Reproduced);
        assert_eq!(pretrained_pi_zero_shot(&none, &pi), NotReproduced);
    }
}
