//! The rules for the encodings' measured properties, shared by the
//! report's family sections and `posenc analyze`: one rule per claim,
//! whatever measured it.

use super::{Judged, Verdict};

/// The rule `rule`: reproduced if `value` (finite) is at most `max`.
fn at_most(value: f64, max: f64, rule: &str) -> Judged {
    Judged::new(
        rule,
        Verdict::finite_or_nan(&[value], || Verdict::from_bool(value <= max)),
    )
}

/// The NoPE-and-RoPE post ([`crate::sources::NOPE_ROPE_RU`]): the similarity of PE(p) and PE(p + k) decreases as k grows.
/// From the fraction of non-increasing steps of cos(PE(p), PE(p + k)) and
/// Spearman's ρ between k and the cosine.
pub fn similarity_monotone(monotone_fraction: f64, spearman: f64) -> Judged {
    let rule = "reproduced if strictly non-increasing (fraction 1.0); partly if Spearman ρ(k, cos) ≤ −0.9 (falls overall, with ripples); else not reproduced";
    Judged::new(
        rule,
        Verdict::finite_or_nan(&[monotone_fraction, spearman], || {
            Verdict::three(monotone_fraction >= 1.0, spearman <= -0.9)
        }),
    )
}

/// Vaswani et al. §3.5: PE(p)·PE(p + k) depends on k only. `deviation` is
/// the largest change of the dot product across reference positions.
pub fn shift_invariant_similarity(deviation: f64) -> Judged {
    at_most(deviation, 1e-9, "reproduced if ≤ 1e-9")
}

/// The NoPE-and-RoPE post ("why 10000"): encodings of different positions never repeat.
/// `min_distance` is the smallest ‖PE(k) − PE(0)‖.
pub fn distinct_positions(min_distance: f64) -> Judged {
    Judged::new(
        "reproduced if the minimum distance is > 1e-6 (a shift is an isometry, so this is the minimum over all pairs)",
        Verdict::finite_or_nan(&[min_distance], || {
            Verdict::from_bool(min_distance > 1e-6)
        }),
    )
}

/// Vaswani et al. §3.5 and the notes on it ([`crate::sources::VASWANI_NOTES`]): PE(p + k) = M_k·PE(p) with M_k the
/// block-diagonal rotations. `residual` is the largest error, in f64.
pub fn linear_map(residual: f64) -> Judged {
    at_most(residual, 1e-9, "reproduced if ≤ 1e-9 (f64)")
}

/// The notes on Vaswani et al. §3.5: the same linear map, fitted by least squares without the
/// formula. `residual` is its largest error on positions never fitted.
pub fn fitted_linear_map(residual: f64) -> Judged {
    at_most(residual, 1e-6, "reproduced if ≤ 1e-6")
}

/// Vaswani et al. §3.5 (and θ_i = base^(−2i/d) for RoPE): wavelengths form
/// a geometric progression from 2π to base·2π. `min_over_2pi` and
/// `max_over_2pi` are the shortest and longest wavelengths in units of 2π,
/// `ratio_deviation` the largest relative deviation of a ratio of
/// consecutive wavelengths from the first ratio, `d` the dimension (the
/// longest pair is i = d/2 − 1), `tol` the relative tolerance of every
/// comparison (1e-12 for f64 frequencies, 1e-6 for f32 ones).
pub fn geometric_wavelengths(
    min_over_2pi: f64,
    max_over_2pi: f64,
    ratio_deviation: f64,
    base: f64,
    d: usize,
    tol: f64,
) -> Judged {
    let rule = format!(
        "reproduced if min = 2π, 2π·base^((d−2)/d) ≤ max ≤ 2π·base, and consecutive ratios are equal (each within a relative tolerance of {tol:e})"
    );
    let v = Verdict::finite_or_nan(&[min_over_2pi, max_over_2pi, ratio_deviation, base], || {
        let lo = base.powf((d as f64 - 2.0) / d as f64);
        Verdict::from_bool(
            (min_over_2pi - 1.0).abs() <= tol
                && max_over_2pi <= base * (1.0 + tol)
                && max_over_2pi >= lo * (1.0 - tol)
                && ratio_deviation <= tol,
        )
    });
    Judged::new(rule, v)
}

