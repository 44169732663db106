//! Every claim's verdict function, with synthetic numbers on both sides of
//! each threshold, ties and NaN (and a diverged seed's NaN mean).

use super::*;
use crate::claims::Verdict::*;

const NAN: f64 = f64::NAN;

fn s(mean: f64, sd: f64) -> Stat {
    Stat { mean, sd, n: 3 }
}

/// `rule` at each `(x, verdict)` of `cases`.
fn check<A: Copy + std::fmt::Debug>(rule: impl Fn(A) -> Verdict, cases: &[(A, Verdict)]) {
    for &(x, want) in cases {
        assert_eq!(rule(x), want, "{x:?}");
    }
}

#[test]
fn ids_are_unique_stable_and_ruled() {
    let mut ids: Vec<&str> = ALL.iter().map(|c| c.id).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), ALL.len());
    for c in ALL {
        assert!(c.id.starts_with(&format!("e{}.", c.experiment)), "{}", c.id);
        assert!(c.rule.contains("reproduced if"), "{}", c.id);
        assert!(!c.source.is_empty() && !c.claim.is_empty(), "{}", c.id);
    }
    // The ids the issue names, and earlier reports used, are still here.
    for id in [
        "e1.permutation-invariance",
        "e1.nope-near-chance",
        "e1.positional-solve",
        "e1.mlm-nope-near-unigram",
        "e2.nope-close",
        "e2.probe",
        "e2.shuffle",
        "e3.no-scaling-blows-up",
        "e3.pi-zero-shot-finite",
        "e3.pi-finetune-recovers",
        "e3.dynamic-yarn-best",
        "e4.in-distribution",
        "e4.past-the-table",
        "e5.ranking",
        "e6.k0-collapses-k2-plateau",
        "e7.rope-decay",
        "e7.pi-fit",
    ] {
        assert!(ALL.iter().any(|c| c.id == id), "{id} is gone");
    }
    for q in QUIZ {
        assert!(q.id.contains("quiz"), "{}", q.id);
        assert!(q.source.contains(crate::sources::QUIZ), "{}", q.id);
    }
}

#[test]
fn e1_permutation_invariance() {
    assert_eq!(permutation_invariance(1e-5, 1e-3), Reproduced);
    assert_eq!(permutation_invariance(1e-5, 0.9e-3), Partly);
    assert_eq!(permutation_invariance(1.1e-5, 1.0), NotReproduced);
    assert_eq!(permutation_invariance(NAN, 1.0), Nan);
    assert_eq!(permutation_invariance(0.0, NAN), Nan);
}

#[test]
fn e1_nope_near_chance() {
    check(
        nope_near_chance,
        &[
            (0.60, Reproduced),
            (0.601, Partly),
            (0.70, Partly),
            (0.701, NotReproduced),
            (NAN, Nan),
        ],
    );
}

#[test]
fn e1_positional_solve() {
    assert_eq!(positional_solve(&[0.95, 1.0]), Reproduced);
    assert_eq!(positional_solve(&[0.949, 1.0, 1.0]), Partly);
    // One failing encoding below 80%: partly ("all but one").
    assert_eq!(positional_solve(&[0.5, 1.0, 1.0]), Partly);
    // Two failing, worst ≥ 80%: partly; worst below 80%: not.
    assert_eq!(positional_solve(&[0.80, 0.9, 1.0]), Partly);
    assert_eq!(positional_solve(&[0.79, 0.9, 1.0]), NotReproduced);
    assert_eq!(positional_solve(&[NAN, 1.0]), Nan);
    assert_eq!(positional_solve(&[]), Nan);
}

