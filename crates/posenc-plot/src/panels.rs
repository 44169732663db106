//! Several heatmaps side by side in one picture.

use plotters::backend::DrawingBackend;
use plotters::coord::Shift;
use plotters::drawing::DrawingArea;

use crate::colormap::{Colormap, ValueRange};
use crate::error::{check_matrix, PlotError, Result};
use crate::figure::{impl_draw, Figure};
use crate::fonts::{self, Fonts};
use crate::heatmap::Heatmap;

/// Heatmaps side by side, each with its own title, axes and colour bar,
/// under an optional overall title. Widths are shared in proportion to the
/// panels' natural widths.
///
/// ```
/// use posenc_plot::{Figure, Heatmap, Panels};
/// let a = Heatmap::new(vec![vec![0.0, 1.0]; 4])?.title("a");
/// let b = Heatmap::new(vec![vec![1.0, 0.0]; 4])?.title("b");
/// let fig = Panels::new(vec![a, b])?.title("Two maps");
/// let svg = fig.to_svg_string(800, 300)?;
/// assert!(svg.contains("Two maps"));
/// # Ok::<(), posenc_plot::PlotError>(())
/// ```
#[derive(Debug, Clone)]
pub struct Panels {
    title: String,
    panels: Vec<Heatmap>,
}

impl Panels {
    /// Panels from left to right. Errors: [`PlotError::Empty`] for none.
    pub fn new(panels: Vec<Heatmap>) -> Result<Panels> {
        if panels.is_empty() {
            return Err(PlotError::Empty {
                what: "panels".into(),
            });
        }
        Ok(Panels {
            title: String::new(),
            panels,
        })
    }

    /// Sets the overall title.
    pub fn title(mut self, title: impl Into<String>) -> Self {
        self.title = title.into();
        self
    }

    /// The panels, left to right.
    pub fn panels(&self) -> &[Heatmap] {
        &self.panels
    }

    fn check(&self) -> Result<()> {
        self.panels
            .iter()
            .try_for_each(crate::figure::private::Draw::validate)
    }

    fn draw<DB: DrawingBackend>(&self, area: &DrawingArea<DB, Shift>) -> Result<()> {
        let (w, h) = area.dim_in_pixel();
        let n = self.panels.len() as u32;
        // Text sized for one panel, as if each were drawn alone.
        let f = Fonts::for_size(w / n, h);
        let mut big = f;
        big.title *= 1.15;
        let area = fonts::title_band(area, &self.title, &big)?;
        let widths: Vec<f64> = self
            .panels
            .iter()
            .map(|p| p.natural_size().0 as f64)
            .collect();
        let total: f64 = widths.iter().sum();
        let (aw, _) = area.dim_in_pixel();
        let mut rest = area;
        for (i, p) in self.panels.iter().enumerate() {
            if i + 1 == self.panels.len() {
                p.draw_with(&rest, &f)?;
                break;
            }
            let px = (widths[i] / total * aw as f64).round() as i32;
            let (left, right) = rest.split_horizontally(px);
            p.draw_with(&left, &f)?;
            rest = right;
        }
        Ok(())
    }
}

impl_draw!(Panels);

impl Figure for Panels {
    fn default_size(&self) -> (u32, u32) {
        let w: u32 = self.panels.iter().map(|p| p.natural_size().0).sum();
        let h = self
            .panels
            .iter()
            .map(|p| p.natural_size().1)
            .max()
            .unwrap_or(0);
        let title = if self.title.is_empty() { 0 } else { 42 };
        (
            w.min(crate::figure::MAX_SIDE),
            (h + title).min(crate::figure::MAX_SIDE),
        )
    }
}

/// The introductory articles' "binary analogy" figure: a position's binary code next to
/// its sinusoidal encoding.
///
/// `bits` is a `positions × bits` 0/1 matrix (bit `k` of position `p`, low
/// bit first), `table` a `positions × dims` sinusoidal table; both are drawn
/// in the introductory articles' orientation (position `p` is column `p`), the bits in
/// white (0) → black (1), the table on the diverging red–blue map with zero
/// in the middle. The lowest bit flips at every position like the fastest
/// sinusoid, higher bits ever more slowly, like lower frequencies.
///
/// Errors: [`PlotError::Empty`], [`PlotError::Ragged`],
/// [`PlotError::NonFinite`] for either matrix,
/// [`PlotError::LengthMismatch`] when they have different numbers of
/// positions, [`PlotError::InvalidOption`] for a bit that is not 0 or 1.
///
/// ```
/// use posenc_plot::{binary_analogy, Figure};
/// let positions = 16;
/// let bits: Vec<Vec<f64>> = (0..positions)
///     .map(|p| (0..4).map(|k| ((p >> k) & 1) as f64).collect())
///     .collect();
/// let table: Vec<Vec<f64>> = (0..positions)
///     .map(|p| (0..8).map(|d| (p as f64 / 10f64.powf(d as f64 / 2.0)).sin()).collect())
///     .collect();
/// let fig = binary_analogy(bits, table)?;
/// let img = fig.to_rgb(900, 320)?;
/// assert_eq!(img.width, 900);
/// # Ok::<(), posenc_plot::PlotError>(())
/// ```
pub fn binary_analogy(bits: Vec<Vec<f64>>, table: Vec<Vec<f64>>) -> Result<Panels> {
    let (pb, _) = check_matrix(&bits, "bit matrix")?;
    let (pt, _) = check_matrix(&table, "sinusoidal table")?;
    if pb != pt {
        return Err(PlotError::LengthMismatch {
            what: "positions of the bit matrix and of the sinusoidal table".into(),
            expected: pb,
            found: pt,
        });
    }
    for (p, row) in bits.iter().enumerate() {
        for (k, &b) in row.iter().enumerate() {
            if b != 0.0 && b != 1.0 {
                return Err(PlotError::InvalidOption(format!(
                    "bit {k} of position {p} is {b}, not 0 or 1"
                )));
            }
        }
    }
    let left = Heatmap::new(bits)?
        .title("Binary code of the position")
        .x_label("position")
        .y_label("bit (lowest first)")
        .colormap(Colormap::Greys)
        .range(ValueRange::Fixed { min: 0.0, max: 1.0 });
    let right = Heatmap::new(table)?
        .title("Sinusoidal encoding")
        .x_label("position")
        .y_label("dimension")
        .colormap(Colormap::RdBu)
        .range(ValueRange::Symmetric);
    Ok(Panels::new(vec![left, right])?.title("Positions as bits and as sinusoids"))
}