/// The largest relative deviation of the ratio of consecutive `values`
/// from the first ratio: 0 for a geometric progression (0 for fewer than
/// three values).
pub fn ratio_deviation(values: &[f64]) -> f64 {
    let ratios: Vec<f64> = values.windows(2).map(|w| w[1] / w[0]).collect();
    let Some(&r0) = ratios.first() else {
        return 0.0;
    };
    ratios
        .iter()
        .map(|r| (r / r0 - 1.0).abs())
        .fold(0.0, f64::max)
}

/// Su et al. §3.2: RoPE is a rotation, so it keeps the norm. `deviation` is
/// the largest relative change of ‖x‖.
pub fn norm_preserved(deviation: f64) -> Judged {
    at_most(deviation, 1e-12, "reproduced if ≤ 1e-12")
}

/// Su et al. §3.2 (and xPos, every RoPE scaling): the score depends on
/// m − n only. `deviation` is the largest change of the score under a
/// common shift, relative to ‖q‖‖k‖.
pub fn relative_score(deviation: f64) -> Judged {
    at_most(deviation, 1e-9, "reproduced if ≤ 1e-9")
}

/// The values RoFormer's Fig. 2 shows (d = 128, base 10000): the bound at
/// relative distances 0, 100 and 250, read off the figure (32.5 is exact:
/// (d/2 + 1)/2).
pub const ROFORMER_DECAY: [(f64, f64); 3] = [(0.0, 32.5), (100.0, 10.2), (250.0, 6.6)];

/// Su et al. §3.4.3, Fig. 2: the relative upper bound decays with
/// distance. `values` are the bound at the distances of
/// [`ROFORMER_DECAY`], in order.
pub fn roformer_decay(values: [f64; 3]) -> Judged {
    let worst = values
        .iter()
        .zip(ROFORMER_DECAY)
        .map(|(v, (_, p))| (v - p).abs() / p)
        .fold(0.0f64, f64::max);
    Judged::new(
        "reproduced if every value is within 5% of the figure's (32.5 at 0, 10.2 at 100, 6.6 at 250); partly if within 15%",
        Verdict::finite_or_nan(&values, || Verdict::three(worst <= 0.05, worst <= 0.15)),
    )
}

/// Press et al. §3: for a power-of-two number of heads n the slopes are
/// 2^(−8h/n), h = 1..n. `deviation` is the largest relative deviation.
pub fn alibi_geometric(deviation: f64) -> Judged {
    at_most(
        deviation,
        1e-12,
        "reproduced if every slope is within 1e-12 (relative) of 2^(−8h/n)",
    )
}

/// ALiBi, T5, Shaw: the bias (or the table row) depends on j − i only.
/// `deviation` is the largest |b(i, j) − b(i + s, j + s)|.
pub fn toeplitz_bias(deviation: f64) -> Judged {
    Judged::new(
        "reproduced if 0 (exact)",
        Verdict::finite_or_nan(&[deviation], || Verdict::from_bool(deviation == 0.0)),
    )
}

/// Raffel et al. §2.1 (transformers' `_relative_position_bucket`): small
/// distances get one bucket each, larger ones logarithmically wider
/// buckets, and everything beyond max_distance shares the last.
pub fn t5_buckets(exact_below_max_exact: bool, monotone: bool, constant_beyond: bool) -> Judged {
    Judged::new(
        "reproduced if bucket(r) = |r| for |r| < max_exact, non-decreasing in |r| for each sign, and constant for |r| ≥ max_distance",
        Verdict::from_bool(exact_below_max_exact && monotone && constant_beyond),
    )
}