#[test]
fn e1_mlm_nope_near_unigram() {
    // unigram 3, positional mean 1: fraction = (nope − 1) / 2.
    assert!((unigram_fraction(2.0, 1.0, 3.0) - 0.5).abs() < 1e-15);
    assert!(unigram_fraction(2.0, 3.0, 3.0).is_nan());
    assert_eq!(mlm_nope_near_unigram(2.0, &[0.9, 1.1], 3.0), Reproduced);
    assert_eq!(mlm_nope_near_unigram(1.99, &[0.9, 1.1], 3.0), Partly);
    assert_eq!(mlm_nope_near_unigram(1.5, &[0.9, 1.1], 3.0), Partly);
    assert_eq!(mlm_nope_near_unigram(1.49, &[0.9, 1.1], 3.0), NotReproduced);
    // One positional encoding worse than NoPE: never better than not.
    assert_eq!(mlm_nope_near_unigram(2.5, &[0.5, 2.6], 3.0), NotReproduced);
    // A positional encoding equal to NoPE: a tie.
    assert_eq!(mlm_nope_near_unigram(2.5, &[0.5, 2.5], 3.0), Tie);
    // Positional encoders at or above the unigram level: undefined.
    assert_eq!(mlm_nope_near_unigram(3.5, &[3.0, 3.2], 3.0), Nan);
    assert_eq!(mlm_nope_near_unigram(NAN, &[1.0], 3.0), Nan);
    assert_eq!(mlm_nope_near_unigram(2.0, &[NAN], 3.0), Nan);
    assert_eq!(mlm_nope_near_unigram(2.0, &[], 3.0), Nan);
}

#[test]
fn e1_quiz_encoder_fails() {
    assert_eq!(quiz_encoder_fails(2.0, &[1.0], 3.0, 0.60), Reproduced);
    assert_eq!(quiz_encoder_fails(2.0, &[1.0], 3.0, 0.61), Partly);
    assert_eq!(quiz_encoder_fails(1.9, &[1.0], 3.0, 0.5), Partly);
    assert_eq!(quiz_encoder_fails(1.9, &[1.0], 3.0, 0.61), NotReproduced);
    assert_eq!(quiz_encoder_fails(1.0, &[1.0], 3.0, 0.5), Tie);
    assert_eq!(quiz_encoder_fails(2.0, &[1.0], 3.0, NAN), Nan);
    assert_eq!(quiz_encoder_fails(NAN, &[1.0], 3.0, 0.5), Nan);
}

#[test]
fn e2_nope_close() {
    // unigram 3, best 1: closed = (3 − nope) / 2.
    assert!((closed_fraction(3.0, 1.2, 1.0) - 0.9).abs() < 1e-12);
    assert!(closed_fraction(3.0, 1.2, 3.0).is_nan());
    let shrinking = (s(0.5, 0.05), s(0.1, 0.05));
    assert_eq!(nope_close(0.9, shrinking.0, shrinking.1), Reproduced);
    assert_eq!(nope_close(0.899, shrinking.0, shrinking.1), Partly);
    assert_eq!(nope_close(0.75, shrinking.0, shrinking.1), Partly);
    assert_eq!(nope_close(0.749, shrinking.0, shrinking.1), NotReproduced);
    // Closed ≥ 0.9 but the gap grew with size: partly; within the spread: tie.
    assert_eq!(nope_close(0.95, s(0.1, 0.01), s(0.5, 0.01)), Partly);
    assert_eq!(nope_close(0.95, s(0.3, 0.1), s(0.25, 0.1)), Tie);
    assert_eq!(nope_close(0.95, s(0.3, 0.0), s(0.3, 0.0)), Tie);
    assert_eq!(nope_close(0.95, s(-0.5, 0.05), s(-0.1, 0.05)), Reproduced);
    assert_eq!(nope_close(0.95, s(-0.1, 0.01), s(-0.5, 0.01)), Partly);
    assert_eq!(nope_close(NAN, shrinking.0, shrinking.1), Nan);
    assert_eq!(nope_close(0.95, s(NAN, NAN), shrinking.1), Nan);
    // One seed: no spread, no trend verdict.
    assert_eq!(nope_close(0.95, Stat::of(&[0.5]), Stat::of(&[0.1])), Nan);
}

