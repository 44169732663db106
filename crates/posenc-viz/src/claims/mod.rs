//! Claims, verdicts and the rules that turn measurements into verdicts,
//! shared by the report's experiments, its encoding families and
//! `posenc analyze`.
//!
//! Every rule is a pure function of the numbers it judges, written here
//! before any run, with its text beside it ([`experiments`] for the trained
//! experiments' claims, [`properties`] for the encodings' measured
//! properties). A rule never turns a tie, a NaN or a diverged run into
//! "partly" or "reproduced": those are verdicts of their own
//! ([`Verdict::Tie`], [`Verdict::Nan`], [`Verdict::Diverged`]).

use serde::{Deserialize, Serialize};

pub mod experiments;
pub mod properties;

/// The outcome of comparing a measurement with a claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Verdict {
    /// The measurement meets the claim's rule.
    #[serde(rename = "reproduced")]
    Reproduced,
    /// The measurement meets the weaker form of the rule that the rule
    /// states.
    #[serde(rename = "partly")]
    Partly,
    /// The measurement does not meet the rule.
    #[serde(rename = "not reproduced")]
    NotReproduced,
    /// The comparison the claim makes came out even (equal values, or a
    /// difference within the seed-to-seed spread): neither for nor against.
    #[serde(rename = "tie")]
    Tie,
    /// A number the rule needs is not a number (NaN or infinite), so the
    /// rule cannot be applied.
    #[serde(rename = "NaN")]
    Nan,
    /// A training run behind the numbers diverged (the run is named in the
    /// claim); its seed stays in the mean, which is then undefined.
    #[serde(rename = "diverged")]
    Diverged,
}

impl Verdict {
    /// Every verdict, in the order reports count them.
    pub const ALL: [Verdict; 6] = [
        Verdict::Reproduced,
        Verdict::Partly,
        Verdict::NotReproduced,
        Verdict::Tie,
        Verdict::Nan,
        Verdict::Diverged,
    ];

    /// The verdict as written in reports (`reproduced`, `partly`, `not
    /// reproduced`, `tie`, `NaN`, `diverged`).
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Reproduced => "reproduced",
            Verdict::Partly => "partly",
            Verdict::NotReproduced => "not reproduced",
            Verdict::Tie => "tie",
            Verdict::Nan => "NaN",
            Verdict::Diverged => "diverged",
        }
    }

    /// `Reproduced` when `ok`, otherwise `NotReproduced`.
    pub fn from_bool(ok: bool) -> Self {
        if ok {
            Verdict::Reproduced
        } else {
            Verdict::NotReproduced
        }
    }

    /// Three-way: `full` → reproduced, else `weak` → partly, else not
    /// reproduced.
    pub fn three(full: bool, weak: bool) -> Self {
        if full {
            Verdict::Reproduced
        } else if weak {
            Verdict::Partly
        } else {
            Verdict::NotReproduced
        }
    }

    /// `Nan` if any of `values` is not finite, otherwise `rule()`: every
    /// rule checks its inputs through this first.
    pub fn finite_or_nan(values: &[f64], rule: impl FnOnce() -> Verdict) -> Verdict {
        if values.iter().all(|v| v.is_finite()) {
            rule()
        } else {
            Verdict::Nan
        }
    }

    /// `Diverged` if any run behind the numbers diverged, otherwise `self`.
    pub fn unless_diverged(self, diverged: &[String]) -> Verdict {
        if diverged.is_empty() {
            self
        } else {
            Verdict::Diverged
        }
    }
}

/// How many of each verdict, in [`Verdict::ALL`]'s order.
pub fn count(verdicts: impl IntoIterator<Item = Verdict>) -> [usize; 6] {
    let mut c = [0; 6];
    for v in verdicts {
        c[Verdict::ALL.iter().position(|x| *x == v).unwrap_or(0)] += 1;
    }
    c
}

/// `"3 reproduced, 1 partly, 2 not reproduced"`, leaving out zeros (`"none"`
/// when empty).
pub fn summarize(verdicts: impl IntoIterator<Item = Verdict>) -> String {
    let c = count(verdicts);
    let parts: Vec<String> = Verdict::ALL
        .iter()
        .zip(c)
        .filter(|(_, n)| *n > 0)
        .map(|(v, n)| format!("{n} {}", v.as_str()))
        .collect();
    if parts.is_empty() {
        "none".into()
    } else {
        parts.join(", ")
    }
}

/// A rule applied: its text and the verdict it gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Judged {
    /// The rule, in words (starts with "reproduced if").
    pub rule: String,
    /// The verdict.
    pub verdict: Verdict,
}

impl Judged {
    /// A rule's text with its verdict.
    pub fn new(rule: impl Into<String>, verdict: Verdict) -> Self {
        Judged {
            rule: rule.into(),
            verdict,
        }
    }
}

/// A claim from a paper or a seed, with the rule that judged it: the
/// shape `posenc analyze` prints and the report's encoding families embed.
#[derive(Debug, Clone, Serialize)]
pub struct Judgement {
    /// The claim, in words.
    pub claim: String,
    /// Where it comes from (paper, section; seed).
    pub source: String,
    /// The value the source gives, where it gives one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expected: Option<serde_json::Value>,
    /// The rule that turns the value into the verdict.
    pub rule: String,
    /// The verdict.
    pub verdict: Verdict,
}

impl Judgement {
    /// A claim judged by `judged`.
    pub fn new(
        claim: &str,
        source: &str,
        expected: Option<serde_json::Value>,
        judged: Judged,
    ) -> Self {
        Judgement {
            claim: claim.into(),
            source: source.into(),
            expected,
            rule: judged.rule,
            verdict: judged.verdict,
        }
    }
}

