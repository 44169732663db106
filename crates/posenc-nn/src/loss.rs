//! Loss per position on plain logits: the negative log-likelihood of each
//! row's target, with one `log Σ exp` whose arithmetic (an `f32` max, `f32`
//! partial sums over 64 logits added in `f64`) every caller shares, so the
//! pretrained decoders' perplexity and passkey read the same numbers.

use rayon::prelude::*;

/// `log Σ exp(x)`, in `f64` after an `f32` max.
pub fn log_sum_exp(x: &[f32]) -> f64 {
    let m = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if !m.is_finite() {
        return m as f64;
    }
    let mut s = 0f64;
    for c in x.chunks(64) {
        let mut part = 0f32;
        for &v in c {
            part += (v - m).exp();
        }
        s += part as f64;
    }
    m as f64 + s.ln()
}

/// `log p(target)` of one row of logits: `x[target] − log Σ exp(x)`.
pub fn log_prob(logits: &[f32], target: u32) -> f64 {
    logits[target as usize] as f64 - log_sum_exp(logits)
}

/// `−log p(targets[r])` for each row `r` of `logits` (`targets.len()` rows
/// of `vocab` logits each), rows in parallel.
///
/// # Panics
/// If `logits` holds fewer than `targets.len() * vocab` values or a target
/// is not below `vocab`.
pub fn nll_rows(logits: &[f32], vocab: usize, targets: &[u32]) -> Vec<f64> {
    let mut out = vec![0f64; targets.len()];
    nll_rows_into(logits, vocab, targets, &mut out);
    out
}

/// [`nll_rows`] written into `out` (one value per target).
///
/// # Panics
/// As [`nll_rows`], and if `out` and `targets` differ in length.
pub fn nll_rows_into(logits: &[f32], vocab: usize, targets: &[u32], out: &mut [f64]) {
    assert_eq!(out.len(), targets.len(), "one output per target");
    assert!(
        logits.len() >= targets.len() * vocab,
        "one row of logits per target"
    );
    out.par_iter_mut().enumerate().for_each(|(r, o)| {
        let row = &logits[r * vocab..][..vocab];
        *o = log_sum_exp(row) - row[targets[r] as usize] as f64;
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nll_of_uniform_rows_is_log_vocab() {
        let v = 100;
        let logits = vec![0.5f32; 3 * v];
        for l in nll_rows(&logits, v, &[0, 7, 99]) {
            assert!((l - (v as f64).ln()).abs() < 1e-6);
        }
    }

    #[test]
    fn log_prob_is_minus_nll() {
        let logits: Vec<f32> = (0..130).map(|i| (i as f32 * 0.37).sin() * 5.0).collect();
        let nll = nll_rows(&logits, 130, &[42]);
        assert_eq!(nll[0], -log_prob(&logits, 42));
    }
}