#[test]
fn e2_nope_gap_shrinks() {
    let g = |m: f64| s(m, 0.01);
    assert_eq!(nope_gap_shrinks(&[g(0.5), g(0.3), g(0.1)]), Reproduced);
    assert_eq!(nope_gap_shrinks(&[g(0.5), g(0.1)]), Reproduced);
    assert_eq!(nope_gap_shrinks(&[g(0.5), g(0.6), g(0.1)]), Partly);
    assert_eq!(nope_gap_shrinks(&[g(0.5), g(0.495), g(0.1)]), Partly);
    assert_eq!(nope_gap_shrinks(&[g(0.5), g(0.49)]), Tie);
    assert_eq!(nope_gap_shrinks(&[g(0.5), g(0.5)]), Tie);
    assert_eq!(nope_gap_shrinks(&[g(0.1), g(0.5)]), NotReproduced);
    // From the other side (NoPE better): converging is shrinking, pulling
    // ahead is not.
    assert_eq!(nope_gap_shrinks(&[g(-0.5), g(-0.1)]), Reproduced);
    assert_eq!(nope_gap_shrinks(&[g(-0.1), g(-0.5)]), NotReproduced);
    assert_eq!(nope_gap_shrinks(&[g(0.5), g(-0.1)]), Reproduced);
    assert_eq!(nope_gap_shrinks(&[g(0.5), g(NAN), g(0.1)]), Nan);
    assert_eq!(nope_gap_shrinks(&[g(0.5)]), Nan);
    assert_eq!(nope_gap_shrinks(&[]), Nan);
}

#[test]
fn e2_probe_and_shuffle() {
    assert_eq!(probe(0.9, 0.6), Reproduced);
    assert_eq!(probe(0.9, 0.61), Partly);
    assert_eq!(probe(0.9, 0.85), Partly);
    assert_eq!(probe(0.9, 0.851), NotReproduced);
    assert_eq!(probe(0.89, 0.1), NotReproduced);
    assert_eq!(probe(NAN, 0.1), Nan);
    assert_eq!(probe(0.95, NAN), Nan);
    check(
        shuffle,
        &[
            (0.5, Reproduced),
            (0.49, Partly),
            (0.1, Partly),
            (0.099, NotReproduced),
            (NAN, Nan),
        ],
    );
}

#[test]
fn e2_quiz_decoder_works() {
    check(
        quiz_decoder_works,
        &[
            (0.9, Reproduced),
            (0.899, Partly),
            (0.75, Partly),
            (0.749, NotReproduced),
            (NAN, Nan),
        ],
    );
}

#[test]
fn e3_no_scaling_blows_up() {
    // The loss past L, with the loss at L 1.0 and the unigram 3.0.
    check(
        |past_l| no_scaling_blows_up(past_l, 1.0, 3.0),
        &[
            (3.0, Reproduced),
            (2.99, Partly),
            (2.0, Partly),
            (1.99, NotReproduced),
            // The old rule's 1.25× is no longer enough.
            (1.25, NotReproduced),
            (NAN, Nan),
        ],
    );
    assert_eq!(no_scaling_blows_up(4.0, NAN, 3.0), Nan);
    assert_eq!(no_scaling_blows_up(4.0, 1.0, NAN), Nan);
}

#[test]
fn e3_pi_zero_shot_finite() {
    assert_eq!(pi_zero_shot_finite(s(1.0, 0.1), s(1.5, 0.1)), Reproduced);
    assert_eq!(pi_zero_shot_finite(s(1.0, 0.3), s(1.5, 0.3)), Tie);
    // Up to 5% worse was "partly" before; now it is not reproduced.
    assert_eq!(
        pi_zero_shot_finite(s(1.05, 0.001), s(1.0, 0.001)),
        NotReproduced
    );
    assert_eq!(pi_zero_shot_finite(s(NAN, 0.1), s(1.5, 0.1)), Nan);
    assert_eq!(pi_zero_shot_finite(s(f64::INFINITY, 0.1), s(1.5, 0.1)), Nan);
    assert_eq!(pi_zero_shot_finite(Stat::of(&[1.0]), Stat::of(&[2.0])), Nan);
}

#[test]
fn e3_pi_finetune_recovers() {
    let zero = s(2.0, 0.1);
    assert_eq!(pi_finetune_recovers(s(1.05, 0.1), zero, 1.0), Reproduced);
    assert_eq!(pi_finetune_recovers(s(1.06, 0.1), zero, 1.0), Partly);
    assert_eq!(pi_finetune_recovers(s(1.8, 0.1), zero, 1.0), Tie);
    assert_eq!(pi_finetune_recovers(s(2.5, 0.1), zero, 1.0), NotReproduced);
    assert_eq!(pi_finetune_recovers(s(NAN, NAN), zero, 1.0), Nan);
    assert_eq!(pi_finetune_recovers(s(1.0, 0.1), zero, NAN), Nan);
    assert_eq!(pi_finetune_recovers(s(1.5, 0.1), s(NAN, NAN), 1.0), Nan);
}