/// Shaw et al. §3.2: relative positions are clipped to [−k, k], so 2k + 1
/// vectors serve every distance. `rows_used` is how many distinct rows the
/// distances up to beyond k use.
pub fn shaw_clipping(rows_used: usize, k: usize) -> Judged {
    Judged::new(
        "reproduced if the rows used number 2k + 1 when |j − i| reaches beyond k",
        Verdict::from_bool(rows_used == 2 * k + 1),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use Verdict::*;

    fn v(j: Judged) -> Verdict {
        assert!(j.rule.starts_with("reproduced if"), "{}", j.rule);
        j.verdict
    }

    #[test]
    fn similarity_on_both_sides_of_each_threshold() {
        assert_eq!(v(similarity_monotone(1.0, -1.0)), Reproduced);
        assert_eq!(v(similarity_monotone(0.99, -0.9)), Partly);
        assert_eq!(v(similarity_monotone(0.99, -0.89)), NotReproduced);
        assert_eq!(v(similarity_monotone(f64::NAN, -1.0)), Nan);
        assert_eq!(v(similarity_monotone(1.0, f64::NAN)), Nan);
    }

    #[test]
    fn exactness_rules_on_both_sides() {
        for (f, t) in [
            (shift_invariant_similarity as fn(f64) -> Judged, 1e-9),
            (linear_map, 1e-9),
            (fitted_linear_map, 1e-6),
            (norm_preserved, 1e-12),
            (relative_score, 1e-9),
            (alibi_geometric, 1e-12),
        ] {
            assert_eq!(v(f(0.0)), Reproduced);
            assert_eq!(v(f(t)), Reproduced);
            assert_eq!(v(f(t * 1.01)), NotReproduced);
            assert_eq!(v(f(f64::NAN)), Nan);
        }
        assert_eq!(v(distinct_positions(2e-6)), Reproduced);
        assert_eq!(v(distinct_positions(1e-6)), NotReproduced);
        assert_eq!(v(distinct_positions(f64::NAN)), Nan);
        assert_eq!(v(toeplitz_bias(0.0)), Reproduced);
        assert_eq!(v(toeplitz_bias(1e-300)), NotReproduced);
        assert_eq!(v(toeplitz_bias(f64::NAN)), Nan);
    }

    #[test]
    fn wavelengths_on_both_sides() {
        let d = 128;
        let lo = 10000f64.powf(126.0 / 128.0);
        let g = |min: f64, max: f64, dev: f64, tol: f64| {
            v(geometric_wavelengths(min, max, dev, 10000.0, d, tol))
        };
        assert_eq!(g(1.0, lo, 0.0, 1e-12), Reproduced);
        assert_eq!(g(1.0, 10000.0, 0.0, 1e-12), Reproduced);
        assert_eq!(g(1.0, lo * 0.999, 0.0, 1e-12), NotReproduced);
        assert_eq!(g(1.0, 10001.0, 0.0, 1e-12), NotReproduced);
        assert_eq!(g(1.0 + 1e-9, lo, 0.0, 1e-12), NotReproduced);
        assert_eq!(g(1.0 + 1e-9, lo, 0.0, 1e-6), Reproduced);
        assert_eq!(g(1.0, lo, 1e-12, 1e-12), Reproduced);
        assert_eq!(g(1.0, lo, 2e-12, 1e-12), NotReproduced);
        assert_eq!(g(f64::NAN, lo, 0.0, 1e-6), Nan);
        assert_eq!(g(1.0, lo, f64::NAN, 1e-6), Nan);
        // The deviation of consecutive ratios.
        assert_eq!(ratio_deviation(&[1.0, 2.0, 4.0, 8.0]), 0.0);
        assert!((ratio_deviation(&[1.0, 2.0, 5.0]) - 0.25).abs() < 1e-15);
        assert_eq!(ratio_deviation(&[3.0]), 0.0);
    }

    #[test]
    fn decay_on_both_sides_of_five_and_fifteen_percent() {
        assert_eq!(v(roformer_decay([32.5, 10.2, 6.6])), Reproduced);
        assert_eq!(v(roformer_decay([32.5, 10.2 * 1.049, 6.6])), Reproduced);
        assert_eq!(v(roformer_decay([32.5, 10.2 * 1.051, 6.6])), Partly);
        assert_eq!(v(roformer_decay([32.5, 10.2, 6.6 * 0.851])), Partly);
        assert_eq!(v(roformer_decay([32.5, 10.2, 6.6 * 0.849])), NotReproduced);
        assert_eq!(v(roformer_decay([f64::NAN, 10.2, 6.6])), Nan);
    }

    #[test]
    fn buckets_and_clipping() {
        assert_eq!(v(t5_buckets(true, true, true)), Reproduced);
        for (a, b, c) in [
            (false, true, true),
            (true, false, true),
            (true, true, false),
        ] {
            assert_eq!(v(t5_buckets(a, b, c)), NotReproduced);
        }
        assert_eq!(v(shaw_clipping(5, 2)), Reproduced);
        assert_eq!(v(shaw_clipping(4, 2)), NotReproduced);
        assert_eq!(v(shaw_clipping(6, 2)), NotReproduced);
    }
}