/// A sample's mean, its sample standard deviation and its size. The sample
/// sd of one value is undefined (NaN): one seed has no seed-to-seed spread.
/// A non-finite value (a diverged seed) is kept: the mean and the spread are
/// then NaN, never the mean of the other seeds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stat {
    /// Mean.
    pub mean: f64,
    /// Sample standard deviation.
    pub sd: f64,
    /// Number of values.
    pub n: usize,
}

impl Stat {
    /// The statistics of `v` (NaN mean and sd for an empty sample or one
    /// with a non-finite value; NaN sd for one value).
    pub fn of(v: &[f64]) -> Self {
        if v.is_empty() || v.iter().any(|x| !x.is_finite()) {
            return Stat {
                mean: f64::NAN,
                sd: f64::NAN,
                n: v.len(),
            };
        }
        let m = v.iter().sum::<f64>() / v.len() as f64;
        let sd = if v.len() > 1 {
            (v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (v.len() - 1) as f64).sqrt()
        } else {
            f64::NAN
        };
        Stat {
            mean: m,
            sd,
            n: v.len(),
        }
    }

    /// One exact value (no spread: sd 0), e.g. a computed, not sampled,
    /// quantity.
    pub fn exact(x: f64) -> Self {
        Stat {
            mean: x,
            sd: 0.0,
            n: 1,
        }
    }
}

/// The outcome of "`a` is lower than `b`, beyond the seed-to-seed spread".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compare {
    /// `a.mean + a.sd < b.mean − b.sd`: the mean ± sd intervals do not
    /// touch, `a` below.
    Lower,
    /// The same with `b` below.
    Higher,
    /// The intervals overlap (or the means are equal): a tie.
    Tie,
    /// A mean or a spread is not a number.
    Nan,
}

/// The rule's words for [`lower`].
pub const BEYOND_SPREAD: &str =
    "\"lower beyond the spread\": mean + sd of one below mean − sd of the other (sample sd over the seeds)";

/// Compares `a` with `b` (lower is better), beyond the seed-to-seed spread.
pub fn lower(a: Stat, b: Stat) -> Compare {
    if ![a.mean, a.sd, b.mean, b.sd].iter().all(|x| x.is_finite()) {
        Compare::Nan
    } else if a.mean + a.sd < b.mean - b.sd {
        Compare::Lower
    } else if b.mean + b.sd < a.mean - a.sd {
        Compare::Higher
    } else {
        Compare::Tie
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_serialise_as_the_words_reports_print() {
        for v in Verdict::ALL {
            assert_eq!(
                serde_json::to_value(v).unwrap(),
                serde_json::json!(v.as_str())
            );
            let back: Verdict = serde_json::from_value(serde_json::json!(v.as_str())).unwrap();
            assert_eq!(back, v);
        }
        assert_eq!(
            summarize([Verdict::Tie, Verdict::Reproduced, Verdict::Tie]),
            "1 reproduced, 2 tie"
        );
        assert_eq!(summarize([]), "none");
        assert_eq!(Verdict::three(false, true), Verdict::Partly);
        assert_eq!(
            Verdict::finite_or_nan(&[1.0, f64::INFINITY], || Verdict::Reproduced),
            Verdict::Nan
        );
        assert_eq!(
            Verdict::Reproduced.unless_diverged(&["lm rope seed 1".into()]),
            Verdict::Diverged
        );
    }

    #[test]
    fn a_diverged_seed_stays_in_the_mean() {
        let s = Stat::of(&[1.0, f64::NAN, 3.0]);
        assert!(s.mean.is_nan() && s.sd.is_nan());
        assert_eq!(s.n, 3);
        let s = Stat::of(&[1.0, 3.0]);
        assert_eq!((s.mean, s.n), (2.0, 2));
        assert!((s.sd - 2f64.sqrt()).abs() < 1e-12);
        // One seed: a mean, but no spread.
        assert_eq!(Stat::of(&[5.0]).mean, 5.0);
        assert!(Stat::of(&[5.0]).sd.is_nan());
        assert!(Stat::of(&[]).mean.is_nan());
    }

    #[test]
    fn lower_beyond_the_spread() {
        let s = |m: f64, sd: f64| Stat { mean: m, sd, n: 3 };
        assert_eq!(lower(s(1.0, 0.1), s(1.5, 0.1)), Compare::Lower);
        assert_eq!(lower(s(1.5, 0.1), s(1.0, 0.1)), Compare::Higher);
        // Intervals that touch or overlap are a tie.
        assert_eq!(lower(s(1.0, 0.25), s(1.5, 0.25)), Compare::Tie);
        assert_eq!(lower(s(1.0, 0.3), s(1.5, 0.3)), Compare::Tie);
        assert_eq!(lower(s(1.0, 0.0), s(1.0, 0.0)), Compare::Tie);
        // Exact values: any difference counts.
        assert_eq!(lower(Stat::exact(1.0), Stat::exact(1.0001)), Compare::Lower);
        assert_eq!(lower(s(f64::NAN, 0.1), s(1.0, 0.1)), Compare::Nan);
        assert_eq!(lower(s(1.0, f64::NAN), s(2.0, 0.1)), Compare::Nan);
        // One seed has no spread to compare beyond.
        assert_eq!(lower(Stat::of(&[1.0]), Stat::of(&[2.0, 2.1])), Compare::Nan);
    }
}