#[test]
fn e3_dynamic_yarn_best() {
    let (pi, none) = (s(2.0, 0.1), s(3.0, 0.1));
    for (dynamic, yarn, pi, none, want) in [
        (s(1.0, 0.1), s(1.2, 0.1), pi, none, Reproduced),
        // Only one of the two beats both: partly (the old rule said reproduced).
        (s(1.0, 0.1), s(2.5, 0.1), pi, none, Partly),
        (s(2.0, 0.1), s(1.0, 0.1), pi, none, Partly),
        // Within the spread of PI, better than none: tie.
        (s(1.9, 0.1), s(2.05, 0.1), pi, none, Tie),
        // Worse than PI beyond the spread: not reproduced.
        (s(2.5, 0.1), s(1.8, 0.5), pi, none, NotReproduced),
        (s(NAN, 0.1), s(1.0, 0.1), pi, none, Nan),
        (s(1.0, 0.1), s(1.0, 0.1), pi, s(NAN, NAN), Nan),
    ] {
        assert_eq!(
            dynamic_yarn_best(dynamic, yarn, pi, none),
            want,
            "{dynamic:?} {yarn:?} {pi:?} {none:?}"
        );
    }
}

#[test]
fn e3_quiz_rope_needs_interpolation() {
    for (none, pi, at_l, want) in [
        (s(2.0, 0.1), s(1.05, 0.01), 1.0, Reproduced),
        (s(1.99, 0.1), s(1.05, 0.01), 1.0, Partly),
        (s(2.0, 0.1), s(1.06, 0.01), 1.0, Partly),
        (s(1.1, 0.1), s(1.06, 0.1), 1.0, Tie),
        (s(1.1, 0.01), s(1.5, 0.01), 1.0, NotReproduced),
        (s(NAN, NAN), s(1.0, 0.01), 1.0, Nan),
        (s(2.0, 0.1), s(1.0, 0.01), NAN, Nan),
    ] {
        assert_eq!(
            quiz_rope_needs_interpolation(none, pi, at_l),
            want,
            "{none:?} {pi:?} {at_l}"
        );
    }
}

#[test]
fn e4_rules() {
    // sd 0.01, sinusoidal 1.0: tolerance max(0.02, 0.02) = 0.02.
    assert_eq!(in_distribution(s(1.019, 0.01), s(1.0, 0.01)), Reproduced);
    assert_eq!(in_distribution(s(0.981, 0.01), s(1.0, 0.01)), Reproduced);
    assert_eq!(in_distribution(s(1.021, 0.01), s(1.0, 0.01)), Partly);
    assert_eq!(in_distribution(s(1.049, 0.01), s(1.0, 0.01)), Partly);
    assert_eq!(in_distribution(s(1.051, 0.01), s(1.0, 0.01)), NotReproduced);
    // A wide spread widens the tolerance.
    assert_eq!(in_distribution(s(1.09, 0.05), s(1.0, 0.01)), Reproduced);
    assert_eq!(in_distribution(s(NAN, 0.01), s(1.0, 0.01)), Nan);
    assert_eq!(in_distribution(Stat::of(&[1.0]), Stat::of(&[1.0])), Nan);

    assert_eq!(past_the_table(true, 1.5), Reproduced);
    assert_eq!(past_the_table(false, 1.5), NotReproduced);
    assert_eq!(past_the_table(true, NAN), Nan);

    // at L 1.0, unigram 3.0.
    assert_eq!(sinusoidal_extrapolates(1.1, 1.0, 3.0), Reproduced);
    assert_eq!(sinusoidal_extrapolates(1.11, 1.0, 3.0), Partly);
    assert_eq!(sinusoidal_extrapolates(2.99, 1.0, 3.0), Partly);
    assert_eq!(sinusoidal_extrapolates(3.0, 1.0, 3.0), NotReproduced);
    assert_eq!(sinusoidal_extrapolates(NAN, 1.0, 3.0), Nan);
}

