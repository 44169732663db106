//! Axis types: integer cells (heatmaps, bar groups) and real values
//! (linear or logarithmic) with "nice" ticks.

use std::ops::Range;

use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint, Ranged};

use crate::format::format_tick;

/// `n` cells of equal width along an axis, cell `i` spanning `[i, i + 1)`,
/// drawn from the left (x) or from the top (y). Ticks sit at cell centres.
#[derive(Debug, Clone)]
pub(crate) struct CellAxis {
    pub n: usize,
    /// Cell indices that get a tick.
    pub ticks: Vec<usize>,
}

impl CellAxis {
    /// Pixel offset of cell boundary `v ∈ [0, n]` within a span of `span`
    /// pixels.
    pub fn offset(n: usize, v: f64, span: i32) -> i32 {
        (v / n as f64 * span as f64).round() as i32
    }
}

impl Ranged for CellAxis {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, v: &f64, limit: (i32, i32)) -> i32 {
        let (a, b) = (limit.0.min(limit.1), limit.0.max(limit.1));
        a + CellAxis::offset(self.n, *v, b - a + 1)
    }

    fn key_points<H: KeyPointHint>(&self, _hint: H) -> Vec<f64> {
        self.ticks.iter().map(|&i| i as f64 + 0.5).collect()
    }

    fn range(&self) -> Range<f64> {
        0.0..self.n as f64
    }
}

/// Tick indices for `n` cells with at most `max` ticks: every `step`-th
/// cell from 0, `step` the smallest of 1, 2, 4, 5, 8, 10, 16, 20, 25, 32,
/// 50, 64, 100, … that fits.
pub(crate) fn auto_cell_ticks(n: usize, max: usize) -> Vec<usize> {
    let max = max.max(1);
    let mut candidates = vec![1usize, 2, 4, 5, 8];
    let mut p = 10usize;
    while p < n.max(10) * 10 {
        candidates.extend([
            p,
            p * 16 / 10,
            p * 2,
            p * 25 / 10,
            p * 32 / 10,
            p * 5,
            p * 64 / 10,
        ]);
        p *= 10;
    }
    candidates.sort_unstable();
    candidates.dedup();
    let step = candidates
        .into_iter()
        .find(|&s| n.div_ceil(s) <= max)
        .unwrap_or(n.max(1));
    (0..n).step_by(step).collect()
}

/// A real axis `[lo, hi]`, linear or base-10 logarithmic.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ValueAxis {
    pub lo: f64,
    pub hi: f64,
    pub log: bool,
    pub max_ticks: usize,
}

impl ValueAxis {
    fn fraction(&self, v: f64) -> f64 {
        if self.log {
            (v.log10() - self.lo.log10()) / (self.hi.log10() - self.lo.log10())
        } else {
            (v - self.lo) / (self.hi - self.lo)
        }
    }

    /// Linear tick spacing (1, 2 or 5 × 10^k).
    pub fn step(&self) -> f64 {
        nice_step(self.hi - self.lo, self.max_ticks)
    }

    /// The tick values.
    pub fn ticks(&self) -> Vec<f64> {
        if self.log {
            log_ticks(self.lo, self.hi, self.max_ticks)
        } else {
            linear_ticks(self.lo, self.hi, self.step())
        }
    }

    /// Label of tick `v`.
    pub fn label(&self, v: f64) -> String {
        if self.log {
            let e = v.log10();
            if (e - e.round()).abs() < 1e-9 && !(-2.0..=4.0).contains(&e.round()) {
                format!("1e{}", e.round() as i64)
            } else {
                crate::format::format_value(v)
            }
        } else {
            format_tick(v, self.step())
        }
    }
}

impl Ranged for ValueAxis {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, v: &f64, limit: (i32, i32)) -> i32 {
        let f = self.fraction(*v);
        let f = if f.is_finite() {
            f.clamp(-1.0, 2.0)
        } else {
            0.0
        };
        limit.0 + (f * (limit.1 - limit.0) as f64).round() as i32
    }

    fn key_points<H: KeyPointHint>(&self, _hint: H) -> Vec<f64> {
        self.ticks()
    }

    fn range(&self) -> Range<f64> {
        self.lo..self.hi
    }
}

/// 1, 2 or 5 × 10^k giving at most about `max` intervals over `span`.
pub(crate) fn nice_step(span: f64, max: usize) -> f64 {
    let raw = span / max.max(1) as f64;
    if !(raw > 0.0 && raw.is_finite()) {
        return 1.0;
    }
    let mag = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * mag)
        .find(|&s| s >= raw * (1.0 - 1e-9))
        .unwrap_or(10.0 * mag)
}

fn linear_ticks(lo: f64, hi: f64, step: f64) -> Vec<f64> {
    let eps = step * 1e-9;
    let first = (lo / step - 1e-9).ceil() as i64;
    let last = (hi / step + 1e-9).floor() as i64;
    (first..=last)
        .map(|k| k as f64 * step)
        .filter(|v| *v >= lo - eps && *v <= hi + eps)
        .collect()
}

fn log_ticks(lo: f64, hi: f64, max: usize) -> Vec<f64> {
    let (a, b) = (lo.log10().ceil() as i64, hi.log10().floor() as i64);
    let decades = (b - a + 1).max(0) as usize;
    if decades >= 2 {
        let stride = decades.div_ceil(max.max(1)).max(1);
        return (a..=b)
            .step_by(stride)
            .map(|e| 10f64.powi(e as i32))
            .collect();
    }
    // Less than two powers of ten in view: add 2× and 5× multiples.
    let mut out = Vec::new();
    for e in (a - 1)..=(b + 1) {
        for m in [1.0, 2.0, 5.0] {
            let v = m * 10f64.powi(e as i32);
            if v >= lo * (1.0 - 1e-9) && v <= hi * (1.0 + 1e-9) {
                out.push(v);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cell_ticks() {
        assert_eq!(auto_cell_ticks(3, 10), vec![0, 1, 2]);
        assert_eq!(auto_cell_ticks(32, 10), vec![0, 4, 8, 12, 16, 20, 24, 28]);
        assert_eq!(auto_cell_ticks(16, 10), vec![0, 2, 4, 6, 8, 10, 12, 14]);
        assert_eq!(auto_cell_ticks(1, 10), vec![0]);
        assert_eq!(auto_cell_ticks(1000, 8).len(), 7);
    }

    #[test]
    fn nice_ticks() {
        assert_eq!(nice_step(2.0, 8), 0.5);
        assert_eq!(nice_step(100.0, 6), 20.0);
        let t = linear_ticks(-1.0, 1.0, 0.5);
        assert_eq!(t, vec![-1.0, -0.5, 0.0, 0.5, 1.0]);
        assert_eq!(log_ticks(1.0, 1e4, 10), vec![1.0, 10.0, 100.0, 1e3, 1e4]);
        assert_eq!(log_ticks(3.0, 30.0, 10), vec![5.0, 10.0, 20.0]);
    }

    #[test]
    fn cell_axis_maps_edges_and_centres() {
        let a = CellAxis {
            n: 4,
            ticks: vec![],
        };
        // A 100-pixel span [10, 109]; y limits come reversed.
        assert_eq!(a.map(&0.0, (10, 109)), 10);
        assert_eq!(a.map(&4.0, (10, 109)), 110);
        assert_eq!(a.map(&0.0, (109, 10)), 10);
        assert_eq!(a.map(&0.5, (10, 109)), 10 + 13);
    }
}
