//! Colour maps and value ranges.

use crate::error::{PlotError, Result};

/// An sRGB colour, 8 bits a channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Rgb(pub u8, pub u8, pub u8);

impl Rgb {
    /// Parses `0xRRGGBB`.
    pub const fn hex(v: u32) -> Rgb {
        Rgb((v >> 16) as u8, (v >> 8) as u8, v as u8)
    }

    pub(crate) fn plotters(self) -> plotters::style::RGBColor {
        plotters::style::RGBColor(self.0, self.1, self.2)
    }
}

/// The colours `0xRRGGBB` of `v`.
const fn hexes<const N: usize>(v: [u32; N]) -> [Rgb; N] {
    let mut out = [Rgb(0, 0, 0); N];
    let mut i = 0;
    while i < N {
        out[i] = Rgb::hex(v[i]);
        i += 1;
    }
    out
}

/// ColorBrewer RdBu, 11 classes, red (low) → white → blue (high), as in
/// matplotlib's `RdBu`.
const RDBU: [Rgb; 11] = hexes([
    0x67001f, 0xb2182b, 0xd6604d, 0xf4a582, 0xfddbc7, 0xf7f7f7, 0xd1e5f0, 0x92c5de, 0x4393c3,
    0x2166ac, 0x053061,
]);

/// matplotlib's viridis sampled at 0, 1/9, …, 1.
const VIRIDIS: [Rgb; 10] = hexes([
    0x440154, 0x482878, 0x3e4989, 0x31688e, 0x26828e, 0x1f9e89, 0x35b779, 0x6dcd59, 0xb4de2c,
    0xfde725,
]);

/// White (low) → black (high).
const GREYS: [Rgb; 2] = hexes([0xffffff, 0x000000]);

/// How values become colours.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Colormap {
    /// Diverging red → white → blue (ColorBrewer / matplotlib `RdBu`): for
    /// signed data such as sinusoids in `[-1, 1]`; pair it with
    /// [`ValueRange::Symmetric`] so that white is zero.
    #[default]
    RdBu,
    /// Sequential, perceptually uniform (matplotlib `viridis`): for
    /// magnitudes, distances, attention weights.
    Viridis,
    /// Sequential white → black: for 0/1 matrices (bits).
    Greys,
}

impl Colormap {
    fn anchors(self) -> &'static [Rgb] {
        match self {
            Colormap::RdBu => &RDBU,
            Colormap::Viridis => &VIRIDIS,
            Colormap::Greys => &GREYS,
        }
    }

    /// Colour at `t ∈ [0, 1]` (clamped; NaN maps to 0.5), interpolated
    /// linearly between the map's anchor colours.
    ///
    /// ```
    /// use posenc_plot::{Colormap, Rgb};
    /// assert_eq!(Colormap::RdBu.at(0.5), Rgb(0xf7, 0xf7, 0xf7));
    /// assert_eq!(Colormap::Greys.at(0.0), Rgb(255, 255, 255));
    /// ```
    pub fn at(self, t: f64) -> Rgb {
        let t = if t.is_nan() { 0.5 } else { t.clamp(0.0, 1.0) };
        let a = self.anchors();
        let pos = t * (a.len() - 1) as f64;
        let i = (pos.floor() as usize).min(a.len() - 2);
        let f = pos - i as f64;
        let lerp = |x: u8, y: u8| (x as f64 + (y as f64 - x as f64) * f).round() as u8;
        let (p, q) = (a[i], a[i + 1]);
        Rgb(lerp(p.0, q.0), lerp(p.1, q.1), lerp(p.2, q.2))
    }

    /// Whether the map is diverging (has a neutral middle).
    pub fn is_diverging(self) -> bool {
        matches!(self, Colormap::RdBu)
    }
}