#[test]
fn e5_ranking() {
    assert_eq!(ranking(0.7, &[0.5, 0.3], 0.7, 4), Reproduced);
    assert_eq!(ranking(0.7, &[0.5, 0.3], 0.69, 4), Partly);
    assert_eq!(ranking(0.4, &[0.5, 0.3], 0.3, 4), Partly);
    assert_eq!(ranking(0.4, &[0.5, 0.3], 0.29, 4), NotReproduced);
    // NoPE shares the top: a tie, whatever ρ says.
    assert_eq!(ranking(0.5, &[0.5, 0.3], 0.9, 4), Tie);
    // All-zero accuracies give every encoding the same MRR: a tie, not "NoPE top".
    assert_eq!(ranking(1.0, &[1.0, 1.0], NAN, 4), Tie);
    assert_eq!(ranking(0.7, &[0.5], 0.9, 0), Tie);
    assert_eq!(ranking(0.7, &[0.5, 0.3], NAN, 4), Nan);
    assert_eq!(ranking(NAN, &[0.5, 0.3], 0.9, 4), Nan);
}

#[test]
fn e5_newer_generalise() {
    // RoPE 0.2, ALiBi 0.3: the bar is 0.3.
    assert_eq!(newer_generalise(&[0.31, 0.4, 0.5], 0.2, 0.3), Reproduced);
    assert_eq!(newer_generalise(&[0.31, 0.3, 0.5], 0.2, 0.3), Partly);
    assert_eq!(newer_generalise(&[0.31, 0.1, 0.0], 0.3, 0.2), Partly);
    assert_eq!(newer_generalise(&[0.29, 0.1, 0.0], 0.2, 0.3), NotReproduced);
    // Everything at 0 beyond L (or equal to the bar): a tie, never support.
    assert_eq!(newer_generalise(&[0.0, 0.0, 0.0], 0.0, 0.0), Tie);
    assert_eq!(newer_generalise(&[0.3, 0.1], 0.2, 0.3), Tie);
    assert_eq!(newer_generalise(&[0.5, NAN], 0.2, 0.3), Nan);
    assert_eq!(newer_generalise(&[0.5], NAN, 0.3), Nan);
    assert_eq!(newer_generalise(&[], 0.2, 0.3), Nan);
}

#[test]
fn e6_shaw_k() {
    // k0 0.5, k ≥ 2 at 0.9 and 0.95.
    assert_eq!(shaw_k(0.5, &[0.9, 0.95], &[0.7, 0.9, 0.95]), Reproduced);
    assert_eq!(shaw_k(0.61, &[0.9, 0.95], &[0.7, 0.9, 0.95]), Partly);
    assert_eq!(shaw_k(0.5, &[0.69, 0.72], &[0.6, 0.69, 0.72]), Partly);
    assert_eq!(shaw_k(0.5, &[0.9, 0.951], &[0.7, 0.9, 0.951]), Partly);
    // k = 0 ties the lowest (all at chance, or all perfect): a tie.
    assert_eq!(shaw_k(0.5, &[0.5, 0.9], &[0.7, 0.5, 0.9]), Tie);
    assert_eq!(shaw_k(1.0, &[1.0, 1.0], &[1.0, 1.0, 1.0]), Tie);
    assert_eq!(shaw_k(0.8, &[0.7, 0.9], &[0.9, 0.7, 0.9]), NotReproduced);
    assert_eq!(shaw_k(NAN, &[0.9], &[0.9]), Nan);
    assert_eq!(shaw_k(0.5, &[NAN], &[0.9, NAN]), Nan);
    assert_eq!(shaw_k(0.5, &[], &[0.9]), Nan);
}

#[test]
fn e7_pi_fit() {
    assert_eq!(pi_fit(1.0, 2.0, 100.0), Reproduced);
    assert_eq!(pi_fit(1.0, 2.01, 100.0), Partly);
    assert_eq!(pi_fit(1.0, 1.0, 99.9), Partly);
    assert_eq!(pi_fit(1.0, 1.0, 10.0), Partly);
    assert_eq!(pi_fit(1.0, 1.0, 9.99), NotReproduced);
    assert_eq!(pi_fit(NAN, 1.0, 100.0), Nan);
    assert_eq!(pi_fit(1.0, 1.0, f64::INFINITY), Nan);
}