/// Which values map to the two ends of the colour map.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum ValueRange {
    /// The data's minimum and maximum.
    #[default]
    Auto,
    /// `[-m, m]` with `m` the largest absolute value: zero sits in the
    /// middle of a diverging map.
    Symmetric,
    /// A fixed interval; values outside are clamped to the ends.
    Fixed {
        /// Value drawn with the low end of the map.
        min: f64,
        /// Value drawn with the high end of the map.
        max: f64,
    },
}

/// A resolved colour scale: `lo` and `hi` may be equal (constant data), in
/// which case every value maps to the middle of the map.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Scale {
    pub lo: f64,
    pub hi: f64,
}

impl Scale {
    /// Resolves `range` against finite data extremes `min ≤ max`.
    pub fn resolve(range: ValueRange, min: f64, max: f64) -> Result<Scale> {
        match range {
            ValueRange::Auto => Ok(Scale { lo: min, hi: max }),
            ValueRange::Symmetric => {
                let m = min.abs().max(max.abs());
                Ok(Scale { lo: -m, hi: m })
            }
            ValueRange::Fixed { min, max } => {
                if min.is_finite() && max.is_finite() && min < max {
                    Ok(Scale { lo: min, hi: max })
                } else {
                    Err(PlotError::InvalidRange { min, max })
                }
            }
        }
    }

    /// Position of `v` on the map, in `[0, 1]`; 0.5 for a degenerate scale.
    pub fn t(&self, v: f64) -> f64 {
        if self.hi > self.lo {
            ((v - self.lo) / (self.hi - self.lo)).clamp(0.0, 1.0)
        } else {
            0.5
        }
    }

    /// The interval drawn on a colour bar: the scale itself, or a small
    /// interval around a constant value.
    pub fn display(&self) -> (f64, f64) {
        if self.hi > self.lo {
            (self.lo, self.hi)
        } else {
            let pad = if self.lo == 0.0 {
                1.0
            } else {
                self.lo.abs() * 0.1
            };
            (self.lo - pad, self.hi + pad)
        }
    }
}

/// Minimum and maximum of a non-empty, finite matrix.
pub(crate) fn extremes(data: &[Vec<f64>]) -> (f64, f64) {
    data.iter()
        .flatten()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &v| {
            (lo.min(v), hi.max(v))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anchors_are_hit_exactly() {
        for (k, &c) in RDBU.iter().enumerate() {
            assert_eq!(Colormap::RdBu.at(k as f64 / 10.0), c);
        }
        for (k, &c) in VIRIDIS.iter().enumerate() {
            assert_eq!(Colormap::Viridis.at(k as f64 / 9.0), c);
        }
    }

    #[test]
    fn interpolates_and_clamps() {
        assert_eq!(Colormap::Greys.at(0.5), Rgb(128, 128, 128));
        assert_eq!(Colormap::Greys.at(-3.0), Rgb(255, 255, 255));
        assert_eq!(Colormap::Greys.at(7.0), Rgb(0, 0, 0));
        assert_eq!(Colormap::Greys.at(f64::NAN), Rgb(128, 128, 128));
    }

    #[test]
    fn scales() {
        let s = Scale::resolve(ValueRange::Symmetric, -0.5, 2.0).unwrap();
        assert_eq!((s.lo, s.hi), (-2.0, 2.0));
        assert_eq!(s.t(0.0), 0.5);
        let c = Scale::resolve(ValueRange::Auto, 3.0, 3.0).unwrap();
        assert_eq!(c.t(3.0), 0.5);
        let (a, b) = c.display();
        assert!(a < 3.0 && b > 3.0);
        let z = Scale { lo: 0.0, hi: 0.0 };
        assert_eq!(z.display(), (-1.0, 1.0));
        assert!(matches!(
            Scale::resolve(ValueRange::Fixed { min: 1.0, max: 1.0 }, 0.0, 1.0),
            Err(PlotError::InvalidRange { .. })
        ));
        assert!(Scale::resolve(
            ValueRange::Fixed {
                min: f64::NAN,
                max: 1.0
            },
            0.0,
            1.0
        )
        .is_err());
    }
}
